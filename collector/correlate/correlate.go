// Package correlate merges the two node halves of a cross-node connection
// into one flow record.
//
// A connection between pods on two nodes is exported by both nodes. The
// source node's half carries the source-side facts (egress policy, the
// Service it addressed before DNAT, SNAT); the destination node's half the
// destination-side facts (ingress policy). The Correlator pairs them on the
// connection's tuple as it crosses between the nodes (after DNAT, after
// SNAT), so both halves of a Service flow have the same key, and an IPv4
// half can never pair with an IPv6 one. It waits at most Timeout for the
// other half; a half that never comes (denied at the source, lost) is
// written alone, marked flow.CorrelationSourceOnly or DestOnly. Intra-node
// flows and flows to or from outside the cluster pass straight through
// (flow.CorrelationNone).
//
// Counters of a merged record are the source node's (both nodes count the
// same packets): they are never added.
package correlate

import (
	"context"
	"net/netip"
	"slices"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/dualflow/dualflow/collector/pipeline"
	"github.com/dualflow/dualflow/flow"
)

// nodeOf tells which node addresses belong to (a pod address or a node's
// own address): the Kubernetes enrichment's live view, or enrich.Nodes (the
// nodes of a manifest, on the same index). NodesForIPs sets nodes[i] to
// addrs[i]'s node, "" when none; it answers a whole batch under one lock.
type nodeOf interface {
	NodesForIPs(addrs []netip.Addr, nodes []string)
}

// Defaults of Config.
const (
	// DefaultTimeout is how long a half waits for the other: exporters on
	// both nodes see a connection end within their poll interval (1 s)
	// of each other, plus transport and batching delays.
	DefaultTimeout = 5 * time.Second
	// DefaultMaxHeld bounds the halves waiting: about 50 MB of records.
	DefaultMaxHeld = 65536
	// Stage is the stage label of the pipeline metrics.
	Stage = "correlate"
)

// Config configures a Correlator.
type Config struct {
	// Timeout is the longest a half waits for the other one.
	Timeout time.Duration
	// MaxHeld bounds the halves waiting. Overflow policy: the oldest half
	// is written early, unmatched, and counted
	// (dualflow_correlate_flushed_early_total).
	MaxHeld int
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	if c.Timeout <= 0 {
		c.Timeout = DefaultTimeout
	}
	if c.MaxHeld <= 0 {
		c.MaxHeld = DefaultMaxHeld
	}
}

// side is which node exported a half.
type side uint8

const (
	sideNone side = iota // not correlated
	sideSource
	sideDest
)

// key is the tuple of a connection between the two nodes: the source as
// it leaves the source node (after SNAT), the destination after DNAT.
type key struct {
	t flow.Tuple
}

// entry is a held half.
type entry struct {
	rec      flow.Record
	side     side
	seq      uint64 // identifies the FIFO item of this entry
	deadline time.Time
}

type fifoItem struct {
	k   key
	seq uint64
}

// Correlator pairs halves. Use Run for the pipeline stage, or Add and
// Expire directly (tests, benchmarks); it is not safe for concurrent use.
type Correlator struct {
	cfg   Config
	nodes nodeOf
	held  map[key]*entry
	fifo  []fifoItem // arrival order = deadline order (one Timeout)
	head  int
	seq   uint64
	free  []*entry
	m     *metrics
	now   func() time.Time

	// addrs and names are lookupNodes' buffers, reused batch after batch.
	addrs []netip.Addr
	names []string
	// ends holds the nodes of the records lookupNodes was given, by index.
	ends []ends
}

// ends are the nodes of a record's source, destination and exporter (""
// when unknown; the exporter's is its ExporterNode, else looked up only
// when the record crosses between two nodes).
type ends struct{ src, dst, exp string }

// crosses reports whether the record's ends are on two known nodes: a
// half that another node's exporter may see too.
func (e ends) crosses() bool { return e.src != "" && e.dst != "" && e.src != e.dst }

// needsExporter reports whether the exporter's node must be looked up
// (lookupNodes): a crossing record that does not name it.
func (e ends) needsExporter() bool { return e.crosses() && e.exp == "" }

// New returns a Correlator. reg may be nil.
func New(cfg Config, nodes nodeOf, reg prometheus.Registerer) *Correlator {
	cfg.SetDefaults()
	return &Correlator{cfg: cfg, nodes: nodes, held: map[key]*entry{}, m: newMetrics(reg), now: time.Now}
}

// Held returns the number of halves waiting.
func (c *Correlator) Held() int { return len(c.held) }

// lookupNodes sets c.ends[i] to the nodes of recs[i]'s ends, with at
// most two calls to the node view for the whole of recs: one for the
// sources and destinations, one for the exporters of records that cross
// between two nodes and do not name their exporter's node.
func (c *Correlator) lookupNodes(recs []flow.Record) {
	c.ends = c.ends[:0]
	if c.nodes == nil { // no node is known: nothing is classified
		c.ends = append(c.ends, make([]ends, len(recs))...)
		return
	}
	c.addrs = c.addrs[:0]
	for i := range recs {
		c.addrs = append(c.addrs, recs[i].SrcAddr, recs[i].DstAddr)
	}
	c.names = slices.Grow(c.names[:0], len(c.addrs))[:len(c.addrs)] // NodesForIPs sets each
	c.nodes.NodesForIPs(c.addrs, c.names)
	c.addrs = c.addrs[:0]
	for i := range recs {
		e := ends{src: c.names[2*i], dst: c.names[2*i+1], exp: recs[i].ExporterNode}
		if e.needsExporter() {
			c.addrs = append(c.addrs, recs[i].ExporterAddr)
		}
		c.ends = append(c.ends, e)
	}
	if len(c.addrs) == 0 {
		return
	}
	c.names = slices.Grow(c.names[:0], len(c.addrs))[:len(c.addrs)] // NodesForIPs sets each
	c.nodes.NodesForIPs(c.addrs, c.names)
	j := 0
	for i := range c.ends {
		if e := &c.ends[i]; e.needsExporter() {
			e.exp = c.names[j]
			j++
		}
	}
}

// classify says whether r, whose ends are on nodes n (lookupNodes), is a
// half to correlate, and which (halfKey is its key). It fills the node
// names and flow type when they are known and unset.
func (c *Correlator) classify(r *flow.Record, n *ends) side {
	srcNode, dstNode := n.src, n.dst
	srcOK, dstOK := srcNode != "", dstNode != ""
	if r.Src.NodeName == "" && srcOK {
		r.Src.NodeName = srcNode
	}
	if r.Dst.NodeName == "" && dstOK {
		r.Dst.NodeName = dstNode
	}
	if r.Type == flow.FlowTypeUnknown {
		switch {
		case srcOK && dstOK && srcNode == dstNode:
			r.Type = flow.FlowTypeIntraNode
		case srcOK && dstOK:
			r.Type = flow.FlowTypeInterNode
		case srcOK:
			r.Type = flow.FlowTypeToExternal
		case dstOK:
			r.Type = flow.FlowTypeFromExternal
		}
	}
	if !n.crosses() {
		return sideNone
	}
	switch n.exp {
	case srcNode:
		return sideSource
	case dstNode:
		return sideDest
	}
	return sideNone // seen by a third node: nothing to pair
}

// halfKey is the key of half r of side sd: the connection as both nodes
// see it. It is built for halves only: classify returned it for every
// record, and copying the zero key of the others (most records), just
// stored field by field, stalled the CPU (a 16-byte load of two 8-byte
// stores is not forwarded).
func halfKey(r *flow.Record, sd side) key {
	k := key{t: flow.Tuple{Src: r.SrcAddr, Dst: r.DstAddr, Proto: r.Proto, SrcPort: r.SrcPort, DstPort: r.DstPort}}
	if sd == sideSource && r.SNATAddr.IsValid() { // the destination node sees the translated source
		k.t.Src = r.SNATAddr
		if r.SNATPort != 0 {
			k.t.SrcPort = r.SNATPort
		}
	}
	return k
}

// Add processes one record: it appends to out whatever is ready (r itself
// when not correlated, the merged record when r completes a pair, a half
// flushed early on overflow) and returns out. r is copied, not retained.
func (c *Correlator) Add(r *flow.Record, out []flow.Record) []flow.Record {
	c.lookupNodes(unsafe.Slice(r, 1))
	sd := c.classify(r, &c.ends[0])
	if sd == sideNone {
		c.m.records[flow.CorrelationNone].Inc()
		out = append(out, *r)
		out[len(out)-1].Correlation = flow.CorrelationNone
		return out
	}
	return c.addHalf(r, sd, out)
}

// addHalf is Add for a half that classify gave side sd.
func (c *Correlator) addHalf(r *flow.Record, sd side, out []flow.Record) []flow.Record {
	k := halfKey(r, sd)
	if e := c.held[k]; e != nil {
		if e.side == sd {
			coalesce(&e.rec, r)
			c.m.coalesced.Inc()
			return out
		}
		src, dst := &e.rec, r
		if sd == sideSource {
			src, dst = r, &e.rec
		}
		out = append(out, flow.Record{})
		merge(&out[len(out)-1], src, dst)
		c.m.records[flow.CorrelationMerged].Inc()
		c.release(k, e)
		return out
	}
	if len(c.held) >= c.cfg.MaxHeld {
		out = c.flushOldest(out)
		c.m.early.Inc()
	}
	e := c.alloc()
	e.rec, e.side = *r, sd
	c.seq++
	e.seq = c.seq
	e.deadline = c.now().Add(c.cfg.Timeout)
	c.held[k] = e
	c.fifo = append(c.fifo, fifoItem{k: k, seq: e.seq})
	c.m.held.Set(float64(len(c.held)))
	return out
}

// Expire appends the halves whose wait ended by now, unmatched, and
// returns out.
func (c *Correlator) Expire(now time.Time, out []flow.Record) []flow.Record {
	for c.head < len(c.fifo) {
		it := c.fifo[c.head]
		e := c.held[it.k]
		if e == nil || e.seq != it.seq { // paired or replaced since
			c.pop()
			continue
		}
		if e.deadline.After(now) {
			break
		}
		c.pop()
		out = c.emitAlone(it.k, e, out)
	}
	c.compact()
	return out
}

// Flush appends every held half, unmatched (shutdown).
func (c *Correlator) Flush(out []flow.Record) []flow.Record {
	for c.head < len(c.fifo) {
		out = c.flushOldest(out)
	}
	c.compact()
	return out
}

func (c *Correlator) flushOldest(out []flow.Record) []flow.Record {
	for c.head < len(c.fifo) {
		it := c.fifo[c.head]
		c.pop()
		if e := c.held[it.k]; e != nil && e.seq == it.seq {
			return c.emitAlone(it.k, e, out)
		}
	}
	return out
}

func (c *Correlator) pop() {
	c.fifo[c.head] = fifoItem{}
	c.head++
}

// compact reclaims the consumed front of the FIFO once it is half of it.
func (c *Correlator) compact() {
	if c.head > 0 && c.head*2 >= len(c.fifo) {
		n := copy(c.fifo, c.fifo[c.head:])
		clear(c.fifo[n:])
		c.fifo = c.fifo[:n]
		c.head = 0
	}
}

func (c *Correlator) emitAlone(k key, e *entry, out []flow.Record) []flow.Record {
	out = append(out, e.rec)
	r := &out[len(out)-1]
	if e.side == sideSource {
		r.Correlation = flow.CorrelationSourceOnly
	} else {
		r.Correlation = flow.CorrelationDestOnly
	}
	c.m.records[r.Correlation].Inc()
	c.release(k, e)
	return out
}

func (c *Correlator) alloc() *entry {
	if n := len(c.free); n > 0 {
		e := c.free[n-1]
		c.free = c.free[:n-1]
		return e
	}
	return new(entry)
}

func (c *Correlator) release(k key, e *entry) {
	delete(c.held, k)
	e.rec = flow.Record{}
	if len(c.free) < 1024 {
		c.free = append(c.free, e)
	}
	c.m.held.Set(float64(len(c.held)))
}

// merge writes into m the record of a connection from its source half src
// and destination half dst.
func merge(m, src, dst *flow.Record) {
	*m = *src
	m.Journal.Absorb(dst.Journal) // acknowledged when m is durable
	m.Correlation = flow.CorrelationMerged
	m.Type = flow.FlowTypeInterNode
	if dst.FlowStart.Before(m.FlowStart) && !dst.FlowStart.IsZero() || m.FlowStart.IsZero() {
		m.FlowStart = dst.FlowStart
	}
	if dst.FlowEnd.After(m.FlowEnd) {
		m.FlowEnd = dst.FlowEnd
	}
	if dst.TimeReceived.After(m.TimeReceived) {
		m.TimeReceived = dst.TimeReceived
	}
	if !m.ServiceAddr.IsValid() {
		m.ServiceAddr, m.ServicePort = dst.ServiceAddr, dst.ServicePort
	}
	if m.Service == (flow.Service{}) {
		m.Service = dst.Service
	}
	// The destination side is the destination node's to tell.
	m.Dst = mergeEndpoint(dst.Dst, src.Dst)
	m.Src = mergeEndpoint(src.Src, dst.Src)
	m.Ingress = dst.Ingress
	if m.Ingress.ReportedVerdict == flow.VerdictUnknown && src.Ingress.ReportedVerdict != flow.VerdictUnknown {
		m.Ingress = src.Ingress
	}
	if m.EndReason == flow.EndReasonUnknown {
		m.EndReason = dst.EndReason
	}
}

// mergeEndpoint returns primary with its empty fields taken from other.
func mergeEndpoint(primary, other flow.Endpoint) flow.Endpoint {
	set := func(p *string, o string) {
		if *p == "" {
			*p = o
		}
	}
	set(&primary.PodNamespace, other.PodNamespace)
	set(&primary.PodName, other.PodName)
	set(&primary.WorkloadKind, other.WorkloadKind)
	set(&primary.WorkloadName, other.WorkloadName)
	set(&primary.NodeName, other.NodeName)
	set(&primary.Zone, other.Zone)
	if primary.Labels == nil {
		primary.Labels = other.Labels
	}
	return primary
}

// coalesce folds a later record of the same half into the held one (an
// active-timeout slice exported before the other node's half arrived):
// deltas add up, totals, end and state are the later ones.
func coalesce(h, r *flow.Record) {
	h.Journal.Absorb(r.Journal) // h now stands for r too
	h.PacketsDelta += r.PacketsDelta
	h.BytesDelta += r.BytesDelta
	h.ReversePacketsDelta += r.ReversePacketsDelta
	h.ReverseBytesDelta += r.ReverseBytesDelta
	h.Packets = max(h.Packets, r.Packets)
	h.Bytes = max(h.Bytes, r.Bytes)
	h.ReversePackets = max(h.ReversePackets, r.ReversePackets)
	h.ReverseBytes = max(h.ReverseBytes, r.ReverseBytes)
	if r.FlowEnd.After(h.FlowEnd) {
		h.FlowEnd = r.FlowEnd
	}
	if r.TimeReceived.After(h.TimeReceived) {
		h.TimeReceived = r.TimeReceived
	}
	if r.EndReason != flow.EndReasonUnknown {
		h.EndReason = r.EndReason
	}
	if r.TCPState != "" {
		h.TCPState = r.TCPState
	}
}

// Run is the pipeline stage: it reads batches from in, puts what is ready
// on out (blocking while out is full: back-pressure), and writes halves
// whose wait ended. When in is closed and drained it flushes every held
// half, closes out and returns. ctx only aborts a blocked Put.
func (c *Correlator) Run(ctx context.Context, in, out *pipeline.Queue, pool *pipeline.Pool, pm *pipeline.Metrics) error {
	defer out.Close()
	recIn, recOut := pm.RecordsIn.WithLabelValues(Stage), pm.RecordsOut.WithLabelValues(Stage)
	// send hands b on; false when ctx ended first (b's records are
	// counted as dropped and b is emptied, still the caller's).
	send := func(b *pipeline.Batch) bool {
		n := len(b.Recs)
		if err := out.Put(ctx, b); err != nil {
			pm.Dropped.WithLabelValues(Stage, "aborted").Add(float64(n))
			b.Recs = b.Recs[:0]
			return false
		}
		recOut.Add(float64(n))
		return true
	}
	// put sends b unless empty and returns the batch to fill next.
	put := func(b *pipeline.Batch) *pipeline.Batch {
		if len(b.Recs) == 0 || !send(b) {
			return b
		}
		return pool.Get()
	}
	tick := time.NewTicker(max(c.cfg.Timeout/4, 50*time.Millisecond))
	defer tick.Stop()
	ob := pool.Get()
	for {
		select {
		case b, ok := <-in.C():
			if !ok {
				ob.Recs = c.Flush(ob.Recs)
				put(ob).Release()
				return nil
			}
			in.Taken()
			recIn.Add(float64(len(b.Recs)))
			// Records with nothing to pair (intra-node, external, no
			// inventory: most of them) go on in their own batch,
			// compacted in place; halves and merged records go through
			// ob. Copying every record into a new batch was most of
			// this stage's time.
			kept := 0
			c.lookupNodes(b.Recs)
			for i := range b.Recs {
				r := &b.Recs[i]
				sd := c.classify(r, &c.ends[i])
				if sd == sideNone {
					r.Correlation = flow.CorrelationNone
					if kept != i {
						b.Recs[kept] = *r
					}
					kept++
					continue
				}
				if len(ob.Recs)+2 > cap(ob.Recs) { // addHalf appends at most 2
					ob = put(ob)
				}
				ob.Recs = c.addHalf(r, sd, ob.Recs)
			}
			c.m.records[flow.CorrelationNone].Add(float64(kept))
			b.Recs = b.Recs[:kept]
			if kept == 0 || !send(b) {
				b.Release()
			}
			ob = put(ob)
		case now := <-tick.C:
			ob.Recs = c.Expire(now, ob.Recs)
			ob = put(ob)
		}
	}
}

type metrics struct {
	held      prometheus.Gauge
	records   [4]prometheus.Counter // by flow.Correlation
	coalesced prometheus.Counter
	early     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg) // registers on reg unless it is nil
	m := &metrics{
		held: f.NewGauge(prometheus.GaugeOpts{
			Name: "dualflow_correlate_held", Help: "Flow halves waiting for the other node's half.",
		}),
		coalesced: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_correlate_coalesced_total", Help: "Later records of a held half folded into it.",
		}),
		early: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_correlate_flushed_early_total", Help: "Halves written unmatched before their timeout because MaxHeld was reached.",
		}),
	}
	out := f.NewCounterVec(prometheus.CounterOpts{
		Name: "dualflow_correlate_records_total", Help: "Records written by the correlator, by correlation result.",
	}, []string{"correlation"})
	for c := range m.records {
		m.records[c] = out.WithLabelValues(flow.Correlation(c).String())
	}
	return m
}
