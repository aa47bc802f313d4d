package ipfix

import (
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// dirTracker remembers, per directional tuple of one observation domain,
// which flowDirection's records are kept (DirectionAuto). It holds only the
// tuples of exporters that send flowDirection: at most dirTrackMax per
// session, each charged dirTupleBytes to the listener's tuple budget
// (Limits.TupleBudget, its own: a full one never refuses a template), so a
// hostile exporter cannot grow it without bound; a tuple not seen for
// dirTrackIdle is forgotten by a sweep at most once a minute per domain (a
// full session does not sweep per record).
type dirTracker struct {
	m         map[dirKey]dirEntry
	lastSweep int64 // unix seconds
}

type dirKey struct {
	src, dst     netip.Addr
	sport, dport uint16
	proto        uint8
}

type dirEntry struct {
	dir  int8
	seen int64 // unix seconds
}

const (
	dirTrackMax   = 1 << 16
	dirTrackIdle  = 10 * 60 // seconds
	dirTupleBytes = 128     // a map entry: key, value and the map's overhead
)

// DefaultTupleBytesTotal bounds the tuples flowDirection auto tracks over
// every session of a listener: 64 MiB, 524,288 tuples.
const DefaultTupleBytesTotal = 64 << 20

// keep reports whether the record r of direction dir is kept: a tuple's
// first direction is, the other (the same packets observed at the other
// end of the exporter) is not. Past the session's or the budget's bound,
// records of new tuples are kept untracked (counting them twice rather than
// losing them); untracked reports that.
func (t *dirTracker) keep(r *flow.Record, dir int8, now time.Time, s *Session) (keep, untracked bool) {
	sec := now.Unix()
	if t.m == nil {
		t.m = make(map[dirKey]dirEntry)
		t.lastSweep = sec
	}
	k := dirKey{src: r.SrcAddr, dst: r.DstAddr, sport: r.SrcPort, dport: r.DstPort, proto: r.Proto}
	if e, ok := t.m[k]; ok {
		t.m[k] = dirEntry{dir: e.dir, seen: sec}
		return e.dir == dir, false
	}
	if sec-t.lastSweep >= 60 {
		t.sweep(sec, s)
	}
	if s.tuples >= dirTrackMax || !s.lim.TupleBudget.take(dirTupleBytes) {
		return true, true
	}
	t.m[k] = dirEntry{dir: dir, seen: sec}
	s.tuples++
	return true, false
}

func (t *dirTracker) sweep(sec int64, s *Session) {
	t.lastSweep = sec
	for k, e := range t.m {
		if sec-e.seen > dirTrackIdle {
			delete(t.m, k)
			s.tuples--
			s.lim.TupleBudget.give(dirTupleBytes)
		}
	}
}
