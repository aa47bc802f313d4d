package ipfix

import (
	"time"

	"github.com/dualflow/dualflow/flow"
)

// A record is written with its own times only when its end (flow_end, the
// column the store's TTL is on) lies within the decoder's time window of
// both its message's export time and the time it was received. Other
// records are stamped, never dropped: their counters are real traffic.
// Records without a usable end take the export time (or, when that is zero
// or itself out of the window, the receive time) as start and end; a
// record whose end is out of the window is moved to that time with its
// duration; a missing start is the end. Each stamped record is counted by
// reason (Stats.Stamped).

// StampReason says why a record's times were set by the decoder (label of
// dualflow_ipfix_records_stamped_total).
type StampReason uint8

const (
	StampNone StampReason = iota
	// StampNoTime: no usable start or end (no time element in the
	// template, or zeros).
	StampNoTime
	// StampRelativeWithoutInit: IPFIX flowStart/EndSysUpTime without the
	// systemInitTimeMilliseconds they are relative to.
	StampRelativeWithoutInit
	// StampZeroUptime: NetFlow v5 or v9 FIRST_SWITCHED and LAST_SWITCHED
	// both 0.
	StampZeroUptime
	// StampNoStart: an end but no start; the start is the end.
	StampNoStart
	// StampNoEnd: a start but no end; the end is the export time.
	StampNoEnd
	// StampTooOld: the end is more than the time window before the export
	// or the receive time: the store's TTL would delete the row at once.
	StampTooOld
	// StampFuture: the end is more than the time window after the export
	// or the receive time.
	StampFuture
	numStampReasons
)

var stampNames = [numStampReasons]string{"none", "no_time", "relative_without_init", "zero_uptime",
	"no_start", "no_end", "too_old", "future"}

func (r StampReason) String() string {
	if r < numStampReasons {
		return stampNames[r]
	}
	return "unknown"
}

// DefaultTimeWindow is the time window when the flows' retention is not
// known or unlimited (Config.Retention 0): half of the shortest retention
// --clickhouse.ttl-days can set (1 day), so that no row is written within
// 12 hours of its deletion.
const DefaultTimeWindow = 12 * time.Hour

// TimeWindow is the time window for a retention of the flows (the store's
// TTL on flow_end): half of it, so that a row lives at least half the
// retention; DefaultTimeWindow for 0 (unknown or unlimited).
func TimeWindow(retention time.Duration) time.Duration {
	if retention <= 0 {
		return DefaultTimeWindow
	}
	return retention / 2
}

// clock is what the records of one message are checked against.
type clock struct {
	// ref is what records are stamped with: the message's export time,
	// or the receive time when the export time is zero or out of the
	// window.
	ref time.Time
	// loSec and hiSec bound a record's end, in Unix seconds (a second
	// more than the window at most; the window is hours): the window
	// around the receive time and, when it is ref, around the export
	// time.
	loSec, hiSec int64
	window       time.Duration
}

// newClock returns the clock of a message exported at export (zero: the
// header has none) and received at now. It works in whole seconds,
// rounding the window outwards.
func newClock(export, now time.Time, window time.Duration) clock {
	w := int64(window / time.Second)
	n := now.Unix()
	c := clock{ref: now, loSec: n - w, hiSec: n + w, window: window}
	if e := export.Unix(); e > 0 && e >= c.loSec && e <= c.hiSec {
		c.ref = export
		c.loSec, c.hiSec = max(c.loSec, e-w), min(c.hiSec, e+w)
	}
	return c
}

// usable reports whether r's times can be written as they are: a start,
// and an end within the window (to the second: the window is hours). The
// zero Time, year 1, is before any window.
func (c *clock) usable(r *flow.Record) bool {
	end := r.FlowEnd.Unix()
	return end >= c.loSec && end <= c.hiSec && !r.FlowStart.IsZero()
}

// stamp sets the times of a record that is not usable and counts it;
// missing is the reason when it has neither start nor end.
func (d *Decoder) stamp(r *flow.Record, c *clock, missing StampReason) {
	start, end := r.FlowStart, r.FlowEnd
	var why StampReason
	switch {
	case start.IsZero() && end.IsZero():
		r.FlowStart, r.FlowEnd = c.ref, c.ref
		d.count(missing)
		return
	case end.IsZero():
		why, end = StampNoEnd, c.ref
	case start.IsZero():
		why, start = StampNoStart, end
	}
	if end.Unix() < c.loSec || end.Unix() > c.hiSec {
		why = StampFuture
		if end.Unix() < c.loSec {
			why = StampTooOld
		}
		// The exporter's clock is off, not its measure of the flow: the
		// duration is kept when it is plausible.
		dur := end.Sub(start)
		end = c.ref
		start = end
		if dur > 0 && dur <= c.window {
			start = end.Add(-dur)
		}
	}
	if start.After(end) {
		start = end
	}
	r.FlowStart, r.FlowEnd = start, end
	d.count(why)
}

func (d *Decoder) count(why StampReason) {
	d.Stats.Stamped[why]++
	d.stamped = why
}

// missingTime is why a record of template t with scratch sc has no usable
// time.
func missingTime(t *template, sc *scratch, mc *msgCtx) StampReason {
	if t.post&postUptime == 0 || !sc.hasStartUp && !sc.hasEndUp {
		return StampNoTime
	}
	if mc.hasUptime {
		if sc.startUp == 0 && sc.endUp == 0 {
			return StampZeroUptime
		}
		return StampNoTime
	}
	sys := mc.domain.sysInitMs // as fixup reads it
	if sc.hasSys {
		sys = sc.sysInit
	}
	if sys == 0 {
		return StampRelativeWithoutInit
	}
	return StampNoTime
}

// maxZeroSpan bounds the flows whose FIRST_SWITCHED or LAST_SWITCHED of 0
// is read as a value (ms): an hour, the longest active timeout of common
// exporters.
const maxZeroSpan = 3_600_000

// zeroSwitched returns the times of NetFlow's FIRST_SWITCHED and
// LAST_SWITCHED (sysUptime ms) when one of them is 0, in a message
// exported at export when the exporter's uptime was uptime (callers read
// the others with uptimeTime). 0 means "not measured" for most exporters,
// and read as a value it would place the flow at the exporter's boot, days
// or weeks before its other end: it is missing (the zero Time), unless the
// other value is within an hour on the right side of it. softflowd counts
// its uptime from its own start (and, reading a capture, has flows before
// it): a flow it saw from its first millisecond has FIRST 0 and a LAST a
// few ms later.
func zeroSwitched(export time.Time, uptime, first, last uint32) (start, end time.Time) {
	start, end = uptimeTime(export, uptime, first), uptimeTime(export, uptime, last)
	switch {
	case first == 0 && last != 0 && last <= maxZeroSpan:
		start = uptimeAt(export, uptime, 0)
	case last == 0 && first != 0 && -first <= maxZeroSpan:
		end = uptimeAt(export, uptime, 0)
	}
	return start, end
}
