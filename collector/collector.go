// Package collector runs the dualflow collector: it receives flow records,
// enriches them and writes them to ClickHouse. This file wires the stages
// together; each stage lives in its own package under collector/.
package collector

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/migrations"
)

// Config configures the collector.
type Config struct {
	Store  store.Config
	Writer store.WriterConfig
	// MetricsAddr serves /metrics, /healthz and /readyz ("" disables).
	MetricsAddr string
	// Version is recorded with applied migrations.
	Version string
}

// DefaultMetricsAddr is where the collector serves its metrics by default.
const DefaultMetricsAddr = "127.0.0.1:9464"

// BindFlags registers the collector flags on fs.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	c.Store.BindFlags(fs)
	w := &c.Writer
	fs.IntVar(&w.BatchRows, "clickhouse.batch-rows", store.DefaultBatchRows, "rows per insert batch")
	fs.DurationVar(&w.FlushInterval, "clickhouse.flush-interval", store.DefaultFlushInterval, "send a batch at least this often")
	fs.IntVar(&w.MaxPending, "clickhouse.max-pending-batches", store.DefaultMaxPending, "sealed batches held in memory before the pipeline is slowed down (back-pressure)")
	fs.StringVar(&w.SpoolDir, "clickhouse.spool-dir", "", "spool batches here while ClickHouse is unreachable (default <data-dir>/../spool for the embedded store, disabled for a server unless set)")
	fs.Int64Var(&w.SpoolMaxBytes, "clickhouse.spool-max-bytes", store.DefaultSpoolMaxBytes, "spool size bound; past it failed batches are dropped and counted")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", DefaultMetricsAddr, "serve /metrics, /healthz and /readyz here (empty disables)")
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	c.Store.SetDefaults()
	if c.Writer.SpoolDir == "" && c.Store.Embedded() {
		c.Writer.SpoolDir = filepath.Join(filepath.Dir(filepath.Clean(c.Store.DataDir)), "spool")
	}
	c.Writer.SetDefaults()
}

// Validate checks the configuration.
func (c Config) Validate() error {
	return errors.Join(c.Store.Validate(), c.Writer.Validate())
}

// Collector is a running collector. Create it with New, then call Run.
type Collector struct {
	cfg    Config
	log    *slog.Logger
	reg    *prometheus.Registry
	conn   store.Conn
	writer *store.Writer
	http   *chhttp.Server // nil unless embedded with HTTPAddr
	ready  chan struct{}
}

// New opens the store, applies pending migrations and builds the stages.
// The caller must call Run (which closes the store) or Close.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Collector, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	conn, err := store.Open(cfg.Store)
	if err != nil {
		return nil, err
	}
	c := &Collector{cfg: cfg, log: log, reg: reg, conn: conn, ready: make(chan struct{})}
	if err := c.migrate(ctx); err != nil {
		conn.Close()
		return nil, err
	}
	c.writer, err = store.NewWriter(cfg.Writer, conn, reg, log.With("stage", "store"))
	if err != nil {
		conn.Close()
		return nil, err
	}
	if e, ok := conn.(*store.Embedded); ok && cfg.Store.HTTPAddr != "" {
		c.http, err = chhttp.New(chhttp.Config{Addr: cfg.Store.HTTPAddr, Engine: e.DB(), Registerer: reg, Logger: log.With("stage", "clickhouse-http")})
		if err != nil {
			conn.Close()
			return nil, err
		}
	}
	return c, nil
}

func (c *Collector) migrate(ctx context.Context) error {
	r, err := migrations.NewRunner(c.conn, c.cfg.Store.Migrations())
	if err != nil {
		return err
	}
	r.Version = c.cfg.Version
	done, err := r.Up(ctx)
	for _, m := range done {
		c.log.Info("applied migration", "name", m.Name)
	}
	return err
}

// Writer returns the store writer that the ingest pipeline feeds.
func (c *Collector) Writer() *store.Writer { return c.writer }

// Conn returns the store connection (for queries).
func (c *Collector) Conn() store.Conn { return c.conn }

// Registry returns the collector's Prometheus registry.
func (c *Collector) Registry() *prometheus.Registry { return c.reg }

// Run runs every stage until ctx is cancelled, then shuts them down in
// pipeline order (so the writer flushes what the earlier stages handed it)
// and closes the store. It returns the first stage error.
func (c *Collector) Run(ctx context.Context) error {
	defer c.conn.Close()
	g, gctx := errgroup.WithContext(ctx)
	// The writer outlives the other stages: it stops after them, so it gets
	// the records they flush on the way out.
	writerCtx, stopWriter := context.WithCancel(context.WithoutCancel(ctx))
	writerDone := make(chan error, 1)
	go func() { writerDone <- c.writer.Run(writerCtx) }()
	if c.http != nil {
		g.Go(func() error { return c.http.Run(gctx) })
		c.log.Info("serving the ClickHouse HTTP interface", "url", "http://"+c.cfg.Store.HTTPAddr+"/")
	}
	if c.cfg.MetricsAddr != "" {
		g.Go(func() error { return c.serveMetrics(gctx) })
	}
	close(c.ready)
	<-gctx.Done()
	err := g.Wait()
	stopWriter()
	if werr := <-writerDone; werr != nil && !errors.Is(werr, context.Canceled) {
		err = errors.Join(err, werr)
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

func (c *Collector) serveMetrics(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(c.reg, promhttp.HandlerOpts{Registry: c.reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-c.ready:
			fmt.Fprintln(w, "ok")
		default:
			http.Error(w, "starting", http.StatusServiceUnavailable)
		}
	})
	ln, err := net.Listen("tcp", c.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("metrics listener: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	c.log.Info("serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
