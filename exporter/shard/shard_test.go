package shard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dualflow/dualflow/exporter/ipfix"
	"github.com/dualflow/dualflow/flow"
)

// fakeSender stands for a member's IPFIX exporter: it keeps what it is
// given and is connected when the test says so.
type fakeSender struct {
	addr      string
	connected atomic.Bool
	running   atomic.Bool
	stopped   chan struct{}

	mu   sync.Mutex
	recs []flow.Record
}

func (f *fakeSender) Export(recs []flow.Record) {
	f.mu.Lock()
	f.recs = append(f.recs, recs...)
	f.mu.Unlock()
}

func (f *fakeSender) Flush() {}

func (f *fakeSender) Run(ctx context.Context) error {
	f.running.Store(true)
	<-ctx.Done()
	close(f.stopped)
	return nil
}

func (f *fakeSender) Stats() ipfix.Stats {
	f.mu.Lock()
	defer f.mu.Unlock()
	return ipfix.Stats{Connected: f.connected.Load(), Messages: uint64(len(f.recs)), Records: [2]uint64{uint64(len(f.recs))}}
}

func (f *fakeSender) take() []flow.Record {
	f.mu.Lock()
	defer f.mu.Unlock()
	r := f.recs
	f.recs = nil
	return r
}

// fakes builds the members of a test Sharder and keeps them by address.
type fakes struct {
	mu sync.Mutex
	m  map[string]*fakeSender
}

func (fs *fakes) new(c ipfix.Config) (sender, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if fs.m == nil {
		fs.m = map[string]*fakeSender{}
	}
	f := &fakeSender{addr: c.Address, stopped: make(chan struct{})}
	fs.m[c.Address] = f
	return f, nil
}

func (fs *fakes) get(addr string) *fakeSender {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.m[addr]
}

// clock is a settable clock for the health checks.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func testConfig(fs *fakes, c *clock) Config {
	cfg := Config{FailoverTimeout: 10 * time.Second, Logger: quiet, newSender: fs.new}
	if c != nil {
		cfg.now = c.now
	}
	return cfg
}

func newSharder(t testing.TB, cfg Config) *Sharder {
	t.Helper()
	cfg.SetDefaults()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// members are lab collector addresses of both families.
var members = []string{"198.18.0.11:4739", "198.18.0.12:4739", "[fd00:10::13]:4739", "[fd00:10::14]:4739", "198.18.0.15:4739",
	"[fd00:10::16]:4739"}

// keys returns n shard keys of distinct connections of family v (4, 6,
// or 0 for both).
func keys(v uint8, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		r := conn(v, i)
		out[i] = Key(&r)
	}
	return out
}

// conn is the source node's half of connection i of family v (0: even i
// IPv4, odd i IPv6).
func conn(v uint8, i int) flow.Record {
	if v == 0 {
		v = 4 + 2*uint8(i%2)
	}
	src, _ := connHalves(v, i)
	return src
}

// connHalves returns both halves of connection i: client pod i on node a
// (SNAT-ed to node a's address) to one of 7 server pods on node b.
func connHalves(v uint8, i int) (src, dst flow.Record) {
	client := netip.AddrFrom4([4]byte{198, 18, 1 + byte(i>>8%100), byte(i)})
	node := a("198.18.0.1")
	server := netip.AddrFrom4([4]byte{198, 18, 200, 1 + byte(i%7)})
	if v == 6 {
		client = netip.AddrFrom16([16]byte{0xfd, 0x00, 0x00, 0x10, 0, 1, 14: byte(i >> 8), 15: byte(i)})
		node = a("fd00:10::1")
		server = netip.AddrFrom16([16]byte{0xfd, 0x00, 0x00, 0x10, 0, 2, 15: 1 + byte(i%7)})
	}
	src, dst = halves(client, uint16(30000+i%20000), node, uint16(40000+i%20000), server, 8080, flow.ProtoTCP)
	for _, r := range []*flow.Record{&src, &dst} {
		r.IPVersion, r.BytesDelta = v, uint64(i)
		r.FlowStart, r.FlowEnd = t0, t0.Add(time.Second)
	}
	return src, dst
}

var t0 = time.UnixMilli(1_780_000_000_000)

func owners(s *Sharder, ks []uint64) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = s.Pick(k)
	}
	return out
}

// TestRendezvousMovement: adding or removing one of N members moves about
// 1/N of the keys, and only keys to or from that member.
func TestRendezvousMovement(t *testing.T) {
	const n = 100_000
	for _, v := range []uint8{4, 6, 0} {
		t.Run(fmt.Sprintf("ipv%d", v), func(t *testing.T) {
			ks := keys(v, n)
			s := newSharder(t, Config{Collectors: members[:5], FailoverTimeout: time.Second, Logger: quiet, newSender: (&fakes{}).new})
			before := owners(s, ks)
			share := map[string]int{}
			for _, o := range before {
				share[o]++
			}
			for _, m := range members[:5] {
				if c := share[m]; c < n/5*8/10 || c > n/5*12/10 {
					t.Errorf("%s owns %d of %d keys, want about %d", m, c, n, n/5)
				}
			}

			// Remove one: only its keys move, to the others.
			gone := members[2]
			if err := s.setMembers(slices.DeleteFunc(slices.Clone(members[:5]), func(m string) bool { return m == gone }), false); err != nil {
				t.Fatal(err)
			}
			after := owners(s, ks)
			moved := 0
			for i := range ks {
				if before[i] != after[i] {
					moved++
					if before[i] != gone {
						t.Fatalf("key %d moved from %s (still a member) to %s", i, before[i], after[i])
					}
				}
				if after[i] == gone {
					t.Fatalf("key %d still on the removed member", i)
				}
			}
			if moved != share[gone] {
				t.Errorf("removal moved %d keys, the removed member owned %d", moved, share[gone])
			}

			// Add one (to the five): only keys to it move, about 1/6.
			if err := s.setMembers(members[:6], false); err != nil {
				t.Fatal(err)
			}
			grown := owners(s, ks)
			moved = 0
			for i := range ks {
				if before[i] != grown[i] {
					moved++
					if grown[i] != members[5] {
						t.Fatalf("key %d moved from %s to %s, not to the new member", i, before[i], grown[i])
					}
				}
			}
			if moved < n/6*8/10 || moved > n/6*12/10 {
				t.Errorf("adding a sixth member moved %d of %d keys, want about %d", moved, n, n/6)
			}
		})
	}
}

// TestFailover: a disconnected member keeps its share until the failover
// timeout (its records wait in its buffer), then its share moves to each
// key's next-heaviest member, and returns when it is connected again.
func TestFailover(t *testing.T) {
	for _, v := range []uint8{4, 6, 0} {
		t.Run(fmt.Sprintf("ipv%d", v), func(t *testing.T) {
			fs, c := &fakes{}, &clock{t: t0}
			cfg := testConfig(fs, c)
			cfg.Collectors = members[:3]
			s := newSharder(t, cfg)
			for _, m := range members[:3] {
				fs.get(m).connected.Store(true)
			}
			s.check(c.now())
			const n = 3000
			ks := keys(v, n)
			before := owners(s, ks)
			down := members[1]
			survivors := []*member{s.all[0], s.all[2]}
			if s.all[1].name != down {
				t.Fatalf("members %v", memberList(s.all))
			}

			fs.get(down).connected.Store(false)
			c.t = c.t.Add(time.Second)
			s.check(c.now()) // noticed down
			c.t = c.t.Add(s.cfg.FailoverTimeout - time.Nanosecond)
			s.check(c.now()) // not yet past the timeout
			if got := owners(s, ks); !slices.Equal(got, before) {
				t.Fatal("routing changed before the failover timeout")
			}
			// Records of the down member's share wait in its buffer.
			recs := make([]flow.Record, n)
			for i := range recs {
				recs[i] = conn(v, i)
			}
			s.Export(recs)
			for _, m := range members[:3] {
				got := fs.get(m).take()
				for _, r := range got {
					if o := before[r.BytesDelta]; o != m {
						t.Fatalf("record %d went to %s, owner %s", r.BytesDelta, m, o)
					}
				}
				if len(got) == 0 {
					t.Fatalf("%s got nothing", m)
				}
			}

			c.t = c.t.Add(time.Nanosecond)
			s.check(c.now()) // past the timeout: failed over
			if f := s.failovers.Load(); f != 1 {
				t.Fatalf("%d failovers", f)
			}
			after := owners(s, ks)
			for i, k := range ks {
				switch {
				case before[i] != down && after[i] != before[i]:
					t.Fatalf("key %d of a live member moved from %s to %s", i, before[i], after[i])
				case before[i] == down && after[i] != pick(survivors, k).name:
					t.Fatalf("key %d of the down member went to %s, not its next-heaviest %s", i, after[i], pick(survivors, k).name)
				}
			}
			s.Export(recs)
			if got := fs.get(down).take(); len(got) != 0 {
				t.Fatalf("%d records routed to the failed-over member", len(got))
			}
			total := 0
			for _, m := range []string{members[0], members[2]} {
				total += len(fs.get(m).take())
			}
			if total != n {
				t.Fatalf("survivors got %d of %d records", total, n)
			}

			// Back: its share returns.
			fs.get(down).connected.Store(true)
			c.t = c.t.Add(time.Second)
			s.check(c.now())
			if got := owners(s, ks); !slices.Equal(got, before) {
				t.Fatal("the recovered member's share did not return")
			}
			if f := s.failovers.Load(); f != 1 {
				t.Fatalf("%d failovers", f)
			}
		})
	}
}

// TestFailoverAll: when every member is down past the timeout, records go
// to their owner among all members and wait in its buffer.
func TestFailoverAll(t *testing.T) {
	fs, c := &fakes{}, &clock{t: t0}
	cfg := testConfig(fs, c)
	cfg.Collectors = members[:3]
	s := newSharder(t, cfg)
	ks := keys(0, 1000)
	before := owners(s, ks)
	s.check(c.now()) // never connected: down since New
	c.t = c.t.Add(cfg.FailoverTimeout)
	s.check(c.now())
	if f := s.failovers.Load(); f != 3 {
		t.Fatalf("%d failovers, want 3", f)
	}
	if got := owners(s, ks); !slices.Equal(got, before) {
		t.Fatal("with every member down, routing is not the full set's")
	}
	fs.get(members[0]).connected.Store(true)
	s.check(c.now())
	for i, o := range owners(s, ks) {
		if o != members[0] {
			t.Fatalf("key %d on %s with only %s up", i, o, members[0])
		}
	}
}

// TestDNS re-resolves the collectors' name: new addresses become members
// at once, vanished ones stay until the failover timeout (see
// TestDNSGone) unless new ones came in the same answer (a replacement),
// and a failed or empty resolution keeps the last set.
func TestDNS(t *testing.T) {
	type answer struct {
		addrs []string
		err   error
	}
	for _, tc := range []struct {
		family  string
		answers []answer
		want    [][]string // members after each answer
		final   []string   // after the failover timeout
		errs    uint64
	}{
		{FamilyAny, []answer{
			{addrs: []string{"198.18.0.11", "fd00:10::12"}},
			{err: errors.New("SERVFAIL")},
			{},
			{addrs: []string{"198.18.0.11", "198.18.0.13", "::ffff:198.18.0.13"}},
		}, [][]string{
			{"198.18.0.11:4739", "[fd00:10::12]:4739"},
			{"198.18.0.11:4739", "[fd00:10::12]:4739"},
			{"198.18.0.11:4739", "[fd00:10::12]:4739"},
			// A new address while one vanishes: a replacement, the
			// vanished one goes at once.
			{"198.18.0.11:4739", "198.18.0.13:4739"},
		}, []string{"198.18.0.11:4739", "198.18.0.13:4739"}, 2},
		{FamilyIPv4, []answer{
			{addrs: []string{"198.18.0.11", "fd00:10::12"}},
			{addrs: []string{"fd00:10::12"}}, // nothing of the family: kept
		}, [][]string{{"198.18.0.11:4739"}, {"198.18.0.11:4739"}}, []string{"198.18.0.11:4739"}, 1},
		{FamilyIPv6, []answer{
			{addrs: []string{"198.18.0.11", "fd00:10::12", "fd00:10::13"}},
			{addrs: []string{"fd00:10::13"}},
		}, [][]string{{"[fd00:10::12]:4739", "[fd00:10::13]:4739"}, {"[fd00:10::12]:4739", "[fd00:10::13]:4739"}},
			[]string{"[fd00:10::13]:4739"}, 0},
	} {
		t.Run(tc.family, func(t *testing.T) {
			fs, c := &fakes{}, &clock{t: t0}
			var next atomic.Int32
			cfg := testConfig(fs, c)
			cfg.DNS, cfg.DNSFamily = "collector.dualflow.svc:4739", tc.family
			cfg.lookup = func(_ context.Context, network, host string) ([]netip.Addr, error) {
				if host != "collector.dualflow.svc" {
					t.Errorf("lookup of %q", host)
				}
				ans := tc.answers[min(int(next.Load()), len(tc.answers)-1)]
				var out []netip.Addr
				for _, s := range ans.addrs {
					out = append(out, a(s))
				}
				return out, ans.err
			}
			s := newSharder(t, cfg) // the first answer
			for i := range tc.answers {
				if i > 0 {
					next.Store(int32(i))
					s.resolve(context.Background())
				}
				if got := memberList(s.all); !slices.Equal(got, tc.want[i]) {
					t.Fatalf("after answer %d: members %v, want %v", i, got, tc.want[i])
				}
			}
			c.t = c.t.Add(cfg.FailoverTimeout)
			s.check(c.now())
			if got := memberList(s.all); !slices.Equal(got, tc.final) {
				t.Fatalf("after the failover timeout: members %v, want %v", got, tc.final)
			}
			if e := s.dnsErrors.Load(); e != tc.errs {
				t.Errorf("%d DNS errors, want %d", e, tc.errs)
			}
		})
	}
}

// TestDNSRun: Run resolves again every interval, starts new members and
// stops (and retires) removed ones after the failover timeout; records
// with no member yet are counted.
func TestDNSRun(t *testing.T) {
	fs := &fakes{}
	var mu sync.Mutex
	var answer []netip.Addr
	set := func(addrs ...string) {
		mu.Lock()
		defer mu.Unlock()
		answer = nil
		for _, s := range addrs {
			answer = append(answer, a(s))
		}
	}
	cfg := testConfig(fs, nil)
	cfg.DNS, cfg.DNSInterval = "collector.dualflow.svc:4739", 10*time.Millisecond
	cfg.FailoverTimeout = 100 * time.Millisecond // the fakes never connect
	cfg.lookup = func(context.Context, string, string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(answer), nil
	}
	s := newSharder(t, cfg)
	s.Export([]flow.Record{conn(4, 1), conn(6, 2)})
	if u := s.unrouted.Load(); u != 2 {
		t.Fatalf("%d unrouted records, want 2", u)
	}
	set("198.18.0.11", "fd00:10::12")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, "both members running", func() bool {
		f1, f2 := fs.get("198.18.0.11:4739"), fs.get("[fd00:10::12]:4739")
		return f1 != nil && f2 != nil && f1.running.Load() && f2.running.Load()
	})
	s.Export([]flow.Record{conn(4, 1), conn(6, 2)})
	set("fd00:10::12")
	waitFor(t, "the removed member stopped and retired", func() bool {
		select {
		case <-fs.get("198.18.0.11:4739").stopped:
		default:
			return false
		}
		s.statsMu.Lock()
		defer s.statsMu.Unlock()
		return len(s.leaving) == 0
	})
	if st := s.Stats(); st.Records[0] != 2 {
		t.Fatalf("records of present and retired members: %d, want 2", st.Records[0])
	}
}

// waitFor polls cond every few milliseconds until it holds, failing the
// test after a generous deadline.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	// Generous: a passing wait takes a second or two, but this 2-core
	// machine runs other tests beside it (it once took over 10s).
	const limit = time.Minute
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", limit, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestConfig(t *testing.T) {
	ok := func(c *Config) {}
	for _, tc := range []struct {
		name  string
		edit  func(c *Config)
		valid bool
	}{
		{"static", ok, true},
		{"static ipv6", func(c *Config) { c.Collectors = []string{"[fd00:10::1]:4739"} }, true},
		{"dns", func(c *Config) { c.Collectors, c.DNS = nil, "collector.dualflow.svc:4739" }, true},
		{"both", func(c *Config) { c.DNS = "collector.dualflow.svc:4739" }, false},
		{"neither", func(c *Config) { c.Collectors = nil }, false},
		{"no port", func(c *Config) { c.Collectors = []string{"198.18.0.1"} }, false},
		{"ipv6 unbracketed", func(c *Config) { c.Collectors = []string{"fd00:10::1:4739"} }, false},
		{"dns no port", func(c *Config) { c.Collectors, c.DNS = nil, "collector.dualflow.svc" }, false},
		{"dns family", func(c *Config) { c.Collectors, c.DNS, c.DNSFamily = nil, "c:4739", "ip5" }, false},
		{"failover timeout", func(c *Config) { c.FailoverTimeout = -time.Second }, false},
		{"ipfix", func(c *Config) { c.IPFIX.Transport = "sctp" }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Config{Collectors: []string{"198.18.0.1:4739"}}
			tc.edit(&c)
			c.SetDefaults()
			if err := c.Validate(); (err == nil) != tc.valid {
				t.Fatalf("Validate: %v, want valid %v", err, tc.valid)
			}
		})
	}
}

func TestMemberNames(t *testing.T) {
	got, err := memberNames([]string{" [fd00:10:0::1]:4739", "198.18.0.2:4739", "[::ffff:198.18.0.2]:4739", "", "Collector-A.svc:4739"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"198.18.0.2:4739", "[fd00:10::1]:4739", "collector-a.svc:4739"}
	if !slices.Equal(got, want) {
		t.Fatalf("%v, want %v", got, want)
	}
}

// TestExportAllocs: routing does not allocate.
func TestExportAllocs(t *testing.T) {
	s := newSharder(t, Config{Collectors: members[:3], Logger: quiet, newSender: func(ipfix.Config) (sender, error) { return nopSender{}, nil }})
	recs := make([]flow.Record, 64)
	for i := range recs {
		recs[i] = conn(0, i)
	}
	if n := testing.AllocsPerRun(100, func() { s.Export(recs) }); n != 0 {
		t.Fatalf("%v allocations per Export", n)
	}
}

// nopSender discards records: the benchmark measures routing alone.
type nopSender struct{}

func (nopSender) Export([]flow.Record)      {}
func (nopSender) Flush()                    {}
func (nopSender) Run(context.Context) error { return nil }
func (nopSender) Stats() ipfix.Stats        { return ipfix.Stats{} }

// BenchmarkSharderRoute routes batches of 64 records (both families) over
// 1 and 3 members: routing alone (nop members), and into real IPFIX
// exporters' buffers (encoding included; not running, so the buffers
// evict their oldest messages).
func BenchmarkSharderRoute(b *testing.B) {
	recs := make([]flow.Record, 64)
	for i := range recs {
		recs[i] = conn(0, i)
	}
	for _, bc := range []struct {
		name string
		n    int
		real bool
	}{{"nop/1", 1, false}, {"nop/3", 3, false}, {"nop/6", 6, false}, {"ipfix/1", 1, true}, {"ipfix/3", 3, true}} {
		b.Run(bc.name, func(b *testing.B) {
			cfg := Config{Collectors: members[:bc.n], Logger: quiet}
			if !bc.real {
				cfg.newSender = func(ipfix.Config) (sender, error) { return nopSender{}, nil }
			} else {
				cfg.IPFIX.BufferBytes = 1 << 20
			}
			s := newSharder(b, cfg)
			b.ReportAllocs()
			for b.Loop() {
				s.Export(recs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
		})
	}
}
