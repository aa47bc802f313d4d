package web

import (
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/recommend"
	"github.com/dualflow/dualflow/test/support/reloadtest"
	"github.com/dualflow/dualflow/web/api"
)

type nopStore struct{}

func (nopStore) Query(context.Context, string, string) ([]byte, error) { return nil, nil }

func TestLoopbackWithoutTokens(t *testing.T) {
	for _, tc := range []struct{ addr, want string }{
		{"0.0.0.0:8080", "127.0.0.1:8080"},
		{"[::]:8080", "127.0.0.1:8080"},
		{":8080", "127.0.0.1:8080"},
		{"127.0.0.1:9000", "127.0.0.1:9000"},
		{"[::1]:9000", "[::1]:9000"},
	} {
		s, err := New(Config{Addr: tc.addr, Config: api.Config{Store: nopStore{}}})
		if err != nil {
			t.Fatal(err)
		}
		if s.Addr() != tc.want {
			t.Errorf("%s: listens on %s, want %s", tc.addr, s.Addr(), tc.want)
		}
	}
	if _, err := New(Config{Addr: "nonsense", Config: api.Config{Store: nopStore{}}}); err == nil {
		t.Error("bad address accepted")
	}
}

func TestTokensFileAndRun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("# viewers and operators\nv-tok viewer alice\no-tok operator bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := New(Config{Addr: "[::]:0", TokensFile: path, Config: api.Config{Store: nopStore{}}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Addr() != "[::]:0" {
		t.Errorf("with tokens the address is kept: %s", s.Addr())
	}
	for _, bad := range []string{"lonely\n", "tok admin\n"} {
		p := filepath.Join(t.TempDir(), "bad")
		os.WriteFile(p, []byte(bad), 0o600)
		if _, err := New(Config{TokensFile: p, Config: api.Config{Store: nopStore{}}}); err == nil {
			t.Errorf("token file %q accepted", bad)
		}
	}
	// Run on loopback, check the UI and an authenticated call, then stop.
	s, err = New(Config{Addr: "127.0.0.1:0", TokensFile: path, Config: api.Config{Store: nopStore{}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ln, err := net.Listen("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- s.Serve(ctx, ln) }()
	base := "http://" + ln.Addr().String()
	get := func(path, tok string) (int, string) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, string(b)
	}
	if code, body := get("/", ""); code != 200 || !strings.Contains(body, "dualflow") {
		t.Errorf("UI: %d", code)
	}
	if code, _ := get("/flows-page-reload", ""); code != 200 {
		t.Errorf("unknown UI path: %d", code)
	}
	if code, _ := get("/api/v1/whoami", ""); code != 401 {
		t.Errorf("whoami without token: %d", code)
	}
	if code, body := get("/api/v1/whoami", "o-tok"); code != 200 || !strings.Contains(body, `"role":"operator"`) || !strings.Contains(body, "bob") {
		t.Errorf("whoami: %d %s", code, body)
	}
	// A follow stream must not hold up shutdown.
	req, _ := http.NewRequest("GET", base+"/api/v1/flows?follow=true", nil)
	req.Header.Set("Authorization", "Bearer v-tok")
	r, err := http.DefaultClient.Do(req)
	if err != nil || r.StatusCode != 200 {
		t.Fatalf("follow: %v", err)
	}
	defer r.Body.Close()
	start := time.Now()
	cancel()
	if err := <-done; err != nil {
		t.Error(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("shutdown took %s with a follow stream open", d)
	}
}

// TestTokensFileMode: the server does not start on a tokens file group or
// others may read (the tokens are secrets).
func TestTokensFileMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("o-tok operator bob\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Addr: "[::]:0", TokensFile: path, Config: api.Config{Store: nopStore{}}}); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a 0644 tokens file: %v, want a refusal saying chmod 600", err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Addr: "[::]:0", TokensFile: path, Config: api.Config{Store: nopStore{}}}); err != nil {
		t.Errorf("a 0600 tokens file: %v", err)
	}
}

// TestTokensFileReload: the server follows its tokens file, mounted from
// a Secret and rotated the way the kubelet does it: the old token stops
// working, the new one works, without a restart; /metrics counts the
// reload.
func TestTokensFileReload(t *testing.T) {
	v := reloadtest.NewVolume(t, 0o440, map[string][]byte{"tokens": []byte("old-tok operator bob\n")})
	reg := prometheus.NewRegistry()
	s, err := New(Config{Addr: "127.0.0.1:0", TokensFile: v.Path("tokens"), Config: api.Config{Store: nopStore{}, Registerer: reg, Gatherer: reg}})
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler()
	code := func(tok string) int {
		req := httptest.NewRequest("GET", "http://127.0.0.1/api/v1/whoami", nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	if code("old-tok") != 200 || code("new-tok") != 401 {
		t.Fatalf("before: old %d new %d", code("old-tok"), code("new-tok"))
	}
	v.Update(map[string][]byte{"tokens": []byte("new-tok operator bob\n")})
	deadline := time.Now().Add(30 * time.Second) // the file is checked once a second
	for code("old-tok") != 401 || code("new-tok") != 200 {
		if time.Now().After(deadline) {
			t.Fatalf("after the rotation: old %d new %d", code("old-tok"), code("new-tok"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	want := `
# HELP dualflow_file_reloads_total Changed certificate, key, CA or token files loaded without a restart, by name (ipfix-server, web-tokens, …).
# TYPE dualflow_file_reloads_total counter
dualflow_file_reloads_total{name="web-tokens"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "dualflow_file_reloads_total"); err != nil {
		t.Error(err)
	}
}

// TestLimitFlags: the --web.sql.*, --web.follow.*, --web.whatif.* and
// --web.reachability.* flags fill Limits (with the api and audit
// defaults), and the server enforces them.
func TestLimitFlags(t *testing.T) {
	var l api.Limits
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	l.BindFlags(fs)
	if l != (api.Limits{SQLConcurrency: api.DefaultSQLConcurrency, SQLMaxThreads: api.DefaultSQLMaxThreads,
		FollowStreams: api.DefaultFollowStreams, FollowStreamsPerRole: api.DefaultFollowStreamsPerRole,
		SQLConcurrencyPerToken: api.DefaultSQLConcurrencyPerToken, FollowStreamsPerToken: api.DefaultFollowStreamsPerToken,
		WhatIfConcurrency: api.DefaultWhatIfConcurrency, WhatIfConcurrencyPerToken: api.DefaultWhatIfConcurrencyPerToken,
		WhatIfMaxChecks: audit.DefaultWhatIfMaxChecks, WhatIfMaxFlowGroups: audit.DefaultWhatIfMaxFlowGroups, RecommendMaxFlowGroups: recommend.DefaultMaxFlowGroups,
		ReachabilityConcurrency: api.DefaultReachabilityConcurrency, ReachabilityConcurrencyPerToken: api.DefaultReachabilityConcurrencyPerToken,
		ReachabilityMaxChecks: audit.DefaultReachabilityMaxChecks}) {
		t.Errorf("defaults %+v", l)
	}
	if err := fs.Parse([]string{"--web.sql.max-concurrent=3", "--web.sql.max-threads=1", "--web.follow.max-streams=1", "--web.follow.max-streams-per-role=1",
		"--web.sql.max-concurrent-per-token=2", "--web.follow.max-streams-per-token=1",
		"--web.whatif.max-concurrent=3", "--web.whatif.max-concurrent-per-token=2", "--web.whatif.max-checks=1000", "--web.whatif.max-flow-groups=10",
		"--web.recommend.max-flow-groups=20", "--web.reachability.max-concurrent=5", "--web.reachability.max-concurrent-per-token=3", "--web.reachability.max-checks=2000"}); err != nil {
		t.Fatal(err)
	}
	if l != (api.Limits{SQLConcurrency: 3, SQLMaxThreads: 1, FollowStreams: 1, FollowStreamsPerRole: 1, SQLConcurrencyPerToken: 2, FollowStreamsPerToken: 1,
		WhatIfConcurrency: 3, WhatIfConcurrencyPerToken: 2, WhatIfMaxChecks: 1000, WhatIfMaxFlowGroups: 10, RecommendMaxFlowGroups: 20,
		ReachabilityConcurrency: 5, ReachabilityConcurrencyPerToken: 3, ReachabilityMaxChecks: 2000}) {
		t.Errorf("parsed %+v", l)
	}
	s, err := New(Config{Addr: "127.0.0.1:0", Config: api.Config{Store: nopStore{}, Limits: l}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	follow := func() *http.Response {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/v1/flows?follow=true", nil)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	first := follow()
	defer first.Body.Close()
	second := follow()
	second.Body.Close()
	if first.StatusCode != 200 || second.StatusCode != http.StatusTooManyRequests {
		t.Errorf("with --web.follow.max-streams=1: streams answered %d and %d, want 200 and 429", first.StatusCode, second.StatusCode)
	}
}

// TestDNSRebinding: a page of the attacker's name rebound to the server's
// address is same-origin with itself; the server answers only to IP
// literals, localhost and the names it is given.
func TestDNSRebinding(t *testing.T) {
	s, err := New(Config{Addr: "127.0.0.1:0", AllowedHosts: []string{"dualflow.example"}, Config: api.Config{Store: nopStore{}}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		host string
		code int
	}{
		{"attacker.example:8080", http.StatusForbidden},
		{"127.0.0.1.attacker.example", http.StatusForbidden},
		{"127.0.0.1:8080", http.StatusOK},
		{"[::1]:8080", http.StatusOK},
		{"localhost:8080", http.StatusOK},
		{"dualflow.example", http.StatusOK},
		{"DUALFLOW.example:8080", http.StatusOK},
	} {
		for _, path := range []string{"/api/v1/whoami", "/", "/metrics"} {
			req, _ := http.NewRequest("GET", "http://127.0.0.1:8080"+path, nil)
			req.Host = tc.host
			req.Header.Set("Sec-Fetch-Site", "same-origin")
			req.Header.Set("Origin", "http://"+tc.host)
			rec := httptest.NewRecorder()
			s.Handler().ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Errorf("Host %s %s: %d, want %d", tc.host, path, rec.Code, tc.code)
			}
		}
	}
}

// TestLocalRequestsAreViewers: without a tokens file every local user was
// an operator (SQL, traces); with the SQL that wrote files, an
// unprivileged user wrote a root-owned one. A request without a token is
// now a viewer; operator actions need the local operator token, which the
// server writes (mode 0600) for its own user to read.
func TestLocalRequestsAreViewers(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "data", LocalTokenFileName)
	sqlCalls := 0
	s, err := New(Config{Addr: "127.0.0.1:0", Config: api.Config{Store: nopStore{}, LocalTokenFile: tokenFile,
		SQL: sqlFunc(func() { sqlCalls++ })}})
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(tokenFile)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("local token file: %v %v, want mode 0600", err, fi)
	}
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatal(err)
	}
	req := func(method, path, body, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, "http://127.0.0.1"+path, strings.NewReader(body))
		if body != "" {
			r.Header.Set("Content-Type", "application/json")
		}
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		s.Handler().ServeHTTP(w, r)
		return w
	}
	if w := req("GET", "/api/v1/whoami", "", ""); w.Code != 200 || !strings.Contains(w.Body.String(), `"role":"viewer"`) {
		t.Errorf("whoami without a token: %d %s", w.Code, w.Body)
	}
	for _, op := range []struct{ path, body string }{
		{"/api/v1/sql", `{"query":"SELECT 1"}`},
		{"/api/v1/traceflows", `{}`},
	} {
		w := req("POST", op.path, op.body, "")
		if w.Code != 401 || !strings.Contains(w.Body.String(), tokenFile) {
			t.Errorf("%s without a token: %d %s, want 401 naming %s", op.path, w.Code, w.Body, tokenFile)
		}
	}
	if sqlCalls != 0 {
		t.Errorf("SQL ran %d times for a viewer", sqlCalls)
	}
	if w := req("POST", "/api/v1/sql", `{"query":"SELECT 1"}`, strings.TrimSpace(string(tok))); w.Code == 401 || w.Code == 403 {
		t.Errorf("SQL with the local operator token: %d %s", w.Code, w.Body)
	}
	// The token survives a restart; a loose file is refused.
	if _, err := New(Config{Addr: "127.0.0.1:0", Config: api.Config{Store: nopStore{}, LocalTokenFile: tokenFile}}); err != nil {
		t.Fatal(err)
	}
	if again, _ := os.ReadFile(tokenFile); string(again) != string(tok) {
		t.Errorf("the token changed at a restart")
	}
	if err := os.Chmod(tokenFile, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Config{Addr: "127.0.0.1:0", Config: api.Config{Store: nopStore{}, LocalTokenFile: tokenFile}}); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("a 0644 local token file: %v", err)
	}
}

// sqlFunc is an api.SQLRunner that counts its calls and answers nothing.
type sqlFunc func()

func (f sqlFunc) RunSQL(context.Context, string, string, map[string]string) ([]byte, error) {
	f()
	return []byte(`{"meta":[],"data":[]}`), nil
}
