package connstore

import (
	"fmt"
	"net/netip"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// family holds the addresses of one IP family for the tables below.
type family struct {
	name                          string
	client, server, vip, endpoint netip.Addr
	masq                          netip.Addr
}

var families = []family{
	{"ipv4", a("198.18.1.1"), a("198.18.2.2"), a("198.19.0.10"), a("198.18.3.3"), a("198.18.0.1")},
	{"ipv6", a("fd00:10:1::1"), a("fd00:10:2::2"), a("fd00:10:ff::10"), a("fd00:10:3::3"), a("fd00:10::1")},
}

func a(s string) netip.Addr { return netip.MustParseAddr(s) }

var t0 = time.Unix(1_780_000_000, 0)

func (f family) key(sport uint16) Key {
	return Key{Tuple: flow.Tuple{Src: f.client, Dst: f.server, Proto: flow.ProtoTCP, SrcPort: sport, DstPort: 8080}}
}

// conn is an observation of f.key(sport) with forward counters p packets /
// 100*p bytes and reverse counters p / 200*p.
func (f family) conn(sport uint16, id uint32, p uint64) Conn {
	k := f.key(sport)
	return Conn{Key: k, ID: id, DstAddr: k.Dst, DstPort: k.DstPort, Start: t0.Add(-time.Second),
		Packets: p, Bytes: 100 * p, ReversePackets: p, ReverseBytes: 200 * p, HasCounters: true, TCPState: "ESTABLISHED"}
}

// restarted is c as a new connection that started at start.
func restarted(c Conn, start time.Time) Conn {
	c.Start = start
	return c
}

func ended(c Conn, stop time.Time) Conn {
	c.Ended, c.Stop, c.TCPState = true, stop, "CLOSE"
	return c
}

// got is the part of a record the tables check.
type got struct {
	Reason              flow.EndReason
	SrcPort             uint16
	Packets, PacketsD   uint64
	BytesD, RevBytesD   uint64
	FlowEndAfterT0      time.Duration
	Service, Dst, SNAT  netip.Addr
	ServicePort, DstPrt uint16
}

func summarize(rs []flow.Record) []got {
	var out []got
	for _, r := range rs {
		out = append(out, got{r.EndReason, r.SrcPort, r.Packets, r.PacketsDelta, r.BytesDelta, r.ReverseBytesDelta,
			r.FlowEnd.Sub(t0), r.ServiceAddr, r.DstAddr, r.SNATAddr, r.ServicePort, r.DstPort})
	}
	return out
}

// want builds the expected summary of a plain (no NAT) record.
func (f family) want(reason flow.EndReason, sport uint16, total, d uint64, end time.Duration) got {
	return got{reason, sport, total, d, 100 * d, 200 * d, end, netip.Addr{}, f.server, netip.Addr{}, 0, 8080}
}

type step struct {
	at     time.Duration
	merge  []Conn
	sweep  bool // Sweep the family with since = at
	expire bool
	flush  bool
	want   []got
	len    *int // connections tracked after the step; nil: not checked
}

func n(i int) *int { return &i }

func TestStore(t *testing.T) {
	const (
		idle   = 15 * time.Second
		active = 60 * time.Second
	)
	for _, f := range families {
		for _, tc := range []struct {
			name  string
			steps []step
		}{
			{"nothing due before the timeouts", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}, len: n(1)},
				{at: 5 * time.Second, merge: []Conn{f.conn(1, 1, 20)}, expire: true, len: n(1)},
				{at: 19 * time.Second, merge: []Conn{f.conn(1, 1, 30)}, expire: true, len: n(1)},
			}},
			{"active timeout exports deltas since the last export", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}},
				{at: 10 * time.Second, merge: []Conn{f.conn(1, 1, 20)}},
				{at: 60 * time.Second, merge: []Conn{f.conn(1, 1, 25)}, expire: true,
					want: []got{f.want(flow.EndReasonActiveTimeout, 1, 25, 25, 60*time.Second)}},
				{at: 70 * time.Second, merge: []Conn{f.conn(1, 1, 31)}},
				{at: 120 * time.Second, merge: []Conn{f.conn(1, 1, 40)}, expire: true,
					want: []got{f.want(flow.EndReasonActiveTimeout, 1, 40, 15, 120*time.Second)}, len: n(1)},
			}},
			{"idle timeout once, then silent removal", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}},
				{at: 5 * time.Second, merge: []Conn{f.conn(1, 1, 12)}},
				{at: 20 * time.Second, merge: []Conn{f.conn(1, 1, 12)}, expire: true,
					want: []got{f.want(flow.EndReasonIdleTimeout, 1, 12, 12, 5*time.Second)}, len: n(1)},
				{at: 90 * time.Second, merge: []Conn{f.conn(1, 1, 12)}, expire: true, len: n(1)},
				{at: 95 * time.Second, sweep: true, expire: true, len: n(0)},
			}},
			{"idle connection that moves again is exported again", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}},
				{at: 16 * time.Second, expire: true, want: []got{f.want(flow.EndReasonIdleTimeout, 1, 10, 10, 0)}},
				{at: 30 * time.Second, merge: []Conn{f.conn(1, 1, 14)}, expire: true},
				{at: 46 * time.Second, expire: true, want: []got{f.want(flow.EndReasonIdleTimeout, 1, 14, 4, 30*time.Second)}},
			}},
			{"end event exports the rest and removes", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}},
				{at: 60 * time.Second, merge: []Conn{f.conn(1, 1, 20)}, expire: true,
					want: []got{f.want(flow.EndReasonActiveTimeout, 1, 20, 20, 60*time.Second)}},
				{at: 62 * time.Second, merge: []Conn{ended(f.conn(1, 1, 23), t0.Add(61*time.Second))}, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 23, 3, 61*time.Second)}, len: n(0)},
			}},
			{"short flow: one end-of-flow record with everything", []step{
				{at: time.Second, merge: []Conn{ended(f.conn(1, 1, 4), t0.Add(time.Second))}, len: n(1)},
				{at: 2 * time.Second, expire: true, want: []got{f.want(flow.EndReasonEndOfFlow, 1, 4, 4, time.Second)}, len: n(0)},
			}},
			{"stale dump after the end event keeps the final counters", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}},
				{at: 2 * time.Second, merge: []Conn{ended(f.conn(1, 1, 50), t0.Add(2*time.Second)), f.conn(1, 1, 40)}},
				{at: 3 * time.Second, expire: true, want: []got{f.want(flow.EndReasonEndOfFlow, 1, 50, 50, 2*time.Second)}},
			}},
			{"tuple reuse by conntrack id ends the old connection", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 100)}},
				{at: 5 * time.Second, merge: []Conn{f.conn(1, 2, 500)},
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 100, 100, 0)}, len: n(1)},
				{at: 65 * time.Second, merge: []Conn{f.conn(1, 2, 510)}, expire: true,
					want: []got{f.want(flow.EndReasonActiveTimeout, 1, 510, 510, 65*time.Second)}},
			}},
			{"tuple reuse without ids: counters going down", []step{
				{at: 0, merge: []Conn{f.conn(1, 0, 100)}},
				{at: 60 * time.Second, expire: true, want: []got{f.want(flow.EndReasonIdleTimeout, 1, 100, 100, 0)}},
				{at: 61 * time.Second, merge: []Conn{f.conn(1, 0, 100)}},
				{at: 62 * time.Second, merge: []Conn{f.conn(1, 0, 3)}, len: n(1)},
				{at: 80 * time.Second, expire: true, want: []got{f.want(flow.EndReasonIdleTimeout, 1, 3, 3, 62*time.Second)}},
			}},
			{"tuple reuse with moved counters exports the old rest", []step{
				{at: 0, merge: []Conn{f.conn(1, 0, 100)}},
				{at: 5 * time.Second, merge: []Conn{f.conn(1, 0, 120)}},
				{at: 6 * time.Second, merge: []Conn{f.conn(1, 0, 2)}, want: []got{f.want(flow.EndReasonEndOfFlow, 1, 120, 120, 5*time.Second)}},
			}},
			{"sweep ends connections missing from a dump", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10), f.conn(2, 2, 10)}},
				{at: 5 * time.Second, merge: []Conn{f.conn(2, 2, 11)}, sweep: true, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 10, 10, 0)}, len: n(1)},
			}},
			// Late observations of deleted connections (tombstones).
			{"swept, then late DESTROY", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}},
				{at: 5 * time.Second, sweep: true, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 10, 10, 0)}, len: n(0)},
				{at: 6 * time.Second, merge: []Conn{ended(f.conn(1, 1, 10), t0.Add(4*time.Second))}, expire: true, len: n(0)},
				{at: 7 * time.Second, sweep: true, expire: true, len: n(0)},
			}},
			{"swept, then late DESTROY with more traffic", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}},
				{at: 5 * time.Second, sweep: true, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 10, 10, 0)}, len: n(0)},
				{at: 6 * time.Second, merge: []Conn{ended(f.conn(1, 1, 12), t0.Add(4*time.Second))}, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 12, 2, 4*time.Second)}, len: n(0)},
				{at: 7 * time.Second, merge: []Conn{ended(f.conn(1, 1, 12), t0.Add(4*time.Second))}, expire: true, len: n(0)},
			}},
			{"swept, then late DESTROY, no conntrack id", []step{
				{at: 0, merge: []Conn{f.conn(1, 0, 10)}},
				{at: 5 * time.Second, sweep: true, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 10, 10, 0)}, len: n(0)},
				{at: 6 * time.Second, merge: []Conn{ended(f.conn(1, 0, 10), t0.Add(4*time.Second))}, expire: true, len: n(0)},
			}},
			{"skipped by a dump, then seen again", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}},
				{at: 5 * time.Second, sweep: true, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 10, 10, 0)}, len: n(0)},
				{at: 10 * time.Second, merge: []Conn{f.conn(1, 1, 14)}, sweep: true, expire: true, len: n(1)},
				{at: 11 * time.Second, merge: []Conn{ended(f.conn(1, 1, 15), t0.Add(11*time.Second))}, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 15, 5, 11*time.Second)}, len: n(0)},
			}},
			{"skipped by a dump, then seen again unchanged", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}},
				{at: 5 * time.Second, sweep: true, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 10, 10, 0)}, len: n(0)},
				{at: 10 * time.Second, merge: []Conn{f.conn(1, 1, 10)}, sweep: true, expire: true, len: n(1)},
				{at: 40 * time.Second, merge: []Conn{f.conn(1, 1, 10)}, sweep: true, expire: true, len: n(1)},
				{at: 41 * time.Second, merge: []Conn{ended(f.conn(1, 1, 10), t0.Add(41*time.Second))}, expire: true, len: n(0)},
			}},
			{"a new connection on a swept tuple is new", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}},
				{at: 5 * time.Second, sweep: true, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 10, 10, 0)}, len: n(0)},
				{at: 6 * time.Second, merge: []Conn{ended(f.conn(1, 2, 3), t0.Add(6*time.Second))}, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 3, 3, 6*time.Second)}, len: n(0)},
			}},
			{"late DESTROY after the tuple was reused", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10)}},
				{at: 5 * time.Second, merge: []Conn{f.conn(1, 2, 1)},
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 10, 10, 0)}, len: n(1)},
				{at: 6 * time.Second, merge: []Conn{ended(f.conn(1, 1, 12), t0.Add(5*time.Second))},
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 12, 2, 5*time.Second)}, len: n(1)},
				{at: 7 * time.Second, merge: []Conn{ended(f.conn(1, 1, 12), t0.Add(5*time.Second))}, expire: true, len: n(1)},
				{at: 8 * time.Second, merge: []Conn{ended(f.conn(1, 2, 2), t0.Add(8*time.Second))}, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 2, 2, 8*time.Second)}, len: n(0)},
			}},
			// The kernel recycles a TIME_WAIT entry for the same tuple
			// with the same conntrack id (destroy and new 15 µs apart):
			// the new start time tells the new connection apart, so the
			// old one is exported whole and the new one is its own.
			{"a recycled entry: same id, new start", []step{
				{at: 0, merge: []Conn{f.conn(1, 7, 10)}},
				{at: 5 * time.Second, merge: []Conn{restarted(f.conn(1, 7, 2), t0.Add(5*time.Second))},
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 10, 10, 0)}, len: n(1)},
				{at: 6 * time.Second, merge: []Conn{ended(restarted(f.conn(1, 7, 3), t0.Add(5*time.Second)), t0.Add(6*time.Second))}, expire: true,
					want: []got{f.want(flow.EndReasonEndOfFlow, 1, 3, 3, 6*time.Second)}, len: n(0)},
			}},
			{"flush forces out everything unexported", []step{
				{at: 0, merge: []Conn{f.conn(1, 1, 10), f.conn(2, 2, 10)}},
				{at: 16 * time.Second, merge: []Conn{f.conn(2, 2, 12)}, expire: true,
					want: []got{f.want(flow.EndReasonIdleTimeout, 1, 10, 10, 0)}},
				{at: 17 * time.Second, merge: []Conn{f.conn(2, 2, 13)}, flush: true,
					want: []got{f.want(flow.EndReasonForcedEnd, 2, 13, 13, 17*time.Second)}, len: n(0)},
			}},
		} {
			t.Run(f.name+"/"+tc.name, func(t *testing.T) {
				runSteps(t, newStore(t, Config{ActiveTimeout: active, IdleTimeout: idle, MaxConns: 100}), f, tc.steps)
			})
		}
	}
}

// newStore returns a store of cfg with the defaults of the fields it
// leaves unset (a tombstone TTL of 10s).
func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	cfg.SetDefaults()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func runSteps(t *testing.T, s *Store, f family, steps []step) {
	t.Helper()
	version := flow.Version(f.client)
	for i, st := range steps {
		now := t0.Add(st.at)
		out := s.Merge(st.merge, now, nil)
		if st.sweep {
			s.Sweep(version, now)
		}
		if st.expire {
			out = s.Expire(now, out)
		}
		if st.flush {
			out, _ = s.Flush(flow.EndReasonForcedEnd, out, nil)
		}
		if g := summarize(out); !reflect.DeepEqual(g, st.want) {
			t.Fatalf("step %d (t0+%v):\n got %+v\nwant %+v", i, st.at, g, st.want)
		}
		if st.len != nil && *st.len != s.Len() {
			t.Fatalf("step %d: %d connections tracked, want %d", i, s.Len(), *st.len)
		}
		for _, r := range out {
			if r.IPVersion != version {
				t.Fatalf("step %d: record IP version %d", i, r.IPVersion)
			}
		}
	}
}

func TestNAT(t *testing.T) {
	for _, f := range families {
		for _, tc := range []struct {
			name            string
			dst             netip.Addr
			dstPort         uint16
			snat            netip.Addr
			snatPort        uint16
			wantDst, wantSv netip.Addr
			wantSNAT        netip.Addr
		}{
			{"plain", f.server, 8080, f.client, 1, f.server, netip.Addr{}, netip.Addr{}},
			{"dnat", f.endpoint, 8443, f.client, 1, f.endpoint, f.server, netip.Addr{}},
			{"snat", f.server, 8080, f.masq, 61000, f.server, netip.Addr{}, f.masq},
			{"dnat+snat", f.endpoint, 8443, f.masq, 61000, f.endpoint, f.server, f.masq},
			{"dnat port only", f.server, 9000, f.client, 1, f.server, f.server, netip.Addr{}},
		} {
			t.Run(f.name+"/"+tc.name, func(t *testing.T) {
				s := newStore(t, Config{ActiveTimeout: time.Minute, IdleTimeout: time.Second, MaxConns: 10})
				c := f.conn(1, 1, 3)
				c.DstAddr, c.DstPort, c.SNATAddr, c.SNATPort = tc.dst, tc.dstPort, tc.snat, tc.snatPort
				s.Merge([]Conn{c}, t0, nil)
				out := s.Expire(t0.Add(2*time.Second), nil)
				if len(out) != 1 {
					t.Fatalf("%d records", len(out))
				}
				r := out[0]
				if r.DstAddr != tc.wantDst || r.ServiceAddr != tc.wantSv || r.SNATAddr != tc.wantSNAT {
					t.Errorf("dst %v service %v snat %v", r.DstAddr, r.ServiceAddr, r.SNATAddr)
				}
				if tc.wantSv.IsValid() && (r.ServicePort != 8080 || r.DstPort != tc.dstPort) {
					t.Errorf("service port %d dst port %d", r.ServicePort, r.DstPort)
				}
				if tc.wantSNAT.IsValid() && r.SNATPort != tc.snatPort {
					t.Errorf("snat port %d", r.SNATPort)
				}
				if r.SrcAddr != f.client || r.SrcPort != 1 || r.Zone != 0 || r.TCPState != "ESTABLISHED" {
					t.Errorf("record %+v", r)
				}
			})
		}
	}
}

// TestBounds fills the store and checks what happens past MaxConns.
func TestBounds(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			s := newStore(t, Config{ActiveTimeout: time.Minute, IdleTimeout: 15 * time.Second, MaxConns: 2})
			out := s.Merge([]Conn{f.conn(1, 1, 10), f.conn(2, 2, 10), f.conn(3, 3, 10)}, t0, nil)
			if g, w := summarize(out), []got{f.want(flow.EndReasonLackOfResources, 3, 10, 0, 0)}; !reflect.DeepEqual(g, w) {
				t.Fatalf("overflow record:\n got %+v\nwant %+v", g, w)
			}
			// The end of an untracked connection carries its whole life.
			out = s.Merge([]Conn{ended(f.conn(3, 3, 12), t0.Add(time.Second))}, t0.Add(time.Second), nil)
			if g, w := summarize(out), []got{f.want(flow.EndReasonLackOfResources, 3, 12, 12, time.Second)}; !reflect.DeepEqual(g, w) {
				t.Fatalf("overflow end record:\n got %+v\nwant %+v", g, w)
			}
			st := s.Stats()
			i := int(flow.Version(f.client) / 6)
			if s.Len() != 2 || st.Conns[i] != 2 || st.Overflow[i] != 2 {
				t.Fatalf("len %d stats %+v", s.Len(), st)
			}
			// Once a connection ends there is room again.
			s.Merge([]Conn{ended(f.conn(1, 1, 11), t0.Add(2*time.Second))}, t0.Add(2*time.Second), nil)
			if out := s.Expire(t0.Add(2*time.Second), nil); len(out) != 1 || out[0].EndReason != flow.EndReasonEndOfFlow {
				t.Fatalf("end: %+v", summarize(out))
			}
			if out := s.Merge([]Conn{f.conn(4, 4, 1)}, t0.Add(3*time.Second), nil); len(out) != 0 {
				t.Fatalf("after room was made: %+v", summarize(out))
			}
			if s.Len() != 2 {
				t.Fatalf("len %d", s.Len())
			}
		})
	}
}

// TestFamiliesIndependent checks Sweep only touches its own family.
func TestFamiliesIndependent(t *testing.T) {
	s := newStore(t, Config{ActiveTimeout: time.Minute, IdleTimeout: 15 * time.Second, MaxConns: 10})
	s.Merge([]Conn{families[0].conn(1, 1, 1), families[1].conn(1, 2, 1)}, t0, nil)
	if n := s.Sweep(6, t0.Add(time.Second)); n != 1 {
		t.Fatalf("swept %d", n)
	}
	out := s.Expire(t0.Add(time.Second), nil)
	if len(out) != 1 || out[0].IPVersion != 6 {
		t.Fatalf("expired %+v", out)
	}
	st := s.Stats()
	if st.Conns != [2]int{1, 0} || st.Swept != [2]uint64{0, 1} {
		t.Fatalf("stats %+v", st)
	}
}

func TestWithoutCounters(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			s := newStore(t, Config{ActiveTimeout: time.Minute, IdleTimeout: 15 * time.Second, MaxConns: 10})
			c := f.conn(1, 1, 0)
			c.HasCounters = false
			s.Merge([]Conn{c}, t0, nil)
			s.Merge([]Conn{c}, t0.Add(10*time.Second), nil)
			out := s.Expire(t0.Add(16*time.Second), nil)
			if len(out) != 1 || out[0].EndReason != flow.EndReasonIdleTimeout || out[0].FlowEnd != t0.Add(10*time.Second) {
				t.Fatalf("%+v", out)
			}
		})
	}
}

func TestDelta(t *testing.T) {
	for _, tc := range []struct{ cur, base, want uint64 }{
		{10, 4, 6}, {4, 4, 0}, {3, 4, 0}, {1 << 63, 0, 1 << 63},
	} {
		if got := delta(tc.cur, tc.base); got != tc.want {
			t.Errorf("delta(%d, %d) = %d, want %d", tc.cur, tc.base, got, tc.want)
		}
	}
}

func TestConfig(t *testing.T) {
	var c Config
	c.SetDefaults()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []Config{{ActiveTimeout: -1, IdleTimeout: 1, MaxConns: 1}, {ActiveTimeout: 1, IdleTimeout: 1, MaxConns: -1}} {
		if bad.Validate() == nil {
			t.Errorf("%+v: no error", bad)
		}
		if _, err := New(bad); err == nil {
			t.Errorf("New(%+v): no error", bad)
		}
	}
}

// benchConns returns n distinct connections, half IPv4, half IPv6.
func benchConns(n int) []Conn {
	conns := make([]Conn, n)
	for i := range conns {
		f := families[i%2]
		c := f.conn(uint16(i), uint32(i+1), 10)
		if f.name == "ipv4" {
			c.Key.Src = netip.AddrFrom4([4]byte{198, 18, byte(i >> 16), byte(i >> 8)})
		} else {
			b := f.client.As16()
			b[13], b[14], b[15] = byte(i>>16), byte(i>>8), byte(i)
			c.Key.Src = netip.AddrFrom16(b)
		}
		conns[i] = c
	}
	return conns
}

// BenchmarkMerge is the store's cost per connection of merging a poll: one
// op is one connection. "update" is the steady state (the connection is
// known and its counters moved), "insert" a poll of new connections.
func BenchmarkMerge(b *testing.B) {
	const n = 100_000
	conns := benchConns(n)
	b.Run("update", func(b *testing.B) {
		s := newStore(b, Config{ActiveTimeout: time.Minute, IdleTimeout: time.Minute, MaxConns: n})
		s.Merge(conns, t0, nil)
		b.ReportAllocs()
		b.ResetTimer()
		var out []flow.Record
		for i := 0; i < b.N; i += n {
			batch := conns[:min(n, b.N-i)]
			for j := range batch {
				batch[j].Packets++
			}
			out = s.Merge(batch, t0.Add(time.Duration(i)), out[:0])
		}
	})
	b.Run("insert", func(b *testing.B) {
		b.ReportAllocs()
		var s *Store
		for i := 0; i < b.N; i++ {
			if i%n == 0 {
				b.StopTimer()
				s = newStore(b, Config{ActiveTimeout: time.Minute, IdleTimeout: time.Minute, MaxConns: n})
				b.StartTimer()
			}
			s.Merge(conns[i%n:i%n+1], t0, nil)
		}
	})
}

// BenchmarkExpire is the cost per tracked connection of one Expire pass
// that exports every connection (active timeout).
func BenchmarkExpire(b *testing.B) {
	const n = 100_000
	conns := benchConns(n)
	s := newStore(b, Config{ActiveTimeout: time.Second, IdleTimeout: time.Hour, MaxConns: n})
	s.Merge(conns, t0, nil)
	out := make([]flow.Record, 0, n)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += n {
		out = s.Expire(t0.Add(time.Duration(i+1)*time.Second), out[:0])
	}
}

// BenchmarkMemoryPerConn reports the heap held per tracked connection.
func BenchmarkMemoryPerConn(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			conns := benchConns(n)
			b.ReportAllocs()
			var perConn float64
			for i := 0; i < b.N; i++ {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				s := newStore(b, Config{ActiveTimeout: time.Minute, IdleTimeout: time.Minute, MaxConns: n})
				s.Merge(conns, t0, nil)
				runtime.GC()
				runtime.ReadMemStats(&after)
				perConn = float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
				runtime.KeepAlive(s)
			}
			b.ReportMetric(perConn, "bytes/conn")
		})
	}
}

// TestTombstones checks the bounds of tombstones: they are counted, match
// only their own connection, are forgotten after TombstoneTTL, and past
// MaxTombstones the oldest go first.
func TestTombstones(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			i := int(flow.Version(f.client) / 6)
			s := newStore(t, Config{ActiveTimeout: time.Minute, IdleTimeout: 15 * time.Second, MaxConns: 10,
				TombstoneTTL: 10 * time.Second, MaxTombstones: 2})
			s.Merge([]Conn{f.conn(1, 1, 10), f.conn(2, 2, 10), f.conn(3, 3, 10)}, t0, nil)
			s.Sweep(flow.Version(f.client), t0.Add(time.Second))
			if out := s.Expire(t0.Add(time.Second), nil); len(out) != 3 {
				t.Fatalf("expired %d, want 3", len(out))
			}
			st := s.Stats()
			if st.Tombstones[i] != 2 || st.TombstonesEvicted[i] != 1 {
				t.Fatalf("after 3 deletions with room for 2: %+v", st)
			}
			// Which one was evicted is up to map order. The two kept drop
			// their late end events; the evicted one's is exported again.
			var kept, evicted []uint16
			for sport := uint16(1); sport <= 3; sport++ {
				if _, ok := s.tombs[f.key(sport)]; ok {
					kept = append(kept, sport)
				} else {
					evicted = append(evicted, sport)
				}
			}
			for _, sport := range kept {
				s.Merge([]Conn{ended(f.conn(sport, uint32(sport), 10), t0)}, t0.Add(2*time.Second), nil)
			}
			if out := s.Expire(t0.Add(2*time.Second), nil); len(out) != 0 || s.Stats().Late[i] != 2 {
				t.Fatalf("late end events of %v: exported %+v, stats %+v", kept, summarize(out), s.Stats())
			}
			s.Merge([]Conn{ended(f.conn(evicted[0], uint32(evicted[0]), 10), t0)}, t0.Add(3*time.Second), nil)
			if out := s.Expire(t0.Add(3*time.Second), nil); len(out) != 1 || out[0].PacketsDelta != 10 {
				t.Fatalf("late end event of evicted %v: %+v", evicted, summarize(out))
			}
			// After the TTL a late end event is a new connection.
			s.Expire(t0.Add(14*time.Second), nil)
			if st := s.Stats(); st.Tombstones[i] != 0 {
				t.Fatalf("after the TTL: %+v", st)
			}
			s.Merge([]Conn{ended(f.conn(kept[0], uint32(kept[0]), 10), t0)}, t0.Add(14*time.Second), nil)
			if out := s.Expire(t0.Add(14*time.Second), nil); len(out) != 1 || out[0].PacketsDelta != 10 {
				t.Fatalf("after the TTL: %+v", summarize(out))
			}
			s.Flush(flow.EndReasonForcedEnd, nil, nil)
			if st := s.Stats(); st.Tombstones != [2]int{} || len(s.tombs) != 0 || len(s.tombQ) != 0 {
				t.Fatalf("after Flush: %+v, %d tombs, queue %d", st, len(s.tombs), len(s.tombQ))
			}
		})
	}
}

// TestTombstoneQueueBounded reuses one tuple over and over: each reuse
// replaces the tuple's tombstone, and the queue of their expiries must not
// grow with the stale refs.
func TestTombstoneQueueBounded(t *testing.T) {
	f := families[1]
	s := newStore(t, Config{ActiveTimeout: time.Minute, IdleTimeout: 15 * time.Second, MaxConns: 10,
		TombstoneTTL: time.Hour, MaxTombstones: 4})
	for id := uint32(1); id <= 1000; id++ {
		s.Merge([]Conn{f.conn(1, id, 10)}, t0.Add(time.Duration(id)*time.Millisecond), nil)
	}
	if len(s.tombs) != 1 || len(s.tombQ)-s.tombHead > 2*4+1 {
		t.Fatalf("%d tombstones, queue %d", len(s.tombs), len(s.tombQ)-s.tombHead)
	}
}

// BenchmarkMemoryPerTombstone reports the heap held per tombstone (see
// DefaultMaxTombstones).
func BenchmarkMemoryPerTombstone(b *testing.B) {
	const n = 100_000
	conns := benchConns(n)
	b.ReportAllocs()
	var per float64
	for i := 0; i < b.N; i++ {
		s := newStore(b, Config{ActiveTimeout: time.Minute, IdleTimeout: time.Minute, MaxConns: n, MaxTombstones: n})
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		s.mu.Lock()
		for j := range conns {
			var e entry
			e.reset(&conns[j], 0)
			s.bury(conns[j].Key, &e, 0)
		}
		s.mu.Unlock()
		runtime.GC()
		runtime.ReadMemStats(&after)
		per = float64(after.HeapAlloc-before.HeapAlloc) / n
		runtime.KeepAlive(s)
	}
	b.ReportMetric(per, "bytes/tombstone")
}

// An exporter restart (a DaemonSet roll): the stopping store flushes and
// hands over its marks; the next store, resumed from them, finds in its
// first dump the same connections (TCP keeps a closed one in TIME_WAIT):
// the closed one, exported in full, is not exported again, even when
// conntrack destroys it; the live one exports only what it did since; a
// new connection on a reused tuple (another conntrack id) is new. Without
// the handover, each would be exported again in full.
func TestHandoverAcrossRestart(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			cfg := Config{}
			cfg.SetDefaults()
			cfg.IdleTimeout = 5 * time.Second
			closed := f.conn(1000, 11, 5)
			closed.TCPState = "TIME_WAIT"
			live := f.conn(1001, 12, 7)
			reused := f.conn(1002, 13, 3)

			old := newStore(t, cfg)
			old.Merge([]Conn{closed, live, reused}, t0, nil)
			recs := old.Expire(t0.Add(6*time.Second), nil) // all three idle: exported
			if len(recs) != 3 {
				t.Fatalf("the old run exported %d records, want 3", len(recs))
			}
			recs, marks := old.Flush(flow.EndReasonForcedEnd, nil, nil)
			if len(recs) != 0 || len(marks) != 3 {
				t.Fatalf("flush: %d records (want none: nothing unexported), %d marks (want 3)", len(recs), len(marks))
			}

			for _, resume := range []bool{true, false} {
				s := newStore(t, cfg)
				at := t0.Add(8 * time.Second)
				if resume {
					s.Resume(marks, at)
				}
				moved := f.conn(1001, 12, 9)                                     // 2 packets since
				newConn := restarted(f.conn(1002, 14, 1), t0.Add(7*time.Second)) // the tuple reused
				out := s.Merge([]Conn{closed, moved, newConn}, at, nil)
				out = s.Expire(at.Add(6*time.Second), out)
				out = append(out, s.Merge([]Conn{ended(closed, at.Add(10*time.Second))}, at.Add(10*time.Second), nil)...)
				var got []string
				for _, r := range out {
					got = append(got, fmt.Sprintf("%d:%s:+%d", r.SrcPort, r.EndReason, r.PacketsDelta))
				}
				sort.Strings(got)
				want := "1001:idle_timeout:+2 1002:idle_timeout:+1"
				if !resume {
					want = "1000:idle_timeout:+5 1001:idle_timeout:+9 1002:idle_timeout:+1"
				}
				if strings.Join(got, " ") != want {
					t.Errorf("resumed %v: records %v, want %s", resume, got, want)
				}
			}
		})
	}
}
