package ovs

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/ovs"
)

// Parse error sources, the values of the source label of
// dualflow_exporter_ovs_parse_errors_total.
const (
	parseConntrack = "conntrack" // dpctl/dump-conntrack lines
	parseFlows     = "flows"     // dump-flows lines
	parsePacketIn  = "packet_in" // monitor packet-ins
	parseRules     = "rules"     // the rules file
)

// metrics are the OVS source's Prometheus instruments.
type metrics struct {
	parseErrors   *prometheus.CounterVec // source
	commandErrors *prometheus.CounterVec // command
	deniedPackets prometheus.Counter
	deniedDropped prometheus.Counter
	rules         *ruleCollector
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		parseErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_exporter_ovs_parse_errors_total",
			Help: "Lines of OVS CLI output (or rules files) that could not be parsed and were skipped, by source.",
		}, []string{"source"}),
		commandErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_exporter_ovs_command_errors_total",
			Help: "OVS CLI runs that failed or timed out, by command.",
		}, []string{"command"}),
		deniedPackets: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_exporter_ovs_denied_packets_total",
			Help: "Dropped packets received as packet-ins from drop flows (rate-limited by the datapath's meter).",
		}),
		deniedDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_exporter_ovs_denied_overflow_total",
			Help: "Denied packets of new flows not tracked because the denied-flow table was full.",
		}),
		rules: &ruleCollector{},
	}
	for _, s := range []string{parseConntrack, parseFlows, parsePacketIn, parseRules} {
		m.parseErrors.WithLabelValues(s)
	}
	if reg != nil {
		reg.MustRegister(m.parseErrors, m.commandErrors, m.deniedPackets, m.deniedDropped, m.rules)
	}
	return m
}

var (
	descRulePackets = prometheus.NewDesc("dualflow_exporter_ovs_rule_packets_total",
		"Packets that hit the OpenFlow flows of a NetworkPolicy rule (kind allow: new connections it allowed; kind drop: packets an isolated pod dropped), from dump-flows.",
		[]string{"rule", "kind"}, nil)
	descRuleBytes = prometheus.NewDesc("dualflow_exporter_ovs_rule_bytes_total",
		"Frame bytes that hit the OpenFlow flows of a NetworkPolicy rule, from dump-flows.",
		[]string{"rule", "kind"}, nil)
)

// RuleStat is the sum of the statistics of every flow of one rule.
type RuleStat struct {
	Rule           ovs.Rule
	Packets, Bytes uint64
}

// ruleCollector exposes the rule statistics of the latest dump.
type ruleCollector struct {
	mu    sync.Mutex
	stats []RuleStat
}

func (c *ruleCollector) set(s []RuleStat) {
	c.mu.Lock()
	c.stats = s
	c.mu.Unlock()
}

func (c *ruleCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descRulePackets
	ch <- descRuleBytes
}

func (c *ruleCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.stats {
		ch <- prometheus.MustNewConstMetric(descRulePackets, prometheus.CounterValue, float64(s.Packets), s.Rule.Name, s.Rule.Kind.String())
		ch <- prometheus.MustNewConstMetric(descRuleBytes, prometheus.CounterValue, float64(s.Bytes), s.Rule.Name, s.Rule.Kind.String())
	}
}
