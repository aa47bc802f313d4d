package api

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/collector/store/chhttp"
)

// TestHTTPSQL runs /sql through the collector's ClickHouse HTTP interface,
// as one of its users (it refuses anonymous requests).
func TestHTTPSQL(t *testing.T) {
	e := needEngine(t)
	ch, err := chhttp.New(chhttp.Config{Engine: e.DB(), Users: []chhttp.User{{Name: "web", Password: "web-secret"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(ch.Handler())
	defer srv.Close()
	h := testAPI(t, Config{SQL: HTTPSQL{URL: srv.URL + "/", Database: "dualflow", User: "web", Password: "web-secret"}, SQLMaxRows: 10})
	r := do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT ip_version, count() AS n FROM flows GROUP BY ip_version ORDER BY ip_version"}`)
	if res := decode[SQLResult](t, r); r.code != 200 || len(res.Rows) != 2 || res.Columns[1].Name != "n" {
		t.Fatalf("select: %v", r)
	}
	for name, q := range map[string]string{
		"insert":     "INSERT INTO dualflow.flows (ip_version) VALUES (4)",
		"drop":       "DROP TABLE dualflow.flows",
		"lift limit": "SELECT number FROM numbers(100) SETTINGS max_result_rows = 1000",
		"syntax":     "SELEKT 1",
	} {
		if r := do(t, h, "POST", "/api/v1/sql", `{"query":`+jsonString(q)+`}`); r.code != 400 || !strings.Contains(r.body, `"field":"query"`) {
			t.Errorf("%s: %v", name, r)
		}
	}
	r = do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT number FROM numbers(100)"}`)
	if res := decode[SQLResult](t, r); r.code != 200 || len(res.Rows) != 10 || !res.Truncated {
		t.Errorf("past the row limit: %v, want 10 rows and truncated", r)
	}
	if r := do(t, h, "POST", "/api/v1/sql", `{"query":"SELECT 42 AS answer"}`); !strings.Contains(r.body, `"answer"`) {
		t.Errorf("after refused statements: %v", r)
	}
	down := testAPI(t, Config{SQL: HTTPSQL{URL: "http://127.0.0.1:1/"}})
	if r := do(t, down, "POST", "/api/v1/sql", `{"query":"SELECT 1"}`); r.code != 502 {
		t.Errorf("unreachable ClickHouse: %v", r)
	}
}
