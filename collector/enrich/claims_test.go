package enrich

import (
	"testing"
	"time"
)

// idClaim is a claim value for the tests.
type idClaim string

func (c idClaim) claimID() string { return string(c) }

func TestResolve(t *testing.T) {
	s := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	old := claim[idClaim]{v: "old", from: s(-time.Hour), until: s(0)}
	cur := claim[idClaim]{v: "new", from: s(time.Minute), until: active}
	overlap := claim[idClaim]{v: "overlap", from: s(-10 * time.Minute), until: active}
	for _, tc := range []struct {
		name       string
		cs         []claim[idClaim]
		start, end time.Duration
		want       idClaim
	}{
		{"single active, inside", []claim[idClaim]{cur}, 2 * time.Minute, 2 * time.Minute, "new"},
		{"single active, just before from (skew)", []claim[idClaim]{cur}, time.Minute - time.Second, time.Minute - time.Second, "new"},
		{"single active, long before from", []claim[idClaim]{cur}, 0, 0, ""},
		{"single ended, inside", []claim[idClaim]{old}, -time.Minute, -time.Minute, "old"},
		{"single ended, just after (skew)", []claim[idClaim]{old}, 3 * time.Second, 3 * time.Second, "old"},
		{"single ended, long after", []claim[idClaim]{old}, time.Minute, time.Minute, ""},
		{"reuse: before the gap", []claim[idClaim]{cur, old}, -time.Second, -time.Second, "old"},
		{"reuse: after the gap", []claim[idClaim]{old, cur}, 2 * time.Minute, 2 * time.Minute, "new"},
		{"reuse: in the gap", []claim[idClaim]{old, cur}, 30 * time.Second, 30 * time.Second, ""},
		{"reuse: near the old end", []claim[idClaim]{old, cur}, 2 * time.Second, 2 * time.Second, "old"},
		{"reuse: near the new start", []claim[idClaim]{old, cur}, 58 * time.Second, 58 * time.Second, "new"},
		{"start in the gap, end covered", []claim[idClaim]{old, cur}, 30 * time.Second, 2 * time.Minute, "new"},
		{"overlap: the later claim wins", []claim[idClaim]{old, overlap}, -time.Minute, -time.Minute, "overlap"},
		{"overlap, other order", []claim[idClaim]{overlap, old}, -time.Minute, -time.Minute, "overlap"},
		{"overlap: before the later claim", []claim[idClaim]{overlap, old}, -20 * time.Minute, -20 * time.Minute, "old"},
		{"tie broken by id", []claim[idClaim]{{v: "b", from: s(0), until: active}, {v: "a", from: s(0), until: active}}, time.Minute, time.Minute, "a"},
		{"none", nil, 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l claims[idClaim]
			for _, c := range tc.cs {
				l.push(c)
			}
			got, ok := resolve(&l, s(tc.start), s(tc.end), nil)
			if got != tc.want || ok != (tc.want != "") {
				t.Errorf("resolve = %q, %v; want %q", got, ok, tc.want)
			}
		})
	}
}

func TestHistoryEndAndCollect(t *testing.T) {
	h := newHistory[string, idClaim]()
	ns := func(d time.Duration) int64 { return t0.Add(d).UnixNano() }
	h.add("198.18.0.1", "a", ns(0))
	h.add("fd00:10::1", "a", ns(0))
	h.add("198.18.0.1", "b", ns(0))
	h.end("198.18.0.1", "a", ns(time.Minute), ns(time.Minute), true)
	h.end("fd00:10::1", "a", ns(2*time.Minute), ns(2*time.Minute), true)
	h.end("fd00:10::1", "zzz", ns(2*time.Minute), ns(2*time.Minute), true) // no such claimant
	if h.retained != 2 || claimsOn(h, "198.18.0.1") != 2 {
		t.Fatalf("retained %d, claims %v", h.retained, h.m)
	}
	if !h.replace("198.18.0.1", "b") || h.replace("198.18.0.1", "a") {
		t.Error("replace must find b's active claim and not a's ended one")
	}
	if n := h.collect(ns(90 * time.Second)); n != 1 || claimsOn(h, "198.18.0.1") != 1 || h.retained != 1 {
		t.Errorf("collected %d: %v retained %d", n, h.m, h.retained)
	}
	if n := h.collect(ns(3 * time.Minute)); n != 1 || len(h.m) != 1 || h.retained != 0 {
		t.Errorf("collected %d: %v retained %d", n, h.m, h.retained)
	}
	// Without a grace period ended claims go at once.
	h.end("198.18.0.1", "b", ns(4*time.Minute), ns(4*time.Minute), false)
	if len(h.m) != 0 || h.retained != 0 {
		t.Errorf("after an immediate end: %v", h.m)
	}
}

func TestCollectInterval(t *testing.T) {
	for _, c := range []struct{ grace, want time.Duration }{
		{0, time.Second}, {5 * time.Second, time.Second}, {5 * time.Minute, 30 * time.Second}, {time.Hour, time.Minute},
	} {
		if got := collectInterval(c.grace); got != c.want {
			t.Errorf("collectInterval(%v) = %v, want %v", c.grace, got, c.want)
		}
	}
}

func claimsOn(h history[string, idClaim], k string) int {
	l := h.m[k]
	return l.n()
}

func TestClaimsList(t *testing.T) {
	var l claims[idClaim]
	for _, v := range []idClaim{"a", "b", "c", "d"} {
		l.push(claim[idClaim]{v: v})
	}
	l.remove(0) // b c d
	l.remove(1) // b d
	if l.n() != 2 || l.get(0).v != "b" || l.get(1).v != "d" {
		t.Errorf("after removals: %v %v", l.one, l.more)
	}
	l.remove(1)
	l.remove(0)
	if l.n() != 0 || l.more != nil {
		t.Errorf("not empty: %v %v", l.one, l.more)
	}
}
