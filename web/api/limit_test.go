package api

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// waitFor polls cond until it holds or a generous deadline passes (the
// test machines are small and loaded).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// selectAST is the engine's EXPLAIN AST of SELECT 1.
const selectAST = "SelectWithUnionQuery (children 1)\n ExpressionList (children 1)\n  SelectQuery (children 1)\n   ExpressionList (children 1)\n    Literal UInt64_1\n"

// gatedSQL passes sqlguard's vetting and holds each query until release
// is closed, reporting its settings on entered.
type gatedSQL struct {
	entered chan map[string]string
	release chan struct{}
}

func newGatedSQL() *gatedSQL {
	return &gatedSQL{entered: make(chan map[string]string, 16), release: make(chan struct{})}
}

func (g *gatedSQL) RunSQL(ctx context.Context, q, _ string, settings map[string]string) ([]byte, error) {
	switch {
	case strings.HasPrefix(q, "SELECT formatQuery("):
		return []byte("SELECT 1\n"), nil
	case strings.HasPrefix(q, "EXPLAIN AST "):
		return []byte(selectAST), nil
	}
	g.entered <- settings
	select {
	case <-g.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return []byte(`{"meta":[{"name":"1","type":"UInt8"}],"data":[[1]]}`), nil
}

// TestSQLConcurrencyLimit: past SQLConcurrency queries of a role, /sql
// answers 429 with Retry-After and counts it; the queries that run have
// the engine's thread cap and a priority below the API's own reads.
func TestSQLConcurrencyLimit(t *testing.T) {
	g := newGatedSQL()
	a, err := New(Config{Store: &fakeStore{}, SQL: g, Tokens: gateTokens(), Limits: Limits{SQLConcurrency: 2, SQLConcurrencyPerToken: 3, SQLMaxThreads: 1}}) // the role's cap first
	if err != nil {
		t.Fatal(err)
	}
	h := a.Handler()
	var wg sync.WaitGroup
	codes := make(chan int, 2)
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT 1"}`, "Authorization", "Bearer secret-o").code
		}()
	}
	for range 2 {
		select {
		case s := <-g.entered:
			if s["max_threads"] != "1" {
				t.Errorf("max_threads %q, want 1", s["max_threads"])
			}
			p, _ := strconv.Atoi(s["priority"])
			ui, _ := strconv.Atoi(uiPriority)
			if p <= ui {
				t.Errorf("/sql priority %q is not below the UI's %s (a larger number is a lower priority)", s["priority"], uiPriority)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the first two queries did not reach the engine")
		}
	}
	r := do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT 1"}`, "Authorization", "Bearer secret-o")
	if r.code != http.StatusTooManyRequests || r.hdr.Get("Retry-After") == "" {
		t.Errorf("third query while two run: %v Retry-After %q, want 429 with Retry-After", r, r.hdr.Get("Retry-After"))
	}
	if e := decode[errorBody](t, r); !strings.Contains(e.Message, "SQL queries") || !strings.Contains(e.Message, "operator") {
		t.Errorf("429 message %q does not say what is full", e.Message)
	}
	if m := do(t, h, "GET", "/metrics", "", "Authorization", "Bearer secret-o"); !strings.Contains(m.body, `dualflow_web_concurrency_refused_total{cap="role",kind="sql",role="operator"} 1`) ||
		!strings.Contains(m.body, `dualflow_web_in_flight{kind="sql"} 2`) {
		t.Errorf("metrics lack the refusal or the queries in flight:\n%s", m.body)
	}
	close(g.release)
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != http.StatusOK {
			t.Errorf("a query let in answered %d", c)
		}
	}
	// The places are given back.
	if r := do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT 1"}`, "Authorization", "Bearer secret-o"); r.code != http.StatusOK {
		t.Errorf("after the queries ended: %v", r)
	}
}

// TestQueryPriorities: the API's own reads run at the highest engine
// priority, so operator SQL (sqlPriority) waits for them.
func TestQueryPriorities(t *testing.T) {
	st := &fakeStore{}
	h := testAPI(t, Config{Store: st})
	for _, u := range []string{"/api/v1/flows", "/api/v1/flows/summary", "/api/v1/servicemap"} {
		st.last = ""
		do(t, h, "GET", u, "")
		if !strings.Contains(st.last, "priority = "+uiPriority) {
			t.Errorf("%s ran without priority %s: %s", u, uiPriority, st.last)
		}
		if !strings.Contains(st.last, "max_memory_usage = 1073741824") || !strings.Contains(st.last, "max_bytes_before_external_group_by = 536870912") {
			t.Errorf("%s ran without its memory bounds: %s", u, st.last)
		}
	}
	if ui, _ := strconv.Atoi(uiPriority); ui != 1 {
		t.Errorf("uiPriority %s: 1 is the engine's highest", uiPriority)
	}
}

// TestSQLEngineSettings: the engine applies the thread cap and the
// priority to /sql, and a query cannot lift them.
func TestSQLEngineSettings(t *testing.T) {
	e := needEngine(t)
	h := testAPI(t, Config{SQL: e, Limits: Limits{SQLMaxThreads: 1}})
	r := do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT getSetting('max_threads') AS t, getSetting('priority') AS p"}`)
	res := decode[SQLResult](t, r)
	if r.code != 200 || len(res.Rows) != 1 || res.Limits.MaxThreads != 1 {
		t.Fatalf("settings query: %v", r)
	}
	if got := []string{jsonText(res.Rows[0][0]), jsonText(res.Rows[0][1])}; got[0] != "1" || got[1] != sqlPriority {
		t.Errorf("engine saw max_threads %s priority %s, want 1 and %s", got[0], got[1], sqlPriority)
	}
	for _, q := range []string{"SELECT 1 SETTINGS priority = 1", "SELECT 1 SETTINGS max_threads = 64"} {
		if r := do(t, h, "POST", "/api/v1/sql", `{"query":`+jsonString(q)+`}`); r.code != 400 {
			t.Errorf("%s: %v, want 400", q, r)
		}
	}
	// The API's own reads run with their priority on the engine.
	if r := do(t, h, "GET", "/api/v1/flows?limit=1", ""); r.code != 200 {
		t.Errorf("flows with priority %s: %v", uiPriority, r)
	}
}

// jsonText is a JSONCompact cell as text (a string, or a json.Number).
func jsonText(v any) string { return fmt.Sprint(v) }

// TestFollowStreamLimits: follow streams are capped per role and in all;
// a stream that ends gives its place back.
func TestFollowStreamLimits(t *testing.T) {
	tok := &Tokens{}
	tok.Add("view-secret", Principal{Name: "v", Role: RoleViewer})
	tok.Add("op-secret", Principal{Name: "o", Role: RoleOperator})
	a, err := New(Config{Store: emptyStore{}, Tokens: tok, FollowInterval: time.Hour, Limits: Limits{FollowStreams: 3, FollowStreamsPerRole: 2}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	open := func(token string) (int, http.Header, context.CancelFunc) {
		t.Helper()
		sctx, stop := context.WithCancel(ctx)
		req, _ := http.NewRequestWithContext(sctx, "GET", srv.URL+"/api/v1/flows?follow=true", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if r.StatusCode != http.StatusOK {
			r.Body.Close()
		}
		return r.StatusCode, r.Header, stop
	}
	inFlight := func(r Role) int { return len(a.followGate.byRole[r]) }
	c1, _, stop1 := open("view-secret")
	c2, _, _ := open("view-secret")
	if c1 != 200 || c2 != 200 {
		t.Fatalf("two viewer streams: %d %d", c1, c2)
	}
	if c, hdr, _ := open("view-secret"); c != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" {
		t.Errorf("a third viewer stream past the role's cap: %d, want 429 with Retry-After", c)
	}
	if c, _, _ := open("op-secret"); c != 200 {
		t.Errorf("an operator stream while viewers hold their cap: %d", c)
	}
	if c, _, _ := open("op-secret"); c != http.StatusTooManyRequests {
		t.Errorf("a fourth stream past the overall cap: %d, want 429", c)
	}
	stop1()
	waitFor(t, "the closed stream to give its place back", func() bool { return inFlight(RoleViewer) == 1 })
	if c, _, _ := open("view-secret"); c != 200 {
		t.Errorf("a viewer stream after one closed: %d", c)
	}
	m := do(t, a.Handler(), "GET", "/metrics", "", "Authorization", "Bearer view-secret")
	for _, want := range []string{
		`dualflow_web_concurrency_refused_total{cap="role",kind="follow",role="viewer"} 1`,
		`dualflow_web_concurrency_refused_total{cap="all",kind="follow",role="operator"} 1`,
		`dualflow_web_in_flight{kind="follow"} 3`,
	} {
		if !strings.Contains(m.body, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
}

// TestGate: places are per principal, per role and overall, and given
// back once; a refusal names the cap it reached and keeps no place.
func TestGate(t *testing.T) {
	g := newGate("x", "things", 2, 2, 3, time.Second)
	v1, v2 := Principal{Name: "v1", Role: RoleViewer}, Principal{Name: "v2", Role: RoleViewer}
	o1, o2 := Principal{Name: "o1", Role: RoleOperator}, Principal{Name: "o2", Role: RoleOperator}
	var leaves []func()
	for _, p := range []Principal{v1, v1, o1} {
		leave, _, why, ok := g.enter(p)
		if !ok {
			t.Fatalf("%s refused: %s", p.Name, why)
		}
		leaves = append(leaves, leave)
	}
	if _, capName, why, ok := g.enter(v1); ok || capName != capToken || !strings.Contains(why, `token "v1"`) {
		t.Errorf("v1 past its own cap: ok %v %s %q", ok, capName, why)
	}
	if _, capName, why, ok := g.enter(v2); ok || capName != capRole || !strings.Contains(why, "role viewer") {
		t.Errorf("v2 past its role's cap: ok %v %s %q", ok, capName, why)
	}
	if _, capName, why, ok := g.enter(o2); ok || capName != capAll || strings.Contains(why, "role") {
		t.Errorf("o2 past the overall cap: ok %v %s %q", ok, capName, why)
	}
	if len(g.byRole[RoleOperator]) != 1 || len(g.byRole[RoleViewer]) != 2 || g.held["v2"] != 0 || g.held["o2"] != 0 {
		t.Errorf("a refusal kept a place: roles %d %d, held %v", len(g.byRole[RoleViewer]), len(g.byRole[RoleOperator]), g.held)
	}
	leaves[0]()
	leaves[0]() // a second release gives nothing back twice
	if len(g.byRole[RoleViewer]) != 1 || g.held["v1"] != 1 {
		t.Errorf("after one release: viewer places %d, v1 holds %d", len(g.byRole[RoleViewer]), g.held["v1"])
	}
	if _, _, _, ok := g.enter(v2); !ok {
		t.Error("a place given back is not reusable")
	}
	if _, _, _, ok := g.enter(Principal{Name: "nobody"}); ok {
		t.Error("no role counts as a viewer, whose places are taken")
	}
	leaves[1]()
	leaves[2]()
	if len(g.held) != 1 || g.held["v2"] != 1 {
		t.Errorf("principals holding nothing stay in the map: %v", g.held)
	}
}

// TestGateConcurrent: under concurrent use a principal never holds more
// than its cap, and every place comes back (run with -race).
func TestGateConcurrent(t *testing.T) {
	g := newGate("x", "things", 2, 5, 8, time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	most := map[string]int{}
	for w := range 8 {
		wg.Go(func() {
			p := Principal{Name: "p" + strconv.Itoa(w%3), Role: Role(1 + w%2)}
			for range 500 {
				leave, _, _, ok := g.enter(p)
				if !ok {
					continue
				}
				g.mu.Lock()
				n := g.held[p.Name]
				g.mu.Unlock()
				mu.Lock()
				most[p.Name] = max(most[p.Name], n)
				mu.Unlock()
				leave()
			}
		})
	}
	wg.Wait()
	for name, n := range most {
		if n > 2 {
			t.Errorf("%s held %d places, its cap is 2", name, n)
		}
	}
	if len(g.held) != 0 || len(g.all) != 0 || len(g.byRole[RoleViewer])+len(g.byRole[RoleOperator]) != 0 {
		t.Errorf("places not given back: held %v, all %d", g.held, len(g.all))
	}
}
