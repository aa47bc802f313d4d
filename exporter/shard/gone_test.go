package shard

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dualflow/dualflow/exporter/ipfix"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/test/support/ipfixtest"
)

// dnsAnswer is a resolver whose answer the test sets.
type dnsAnswer struct {
	mu    sync.Mutex
	addrs []netip.Addr
}

// set makes the answer the addresses of members (host:port).
func (d *dnsAnswer) set(members ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.addrs = nil
	for _, m := range members {
		d.addrs = append(d.addrs, netip.MustParseAddrPort(m).Addr())
	}
}

func (d *dnsAnswer) lookup(context.Context, string, string) ([]netip.Addr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.addrs), nil
}

// runClock is a settable clock safe to read from Run's goroutine.
type runClock struct{ ns atomic.Int64 }

func newRunClock(t time.Time) *runClock {
	c := &runClock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *runClock) now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *runClock) add(d time.Duration) { c.ns.Add(int64(d)) }

// count is how many records f was given.
func (f *fakeSender) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.recs)
}

// memberNamesOf is s's members, read as Export would.
func memberNamesOf(s *Sharder) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return memberList(s.all)
}

// leavingCount is how many removed members are still draining.
func leavingCount(s *Sharder) int {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	return len(s.leaving)
}

// records (recordsFrom) are the source halves of connections 0..n-1
// (first..first+n-1) of family v.
func records(v uint8, n int) []flow.Record { return recordsFrom(v, 0, n) }

func recordsFrom(v uint8, first, n int) []flow.Record {
	out := make([]flow.Record, n)
	for i := range out {
		out[i] = conn(v, first+i)
	}
	return out
}

// memberStats is the counters of member name's exporter, if it is a
// member.
func memberStats(s *Sharder, name string) (ipfix.Stats, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, m := range s.all {
		if m.name == name {
			return m.snd.Stats(), true
		}
	}
	return ipfix.Stats{}, false
}

// TestDNSGoneAndBack: a collector that restarts (down, then out of the DNS
// answer) and is back in the answer within the failover timeout loses
// nothing: its share never moved, the records of its share waited in its
// own buffer (its exporter is not rebuilt), and nothing was retired.
func TestDNSGoneAndBack(t *testing.T) {
	fs, c, dns := &fakes{}, &clock{t: t0}, &dnsAnswer{}
	cfg := testConfig(fs, c)
	cfg.DNS, cfg.lookup = "collector.dualflow.svc:4739", dns.lookup
	dns.set(members[:3]...)
	s := newSharder(t, cfg)
	for _, m := range members[:3] {
		fs.get(m).connected.Store(true)
	}
	s.check(c.now())
	const n = 3000
	ks, recs := keys(0, n), records(0, n)
	before := owners(s, ks)
	gone := members[2]
	snd := fs.get(gone)
	share := 0
	for _, o := range before {
		if o == gone {
			share++
		}
	}
	if share == 0 {
		t.Fatal("the member owns no key")
	}

	snd.connected.Store(false)
	c.t = c.t.Add(time.Second)
	downAt := c.t
	s.check(c.now()) // noticed down
	c.t = c.t.Add(time.Second)
	dns.set(members[:2]...)
	s.resolve(context.Background()) // out of the answer
	if g := s.gone.Load(); g != 1 {
		t.Fatalf("%d members counted gone, want 1", g)
	}
	exported := 0
	for _, at := range []time.Duration{2 * time.Second, 5 * time.Second, cfg.FailoverTimeout - time.Nanosecond} {
		c.t = downAt.Add(at)
		s.resolve(context.Background()) // still out
		s.check(c.now())
		if got := memberNamesOf(s); !slices.Equal(got, members[:3]) {
			t.Fatalf("%v after it went down: members %v", at, got)
		}
		if got := owners(s, ks); !slices.Equal(got, before) {
			t.Fatalf("%v after it went down (failover timeout %v): routing changed", at, cfg.FailoverTimeout)
		}
		s.Export(recs)
		exported += share
	}

	// Back in the answer, then connected; later checks move nothing either.
	dns.set(members[:3]...)
	s.resolve(context.Background())
	snd.connected.Store(true)
	for range 3 {
		s.check(c.now())
		c.t = c.t.Add(cfg.FailoverTimeout)
	}
	if got := owners(s, ks); !slices.Equal(got, before) {
		t.Fatal("routing changed after it came back")
	}
	if fs.get(gone) != snd {
		t.Fatal("its exporter was rebuilt: its buffer was lost")
	}
	if g, f, l := s.gone.Load(), s.failovers.Load(), leavingCount(s); g != 0 || f != 0 || l != 0 {
		t.Fatalf("%d gone, %d failovers, %d retired members, want none", g, f, l)
	}
	got := snd.take()
	if len(got) != exported {
		t.Fatalf("its buffer holds %d records, want the %d of its share", len(got), exported)
	}
	for _, r := range got {
		if o := before[r.BytesDelta]; o != gone {
			t.Fatalf("record %d in its buffer belongs to %s", r.BytesDelta, o)
		}
	}
}

// TestDNSGonePastTimeout: a member out of the DNS answer keeps its share
// until the failover timeout has passed since it left or, if earlier,
// since it went down; then it is retired, its keys go to their
// next-heaviest survivor, and every record routed to it is still counted
// (retired members' counters stay in Stats).
func TestDNSGonePastTimeout(t *testing.T) {
	const timeout = 10 * time.Second
	const never = time.Duration(-1)
	for _, tc := range []struct {
		name                 string
		downAt, leftAt       time.Duration // from the start; never: stays connected
		wantRetired, wantMov time.Duration // retired at; share moved at
	}{
		{"connected", never, 0, timeout, timeout},
		{"down first", 0, 6 * time.Second, timeout, timeout},
		{"left first", 3 * time.Second, 0, timeout, timeout},
		{"down past the timeout", 0, timeout + time.Second, timeout + time.Second, timeout},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, c, dns := &fakes{}, &clock{t: t0}, &dnsAnswer{}
			cfg := testConfig(fs, c)
			cfg.DNS, cfg.lookup, cfg.FailoverTimeout = "collector.dualflow.svc:4739", dns.lookup, timeout
			dns.set(members[:3]...)
			s := newSharder(t, cfg)
			for _, m := range members[:3] {
				fs.get(m).connected.Store(true)
			}
			s.check(c.now())
			const n = 3000
			ks, recs := keys(0, n), records(0, n)
			before := owners(s, ks)
			gone, survivors := members[1], []*member{s.all[0], s.all[2]}
			snd := fs.get(gone)

			start := c.t.Add(time.Second)
			var at []time.Duration
			for _, d := range []time.Duration{0, tc.downAt, tc.leftAt, tc.wantMov - 1, tc.wantMov, tc.wantRetired - 1, tc.wantRetired} {
				if d >= 0 && !slices.Contains(at, d) {
					at = append(at, d)
				}
			}
			slices.Sort(at)
			exported := 0
			for _, d := range at {
				c.t = start.Add(d)
				if d == tc.downAt {
					snd.connected.Store(false)
				}
				if d == tc.leftAt {
					dns.set(members[0], members[2])
				}
				s.resolve(context.Background())
				s.check(c.now())

				if in := slices.Contains(memberNamesOf(s), gone); in != (d < tc.wantRetired) {
					t.Fatalf("at %v: member %v, want retired at %v", d, in, tc.wantRetired)
				}
				for i, o := range owners(s, ks) {
					want := before[i]
					if d >= tc.wantMov && want == gone {
						want = pick(survivors, ks[i]).name
					}
					if o != want {
						t.Fatalf("at %v: key %d on %s, want %s (share moves at %v)", d, i, o, want, tc.wantMov)
					}
				}
				had := snd.count()
				s.Export(recs)
				exported += n
				if got := snd.count() - had; (got > 0) != (d < tc.wantMov) {
					t.Fatalf("at %v: %d records routed to it (share moves at %v)", d, got, tc.wantMov)
				}
			}
			if g, l := s.gone.Load(), leavingCount(s); g != 0 || l != 0 {
				t.Fatalf("%d gone, %d retiring, want none", g, l)
			}
			wantFailovers := uint64(0)
			if tc.downAt != never && tc.downAt+timeout <= tc.wantRetired {
				wantFailovers = 1
			}
			if f := s.failovers.Load(); f != wantFailovers {
				t.Errorf("%d failovers, want %d", f, wantFailovers)
			}
			if st := s.Stats(); st.Records[0] != uint64(exported) {
				t.Fatalf("members present and retired account for %d records, %d exported", st.Records[0], exported)
			}
			if r := s.retired.Records[0]; r != uint64(snd.count()) || r == 0 {
				t.Fatalf("retired counters: %d records, the member got %d", r, snd.count())
			}
		})
	}
}

// TestDNSGoneRun runs a sharder with real IPFIX exporters and collectors
// (the health checks on a test clock, so the failover timeout elapses only
// when the test says). A collector restarts: it goes down, the exporter
// notices, it leaves the DNS answer, and records of its share are exported
// meanwhile. Back within the timeout, they are delivered to it and nothing
// moved; past the timeout, its share moves to the survivors and what was
// buffered for it, unreachable, is counted as dropped.
func TestDNSGoneRun(t *testing.T) {
	for _, back := range []bool{true, false} {
		name := "past the timeout"
		if back {
			name = "back within the timeout"
		}
		t.Run(name, func(t *testing.T) {
			var cols [3]*ipfixtest.Collector
			cols[0] = ipfixtest.Start(t, ipfixtest.Options{Address: "127.0.0.1:0"})
			_, port, _ := net.SplitHostPort(cols[0].Addr)
			addrs := []string{cols[0].Addr, net.JoinHostPort("127.0.0.2", port), net.JoinHostPort("127.0.0.3", port)}
			for i := 1; i < 3; i++ {
				cols[i] = ipfixtest.Start(t, ipfixtest.Options{Address: addrs[i]})
			}
			dns, clk := &dnsAnswer{}, newRunClock(t0)
			dns.set(addrs...)
			cfg := Config{DNS: net.JoinHostPort("collectors.test", port), DNSInterval: 10 * time.Millisecond,
				FailoverTimeout: 10 * time.Second, CheckInterval: 10 * time.Millisecond, Logger: quiet,
				now: clk.now, lookup: dns.lookup,
				IPFIX: ipfix.Config{ObservationDomainID: 1, FlushInterval: 20 * time.Millisecond,
					BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, DrainTimeout: 2 * time.Second}}
			s := newSharder(t, cfg)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				select {
				case err := <-done:
					if err != nil {
						t.Error(err)
					}
				case <-time.After(10 * time.Second):
					t.Error("Run did not return")
				}
			})
			waitFor(t, "connected to every collector", func() bool {
				return len(memberNamesOf(s)) == 3 && s.Stats().Connected
			})

			// Connections 0..n-1 are a first batch that every collector
			// gets; n..2n-1 the batch of the test; 2n..3n-1 the batch
			// after it.
			const n = 600
			ks, recs := keys(0, 2*n)[n:], recordsFrom(0, n, n)
			before := owners(s, ks) // before[id-n]
			gone := addrs[2]
			share := 0
			for _, o := range before {
				if o == gone {
					share++
				}
			}
			if share == 0 {
				t.Fatal("the collector owns no key")
			}
			// ids returns the ids from first on of the records the
			// collectors at idx got, checking each arrived once.
			ids := func(first int, idx ...int) map[int]string {
				out := map[int]string{}
				for _, i := range idx {
					for _, r := range cols[i].Records() {
						id := int(r.BytesDelta)
						if id < first {
							continue
						}
						if _, dup := out[id]; dup {
							t.Fatalf("record %d received twice", id)
						}
						out[id] = addrs[i]
					}
				}
				return out
			}
			// The first batch: every collector has received (and the test
			// has read) something before one is stopped.
			s.Export(records(0, n))
			waitFor(t, "the first batch delivered", func() bool {
				for i := range cols {
					if cols[i].Len() == 0 {
						return false
					}
				}
				return len(ids(0, 0, 1, 2)) == n
			})

			cols[2].Stop()
			waitFor(t, "the exporter noticed the collector down", func() bool {
				st, ok := memberStats(s, gone)
				return ok && !st.Connected
			})
			dns.set(addrs[:2]...)
			waitFor(t, "the collector out of the answer", func() bool { return s.gone.Load() == 1 })
			if got := owners(s, ks); !slices.Equal(got, before) {
				t.Fatal("its share moved when it left the answer")
			}
			s.Export(recs)
			waitFor(t, "its share buffered for it, the rest delivered", func() bool {
				st, _ := memberStats(s, gone)
				return st.BufferedRecords == share && len(ids(n, 0, 1)) == n-share
			})

			if back {
				cols[2] = ipfixtest.Start(t, ipfixtest.Options{Address: gone})
				dns.set(addrs...)
				waitFor(t, "its buffer delivered and the collector back in the answer", func() bool {
					return len(ids(n, 0, 1, 2)) == n && s.gone.Load() == 0
				})
				for id, at := range ids(n, 0, 1, 2) {
					if before[id-n] != at {
						t.Fatalf("record %d delivered to %s, owner %s", id, at, before[id-n])
					}
				}
				if got := owners(s, ks); !slices.Equal(got, before) {
					t.Fatal("routing changed")
				}
				if f := s.failovers.Load(); f != 0 {
					t.Fatalf("%d failovers", f)
				}
				if st := s.Stats(); st.DroppedBufferFull+st.DroppedShutdown+st.DroppedInvalid+st.DroppedOversize != 0 {
					t.Fatalf("drops: %+v", st)
				}
				return
			}

			clk.add(cfg.FailoverTimeout)
			waitFor(t, "the collector retired", func() bool {
				return slices.Equal(memberNamesOf(s), addrs[:2]) && leavingCount(s) == 0
			})
			st := s.Stats()
			if st.DroppedShutdown != uint64(share) || st.Records[0]+st.Records[1] != uint64(2*n-share) || st.BufferedRecords != 0 {
				t.Fatalf("%d of %d records routed to the retired collector: dropped %d, sent %d (want %d), buffered %d",
					share, n, st.DroppedShutdown, st.Records[0]+st.Records[1], 2*n-share, st.BufferedRecords)
			}
			if f := s.failovers.Load(); f != 1 {
				t.Fatalf("%d failovers, want 1 (it was down past the timeout)", f)
			}
			survivors := []*member{{name: addrs[0], seed: nameHash(addrs[0])}, {name: addrs[1], seed: nameHash(addrs[1])}}
			for i, o := range owners(s, ks) {
				want := before[i]
				if want == gone {
					want = pick(survivors, ks[i]).name
				}
				if o != want {
					t.Fatalf("key %d on %s, want %s", i, o, want)
				}
			}
			// New records of its share reach the survivors.
			s.Export(recordsFrom(0, 2*n, n))
			waitFor(t, "the next batch delivered to the survivors", func() bool { return len(ids(2*n, 0, 1)) == n })
		})
	}
}

// TestDNSReplacement: an answer that drops one address and brings a new
// one (a collector pod recreated under a new address) retires the dropped
// member at once: it will not come back there, and keeping its share
// would buffer records for nobody until the failover timeout.
func TestDNSReplacement(t *testing.T) {
	fs, c, dns := &fakes{}, &clock{t: t0}, &dnsAnswer{}
	cfg := testConfig(fs, c)
	cfg.DNS, cfg.lookup = "collector.dualflow.svc:4739", dns.lookup
	dns.set(members[:3]...)
	s := newSharder(t, cfg)
	dns.set(members[0], members[1], members[3])
	s.resolve(context.Background())
	if got, want := memberNamesOf(s), []string{members[0], members[1], members[3]}; !slices.Equal(got, want) {
		t.Fatalf("after the replacement: members %v, want %v", got, want)
	}
	for i, o := range owners(s, keys(0, 3000)) {
		if o == members[2] {
			t.Fatalf("key %d still routed to the replaced member", i)
		}
	}
	// An answer that only drops an address keeps the member for the
	// failover timeout (a collector restarting in place).
	dns.set(members[0], members[3])
	s.resolve(context.Background())
	if got := memberNamesOf(s); !slices.Contains(got, members[1]) {
		t.Fatalf("a member only dropped from the answer went at once: %v", got)
	}
}
