// Package flowmetrics derives Prometheus metrics from the flow records
// the collector enriches and audits, as they pass (issue 39): bytes,
// packets and connections, and denied connections by policy, labelled by
// namespace, workload, Service, IP family, protocol, verdict and node as
// the operator configures. Every metric holds at most MaxSeries series;
// past it the high-cardinality labels of a new series fold into "other"
// (counted), and series not updated for Expire are removed, so the
// series of deleted workloads go and memory stays bounded.
package flowmetrics

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/dualflow/dualflow/flow"
)

// Label is a label a flow metric may carry.
type Label string

// The labels a flow metric may carry. Those marked bounded take few
// values and survive folding; the others fold into Other.
const (
	SrcNamespace Label = "src_namespace"
	DstNamespace Label = "dst_namespace"
	SrcWorkload  Label = "src_workload" // kind/name, "" for an address outside the cluster
	DstWorkload  Label = "dst_workload"
	Service      Label = "service"   // namespace/name of the Service addressed, "" for none
	IPFamily     Label = "ip_family" // ipv4 or ipv6 (bounded)
	Protocol     Label = "protocol"  // TCP, UDP, ICMP, ... (bounded)
	Verdict      Label = "verdict"   // allowed, denied or unknown (bounded)
	Policy       Label = "policy"    // namespace/name of the policy that denied (denied connections only)
	Node         Label = "node"      // node of the side that denied (denied connections only)
)

// Other is the value folded labels take once a metric holds MaxSeries
// series: not a valid Kubernetes name (no underscore is), so it never
// merges with a namespace or workload named "other".
const Other = "_other"

var labels = []Label{SrcNamespace, DstNamespace, SrcWorkload, DstWorkload, Service, IPFamily, Protocol, Verdict, Policy, Node}

// bounded labels keep their values when a series is folded.
func bounded(l Label) bool { return l == IPFamily || l == Protocol || l == Verdict }

// Metric names what a flow metric counts.
type Metric string

// The flow metrics. Bytes and packets are the client-to-server direction
// of a connection (the record's source to its destination), the reverse
// ones the replies; the record's deltas are counted, so no slice of a
// long connection counts twice.
const (
	Bytes          Metric = "bytes"
	ReverseBytes   Metric = "reverse_bytes"
	Packets        Metric = "packets"
	ReversePackets Metric = "reverse_packets"
	// Connections counts connections at their first record (its packet
	// total equals its delta: the first slice of a long connection, or a
	// whole short one).
	Connections Metric = "connections"
	// DeniedConnections counts the connections (first records) that an
	// evaluated or reported verdict of either side denied or rejected.
	DeniedConnections Metric = "denied_connections"
	// DualStackGapConnections counts the connections (first records)
	// between two dual-stack pods that the policies in force decide the
	// other way over the other family (flow.Record.DualStackGap); its
	// verdict label is the record's own family's.
	DualStackGapConnections Metric = "dual_stack_gap_connections"
)

var metricHelp = map[Metric]string{
	Bytes:                   "Bytes from the source to the destination of connections, by the configured labels.",
	ReverseBytes:            "Bytes from the destination back to the source of connections, by the configured labels.",
	Packets:                 "Packets from the source to the destination of connections, by the configured labels.",
	ReversePackets:          "Packets from the destination back to the source of connections, by the configured labels.",
	Connections:             "Connections, counted at their first record, by the configured labels.",
	DeniedConnections:       "Connections denied or rejected by a NetworkPolicy (evaluated or reported by the datapath), by the configured labels.",
	DualStackGapConnections: "Connections between two dual-stack pods that the NetworkPolicies in force decide the other way over the other IP family (allowed over one, denied over the other), by the configured labels; verdict is the connection's own family's.",
}

// MetricConfig selects one metric and its labels.
type MetricConfig struct {
	Name   Metric  `json:"name"`
	Labels []Label `json:"labels"`
}

// Config is which flow metrics exist, with which labels, and their
// bounds.
type Config struct {
	// Metrics are the metrics that exist; none: no flow metric.
	Metrics []MetricConfig `json:"metrics"`
	// MaxSeries bounds the series of each metric (default
	// DefaultMaxSeries).
	MaxSeries int `json:"maxSeries"`
	// Expire removes a series not updated for this long (default
	// DefaultExpire).
	Expire Duration `json:"expire"`
}

// Duration is a time.Duration written as "15m" in the config file.
type Duration struct{ time.Duration }

// UnmarshalJSON reads "15m".
func (d *Duration) UnmarshalJSON(b []byte) error {
	s := strings.Trim(string(b), `"`)
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %s: %w", b, err)
	}
	d.Duration = v
	return nil
}

// MarshalJSON writes "15m0s".
func (d Duration) MarshalJSON() ([]byte, error) { return []byte(`"` + d.String() + `"`), nil }

// Defaults.
const (
	// DefaultMaxSeries bounds each metric: with the default labels a
	// cluster of 100 namespaces whose every namespace talks to 10 others
	// over both families, 3 protocols and 2 verdicts needs 12,000.
	DefaultMaxSeries = 20_000
	// DefaultExpire is how long a series lives without an update.
	DefaultExpire = 30 * time.Minute
)

// DefaultConfig is safe for a 2,000-workload cluster: namespaces, not
// workloads, so the series grow with the namespace pairs that talk.
func DefaultConfig() Config {
	traffic := []Label{SrcNamespace, DstNamespace, IPFamily, Protocol, Verdict}
	return Config{
		Metrics: []MetricConfig{
			{Name: Bytes, Labels: traffic},
			{Name: Packets, Labels: traffic},
			{Name: Connections, Labels: traffic},
			{Name: DeniedConnections, Labels: []Label{SrcNamespace, DstNamespace, IPFamily, Protocol, Policy, Node}},
			{Name: DualStackGapConnections, Labels: traffic},
		},
		MaxSeries: DefaultMaxSeries,
		Expire:    Duration{DefaultExpire},
	}
}

// LoadConfig reads a config file (YAML or JSON, unknown fields refused)
// over the defaults' bounds: a file that lists metrics replaces the
// default metrics.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, err
	}
	var c Config
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		return Config{}, fmt.Errorf("flow metrics config %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("flow metrics config %s: %w", path, err)
	}
	return c, nil
}

// Validate checks the names, the labels and the bounds.
func (c *Config) Validate() error {
	var errs []error
	seen := map[Metric]bool{}
	for _, m := range c.Metrics {
		if _, ok := metricHelp[m.Name]; !ok {
			errs = append(errs, fmt.Errorf("metric %q: want one of %s", m.Name, strings.Join(metricNames(), ", ")))
			continue
		}
		if seen[m.Name] {
			errs = append(errs, fmt.Errorf("metric %q listed twice", m.Name))
		}
		seen[m.Name] = true
		ls := map[Label]bool{}
		for _, l := range m.Labels {
			switch {
			case !slices.Contains(labels, l):
				errs = append(errs, fmt.Errorf("metric %q: label %q: want one of %s", m.Name, l, labelNames()))
			case ls[l]:
				errs = append(errs, fmt.Errorf("metric %q: label %q listed twice", m.Name, l))
			case (l == Policy || l == Node) && m.Name != DeniedConnections:
				errs = append(errs, fmt.Errorf("metric %q: label %q is only for %s", m.Name, l, DeniedConnections))
			}
			ls[l] = true
		}
	}
	if c.MaxSeries < 0 {
		errs = append(errs, fmt.Errorf("maxSeries %d: must not be negative", c.MaxSeries))
	}
	if c.Expire.Duration < 0 {
		errs = append(errs, fmt.Errorf("expire %v: must not be negative", c.Expire))
	}
	return errors.Join(errs...)
}

func metricNames() []string {
	var out []string
	for m := range metricHelp {
		out = append(out, string(m))
	}
	slices.Sort(out)
	return out
}

func labelNames() string {
	out := make([]string, len(labels))
	for i, l := range labels {
		out[i] = string(l)
	}
	return strings.Join(out, ", ")
}

// A record's label values are kept as parts (slots), joined only when
// scraped: a workload is its kind and name, a Service and a policy their
// namespace and name. Building "kind/name" for every record cost two
// allocations per record.
const (
	slotSrcNS = iota
	slotDstNS
	slotSrcKind
	slotSrcName
	slotDstKind
	slotDstName
	slotSvcNS
	slotSvcName
	slotFamily
	slotProto
	slotVerdict
	slotPolicyNS
	slotPolicyName
	slotNode
	slots
)

// labelSlots are each label's slots: one, or two joined by "/".
var labelSlots = map[Label][]int{
	SrcNamespace: {slotSrcNS}, DstNamespace: {slotDstNS},
	SrcWorkload: {slotSrcKind, slotSrcName}, DstWorkload: {slotDstKind, slotDstName},
	Service: {slotSvcNS, slotSvcName}, IPFamily: {slotFamily}, Protocol: {slotProto}, Verdict: {slotVerdict},
	Policy: {slotPolicyNS, slotPolicyName}, Node: {slotNode},
}

// A series' key is its slot values joined by sep (no Kubernetes name
// holds a NUL): one contiguous string hashes faster than an array of
// strings, and a lookup with a reused buffer allocates nothing.
const sep = "\x00"

// series is one series' values (one per metric of its table) and when it
// was last updated.
type series struct {
	values []float64
	seen   int64 // unix nanoseconds
}

// table is the series of the metrics that share one list of labels (the
// default bytes, packets and connections: one map lookup per record for
// the three).
type table struct {
	labels  []Label
	slots   []int // the labels' slots, in order
	metrics []Metric
	descs   []*prometheus.Desc
	series  map[string]*series
	folded  uint64
	expired uint64
	buf     []byte // the key being looked up
}

// Metrics is the configured flow metrics: a prometheus.Collector fed by
// Observe. Safe for concurrent use.
type Metrics struct {
	cfg    Config
	mu     sync.Mutex
	tables []*table
	now    func() time.Time

	seriesDesc, foldedDesc, expiredDesc *prometheus.Desc
}

// New returns the flow metrics of cfg (defaults filled in).
func New(cfg Config) (*Metrics, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.MaxSeries = cmp.Or(cfg.MaxSeries, DefaultMaxSeries)
	cfg.Expire.Duration = cmp.Or(cfg.Expire.Duration, DefaultExpire)
	m := &Metrics{cfg: cfg, now: time.Now,
		seriesDesc:  prometheus.NewDesc("dualflow_flow_metrics_series", "Series a flow metric holds now (at most its maxSeries, plus one \"_other\" series per family, protocol and verdict).", []string{"metric"}, nil),
		foldedDesc:  prometheus.NewDesc("dualflow_flow_metrics_folded_total", "Observations a flow metric folded into an \"_other\" series because it held maxSeries series.", []string{"metric"}, nil),
		expiredDesc: prometheus.NewDesc("dualflow_flow_metrics_expired_total", "Series a flow metric removed because they were not updated for the expire time (deleted workloads, traffic that stopped).", []string{"metric"}, nil),
	}
	for _, mc := range cfg.Metrics {
		var t *table
		for _, x := range m.tables {
			if slices.Equal(x.labels, mc.Labels) && !sparse(mc.Name) && !sparse(x.metrics[0]) {
				t = x
			}
		}
		if t == nil {
			t = &table{labels: mc.Labels, series: map[string]*series{}}
			for _, l := range mc.Labels {
				t.slots = append(t.slots, labelSlots[l]...)
			}
			m.tables = append(m.tables, t)
		}
		names := make([]string, len(mc.Labels))
		for i, l := range mc.Labels {
			names[i] = string(l)
		}
		t.metrics = append(t.metrics, mc.Name)
		t.descs = append(t.descs, prometheus.NewDesc("dualflow_flow_"+string(mc.Name)+"_total", metricHelp[mc.Name], names, nil))
	}
	return m, nil
}

// sparse metrics count few connections of a series' traffic: each has a
// table of its own, so that its series exist only where it counted (in a
// shared table every series has a value of every metric, zero or not).
func sparse(name Metric) bool { return name == DeniedConnections || name == DualStackGapConnections }

// Config returns the configuration in force, defaults filled in.
func (m *Metrics) Config() Config { return m.cfg }

// Observe counts recs: enriched and audited records, traceflow probes
// left out.
func (m *Metrics) Observe(recs []flow.Record) {
	if m == nil || len(m.tables) == 0 {
		return
	}
	now := m.now().UnixNano()
	m.mu.Lock()
	defer m.mu.Unlock()
	var v [slots]string
	var add [7]float64 // at most every metric in one table
	for i := range recs {
		r := &recs[i]
		if r.ProbeTraceID != "" {
			continue
		}
		first := r.First()
		denied, side := deniedSide(r)
		filled := false
		for _, t := range m.tables {
			any := false
			for j, name := range t.metrics {
				var a float64
				switch name {
				case Bytes:
					a = float64(r.BytesDelta)
				case ReverseBytes:
					a = float64(r.ReverseBytesDelta)
				case Packets:
					a = float64(r.PacketsDelta)
				case ReversePackets:
					a = float64(r.ReversePacketsDelta)
				case Connections:
					if first {
						a = 1
					}
				case DeniedConnections:
					if first && denied {
						a = 1
					}
				case DualStackGapConnections:
					if first && r.DualStackGap {
						a = 1
					}
				}
				add[j] = a
				any = any || a != 0
			}
			if !any {
				continue
			}
			if !filled {
				fill(&v, r, denied, side)
				filled = true
			}
			t.add(&v, add[:len(t.metrics)], now, m.cfg.MaxSeries)
		}
	}
}

// add adds to the series of v's labels, folding when the table is full.
func (t *table) add(v *[slots]string, add []float64, now int64, maxSeries int) {
	t.buf = t.key(t.buf[:0], v, false)
	s := t.series[string(t.buf)] // no allocation: the compiler looks up the bytes
	if s == nil {
		if len(t.series) >= maxSeries {
			t.folded++
			t.buf = t.key(t.buf[:0], v, true)
			s = t.series[string(t.buf)]
		}
		if s == nil {
			// The _other series may take a table past maxSeries: at most
			// one per combination of the bounded labels' values.
			s = &series{values: make([]float64, len(t.metrics))}
			t.series[string(t.buf)] = s
		}
	}
	for j, a := range add {
		s.values[j] += a
	}
	s.seen = now
}

// key appends the key of v's slots to b; folded, the labels that are not
// bounded read Other.
func (t *table) key(b []byte, v *[slots]string, folded bool) []byte {
	first := true
	for _, l := range t.labels {
		for i, j := range labelSlots[l] {
			if !first {
				b = append(b, sep...)
			}
			first = false
			switch {
			case !folded || bounded(l):
				b = append(b, v[j]...)
			case i == 0:
				b = append(b, Other...)
			}
		}
	}
	return b
}

// labelValues splits key k into t's label values.
func (t *table) labelValues(k string, out []string) []string {
	out = out[:0]
	parts := strings.Split(k, sep)
	i := 0
	for _, l := range t.labels {
		switch n := len(labelSlots[l]); {
		case n == 1:
			out = append(out, parts[i])
		case parts[i+1] == "":
			out = append(out, parts[i]) // "" or _other
		default:
			out = append(out, parts[i]+"/"+parts[i+1])
		}
		i += len(labelSlots[l])
	}
	return out
}

// deniedSide reports whether a side of r was denied or rejected, by the
// evaluated or the reported verdict, and which (ingress first).
func deniedSide(r *flow.Record) (bool, *flow.Policy) {
	for _, p := range []*flow.Policy{&r.Ingress, &r.Egress} {
		if p.Verdict.Blocked() || p.ReportedVerdict.Blocked() {
			return true, p
		}
	}
	return false, nil
}

// fill sets v to r's label slots.
func fill(v *[slots]string, r *flow.Record, denied bool, side *flow.Policy) {
	v[slotSrcNS], v[slotDstNS] = r.Src.PodNamespace, r.Dst.PodNamespace
	v[slotSrcKind], v[slotSrcName] = r.Src.WorkloadKind, r.Src.WorkloadName
	v[slotDstKind], v[slotDstName] = r.Dst.WorkloadKind, r.Dst.WorkloadName
	if r.Src.WorkloadName == "" {
		v[slotSrcKind] = ""
	}
	if r.Dst.WorkloadName == "" {
		v[slotDstKind] = ""
	}
	v[slotSvcNS], v[slotSvcName] = r.Service.Namespace, r.Service.Name
	if r.Service.Name == "" {
		v[slotSvcNS] = ""
	}
	v[slotFamily] = "ipv4"
	if r.IPVersion == 6 {
		v[slotFamily] = "ipv6"
	}
	v[slotProto] = flow.ProtoName(r.Proto)
	switch {
	case denied:
		v[slotVerdict] = "denied"
	case r.Ingress.Verdict == flow.VerdictUnknown && r.Egress.Verdict == flow.VerdictUnknown:
		v[slotVerdict] = "unknown"
	default:
		v[slotVerdict] = "allowed"
	}
	v[slotPolicyNS], v[slotPolicyName], v[slotNode] = "", "", ""
	if side != nil {
		switch {
		case side.Name != "":
			v[slotPolicyNS], v[slotPolicyName] = side.Namespace, side.Name
		case side.ReportedName != "":
			v[slotPolicyNS] = side.ReportedName // already namespace/name or a rule id
		}
		v[slotNode] = r.Dst.NodeName
		if side == &r.Egress {
			v[slotNode] = r.Src.NodeName
		}
		v[slotNode] = cmp.Or(v[slotNode], r.ExporterNode)
	}
}

// Describe sends the metrics' descriptions.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.seriesDesc
	ch <- m.foldedDesc
	ch <- m.expiredDesc
	for _, t := range m.tables {
		for _, d := range t.descs {
			ch <- d
		}
	}
}

// Collect removes the expired series and sends the others.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire()
	var lv []string
	for _, t := range m.tables {
		for k, s := range t.series {
			lv = t.labelValues(k, lv)
			for j, d := range t.descs {
				ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, s.values[j], lv...)
			}
		}
		for _, name := range t.metrics {
			ch <- prometheus.MustNewConstMetric(m.seriesDesc, prometheus.GaugeValue, float64(len(t.series)), string(name))
			ch <- prometheus.MustNewConstMetric(m.foldedDesc, prometheus.CounterValue, float64(t.folded), string(name))
			ch <- prometheus.MustNewConstMetric(m.expiredDesc, prometheus.CounterValue, float64(t.expired), string(name))
		}
	}
}

// Expire removes the series not updated for the expire time; Collect
// calls it, and so should a caller that is not scraped.
func (m *Metrics) Expire() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.expire()
}

func (m *Metrics) expire() {
	cut := m.now().Add(-m.cfg.Expire.Duration).UnixNano()
	for _, t := range m.tables {
		for k, s := range t.series {
			if s.seen < cut {
				delete(t.series, k)
				t.expired++
			}
		}
	}
}
