package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
)

// loadPolicies returns n policies of namespace ns that each select every
// pod of it (an Exists selector, which the label index cannot narrow) and
// whose one ingress and one egress rule match no pod: every pair is
// checked against every rule of all n, the worst case of an evaluation.
func loadPolicies(ns string, n int) []*networkingv1.NetworkPolicy {
	none := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "none"}}}}
	out := make([]*networkingv1.NetworkPolicy, n)
	for i := range out {
		out[i] = &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p" + strconv.Itoa(i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: none}},
				Egress:      []networkingv1.NetworkPolicyEgressRule{{To: none}},
			},
		}
	}
	return out
}

// loadResolver resolves the workloads "w<i>" of namespace ns, each of
// size dual-stack pods (198.18.i.k and fd00:10::i:k).
type loadResolver struct {
	ns   string
	size int
}

func (r loadResolver) Resolve(_ context.Context, e audit.Endpoint) (*audit.Target, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(e.Name, "w"))
	if e.Kind != "workload" || e.Namespace != r.ns || err != nil || i < 0 || i > 255 {
		return nil, fmt.Errorf("%s not found", e)
	}
	t := &audit.Target{}
	for k := range r.size {
		lbl := map[string]string{"app": e.Name}
		peer := func(a netip.Addr) policy.Peer {
			return policy.Peer{Addr: a, IsPod: true, Namespace: r.ns, Labels: lbl}
		}
		v4 := netip.AddrFrom4([4]byte{198, 18, byte(i), byte(k)})
		v6 := netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 12: 0, 13: byte(i), 14: 0, 15: byte(k)})
		t.Members = append(t.Members, audit.Member{Name: r.ns + "/" + e.Name + "-" + strconv.Itoa(k), Pod: true,
			Peers: map[int]policy.Peer{4: peer(v4), 6: peer(v6)}})
	}
	return t, nil
}

// loadMatrix is a sides × sides matrix of workloads of loadResolver.
func loadMatrix(ns string, sides int) (srcs, dsts []audit.Endpoint) {
	for i := range sides {
		srcs = append(srcs, audit.Endpoint{Kind: "workload", Namespace: ns, Name: "w" + strconv.Itoa(i)})
		dsts = append(dsts, audit.Endpoint{Kind: "workload", Namespace: ns, Name: "w" + strconv.Itoa(sides+i)})
	}
	return srcs, dsts
}

// cpuTime is the CPU time (user and system) the process has used.
func cpuTime(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// held is a what-if handler and a matrix evaluator that hold each
// request until release is closed, reporting it on entered.
type held struct {
	entered chan struct{}
	release chan struct{}
}

func newHeld() *held { return &held{entered: make(chan struct{}, 64), release: make(chan struct{})} }

// heldAudit holds its what-ifs; the audit's other questions are
// unavailable.
type heldAudit struct {
	*audit.Queries
	h *held
}

func (a heldAudit) WhatIf(ctx context.Context, _ io.Reader, _ audit.Window, _ int) (*audit.WhatIfReport, error) {
	a.h.entered <- struct{}{}
	select {
	case <-a.h.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &audit.WhatIfReport{}, nil
}

func (h *held) EvaluateMatrix(ctx context.Context, srcs, dsts []audit.Endpoint, _ uint8, _ uint16, _ ...[]uint16) ([][]map[int]*audit.FamilyPolicy, error) {
	h.entered <- struct{}{}
	select {
	case <-h.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	out := make([][]map[int]*audit.FamilyPolicy, len(srcs))
	for i := range out {
		out[i] = make([]map[int]*audit.FamilyPolicy, len(dsts))
	}
	return out, nil
}

// wait waits for n requests to enter.
func (h *held) wait(t *testing.T, n int, who string) {
	t.Helper()
	for range n {
		select {
		case <-h.entered:
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: a request let in did not start", who)
		}
	}
}

// emptyStore answers every query with no rows; safe for concurrent use.
type emptyStore struct{}

func (emptyStore) Query(context.Context, string, string) ([]byte, error) { return nil, nil }

// gateTokens are viewers a, b and c and operator o.
func gateTokens() *Tokens {
	tok := &Tokens{}
	for _, v := range []string{"a", "b", "c"} {
		tok.Add("secret-"+v, Principal{Name: v, Role: RoleViewer})
	}
	tok.Add("secret-o", Principal{Name: "o", Role: RoleOperator})
	return tok
}

// checkGate drives requests of one gated kind (method, target, body;
// held holds them) past the caps of a token (perToken places) and of the
// viewers (perRole): a token past its own gets 429 naming it while
// another token still gets in, a viewer past the role's gets 429 naming
// the role while an operator still gets in; every request let in ends
// 200 and gives its place back, and the refusals are counted by cap.
func checkGate(t *testing.T, a *API, h *held, kind, method, target, body string, perToken, perRole int) {
	t.Helper()
	hh := a.Handler()
	type answer struct {
		who string
		r   resp
	}
	answers := make(chan answer, 64)
	send := func(who string) {
		go func() { answers <- answer{who, do(t, hh, method, target, body, "Authorization", "Bearer secret-"+who)} }()
	}
	// refused sends one more request of who, which must be answered 429
	// at once naming want.
	refused := func(who, want string) {
		t.Helper()
		send(who)
		select {
		case x := <-answers:
			if x.r.code != http.StatusTooManyRequests || x.r.hdr.Get("Retry-After") == "" || !strings.Contains(decode[errorBody](t, x.r).Message, want) {
				t.Errorf("%s past a cap: %v Retry-After %q, want 429 naming %s", who, x.r, x.r.hdr.Get("Retry-After"), want)
			}
		case <-time.After(10 * time.Second):
			t.Errorf("%s past a cap was let in (no answer within 10 s), want 429 naming %s", who, want)
		}
	}
	viewers := []string{"a", "b", "c"}
	sent := 0
	for i := 0; sent < perRole; i++ {
		who := viewers[i]
		n := min(perToken, perRole-sent)
		for range n {
			send(who)
		}
		h.wait(t, n, who)
		sent += n
		if n == perToken {
			refused(who, `token "`+who+`"`)
		}
	}
	refused(viewers[len(viewers)-1], "role viewer")
	send("o")
	h.wait(t, 1, "an operator while the viewers hold their places")
	close(h.release)
	for range sent + 1 {
		if x := <-answers; x.r.code != http.StatusOK {
			t.Errorf("%s let in: %v", x.who, x.r)
		}
	}
	m := do(t, hh, "GET", "/metrics", "", "Authorization", "Bearer secret-a")
	for _, want := range []string{
		`dualflow_web_concurrency_refused_total{cap="token",kind="` + kind + `",role="viewer"} ` + strconv.Itoa(perRole/perToken),
		`dualflow_web_concurrency_refused_total{cap="role",kind="` + kind + `",role="viewer"} 1`,
		`dualflow_web_in_flight{kind="` + kind + `"} 0`,
	} {
		if !strings.Contains(m.body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestWhatIfGate: what-ifs are capped per token and per role (issue 33,
// items 7 and 16).
func TestWhatIfGate(t *testing.T) {
	h := newHeld()
	a, err := New(Config{Store: emptyStore{}, Tokens: gateTokens(), Audit: heldAudit{&audit.Queries{}, h}})
	if err != nil {
		t.Fatal(err)
	}
	checkGate(t, a, h, "whatif", "POST", "/api/v1/audit/whatif", "kind: NetworkPolicy\n", DefaultWhatIfConcurrencyPerToken, DefaultWhatIfConcurrency)
}

// TestReachabilityGate: reachability matrices are capped per token and
// per role (issue 33, items 8 and 16).
func TestReachabilityGate(t *testing.T) {
	h := newHeld()
	a, err := New(Config{Store: emptyStore{}, Tokens: gateTokens(), Evaluator: h})
	if err != nil {
		t.Fatal(err)
	}
	body := `{"sources":[{"kind":"ip","name":"198.18.0.1"}],"destinations":[{"kind":"ip","name":"fd00:10::1"}]}`
	checkGate(t, a, h, "reachability", "POST", "/api/v1/reachability", body, DefaultReachabilityConcurrencyPerToken, DefaultReachabilityConcurrency)
}

// TestFollowStreamsPerToken: one token cannot take every follow stream
// of its role (issue 33, item 16): past its own cap its next stream is
// refused naming the token, and another token of the role still gets one.
func TestFollowStreamsPerToken(t *testing.T) {
	a, err := New(Config{Store: emptyStore{}, Tokens: gateTokens(), FollowInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(who string) (int, string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/v1/flows?follow=true", nil)
		req.Header.Set("Authorization", "Bearer secret-"+who)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if r.StatusCode == http.StatusOK {
			return r.StatusCode, "" // left open until cancel
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b)
	}
	opened := 0
	for ; opened < a.cfg.FollowStreamsPerRole; opened++ {
		code, body := open("a")
		if code == http.StatusOK {
			continue
		}
		if code != http.StatusTooManyRequests || !strings.Contains(body, `token \"a\"`) {
			t.Errorf("stream %d of token a: %d %s, want 429 naming the token", opened+1, code, body)
		}
		break
	}
	if opened != DefaultFollowStreamsPerToken {
		t.Errorf("token a opened %d follow streams of its role's %d, want %d", opened, a.cfg.FollowStreamsPerRole, DefaultFollowStreamsPerToken)
	}
	if code, body := open("b"); code != http.StatusOK {
		t.Errorf("token b while a holds its streams: %d %s", code, body)
	}
	m := do(t, a.Handler(), "GET", "/metrics", "", "Authorization", "Bearer secret-a")
	if want := `dualflow_web_concurrency_refused_total{cap="token",kind="follow",role="viewer"} 1`; !strings.Contains(m.body, want) {
		t.Errorf("metrics lack %s", want)
	}
}

// TestReachabilityWorkBound: a matrix whose pod pairs times the policies
// checked for each pass the bound is refused before any pair is
// evaluated, 422 saying what to narrow, and counted (issue 33, item 8).
func TestReachabilityWorkBound(t *testing.T) {
	set, err := policy.Compile(loadPolicies("load", 2000))
	if err != nil {
		t.Fatal(err)
	}
	ev := audit.PolicyEvaluator{Policies: func() *policy.Set { return set }, Resolver: loadResolver{ns: "load", size: 10}}
	a, err := New(Config{Store: emptyStore{}, Tokens: gateTokens(), Evaluator: ev})
	if err != nil {
		t.Fatal(err)
	}
	h := a.Handler()
	ask := func(sides int) resp {
		srcs, dsts := loadMatrix("load", sides)
		b, _ := json.Marshal(ReachabilityRequest{Sources: srcs, Destinations: dsts, Port: 80})
		return do(t, h, "POST", "/api/v1/reachability", string(b), "Authorization", "Bearer secret-a")
	}
	// 10×10 workloads of 10 pods: 20,000 pod pairs over both families,
	// each checked against 2,000 policies per side: 80 million checks.
	r := ask(10)
	e := decode[errorBody](t, r)
	if r.code != http.StatusUnprocessableEntity || e.Field != "destinations" || !strings.Contains(e.Message, "80000000 policy checks") || !strings.Contains(e.Message, "fewer or smaller endpoints") {
		t.Errorf("80 million checks: %v, want 422 saying what to narrow", r)
	}
	// 2×2 of them: 3.2 million checks, evaluated.
	if r := ask(2); r.code != http.StatusOK {
		t.Errorf("3.2 million checks: %v", r)
	}
	m := do(t, h, "GET", "/metrics", "", "Authorization", "Bearer secret-a")
	if want := `dualflow_web_too_large_total{kind="reachability"} 1`; !strings.Contains(m.body, want) {
		t.Errorf("metrics lack %s", want)
	}
}

// TestReachabilityChecks: the checks of a matrix are, per family and
// cell, its source members' egress tries times its destination members
// plus its source members times its destination members' ingress tries;
// the bound is inclusive.
func TestReachabilityChecks(t *testing.T) {
	set, err := policy.Compile(loadPolicies("load", 10))
	if err != nil {
		t.Fatal(err)
	}
	srcs, dsts := loadMatrix("load", 2)
	// 4 cells × 2 families × 3×3 pairs × (10 + 10) tries.
	const want = 4 * 2 * 9 * 20
	for _, c := range []struct {
		max int64
		ok  bool
	}{{want, true}, {want - 1, false}} {
		ev := audit.PolicyEvaluator{Policies: func() *policy.Set { return set }, Resolver: loadResolver{ns: "load", size: 3}, MaxChecks: c.max}
		_, err := ev.EvaluateMatrix(context.Background(), srcs, dsts, 6, 80)
		var tl *audit.TooLargeError
		if refused := errors.As(err, &tl); refused == c.ok || (c.ok && err != nil) {
			t.Errorf("MaxChecks %d: %v, want ok %v", c.max, err, c.ok)
		}
	}
}

// BenchmarkReachabilityIssue asks the issue's matrix: 10×10 workloads
// of 31 pods (192,200 pod pairs over both families) under 3,000 policies
// that all apply to every pair, over a billion policy checks. cpu-s/op
// is the CPU it takes: the issue measured 7.5 CPU-seconds; it is now
// refused before any pair is evaluated.
func BenchmarkReachabilityIssue(b *testing.B) {
	benchMatrix(b, 3000, 10, 31)
}

// BenchmarkReachabilityMaximal asks the largest matrices the default
// bound admits (just under DefaultReachabilityMaxChecks): few pairs
// under many policies, and many pairs under few.
func BenchmarkReachabilityMaximal(b *testing.B) {
	b.Run("3000policies-3200pairs", func(b *testing.B) { benchMatrix(b, 3000, 10, 4) })
	b.Run("100policies-96800pairs", func(b *testing.B) { benchMatrix(b, 100, 10, 22) })
}

// benchMatrix evaluates a sides×sides matrix of workloads of size pods
// under n policies that all apply to every pair, and reports its CPU.
func benchMatrix(b *testing.B, n, sides, size int) {
	set, err := policy.Compile(loadPolicies("load", n))
	if err != nil {
		b.Fatal(err)
	}
	ev := audit.PolicyEvaluator{Policies: func() *policy.Set { return set }, Resolver: loadResolver{ns: "load", size: size}}
	srcs, dsts := loadMatrix("load", sides)
	b.ReportAllocs()
	start := cpuTime(b)
	var refused bool
	for b.Loop() {
		_, err := ev.EvaluateMatrix(context.Background(), srcs, dsts, 6, 80)
		refused = err != nil
	}
	b.ReportMetric((cpuTime(b)-start).Seconds()/float64(b.N), "cpu-s/op")
	if refused {
		b.ReportMetric(1, "refused")
	}
}
