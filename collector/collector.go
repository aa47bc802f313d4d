// Package collector runs the dualflow collector: it receives flow records,
// enriches them and writes them to ClickHouse. This file wires the stages
// together; each stage lives in its own package under collector/:
//
//	ipfix listeners ─decoded→ correlate ─correlated→ enrich+audit ─enriched→ store writer
//
// Every arrow is a bounded pipeline.Queue. TCP/TLS listeners block on a
// full queue (back-pressure through TCP flow control), UDP listeners drop
// and count; every later stage blocks, so a slow ClickHouse fills the
// queues from the writer backwards, visible in
// dualflow_pipeline_queue_length and dualflow_pipeline_queue_blocked_seconds_total.
package collector

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/correlate"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/flowmetrics"
	"github.com/dualflow/dualflow/collector/ipfix"
	"github.com/dualflow/dualflow/collector/pipeline"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/collector/wal"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/httpserve"
	"github.com/dualflow/dualflow/migrations"
)

// Config configures the collector.
type Config struct {
	Store  store.Config
	Writer store.WriterConfig
	// IPFIX configures the listeners; with no address at all the collector
	// runs without ingest (the writer is still fed through Writer()).
	IPFIX     ipfix.Config
	Correlate correlate.Config
	// InventoryFile is a Kubernetes manifest whose Node objects (pod CIDRs,
	// addresses) tell the correlator which node an address is on. Empty:
	// the Kubernetes enrichment answers (K8s), and without it there is no
	// correlation: every record passes as CorrelationNone.
	InventoryFile string
	// FlowMetricsFile configures the flow metrics (collector/flowmetrics:
	// which metrics, which labels, the series bound); empty: the
	// defaults.
	FlowMetricsFile string
	// K8s configures the Kubernetes enrichment (informers or inventory
	// manifests); Source "off" disables it.
	K8s enrich.Config
	// Audit configures the NetworkPolicy evaluation of every flow; it runs
	// whenever the enrichment does.
	Audit audit.Config
	// WAL journals received records until they are durable, so a crash
	// loses none (see package wal). Dir "" means <data-dir>/../wal for the
	// embedded store and off for a server; "off" disables it.
	WAL wal.Config
	// MetricsAddr serves /metrics, /healthz and /readyz ("" disables).
	MetricsAddr string
	// StoreWait is how long New waits for an unreachable ClickHouse (a
	// store starting with the collector) before it gives up.
	StoreWait time.Duration
	// Version is recorded with applied migrations.
	Version string
}

// DefaultStoreWait is Config.StoreWait's default.
const DefaultStoreWait = 5 * time.Minute

// DefaultMetricsAddr is where the collector serves its metrics by default.
const DefaultMetricsAddr = "127.0.0.1:9464"

// BindFlags registers the collector flags on fs.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	c.Store.BindFlags(fs)
	w := &c.Writer
	fs.IntVar(&w.BatchRows, "clickhouse.batch-rows", store.DefaultBatchRows, "rows per insert batch: bigger batches make fewer, larger parts (less merging) for more memory, about 70 MB per 100k enriched rows, times max-pending-batches + 1")
	fs.DurationVar(&w.FlushInterval, "clickhouse.flush-interval", store.DefaultFlushInterval, "send a batch at least this often")
	fs.IntVar(&w.MaxPending, "clickhouse.max-pending-batches", store.DefaultMaxPending, "sealed batches held in memory before the pipeline is slowed down (back-pressure)")
	fs.IntVar(&w.Inserters, "clickhouse.inserters", store.DefaultInserters, "batches inserted at once (capped at max-pending-batches; 1 keeps rows in arrival order)")
	fs.StringVar(&w.SpoolDir, "clickhouse.spool-dir", "", "spool batches here while ClickHouse is unreachable (default <data-dir>/../spool for the embedded store, disabled for a server unless set)")
	fs.Int64Var(&w.SpoolMaxBytes, "clickhouse.spool-max-bytes", store.DefaultSpoolMaxBytes, "spool size bound; past it failed batches are dropped and counted")
	fs.StringVar(&c.WAL.Dir, "collector.wal.dir", "", "write-ahead log of received records, replayed after a crash (default <data-dir>/../wal for the embedded store; off for a ClickHouse server unless set; \"off\" disables)")
	fs.DurationVar(&c.WAL.SyncInterval, "collector.wal.sync-interval", wal.DefaultSyncInterval, "fsync the write-ahead log this often (a killed process loses nothing either way; a power loss loses at most this much); negative: never")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", DefaultMetricsAddr, "serve /metrics, /healthz and /readyz here (empty disables)")
	fs.DurationVar(&c.StoreWait, "clickhouse.start-timeout", DefaultStoreWait, "at start, wait this long for an unreachable ClickHouse server (or `dualflow store`) to answer before giving up; a refused query or login fails at once")
	ic := &c.IPFIX
	addrList(fs, &ic.TCPAddrs, "collector.ipfix.tcp-addr", ipfix.DefaultTCPAddr, "IPFIX over TCP listen addresses, comma-separated (\":4739\" is IPv4 and IPv6; empty disables)")
	addrList(fs, &ic.UDPAddrs, "collector.ipfix.udp-addr", ipfix.DefaultUDPAddr, "IPFIX over UDP listen addresses, comma-separated (empty disables)")
	addrList(fs, &ic.TLSAddrs, "collector.ipfix.tls-addr", "", "IPFIX over TLS listen addresses, comma-separated, e.g. \":4740\" (needs --collector.ipfix.tls-cert and -key)")
	fs.StringVar(&ic.TLSCertFile, "collector.ipfix.tls-cert", "", "PEM certificate of the TLS listener")
	fs.StringVar(&ic.TLSKeyFile, "collector.ipfix.tls-key", "", "PEM private key file of the TLS listener")
	fs.StringVar(&ic.TLSClientCAFile, "collector.ipfix.tls-client-ca", "", "PEM CA bundle: require client certificates signed by it (mutual TLS)")
	fs.Var(&ic.AllowedSources, "collector.ipfix.allowed-sources", "exporter addresses accepted by the IPFIX listeners: comma-separated CIDRs or addresses, both families (IPv4-mapped sources match IPv4 CIDRs), \"any\" for every host; others are dropped before decoding and counted (empty: any, with a warning when a listener is on a non-loopback address without mutual TLS). Its prefixes but \"any\" (empty: loopback and private networks) keep 1/8 of the TCP/TLS sessions for themselves")
	fs.Var(&ic.Direction, "collector.ipfix.flow-direction", "records kept by their flowDirection element: auto (default: per exporter domain and tuple, the direction seen first is kept, so an exporter that reports the same packets in and out, like Open vSwitch, counts them once, while reply flows that softflowd marks egress are kept), ingress, egress, or both; records without it are always kept")
	fs.IntVar(&ic.MaxSessions, "collector.ipfix.max-sessions", ipfix.DefaultMaxSessions, "IPFIX sessions (connections, UDP exporters) per listener, 1/8 of the TCP/TLS ones kept for the allowed sources' prefixes; past a limit a new TCP/TLS connection takes the place of a session over 10 s old delivering under one record a minute, else it is refused and counted")
	fs.IntVar(&ic.MaxSessionsPerSource, "collector.ipfix.max-sessions-per-source", ipfix.DefaultMaxSessionsPerSource, "IPFIX TCP/TLS sessions from one address; more are refused and counted")
	fs.IntVar(&ic.MaxSessionsPerPrefix, "collector.ipfix.max-sessions-per-prefix", ipfix.DefaultMaxSessionsPerPrefix, "IPFIX TCP/TLS sessions from one IPv4 /24 or IPv6 /64 (127.0.0.0/8 counts as one); more are refused and counted")
	fs.DurationVar(&ic.IdleTimeout, "collector.ipfix.idle-timeout", ipfix.DefaultIdleTimeout, "close an IPFIX TCP/TLS session that sent no templates or records for this long (the exporter reconnects when it has flows)")
	fs.Int64Var(&ic.MaxTemplateBytesTotal, "collector.ipfix.max-template-bytes-total", ipfix.DefaultMaxTemplateBytesTotal, "template memory of all IPFIX sessions together; further templates are refused and counted (each session is also capped at 1 MiB)")
	fs.DurationVar(&ic.MessageTimeout, "collector.ipfix.message-timeout", ipfix.DefaultMessageTimeout, "close an IPFIX TCP/TLS session whose message does not complete within this long after its header")
	fs.IntVar(&ic.UDPReadBuffer, "collector.ipfix.udp-read-buffer", ipfix.DefaultUDPReadBuffer, "UDP socket receive buffer in bytes (SO_RCVBUFFORCE as root)")
	fs.DurationVar(&ic.Limits.TemplateLifetime, "collector.ipfix.template-lifetime", ipfix.DefaultTemplateLifetime, "lifetime of a UDP template that is not refreshed")
	fs.IntVar(&ic.Limits.MaxTemplates, "collector.ipfix.max-templates", ipfix.DefaultMaxTemplates, "templates per IPFIX session; more are ignored and counted")
	fs.DurationVar(&c.Correlate.Timeout, "collector.correlate.timeout", correlate.DefaultTimeout, "how long a cross-node flow half waits for the other node's half")
	fs.IntVar(&c.Correlate.MaxHeld, "collector.correlate.max-held", correlate.DefaultMaxHeld, "flow halves held waiting; past it the oldest is written unmatched and counted")
	fs.StringVar(&c.InventoryFile, "collector.inventory", "", "Kubernetes manifest with the Node objects (spec.podCIDRs, addresses) used to correlate cross-node flows (default: the Kubernetes enrichment's objects)")
	fs.StringVar(&c.FlowMetricsFile, "collector.flow-metrics", "", "YAML file selecting the flow metrics on /metrics (dualflow_flow_*_total: bytes, packets, connections, denied connections), their labels and the series bound per metric (docs/metrics.md; default: by namespace pair, family, protocol and verdict, 20,000 series per metric; `metrics: []` turns them off)")
	c.K8s.BindFlags(fs)
	c.Audit.BindFlags(fs)
}

// addrList binds a comma-separated address list flag.
func addrList(fs *flag.FlagSet, dst *[]string, name, def, usage string) {
	*dst = ipfix.SplitAddrs(def)
	fs.Func(name, usage+" (default \""+def+"\")", func(v string) error {
		*dst = ipfix.SplitAddrs(v)
		return nil
	})
}

// ingest reports whether any IPFIX listener is configured.
func (c *Config) ingest() bool {
	return len(c.IPFIX.TCPAddrs)+len(c.IPFIX.UDPAddrs)+len(c.IPFIX.TLSAddrs) > 0
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	c.Store.SetDefaults()
	if c.Writer.SpoolDir == "" && c.Store.Embedded() {
		c.Writer.SpoolDir = filepath.Join(filepath.Dir(filepath.Clean(c.Store.DataDir)), "spool")
	}
	if c.WAL.Dir == "" && c.Store.Embedded() {
		c.WAL.Dir = filepath.Join(filepath.Dir(filepath.Clean(c.Store.DataDir)), "wal")
	}
	if c.WAL.Dir == "off" {
		c.WAL.Dir = ""
	}
	c.Writer.SetDefaults()
	c.IPFIX.SetDefaults()
	c.Correlate.SetDefaults()
	if c.K8s.Source == "" && c.K8s.SyncTimeout == 0 {
		// A zero Config (not bound to flags): the enrichment defaults.
		inv := c.K8s.Inventory
		c.K8s = enrich.NewConfig()
		c.K8s.Inventory = inv
	}
	c.K8s.SetDefaults()
	c.Audit.SetDefaults()
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var ingest error
	if c.ingest() {
		ingest = c.IPFIX.Validate()
	}
	var fm error
	if c.FlowMetricsFile != "" {
		_, fm = flowmetrics.LoadConfig(c.FlowMetricsFile)
	}
	return errors.Join(c.Store.Validate(), c.Writer.Validate(), ingest, c.K8s.Validate(), c.Audit.Validate(), fm)
}

// Queue sizes, in batches of up to ipfix.DefaultBatchRecords (1024) records
// of ~730 bytes: each full batch is ~0.75 MB.
const (
	// decodedQueue takes the listeners' output. Overflow: TCP/TLS block,
	// UDP drops and counts (dualflow_records_dropped_total{stage="decode"}).
	// 32 batches ≈ 24 MB, ~0.1 s at the target rate: a burst absorber.
	decodedQueue = 32
	// correlatedQueue and enrichedQueue block when full; 16 batches each
	// ≈ 12 MB. The writer has its own bound (MaxPending batches).
	correlatedQueue = 16
	enrichedQueue   = 16
	// drainTimeout bounds the flush of the stages at shutdown, before the
	// writer's own ShutdownTimeout; records still queued then are counted
	// as dropped (reason aborted).
	drainTimeout = 30 * time.Second
)

// Collector is a running collector. Create it with New, then call Run.
type Collector struct {
	cfg    Config
	log    *slog.Logger
	reg    *prometheus.Registry
	conn   store.Conn
	writer *store.Writer
	http   *chhttp.Server // nil unless embedded with HTTPAddr
	httpLn net.Listener   // http's listener, bound by New
	metLn  net.Listener   // the metrics listener, bound by New (nil: off)
	ready  chan struct{}

	pm         *pipeline.Metrics
	pool       *pipeline.Pool
	decoded    *pipeline.Queue
	correlated *pipeline.Queue
	enriched   *pipeline.Queue
	listener   *ipfix.Listener // nil without ingest
	wal        *wal.Log        // nil when off or without ingest
	correlator *correlate.Correlator
	enricher   pipeline.Enricher
	k8s        *enrich.Enricher   // nil when the enrichment is off
	auditor    *audit.Auditor     // nil when the enrichment is off
	cluster    clusterView        // Cluster's cache
	schema     *migrations.Keeper // nil when this collector may not change the schema
	schemaM    *schemaMetrics
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
	if s, ok := conn.(*store.Server); ok {
		reg.MustRegister(s.Metrics()) // its TLS files' reloads
	}
	c := &Collector{cfg: cfg, log: log, reg: reg, conn: conn, ready: make(chan struct{})}
	if err := c.build(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// build migrates the store and builds the writer, the embedded engine's
// ClickHouse HTTP interface (its users file created at first start), the
// stages and the listeners.
func (c *Collector) build(ctx context.Context) error {
	if err := c.migrate(ctx); err != nil {
		return err
	}
	var err error
	if c.writer, err = store.NewWriter(c.cfg.Writer, c.conn, c.reg, c.log.With("stage", "store")); err != nil {
		return err
	}
	if e, ok := c.conn.(*store.Embedded); ok && c.cfg.Store.HTTPAddr != "" {
		cfg := chhttp.Config{Registerer: c.reg, Logger: c.log.With("stage", "clickhouse-http")}
		if c.http, err = c.cfg.Store.HTTPInterface(e, cfg); err != nil {
			return err
		}
	}
	if err := c.buildPipeline(); err != nil {
		return err
	}
	return c.bind()
}

// bind opens the ClickHouse HTTP and metrics listeners, so that a port in
// use fails New and port 0 gets its address before Run.
func (c *Collector) bind() error {
	var err error
	if c.http != nil {
		if c.httpLn, err = net.Listen("tcp", c.cfg.Store.HTTPAddr); err != nil {
			return fmt.Errorf("clickhouse http listener: %w", err)
		}
	}
	if c.cfg.MetricsAddr != "" {
		if c.metLn, err = net.Listen("tcp", c.cfg.MetricsAddr); err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
	}
	return nil
}

// Close releases a collector that will not Run: its listeners and the
// store. Run does this itself.
func (c *Collector) Close() error {
	var errs []error
	if c.listener != nil {
		errs = append(errs, c.listener.Close())
	}
	for _, ln := range []net.Listener{c.httpLn, c.metLn} {
		if ln != nil {
			errs = append(errs, ln.Close())
		}
	}
	if c.wal != nil {
		errs = append(errs, c.wal.Close())
	}
	errs = append(errs, c.conn.Close())
	return errors.Join(errs...)
}

// Database is the database holding the dualflow tables.
func (c *Collector) Database() string { return c.cfg.Store.Database }

// HTTPAddr is the bound address of the ClickHouse HTTP interface of the
// embedded store (nil when not served).
func (c *Collector) HTTPAddr() net.Addr { return addrOf(c.httpLn) }

// MetricsAddr is the bound address of /metrics (nil when off).
func (c *Collector) MetricsAddr() net.Addr { return addrOf(c.metLn) }

func addrOf(ln net.Listener) net.Addr {
	if ln == nil {
		return nil
	}
	return ln.Addr()
}

// buildPipeline creates the queues and stages and binds the listeners.
func (c *Collector) buildPipeline() error {
	c.pm = pipeline.NewMetrics(c.reg)
	// Batches are handed on at BatchRecords; the headroom lets the last
	// message (at most a few hundred records) land without growing them.
	// Up to a batch per queue slot, plus the one each listener, the
	// correlator (in and out), the enricher and the writer stage hold.
	c.pool = pipeline.NewPool(2*c.cfg.IPFIX.BatchRecords, decodedQueue+correlatedQueue+enrichedQueue+8)
	c.decoded = pipeline.NewQueue("decoded", decodedQueue, c.pm)
	c.correlated = pipeline.NewQueue("correlated", correlatedQueue, c.pm)
	c.enriched = pipeline.NewQueue("enriched", enrichedQueue, c.pm)
	var inv *enrich.Nodes
	if c.cfg.InventoryFile != "" {
		var err error
		if inv, err = enrich.LoadNodes(c.cfg.InventoryFile); err != nil {
			return err
		}
		c.log.Info("loaded node inventory", "file", c.cfg.InventoryFile, "nodes", inv.Len())
	}
	c.enricher = pipeline.Passthrough{}
	if c.cfg.K8s.Source != enrich.SourceOff {
		var err error
		if c.k8s, err = enrich.New(c.cfg.K8s, c.reg, c.log.With("stage", "enrich")); err != nil {
			return err
		}
		if c.auditor, err = audit.New(c.cfg.Audit, c.k8s, c.reg); err != nil {
			return err
		}
		c.enricher = enrichAndAudit{c.k8s, c.auditor}
	}
	fmc := flowmetrics.DefaultConfig()
	if c.cfg.FlowMetricsFile != "" {
		var err error
		if fmc, err = flowmetrics.LoadConfig(c.cfg.FlowMetricsFile); err != nil {
			return err
		}
	}
	fm, err := flowmetrics.New(fmc)
	if err != nil {
		return err
	}
	if err := c.reg.Register(fm); err != nil {
		return fmt.Errorf("flow metrics: %w", err)
	}
	c.enricher = withFlowMetrics{c.enricher, fm}
	switch {
	case inv != nil:
		c.correlator = correlate.New(c.cfg.Correlate, inv, c.reg)
	case c.k8s != nil:
		c.correlator = correlate.New(c.cfg.Correlate, c.k8s, c.reg)
	default:
		c.correlator = correlate.New(c.cfg.Correlate, nil, c.reg)
	}
	if c.cfg.ingest() && c.cfg.WAL.Dir != "" {
		var err error
		if c.wal, err = wal.Open(c.cfg.WAL, c.reg, c.log.With("stage", "wal")); err != nil {
			return err
		}
		c.decoded.SetJournal(c.wal)
		c.writer.SetAcker(c.wal)
	}
	if c.cfg.ingest() {
		ic := c.cfg.IPFIX
		// Record times are kept within half the store's retention of
		// their export and receive times, else stamped: a row the TTL
		// deletes as it is inserted would be counted as written and lost.
		ic.Retention = time.Duration(c.cfg.Store.TTLDays) * 24 * time.Hour
		l, err := ipfix.New(ic, c.decoded, c.pool, c.pm, c.reg, c.log.With("stage", "ipfix"))
		if err != nil {
			return err
		}
		c.listener = l
	}
	return nil
}

// IPFIXAddrs returns the bound IPFIX listener addresses by transport
// ("tcp", "udp", "tls"); useful with port 0.
func (c *Collector) IPFIXAddrs() map[string][]net.Addr {
	if c.listener == nil {
		return nil
	}
	return map[string][]net.Addr{"tcp": c.listener.TCPAddrs(), "udp": c.listener.UDPAddrs(), "tls": c.listener.TLSAddrs()}
}

// migrate applies the pending migrations. While ClickHouse cannot be
// reached (a server, or `dualflow store`, starting with the collector) it
// retries with backoff for StoreWait, logging each failure; a refusal
// (bad credentials, bad SQL) fails at once. A user who may only insert
// (the inserter of `dualflow store`, a server user with INSERT and SELECT)
// applies nothing: the schema must be current, which it checks.
func (c *Collector) migrate(ctx context.Context) error {
	r, err := migrations.NewRunner(c.conn, c.cfg.Store.Migrations())
	if err != nil {
		return err
	}
	r.Version = c.cfg.Version
	deadline := time.Now().Add(c.cfg.StoreWait)
	for delay := 250 * time.Millisecond; ; delay = min(2*delay, 10*time.Second) {
		done, err := r.Up(ctx)
		for _, m := range done {
			c.log.Info("applied migration", "name", m.Name)
		}
		if store.Forbidden(err) {
			return c.schemaCurrent(ctx, r, err)
		}
		if err == nil {
			return c.keepSchema(ctx, r)
		}
		if !store.Unavailable(err) || time.Now().Add(delay).After(deadline) {
			return err
		}
		c.log.Warn("clickhouse not reachable yet; retrying", "err", err, "retry_in", delay, "gives_up_at", deadline.Format(time.RFC3339))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}

// schemaCurrent is migrate for a ClickHouse user who may not change the
// schema (refused, the statement Up was refused with): nil when no
// migration is pending, else an error that says who applies them.
func (c *Collector) schemaCurrent(ctx context.Context, r *migrations.Runner, refused error) error {
	pending, err := r.Pending(ctx)
	if err != nil {
		return fmt.Errorf("this collector's ClickHouse user may not apply migrations (%v), nor read which are applied: %w", refused, err)
	}
	if len(pending) > 0 {
		return fmt.Errorf("the schema lacks %d migrations (first %s) and this collector's ClickHouse user may not apply them (%v): apply them with `dualflow migrate` as an admin, or let `dualflow store` apply them at its start", len(pending), pending[0].Name, refused)
	}
	c.log.Info("the schema is current; this collector's ClickHouse user applies no migrations (it may not)")
	return nil
}

// Writer returns the store writer that the ingest pipeline feeds.
func (c *Collector) Writer() *store.Writer { return c.writer }

// Conn returns the store connection (for queries).
func (c *Collector) Conn() store.Conn { return c.conn }

// Registry returns the collector's Prometheus registry.
func (c *Collector) Registry() *prometheus.Registry { return c.reg }

// Run runs every stage until ctx is cancelled, then shuts them down in
// pipeline order: the listeners stop and hand on their last records, the
// decoded queue is closed, the correlator flushes its held halves, enrich
// and write drain, and the writer flushes (or spools) what it was handed.
// Then it closes the store. It returns the first stage error.
func (c *Collector) Run(ctx context.Context) error {
	defer c.conn.Close()
	g, gctx := errgroup.WithContext(ctx)
	// The writer outlives the other stages: it stops after them, so it gets
	// the records they flush on the way out. If it stops on its own (its
	// spool cannot be opened, say), the whole collector stops with it.
	writerCtx, stopWriter := context.WithCancel(context.WithoutCancel(ctx))
	writerDone := make(chan struct{})
	var writerErr error
	go func() { writerErr = c.writer.Run(writerCtx); close(writerDone) }()
	g.Go(func() error {
		select {
		case <-writerDone:
			return fmt.Errorf("store writer stopped: %w", cmp.Or(writerErr, errors.New("no error")))
		case <-gctx.Done():
			return nil
		}
	})
	// The stages end when their input queue is closed, not with ctx;
	// drainCtx only aborts them if draining takes longer than drainTimeout.
	drainCtx, abortDrain := context.WithCancel(context.WithoutCancel(ctx))
	defer abortDrain()
	var stages sync.WaitGroup
	stages.Go(func() { c.correlator.Run(drainCtx, c.decoded, c.correlated, c.pool, c.pm) })
	stages.Go(func() { pipeline.RunEnrich(drainCtx, c.enricher, c.correlated, c.enriched, c.pm) })
	stages.Go(func() { pipeline.RunWrite(drainCtx, c.writer, c.enriched, c.pm) })
	if c.k8s != nil {
		g.Go(func() error { return c.k8s.Run(gctx) })
		// Evaluate policies only once every kind is listed: an empty policy
		// set would call every pod "not isolated".
		g.Go(func() error {
			if err := c.k8s.WaitForSync(gctx); err != nil {
				return err
			}
			return c.auditor.Run(gctx, c.k8s.AllNetworkPolicies, c.k8s.PoliciesChanged(), c.log.With("stage", "audit"))
		})
	}
	if c.http != nil {
		g.Go(func() error { return c.http.Serve(gctx, c.httpLn) })
		c.log.Info("serving the ClickHouse HTTP interface", "url", "http://"+c.httpLn.Addr().String()+"/")
	}
	if c.metLn != nil {
		g.Go(func() error { return c.serveMetrics(gctx) })
	}
	if c.schema != nil {
		g.Go(func() error { c.schema.Run(gctx, schemaCheckInterval, c.reportRepairs); return nil })
	}
	g.Go(func() error {
		// Serve IPFIX (and say ready) once the Kubernetes caches are
		// synced, so records are never written unenriched at start (the
		// kernel buffers them) and the cluster view is whole.
		if c.k8s != nil {
			if err := c.k8s.WaitForSync(gctx); err != nil {
				return err
			}
			c.log.Info("kubernetes caches synced")
		}
		if c.listener == nil {
			close(c.ready)
			return nil
		}
		if err := c.replay(gctx); err != nil {
			return err
		}
		for tr, addrs := range c.IPFIXAddrs() {
			for _, a := range addrs {
				c.log.Info("receiving IPFIX", "transport", tr, "addr", a.String())
			}
		}
		close(c.ready)
		return c.listener.Run(gctx)
	})
	<-gctx.Done()
	err := g.Wait()
	// Every producer of the decoded queue has returned.
	c.decoded.Close()
	abort := time.AfterFunc(drainTimeout, abortDrain)
	stages.Wait()
	abort.Stop()
	stopWriter()
	<-writerDone
	if c.wal != nil {
		// Every record the writer took is acknowledged by now; what
		// remains (aborted at shutdown) is replayed at the next start.
		if werr := c.wal.Close(); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	if writerErr != nil && !errors.Is(writerErr, context.Canceled) && !errors.Is(err, writerErr) {
		err = errors.Join(err, writerErr)
	}
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// replay feeds the records a crashed run left in the write-ahead log into
// the pipeline, before the listeners take new ones.
func (c *Collector) replay(ctx context.Context) error {
	if c.wal == nil {
		return nil
	}
	start := time.Now()
	stored := func(intents []wal.Intent) (map[string]bool, error) { return c.storedBatches(ctx, intents) }
	n, err := c.wal.ReplayVerified(c.cfg.IPFIX.BatchRecords, stored, func(recs []flow.Record) error {
		b := c.pool.Get()
		b.Recs = append(b.Recs, recs...)
		if err := c.decoded.Put(ctx, b); err != nil {
			b.Release()
			return err
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("replay the write-ahead log: %w", err)
	}
	if n > 0 {
		c.log.Warn("replayed records of a previous run that had not reached the store (the collector was killed or crashed)",
			"records", n, "took", time.Since(start).Round(time.Millisecond), "dir", c.cfg.WAL.Dir)
	}
	return nil
}

// verifyTimeout bounds how long a starting collector keeps asking an
// unreachable store which batches of its previous run it holds, before it
// replays them (at-least-once) and goes on receiving.
const verifyTimeout = 30 * time.Second

// storedBatches tells the journal which batches of the previous run are
// stored: in the writer's spool (asked first: see Writer.Spooled), or in
// ClickHouse (flows.ingest_batch). It retries every second or so while
// ClickHouse cannot be reached, for verifyTimeout.
func (c *Collector) storedBatches(ctx context.Context, intents []wal.Intent) (map[string]bool, error) {
	found := map[string]bool{}
	var ask []store.BatchRange
	for _, in := range intents {
		ok, err := c.writer.Spooled(ctx, in.Token)
		if err != nil {
			return nil, err
		}
		if ok {
			found[in.Token] = true
			continue
		}
		ask = append(ask, store.BatchRange{Token: in.Token, MinEnd: in.MinEnd, MaxEnd: in.MaxEnd, Rows: in.Rows})
	}
	if len(ask) == 0 {
		return found, nil
	}
	deadline := time.Now().Add(verifyTimeout)
	for attempt := 0; ; attempt++ {
		qctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		in, err := store.StoredBatches(qctx, c.conn, c.cfg.Store.Database, ask)
		cancel()
		if err == nil {
			for t := range in {
				found[t] = true
			}
			c.log.Info("checked the store for the batches the previous run was inserting when it stopped",
				"batches", len(intents), "stored", len(found))
			return found, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, err
		}
		if attempt == 0 {
			c.log.Warn("cannot ask the store which batches of the previous run it holds; retrying", "err", err, "for", verifyTimeout)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// Enricher returns the Kubernetes enrichment (nil when it is off): the
// live view that traceflow resolves pod and Service names through (see
// also Cluster).
func (c *Collector) Enricher() *enrich.Enricher { return c.k8s }

// Auditor returns the policy auditor (nil when the enrichment is off).
func (c *Collector) Auditor() *audit.Auditor { return c.auditor }

// Ready is closed once the collector serves: caches synced, listeners on.
func (c *Collector) Ready() <-chan struct{} { return c.ready }

// enrichAndAudit is the enrich stage: Kubernetes metadata, then the
// policy verdicts that need it.
type enrichAndAudit struct {
	enrich pipeline.Enricher
	audit  *audit.Auditor
}

func (s enrichAndAudit) Enrich(recs []flow.Record) {
	s.enrich.Enrich(recs)
	s.audit.AuditBatch(recs)
}

// withFlowMetrics counts the records an enrich stage has enriched and
// audited in the flow metrics.
type withFlowMetrics struct {
	pipeline.Enricher
	m *flowmetrics.Metrics
}

func (s withFlowMetrics) Enrich(recs []flow.Record) {
	s.Enricher.Enrich(recs)
	s.m.Observe(recs)
}

// k8sStaleness describes a stale view of the cluster, "" when current.
func (c *Collector) k8sStaleness() string {
	if c.k8s == nil || !c.k8s.Stale() {
		return ""
	}
	var kinds []string
	var worst time.Duration
	for _, s := range c.k8s.Status() {
		if !s.Watching {
			kinds = append(kinds, s.Kind)
			worst = max(worst, s.StaleFor)
		}
	}
	if len(kinds) == 0 { // it came back between the two reads
		return ""
	}
	return fmt.Sprintf("kubernetes view stale: no watch of %s for %v (is the API server reachable?); names may be out of date, rows written meanwhile have k8s_view_stale = true",
		strings.Join(kinds, ", "), worst.Round(time.Second))
}

func (c *Collector) serveMetrics(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(c.reg, promhttp.HandlerOpts{Registry: c.reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if err := c.Readiness(r.Context()); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
		// A stale view of the cluster is said, not failed: failing
		// readiness would take the collector out of its Service and
		// lose flows, which is worse than names that may be late.
		if msg := c.k8sStaleness(); msg != "" {
			fmt.Fprintln(w, "warning: "+msg)
		}
	})
	ln := c.metLn
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	c.log.Info("serving metrics", "url", "http://"+ln.Addr().String()+"/metrics")
	return httpserve.Serve(ctx, srv, ln, 5*time.Second)
}
