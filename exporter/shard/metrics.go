package shard

import "github.com/prometheus/client_golang/prometheus"

var (
	descMembers   = prometheus.NewDesc("dualflow_exporter_collectors", "Collectors records are sharded over (static list or DNS).", nil, nil)
	descGone      = prometheus.NewDesc("dualflow_exporter_collectors_gone", "Collectors out of the --exporter.collectors-dns answer that keep their share and buffer until --exporter.collector-failover-timeout (counted in dualflow_exporter_collectors).", nil, nil)
	descHealthy   = prometheus.NewDesc("dualflow_exporter_collectors_healthy", "Collectors connected now.", nil, nil)
	descUp        = prometheus.NewDesc("dualflow_exporter_collector_up", "1 while connected to this collector.", []string{"collector"}, nil)
	descRouted    = prometheus.NewDesc("dualflow_exporter_collector_records_routed_total", "Records routed to this collector's send buffer.", []string{"collector"}, nil)
	descFailovers = prometheus.NewDesc("dualflow_exporter_collector_failovers_total", "Collectors disconnected past --exporter.collector-failover-timeout, whose share of new records moved to the others.", nil, nil)
	descDNSErrors = prometheus.NewDesc("dualflow_exporter_collectors_dns_errors_total", "Resolutions of --exporter.collectors-dns that failed or returned no address; the last collectors were kept.", nil, nil)
	descUnrouted  = prometheus.NewDesc("dualflow_exporter_collectors_unrouted_records_total", "Records dropped because no collector was known (DNS had resolved nothing yet).", nil, nil)
)

// Describe implements prometheus.Collector. The send counters summed over
// the members are in Stats, for the exporter's own metrics.
func (s *Sharder) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMembers, descGone, descHealthy, descUp, descRouted, descFailovers, descDNSErrors, descUnrouted} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. The per-collector series are
// those of the present members, so their number is bounded by the member
// set.
func (s *Sharder) Collect(ch chan<- prometheus.Metric) {
	s.mu.RLock()
	all := s.all
	s.mu.RUnlock()
	healthy := 0
	for _, m := range all {
		up := 0.0
		if m.snd.Stats().Connected {
			up, healthy = 1, healthy+1
		}
		ch <- prometheus.MustNewConstMetric(descUp, prometheus.GaugeValue, up, m.name)
		ch <- prometheus.MustNewConstMetric(descRouted, prometheus.CounterValue, float64(m.routed.Load()), m.name)
	}
	ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(len(all)))
	ch <- prometheus.MustNewConstMetric(descGone, prometheus.GaugeValue, float64(s.gone.Load()))
	ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, float64(healthy))
	ch <- prometheus.MustNewConstMetric(descFailovers, prometheus.CounterValue, float64(s.failovers.Load()))
	ch <- prometheus.MustNewConstMetric(descDNSErrors, prometheus.CounterValue, float64(s.dnsErrors.Load()))
	ch <- prometheus.MustNewConstMetric(descUnrouted, prometheus.CounterValue, float64(s.unrouted.Load()))
}

var _ prometheus.Collector = (*Sharder)(nil)
