package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/packet"
	"github.com/dualflow/dualflow/traceflow/ratelimit"
)

// call serves one request to h as if from addr.
func call(h http.Handler, method, path, auth, body, addr string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.RemoteAddr = addr
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestHandlerBearerScheme: the scheme is matched in any case (RFC 7235),
// the token exactly.
func TestHandlerBearerScheme(t *testing.T) {
	h := Handler(&fakeNode{name: "n1", wire: newWire(), hasPod: true}, Info{Node: "n1"}, "s3cret", nil)
	for _, tc := range []struct {
		auth string
		want int
	}{
		{"Bearer s3cret", 200},
		{"bearer s3cret", 200},
		{"BEARER s3cret", 200},
		{"BeArEr s3cret", 200},
		{"Bearer  s3cret ", 200},
		{"Bearer s3cre", 401},
		{"Bearer s3cretx", 401},
		{"Bearer S3CRET", 401},
		{"Basic s3cret", 401},
		{"Bearers3cret", 401},
		{"s3cret", 401},
		{"Bearer", 401},
		{"Bearer ", 401},
		{"", 401},
	} {
		if w := call(h, "GET", InfoPath, tc.auth, "", "198.18.0.10:40000"); w.Code != tc.want {
			t.Errorf("Authorization %q: %d, want %d", tc.auth, w.Code, tc.want)
		}
	}
}

// countingNode counts the probes it is asked to send.
type countingNode struct {
	fakeNode
	injected int
}

func (c *countingNode) Inject(ctx context.Context, p traceflow.Probe) error {
	c.injected++
	return nil
}

// TestHandlerRefusesProbesATraceDoesNotNeed: /agent/v1/inject refuses
// (400) TCP flags other than SYN, a low TTL, flags on UDP, a non-unicast
// destination, in both families, without sending anything.
func TestHandlerRefusesProbesATraceDoesNotNeed(t *testing.T) {
	v4 := probe
	v6 := probe
	v6.Src, v6.Dst = netip.MustParseAddr("fd00:10:0:1::10"), netip.MustParseAddr("fd00:10:0:2::11")
	with := func(p traceflow.Probe, edit func(*traceflow.Probe)) traceflow.Probe { edit(&p); return p }
	for _, tc := range []struct {
		name string
		p    traceflow.Probe
		want int
	}{
		{"syn v4", v4, 200},
		{"syn v6", v6, 200},
		{"rst v4", with(v4, func(p *traceflow.Probe) { p.TCPFlags = packet.RST }), 400},
		{"rst v6", with(v6, func(p *traceflow.Probe) { p.TCPFlags = packet.RST }), 400},
		{"syn-ack v4", with(v4, func(p *traceflow.Probe) { p.TCPFlags = packet.SYN | packet.ACK }), 400},
		{"fin v6", with(v6, func(p *traceflow.Probe) { p.TCPFlags = packet.FIN }), 400},
		{"ttl 1 v4", with(v4, func(p *traceflow.Probe) { p.TTL = 1 }), 400},
		{"hop limit 1 v6", with(v6, func(p *traceflow.Probe) { p.TTL = 1 }), 400},
		{"ttl 64 v4", with(v4, func(p *traceflow.Probe) { p.TTL = 64 }), 200},
		{"udp with flags v6", with(v6, func(p *traceflow.Probe) { p.Protocol = traceflow.UDP }), 400},
		{"udp v6", with(v6, func(p *traceflow.Probe) { p.Protocol, p.TCPFlags = traceflow.UDP, 0 }), 200},
		{"echo v4", with(v4, func(p *traceflow.Probe) { p.Protocol, p.TCPFlags, p.DstPort = traceflow.ICMP, 0, 0 }), 200},
		{"echo v6", with(v6, func(p *traceflow.Probe) { p.Protocol, p.TCPFlags, p.DstPort = traceflow.ICMPv6, 0, 0 }), 200},
		{"broadcast v4", with(v4, func(p *traceflow.Probe) { p.Dst = netip.MustParseAddr("255.255.255.255") }), 400},
		{"multicast v6", with(v6, func(p *traceflow.Probe) { p.Dst = netip.MustParseAddr("ff02::1") }), 400},
		{"link-local v4", with(v4, func(p *traceflow.Probe) { p.Dst = netip.MustParseAddr("169.254.169.254") }), 400},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := &countingNode{fakeNode: fakeNode{name: "n1", wire: newWire(), hasPod: true}}
			h := Handler(n, Info{Node: "n1"}, "tok", nil)
			b, _ := jsonText(injectRequest{Probe: tc.p})
			w := call(h, "POST", InjectPath, "Bearer tok", b, "198.18.0.10:40000")
			if w.Code != tc.want {
				t.Fatalf("%d %s, want %d", w.Code, w.Body, tc.want)
			}
			if sent := n.injected == 1; sent != (tc.want == 200) {
				t.Errorf("injected %d", n.injected)
			}
		})
	}
}

func jsonText(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

// TestHandlerRateLimitsInject: a caller beyond its rate, or all callers
// beyond the node's, get 429 with Retry-After, counted as rate_limited;
// callers are told apart by address (IPv4 and IPv6 alike).
func TestHandlerRateLimitsInject(t *testing.T) {
	n := &countingNode{fakeNode: fakeNode{name: "n1", wire: newWire(), hasPod: true}}
	m := NewMetrics(nil)
	h := Handler(n, Info{Node: "n1"}, "tok", m, WithLimits(Limits{Caller: ratelimit.Limit{Rate: 0.5, Burst: 3}, Node: ratelimit.Limit{Rate: 0.5, Burst: 5}}))
	body, _ := jsonText(injectRequest{Probe: probe})
	inject := func(addr string) *httptest.ResponseRecorder {
		return call(h, "POST", InjectPath, "Bearer tok", body, addr)
	}
	for i := range 3 {
		if w := inject("198.18.0.10:40000"); w.Code != 200 {
			t.Fatalf("caller A probe %d: %d %s", i, w.Code, w.Body)
		}
	}
	w := inject("198.18.0.10:40001") // same address, another port: the same caller
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "caller addr:198.18.0.10") {
		t.Fatalf("caller A beyond its burst: %d %s", w.Code, w.Body)
	}
	if s, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || s < 1 || s > 2 {
		t.Errorf("Retry-After %q", w.Header().Get("Retry-After"))
	}
	for i := range 2 {
		if w := inject("[fd00:10::20]:40000"); w.Code != 200 {
			t.Fatalf("caller B probe %d: %d %s", i, w.Code, w.Body)
		}
	}
	// The node has sent its 5: caller B's third is refused by the node.
	w = inject("[fd00:10::20]:40000")
	if w.Code != http.StatusTooManyRequests || !strings.Contains(w.Body.String(), "node n1") || w.Header().Get("Retry-After") == "" {
		t.Fatalf("node beyond its burst: %d %s", w.Code, w.Body)
	}
	if n.injected != 5 {
		t.Errorf("%d probes sent, want 5", n.injected)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("inject", "rate_limited")); got != 2 {
		t.Errorf("rate_limited counted %v, want 2", got)
	}
	// Watches and info are not rate limited.
	if w := call(h, "GET", InfoPath, "Bearer tok", "", "198.18.0.10:40000"); w.Code != 200 {
		t.Errorf("info: %d", w.Code)
	}
}

// TestDefaultLimitsAllowATrace: with the default limits, the first probes
// of as many family traces as the controller starts at once from one node
// (its node burst) pass.
func TestDefaultLimitsAllowATrace(t *testing.T) {
	n := &countingNode{fakeNode: fakeNode{name: "n1", wire: newWire(), hasPod: true}}
	h := Handler(n, Info{Node: "n1"}, "tok", nil)
	body, _ := jsonText(injectRequest{Probe: probe})
	for i := range traceflow.DefaultNodeLimit.Burst {
		if w := call(h, "POST", InjectPath, "Bearer tok", body, "[fd00:10::1]:9444"); w.Code != 200 {
			t.Fatalf("probe %d: %d %s", i, w.Code, w.Body)
		}
	}
}

// TestClusterWaitsForTheAgentsRate: a trace whose probe the agent refuses
// for its rate sends it after the Retry-After and is delivered.
func TestClusterWaitsForTheAgentsRate(t *testing.T) {
	w := newWire()
	n1 := &fakeNode{name: "n1", wire: w, hasPod: true, other: 1, script: []traceflow.WatchEvent{
		{Observation: obs(traceflow.Forwarding, traceflow.ActionReceived)},
		{Observation: obs(traceflow.Delivery, traceflow.ActionDelivered), Outcome: traceflow.Delivered, Left: true}}}
	srv := httptest.NewServer(Handler(n1, Info{Node: "n1"}, "tok", nil, WithLimits(Limits{Caller: ratelimit.Limit{Rate: 2, Burst: 1}, Node: ratelimit.Limit{Rate: -1}})))
	defer srv.Close()
	d := dir{"n1": {Node: "n1", URL: srv.URL, Token: "tok"}}
	// Another caller's probe (from the same address) took the token.
	otherProbe := probe
	otherProbe.SrcPort = 1
	if err := (&Client{Node: "n1", URL: srv.URL, Token: "tok"}).Inject(context.Background(), otherProbe); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	p := probe
	p.Nodes = []string{"n1"}
	start := time.Now()
	path, err := (&Cluster{Agents: d}).Trace(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if path.Outcome != traceflow.Delivered {
		t.Errorf("outcome %s %q", path.Outcome, path.Reason)
	}
	if took := time.Since(start); took < 500*time.Millisecond {
		t.Errorf("delivered after %v: the agent's Retry-After (1s) was not waited for", took)
	}
}

// TestLoadTokenFileMode: the agent's token file is refused when others
// may read it, as the web's tokens file is; the environment wins.
func TestLoadTokenFileMode(t *testing.T) {
	t.Setenv(TokenEnv, "")
	for _, tc := range []struct {
		mode os.FileMode
		ok   bool
	}{{0o600, true}, {0o400, true}, {0o640, true}, {0o440, true}, {0o644, false}, {0o604, false}, {0o660, false}, {0o666, false}} {
		path := filepath.Join(t.TempDir(), "token")
		os.WriteFile(path, []byte("s3cret\n"), 0o600)
		os.Chmod(path, tc.mode)
		tok, err := LoadToken(path)
		switch {
		case tc.ok && (err != nil || tok != "s3cret"):
			t.Errorf("mode %#o: %q %v", tc.mode, tok, err)
		case !tc.ok && (err == nil || !strings.Contains(err.Error(), "chmod 600 "+path)):
			t.Errorf("mode %#o: %v, want refused with the fix", tc.mode, err)
		}
	}
	path := filepath.Join(t.TempDir(), "token")
	os.WriteFile(path, []byte("s3cret\n"), 0o644)
	t.Setenv(TokenEnv, "from-env")
	if tok, err := LoadToken(path); err != nil || tok != "from-env" {
		t.Errorf("environment: %q %v", tok, err)
	}
}
