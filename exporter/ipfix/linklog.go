package ipfix

import (
	"log/slog"
	"time"
)

// Logging of the collector connection.
const (
	// linkLogEvery is the least time between two warnings about the
	// collector: the first failure of an outage is logged at once, then a
	// summary at most this often.
	linkLogEvery = time.Minute
	// linkSettle is how long a connection must last to end an outage: a
	// collector that accepts and closes at once (a source it does not
	// allow, a client certificate it refuses) or a UDP collector that is
	// not there (ICMP port unreachable) reports itself within a round trip.
	linkSettle = time.Second
)

// linkLog turns the connection events of Run into a few log lines: the
// first failure of an outage at once, a summary of the failed attempts and
// the records dropped at most every linkLogEvery while it lasts, one line
// when the connection is back, and, while connected, a warning at most
// every linkLogEvery when the buffer drops records. A flapping collector
// costs at most one warning and one "back" line per interval (the flaps
// are counted in the next warning). Only Run's goroutine uses it.
type linkLog struct {
	log                *slog.Logger
	collector, network string
	every, settle      time.Duration

	up          bool      // connected for settle, no failure since
	everUp      bool      // up at least once
	connectedAt time.Time // of the current connection; zero when none
	since       time.Time // start of the outage (Run's start at first)
	failures    int       // failed attempts in the outage
	lost        int       // connections lost since the last warning
	warned      time.Time // last warning about the connection
	dropWarned  time.Time // last warning about drops while up
	outageShown bool      // the outage was warned about
	// Stats counters at the start of the outage, or at the last warning
	// about drops while up.
	dropped0, retried0 uint64
}

func newLinkLog(log *slog.Logger, cfg Config) *linkLog {
	return &linkLog{log: log, collector: cfg.Address, network: cfg.Transport, every: linkLogEvery, settle: linkSettle}
}

// start marks the beginning of Run: down until a connection settles.
func (l *linkLog) start(now time.Time) { l.since = now }

// connected records a new connection (templates sent).
func (l *linkLog) connected(now time.Time) { l.connectedAt = now }

// failed records a failed connection attempt, or a connection that ended
// with err.
func (l *linkLog) failed(now time.Time, err error, st Stats) {
	l.connectedAt = time.Time{}
	if l.up {
		l.up, l.lost = false, l.lost+1
		l.since, l.failures, l.outageShown = now, 0, false
		l.dropped0, l.retried0 = st.DroppedBufferFull, st.RetriedRecords
	}
	l.failures++
	if !l.warned.IsZero() && now.Sub(l.warned) < l.every {
		return
	}
	msg := "ipfix collector still unreachable"
	if !l.outageShown {
		msg = "ipfix collector unreachable; records wait in the send buffer (the oldest are dropped when --exporter.ipfix.buffer-bytes is full)"
	}
	args := []any{"collector", l.collector, "transport", l.network, "err", err,
		"down_for", now.Sub(l.since).Round(time.Millisecond), "failed_attempts", l.failures,
		"records_dropped", st.DroppedBufferFull - l.dropped0, "records_retried", st.RetriedRecords - l.retried0,
		"records_buffered", st.BufferedRecords}
	if l.lost > 0 {
		args = append(args, "connections_lost", l.lost)
	}
	l.log.Warn(msg, args...)
	l.warned, l.outageShown, l.lost = now, true, 0
}

// tick ends the outage once the current connection has lasted settle, and
// while connected warns about records the full buffer dropped.
func (l *linkLog) tick(now time.Time, st Stats) {
	if !l.up && !l.connectedAt.IsZero() && now.Sub(l.connectedAt) >= l.settle {
		l.up = true
		switch {
		case l.outageShown:
			l.log.Info("ipfix connection to the collector is back", "collector", l.collector, "transport", l.network,
				"down_for", now.Sub(l.since).Round(time.Millisecond), "failed_attempts", l.failures,
				"records_dropped", st.DroppedBufferFull-l.dropped0, "records_retried", st.RetriedRecords-l.retried0)
		case !l.everUp:
			l.log.Info("ipfix connected to the collector", "collector", l.collector, "transport", l.network)
		}
		l.everUp, l.outageShown = true, false
		l.dropped0 = st.DroppedBufferFull
	}
	if l.up && st.DroppedBufferFull > l.dropped0 && (l.dropWarned.IsZero() || now.Sub(l.dropWarned) >= l.every) {
		l.log.Warn("ipfix send buffer full: the oldest records were dropped (the collector reads slower than records come)",
			"collector", l.collector, "records_dropped", st.DroppedBufferFull-l.dropped0, "records_buffered", st.BufferedRecords)
		l.dropWarned, l.dropped0 = now, st.DroppedBufferFull
	}
}
