// Package probes remembers the probe packets traceflow sent recently and
// marks the flow records the exporters report for them, so that a trace
// does not show up as traffic (a dropped edge on the map, a denied flow in
// the audit, a point on the charts).
//
// The trace controller (traceflow.Controller) adds each probe when its
// trace starts, with its full tuple; the collector's enrichment stage calls
// Mark on every batch. A probe's records reach the collector later than
// the probe (after conntrack's or OVS's export: idle and active timeouts,
// then the correlator), so a probe is remembered Config.Linger past the
// end of its trace. A record is the probe's when:
//
//   - its source address and port (the echo id for ICMP) and protocol are
//     the probe's: they survive NAT (SNAT is reported separately);
//   - its destination is the probe's as sent (a pod, a Service's
//     ClusterIP and port, an address), before DNAT (the record's Service
//     address and port) or after (its destination), or one of the
//     addresses the probe may be delivered to (a Service's endpoints: a
//     record of the destination node's half carries only the endpoint);
//   - its flow start lies within the trace (the probe's first send up to
//     its timeout), give or take Config.Skew for the nodes' clocks.
//
// A record of the reply direction (an exporter that reports each direction
// as a record of its own, such as NetFlow) is matched the other way round.
// Only the probes of this process's controller are known: a probe sent by
// another collector's controller, or before a restart, is not marked.
package probes

import (
	"cmp"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/flow"
)

// Sent is one probe a trace sends (one IP family of it).
type Sent struct {
	TraceID string
	Src     netip.Addr
	SrcPort uint16 // the source port, or the echo id for ICMP and ICMPv6
	Proto   uint8  // IANA protocol number
	// Dst and DstPort are the destination as sent: a pod's address, a
	// Service's ClusterIP and port, or an address. DstPort is 0 for ICMP.
	Dst     netip.Addr
	DstPort uint16
	// Targets are the addresses the probe may be delivered to: the
	// destination pod, or the Service's endpoints (the destination after
	// DNAT; their port is not known here).
	Targets []netip.Addr
	// Start is when the trace started, before the probe's first send;
	// End the latest it may be sent (the trace's timeout).
	Start, End time.Time
}

// Config configures a Registry. Zero fields take the defaults.
type Config struct {
	// Linger is how long past a probe's End its records are still
	// marked (default DefaultLinger).
	Linger time.Duration
	// Skew is how far a record's flow start may lie outside a probe's
	// Start..End and still be the probe's: the nodes' clocks are not the
	// collector's (default DefaultSkew).
	Skew time.Duration
	// Max bounds the probes remembered (default DefaultMax). Past it the
	// oldest is forgotten early (overwrite-oldest) and counted.
	Max int
}

// Defaults of Config.
const (
	// DefaultLinger covers the exporters' delays: an unanswered TCP SYN
	// stays in conntrack for 2 minutes (nf_conntrack_tcp_timeout_syn_sent)
	// and is reported again when it goes, and an exporter reports a
	// connection after its idle timeout (15 s) or active timeout (60 s)
	// and its poll interval.
	DefaultLinger = 5 * time.Minute
	// DefaultSkew is the clock difference between a node and the
	// collector a record may show.
	DefaultSkew = 10 * time.Second
	// DefaultMax bounds the registry to about 3 MB at ~200 B a probe
	// (and 128 KiB of counts by port): 5 minutes of 50 family traces a
	// second, 10 times the default rate of one caller.
	DefaultMax = 1 << 14
)

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	c.Linger = cmp.Or(c.Linger, DefaultLinger)
	c.Skew = cmp.Or(c.Skew, DefaultSkew)
	c.Max = cmp.Or(c.Max, DefaultMax)
}

// key is one end of a probe's connection: its source address and port
// (echo id) and protocol. A record's source (forward) or destination
// (reply) is looked up by it.
type key struct {
	addr  netip.Addr
	port  uint16
	proto uint8
}

type entry struct {
	k       key
	id      string
	dst     netip.Addr
	dstPort uint16
	targets []netip.Addr
	// from and to bound the flow start of the probe's records; expires is
	// when the entry is forgotten (Unix nanoseconds).
	from, to, expires int64
	next              *entry // another probe of the same key, older
}

// Registry remembers recent probes. Its methods are safe for concurrent
// use. It is a prometheus.Collector of its own metrics.
type Registry struct {
	cfg Config
	now func() time.Time

	size    atomic.Int64 // probes remembered: Mark returns at once when 0
	headExp atomic.Int64 // expiry of the oldest entry: Mark prunes after it

	mu    sync.RWMutex
	byKey map[key]*entry
	// ports counts the entries by source port (echo id): a record whose
	// ports no probe has (nearly all of them) is passed over without
	// hashing its addresses.
	ports *[1 << 16]uint16
	queue []*entry // in Add order, oldest first, from head
	head  int

	marked, evicted atomic.Uint64
}

// New returns an empty registry.
func New(cfg Config) *Registry {
	cfg.SetDefaults()
	return &Registry{cfg: cfg, now: time.Now, byKey: map[key]*entry{}, ports: new([1 << 16]uint16)}
}

// Add remembers s until Linger past its End. (The controller adds no live
// trace: it sends nothing.)
func (r *Registry) Add(s Sent) {
	if !s.Src.IsValid() || !s.Dst.IsValid() || s.TraceID == "" {
		return
	}
	e := &entry{k: key{s.Src.Unmap(), s.SrcPort, s.Proto}, id: s.TraceID, dst: s.Dst.Unmap(), dstPort: s.DstPort,
		from: s.Start.Add(-r.cfg.Skew).UnixNano(), to: s.End.Add(r.cfg.Skew).UnixNano(), expires: s.End.Add(r.cfg.Linger).UnixNano()}
	for _, t := range s.Targets {
		if t = t.Unmap(); t.IsValid() && t != e.dst && !slices.Contains(e.targets, t) {
			e.targets = append(e.targets, t)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.prune(r.now().UnixNano())
	for r.len() >= r.cfg.Max {
		r.drop()
		r.evicted.Add(1)
	}
	e.next = r.byKey[e.k]
	r.byKey[e.k] = e
	r.ports[e.k.port]++
	r.queue = append(r.queue, e)
	r.sync()
}

// Mark sets ProbeTraceID on the records of recs that are a remembered
// probe's (see the package doc), and returns how many it marked. A record
// already marked is left alone. It costs one atomic load per batch while
// no probe is remembered; otherwise two array reads per record, and map
// lookups for the few records whose ports a probe has. It allocates
// nothing.
func (r *Registry) Mark(recs []flow.Record) int {
	if r.size.Load() == 0 || len(recs) == 0 {
		return 0
	}
	if now := r.now().UnixNano(); now >= r.headExp.Load() {
		r.mu.Lock()
		r.prune(now)
		r.mu.Unlock()
	}
	n := 0
	r.mu.RLock()
	for i := range recs {
		rec := &recs[i]
		if rec.ProbeTraceID != "" {
			continue
		}
		if id := r.match(rec); id != "" {
			rec.ProbeTraceID = id
			n++
		}
	}
	r.mu.RUnlock()
	if n > 0 {
		r.marked.Add(uint64(n))
	}
	return n
}

func (r *Registry) match(rec *flow.Record) string {
	icmp := rec.Proto == flow.ProtoICMP || rec.Proto == flow.ProtoICMPv6
	// Forward: the record's source is the probe's.
	if r.ports[rec.SrcPort] > 0 {
		for e := r.byKey[key{rec.SrcAddr, rec.SrcPort, rec.Proto}]; e != nil; e = e.next {
			if (e.reached(rec.DstAddr, rec.DstPort, icmp) || e.reached(rec.ServiceAddr, rec.ServicePort, icmp)) && e.during(rec) {
				return e.id
			}
		}
	}
	// Reply: the record's destination is the probe's source. An ICMP
	// reply carries the echo id in its source port too.
	port := rec.DstPort
	if icmp {
		port = rec.SrcPort
	}
	if r.ports[port] > 0 {
		for e := r.byKey[key{rec.DstAddr, port, rec.Proto}]; e != nil; e = e.next {
			if e.reached(rec.SrcAddr, rec.SrcPort, icmp) && e.during(rec) {
				return e.id
			}
		}
	}
	return ""
}

// reached reports whether a, port is where e's probe was sent or may have
// been delivered.
func (e *entry) reached(a netip.Addr, port uint16, icmp bool) bool {
	if !a.IsValid() {
		return false
	}
	if a == e.dst {
		return icmp || port == e.dstPort
	}
	return slices.Contains(e.targets, a)
}

// during reports whether rec started during e's trace; a record without a
// start time is not held to it.
func (e *entry) during(rec *flow.Record) bool {
	if rec.FlowStart.IsZero() {
		return true
	}
	t := rec.FlowStart.UnixNano()
	return t >= e.from && t <= e.to
}

// Len returns how many probes are remembered.
func (r *Registry) Len() int { return int(r.size.Load()) }

// len is the queue's length; r.mu must be held.
func (r *Registry) len() int { return len(r.queue) - r.head }

// prune forgets the entries expired at now, oldest first; r.mu must be
// held for writing.
func (r *Registry) prune(now int64) {
	for r.len() > 0 && r.queue[r.head].expires <= now {
		r.drop()
	}
	r.sync()
}

// drop forgets the oldest entry; r.mu must be held for writing.
func (r *Registry) drop() {
	e := r.queue[r.head]
	r.queue[r.head] = nil
	r.head++
	r.ports[e.k.port]--
	if r.head > len(r.queue)/2 && r.head >= 64 {
		// Reuse the array: move the live half to its start.
		n := copy(r.queue, r.queue[r.head:])
		clear(r.queue[n:])
		r.queue, r.head = r.queue[:n], 0
	}
	switch head := r.byKey[e.k]; {
	case head == e && e.next == nil:
		delete(r.byKey, e.k)
	case head == e:
		r.byKey[e.k] = e.next
	default:
		for p := head; p != nil; p = p.next {
			if p.next == e {
				p.next = e.next
				break
			}
		}
	}
	if r.len() == 0 {
		r.queue, r.head = r.queue[:0], 0
	}
}

// sync publishes the size and the oldest expiry for Mark's lock-free
// checks; r.mu must be held for writing.
func (r *Registry) sync() {
	r.size.Store(int64(r.len()))
	if r.len() > 0 {
		r.headExp.Store(r.queue[r.head].expires)
	}
}

var (
	trackedDesc = prometheus.NewDesc("dualflow_traceflow_probes_tracked",
		"Traceflow probes remembered so that their flow records are marked (probe_trace_id).", nil, nil)
	markedDesc = prometheus.NewDesc("dualflow_traceflow_probe_records_total",
		"Flow records marked as a traceflow probe's (probe_trace_id set), left out of the flows, map, charts and audit by default.", nil, nil)
	evictedDesc = prometheus.NewDesc("dualflow_traceflow_probes_evicted_total",
		"Traceflow probes forgotten before their time because the registry was full: their late records are not marked.", nil, nil)
)

// Describe implements prometheus.Collector.
func (r *Registry) Describe(ch chan<- *prometheus.Desc) {
	ch <- trackedDesc
	ch <- markedDesc
	ch <- evictedDesc
}

// Collect implements prometheus.Collector.
func (r *Registry) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(trackedDesc, prometheus.GaugeValue, float64(r.size.Load()))
	ch <- prometheus.MustNewConstMetric(markedDesc, prometheus.CounterValue, float64(r.marked.Load()))
	ch <- prometheus.MustNewConstMetric(evictedDesc, prometheus.CounterValue, float64(r.evicted.Load()))
}

var _ prometheus.Collector = (*Registry)(nil)
