package ipfix

import (
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// dirTracker remembers, per directional tuple of one observation domain,
// which flowDirection's records are kept (DirectionAuto). It holds only the
// tuples of exporters that send flowDirection, at most dirTrackMax of them
// per domain; a tuple not seen for dirTrackIdle is forgotten.
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
	dirTrackMax  = 1 << 16
	dirTrackIdle = 10 * 60 // seconds
)

// keep reports whether the record r of direction dir is kept: a tuple's
// first direction is, the other (the same packets observed at the other
// end of the exporter) is not. Past dirTrackMax live tuples, records of
// new tuples are kept (counting them twice rather than losing them).
func (t *dirTracker) keep(r *flow.Record, dir int8, now time.Time) bool {
	sec := now.Unix()
	if t.m == nil {
		t.m = make(map[dirKey]dirEntry)
		t.lastSweep = sec
	}
	k := dirKey{src: r.SrcAddr, dst: r.DstAddr, sport: r.SrcPort, dport: r.DstPort, proto: r.Proto}
	if e, ok := t.m[k]; ok {
		t.m[k] = dirEntry{dir: e.dir, seen: sec}
		return e.dir == dir
	}
	if sec-t.lastSweep >= 60 || len(t.m) >= dirTrackMax {
		t.sweep(sec)
	}
	if len(t.m) < dirTrackMax {
		t.m[k] = dirEntry{dir: dir, seen: sec}
	}
	return true
}

func (t *dirTracker) sweep(sec int64) {
	t.lastSweep = sec
	for k, e := range t.m {
		if sec-e.seen > dirTrackIdle {
			delete(t.m, k)
		}
	}
}
