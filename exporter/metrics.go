package exporter

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/exporter/conntrack"
	"github.com/dualflow/dualflow/exporter/ipfix"
	"github.com/dualflow/dualflow/flow"
)

var families = [2]string{"ipv4", "ipv6"}

func familyOf(v uint8) string {
	if v == 6 {
		return families[1]
	}
	return families[0]
}

// metrics are the exporter's Prometheus instruments. Counters the stages
// keep themselves (store, IPFIX sender) are read at scrape time by
// statsCollector.
type metrics struct {
	pollDuration *prometheus.HistogramVec // family
	pollErrors   *prometheus.CounterVec   // family
	records      *prometheus.CounterVec   // family, reason: records handed to the IPFIX sender
	events       *prometheus.CounterVec   // type
	eventLoss    prometheus.Counter
	eventErrors  prometheus.Counter
	sysctl       *prometheus.GaugeVec   // name
	handover     *prometheus.CounterVec // result
}

func newMetrics(reg prometheus.Registerer, store *connstore.Store, sender interface{ Stats() ipfix.Stats }) *metrics {
	m := &metrics{
		pollDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dualflow_exporter_poll_duration_seconds", Help: "Time to dump the conntrack table of one family and merge it into the store.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14), // 1 ms .. 8 s
		}, []string{"family"}),
		pollErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_exporter_poll_errors_total", Help: "Conntrack dumps that failed.",
		}, []string{"family"}),
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_exporter_records_total", Help: "Flow records produced and handed to the IPFIX sender, by flow end reason.",
		}, []string{"family", "reason"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_exporter_conntrack_events_total", Help: "Conntrack events received.",
		}, []string{"type"}),
		eventLoss: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_exporter_conntrack_event_loss_total", Help: "Times the kernel reported dropped conntrack events (ENOBUFS); each triggers a reconciling dump.",
		}),
		eventErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_exporter_conntrack_event_errors_total", Help: "Event subscriptions that failed for another reason than ENOBUFS.",
		}),
		handover: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_exporter_handovers_total", Help: "Starts that read a handover file in --exporter.state-dir of the last run on this node: resumed, or invalid (another node, netns or format, too old, unreadable; its connections are exported again).",
		}, []string{"result"}),
		sysctl: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dualflow_exporter_conntrack_sysctl", Help: "Conntrack sysctls of the target netns the exporter depends on (1 on, 0 off); counters need nf_conntrack_acct, start times nf_conntrack_timestamp.",
		}, []string{"name"}),
	}
	reg.MustRegister(m.pollDuration, m.pollErrors, m.records, m.events, m.eventLoss, m.eventErrors, m.sysctl, m.handover,
		&statsCollector{store: store, sender: sender})
	for _, f := range families {
		m.pollErrors.WithLabelValues(f)
	}
	return m
}

func (m *metrics) setAccounting(a conntrack.Accounting) {
	b := func(v bool) float64 {
		if v {
			return 1
		}
		return 0
	}
	m.sysctl.WithLabelValues("nf_conntrack_acct").Set(b(a.Acct))
	m.sysctl.WithLabelValues("nf_conntrack_timestamp").Set(b(a.Timestamp))
	m.sysctl.WithLabelValues("nf_conntrack_events").Set(b(a.Events))
}

func (m *metrics) countRecords(recs []flow.Record) {
	for i := range recs {
		m.records.WithLabelValues(familyOf(recs[i].IPVersion), recs[i].EndReason.String()).Inc()
	}
}

var (
	descConns        = prometheus.NewDesc("dualflow_exporter_connections", "Connections tracked in the store.", []string{"family"}, nil)
	descOverflow     = prometheus.NewDesc("dualflow_exporter_store_overflow_total", "New connections not tracked because the store was full; each was exported with reason lack_of_resources.", []string{"family"}, nil)
	descReused       = prometheus.NewDesc("dualflow_exporter_store_tuple_reuse_total", "Tuples reused by a new connection before the old one was seen ending.", []string{"family"}, nil)
	descSwept        = prometheus.NewDesc("dualflow_exporter_store_swept_total", "Connections found gone by a dump: their end event was missed.", []string{"family"}, nil)
	descTombs        = prometheus.NewDesc("dualflow_exporter_store_tombstones", "Deleted connections remembered so a late observation of them is not counted twice.", []string{"family"}, nil)
	descTombsEvicted = prometheus.NewDesc("dualflow_exporter_store_tombstones_evicted_total", "Tombstones forgotten before their TTL because the store held the most allowed.", []string{"family"}, nil)
	descLate         = prometheus.NewDesc("dualflow_exporter_store_late_total", "Observations of deleted connections matched by their tombstone: late end events, connections a dump had skipped.", []string{"family"}, nil)
	descSent         = prometheus.NewDesc("dualflow_exporter_ipfix_records_sent_total", "Records written to the collector.", []string{"family"}, nil)
	descMessages     = prometheus.NewDesc("dualflow_exporter_ipfix_messages_sent_total", "IPFIX data messages written to the collector.", nil, nil)
	descBytes        = prometheus.NewDesc("dualflow_exporter_ipfix_bytes_sent_total", "Bytes written to the collector, templates included.", nil, nil)
	descConnected    = prometheus.NewDesc("dualflow_exporter_ipfix_connected", "1 while connected to the collector (with several collectors: to every one; see dualflow_exporter_collector_up).", nil, nil)
	descReconnects   = prometheus.NewDesc("dualflow_exporter_ipfix_reconnects_total", "Connection attempts to the collector after the first.", nil, nil)
	descDialFailures = prometheus.NewDesc("dualflow_exporter_ipfix_dial_failures_total", "Failed connection attempts to the collector.", nil, nil)
	descDisconnects  = prometheus.NewDesc("dualflow_exporter_ipfix_disconnects_total", "Established collector connections lost.", nil, nil)
	descRetried      = prometheus.NewDesc("dualflow_exporter_ipfix_records_retried_total", "Records whose write to the collector failed, put back at the head of the send buffer for the next connection.", nil, nil)
	descBuffered     = prometheus.NewDesc("dualflow_exporter_ipfix_buffered_records", "Records waiting for the collector.", nil, nil)
	descBufferedB    = prometheus.NewDesc("dualflow_exporter_ipfix_buffered_bytes", "Encoded bytes waiting for the collector (bounded by --exporter.ipfix.buffer-bytes).", nil, nil)
	descDropped      = prometheus.NewDesc("dualflow_records_dropped_total", "Records dropped, by pipeline stage and reason.", []string{"stage", "reason"}, nil)
)

// statsCollector reads the store's and the sender's own counters at
// scrape time.
type statsCollector struct {
	store  *connstore.Store
	sender interface{ Stats() ipfix.Stats } // summed over the collectors when sharding
}

func (c *statsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descConns, descOverflow, descReused, descSwept, descTombs, descTombsEvicted, descLate, descSent, descMessages, descBytes,
		descConnected, descReconnects, descDialFailures, descDisconnects, descRetried, descBuffered, descBufferedB, descDropped} {
		ch <- d
	}
}

func (c *statsCollector) Collect(ch chan<- prometheus.Metric) {
	st, sn := c.store.Stats(), c.sender.Stats()
	for i, f := range families {
		ch <- prometheus.MustNewConstMetric(descConns, prometheus.GaugeValue, float64(st.Conns[i]), f)
		ch <- prometheus.MustNewConstMetric(descOverflow, prometheus.CounterValue, float64(st.Overflow[i]), f)
		ch <- prometheus.MustNewConstMetric(descReused, prometheus.CounterValue, float64(st.Reused[i]), f)
		ch <- prometheus.MustNewConstMetric(descSwept, prometheus.CounterValue, float64(st.Swept[i]), f)
		ch <- prometheus.MustNewConstMetric(descTombs, prometheus.GaugeValue, float64(st.Tombstones[i]), f)
		ch <- prometheus.MustNewConstMetric(descTombsEvicted, prometheus.CounterValue, float64(st.TombstonesEvicted[i]), f)
		ch <- prometheus.MustNewConstMetric(descLate, prometheus.CounterValue, float64(st.Late[i]), f)
		ch <- prometheus.MustNewConstMetric(descSent, prometheus.CounterValue, float64(sn.Records[i]), f)
	}
	connected := 0.0
	if sn.Connected {
		connected = 1
	}
	for _, m := range []struct {
		d *prometheus.Desc
		t prometheus.ValueType
		v float64
	}{
		{descMessages, prometheus.CounterValue, float64(sn.Messages)},
		{descBytes, prometheus.CounterValue, float64(sn.Bytes)},
		{descConnected, prometheus.GaugeValue, connected},
		{descReconnects, prometheus.CounterValue, float64(sn.Reconnects)},
		{descDialFailures, prometheus.CounterValue, float64(sn.DialFailures)},
		{descDisconnects, prometheus.CounterValue, float64(sn.Disconnects)},
		{descRetried, prometheus.CounterValue, float64(sn.RetriedRecords)},
		{descBuffered, prometheus.GaugeValue, float64(sn.BufferedRecords)},
		{descBufferedB, prometheus.GaugeValue, float64(sn.BufferedBytes)},
	} {
		ch <- prometheus.MustNewConstMetric(m.d, m.t, m.v)
	}
	for reason, v := range map[string]uint64{"buffer_full": sn.DroppedBufferFull, "shutdown": sn.DroppedShutdown, "invalid": sn.DroppedInvalid,
		"oversize": sn.DroppedOversize} {
		ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(v), "exporter", reason)
	}
}
