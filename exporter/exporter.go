// Package exporter is `dualflow exporter`, run on every node: it turns the
// kernel's connection tracking table (exporter/conntrack) into flow records
// through the connection store (exporter/connstore) and ships them as IPFIX
// to the collector (exporter/ipfix), IPv4 and IPv6 alike; or, given
// several collectors, shards them over those so both halves of a
// connection meet at one (exporter/shard).
//
//	conntrack dumps + NEW/DESTROY events → connstore (deltas, timeouts) → IPFIX sender → collector
//
// With --exporter.source ovs the connections come from Open vSwitch
// instead (exporter/ovs: OVS conntrack, counters from flow statistics),
// and denied connections (drop packet-ins) are exported as records of
// their own.
//
// Records carry the node name, "conntrack" (or "ovs") as their source and,
// when pod CIDRs are configured, the flow type and the node of local
// endpoints.
// Prometheus metrics are served on Config.MetricsAddr.
package exporter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/exporter/conntrack"
	"github.com/dualflow/dualflow/exporter/ipfix"
	"github.com/dualflow/dualflow/exporter/ovs"
	"github.com/dualflow/dualflow/exporter/shard"
	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
	"github.com/dualflow/dualflow/internal/httpserve"
	"github.com/dualflow/dualflow/internal/ratelog"
	"github.com/dualflow/dualflow/internal/reload"
)

// source is the conntrack table as the exporter uses it; *conntrack.Source
// implements it, tests use a fake.
type source interface {
	Dump(version uint8, dst []connstore.Conn) ([]connstore.Conn, error)
	Listen(ctx context.Context, fn func([]connstore.Conn)) error
	Accounting() (conntrack.Accounting, error)
	Close() error
}

var _ source = (*conntrack.Source)(nil)

// subscriber is a source that tells when its event subscription is in
// place, so the first dump can follow it without a gap.
type subscriber interface {
	ListenReady(ctx context.Context, fn func([]connstore.Conn), ready func()) error
}

var _ subscriber = (*conntrack.Source)(nil)

// recordSender ships records to the collectors: *ipfix.Exporter for one
// collector, *shard.Sharder for several.
type recordSender interface {
	Export([]flow.Record)
	Flush()
	Run(ctx context.Context) error
	Stats() ipfix.Stats
}

var (
	_ recordSender = (*ipfix.Exporter)(nil)
	_ recordSender = (*shard.Sharder)(nil)
)

// Exporter runs the pipeline of one node.
type Exporter struct {
	cfg    Config
	src    source // nil: opened by Run
	store  *connstore.Store
	sender recordSender
	reg    *prometheus.Registry
	m      *metrics
	cls    classifier
	log    *slog.Logger

	versions []uint8
	dumpBuf  []connstore.Conn // poll goroutine only
	recBuf   []flow.Record    // poll goroutine only

	ready       chan struct{}    // see Ready
	metricsAddr net.Addr         // set before ready is closed
	warns       *ratelog.Limiter // conntrack dumps and events: a line a minute per kind
	sourceName  string           // Record.Source of every record
}

// expireEvery is how often the store is checked for records due. It bounds
// how late an ended connection is exported.
const expireEvery = time.Second

// shutdownGrace bounds stopping the metrics server.
const shutdownGrace = 2 * time.Second

// New builds an exporter from cfg, which must have been through SetDefaults
// and Validate. The conntrack table is opened by Run.
func New(cfg Config) (*Exporter, error) {
	return newExporter(cfg, nil)
}

func newExporter(cfg Config, src source) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	store, err := connstore.New(cfg.Store)
	if err != nil {
		return nil, err
	}
	log := cmp.Or(cfg.Logger, slog.Default())
	if cfg.IPFIX.Logger == nil {
		cfg.IPFIX.Logger = log
	}
	if cfg.IPFIX.Transport == ipfix.TLS && cfg.IPFIX.TLSFiles == nil {
		// Loaded once for every collector of a shard, reloaded when the
		// files change.
		if cfg.IPFIX.TLSFiles, err = cfg.IPFIX.LoadTLS(); err != nil {
			return nil, err
		}
	}
	var sender recordSender
	var sharder *shard.Sharder
	if cfg.Shard.Enabled() {
		sc := cfg.Shard
		sc.IPFIX, sc.Logger = cfg.IPFIX, log
		if sharder, err = shard.New(sc); err != nil {
			return nil, err
		}
		sender = sharder
	} else if sender, err = ipfix.New(cfg.IPFIX); err != nil {
		return nil, err
	}
	e := &Exporter{
		cfg: cfg, src: src, store: store, sender: sender, reg: prometheus.NewRegistry(),
		cls:        classifier{node: cfg.NodeName, local: cfg.LocalCIDRs, cluster: cfg.ClusterCIDRs},
		log:        log,
		versions:   cfg.source().Versions(),
		ready:      make(chan struct{}),
		warns:      ratelog.New(log, time.Minute, 2),
		sourceName: fipfix.SourceConntrack,
	}
	if cfg.Source == SourceOVS {
		e.sourceName = ovs.SourceName
	}
	e.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	e.m = newMetrics(e.reg, store, sender)
	e.reg.MustRegister(reload.Metrics(cfg.IPFIX.TLSFiles))
	if sharder != nil {
		e.reg.MustRegister(sharder)
	}
	return e, nil
}

// Registerer holds the metrics served on Config.MetricsAddr; what runs
// beside the exporter on the node registers there too, before Run.
func (e *Exporter) Registerer() prometheus.Registerer { return e.reg }

// Ready is closed once Run is running: the metrics listener is up, the
// event subscription is in place (or its first attempt failed, which is
// logged and retried) and the first dump has been merged. It is never
// closed if Run fails to start.
func (e *Exporter) Ready() <-chan struct{} { return e.ready }

// Run opens the conntrack table and the metrics listener, subscribes to
// events, dumps the table (then Ready is closed), and keeps polling,
// listening and exporting until ctx is done. It then stops the event
// subscription, dumps the table once more, flushes every tracked connection
// with reason forced end, sends what is buffered (for at most
// Config.IPFIX.DrainTimeout), closes everything and returns. It returns an
// error only when it cannot start.
func (e *Exporter) Run(ctx context.Context) error {
	src := e.src
	switch {
	case src != nil:
	case e.cfg.Source == SourceOVS:
		s, err := ovs.New(e.cfg.OVS, e.reg)
		if err != nil {
			return err
		}
		src = ovsSource{s}
	default:
		s, err := conntrack.Open(e.cfg.source())
		if err != nil {
			return err
		}
		src = s
	}
	defer src.Close()
	if e.cfg.Source != SourceOVS {
		if err := e.checkAccounting(src); err != nil {
			return err
		}
		if err := e.checkPermission(src); err != nil {
			return err
		}
	}
	var srv *http.Server
	var ln net.Listener
	if e.cfg.MetricsAddr != "" {
		var err error
		if ln, err = net.Listen("tcp", e.cfg.MetricsAddr); err != nil {
			return fmt.Errorf("metrics listener: %w", err)
		}
		e.metricsAddr = ln.Addr()
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{Registry: e.reg}))
		// Liveness: the process serves. Readiness: Ready is closed (the
		// table is open, events subscribed, the first dump merged) and Run
		// is not stopping.
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok\n") })
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			select {
			case <-ctx.Done():
				http.Error(w, "stopping", http.StatusServiceUnavailable)
				return
			default:
			}
			select {
			case <-e.ready:
				io.WriteString(w, "ok\n")
			default:
				http.Error(w, "starting: first conntrack dump not merged yet", http.StatusServiceUnavailable)
			}
		})
		srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}

	var wg sync.WaitGroup
	sendCtx, stopSend := context.WithCancel(context.Background())
	defer stopSend()
	wg.Go(func() { e.sender.Run(sendCtx) })
	if srv != nil {
		wg.Go(func() { // until the sender has flushed (stopSend)
			if err := httpserve.Serve(sendCtx, srv, ln, shutdownGrace); err != nil {
				e.log.Error("metrics server stopped", "err", err)
			}
		})
	}
	evCtx, stopEvents := context.WithCancel(ctx)
	defer stopEvents()
	reconcile := make(chan struct{}, 1) // cap 1: a pending reconcile covers every later request
	subscribed := make(chan struct{})   // closed after the first subscription attempt
	var evWG sync.WaitGroup
	if e.cfg.Events {
		evWG.Go(func() { e.listen(evCtx, src, reconcile, subscribed) })
	} else {
		close(subscribed)
	}
	if d, ok := src.(deniedSource); ok {
		evWG.Go(func() { d.Denied(evCtx, e.post) })
	}
	collector := any(e.cfg.IPFIX.Address)
	switch {
	case e.cfg.Shard.DNS != "":
		collector = "dns:" + e.cfg.Shard.DNS
	case len(e.cfg.Shard.Collectors) > 0:
		collector = e.cfg.Shard.Collectors
	}
	e.log.Info("exporter started", "node", e.cfg.NodeName, "netns", e.cfg.NetNS, "ipv4", e.cfg.IPv4, "ipv6", e.cfg.IPv6,
		"zones", e.cfg.Zones, "collector", collector, "transport", e.cfg.IPFIX.Transport,
		"metrics", e.metricsAddr, "events", e.cfg.Events)
	// Take over from the last run on this node before the first dump.
	if e.cfg.StateDir != "" {
		if fi, err := os.Stat(e.cfg.StateDir); err != nil || !fi.IsDir() {
			e.log.Warn("exporter: --exporter.state-dir is not a directory: this run cannot leave the next one what it exported", "dir", e.cfg.StateDir, "err", err)
		}
		marks, err := readHandover(e.handoverFile(), e.cfg.NodeName, e.cfg.NetNS, time.Now())
		if err != nil {
			e.log.Warn("exporter: not taking over from the last run: its connections still in conntrack are exported again", "err", err)
			e.m.handover.WithLabelValues("invalid").Inc()
		} else if marks != nil {
			e.store.Resume(marks, time.Now())
			e.log.Info("took over from the last run on this node", "connections", len(marks))
			e.m.handover.WithLabelValues("resumed").Inc()
		}
	}
	// Subscribe first, then dump: a connection that starts in between is
	// in the dump or its events, never in neither.
	select {
	case <-subscribed:
	case <-ctx.Done():
	}
	e.poll(src)
	close(e.ready)

	pollT := time.NewTicker(e.cfg.PollInterval)
	defer pollT.Stop()
	expireT := time.NewTicker(min(expireEvery, e.cfg.PollInterval))
	defer expireT.Stop()
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case <-pollT.C:
			e.poll(src)
		case <-reconcile:
			e.poll(src)
		case now := <-expireT.C:
			e.expire(now)
		}
	}

	// Teardown: no more events, one last look at the counters, then
	// everything out with reason forced end.
	stopEvents()
	evWG.Wait()
	e.poll(src)
	recs, marks := e.store.Flush(flow.EndReasonForcedEnd, e.recBuf[:0], nil)
	e.post(recs)
	if e.cfg.StateDir != "" {
		if err := writeHandover(e.handoverFile(), e.cfg.NodeName, e.cfg.NetNS, marks, time.Now()); err != nil {
			e.log.Warn("exporter: the next run will export this run's connections still in conntrack again", "err", err)
		} else {
			e.log.Info("left the next run on this node what this one exported", "connections", len(marks), "file", e.handoverFile())
		}
	}
	e.sender.Flush()
	stopSend()
	wg.Wait()
	st := e.sender.Stats()
	e.log.Info("exporter stopped", "records_sent", st.Records[0]+st.Records[1],
		"dropped_buffer_full", st.DroppedBufferFull, "dropped_shutdown", st.DroppedShutdown, "dropped_oversize", st.DroppedOversize,
		"dropped_invalid", st.DroppedInvalid, "retried", st.RetriedRecords)
	return nil
}

// checkAccounting reports the sysctls counters and timestamps depend on,
// and fails when they are off and Config.RequireAccounting is set.
func (e *Exporter) checkAccounting(src source) error {
	a, err := src.Accounting()
	if err != nil {
		if e.cfg.RequireAccounting {
			return err
		}
		e.log.Warn("cannot read the conntrack sysctls of the target netns; counters and start times may be missing", "err", err)
		return nil
	}
	e.m.setAccounting(a)
	if err := a.Err(); err != nil {
		if e.cfg.RequireAccounting && (!a.Acct || !a.Timestamp) {
			return err
		}
		e.log.Warn("exporting with degraded records", "err", err)
	}
	return nil
}

// checkPermission dumps the table once: a dump refused for lack of
// privilege will not succeed later, so the exporter fails at start with
// what it needs rather than run exporting nothing. Other errors are left
// to poll, which logs and retries them.
func (e *Exporter) checkPermission(src source) error {
	if len(e.versions) == 0 {
		return nil
	}
	var err error
	e.dumpBuf, err = src.Dump(e.versions[0], e.dumpBuf[:0])
	if errors.Is(err, os.ErrPermission) {
		return fmt.Errorf("conntrack dump refused (%w): the exporter needs CAP_NET_ADMIN in the target network namespace, and CAP_SYS_ADMIN to enter it with --exporter.netns", err)
	}
	return nil
}

// poll dumps every enabled family, merges the entries, marks vanished
// connections as ended and exports what is due.
//
// Expire only runs on this goroutine, after the merge of a dump: an entry
// a dump still holds but whose DESTROY event the event goroutine merged
// meanwhile stays in the store (ended) until that dump is merged, so a
// stale dump can never bring an exported connection back and count it
// twice. The other way round (a DESTROY still queued when a dump finds the
// connection gone, or a dump that skipped a live connection) the store's
// tombstones match the late observation to what was already exported.
func (e *Exporter) poll(src source) {
	recs := e.recBuf[:0]
	for _, v := range e.versions {
		began := time.Now()
		var err error
		e.dumpBuf, err = src.Dump(v, e.dumpBuf[:0])
		if err != nil {
			e.m.pollErrors.WithLabelValues(familyOf(v)).Inc()
			e.warns.Warn("dump", netip.Addr{}, "conntrack dump failed", "family", familyOf(v), "err", err)
			continue
		}
		recs = e.store.Merge(e.dumpBuf, time.Now(), recs)
		e.store.Sweep(v, began)
		e.m.pollDuration.WithLabelValues(familyOf(v)).Observe(time.Since(began).Seconds())
	}
	recs = e.store.Expire(time.Now(), recs)
	e.post(recs)
	e.recBuf = recs[:0]
	clear(e.dumpBuf) // drop references to strings of the last dump
}

// expire exports the records due at now.
func (e *Exporter) expire(now time.Time) {
	recs := e.store.Expire(now, e.recBuf[:0])
	e.post(recs)
	e.recBuf = recs[:0]
}

// listen feeds conntrack events into the store until ctx is done,
// subscribing again after a failure. Lost events (ENOBUFS) trigger a
// reconciling poll. It closes subscribed once the first subscription is in
// place or has failed.
func (e *Exporter) listen(ctx context.Context, src source, reconcile chan<- struct{}, subscribed chan struct{}) {
	var once sync.Once
	attempted := func() { once.Do(func() { close(subscribed) }) }
	defer attempted()
	listen := func(ctx context.Context, fn func([]connstore.Conn)) error {
		if s, ok := src.(subscriber); ok {
			return s.ListenReady(ctx, fn, attempted)
		}
		attempted() // the best a plain source tells
		return src.Listen(ctx, fn)
	}
	var recs []flow.Record
	newEv, destroyEv := e.m.events.WithLabelValues("new"), e.m.events.WithLabelValues("destroy")
	for {
		err := listen(ctx, func(batch []connstore.Conn) {
			for i := range batch {
				if batch[i].Ended {
					destroyEv.Inc()
				} else {
					newEv.Inc()
				}
			}
			recs = e.store.Merge(batch, time.Now(), recs[:0])
			e.post(recs)
		})
		attempted()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, conntrack.ErrEventsLost) {
			e.m.eventLoss.Inc()
			e.warns.Warn("events", netip.Addr{}, "conntrack events lost; reconciling with a dump", "err", err)
			select {
			case reconcile <- struct{}{}:
			default:
			}
			continue
		}
		e.m.eventErrors.Inc()
		e.warns.Warn("events", netip.Addr{}, "conntrack event subscription failed; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// post completes records with what the exporter knows and hands them to
// the IPFIX sender.
func (e *Exporter) post(recs []flow.Record) {
	if len(recs) == 0 {
		return
	}
	for i := range recs {
		r := &recs[i]
		r.ExporterNode = e.cfg.NodeName
		r.Source = e.sourceName
		e.cls.classify(r)
	}
	e.m.countRecords(recs)
	e.sender.Export(recs)
}
