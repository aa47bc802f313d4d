package traceflow

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/traceflow/packet"
	"github.com/dualflow/dualflow/traceflow/ratelimit"
)

// clusterResolver resolves like fakeResolver, places the source pod on
// node (default node-1), resolves an IP destination to itself, and knows
// the cluster's addresses (InCluster).
type clusterResolver struct {
	node    map[string]string // source pod -> node
	cluster map[netip.Addr]bool
}

func (r clusterResolver) WorkloadPod(ref string) (string, bool, error) {
	return fakeResolver{}.WorkloadPod(ref)
}

func (r clusterResolver) Resolve(req Request, fam Family) (Probe, error) {
	p, err := fakeResolver{}.Resolve(req, fam)
	if err != nil {
		return p, err
	}
	p.SourceNode = "node-1"
	if n, ok := r.node[req.Source]; ok {
		p.SourceNode = n
	}
	if a := req.Destination.IP; a.IsValid() {
		if a.Is4() != (fam == IPv4) {
			return p, ErrNoAddress
		}
		p.Dst = a
	}
	return p, nil
}

func (r clusterResolver) InCluster(a netip.Addr) bool { return r.cluster[a] }

func asCaller(name string) context.Context { return WithCaller(context.Background(), name) }

// TestControllerProbeShape: a request for a probe a trace does not need
// is refused: TCP flags other than SYN, a TTL or hop limit below MinTTL.
func TestControllerProbeShape(t *testing.T) {
	c := New(Config{}, &fakeTracer{trace: delivered}, fakeResolver{}, nil)
	defer c.Close()
	for _, tc := range []struct {
		name   string
		family Family
		edit   func(*Request)
		ok     bool
	}{
		{"syn", IPv4, func(r *Request) { r.TCPFlags = packet.SYN }, true},
		{"syn v6", IPv6, func(r *Request) { r.TCPFlags = packet.SYN }, true},
		{"default flags", IPv6, func(r *Request) {}, true},
		{"rst", IPv4, func(r *Request) { r.TCPFlags = packet.RST }, false},
		{"rst v6", IPv6, func(r *Request) { r.TCPFlags = packet.RST }, false},
		{"syn-ack", IPv4, func(r *Request) { r.TCPFlags = packet.SYN | packet.ACK }, false},
		{"fin", IPv6, func(r *Request) { r.TCPFlags = packet.FIN }, false},
		{"syn-rst", IPv4, func(r *Request) { r.TCPFlags = packet.SYN | packet.RST }, false},
		{"ttl 1", IPv4, func(r *Request) { r.TTL = 1 }, false},
		{"hop limit 1", IPv6, func(r *Request) { r.TTL = 1 }, false},
		{"ttl below the floor", IPv4, func(r *Request) { r.TTL = MinTTL - 1 }, false},
		{"ttl at the floor", IPv6, func(r *Request) { r.TTL = MinTTL }, true},
		{"ttl 64", IPv4, func(r *Request) { r.TTL = 64 }, true},
		{"ttl 255", IPv6, func(r *Request) { r.TTL = 255 }, true},
		{"udp", IPv4, func(r *Request) { r.Protocol = UDP }, true},
		{"echo", IPv6, func(r *Request) { r.Protocol = ICMPv6 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := req()
			r.Family = tc.family
			tc.edit(&r)
			res, err := c.Trace(context.Background(), r)
			switch {
			case tc.ok && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.ok && res.Phase != Succeeded:
				t.Fatalf("phase %s %s", res.Phase, res.Reason)
			case !tc.ok && !errors.Is(err, ErrInvalid):
				t.Fatalf("err %v, want ErrInvalid", err)
			}
		})
	}
}

// TestProbeSendable: what an agent sends is a SYN, a UDP datagram or an
// echo request of the probe's family, with a TTL of 0 (64) or at least
// MinTTL, to a unicast address, with a tag.
func TestProbeSendable(t *testing.T) {
	syn := func(src, dst string) Probe {
		return Probe{Src: netip.MustParseAddr(src), Dst: netip.MustParseAddr(dst), Protocol: TCP, SrcPort: 40000, DstPort: 8080, TCPFlags: packet.SYN, Tag: 5}
	}
	v4 := func() Probe { return syn("198.18.1.10", "198.18.2.11") }
	v6 := func() Probe { return syn("fd00:10:0:1::10", "fd00:10:0:2::11") }
	with := func(p Probe, edit func(*Probe)) Probe { edit(&p); return p }
	for _, tc := range []struct {
		name string
		p    Probe
		ok   bool
	}{
		{"syn v4", v4(), true},
		{"syn v6", v6(), true},
		{"ttl 64 v4", with(v4(), func(p *Probe) { p.TTL = 64 }), true},
		{"hop limit 255 v6", with(v6(), func(p *Probe) { p.TTL = 255 }), true},
		{"rst v4", with(v4(), func(p *Probe) { p.TCPFlags = packet.RST }), false},
		{"rst v6", with(v6(), func(p *Probe) { p.TCPFlags = packet.RST }), false},
		{"syn-ack v4", with(v4(), func(p *Probe) { p.TCPFlags = packet.SYN | packet.ACK }), false},
		{"no flags v6", with(v6(), func(p *Probe) { p.TCPFlags = 0 }), false},
		{"fin-psh-urg v4", with(v4(), func(p *Probe) { p.TCPFlags = packet.FIN | packet.PSH | packet.URG }), false},
		{"ttl 1 v4", with(v4(), func(p *Probe) { p.TTL = 1 }), false},
		{"hop limit 2 v6", with(v6(), func(p *Probe) { p.TTL = 2 }), false},
		{"udp v4", with(v4(), func(p *Probe) { p.Protocol, p.TCPFlags = UDP, 0 }), true},
		{"udp with flags v6", with(v6(), func(p *Probe) { p.Protocol = UDP }), false},
		{"echo v4", with(v4(), func(p *Probe) { p.Protocol, p.TCPFlags, p.DstPort = ICMP, 0, 0 }), true},
		{"echo v6", with(v6(), func(p *Probe) { p.Protocol, p.TCPFlags, p.DstPort = ICMPv6, 0, 0 }), true},
		{"icmpv6 over v4", with(v4(), func(p *Probe) { p.Protocol, p.TCPFlags, p.DstPort = ICMPv6, 0, 0 }), false},
		{"icmp over v6", with(v6(), func(p *Probe) { p.Protocol, p.TCPFlags, p.DstPort = ICMP, 0, 0 }), false},
		{"sctp v4", with(v4(), func(p *Probe) { p.Protocol, p.TCPFlags = "SCTP", 0 }), false},
		{"tcp without port v6", with(v6(), func(p *Probe) { p.DstPort = 0 }), false},
		{"no tag v4", with(v4(), func(p *Probe) { p.Tag = 0 }), false},
		{"tag 64 v6", with(v6(), func(p *Probe) { p.Tag = 64 }), false},
		{"families differ", syn("198.18.1.10", "fd00:10:0:2::11"), false},
		{"mapped v4 is v4", syn("::ffff:198.18.1.10", "198.18.2.11"), true},
		{"multicast v4", syn("198.18.1.10", "224.0.0.1"), false},
		{"multicast v6", syn("fd00:10:0:1::10", "ff02::1"), false},
		{"broadcast v4", syn("198.18.1.10", "255.255.255.255"), false},
		{"unspecified v4", syn("198.18.1.10", "0.0.0.0"), false},
		{"unspecified v6", syn("fd00:10:0:1::10", "::"), false},
		{"loopback v4", syn("198.18.1.10", "127.0.0.1"), false},
		{"loopback v6", syn("fd00:10:0:1::10", "::1"), false},
		{"multicast source v6", syn("ff02::1", "fd00:10:0:2::11"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.p.Sendable()
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrInvalid)) {
				t.Errorf("Sendable(%+v) = %v, want ok %v", tc.p, err, tc.ok)
			}
		})
	}
}

// TestControllerExternalDestinations: an IP destination that no pod,
// Service or node of the cluster has is traced only when the request asks
// (External) and the collector allows it (Config.AllowExternal).
func TestControllerExternalDestinations(t *testing.T) {
	inCluster := map[netip.Addr]bool{netip.MustParseAddr("198.18.2.11"): true, netip.MustParseAddr("fd00:10:0:2::11"): true,
		netip.MustParseAddr("198.18.100.5"): true, netip.MustParseAddr("fd00:10:100::5"): true}
	for _, tc := range []struct {
		name     string
		dst      string
		external bool
		allow    bool
		ok       bool
	}{
		{"pod v4", "198.18.2.11", false, false, true},
		{"pod v6", "fd00:10:0:2::11", false, false, true},
		{"service v4", "198.18.100.5", false, false, true},
		{"service v6", "fd00:10:100::5", false, false, true},
		{"external v4", "198.19.0.99", false, false, false},
		{"external v6", "fd00:10:ffff::99", false, false, false},
		{"external v4 asked, not allowed", "198.19.0.99", true, false, false},
		{"external v6 asked, not allowed", "fd00:10:ffff::99", true, false, false},
		{"external v4 allowed, not asked", "198.19.0.99", false, true, false},
		{"external v6 allowed, not asked", "fd00:10:ffff::99", false, true, false},
		{"external v4 asked and allowed", "198.19.0.99", true, true, true},
		{"external v6 asked and allowed", "fd00:10:ffff::99", true, true, true},
		{"mapped pod v4", "::ffff:198.18.2.11", false, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(Config{AllowExternal: tc.allow}, &fakeTracer{trace: delivered}, clusterResolver{cluster: inCluster}, nil)
			defer c.Close()
			a := netip.MustParseAddr(tc.dst).Unmap()
			fam := IPv4
			if a.Is6() {
				fam = IPv6
			}
			r := Request{Source: "frontend/web-1", Destination: Destination{IP: a, Port: 8080}, Family: fam, External: tc.external}
			res, err := c.Trace(context.Background(), r)
			switch {
			case tc.ok && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.ok && (res.Phase != Succeeded || res.Families[0].Dst != a):
				t.Fatalf("result %+v", res)
			case !tc.ok && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "outside the cluster")):
				t.Fatalf("err %v, want ErrInvalid saying the destination is outside the cluster", err)
			}
		})
	}
	// A resolver that cannot tell (no InCluster): only pods count.
	c := New(Config{}, &fakeTracer{trace: delivered}, clusterResolver{}, nil)
	defer c.Close()
	if _, err := c.Trace(context.Background(), Request{Source: "frontend/web-1", Destination: Destination{IP: netip.MustParseAddr("198.18.2.11"), Port: 80}, Family: IPv4}); !errors.Is(err, ErrInvalid) {
		t.Errorf("unknown address with a resolver that knows none: %v", err)
	}
	// Pods and Services by name are in the cluster.
	if _, err := c.Trace(context.Background(), req()); err != nil {
		t.Errorf("service by name: %v", err)
	}
}

// TestControllerRateLimits: Start refuses a caller, or a source node,
// beyond its rate with a RateLimitError saying when to come back, and
// takes nothing then; callers and nodes have their own buckets.
func TestControllerRateLimits(t *testing.T) {
	r := clusterResolver{node: map[string]string{"frontend/web-1": "node-1", "frontend/web-2": "node-2", "frontend/web-3": "node-1"}}
	c := New(Config{CallerLimit: ratelimit.Limit{Rate: 1, Burst: 4}, NodeLimit: ratelimit.Limit{Rate: 1, Burst: 6}},
		&fakeTracer{trace: delivered}, r, nil)
	defer c.Close()
	start := func(caller, src string, fam Family) error {
		rq := req()
		rq.Source, rq.Family = src, fam
		_, err := c.Start(asCaller(caller), rq)
		return err
	}
	for i := range 2 { // 2 dual traces: alice's burst of 4 family traces
		if err := start("alice", "frontend/web-1", Dual); err != nil {
			t.Fatalf("alice %d: %v", i, err)
		}
	}
	err := start("alice", "frontend/web-2", IPv6)
	var rl *RateLimitError
	if !errors.As(err, &rl) || !errors.Is(err, ErrRateLimited) || rl.RetryAfter <= 0 || rl.RetryAfter > time.Second {
		t.Fatalf("alice beyond her burst: %v, want a RateLimitError within 1s", err)
	}
	if !strings.Contains(err.Error(), "caller alice") {
		t.Errorf("message %q", err)
	}
	// bob has his own bucket; node-1 has 2 family traces left of 6.
	if err := start("bob", "frontend/web-3", Dual); err != nil {
		t.Fatalf("bob: %v", err)
	}
	err = start("bob", "frontend/web-1", IPv4)
	if !errors.As(err, &rl) || !strings.Contains(err.Error(), "node node-1") {
		t.Fatalf("node-1 beyond its burst: %v", err)
	}
	// The refusal took none of bob's tokens: 2 left, for node-2.
	if err := start("bob", "frontend/web-2", Dual); err != nil {
		t.Fatalf("bob on node-2: %v", err)
	}
	// Unnamed callers share one bucket.
	for i := range 2 {
		if _, err := c.Start(context.Background(), Request{Source: "frontend/web-2", Destination: Destination{Pod: "backend/api-1", Port: 80}}); err != nil && i == 0 {
			t.Fatalf("unnamed caller: %v", err)
		}
	}
}

// TestControllerTraceWaitsForItsRate: Trace (the UI's blocking call)
// waits for the caller's tokens instead of failing, as long as its
// context allows.
func TestControllerTraceWaitsForItsRate(t *testing.T) {
	c := New(Config{CallerLimit: ratelimit.Limit{Rate: 20, Burst: 2}}, &fakeTracer{trace: delivered}, clusterResolver{}, nil)
	defer c.Close()
	start := time.Now()
	for i := range 3 {
		if _, err := c.Trace(asCaller("ui"), req()); err != nil {
			t.Fatalf("trace %d: %v", i, err)
		}
	}
	if took := time.Since(start); took < 80*time.Millisecond {
		t.Errorf("3 dual traces at 20/s after a burst of 2 took %v, want about 200ms", took)
	}
	// A context too short for the wait fails at once with the limit.
	ctx, cancel := context.WithTimeout(asCaller("ui"), 10*time.Millisecond)
	defer cancel()
	c.Trace(ctx, req())
	if _, err := c.Trace(ctx, req()); !errors.Is(err, ErrRateLimited) && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("short context: %v", err)
	}
}

// TestControllerDefaultLimitsAllowNormalUse: with the default limits, what
// a user does by hand or through the UI is never refused: a dual trace
// after another, a dozen family traces at once (the e2e
// concurrent-traces-apart), the dual traces of a few reachability cells.
func TestControllerDefaultLimitsAllowNormalUse(t *testing.T) {
	c := New(Config{}, &fakeTracer{trace: delivered}, clusterResolver{}, nil)
	defer c.Close()
	ctx := asCaller("alice")
	for i := range 5 {
		if _, err := c.Start(ctx, req()); err != nil {
			t.Fatalf("dual trace %d: %v", i, err)
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Go(func() {
			if _, err := c.Start(asCaller("bob"), req()); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent dual trace: %v", err)
	}
	for i := range 4 {
		if _, err := c.Trace(asCaller("ui"), req()); err != nil {
			t.Fatalf("UI cell %d: %v", i, err)
		}
	}
}

// TestControllerKeepPerCaller: each caller's finished traces are kept up
// to KeepPerCaller, its oldest forgotten first; one caller cannot push out
// another's.
func TestControllerKeepPerCaller(t *testing.T) {
	c := New(Config{Keep: 100, KeepPerCaller: 3, CallerLimit: ratelimit.Limit{Rate: -1}, NodeLimit: ratelimit.Limit{Rate: -1}},
		&fakeTracer{trace: delivered}, clusterResolver{}, nil)
	defer c.Close()
	trace := func(caller string) string {
		res, err := c.Trace(asCaller(caller), req())
		if err != nil {
			t.Fatal(err)
		}
		return res.ID
	}
	bob := trace("bob")
	var alice []string
	for range 10 {
		alice = append(alice, trace("alice"))
	}
	for i, id := range alice {
		_, err := c.Get(context.Background(), id)
		if kept := i >= len(alice)-3; kept != (err == nil) {
			t.Errorf("alice's trace %d: %v, kept %v", i, err, kept)
		}
	}
	if _, err := c.Get(context.Background(), bob); err != nil {
		t.Errorf("bob's trace pushed out by alice's: %v", err)
	}
	c.mu.Lock()
	n := len(c.traces)
	c.mu.Unlock()
	if n != 4 {
		t.Errorf("%d traces kept, want 4", n)
	}
	// Keep still bounds them all, whoever they are.
	c2 := New(Config{Keep: 3, CallerLimit: ratelimit.Limit{Rate: -1}, NodeLimit: ratelimit.Limit{Rate: -1}}, &fakeTracer{trace: delivered}, clusterResolver{}, nil)
	defer c2.Close()
	var ids []string
	for i := range 5 {
		res, err := c2.Trace(asCaller(strconv.Itoa(i)), req())
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, res.ID)
	}
	for i, id := range ids {
		if _, err := c2.Get(context.Background(), id); (err == nil) != (i >= 2) {
			t.Errorf("caller %d's trace: %v", i, err)
		}
	}
	c2.mu.Lock()
	if len(c2.traces) != 3 || len(c2.done) != 3 || len(c2.byCaller) != 3 {
		t.Errorf("kept %d traces, %d done, %d callers; want 3 each", len(c2.traces), len(c2.done), len(c2.byCaller))
	}
	c2.mu.Unlock()
}

// TestStartRateLimited: Start refuses a caller beyond its rate with a
// RateLimitError saying when to retry (web/api answers it 429 with
// Retry-After), callers have their own buckets, and too many traces in
// flight is ErrBusy.
func TestStartRateLimited(t *testing.T) {
	c := New(Config{CallerLimit: ratelimit.Limit{Rate: 0.5, Burst: 2}, NodeLimit: ratelimit.Limit{Rate: -1}}, &fakeTracer{trace: delivered}, clusterResolver{}, nil)
	defer c.Close()
	rq := Request{Source: "frontend/web-1", Destination: Destination{Service: "backend/api", Port: 80}, Family: Dual}
	start := func(c *Controller, caller string) error {
		_, err := c.Start(WithCaller(context.Background(), caller), rq)
		return err
	}
	if err := start(c, "alice"); err != nil {
		t.Fatalf("first: %v", err)
	}
	var rl *RateLimitError
	if err := start(c, "alice"); !errors.As(err, &rl) {
		t.Fatalf("second: %v, want a RateLimitError", err)
	}
	if s := ratelimit.RetryAfterSeconds(rl.RetryAfter); s < 1 || s > 4 {
		t.Errorf("retry after %v, want 1..4 s", rl.RetryAfter)
	}
	if err := start(c, "bob"); err != nil {
		t.Errorf("bob: %v", err)
	}
	busy := New(Config{Timeout: time.Minute, CallerLimit: ratelimit.Limit{Rate: -1}, NodeLimit: ratelimit.Limit{Rate: -1}}, &fakeTracer{}, clusterResolver{}, nil)
	defer busy.Close()
	for i := 0; ; i++ {
		err := start(busy, "alice")
		if errors.Is(err, ErrBusy) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if i > packet.MaxTag {
			t.Fatal("never busy")
		}
	}
}

// TestControllerFamilySpellings: a request's family is read as every
// dualflow API reads one (flow.ParseFamily), from a JSON string or
// number, and normalized to ipv4, ipv6 or dual; anything else is
// refused naming the field.
func TestControllerFamilySpellings(t *testing.T) {
	c := New(Config{}, &fakeTracer{trace: delivered}, fakeResolver{}, nil)
	defer c.Close()
	for _, tc := range []struct {
		json string
		want Family // "": refused
	}{
		{`"ipv4"`, IPv4}, {`"4"`, IPv4}, {`4`, IPv4}, {`"IPv4"`, IPv4}, {`"v4"`, IPv4},
		{`"ipv6"`, IPv6}, {`"6"`, IPv6}, {`6`, IPv6}, {`"IPV6"`, IPv6},
		{`"dual"`, Dual}, {`"0"`, Dual}, {`0`, Dual}, {`""`, Dual}, {`null`, Dual},
		{`"5"`, ""}, {`5`, ""}, {`"ipv5"`, ""}, {`"both ways"`, ""},
	} {
		var r Request
		if err := json.Unmarshal([]byte(`{"family":`+tc.json+`}`), &r); err != nil {
			t.Fatalf("%s: %v", tc.json, err)
		}
		full := req()
		full.Family = r.Family
		err := c.Normalize(&full)
		switch {
		case tc.want == "" && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "family")):
			t.Errorf("%s: err %v, want ErrInvalid naming the family", tc.json, err)
		case tc.want != "" && (err != nil || full.Family != tc.want):
			t.Errorf("%s: %q %v, want %q", tc.json, full.Family, err, tc.want)
		}
	}
	if err := json.Unmarshal([]byte(`{"family":[4]}`), new(Request)); err == nil {
		t.Error("a family array was accepted")
	}
}
