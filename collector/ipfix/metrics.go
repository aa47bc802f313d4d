package ipfix

import (
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the listener's Prometheus metrics.
type metrics struct {
	messages   *prometheus.CounterVec // {transport}
	records    *prometheus.CounterVec // {transport}
	dropped    [numReasons]prometheus.Counter
	skipped    *prometheus.CounterVec // {reason}: records not forwarded
	unknownSet prometheus.Counter
	templates  *prometheus.CounterVec // {event}
	seqLost    *prometheus.CounterVec // {transport, exporter}
	seqLostMsg *prometheus.CounterVec // {transport, exporter}
	// exporters are the exporter label values in use (at most
	// maxExporterSeries).
	expMu      sync.Mutex
	exporters  map[netip.Addr]string
	byVersion  *prometheus.CounterVec // {protocol}
	stamped    [numStampReasons]prometheus.Counter
	bothFams   prometheus.Counter
	untracked  prometheus.Counter
	sessions   *prometheus.GaugeVec   // {transport}
	closed     *prometheus.CounterVec // {transport, reason}
	kernelDrop prometheus.Counter
	// overBudgetLog is set once the spent template budget was logged.
	overBudgetLog atomic.Bool
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg) // registers on reg unless it is nil
	m := &metrics{
		messages: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_ipfix_messages_total", Help: "IPFIX messages received.",
		}, []string{"transport"}),
		records: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_ipfix_records_total", Help: "Flow records decoded from IPFIX.",
		}, []string{"transport"}),
		skipped: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_ipfix_records_skipped_total", Help: "IPFIX data records read but not forwarded: options records, records without IP addresses, records of the flowDirection not kept (--collector.ipfix.flow-direction).",
		}, []string{"reason"}),
		unknownSet: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_ipfix_sets_unknown_template_total", Help: "IPFIX data sets skipped because their template is unknown or expired.",
		}),
		templates: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_ipfix_templates_total", Help: "IPFIX template events: added, refreshed, withdrawn, expired, rejected (a session's limits), over_budget (the collector's template budget).",
		}, []string{"event"}),
		seqLost: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_ipfix_sequence_lost_records_total", Help: "Data records missing according to sequence numbers (IPFIX data records, NetFlow v5 flows, NetFlow v9 from exporters that count flows; per observation domain, summed), by transport and exporter address (\"_other\" past 4,096 exporters; a series exists from the exporter's first message).",
		}, []string{"transport", "exporter"}),
		seqLostMsg: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_ipfix_sequence_lost_messages_total", Help: "Messages missing according to sequence numbers that count messages (NetFlow v9 export packets, RFC 3954), by transport and exporter address (as dualflow_ipfix_sequence_lost_records_total).",
		}, []string{"transport", "exporter"}),
		exporters: map[netip.Addr]string{},
		byVersion: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_ipfix_messages_by_protocol_total", Help: "Messages decoded, by protocol: ipfix, netflow9, netflow5 (the version in the message header).",
		}, []string{"protocol"}),
		untracked: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_ipfix_direction_untracked_records_total", Help: "Records with flowDirection kept without tracking their tuple: --collector.ipfix.flow-direction auto past its memory bound (65,536 tuples per session, 64 MiB for all sessions at 128 bytes a tuple). An exporter reporting packets in and out may be counted twice for them.",
		}),
		bothFams: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_ipfix_records_both_families_total", Help: "Records whose template carries both families' addresses and that filled both (contradictory): the IPv6 addresses are kept.",
		}),
		sessions: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dualflow_ipfix_sessions", Help: "Live IPFIX sessions (connections, UDP exporters).",
		}, []string{"transport"}),
		closed: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_ipfix_sessions_closed_total", Help: "IPFIX sessions ended, by reason: eof, bad_framing (a header a stream cannot be framed by: NetFlow over TCP or TLS, also counted in dualflow_ipfix_messages_dropped_total{reason=\"version\"}, or an IPFIX length below 16, reason length), error, shutdown, idle (nothing sent for the idle timeout), slow_message (a message not completed within the message timeout), evicted (a session older than 10 s delivering under one record a minute gave its place to a new connection), and refused TCP/TLS connections: limit (all sessions taken), source_limit (all of this address's), prefix_limit (all of its IPv4 /24 or IPv6 /64; 127.0.0.0/8 is one), reserved (only the places kept for preferred sources left), source_not_allowed (outside --collector.ipfix.allowed-sources); tls_handshake.",
		}, []string{"transport", "reason"}),
		kernelDrop: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_ipfix_udp_kernel_drops_total", Help: "UDP datagrams the kernel dropped on the IPFIX sockets (receive buffer full, SO_RXQ_OVFL).",
		}),
	}
	stamped := f.NewCounterVec(prometheus.CounterOpts{
		Name: "dualflow_ipfix_records_stamped_total", Help: "Records written with times the collector set, by reason: no_time (no usable start or end), relative_without_init (sysUpTime times without systemInitTimeMilliseconds), zero_uptime (NetFlow FIRST and LAST 0), no_start (the end taken), no_end (the export time taken), too_old and future (an end further than the time window, half the flows' retention, from the export and receive times). Stamped with the message's export time, or the receive time when that is unusable; none is dropped.",
	}, []string{"reason"})
	for r := StampReason(1); r < numStampReasons; r++ {
		m.stamped[r] = stamped.WithLabelValues(r.String())
	}
	dropped := f.NewCounterVec(prometheus.CounterOpts{
		Name: "dualflow_ipfix_messages_dropped_total", Help: "IPFIX messages dropped, by reason: malformed (short, version, length, set_length, template, record_length), too_many_domains, too_many_sessions, queue_full (decoded, the pipeline queue full: UDP), source_not_allowed (outside --collector.ipfix.allowed-sources); for TCP/TLS, too_many_sessions (every reason of dualflow_ipfix_sessions_closed_total: limit, source_limit, prefix_limit, reserved) and source_not_allowed count refused connections.",
	}, []string{"reason"})
	for r := Reason(1); r < numReasons; r++ {
		m.dropped[r] = dropped.WithLabelValues(r.String())
	}
	return m
}

// maxExporterSeries bounds the exporter label's values: a cluster's
// nodes, replaced over months, stay well under it.
const maxExporterSeries = 4096

// exporterLabel is the exporter label of address a: the address, or
// "_other" once maxExporterSeries addresses have one.
func (m *metrics) exporterLabel(a netip.Addr) string {
	m.expMu.Lock()
	defer m.expMu.Unlock()
	if e, ok := m.exporters[a]; ok {
		return e
	}
	if len(m.exporters) >= maxExporterSeries {
		return "_other"
	}
	e := a.String()
	m.exporters[a] = e
	return e
}

// newExporter makes the sequence-loss series of exporter a exist, at 0,
// from its first message: increase() then sees its first loss (a series
// born with the loss in it would show none).
func (m *metrics) newExporter(tr Transport, a netip.Addr) {
	e := m.exporterLabel(a)
	m.seqLost.WithLabelValues(tr.String(), e)
	m.seqLostMsg.WithLabelValues(tr.String(), e)
}

// flush adds what d counted since prev to the metrics and updates prev.
// The first records a decoder skips for their flowDirection are also
// logged once: an exporter that observes egress only would otherwise lose
// everything to the default quietly.
func (m *metrics) flush(tr Transport, d *Decoder, prev *Stats, log *slog.Logger) {
	s := &d.Stats
	if s.WrongDirection > 0 && prev.WrongDirection == 0 && log != nil {
		log.Info("ipfix records skipped for their flowDirection (an exporter reporting the same packets in and out is counted once; see --collector.ipfix.flow-direction)",
			"transport", tr.String(), "keep", d.Direction.String(), "skipped", s.WrongDirection)
	}
	add := func(c prometheus.Counter, now, was uint64) {
		if now != was {
			c.Add(float64(now - was))
		}
	}
	t := tr.String()
	add(m.messages.WithLabelValues(t), s.Messages, prev.Messages)
	add(m.records.WithLabelValues(t), s.Records, prev.Records)
	for r := Reason(1); r < numReasons; r++ {
		add(m.dropped[r], s.Dropped[r], prev.Dropped[r])
	}
	add(m.skipped.WithLabelValues("no_address"), s.NoAddress, prev.NoAddress)
	add(m.skipped.WithLabelValues("flow_direction"), s.WrongDirection, prev.WrongDirection)
	add(m.skipped.WithLabelValues("options"), s.OptionsRecords, prev.OptionsRecords)
	add(m.unknownSet, s.UnknownSets, prev.UnknownSets)
	add(m.templates.WithLabelValues("added"), s.Templates, prev.Templates)
	add(m.templates.WithLabelValues("refreshed"), s.Refreshes, prev.Refreshes)
	add(m.templates.WithLabelValues("withdrawn"), s.Withdrawn, prev.Withdrawn)
	add(m.templates.WithLabelValues("expired"), s.Expired, prev.Expired)
	add(m.templates.WithLabelValues("rejected"), s.TemplatesRejected, prev.TemplatesRejected)
	add(m.templates.WithLabelValues("over_budget"), s.TemplatesOverBudget, prev.TemplatesOverBudget)
	if s.TemplatesOverBudget > prev.TemplatesOverBudget && log != nil && !m.overBudgetLog.Swap(true) {
		log.Warn("ipfix templates refused: the collector's template budget is spent (logged once; see dualflow_ipfix_templates_total and --collector.ipfix.max-template-bytes-total)",
			"transport", tr.String())
	}
	for a, l := range d.Lost {
		e := m.exporterLabel(a)
		add(m.seqLost.WithLabelValues(t, e), l.Records, 0)
		add(m.seqLostMsg.WithLabelValues(t, e), l.Messages, 0)
	}
	clear(d.Lost)
	for r := StampReason(1); r < numStampReasons; r++ {
		add(m.stamped[r], s.Stamped[r], prev.Stamped[r])
	}
	add(m.bothFams, s.BothFamilies, prev.BothFamilies)
	add(m.untracked, s.DirectionUntracked, prev.DirectionUntracked)
	for i, name := range [...]string{protoIPFIX: "ipfix", protoV9: "netflow9", protoV5: "netflow5"} {
		add(m.byVersion.WithLabelValues(name), s.ByVersion[i], prev.ByVersion[i])
	}
	*prev = *s
}
