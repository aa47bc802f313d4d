package ratelog

import (
	"net/netip"
	"testing"
	"time"

	"github.com/dualflow/dualflow/test/support/logtest"
)

// TestLogLimiter: one line per kind and source per interval, the count of
// the held-back ones with the next, a bounded number of sources.
func TestLogLimiter(t *testing.T) {
	clock := time.Unix(1_800_000_000, 0)
	var logs logtest.Buffer
	l := New(logs.Logger(), time.Minute, 3)
	l.now = func() time.Time { return clock }
	a4, a6 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd00:10::1")
	type step struct {
		kind      string
		src       netip.Addr
		advance   time.Duration
		ok        bool
		suppessed int
	}
	for i, s := range []step{
		{"bad", a4, 0, true, 0},
		{"bad", a4, time.Second, false, 0},
		{"bad", a4, time.Second, false, 0},
		{"bad", a6, 0, true, 0},           // another source
		{"slow", a4, 0, true, 0},          // another kind
		{"bad", a4, time.Minute, true, 2}, // the interval is over: 2 held back
		{"bad", a4, 0, false, 0},
		// The bound (3 sources): a fourth one makes room by forgetting
		// those whose interval is over; what they held back comes with the
		// next line of their kind.
		{"bad", netip.MustParseAddr("198.18.0.4"), time.Minute, true, 1},
		{"bad", netip.MustParseAddr("198.18.0.5"), 0, true, 0},
		// Nothing to forget: further sources share one slot per kind.
		{"bad", netip.MustParseAddr("198.18.0.6"), 0, true, 0},
		{"bad", netip.MustParseAddr("198.18.0.7"), 0, false, 0},
		{"bad", netip.MustParseAddr("198.18.0.6"), 0, false, 0},
		{"bad", netip.MustParseAddr("198.18.0.8"), time.Minute, true, 2},
	} {
		clock = clock.Add(s.advance)
		ok, n := l.Allow(s.kind, s.src)
		if ok != s.ok || n != s.suppessed {
			t.Errorf("step %d (%s %v): allow = %v, %d; want %v, %d", i, s.kind, s.src, ok, n, s.ok, s.suppessed)
		}
	}
	if len(l.m) > 3+2 { // the bound, plus one shared slot per kind
		t.Errorf("%d slots", len(l.m))
	}
}
