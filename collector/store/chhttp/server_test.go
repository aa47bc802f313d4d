package chhttp

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/ch-go/proto"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/collector/store/chdb"
)

type reply struct {
	status int
	header http.Header
	body   string
}

func do(t *testing.T, method, u string, body io.Reader, header map[string]string) reply {
	t.Helper()
	req, err := http.NewRequest(method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, string(b)}
}

func TestCurlStyle(t *testing.T) {
	ts, _ := testServer(t, Config{})
	d := newDatabase(t)
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("CREATE TABLE "+d+".t (a UInt32, ip IPv6) ENGINE = MergeTree ORDER BY a"), nil); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		want       string
		wantFormat string
	}{
		{"get select", "GET", "/?query=SELECT+1", "", "1\n", "TabSeparated"},
		{"get bare", "GET", "/", "", "Ok.\n", ""},
		{"ping", "GET", "/ping", "", "Ok.\n", ""},
		{"replicas status", "GET", "/replicas_status", "", "Ok.\n", ""},
		{"post body", "POST", "/", "SELECT 1", "1\n", "TabSeparated"},
		{"query param plus body", "POST", "/?query=SELECT", "1 + 1", "2\n", "TabSeparated"},
		{"default format", "POST", "/?default_format=JSONEachRow", "SELECT 1 AS x", "{\"x\":1}\n", "JSONEachRow"},
		{"params", "GET", "/?query=SELECT+toString({ip:IPv6}),+{s:String}&param_ip=fd00:10:db8::1&param_s=a+b%5Ct", "", "fd00:10:db8::1\ta b\\t\n", "TabSeparated"},
		{"params v4", "GET", "/?query=SELECT+toString({ip:IPv4})&param_ip=198.18.2.1", "", "198.18.2.1\n", "TabSeparated"},
		{"database", "GET", "/?database=" + d + "&query=SELECT+currentDatabase()", "", d + "\n", "TabSeparated"},
		{"settings", "GET", "/?query=SELECT+getSetting('max_result_rows')&max_result_rows=77", "", "77\n", "TabSeparated"},
		{"insert tsv", "POST", "/?query=INSERT+INTO+" + d + ".t+FORMAT+TSV", "1\t::1\n2\t198.18.2.1\n", "", ""},
		{"insert in body", "POST", "/", "INSERT INTO " + d + ".t FORMAT CSV\n3,fd00:10:db8::3\n", "", ""},
		{"insert values", "POST", "/", "INSERT INTO " + d + ".t VALUES (4, '::ffff:198.18.0.4')", "", ""},
		{"count back", "GET", "/?query=SELECT+count(),+countIf(IPv4CIDRToRange(toIPv4('0.0.0.0'),0).1+%3D+'0.0.0.0')+FROM+" + d + ".t", "", "4\t4\n", "TabSeparated"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, tt.method, ts.URL+tt.path, strings.NewReader(tt.body), nil)
			if r.status != 200 {
				t.Fatalf("status %d: %s", r.status, r.body)
			}
			if r.body != tt.want {
				t.Errorf("body %q, want %q", r.body, tt.want)
			}
			if got := r.header.Get("X-ClickHouse-Format"); got != tt.wantFormat {
				t.Errorf("X-ClickHouse-Format %q, want %q", got, tt.wantFormat)
			}
		})
	}
	r := do(t, "POST", ts.URL+"/", strings.NewReader("SELECT 1 AS one FORMAT JSON"), nil)
	var js struct {
		Data []map[string]any `json:"data"`
		Rows int              `json:"rows"`
	}
	if err := json.Unmarshal([]byte(r.body), &js); err != nil || js.Rows != 1 || js.Data[0]["one"] != float64(1) {
		t.Errorf("FORMAT JSON: %v %s", err, r.body)
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("FORMAT JSON Content-Type %q", ct)
	}
	var sum map[string]string
	if err := json.Unmarshal([]byte(r.header.Get("X-ClickHouse-Summary")), &sum); err != nil || sum["result_rows"] != "1" {
		t.Errorf("X-ClickHouse-Summary %q: %v", r.header.Get("X-ClickHouse-Summary"), err)
	}
	if r.header.Get("X-ClickHouse-Query-Id") == "" || r.header.Get("X-ClickHouse-Server-Display-Name") == "" {
		t.Errorf("missing ClickHouse headers: %v", r.header)
	}
}

func TestReadonly(t *testing.T) {
	ts, _ := testServer(t, Config{})
	d := newDatabase(t)
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("CREATE TABLE "+d+".t (a UInt32) ENGINE = Memory"), nil); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	victim := filepath.Join(t.TempDir(), "victim")
	if err := os.WriteFile(victim, []byte("keep\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, method, path, body string
	}{
		{"readonly insert stream", "POST", "/?readonly=1&query=INSERT+INTO+" + d + ".t+FORMAT+TSV", "1\n"},
		{"readonly insert values", "POST", "/?readonly=1", "INSERT INTO " + d + ".t VALUES (1)"},
		{"readonly create", "POST", "/?readonly=1", "CREATE TABLE " + d + ".u (a UInt8) ENGINE = Memory"},
		{"readonly drop", "POST", "/?readonly=1", "DROP TABLE " + d + ".t"},
		{"readonly table function", "POST", "/?readonly=1", "SELECT * FROM file('/etc/hostname', 'LineAsString')"},
		{"readonly settings change", "POST", "/?readonly=1", "SELECT 1 SETTINGS max_threads = 1"},
		{"get insert", "GET", "/?query=INSERT+INTO+" + d + ".t+VALUES+(1)", ""},
		{"get create", "GET", "/?query=CREATE+TABLE+" + d + ".v+(a+UInt8)+ENGINE+%3D+Memory", ""},
		// What readonly alone lets through on the embedded engine.
		{"get outfile", "GET", "/?query=" + url.QueryEscape("SELECT 'owned' INTO OUTFILE '"+victim+".new' FORMAT RawBLOB"), ""},
		{"get outfile append", "GET", "/?query=" + url.QueryEscape("SELECT 'owned' INTO OUTFILE '"+victim+"' APPEND FORMAT RawBLOB"), ""},
		{"get file function", "GET", "/?query=" + url.QueryEscape("SELECT file('"+victim+"')"), ""},
		{"get kill", "GET", "/?query=" + url.QueryEscape("KILL QUERY WHERE 1"), ""},
		{"get second statement", "GET", "/?query=" + url.QueryEscape("SELECT 1; SELECT 'owned' INTO OUTFILE '"+victim+".2' FORMAT RawBLOB"), ""},
		{"readonly outfile", "POST", "/?readonly=1", "SELECT 'owned' INTO OUTFILE '" + victim + ".3' TRUNCATE FORMAT RawBLOB"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, tt.method, ts.URL+tt.path, strings.NewReader(tt.body), nil)
			// READONLY as ClickHouse answers it, or SYNTAX_ERROR from the
			// engine's single-statement parse (an INSERT with inline data,
			// two statements).
			code := r.header.Get("X-ClickHouse-Exception-Code")
			ok := (r.status == 500 && code == "164" && strings.HasPrefix(r.body, "Code: 164. DB::Exception: ")) ||
				(r.status == 400 && code == "62" && strings.HasPrefix(r.body, "Code: 62. DB::Exception: "))
			if !ok {
				t.Errorf("got %d code %q: %s", r.status, code, r.body)
			}
		})
	}
	if r := do(t, "GET", ts.URL+"/?readonly=1&query=SELECT+count()+FROM+"+d+".t", nil, nil); r.status != 200 || r.body != "0\n" {
		t.Errorf("readonly select: %d %s", r.status, r.body)
	}
	if b, err := os.ReadFile(victim); err != nil || string(b) != "keep\n" {
		t.Errorf("victim file after the attacks: %q %v", b, err)
	}
	for _, f := range []string{".new", ".2", ".3"} {
		if _, err := os.Stat(victim + f); err == nil {
			t.Errorf("a read-only request wrote %s", victim+f)
		}
	}

	// A server configured read-only ignores readonly=0 from the client.
	ro, _ := testServer(t, Config{ReadOnly: true})
	r := do(t, "POST", ro.URL+"/?readonly=0", strings.NewReader("INSERT INTO "+d+".t VALUES (1)"), nil)
	if r.header.Get("X-ClickHouse-Exception-Code") != "164" {
		t.Errorf("ReadOnly server accepted an insert: %d %s", r.status, r.body)
	}
}

func gz(t *testing.T, s string) io.Reader {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	if _, err := zw.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

func TestCompression(t *testing.T) {
	ts, _ := testServer(t, Config{})
	d := newDatabase(t)
	if r := do(t, "POST", ts.URL+"/", gz(t, "CREATE TABLE "+d+".t (a UInt32) ENGINE = Memory"), map[string]string{"Content-Encoding": "gzip"}); r.status != 200 {
		t.Fatalf("gzip query: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", ts.URL+"/?query=INSERT+INTO+"+d+".t+FORMAT+TSV", gz(t, "1\n2\n3\n"), map[string]string{"Content-Encoding": "gzip"}); r.status != 200 {
		t.Fatalf("gzip insert: %d %s", r.status, r.body)
	}
	// Compressed answer only with enable_http_compression=1, like ClickHouse.
	r := do(t, "GET", ts.URL+"/?query=SELECT+sum(a)+FROM+"+d+".t", nil, map[string]string{"Accept-Encoding": "gzip"})
	if r.body != "6\n" || r.header.Get("Content-Encoding") != "" {
		t.Errorf("without enable_http_compression: %q %q", r.body, r.header.Get("Content-Encoding"))
	}
	r = do(t, "GET", ts.URL+"/?enable_http_compression=1&query=SELECT+sum(a)+FROM+"+d+".t", nil, map[string]string{"Accept-Encoding": "gzip"})
	if r.header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("Content-Encoding %q", r.header.Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(strings.NewReader(r.body))
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(zr); string(b) != "6\n" {
		t.Errorf("gzip answer %q", b)
	}
	r = do(t, "POST", ts.URL+"/", strings.NewReader("SELECT 1"), map[string]string{"Content-Encoding": "snappy"})
	if r.status != 400 || r.header.Get("X-ClickHouse-Exception-Code") != "89" {
		t.Errorf("unknown encoding: %d %s", r.status, r.body)
	}
	r = do(t, "POST", ts.URL+"/", strings.NewReader("not gzip"), map[string]string{"Content-Encoding": "gzip"})
	if r.status != 400 || r.header.Get("X-ClickHouse-Exception-Code") != "271" {
		t.Errorf("corrupt gzip: %d %s", r.status, r.body)
	}
}

func TestErrorResponses(t *testing.T) {
	ts, _ := testServer(t, Config{MaxQuerySize: 64 << 10})
	huge := strings.Repeat("x", 512<<10)
	tests := []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"syntax", "POST", "/", "SELEC 1", 400, "62"},
		{"unknown table", "POST", "/", "SELECT * FROM no_such_table", 404, "60"},
		{"garbage body", "POST", "/", "\x00\x01\xff\xfe garbage \x7f", 400, "62"},
		{"wrong format", "POST", "/?default_format=NoSuchFormat", "SELECT 1", 404, "73"},
		{"wrong format clause", "POST", "/", "SELECT 1 FORMAT NoSuchFormat", 404, "73"},
		{"unknown setting", "POST", "/?no_such_setting=1", "SELECT 1", 404, "115"},
		{"bad setting value", "POST", "/?max_threads=lots", "SELECT 1", 400, "27"},
		{"bad readonly", "POST", "/?readonly=yes", "SELECT 1", 400, "36"},
		{"bad param", "POST", "/?param_x=nope", "SELECT {x:UInt8}", 500, "457"},
		{"huge param", "POST", "/?param_x=" + huge, "SELECT length({x:String})", 200, ""},
		{"too big query", "POST", "/", "SELECT '" + strings.Repeat("y", 100<<10) + "'", 413, "229"},
		{"empty post", "POST", "/", "", 400, "62"},
		{"method", "PUT", "/", "SELECT 1", 405, "1"},
		{"bad protocol version", "POST", "/?client_protocol_version=x", "SELECT 1", 400, "36"},
		{"external tables", "POST", "/?t_structure=a+UInt8", "SELECT 1", 501, "48"},
		{"unknown handler", "GET", "/nope", "", 404, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := do(t, tt.method, ts.URL+tt.path, strings.NewReader(tt.body), nil)
			if r.status != tt.status || r.header.Get("X-ClickHouse-Exception-Code") != tt.code {
				t.Fatalf("got %d code %q, want %d code %q: %.300s", r.status, r.header.Get("X-ClickHouse-Exception-Code"), tt.status, tt.code, r.body)
			}
			if tt.code != "" && !strings.HasPrefix(r.body, "Code: "+tt.code+". DB::Exception: ") {
				t.Errorf("body %.200q", r.body)
			}
		})
	}
	// A URL beyond the header limit is refused by net/http, not the engine.
	r := do(t, "GET", ts.URL+"/?query=SELECT+1&param_x="+strings.Repeat("z", 2<<20), nil, nil)
	if r.status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("2 MiB URL: %d", r.status)
	}
	// The server still answers.
	if r := do(t, "GET", ts.URL+"/?query=SELECT+1", nil, nil); r.body != "1\n" {
		t.Errorf("after errors: %d %s", r.status, r.body)
	}
}

func TestErrorCodeNames(t *testing.T) {
	db := testDB(t)
	// The codes the HTTP layer raises itself, named as ch-go names them.
	for _, code := range []proto.Error{proto.ErrUnsupportedMethod, proto.ErrBadArguments, proto.ErrNotImplemented,
		proto.ErrUnknownCompressionMethod, proto.ErrTooManySimultaneousQueries, proto.ErrTimeoutExceeded,
		proto.ErrReadonly, proto.ErrQueryIsTooLarge, proto.ErrCannotDecompress, proto.ErrQueryWasCancelled,
		proto.ErrAccessDenied, proto.ErrRequiredPassword, proto.ErrAuthenticationFailed, proto.ErrStdException} {
		name := code.String()
		out, err := db.Query(context.Background(), "SELECT errorCodeToName("+strconv.Itoa(int(code))+")", "")
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(out)); got != name {
			t.Errorf("code %d is %s in the engine, %s here", code, got, name)
		}
	}
}

func TestConcurrencyLimit(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	eng := &fakeEngine{run: func(ctx context.Context, st chdb.Statement) (*chdb.Result, error) {
		started <- struct{}{}
		<-release
		return &chdb.Result{Data: []byte("1\n")}, nil
	}}
	reg := prometheus.NewRegistry()
	ts, _ := testServer(t, Config{Engine: eng, MaxConcurrent: 1, Registerer: reg})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		do(t, "POST", ts.URL+"/", strings.NewReader("SELECT 1"), nil)
	}()
	<-started
	r := do(t, "POST", ts.URL+"/", strings.NewReader("SELECT 1"), nil)
	close(release)
	wg.Wait()
	if r.status != 503 || r.header.Get("X-ClickHouse-Exception-Code") != "202" {
		t.Errorf("saturated: %d %s", r.status, r.body)
	}
	if got := counterValue(t, reg, "dualflow_chhttp_rejected_total", nil); got != 1 {
		t.Errorf("rejected_total = %v, want 1", got)
	}
	if got := counterValue(t, reg, "dualflow_chhttp_requests_total", map[string]string{"kind": "query", "code": "200"}); got != 1 {
		t.Errorf("requests_total{query,200} = %v, want 1", got)
	}
}

func counterValue(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue metric
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

func TestPanicRecovered(t *testing.T) {
	eng := &fakeEngine{run: func(context.Context, chdb.Statement) (*chdb.Result, error) {
		var m map[string]int
		m["boom"]++ // assignment to nil map
		return nil, nil
	}}
	ts, _ := testServer(t, Config{Engine: eng})
	r := do(t, "POST", ts.URL+"/", strings.NewReader("SELECT 1"), nil)
	if r.status != 500 || r.header.Get("X-ClickHouse-Exception-Code") != "1001" {
		t.Errorf("panic: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", ts.URL+"/ping", nil, nil); r.body != "Ok.\n" {
		t.Errorf("after panic: %d %s", r.status, r.body)
	}
}

func TestCancelOnClientGone(t *testing.T) {
	ts, _ := testServer(t, Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", ts.URL+"/", strings.NewReader("SELECT sleepEachRow(0.1) FROM numbers(100) SETTINGS function_sleep_max_microseconds_per_block = 0"))
	start := time.Now()
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("request outlived its context")
	}
	// The engine kills the statement, so the next request is served at once.
	if r := do(t, "GET", ts.URL+"/?query=SELECT+1", nil, nil); r.body != "1\n" {
		t.Errorf("after cancel: %d %s", r.status, r.body)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("took %v", el)
	}
}

func TestRunGraceful(t *testing.T) {
	eng := &fakeEngine{run: func(context.Context, chdb.Statement) (*chdb.Result, error) {
		return &chdb.Result{Data: []byte("1\n")}, nil
	}}
	for _, addr := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run(addr, func(t *testing.T) {
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				t.Skipf("no %s: %v", addr, err)
			}
			s, err := New(Config{Engine: eng, Users: []User{{Name: "u", Password: "p"}}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Serve(ctx, ln) }()
			// POST: a GET is read-only, and its statement is first parsed by
			// the engine, which this fake is not.
			u := url.URL{Scheme: "http", User: url.UserPassword("u", "p"), Host: ln.Addr().String(), Path: "/", RawQuery: "query=SELECT+1"}
			if r := do(t, "POST", u.String(), nil, nil); r.body != "1\n" {
				t.Errorf("over %s: %d %q", addr, r.status, r.body)
			}
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Serve: %v", err)
				}
			case <-time.After(15 * time.Second):
				t.Fatal("Serve did not return after cancel")
			}
		})
	}
	s, _ := New(Config{Engine: eng, Addr: "256.0.0.1:1"})
	if err := s.Run(context.Background()); err == nil || !errors.Is(err, err) {
		t.Errorf("Run on a bad address: %v", err)
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		"query=SELECT+1", "default_format=Native&client_protocol_version=54460&param_x=1",
		"readonly=1&max_result_rows=10", "compress=1&network_compression_method=zstd", "a=%zz", "param_=1",
	} {
		f.Add("POST", s, "gzip")
	}
	f.Fuzz(func(t *testing.T, method, rawQuery, enc string) {
		h := http.Header{}
		h.Set("Content-Encoding", enc)
		r, err := parseRequest(method, &url.URL{Path: "/", RawQuery: rawQuery}, h)
		if err != nil {
			var se *statusError
			if !errors.As(err, &se) || se.status < 400 {
				t.Fatalf("error %v is not a status error", err)
			}
			return
		}
		if r.format == "" || r.params == nil || r.settings == nil {
			t.Fatalf("incomplete request %+v", r)
		}
		if method != http.MethodPost && r.settings["readonly"] == "0" {
			t.Fatalf("%s request left writable", method)
		}
		text := r.query
		if _, ok := chdb.SplitInsert(text); ok {
			_ = chdb.OutputFormat(text)
		}
	})
}

// TestRejectsCrossSiteBrowsers: a page on another site must not be able to
// run SQL on the unauthenticated loopback interface; clients without
// browser headers and same-origin requests still work.
func TestRejectsCrossSiteBrowsers(t *testing.T) {
	_, s := testServer(t, Config{})
	h := s.Handler()
	tests := []struct {
		name    string
		headers map[string]string
		want    int
	}{
		{"plain client", nil, http.StatusOK},
		{"cross-site fetch", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://evil.example"}, http.StatusForbidden},
		{"same-site other port", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:8080"}, http.StatusForbidden},
		{"origin only", map[string]string{"Origin": "http://[fd00:10::1]:80"}, http.StatusForbidden},
		{"same origin", map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:8123"}, http.StatusOK},
		{"typed in the address bar", map[string]string{"Sec-Fetch-Site": "none"}, http.StatusOK},
		// DNS rebinding: the attacker's name resolves to 127.0.0.1, its
		// page is same-origin with itself.
		{"rebound name", map[string]string{"Host": "attacker.example:8123", "Sec-Fetch-Site": "same-origin", "Origin": "http://attacker.example:8123"}, http.StatusForbidden},
		{"rebound name, no browser headers", map[string]string{"Host": "attacker.example:8123"}, http.StatusForbidden},
		{"localhost", map[string]string{"Host": "localhost:8123", "Sec-Fetch-Site": "same-origin", "Origin": "http://localhost:8123"}, http.StatusOK},
		{"IPv6 literal", map[string]string{"Host": "[::1]:8123"}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "http://127.0.0.1:8123/", strings.NewReader("SELECT 1"))
			if h, ok := tt.headers["Host"]; ok {
				req.Host = h
			}
			for k, v := range tt.headers {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Errorf("status %d, want %d: %s", rec.Code, tt.want, rec.Body)
			}
		})
	}
}

// TestNewDefaults: unset and negative bounds take the defaults; a
// negative MinDataRate means no minimum and stays.
func TestNewDefaults(t *testing.T) {
	s, err := New(Config{Engine: &fakeEngine{}, MaxConcurrent: -1, BodyTimeout: -time.Second, MinDataRate: -1,
		ReaderLimits: ReaderLimits{MaxThreads: -3, MaxMemoryBytes: 5}})
	if err != nil {
		t.Fatal(err)
	}
	c := s.cfg
	if c.Addr != DefaultAddr || c.MaxConcurrent != DefaultMaxConcurrent || c.BodyTimeout != DefaultBodyTimeout ||
		c.MaxQuerySize != DefaultMaxQuerySize || c.MinDataRate != -1 || c.Logger == nil {
		t.Errorf("config %+v", c)
	}
	if l := c.ReaderLimits; l.MaxThreads != DefaultReaderLimits.MaxThreads || l.MaxMemoryBytes != 5 ||
		l.MaxExecutionTime != DefaultReaderLimits.MaxExecutionTime {
		t.Errorf("reader limits %+v", l)
	}
}
