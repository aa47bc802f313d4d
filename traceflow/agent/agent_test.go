package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/node"
	"github.com/dualflow/dualflow/traceflow/packet"
)

// fakeNode plays a node: Watch emits Ready, then waits for the probe to be
// injected (on any fake node of the same wire) and emits script.
type fakeNode struct {
	name    string
	wire    *wire
	script  []traceflow.WatchEvent
	hasPod  bool
	watchFn func(ctx context.Context) error // optional failure
	// other is the source port of another caller's probes: injected, but
	// not this trace's.
	other uint16
}

// wire connects fake nodes: Inject on the source closes sent.
type wire struct {
	once sync.Once
	sent chan struct{}
	n    int // injections
	mu   sync.Mutex
}

func newWire() *wire { return &wire{sent: make(chan struct{})} }

func (f *fakeNode) Watch(ctx context.Context, p traceflow.Probe, emit func(traceflow.WatchEvent) error) error {
	if f.watchFn != nil {
		if err := f.watchFn(ctx); err != nil {
			return err
		}
	}
	if err := emit(traceflow.WatchEvent{Ready: true}); err != nil {
		return err
	}
	select {
	case <-f.wire.sent:
	case <-ctx.Done():
		return nil
	}
	for _, ev := range f.script {
		if err := emit(ev); err != nil {
			return err
		}
	}
	<-ctx.Done()
	return nil
}

func (f *fakeNode) Inject(ctx context.Context, p traceflow.Probe) error {
	if !f.hasPod {
		return node.ErrPodNotOnNode
	}
	if f.other != 0 && p.SrcPort == f.other {
		return nil
	}
	f.wire.mu.Lock()
	f.wire.n++
	f.wire.mu.Unlock()
	f.wire.once.Do(func() { close(f.wire.sent) })
	return nil
}

type dir map[string]*Client

func (d dir) Agent(n string) (*Client, error) {
	c, ok := d[n]
	if !ok {
		return nil, errors.New("unknown node " + n)
	}
	return c, nil
}

func (d dir) Nodes() []string {
	var out []string
	for n := range d {
		out = append(out, n)
	}
	return out
}

func serve(t *testing.T, nodes ...*fakeNode) dir {
	t.Helper()
	d := dir{}
	for _, n := range nodes {
		srv := httptest.NewServer(Handler(n, Info{Node: n.name, Datapath: "kernel"}, "tok", nil))
		t.Cleanup(srv.Close)
		d[n.name] = &Client{Node: n.name, URL: srv.URL, Token: "tok"}
	}
	return d
}

// policies is a fake PolicyNamer: its policies deny ingress of b/api at
// 198.18.2.11:8080 only, to whoever sends it.
type policies struct{}

const denialText = "ingress denied by b/deny-all, which isolates b/api (ingress) and allows nothing"

func (policies) Denial(src netip.Addr, dst netip.AddrPort, proto uint8) (Denial, bool) {
	if dst == netip.MustParseAddrPort("198.18.2.11:8080") && proto == 6 {
		return Denial{Policy: "b/deny-all", Reason: denialText}, true
	}
	return Denial{}, false
}

var probe = traceflow.Probe{Family: traceflow.IPv4, SourcePod: "a/web", SourceNode: "n1", Src: netip.MustParseAddr("198.18.1.10"),
	Dst: netip.MustParseAddr("198.18.2.11"), Protocol: traceflow.TCP, SrcPort: 40000, DstPort: 8080, TCPFlags: packet.SYN, Tag: 5, Nodes: []string{"n1", "n2"}}

func obs(c traceflow.Component, a traceflow.Action) *traceflow.Observation {
	return &traceflow.Observation{Component: c, Action: a}
}

func TestClusterMergesNodesInPathOrder(t *testing.T) {
	w := newWire()
	// Whichever node's events arrive first, the path starts at the source
	// node and ends with the delivery.
	n1 := &fakeNode{name: "n1", wire: w, hasPod: true, script: []traceflow.WatchEvent{
		{Observation: obs(traceflow.Forwarding, traceflow.ActionReceived)},
		{Observation: obs(traceflow.Forwarding, traceflow.ActionForwarded), Left: true},
	}}
	n2 := &fakeNode{name: "n2", wire: w, script: []traceflow.WatchEvent{
		{Observation: obs(traceflow.Delivery, traceflow.ActionDelivered), Outcome: traceflow.Delivered},
		{Observation: obs(traceflow.Forwarding, traceflow.ActionReceived)},
	}}
	d := serve(t, n1, n2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	path, err := (&Cluster{Agents: d}).Trace(ctx, probe)
	if err != nil {
		t.Fatal(err)
	}
	if path.Outcome != traceflow.Delivered {
		t.Fatalf("outcome %s %q", path.Outcome, path.Reason)
	}
	var got []string
	for _, o := range path.Observations {
		got = append(got, o.Node+":"+string(o.Action))
	}
	want := "n1:received n1:forwarded n2:received n2:delivered"
	if strings.Join(got, " ") != want {
		t.Errorf("path %v, want %s", got, want)
	}
}

func TestClusterNamesIsolatingPolicies(t *testing.T) {
	w := newWire()
	drop := obs(traceflow.NetworkPolicy, traceflow.ActionDropped)
	drop.Rule = "drop/ingress/b/api"
	n1 := &fakeNode{name: "n1", wire: w, hasPod: true, script: []traceflow.WatchEvent{{Observation: obs(traceflow.Forwarding, traceflow.ActionForwarded), Left: true}}}
	n2 := &fakeNode{name: "n2", wire: w, script: []traceflow.WatchEvent{{Observation: drop, Outcome: traceflow.Dropped, Reason: "dropped by rule"}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	path, err := (&Cluster{Agents: serve(t, n1, n2), Policies: policies{}}).Trace(ctx, probe)
	if err != nil {
		t.Fatal(err)
	}
	// The reason is the one explanation; the datapath's rule is a detail.
	last := path.Observations[len(path.Observations)-1]
	if path.Outcome != traceflow.Dropped || last.Policy != "b/deny-all" || path.Reason != "dropped on n2: "+denialText ||
		!strings.Contains(last.Detail, "drop/ingress/b/api") || last.Node != "n2" {
		t.Errorf("path %+v", path)
	}
}

// A drop by another implementation's rule (kube-router's pod firewall
// chain) names no policy on the node: the controller names it from the
// cluster's policies at the endpoint the probe reached, the DNAT's target
// on the path, or says only what the node saw when they allow it.
func TestClusterNamesForeignDrops(t *testing.T) {
	for _, tc := range []struct {
		name   string
		dnatTo string
		want   string // the drop's policy; "" none
	}{
		{"service DNAT to the isolated pod", "198.18.2.11:8080", "b/deny-all"},
		{"service DNAT to a pod the policies allow", "198.18.2.12:8080", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWire()
			lb := obs(traceflow.LoadBalancing, traceflow.ActionForwarded)
			lb.TranslatedDst = netip.MustParseAddrPort(tc.dnatTo)
			drop := obs(traceflow.Forwarding, traceflow.ActionRejected)
			drop.Rule, drop.Detail = "KUBE-POD-FW-YXI4EGRXRLR2G42E", `rule "meta mark & 0x00010000 != 0x00010000 reject" in ip6 filter KUBE-POD-FW-YXI4EGRXRLR2G42E`
			n1 := &fakeNode{name: "n1", wire: w, hasPod: true, script: []traceflow.WatchEvent{
				{Observation: lb}, {Observation: obs(traceflow.Forwarding, traceflow.ActionForwarded), Left: true}}}
			n2 := &fakeNode{name: "n2", wire: w, script: []traceflow.WatchEvent{{Observation: drop, Outcome: traceflow.Rejected, Reason: "rejected by the rule"}}}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p := probe
			p.Service, p.Dst, p.DstPort = "b/api", netip.MustParseAddr("198.18.200.1"), 80
			path, err := (&Cluster{Agents: serve(t, n1, n2), Policies: policies{}}).Trace(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			last := path.Observations[len(path.Observations)-1]
			if path.Outcome != traceflow.Rejected || last.Node != "n2" || last.Policy != tc.want {
				t.Fatalf("outcome %s, last %+v, reason %q; want the policy %q", path.Outcome, last, path.Reason, tc.want)
			}
			if tc.want != "" && (last.Component != traceflow.NetworkPolicy || path.Reason != "rejected on n2: "+denialText ||
				!strings.Contains(last.Detail, "KUBE-POD-FW-YXI4EGRXRLR2G42E")) {
				t.Errorf("reason %q, component %s", path.Reason, last.Component)
			}
			if tc.want == "" && (last.Component != traceflow.Forwarding || path.Reason != "rejected by the rule") {
				t.Errorf("allowed by the policies: reason %q, component %s", path.Reason, last.Component)
			}
		})
	}
}

func TestClusterResendsAndTimesOut(t *testing.T) {
	w := newWire()
	n1 := &fakeNode{name: "n1", wire: w, hasPod: true, script: []traceflow.WatchEvent{{Observation: obs(traceflow.Forwarding, traceflow.ActionReceived)}}}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	p := probe
	p.Nodes = []string{"n1"}
	path, err := (&Cluster{Agents: serve(t, n1), ResendAfter: 50 * time.Millisecond, MaxSends: 3}).Trace(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if path.Outcome != traceflow.TimedOut || !strings.Contains(path.Reason, "last seen on n1") {
		t.Errorf("outcome %s %q", path.Outcome, path.Reason)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.n != 3 {
		t.Errorf("%d injections, want 3", w.n)
	}
}

func TestClusterAgentFailures(t *testing.T) {
	w := newWire()
	n1 := &fakeNode{name: "n1", wire: w, hasPod: true}
	n2 := &fakeNode{name: "n2", wire: w}
	d := serve(t, n1, n2)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	bad := dir{"n1": {Node: "n1", URL: d["n1"].URL, Token: "wrong"}, "n2": d["n2"]}
	_, err := (&Cluster{Agents: bad}).Trace(ctx, probe)
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "node n1") {
		t.Errorf("wrong token: %v", err)
	}

	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	down := dir{"n1": d["n1"], "n2": {Node: "n2", URL: "http://" + addr, Token: "tok"}}
	_, err = (&Cluster{Agents: down}).Trace(ctx, probe)
	if err == nil || !strings.Contains(err.Error(), "node n2") || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("agent down: %v", err)
	}

	// The source pod is not where the controller thinks it is.
	wrong := probe
	wrong.SourceNode = "n2"
	_, err = (&Cluster{Agents: d}).Trace(ctx, wrong)
	if !errors.Is(err, node.ErrPodNotOnNode) || !strings.Contains(err.Error(), "node n2") {
		t.Errorf("pod not on node: %v", err)
	}

	// A node that fails to watch.
	n3 := &fakeNode{name: "n3", wire: w, watchFn: func(context.Context) error { return errors.New("nft: no such file") }}
	d3 := serve(t, n3)
	d3["n1"] = d["n1"]
	p := probe
	p.Nodes = []string{"n1", "n3"}
	_, err = (&Cluster{Agents: d3}).Trace(ctx, p)
	if err == nil || !strings.Contains(err.Error(), "node n3") || !strings.Contains(err.Error(), "nft: no such file") {
		t.Errorf("watch failure: %v", err)
	}
}

func TestHandlerRefusesAndBounds(t *testing.T) {
	n := &fakeNode{name: "n1", wire: newWire(), hasPod: true}
	srv := httptest.NewServer(Handler(n, Info{Node: "n1"}, "tok", nil))
	defer srv.Close()
	for _, tc := range []struct {
		method, path, auth, body string
		want                     int
	}{
		{"GET", InfoPath, "", "", 401},
		{"GET", InfoPath, "Bearer nope", "", 401},
		{"GET", InfoPath, "bearer tok", "", 200},
		{"GET", InfoPath, "Bearer tok", "", 200},
		{"POST", WatchPath, "Bearer tok", "{", 400},
		{"POST", WatchPath, "Bearer tok", `{"probe":{},"timeout":"2h"}`, 400},
		{"POST", InjectPath, "Bearer tok", `{"probe":`, 400},
		{"GET", WatchPath, "Bearer tok", "", 405},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		if tc.auth != "" {
			req.Header.Set("Authorization", tc.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s %s %q %q: %d, want %d", tc.method, tc.path, tc.auth, tc.body, resp.StatusCode, tc.want)
		}
	}
	c := &Client{Node: "n1", URL: srv.URL, Token: "tok"}
	in, err := c.Info(context.Background())
	if err != nil || in.Node != "n1" {
		t.Errorf("info %+v %v", in, err)
	}
	if _, err := c.Watch(context.Background(), probe); err == nil || !strings.Contains(err.Error(), "deadline") {
		t.Errorf("watch without a deadline: %v", err)
	}
}

func TestHandlerPanicsWithoutToken(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("no panic")
		}
	}()
	Handler(&fakeNode{}, Info{}, "", nil)
}

func TestDirectoryPrefersIPv6(t *testing.T) {
	v4, v6 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd00:10::1")
	for _, tc := range []struct {
		addrs []netip.Addr
		ipv6  bool
		want  string
	}{
		{[]netip.Addr{v4, v6}, true, "fd00:10::1"},
		{[]netip.Addr{v4, v6}, false, "198.18.0.1"},
		{[]netip.Addr{v4}, true, "198.18.0.1"},
		{[]netip.Addr{v6}, true, "fd00:10::1"},
	} {
		got, ok := pick(tc.addrs, tc.ipv6)
		if !ok || got.String() != tc.want {
			t.Errorf("pick(%v, %v) = %v, want %s", tc.addrs, tc.ipv6, got, tc.want)
		}
	}
	if _, ok := pick([]netip.Addr{v6}, false); ok {
		t.Error("IPv6 picked with IPv6 disabled")
	}
	var m agentMap
	if err := m.Set("n1=http://127.0.0.1:1,n2=https://[fd00:10::2]:9444"); err != nil || len(m) != 2 {
		t.Errorf("agentMap %v %v", m, err)
	}
	for _, bad := range []string{"n1", "=http://x", "n1=ftp://x", "n1=http://"} {
		if err := m.Set(bad); err == nil {
			t.Errorf("agentMap accepted %q", bad)
		}
	}
}

type view map[string][]netip.Addr

func (v view) NodeAddrs(n string) ([]netip.Addr, bool) { a, ok := v[n]; return a, ok }
func (v view) NodeNames() []string {
	var out []string
	for n := range v {
		out = append(out, n)
	}
	return out
}

func TestNodeDirectory(t *testing.T) {
	t.Setenv(TokenEnv, "tok")
	v := view{
		"dual": {netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("fd00:10::1")},
		"v4":   {netip.MustParseAddr("198.18.0.2")},
		"none": nil,
	}
	d, err := NewDirectory(DirectoryConfig{Static: map[string]string{"pinned": "http://127.0.0.1:1234"}}, v)
	if err != nil {
		t.Fatal(err)
	}
	for node, want := range map[string]string{
		"dual":   "https://[fd00:10::1]:9444",
		"v4":     "https://198.18.0.2:9444",
		"pinned": "http://127.0.0.1:1234",
	} {
		c, err := d.Agent(node)
		if err != nil || c.URL != want || c.Token != "tok" || c.Node != node {
			t.Errorf("%s: %+v %v, want %s", node, c, err, want)
		}
	}
	if c, _ := d.Agent("dual"); c == nil || len(c.Fallback) != 1 || c.Fallback[0] != "https://198.18.0.1:9444" {
		t.Errorf("dual-stack node without its IPv4 fallback: %+v", c)
	}
	for _, node := range []string{"none", "gone"} {
		if _, err := d.Agent(node); err == nil || !strings.Contains(err.Error(), "node "+node) {
			t.Errorf("%s: %v", node, err)
		}
	}
	if got := d.Nodes(); strings.Join(got, ",") != "dual,none,pinned,v4" {
		t.Errorf("nodes %v", got)
	}
	d4, _ := NewDirectory(DirectoryConfig{DisableIPv6: true, Port: 1}, v)
	if c, _ := d4.Agent("dual"); c == nil || c.URL != "https://198.18.0.1:1" {
		t.Errorf("IPv6 disabled: %+v", c)
	}
	d4, _ = NewDirectory(DirectoryConfig{Scheme: "http"}, v)
	if c, err := d4.Agent("dual"); err == nil {
		t.Errorf("http to a node address accepted: %+v", c)
	}
	if _, err := NewDirectory(DirectoryConfig{Static: map[string]string{"n": "http://198.18.0.9:9444"}}, v); err == nil {
		t.Error("a static http URL beyond loopback accepted")
	}
	if _, err := NewDirectory(DirectoryConfig{Scheme: "ftp"}, v); err == nil {
		t.Error("scheme ftp accepted")
	}
	t.Setenv(TokenEnv, "")
	if _, err := NewDirectory(DirectoryConfig{}, v); err == nil {
		t.Error("no token accepted")
	}
}

// TestClientFallsBackToTheOtherFamily: an agent that listens on IPv4 only
// is reached through the node's IPv4 address when IPv6 is refused.
func TestClientFallsBackToTheOtherFamily(t *testing.T) {
	n := &fakeNode{name: "n1", wire: newWire(), hasPod: true}
	srv := httptest.NewServer(Handler(n, Info{Node: "n1"}, "tok", nil)) // 127.0.0.1 only
	defer srv.Close()
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skip("no IPv6 loopback")
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	c := &Client{Node: "n1", URL: dead, Fallback: []string{srv.URL}, Token: "tok"}
	if in, err := c.Info(context.Background()); err != nil || in.Node != "n1" {
		t.Errorf("fallback: %+v %v", in, err)
	}
	c.Fallback = nil
	if _, err := c.Info(context.Background()); err == nil || !strings.Contains(err.Error(), "unreachable") {
		t.Errorf("no fallback: %v", err)
	}
}
