package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/internal/httpserve"
	"github.com/dualflow/dualflow/migrations"
)

// schemaCheckInterval is how often the store compares its database with
// what the migrations create, and repairs it.
const schemaCheckInterval = 30 * time.Second

// defaultStoreMetricsAddr is where `dualflow store` serves its metrics: the
// collector's default port plus one, so both run side by side.
const defaultStoreMetricsAddr = "127.0.0.1:9465"

func runStore(ctx context.Context, args []string) error {
	fs := newFlagSet("store", "[flags]", `Own the embedded ClickHouse store (chDB) and serve it to several collectors
on this machine over the ClickHouse HTTP interface.

The embedded engine is owned by one process per data directory. When flows
are sharded over several collectors on one machine (the exporters'
--exporter.collector list), run one 'dualflow store' and point every
collector at it as at a ClickHouse server:

  dualflow store --clickhouse.data-dir var/data
  jq -r '.users[] | select(.name == "inserter") | .password' var/data/http-users.json > var/ch-password
  dualflow collector --clickhouse.dsn http://127.0.0.1:8123/ \
      --clickhouse.user inserter --clickhouse.password-file var/ch-password ...

The store applies the pending schema migrations before it answers any
query (collectors connecting meanwhile wait), so the collectors find the
schema current: logged in as the inserter, which may insert into tables
and read but not change the schema, they check it and apply nothing. It
authenticates with the users file (--clickhouse.http-users-file, default
<data-dir>/http-users.json, created at first start with users admin,
reader and inserter) and listens on loopback only: the interface has no
TLS. /metrics, /healthz and /readyz are served on
--metrics-addr; /readyz answers 200 once the schema is migrated and the
interface is serving.

This is for one machine. In production, or across machines, use a
ClickHouse server or cluster (--clickhouse.dsn on every collector, schema
applied with 'dualflow migrate') instead.

SIGINT/SIGTERM stop accepting queries, let those in flight finish for up to
--shutdown-timeout (then cancel them), and close the engine.`)
	var cfg store.Config
	cfg.HTTPAddr = store.DefaultHTTPAddr
	cfg.TTLDays = 30
	cfg.BindFlags(fs)
	metricsAddr := fs.String("metrics-addr", defaultStoreMetricsAddr, "serve /metrics, /healthz and /readyz here (empty disables)")
	shutdown := fs.Duration("shutdown-timeout", chhttp.DefaultShutdownTimeout, "on SIGINT/SIGTERM, how long queries in flight may run before they are cancelled")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("store: unexpected arguments %v", fs.Args())
	}
	switch {
	case cfg.DSN != "":
		return errors.New("store: --clickhouse.dsn selects a ClickHouse server; the store serves the embedded engine (point collectors' --clickhouse.dsn at it instead)")
	case cfg.HTTPAddr == "":
		return errors.New("store: --clickhouse.http-addr is required: serving it is what the store is for")
	case *shutdown <= 0:
		return errors.New("store: --shutdown-timeout must be positive")
	}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	s := &storeServer{cfg: cfg, metricsAddr: *metricsAddr, shutdownTimeout: *shutdown, log: slog.Default()}
	return s.run(ctx)
}

// storeServer is `dualflow store`: the embedded engine, its schema and its
// ClickHouse HTTP interface.
type storeServer struct {
	cfg             store.Config
	metricsAddr     string
	shutdownTimeout time.Duration
	log             *slog.Logger
	ready           chan struct{} // closed once migrated and serving
	schema          *migrations.Keeper
}

// run opens the engine, binds the listeners (so a port in use fails at
// once), migrates, serves until ctx is cancelled, then shuts the listeners
// down and closes the engine, which waits for statements still running.
func (s *storeServer) run(ctx context.Context) (err error) {
	s.ready = make(chan struct{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	conn, err := store.Open(s.cfg)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, conn.Close()) }()
	e := conn.(*store.Embedded) // Open returns the embedded engine without a DSN
	srv, err := s.cfg.HTTPInterface(e, chhttp.Config{Registerer: reg, Logger: s.log.With("stage", "clickhouse-http"), ShutdownTimeout: s.shutdownTimeout})
	if err != nil {
		return err
	}
	// Bound now, served after the migrations: a collector connecting
	// meanwhile waits in the accept queue instead of being refused.
	httpLn, err := net.Listen("tcp", s.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("clickhouse http listener: %w", err)
	}
	defer httpLn.Close() // Serve closes it too; this covers the early returns
	var metLn net.Listener
	if s.metricsAddr != "" {
		if metLn, err = net.Listen("tcp", s.metricsAddr); err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
	}
	g, gctx := errgroup.WithContext(ctx)
	if metLn != nil {
		g.Go(func() error { return s.serveMetrics(gctx, metLn, reg) })
	}
	g.Go(func() error {
		if err := s.migrate(gctx, e); err != nil {
			return err
		}
		s.log.Info("serving the ClickHouse HTTP interface", "url", "http://"+httpLn.Addr().String()+"/", "users-file", s.cfg.HTTPUsersFile, "data-dir", s.cfg.DataDir)
		close(s.ready)
		if s.schema != nil {
			go s.schema.Run(gctx, schemaCheckInterval, s.report)
		}
		err := srv.Serve(gctx, httpLn)
		if ctx.Err() != nil && errors.Is(err, context.DeadlineExceeded) {
			// Serve cancelled the queries still running at the bound: a
			// stop as asked, not a failure.
			s.log.Warn("cancelled the queries still running after --shutdown-timeout", "timeout", s.shutdownTimeout)
			return nil
		}
		return err
	})
	err = g.Wait()
	s.log.Info("store stopped; closing the engine")
	return err
}

// migrate applies the pending migrations: the store is the one owner of
// the schema of its data directory.
func (s *storeServer) migrate(ctx context.Context, e *store.Embedded) error {
	r, err := migrations.NewRunner(e, s.cfg.Migrations())
	if err != nil {
		return err
	}
	r.Version = version
	done, err := r.Up(ctx)
	for _, m := range done {
		s.log.Info("applied migration", "name", m.Name)
	}
	if err != nil {
		return err
	}
	// The ledger is not trusted alone: what the migrations create and the
	// database lacks (a table an admin dropped) is recreated now and
	// while the store runs.
	if s.schema, err = r.Keeper(ctx); err != nil {
		return err
	}
	s.report(s.schema.Ensure(ctx))
	return nil
}

// report logs what a schema check repaired, and what it could not.
func (s *storeServer) report(fixed []migrations.Problem, err error) {
	if len(fixed) > 0 {
		s.log.Warn("recreated what the migrations create and the database lacked (someone dropped it; rows it held are gone)", "repaired", migrations.Describe(fixed))
	}
	if err != nil {
		s.log.Error("the schema differs from the migrations; /readyz fails until it is fixed", "err", err)
	}
}

// serveMetrics serves /metrics, /healthz and /readyz on ln until ctx is
// cancelled.
func (s *storeServer) serveMetrics(ctx context.Context, ln net.Listener, reg *prometheus.Registry) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-s.ready:
			if err := s.schema.Err(); err != nil {
				http.Error(w, "schema: "+err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		default:
			http.Error(w, "migrating", http.StatusServiceUnavailable)
		}
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	s.log.Info("serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return httpserve.Serve(ctx, srv, ln, 5*time.Second)
}
