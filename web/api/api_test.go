package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/test/support/webtest"
	"github.com/dualflow/dualflow/traceflow"
)

// fakeStore answers every query with out (or err) and records the SQL.
type fakeStore struct {
	out  string
	err  error
	last string
}

func (f *fakeStore) Query(_ context.Context, q, _ string) ([]byte, error) {
	f.last = q
	return []byte(f.out), f.err
}

// fakeTracer traces as fakeEvaluator evaluates: frontend → db is dropped
// over IPv6.
type fakeTracer struct{ Traces }

func (fakeTracer) Trace(_ context.Context, r traceflow.Request) (traceflow.Result, error) {
	res := traceflow.Result{ID: "tf-0123456789abcdef", Request: r, Phase: traceflow.Succeeded}
	for _, f := range r.Family.Families() {
		fr := traceflow.FamilyResult{Family: f, Outcome: traceflow.Delivered}
		if f == traceflow.IPv6 && r.SourceWorkload == "shop/frontend" && r.Destination.Workload == "shop/db" {
			fr.Outcome = traceflow.Dropped
		}
		res.Families = append(res.Families, fr)
	}
	return res, nil
}

// fakeEvaluator evaluates each cell as one pod pair: frontend → db is
// denied over IPv6, v4only has no IPv6.
type fakeEvaluator struct{}

func (fakeEvaluator) EvaluateMatrix(_ context.Context, srcs, dsts []audit.Endpoint, _ uint8, _ uint16, _ ...[]uint16) ([][]map[int]*audit.FamilyPolicy, error) {
	out := make([][]map[int]*audit.FamilyPolicy, len(srcs))
	for i, src := range srcs {
		for _, dst := range dsts {
			vs := map[int]string{4: "not_isolated", 6: "not_isolated"}
			switch {
			case dst.Name == "db" && src.Name == "frontend":
				vs = map[int]string{4: "allowed", 6: "denied"}
			case dst.Name == "v4only":
				vs = map[int]string{4: "not_isolated", 6: ""}
			}
			cell := map[int]*audit.FamilyPolicy{}
			for fam, v := range vs {
				switch v {
				case "":
					cell[fam] = &audit.FamilyPolicy{Outcome: audit.OutcomeUnavailable, Reason: "no address of the family"}
				case "denied":
					cell[fam] = &audit.FamilyPolicy{Outcome: audit.OutcomeDeny, Total: 1, Summary: audit.PolicyVerdict{Verdict: v, Ingress: "shop/db-policy"}}
				default:
					cell[fam] = &audit.FamilyPolicy{Outcome: audit.OutcomeAllow, Allowed: 1, Total: 1, Summary: audit.PolicyVerdict{Verdict: v}}
				}
			}
			out[i] = append(out[i], cell)
		}
	}
	return out, nil
}

func testAPI(t testing.TB, cfg Config) http.Handler {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = needEngine(t)
	}
	if cfg.Now == nil {
		cfg.Now = func() time.Time { return seedNow }
	}
	if cfg.Tokens == nil && cfg.Anonymous == 0 {
		cfg.Anonymous = RoleOperator // tests of the API itself; auth_test.go tests roles
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a.Handler()
}

type resp struct {
	code int
	body string
	hdr  http.Header
}

func do(t testing.TB, h http.Handler, method, target, body string, hdr ...string) resp {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, target, r)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	return resp{w.Code, w.Body.String(), w.Header()}
}

func (r resp) String() string {
	b := r.body
	if len(b) > 300 {
		b = b[:300] + "…"
	}
	return fmt.Sprintf("%d %s", r.code, b)
}

func decode[T any](t testing.TB, r resp) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(r.body), &v); err != nil {
		t.Fatalf("decode %T from %d %q: %v", v, r.code, r.body, err)
	}
	return v
}

func TestFlowsFilters(t *testing.T) {
	h := testAPI(t, Config{})
	total := func(q string) (n int, fams map[int]int) {
		t.Helper()
		fams = map[int]int{}
		next := ""
		for page := 0; page < 100; page++ {
			u := "/api/v1/flows?limit=1000&" + q
			if next != "" {
				u += "&cursor=" + next
			}
			r := do(t, h, "GET", u, "")
			if r.code != 200 {
				t.Fatalf("%s: %v", u, r)
			}
			p := decode[FlowPage](t, r)
			for _, f := range p.Flows {
				fams[f.IPVersion]++
			}
			n += len(p.Flows)
			if next = p.Next; next == "" {
				return
			}
		}
		t.Fatalf("%s: too many pages", q)
		return
	}
	all, fams := total("")
	if all == 0 || fams[4] == 0 || fams[6] == 0 {
		t.Fatalf("seeded flows: %d %v", all, fams)
	}
	for _, tc := range []struct {
		name, q string
		check   func(n int, fams map[int]int) bool
	}{
		{"ip_version 6", "ip_version=6", func(n int, f map[int]int) bool { return n == fams[6] && f[4] == 0 }},
		{"ip_version 4 or 6", "ip_version=4,6", func(n int, _ map[int]int) bool { return n == all }},
		{"ip_version ipv6", "ip_version=ipv6", func(n int, f map[int]int) bool { return n == fams[6] && f[4] == 0 }},
		{"not ip_version 4", "not.ip_version=4", func(n int, _ map[int]int) bool { return n == fams[6] }},
		{"v4 CIDR", "dst_ip=198.18.3.0/24", func(n int, f map[int]int) bool { return n > 0 && f[6] == 0 }},
		{"v6 CIDR", "dst_ip=fd00:10:244:3::/64", func(n int, f map[int]int) bool { return n > 0 && f[4] == 0 }},
		{"both CIDRs", "dst_ip=198.18.3.0/24,fd00:10:244:3::/64", func(n int, f map[int]int) bool { return f[4] > 0 && f[6] > 0 }},
		{"v4 address", "src_ip=198.18.1.1", func(n int, f map[int]int) bool { return n > 0 && f[6] == 0 }},
		{"v6 address", "src_ip=fd00:10:244:1::2", func(n int, f map[int]int) bool { return n > 0 && f[4] == 0 }},
		{"verdict denied is v6 only", "verdict=denied", func(n int, f map[int]int) bool { return n > 0 && f[4] == 0 }},
		{"workload and port", "src_workload=shop/frontend&dst_port=5432", func(n int, f map[int]int) bool { return n > 0 && n < all }},
		{"label", "dst_label=app=dns", func(n int, _ map[int]int) bool { return n > 0 && n < all }},
		{"not label", "not.dst_label=app=dns", func(n int, _ map[int]int) bool { return n > 0 && n < all }},
		{"service", "service=shop/db", func(n int, f map[int]int) bool { return n > 0 && f[6] == 0 }},
		{"protocol UDP", "protocol=udp", func(n int, _ map[int]int) bool { return n > 0 && n < all }},
		{"policy", "policy=shop/db-policy", func(n int, _ map[int]int) bool { return n > 0 }},
		{"namespace either side", "namespace=infra", func(n int, _ map[int]int) bool { return n > 0 && n < all }},
		{"node", "src_node=node-b", func(n int, _ map[int]int) bool { return n > 0 && n < all }},
		{"injection is a value", "src_pod=x')%20OR%201=1%20--", func(n int, _ map[int]int) bool { return n == 0 }},
		{"time range", "since=" + seedNow.Add(-10*time.Minute).Format(time.RFC3339), func(n int, _ map[int]int) bool { return n > 0 && n < all/4 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, f := total(tc.q)
			if !tc.check(n, f) {
				t.Errorf("%s: %d rows %v (all %d %v)", tc.q, n, f, all, fams)
			}
		})
	}
	// Labels of every row in the CIDR match the filter.
	r := do(t, h, "GET", "/api/v1/flows?dst_ip=fd00:10:244:3::/64&limit=5", "")
	for _, f := range decode[FlowPage](t, r).Flows {
		if !strings.HasPrefix(f.DstIP, "fd00:10:244:3:") || f.IPVersion != 6 {
			t.Errorf("row outside the filter: %+v", f)
		}
	}
}

func TestFlowsPagination(t *testing.T) {
	h := testAPI(t, Config{})
	seen := map[string]bool{}
	next, last := "", int64(1<<62)
	pages := 0
	for {
		u := "/api/v1/flows?limit=97&src_workload=shop/frontend"
		if next != "" {
			u += "&cursor=" + next
		}
		p := decode[FlowPage](t, do(t, h, "GET", u, ""))
		for _, f := range p.Flows {
			id := f.Key + "@" + f.SrcIP
			if seen[id] {
				t.Fatalf("row repeated across pages: %s", id)
			}
			seen[id] = true
			if f.FlowEndMs > last {
				t.Fatalf("not newest first: %d after %d", f.FlowEndMs, last)
			}
			last = f.FlowEndMs
		}
		pages++
		if next = p.Next; next == "" {
			break
		}
	}
	if pages < 3 {
		t.Errorf("only %d pages", pages)
	}
}

// TestFlowsPaginationTies pages through rows that all share one flow_end.
func TestFlowsPaginationTies(t *testing.T) {
	e := needEngine(t)
	tieAt := seedNow.Add(-72 * time.Hour)
	if err := e.Exec(context.Background(), webtest.SeedSQL("dualflow", 500, tieAt, 0)); err != nil {
		t.Fatal(err)
	}
	h := testAPI(t, Config{})
	window := "&since=" + tieAt.Add(-time.Minute).Format(time.RFC3339) + "&until=" + tieAt.Add(time.Minute).Format(time.RFC3339)
	seen := map[string]bool{}
	next := ""
	for page := 0; page < 100; page++ {
		u := "/api/v1/flows?limit=37" + window
		if next != "" {
			u += "&cursor=" + next
		}
		p := decode[FlowPage](t, do(t, h, "GET", u, ""))
		for _, f := range p.Flows {
			id := f.Key + f.SrcIP + f.DstIP + strconv.Itoa(f.SrcPort)
			if seen[id] {
				t.Fatalf("page %d repeats %s", page, id)
			}
			seen[id] = true
		}
		if next = p.Next; next == "" {
			break
		}
	}
	var want int
	out, err := e.Query(context.Background(), "SELECT count() FROM dualflow.flows WHERE flow_end = fromUnixTimestamp64Milli("+strconv.FormatInt(tieAt.UnixMilli(), 10)+", 'UTC')", "TSV")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Sscan(string(out), &want)
	if len(seen) != want || want < 400 {
		t.Errorf("paged %d rows of %d tied rows", len(seen), want)
	}
}

func TestBadInput4xx(t *testing.T) {
	h := testAPI(t, Config{SQL: needEngine(t), Evaluator: fakeEvaluator{}})
	for _, tc := range []struct {
		method, url, body, field string
	}{
		{"GET", "/api/v1/flows?ip_version=5", "", "ip_version"},
		{"GET", "/api/v1/flows?ip_version=dual", "", "ip_version"},
		{"GET", "/api/v1/flows?src_ip=198.18.0.300", "", "src_ip"},
		{"GET", "/api/v1/flows?dst_ip=fd00:10::/129", "", "dst_ip"},
		{"GET", "/api/v1/flows?dst_ip=fd00:10::1%25eth0", "", "dst_ip"},
		{"GET", "/api/v1/flows?port=70000", "", "port"},
		{"GET", "/api/v1/flows?port=90-80", "", "port"},
		{"GET", "/api/v1/flows?protocol=bogus", "", "protocol"},
		{"GET", "/api/v1/flows?verdict=maybe", "", "verdict"},
		{"GET", "/api/v1/flows?colour=red", "", "colour"},
		{"GET", "/api/v1/flows?limit=0", "", "limit"},
		{"GET", "/api/v1/flows?cursor=!!!", "", "cursor"},
		{"GET", "/api/v1/flows?cursor=bm90LWEtY3Vyc29y", "", "cursor"},
		{"GET", "/api/v1/flows?since=yesterday", "", "since"},
		{"GET", "/api/v1/flows?since=1h&until=2h", "", "since"},
		{"GET", "/api/v1/flows/summary?step=1ms&since=24h", "", "step"},
		{"GET", "/api/v1/servicemap?limit=100000", "", "limit"},
		{"POST", "/api/v1/reachability", "{", "body"},
		{"POST", "/api/v1/reachability", `{"sources":[{"kind":"pod","namespace":"a","name":"b"}],"destinations":[{"kind":"pod","namespace":"a","name":"c"}],"prot":"TCP"}`, "prot"},
		{"POST", "/api/v1/reachability", `{"sources":[],"destinations":[{"kind":"pod","namespace":"a","name":"b"}]}`, "sources"},
		{"POST", "/api/v1/reachability", `{"sources":[{"kind":"service","namespace":"a","name":"b"}],"destinations":[{"kind":"pod","namespace":"a","name":"b"}]}`, "sources[0]"},
		{"POST", "/api/v1/reachability", `{"sources":[{"kind":"pod","namespace":"a","name":"b"}],"destinations":[{"kind":"ip","name":"nope"}]}`, "destinations[0]"},
		{"POST", "/api/v1/reachability", `{"sources":[{"kind":"pod","namespace":"a","name":"b"}],"destinations":[{"kind":"pod","namespace":"a","name":"c"}],"protocol":"xyz"}`, "protocol"},
		{"POST", "/api/v1/reachability", `{"sources":[{"kind":"pod","namespace":"a","name":"b"}],"destinations":[{"kind":"pod","namespace":"a","name":"c"}],"protocol":"ICMP","port":8}`, "port"},
		{"POST", "/api/v1/sql", `{"query":"SELECT 1","max_row":5}`, "max_row"},
		{"POST", "/api/v1/sql", `{"query":""}`, "query"},
		{"POST", "/api/v1/sql", `{"query":"SELEC 1"}`, "query"},
		{"POST", "/api/v1/sql", `{"query":"SELECT 1","format":"xml"}`, "format"},
		{"POST", "/api/v1/sql", `{"query":"SELECT * FROM dualflow.nope"}`, "query"},
	} {
		r := do(t, h, tc.method, tc.url, tc.body)
		if r.code < 400 || r.code >= 500 {
			t.Errorf("%s %s %s: %v", tc.method, tc.url, tc.body, r)
			continue
		}
		e := decode[errorBody](t, r)
		if e.Message == "" || e.Field != tc.field {
			t.Errorf("%s %s %s: error %+v, want field %q", tc.method, tc.url, tc.body, e, tc.field)
		}
	}
	if r := do(t, h, "GET", "/api/v1/nope", ""); r.code != 404 || !strings.Contains(r.body, "message") {
		t.Errorf("404: %d %s", r.code, r.body)
	}
}

func TestSQLReadOnlyAndLimits(t *testing.T) {
	e := needEngine(t)
	h := testAPI(t, Config{SQL: e, SQLMaxRows: 50})
	r := do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT ip_version, count() AS n FROM flows GROUP BY ip_version ORDER BY ip_version"}`)
	if r.code != 200 {
		t.Fatalf("select: %d %s", r.code, r.body)
	}
	res := decode[SQLResult](t, r)
	if len(res.Columns) != 2 || res.Columns[1].Name != "n" || len(res.Rows) != 2 || res.Limits.MaxRows != 50 {
		t.Errorf("result %+v", res)
	}
	for name, q := range map[string]string{
		"insert":         "INSERT INTO dualflow.flows (ip_version) VALUES (4)",
		"drop":           "DROP TABLE dualflow.flows",
		"create":         "CREATE TABLE dualflow.x (a UInt8) ENGINE = Memory",
		"truncate":       "TRUNCATE TABLE dualflow.flows",
		"lift the limit": "SELECT number FROM numbers(100) SETTINGS max_result_rows = 1000",
		"readonly=0":     "SELECT 1 SETTINGS readonly = 0",
		"table function": "SELECT * FROM file('/etc/hostname', 'LineAsString')",
		"memory":         "SELECT groupArray(repeat('x', 1000)) FROM numbers(10000000)",
		"set":            "SET max_result_rows = 0",
	} {
		r := do(t, h, "POST", "/api/v1/sql", `{"query":`+jsonString(q)+`}`)
		if r.code != 400 {
			t.Errorf("%s: %d %s", name, r.code, r.body)
		}
	}
	// Past the row limit: the first rows and the truncated flag; exactly
	// at it: every row, not truncated.
	for _, tc := range []struct {
		query     string
		rows      int
		truncated bool
	}{
		{"SELECT number FROM numbers(100)", 50, true},
		{"SELECT number FROM numbers(1000000)", 50, true},
		{"SELECT number FROM numbers(50)", 50, false},
		{"SELECT number FROM numbers(49)", 49, false},
	} {
		r := do(t, h, "POST", "/api/v1/sql", `{"query":`+jsonString(tc.query)+`}`)
		res := decode[SQLResult](t, r)
		if r.code != 200 || len(res.Rows) != tc.rows || res.Truncated != tc.truncated || (tc.rows > 0 && fmt.Sprint(res.Rows[0][0]) != "0") {
			t.Errorf("%s: %d, %d rows, truncated %v; want 200, %d rows, truncated %v", tc.query, r.code, len(res.Rows), res.Truncated, tc.rows, tc.truncated)
		}
		if !strings.Contains(r.body, `"truncated":`+strconv.FormatBool(tc.truncated)) {
			t.Errorf("%s: body %.200s has no truncated flag", tc.query, r.body)
		}
	}
	// CSV: the header and the first rows, byte for byte, cut between
	// records even when one spans lines; the header says it was cut.
	for _, tc := range []struct {
		query, want, truncated string
	}{
		{"SELECT number AS n, if(number = 1, 'a\\nb', 'c') AS s FROM numbers(100)", "\"n\",\"s\"\n0,\"c\"\n1,\"a\nb\"\n2,\"c\"\n", "true"},
		{"SELECT number AS n FROM numbers(3)", "\"n\"\n0\n1\n2\n", "false"},
	} {
		small := testAPI(t, Config{SQL: e, SQLMaxRows: 3})
		r := do(t, small, "POST", "/api/v1/sql", `{"format":"csv","query":`+jsonString(tc.query)+`}`)
		if r.code != 200 || r.body != tc.want || r.hdr.Get("X-Dualflow-Truncated") != tc.truncated {
			t.Errorf("csv %s: %d %q truncated %q; want %q truncated %s", tc.query, r.code, r.body, r.hdr.Get("X-Dualflow-Truncated"), tc.want, tc.truncated)
		}
	}
	r = do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT count() AS n FROM flows"}`)
	if res := decode[SQLResult](t, r); r.code != 200 || len(res.Rows) != 1 || res.Rows[0][0] == "0" {
		t.Errorf("count after the refused statements: %v", r)
	}
	// What readonly=1 lets through on the embedded engine: files written
	// and read, programs, the network, KILL of the collector's inserts,
	// and a second statement after the first.
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for name, q := range map[string]string{
		"outfile":           "SELECT 'owned' INTO OUTFILE '" + victim + ".new' FORMAT RawBLOB",
		"outfile append":    "SELECT 'owned' INTO OUTFILE '" + victim + "' APPEND FORMAT RawBLOB",
		"outfile truncate":  "SELECT 'owned' INTO OUTFILE '" + victim + "' TRUNCATE FORMAT RawBLOB",
		"file read":         "SELECT * FROM file('" + victim + "', 'LineAsString')",
		"file function":     "SELECT file('" + victim + "')",
		"executable":        "SELECT * FROM executable('id', 'TSV', 'a String')",
		"url":               "SELECT * FROM url('http://127.0.0.1:1/', 'CSV', 'a String')",
		"kill":              "KILL QUERY WHERE 1",
		"second statement":  "SELECT 1; SELECT 'owned' INTO OUTFILE '" + victim + ".2' FORMAT RawBLOB",
		"hidden in comment": "SELECT 1 /* a */ INTO /* b */ OUTFILE '" + victim + ".3'",
	} {
		r := do(t, h, "POST", "/api/v1/sql", `{"query":`+jsonString(q)+`}`)
		if r.code != 400 || !strings.Contains(r.body, `"field":"query"`) {
			t.Errorf("%s: %d %s, want 400 refused", name, r.code, r.body)
		}
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep\n" {
		t.Errorf("victim file after the attacks: %q %v", b, err)
	}
	for _, f := range []string{".new", ".2", ".3"} {
		if _, err := os.Stat(victim + f); err == nil {
			t.Errorf("the attacks wrote %s", victim+f)
		}
	}
	r = do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT ip_version, count() FROM flows GROUP BY ip_version ORDER BY 1","format":"csv"}`)
	if r.code != 200 || !strings.HasPrefix(r.body, "\"ip_version\",\"count()\"\n4,") || !strings.Contains(r.hdr.Get("Content-Disposition"), "attachment") {
		t.Errorf("csv: %d %q", r.code, r.body)
	}
}

func jsonString(s string) string { b, _ := json.Marshal(s); return string(b) }

func TestAuthRoles(t *testing.T) {
	tok := &Tokens{}
	tok.Add("view-secret", Principal{Name: "v", Role: RoleViewer})
	tok.Add("op-secret", Principal{Name: "o", Role: RoleOperator})
	h := testAPI(t, Config{Store: &fakeStore{out: `{"si":0}` + "\n"}, Tokens: tok, SQL: fakeEngineNil{}})
	for _, tc := range []struct {
		method, url, body, token string
		code                     int
	}{
		{"GET", "/healthz", "", "", 200},
		{"GET", "/api/v1/openapi.json", "", "", 200},
		{"GET", "/api/v1/flows", "", "", 401},
		{"GET", "/api/v1/flows", "", "wrong", 401},
		{"GET", "/api/v1/flows", "", "view-secret", 200},
		{"GET", "/metrics", "", "", 401},
		{"GET", "/metrics", "", "view-secret", 200},
		{"POST", "/api/v1/sql", `{"query":"SELECT 1"}`, "view-secret", 403},
		{"GET", "/api/v1/whoami", "", "op-secret", 200},
	} {
		var hdr []string
		if tc.token != "" {
			hdr = []string{"Authorization", "Bearer " + tc.token}
		}
		if r := do(t, h, tc.method, tc.url, tc.body, hdr...); r.code != tc.code {
			t.Errorf("%s %s as %q: %d %s, want %d", tc.method, tc.url, tc.token, r.code, r.body, tc.code)
		}
	}
	// A cross-site browser request is refused even with a token.
	if r := do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT 1"}`, "Authorization", "Bearer op-secret", "Sec-Fetch-Site", "cross-site"); r.code != 403 {
		t.Errorf("cross-site: %d", r.code)
	}
}

type fakeEngineNil struct{}

func (fakeEngineNil) RunSQL(context.Context, string, string, map[string]string) ([]byte, error) {
	return []byte(`{"meta":[{"name":"1","type":"UInt8"}],"data":[[1]]}`), nil
}

func TestHealthReadyMetrics(t *testing.T) {
	h := testAPI(t, Config{Store: &fakeStore{}})
	if r := do(t, h, "GET", "/readyz", ""); r.code != 200 {
		t.Errorf("readyz: %d", r.code)
	}
	do(t, h, "GET", "/api/v1/flows", "")
	if r := do(t, h, "GET", "/metrics", ""); r.code != 200 || !strings.Contains(r.body, `dualflow_web_requests_total{route="/api/v1/flows",status="200"} 1`) {
		t.Errorf("metrics: %d %s", r.code, r.body)
	}
	bad := testAPI(t, Config{Store: &fakeStore{err: errors.New("engine gone")}})
	if r := do(t, bad, "GET", "/readyz", ""); r.code != 503 {
		t.Errorf("readyz down: %d", r.code)
	}
	if r := do(t, bad, "GET", "/api/v1/flows", ""); r.code != 502 || !strings.Contains(r.body, "engine gone") {
		t.Errorf("store down: %d %s", r.code, r.body)
	}
	var spec map[string]any
	r := do(t, h, "GET", "/api/v1/openapi.json", "")
	if err := json.Unmarshal([]byte(r.body), &spec); err != nil || spec["openapi"] != "3.0.3" {
		t.Errorf("openapi: %v", err)
	}
	paths := spec["paths"].(map[string]any)
	for _, p := range []string{"/flows", "/flows/summary", "/servicemap", "/reachability", "/traceflows", "/audit/findings", "/sql", "/status", "/catalog"} {
		if paths[p] == nil {
			t.Errorf("openapi lacks %s", p)
		}
	}
}

func TestSummaryAndServiceMap(t *testing.T) {
	h := testAPI(t, Config{})
	s := decode[Summary](t, do(t, h, "GET", "/api/v1/flows/summary?step=5m", ""))
	if s.StepSeconds != 300 || len(s.Series) == 0 || len(s.Talkers) == 0 {
		t.Fatalf("summary %+v", s)
	}
	fam := map[int]FamilyTotal{}
	for _, f := range s.Families {
		fam[f.IPVersion] = f
	}
	if fam[4].Flows == 0 || fam[6].Flows == 0 || fam[6].Dropped == 0 || fam[4].Dropped != 0 {
		t.Errorf("families %+v", s.Families)
	}
	if s.DropsByPolicy != nil {
		t.Errorf("drops by policy not asked for: %+v", s.DropsByPolicy)
	}
	// Drops by policy are counted in the store: every dropped flow of the
	// window (the lab's IPv6 frontend → db, denied by shop/db-policy).
	for _, tc := range []struct{ q, want string }{
		{"", "shop/db-policy"},
		{"&ip_version=6", "shop/db-policy"},
		{"&ip_version=4", ""},
	} {
		s := decode[Summary](t, do(t, h, "GET", "/api/v1/flows/summary?policies=5"+tc.q, ""))
		var total uint64
		for _, f := range s.Families {
			total += f.Dropped
		}
		if tc.want == "" {
			if len(s.DropsByPolicy) != 0 || total != 0 {
				t.Errorf("%s: drops by policy %+v, %d dropped", tc.q, s.DropsByPolicy, total)
			}
			continue
		}
		if len(s.DropsByPolicy) != 1 || s.DropsByPolicy[0].Policy != tc.want || s.DropsByPolicy[0].IPVersion != 6 || s.DropsByPolicy[0].Dropped != total {
			t.Errorf("%s: drops by policy %+v, want %s with all %d dropped", tc.q, s.DropsByPolicy, tc.want, total)
		}
	}
	m := decode[ServiceMap](t, do(t, h, "GET", "/api/v1/servicemap", ""))
	var dropped6, svc bool
	for _, e := range m.Edges {
		if e.Src == "shop/frontend" && e.Dst == "shop/db" && e.IPVersion == 6 && e.Verdict == "dropped" {
			dropped6 = true
		}
		if e.Dst == "svc:shop/cart" {
			svc = true
		}
	}
	if !dropped6 || !svc || len(m.Nodes) < 4 {
		t.Errorf("service map %+v", m)
	}
	// group=node: the same edges, split by the nodes of their ends, in
	// both families; the flows add up to the ungrouped map's.
	g := decode[ServiceMap](t, do(t, h, "GET", "/api/v1/servicemap?group=node", ""))
	sum := func(m ServiceMap) map[string]uint64 {
		out := map[string]uint64{}
		for _, e := range m.Edges {
			out[fmt.Sprint(e.Src, e.Dst, e.IPVersion, e.Verdict)] += e.Flows
		}
		return out
	}
	noded := map[int]bool{}
	for _, e := range g.Edges {
		if e.SrcNode != "" && strings.Contains(e.Src, "/") {
			noded[e.IPVersion] = true
		}
		if e.SrcNode != "" && !strings.Contains(e.Src, "/") {
			t.Errorf("an outside address on node %q: %+v", e.SrcNode, e)
		}
	}
	if !maps.Equal(sum(m), sum(g)) || !noded[4] || !noded[6] {
		t.Errorf("group=node %+v (nodes per family %v)", g.Edges, noded)
	}
	if r := do(t, h, "GET", "/api/v1/servicemap?group=pod", ""); r.code != 400 || !strings.Contains(r.body, `"group"`) {
		t.Errorf("group=pod: %d %s", r.code, r.body)
	}
}

func TestReachability(t *testing.T) {
	h := testAPI(t, Config{Evaluator: fakeEvaluator{}, Traces: fakeTracer{}})
	req := `{"sources":[{"kind":"workload","namespace":"shop","name":"frontend"},{"kind":"workload","namespace":"shop","name":"cart"}],
	 "destinations":[{"kind":"workload","namespace":"shop","name":"db"},{"kind":"service","namespace":"shop","name":"cart"},{"kind":"ip","name":"fd00:10:244:3::/64"},{"kind":"workload","namespace":"x","name":"v4only"}],"since":"1h"}`
	r := do(t, h, "POST", "/api/v1/reachability", req)
	if r.code != 200 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	m := decode[Reachability](t, r)
	fdb := m.Cells[0][0]
	if !fdb.Asymmetric || fdb.Families["4"].Outcome != "allow" || fdb.Families["6"].Outcome != "deny" ||
		fdb.Families["6"].Observed.Verdicts["dropped"] == 0 || fdb.Families["4"].Observed.Flows == 0 {
		t.Errorf("frontend→db %+v", fdb)
	}
	if c := m.Cells[0][1]; c.Asymmetric || c.Families["4"].Observed.Flows == 0 || c.Families["6"].Observed.Flows == 0 {
		t.Errorf("frontend→svc cart %+v", c)
	}
	if c := m.Cells[0][2]; c.Families["6"].Observed.Flows == 0 || c.Families["4"].Observed.Flows != 0 {
		t.Errorf("frontend→v6 CIDR of db %+v %+v", c.Families["4"], c.Families["6"])
	}
	if c := m.Cells[1][3]; !c.Asymmetric || c.Families["6"].Outcome != "unavailable" {
		t.Errorf("cart→v4only %+v", c)
	}
	if m.Asymmetric < 2 {
		t.Errorf("asymmetric %d", m.Asymmetric)
	}
	// Live traces on request.
	r = do(t, h, "POST", "/api/v1/reachability", strings.Replace(req, `"since":"1h"`, `"trace":true`, 1))
	m = decode[Reachability](t, r)
	// One dual trace of the cell, each family's result in its family.
	if f4, f6 := m.Cells[0][0].Families["4"], m.Cells[0][0].Families["6"]; f6.Trace == nil || f6.Trace.Outcome != traceflow.Dropped || f6.Outcome != "deny" ||
		f4.Trace == nil || f4.Trace.Outcome != traceflow.Delivered || f6.TraceID == "" || f4.TraceID != f6.TraceID {
		t.Errorf("frontend→db traced %+v %+v", f4, f6)
	}
	// A family without a pair is not traced.
	if f4, f6 := m.Cells[1][3].Families["4"], m.Cells[1][3].Families["6"]; f4.Trace == nil || f6.Trace != nil || f6.TraceError != "" {
		t.Errorf("cart→v4only traced %+v %+v", f4, f6)
	}
	// A range is no trace's destination.
	if f := m.Cells[0][2].Families["6"]; f.Trace != nil || !strings.Contains(f.TraceError, "one address") {
		t.Errorf("frontend→CIDR traced %+v", f)
	}
}

// portsSeen records the ports observed it is given.
type portsSeen struct {
	fakeEvaluator
	got *[][]uint16
}

func (p portsSeen) EvaluateMatrix(ctx context.Context, srcs, dsts []audit.Endpoint, proto uint8, port uint16, observed ...[]uint16) ([][]map[int]*audit.FamilyPolicy, error) {
	*p.got = observed
	return p.fakeEvaluator.EvaluateMatrix(ctx, srcs, dsts, proto, port)
}

// TestReachabilityObservedPorts: a question on any port hands the
// evaluator the ports flows to each destination were seen on (for pods
// that declare none); a question on one port does not.
func TestReachabilityObservedPorts(t *testing.T) {
	var got [][]uint16
	h := testAPI(t, Config{Evaluator: portsSeen{got: &got}})
	req := `{"sources":[{"kind":"workload","namespace":"shop","name":"frontend"}],
	 "destinations":[{"kind":"workload","namespace":"shop","name":"db"},{"kind":"service","namespace":"shop","name":"cart"},{"kind":"ip","name":"fd00:10:244:3::/64"},{"kind":"workload","namespace":"x","name":"v4only"}]`
	if r := do(t, h, "POST", "/api/v1/reachability", req+`}`); r.code != 200 {
		t.Fatalf("%d %s", r.code, r.body)
	}
	want := [][]uint16{{5432}, {8080}, {5432}, nil}
	if len(got) != len(want) {
		t.Fatalf("observed %v, want %v", got, want)
	}
	for j := range want {
		if !slices.Equal(got[j], want[j]) {
			t.Errorf("destination %d: observed %v, want %v", j, got[j], want[j])
		}
	}
	if r := do(t, h, "POST", "/api/v1/reachability", req+`,"port":5432}`); r.code != 200 || got != nil {
		t.Errorf("one port: %d, observed %v", r.code, got)
	}
}

func TestAuditNotConfigured(t *testing.T) {
	none := testAPI(t, Config{Store: &fakeStore{}})
	if r := do(t, none, "GET", "/api/v1/audit/findings", ""); r.code != 501 {
		t.Errorf("no audit: %d", r.code)
	}
}

// TestUnknownFieldsCounted: a body field the request does not have is a
// 400 naming it, counted by reason.
func TestUnknownFieldsCounted(t *testing.T) {
	h := testAPI(t, Config{Store: &fakeStore{}})
	r := do(t, h, "POST", "/api/v1/reachability", `{"sources":[{"kind":"pod","namespace":"a","name":"x"}],"destinations":[{"kind":"ip","name":"198.18.0.1"}],"protocl":"udp"}`)
	if e := decode[errorBody](t, r); r.code != 400 || e.Field != "protocl" || !strings.Contains(e.Message, `unknown field "protocl"`) {
		t.Errorf("unknown field: %v", r)
	}
	m := do(t, h, "GET", "/metrics", "")
	if want := `dualflow_web_bad_requests_total{reason="unknown_field",route="/api/v1/reachability"} 1`; !strings.Contains(m.body, want) {
		t.Errorf("metrics lack %q", want)
	}
}

func TestFilterSQL(t *testing.T) {
	now := seedNow
	for _, tc := range []struct {
		q    string
		want []string
	}{
		{"src_ip=198.18.2.3", []string{"src_ip_bin = toIPv6('198.18.2.3')"}},
		{"src_ip=::ffff:198.18.2.3", []string{"src_ip_bin = toIPv6('198.18.2.3')"}},
		{"dst_ip=fd00:10::/32", []string{"dst_ip_bin BETWEEN toIPv6('fd00:10::') AND toIPv6('fd00:10:ffff:ffff:ffff:ffff:ffff:ffff')"}},
		{"dst_ip=::ffff:198.18.0.0/111", []string{"dst_ip_bin BETWEEN toIPv6('198.18.0.0') AND toIPv6('198.19.255.255')"}},
		{"pod=ns/p'x", []string{`(src_pod_namespace = 'ns' AND src_pod_name = 'p\'x')`, "OR"}},
		{"not.verdict=denied&ip_version=6", []string{"NOT ((ingress_verdict = 'denied' OR egress_verdict = 'denied'))", "(ip_version = 6)"}},
		{"src_label=app%3Dweb", []string{"src_pod_labels['app'] = 'web'"}},
		{"src_label=!tier", []string{"NOT mapContains(src_pod_labels, 'tier')"}},
		{"port=80-90", []string{"(src_port BETWEEN 80 AND 90 OR dst_port BETWEEN 80 AND 90)"}},
	} {
		q, _ := url.ParseQuery(tc.q)
		f, err := parseFilter(q, now)
		if err != nil {
			t.Errorf("%s: %v", tc.q, err)
			continue
		}
		w := strings.Join(f.where(), " AND ")
		for _, s := range tc.want {
			if !strings.Contains(w, s) {
				t.Errorf("%s: %s lacks %s", tc.q, w, s)
			}
		}
	}
}

// TestSchemaDoc: GET /schema serves docs/schema.md, the reference the
// SQL page lists: its column tables, the REST names and the examples.
func TestSchemaDoc(t *testing.T) {
	a, err := New(Config{Store: &fakeStore{}, Anonymous: RoleViewer})
	if err != nil {
		t.Fatal(err)
	}
	r := do(t, a.engine, "GET", "/api/v1/schema", "")
	if r.code != 200 || !strings.HasPrefix(r.hdr.Get("Content-Type"), "text/markdown") {
		t.Fatalf("%d %s", r.code, r.hdr.Get("Content-Type"))
	}
	for _, want := range []string{"## `flows`", "| column | type | meaning |", "## REST names and SQL columns", "| `src_namespace` /", "## Example queries", "```sql"} {
		if !strings.Contains(r.body, want) {
			t.Errorf("schema lacks %q", want)
		}
	}
}

// TestOpenAPICoversRoutes: every route under /api/v1 is documented with
// its method in openapi.json.
func TestOpenAPICoversRoutes(t *testing.T) {
	a, err := New(Config{Store: &fakeStore{}, Anonymous: RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Paths map[string]map[string]any `json:"paths"`
	}
	b, _ := openapiFS.ReadFile("openapi.json")
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, r := range a.engine.Routes() {
		p, ok := strings.CutPrefix(r.Path, "/api/v1")
		if !ok {
			continue
		}
		parts := strings.Split(p, "/")
		for i, s := range parts {
			if strings.HasPrefix(s, ":") {
				parts[i] = "{" + s[1:] + "}"
			}
		}
		p = strings.Join(parts, "/")
		if spec.Paths[p][strings.ToLower(r.Method)] == nil {
			t.Errorf("openapi.json lacks %s %s", r.Method, p)
		}
		n++
	}
	if n < 18 {
		t.Errorf("only %d routes under /api/v1", n)
	}
}

// TestOpenAPISchemas: the traceflow schemas name every JSON field of the
// types the trace routes read and write, and the audit's those of the
// findings, denied groups and what-if.
func TestOpenAPISchemas(t *testing.T) {
	var spec struct {
		Components struct {
			Schemas map[string]struct {
				Properties map[string]struct {
					Properties map[string]any `json:"properties"`
				} `json:"properties"`
			} `json:"schemas"`
		} `json:"components"`
	}
	b, _ := openapiFS.ReadFile("openapi.json")
	if err := json.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	s := spec.Components.Schemas
	for _, tc := range []struct {
		v     any
		props map[string]any
	}{
		{traceflow.Request{}, anyMap(s["TraceflowRequest"].Properties)},
		{traceflow.Destination{}, s["TraceflowRequest"].Properties["destination"].Properties},
		{traceflow.Result{}, anyMap(s["TraceflowResult"].Properties)},
		{traceflow.FamilyResult{}, anyMap(s["FamilyResult"].Properties)},
		{traceflow.Observation{}, anyMap(s["Observation"].Properties)},
		{audit.Finding{}, anyMap(s["Finding"].Properties)},
		{audit.DeniedGroup{}, anyMap(s["DeniedGroup"].Properties)},
		{audit.WhatIfReport{}, anyMap(s["WhatIfReport"].Properties)},
		{audit.WhatIfFlow{}, anyMap(s["WhatIfFlow"].Properties)},
		{audit.WhatIfCell{}, anyMap(s["WhatIfCell"].Properties)},
		{audit.WhatIfCellFamily{}, anyMap(s["WhatIfCellFamily"].Properties)},
		{audit.CellVerdict{}, anyMap(s["CellVerdict"].Properties)},
		{audit.WhatIfPair{}, anyMap(s["WhatIfPair"].Properties)},
		{audit.PairVerdict{}, anyMap(s["PairVerdict"].Properties)},
	} {
		typ := reflect.TypeOf(tc.v)
		for i := range typ.NumField() {
			name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
			if _, ok := tc.props[name]; !ok {
				t.Errorf("openapi.json: %s lacks %s", typ, name)
			}
		}
	}
}

func anyMap[V any](m map[string]V) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

// TestFlowsPagesEqualFullOrder: the pages (their minute bound from the
// scalar subquery, the engine's virtual-row reading) list exactly the rows
// of a plain ORDER BY flow_end DESC, key DESC over the window, on data in
// several overlapping parts, for filters of every selectivity, including
// none and one that matches nothing.
func TestFlowsPagesEqualFullOrder(t *testing.T) {
	e := needEngine(t)
	ctx := context.Background()
	at := seedNow.Add(-48 * time.Hour)
	for i, span := range []time.Duration{40 * time.Minute, 25 * time.Minute, 50 * time.Minute} {
		// Separate inserts: separate parts, overlapping in time.
		if err := e.Exec(ctx, webtest.SeedSQL("dualflow", 300+i*100, at.Add(-time.Duration(i)*7*time.Minute), span)); err != nil {
			t.Fatal(err)
		}
	}
	h := testAPI(t, Config{})
	a := &API{cfg: Config{Store: e}, table: "dualflow.flows"}
	if s := a.boundSettings(ctx); !strings.Contains(s, virtualRowSetting+" = 1") {
		t.Errorf("the engine knows %s, the bound's settings do not use it: %s", virtualRowSetting, s)
	}
	since, until := at.Add(-time.Hour), at.Add(time.Minute)
	window := "&since=" + since.Format(time.RFC3339) + "&until=" + until.Format(time.RFC3339)
	// ip_version and both namespaces fixed: the sort key's middle columns,
	// the shape of known wrong-order bugs of virtual-row reading.
	for _, q := range []string{"", "src_workload=shop/frontend", "protocol=UDP", "ip_version=6", "verdict=dropped&ip_version=4", "dst_port=1",
		"ip_version=4&src_namespace=shop&dst_namespace=shop"} {
		f, err := parseFilter(mustQuery(t, q+window), seedNow)
		if err != nil {
			t.Fatal(err)
		}
		out, err := e.Query(ctx, "SELECT toString("+keyExpr+") FROM dualflow.flows WHERE "+strings.Join(f.where(), " AND ")+" ORDER BY flow_end DESC, "+keyExpr+" DESC", "TSV")
		if err != nil {
			t.Fatal(err)
		}
		want := strings.Fields(string(out))
		for _, limit := range []int{9, 100} {
			var got []string
			next := ""
			for page := 0; page < 3000; page++ {
				u := "/api/v1/flows?limit=" + strconv.Itoa(limit) + "&" + q + window
				if next != "" {
					u += "&cursor=" + next
				}
				p := decode[FlowPage](t, do(t, h, "GET", u, ""))
				for _, fl := range p.Flows {
					got = append(got, fl.Key)
				}
				if next = p.Next; next == "" {
					break
				}
			}
			if strings.Join(got, ",") != strings.Join(want, ",") {
				t.Errorf("%q limit %d: pages list %d rows, the full order %d (or another order)", q, limit, len(got), len(want))
			}
		}
		if q == "dst_port=1" && len(want) != 0 {
			t.Errorf("dst_port=1 matched %d rows; the test wants a filter matching none", len(want))
		}
		if q == "" && len(want) < 1000 {
			t.Errorf("the window has %d rows, fewer than seeded", len(want))
		}
	}
}

// TestPageSettingsWithoutVirtualRow: a server without the setting, or a
// failed probe, gets the page query without it.
func TestPageSettingsWithoutVirtualRow(t *testing.T) {
	a := &API{cfg: Config{Store: storeFunc(func(context.Context, string, string) ([]byte, error) { return []byte("0\n"), nil })}}
	if s := a.boundSettings(context.Background()); s != jsonSettings {
		t.Errorf("settings %q", s)
	}
	a = &API{cfg: Config{Store: storeFunc(func(context.Context, string, string) ([]byte, error) { return nil, errors.New("down") })}}
	if s := a.boundSettings(context.Background()); s != jsonSettings || a.virtualRow.Load() != 0 {
		t.Errorf("settings %q after a failed probe (state %d)", s, a.virtualRow.Load())
	}
}

// TestFlowsPageReadAgainWhenShort: when the page's read finds fewer rows
// than the bound's saw (a replica behind the other, on a cluster), the
// page is read again without the bound rather than ending the pagination.
func TestFlowsPageReadAgainWhenShort(t *testing.T) {
	e := needEngine(t)
	reg := prometheus.NewRegistry()
	var bounded int
	behind := storeFunc(func(ctx context.Context, q, format string) ([]byte, error) {
		// The first page read (the bounded one) finds nothing.
		if strings.HasPrefix(q, "SELECT "+flowColumns) && strings.Contains(q, " ORDER BY toStartOfMinute(flow_end) DESC, flow_end DESC") {
			if bounded++; bounded == 1 {
				q = strings.Replace(q, " ORDER BY toStartOfMinute", " AND flow_end < now64(3) - INTERVAL 100 YEAR ORDER BY toStartOfMinute", 1)
			}
		}
		return e.Query(ctx, q, format)
	})
	h := testAPI(t, Config{Store: behind, Registerer: reg})
	want := decode[FlowPage](t, do(t, testAPI(t, Config{}), "GET", "/api/v1/flows?limit=20&src_workload=shop/frontend", ""))
	got := decode[FlowPage](t, do(t, h, "GET", "/api/v1/flows?limit=20&src_workload=shop/frontend", ""))
	if bounded != 2 || len(want.Flows) != 20 || want.Next == "" {
		t.Fatalf("the test did not run as meant: %d page reads (want the bounded one and the one again), a page of %d rows, next %q", bounded, len(want.Flows), want.Next)
	}
	if len(got.Flows) != len(want.Flows) || got.Next != want.Next {
		t.Errorf("page with a short bounded read: %d rows, next %q; want %d rows, next %q", len(got.Flows), got.Next, len(want.Flows), want.Next)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := -1.0
	for _, mf := range mfs {
		if mf.GetName() == "dualflow_web_flow_page_rereads_total" {
			n = mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	if n != 1 {
		t.Errorf("dualflow_web_flow_page_rereads_total = %v, want 1", n)
	}
}

type storeFunc func(ctx context.Context, query, format string) ([]byte, error)

func (f storeFunc) Query(ctx context.Context, query, format string) ([]byte, error) {
	return f(ctx, query, format)
}

func mustQuery(t *testing.T, q string) url.Values {
	t.Helper()
	v, err := url.ParseQuery(strings.TrimPrefix(q, "&"))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestEngineErrorSummary: a store failure showed the engine's whole text,
// the generated SQL included, as the message on every page. The message
// is now its summary, the whole text a detail.
func TestEngineErrorSummary(t *testing.T) {
	for _, tc := range []struct{ in, msg string }{
		{"Code: 60. DB::Exception: Table dualflow.flows does not exist. (UNKNOWN_TABLE)", "Table dualflow.flows does not exist (UNKNOWN_TABLE)"},
		{"read flows: Code: 47. DB::Exception: Unknown expression identifier `x` in scope SELECT x FROM dualflow.flows WHERE src_ip = 'fd00:10::1': In scope SELECT x FROM dualflow.flows WHERE toStartOfMinute(flow_end) >= now() - 3600 AND dst_ip = '198.18.0.1'. (UNKNOWN_IDENTIFIER) (version 26.7.2.1)", "Unknown expression identifier `x` (UNKNOWN_IDENTIFIER)"},
		{"dial tcp 127.0.0.1:8123: connection refused", "dial tcp 127.0.0.1:8123: connection refused"},
	} {
		msg, detail := engineSummary(tc.in)
		if msg != tc.msg {
			t.Errorf("summary of %q = %q, want %q", tc.in, msg, tc.msg)
		}
		if msg != tc.in && detail != tc.in {
			t.Errorf("detail of %q = %q, want the whole text", tc.in, detail)
		}
		if strings.Contains(msg, "toStartOfMinute") {
			t.Errorf("the summary holds the generated SQL: %q", msg)
		}
	}
}
