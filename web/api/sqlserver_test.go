package api

import (
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chhttp"
)

// TestSQLOnServer runs /sql on a ClickHouse server's HTTP interface
// through the store's client (here the collector's own interface, which
// `dualflow store` serves, as one of its users), as the collector does
// with an http(s) DSN; a native-protocol DSN answers 501.
func TestSQLOnServer(t *testing.T) {
	e := needEngine(t)
	ch, err := chhttp.New(chhttp.Config{Engine: e.DB(), Users: []chhttp.User{{Name: "web", Password: "web-secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ch.Handler())
	defer srv.Close()
	pw := t.TempDir() + "/pw"
	if err := os.WriteFile(pw, []byte("web-secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	server := func(dsn string) *store.Server {
		s, err := store.NewServer(store.ServerConfig{DSN: dsn, Username: "web", PasswordFile: pw, DialTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	h := testAPI(t, Config{Store: server(srv.URL + "/dualflow"), SQLMaxRows: 10})
	r := do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT ip_version, count() AS n FROM flows GROUP BY ip_version ORDER BY ip_version"}`)
	if res := decode[SQLResult](t, r); r.code != 200 || len(res.Rows) != 2 || res.Columns[1].Name != "n" {
		t.Fatalf("select: %v", r)
	}
	for name, q := range map[string]string{
		"insert":     "INSERT INTO dualflow.flows (ip_version) VALUES (4)",
		"drop":       "DROP TABLE dualflow.flows",
		"lift limit": "SELECT number FROM numbers(100) SETTINGS max_result_rows = 1000",
		"syntax":     "SELEKT 1",
		"no table":   "SELECT * FROM no_such_table",
	} {
		if r := do(t, h, "POST", "/api/v1/sql", `{"query":`+jsonString(q)+`}`); r.code != 400 || !strings.Contains(r.body, `"field":"query"`) {
			t.Errorf("%s: %v", name, r)
		}
	}
	r = do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT number FROM numbers(100)"}`)
	if res := decode[SQLResult](t, r); r.code != 200 || len(res.Rows) != 10 || !res.Truncated {
		t.Errorf("past the row limit: %v, want 10 rows and truncated", r)
	}
	r = do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT number FROM numbers(100)","format":"csv"}`)
	if r.code != 200 || strings.Count(r.body, "\n") != 11 {
		t.Errorf("csv past the row limit: %v, want a header and 10 rows", r)
	}
	if r := do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT 42 AS answer"}`); !strings.Contains(r.body, `"answer"`) {
		t.Errorf("after refused statements: %v", r)
	}
	down := testAPI(t, Config{Store: server("http://127.0.0.1:1/dualflow")})
	if r := do(t, down, "POST", "/api/v1/sql", `{"query":"SELECT 1"}`); r.code != 502 {
		t.Errorf("unreachable ClickHouse: %v", r)
	}
	native := testAPI(t, Config{Store: server("clickhouse://127.0.0.1:1/dualflow")})
	if r := do(t, native, "POST", "/api/v1/sql", `{"query":"SELECT 1"}`); r.code != 501 || !strings.Contains(r.body, "http(s)://") {
		t.Errorf("native protocol: %v, want 501 naming an http(s) DSN", r)
	}
}
