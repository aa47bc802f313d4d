// Package audit is dualflow's NetworkPolicy auditing: which policy and
// rule allowed or denied each flow, and where dual-stack policy has gaps.
//
//   - Auditor is the collector stage: Audit fills a flow.Record's ingress
//     and egress verdict, policy and rule from the compiled policies
//     (package policy), after Kubernetes enrichment and before the writer.
//   - The cluster view is the enrichment's: an enrich.Snapshot (the
//     collector's live view, or manifests read by enrich.LoadSnapshot)
//     feeds the static analyses, Findings (unprotected workloads,
//     dual-stack gaps, invalid policies), and the Auditor in tests and
//     the CLI; the collector's Auditor reads the live enrich.Enricher.
//   - Reports runs the reports over the flow store (denied flows, unused
//     rules, observed dual-stack gaps, what-if of a proposed policy)
//     through a small query interface that store.Conn satisfies.
//   - API serves all of it as JSON under /api/v1/audit/ with net/http.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/maphash"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
)

// Lookup is what the Auditor reads about the cluster for each record,
// besides the pod identities and labels that enrichment put on it: the
// getters of the enrichment's view, which *enrich.Enricher (live) and
// *enrich.Snapshot implement. It must be safe for concurrent use and
// should not allocate: it is called once or twice per record.
type Lookup interface {
	// Namespace returns a namespace, with its labels (for
	// namespaceSelector peers).
	Namespace(name string) (*enrich.Namespace, bool)
	// Pod and LookupPod find the destination pod, by name or (deleted
	// since: a late record) by the address it held at a time, whose
	// container ports name the port a flow reached.
	Pod(namespace, name string) (*enrich.Pod, bool)
	LookupPod(a netip.Addr, at time.Time) (*enrich.Pod, bool)
}

// PortQuery names the destination pod of a flow and the port it reached.
type PortQuery struct {
	// Namespace and Pod name the pod as enrichment resolved it. Addr is the
	// address the flow reached and At the flow's start: the lookup uses
	// them to find a pod deleted since (late records).
	Namespace, Pod string
	Addr           netip.Addr
	At             time.Time
	Port           uint16
	Proto          uint8 // IANA number: TCP, UDP or SCTP
}

// Config configures an Auditor.
type Config struct {
	// Refresh is how often Run re-reads the NetworkPolicies and, when they
	// changed, recompiles them. Default 2s.
	Refresh time.Duration
}

// DefaultRefresh is the default of Config.Refresh.
const DefaultRefresh = 2 * time.Second

// BindFlags registers the --audit.* flags on fs.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.Refresh, "audit.refresh", c.Refresh, "how often the policy auditor re-reads NetworkPolicies and recompiles them when they changed (default 2s)")
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	if c.Refresh == 0 {
		c.Refresh = DefaultRefresh
	}
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.Refresh < 0 {
		return fmt.Errorf("--audit.refresh %v: must be positive", c.Refresh)
	}
	return nil
}

// Auditor evaluates NetworkPolicies for flow records. Audit and
// AuditBatch are safe for concurrent use with each other and with
// SetPolicies; they allocate nothing. Until the first SetPolicies the
// Auditor leaves verdicts unknown (it does not know the policies yet).
type Auditor struct {
	cfg    Config
	lookup Lookup
	set    atomic.Pointer[policy.Set]
	m      *metrics

	mu  sync.Mutex // serializes SetPolicies
	fp  uint64     // fingerprint of the compiled policies
	err error      // compile error of the compiled policies
}

// New returns an Auditor reading namespaces and ports through lookup.
// reg may be nil (no metrics).
func New(cfg Config, lookup Lookup, reg prometheus.Registerer) (*Auditor, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if lookup == nil {
		return nil, errors.New("audit: nil lookup")
	}
	return &Auditor{cfg: cfg, lookup: lookup, m: newMetrics(reg)}, nil
}

// Policies returns the compiled policies in use (nil before the first
// SetPolicies).
func (a *Auditor) Policies() *policy.Set { return a.set.Load() }

// SetPolicies compiles pols and makes them the ones Audit uses. It is
// cheap when pols did not change (same namespace, name, UID and
// resourceVersion/generation of every policy, in any order): nothing is
// recompiled. Invalid policies are left out and reported in the error
// (see policy.Compile); the valid ones are used all the same.
func (a *Auditor) SetPolicies(pols []*networkingv1.NetworkPolicy) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	fp := fingerprint(pols)
	if a.set.Load() != nil && fp == a.fp {
		return a.err
	}
	set, err := policy.Compile(pols)
	a.set.Store(set)
	a.fp, a.err = fp, err
	a.m.compiles.Inc()
	a.m.policies.Set(float64(set.Len()))
	a.m.invalid.Set(float64(len(pols) - set.Len()))
	return err
}

var fpSeed = maphash.MakeSeed()

// fingerprint is an order-independent hash of the policies' identities
// and versions.
func fingerprint(pols []*networkingv1.NetworkPolicy) uint64 {
	var sum uint64
	for _, p := range pols {
		if p == nil {
			continue
		}
		var h maphash.Hash
		h.SetSeed(fpSeed)
		for _, s := range []string{p.Namespace, p.Name, string(p.UID), p.ResourceVersion} {
			h.WriteString(s)
			h.WriteByte(0)
		}
		fmt.Fprint(&h, p.Generation)
		if p.ResourceVersion == "" && p.Generation == 0 {
			// Objects from files carry no version: hash the spec.
			b, _ := json.Marshal(&p.Spec)
			h.Write(b)
		}
		sum += h.Sum64()
	}
	return sum + uint64(len(pols))
}

// Run re-reads the policies with list every Config.Refresh, and at once
// when changed receives (nil: refresh only), and passes them to
// SetPolicies, until ctx is done; it returns nil then. Without changed, a
// new policy takes up to Refresh to count, in stored verdicts and in the
// drops traceflow names (a trace right after kubectl apply named none on
// the real cluster). list must return
// every NetworkPolicy of every namespace (read-only objects). Start Run
// once list's source is synced (enrich.Enricher.WaitForSync): an empty
// list before that would make every pod look not isolated. A compile
// error is logged once per change of the policies, not per refresh.
func (a *Auditor) Run(ctx context.Context, list func() []*networkingv1.NetworkPolicy, changed <-chan struct{}, log *slog.Logger) error {
	if log == nil {
		log = slog.Default()
	}
	var lastErr string
	refresh := func() {
		err := a.SetPolicies(list())
		msg := ""
		if err != nil {
			msg = err.Error()
		}
		if msg != lastErr && msg != "" {
			log.Warn("audit: some NetworkPolicies are invalid and ignored", "err", err)
		}
		lastErr = msg
	}
	refresh()
	t := time.NewTicker(a.cfg.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			refresh()
		case <-changed:
			refresh()
		}
	}
}

// Audit sets rec's Ingress and Egress Verdict, Namespace, Name and Rule
// from the policies. It reads rec's addresses, protocol, destination port
// and the pod identities and labels of rec.Src and rec.Dst (an end with
// no PodNamespace is not a pod: only its address counts); rec.DstAddr
// must be the endpoint actually reached (after DNAT). ReportedVerdict and
// ReportedName, set by the datapath, are kept: rec.VerdictMismatch()
// compares them afterwards. Before the first SetPolicies it does nothing.
func (a *Auditor) Audit(rec *flow.Record) { a.AuditBatch(unsafe.Slice(rec, 1)) }

// AuditBatch audits every record of recs (see Audit). It has the shape of
// the pipeline's Enricher interface: a stage can call it right after
// enrichment.
func (a *Auditor) AuditBatch(recs []flow.Record) {
	set := a.set.Load()
	if set == nil {
		return
	}
	var c counts
	m := memo{lookup: a.lookup}
	for i := range recs {
		a.audit(set, &recs[i], &c, &m)
	}
	a.m.add(&c)
}

// memo answers a batch's lookups, remembering the last two namespaces
// and the last destination port asked: records of a batch come in runs of
// the same pods, and each lookup takes the enrichment's lock and hashes
// strings (with one namespace remembered, a run of flows between pods of
// two namespaces missed at every end). It lives for one batch, so it is
// never staler than the batch's snapshot.
type memo struct {
	lookup Lookup

	ns [2]nsMemo // the namespaces asked last, the latest first

	port      PortQuery
	portName  string
	portValid bool
}

// nsMemo is a namespace's labels as the lookup gave them.
type nsMemo struct {
	name   string
	labels map[string]string
	ok     bool
	valid  bool
}

func (m *memo) namespaceLabels(name string) (map[string]string, bool) {
	switch {
	case m.ns[0].valid && m.ns[0].name == name:
	case m.ns[1].valid && m.ns[1].name == name:
		m.ns[0], m.ns[1] = m.ns[1], m.ns[0]
	default:
		m.ns[1] = m.ns[0]
		m.ns[0] = nsMemo{name: name, valid: true}
		m.ns[0].labels, m.ns[0].ok = namespaceLabels(m.lookup, name)
	}
	return m.ns[0].labels, m.ns[0].ok
}

// portNameOf takes q by pointer: passed by value, the query just stored
// field by field was copied 16 bytes at a time, which the CPU does not
// forward from those stores (0.16 s of the auditor's 2.65 in the
// end-to-end benchmark's profile).
func (m *memo) portNameOf(q *PortQuery) string {
	// At matters only for a pod deleted since (portName's fallback); the
	// pod named by Namespace and Pod at Addr has the same ports then.
	if !m.portValid || m.port.Namespace != q.Namespace || m.port.Pod != q.Pod || m.port.Addr != q.Addr ||
		m.port.Port != q.Port || m.port.Proto != q.Proto {
		m.port, m.portValid = *q, true
		m.portName = portName(m.lookup, *q)
	}
	return m.portName
}

// flowOf sets *f to the policy view of rec.
func flowOf(f *policy.Flow, set *policy.Set, rec *flow.Record, m *memo) {
	f.Proto, f.DstPort = rec.Proto, rec.DstPort
	peer(&f.Src, rec.SrcAddr, &rec.Src, m)
	peer(&f.Dst, rec.DstAddr, &rec.Dst, m)
	if f.Dst.IsPod && set.NamesPorts() && flow.HasPorts(f.Proto) {
		f.Dst.PortName = m.portNameOf(&PortQuery{Namespace: rec.Dst.PodNamespace, Pod: rec.Dst.PodName,
			Addr: f.Dst.Addr, At: rec.FlowStart, Port: rec.DstPort, Proto: rec.Proto})
	}
}

// Denial is why the policies in force deny a flow.
type Denial struct {
	Direction policy.Direction
	// Policy is the deciding policy (namespace/name), as the flow's
	// Ingress or Egress columns name it.
	Policy string
	// Text is the one explanation of the drop (policy.Explanation): the
	// isolating policy, what no rule allowed, the nearest rule and what it
	// lacks.
	Text string
}

// Explain says why the policies in force deny rec, an enriched record,
// for its egress side first (a packet meets its source's policies first),
// else its ingress side; false when they allow it or no policies are set.
// It is the one explanation of a drop that traces, reachability pairs and
// the flow drawer show.
func (a *Auditor) Explain(rec *flow.Record) (Denial, bool) {
	set := a.set.Load()
	if set == nil {
		return Denial{}, false
	}
	var f policy.Flow
	flowOf(&f, set, rec, &memo{lookup: a.lookup})
	return explainDenial(set, &f, endName(rec.SrcAddr, &rec.Src), endName(rec.DstAddr, &rec.Dst))
}

// explainDenial explains denied flow f from src to dst (their names), its
// egress side first: a packet meets its source's policies first.
func explainDenial(set *policy.Set, f *policy.Flow, src, dst string) (Denial, bool) {
	for _, d := range []policy.Direction{policy.Egress, policy.Ingress} {
		e, ok := set.Explain(d, f)
		if !ok {
			continue
		}
		subject, remote := dst, src
		if d == policy.Egress {
			subject, remote = src, dst
		}
		return Denial{Direction: d, Policy: e.By, Text: e.String(subject, remote)}, true
	}
	return Denial{}, false
}

// endName names an end of a flow: its pod (namespace/name), else its
// address.
func endName(addr netip.Addr, e *flow.Endpoint) string {
	if e.PodName != "" {
		return e.PodNamespace + "/" + e.PodName
	}
	return addr.Unmap().String()
}

func (a *Auditor) audit(set *policy.Set, rec *flow.Record, c *counts, m *memo) {
	var f policy.Flow
	flowOf(&f, set, rec, m)
	// Set.Side, not Evaluate: the decisions are stored where they are
	// read, field by field (see Set.Side).
	var eg, in policy.Decision
	set.Side(policy.Egress, &f, &eg)
	set.Side(policy.Ingress, &f, &in)
	setPolicy(&rec.Egress, &eg)
	setPolicy(&rec.Ingress, &in)
	rec.DualStackGap = false
	if rec.ProbeTraceID != "" {
		return // a traceflow probe's verdicts are stored, not counted as traffic's
	}
	c.verdicts[policy.Egress][eg.Verdict%verdictSlots]++
	c.verdicts[policy.Ingress][in.Verdict%verdictSlots]++
	if rec.VerdictMismatch() {
		c.mismatches++
	}
	// Only ipBlocks tell the families of two pods apart, a connection is
	// checked once, at its first record, and only its isolated sides are
	// evaluated again: isolation is decided by selectors, alike for both
	// families.
	iso := func(d *policy.Decision) bool { return d.Verdict >= flow.VerdictAllowed }
	if set.NamesBlocks() && f.Src.IsPod && f.Dst.IsPod && rec.First() && (iso(&eg) || iso(&in)) && otherFamily(&f, rec) {
		eg2, in2 := eg, in
		if iso(&eg) {
			set.Side(policy.Egress, &f, &eg2)
		}
		if iso(&in) {
			set.Side(policy.Ingress, &f, &in2)
		}
		rec.DualStackGap = (eg2.Allowed() && in2.Allowed()) != (eg.Allowed() && in.Allowed())
		if rec.DualStackGap {
			c.gaps++
		}
	}
}

// otherFamily moves f's addresses to the other family's of its two pods
// (the addresses enrichment put on the record: looking the pods up again
// took a third of the auditor's time); false when either pod has no
// address of the other family (single-stack pods, host-network pods on a
// single-stack node).
func otherFamily(f *policy.Flow, rec *flow.Record) bool {
	other := uint8(10 - rec.IPVersion)
	if other != 4 && other != 6 {
		return false
	}
	sa, ok := enrich.AddrOfFamily(rec.Src.PodAddrs, other)
	if !ok {
		return false
	}
	da, ok := enrich.AddrOfFamily(rec.Dst.PodAddrs, other)
	if !ok {
		return false
	}
	f.Src.Addr, f.Dst.Addr = sa, da
	return true
}

func peer(p *policy.Peer, addr netip.Addr, e *flow.Endpoint, m *memo) {
	p.Addr = addr.Unmap()
	p.Node = e.NodeName
	if e.PodNamespace == "" {
		return
	}
	p.IsPod = true
	p.Namespace = e.PodNamespace
	p.Labels = e.Labels
	p.NamespaceLabels, _ = m.namespaceLabels(e.PodNamespace)
}

func setPolicy(p *flow.Policy, d *policy.Decision) {
	p.Verdict = d.Verdict
	p.Namespace, p.Name, p.Rule = d.Namespace, d.Name, d.Rule
}

// verdictSlots is the number of flow.Verdict values counted.
const verdictSlots = 5

type counts struct {
	verdicts   [2][verdictSlots]uint64
	mismatches uint64
	gaps       uint64
}

// metrics are the Auditor's instruments, resolved once.
type metrics struct {
	verdicts   [2][verdictSlots]prometheus.Counter
	mismatches prometheus.Counter
	gaps       prometheus.Counter
	compiles   prometheus.Counter
	policies   prometheus.Gauge
	invalid    prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg) // registers on reg unless it is nil
	verdicts := f.NewCounterVec(prometheus.CounterOpts{
		Name: "dualflow_audit_verdicts_total",
		Help: "Flow records audited, by direction and evaluated verdict (unknown: that end is not a pod).",
	}, []string{"direction", "verdict"})
	m := &metrics{
		mismatches: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_audit_verdict_mismatches_total",
			Help: "Flow records whose datapath-reported verdict disagrees with the evaluated one.",
		}),
		gaps: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_audit_dual_stack_gap_connections_total",
			Help: "Connections between dual-stack pods that the policies in force decide the other way over the other family (the flow metric dualflow_flow_dual_stack_gap_connections_total has them by namespace and family).",
		}),
		compiles: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_audit_policy_compiles_total",
			Help: "Times the NetworkPolicies changed and were recompiled.",
		}),
		policies: f.NewGauge(prometheus.GaugeOpts{
			Name: "dualflow_audit_policies",
			Help: "NetworkPolicies the auditor evaluates.",
		}),
		invalid: f.NewGauge(prometheus.GaugeOpts{
			Name: "dualflow_audit_invalid_policies",
			Help: "NetworkPolicies left out because the API would reject them (bad selector, CIDR, port).",
		}),
	}
	for d := range m.verdicts {
		for v := range m.verdicts[d] {
			m.verdicts[d][v] = verdicts.WithLabelValues(policy.Direction(d).String(), flow.Verdict(v).String())
		}
	}
	return m
}

func (m *metrics) add(c *counts) {
	for d := range c.verdicts {
		for v, n := range c.verdicts[d] {
			if n > 0 {
				m.verdicts[d][v].Add(float64(n))
			}
		}
	}
	if c.mismatches > 0 {
		m.mismatches.Add(float64(c.mismatches))
	}
	if c.gaps > 0 {
		m.gaps.Add(float64(c.gaps))
	}
}
