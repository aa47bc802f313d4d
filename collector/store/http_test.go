package store

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/flow"
)

// httpStore serves the embedded engine over the ClickHouse HTTP interface,
// as the collector does, and can be stopped and restarted on the same
// address to simulate a ClickHouse outage.
type httpStore struct {
	t    testing.TB
	addr string
	stop func()
}

func newHTTPStore(t testing.TB) *httpStore {
	h := &httpStore{t: t}
	h.start()
	t.Cleanup(h.down)
	return h
}

func (h *httpStore) start() {
	e := needEngine(h.t)
	addr := h.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	var ln net.Listener
	var err error
	for i := 0; i < 50; i++ { // the port may linger briefly after a stop
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		h.t.Fatal(err)
	}
	h.addr = ln.Addr().String()
	srv, err := chhttp.New(chhttp.Config{Engine: e.DB(), ShutdownTimeout: time.Second,
		Users: []chhttp.User{{Name: "writer", Password: "w-secret"}}})
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { srv.Serve(ctx, ln); close(done) }()
	h.stop = func() { cancel(); <-done }
}

func (h *httpStore) down() {
	if h.stop != nil {
		h.stop()
		h.stop = nil
	}
}

// server returns a clickhouse-go (Protocol HTTP) backend for the store.
func (h *httpStore) server() *Server {
	pw := filepath.Join(h.t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte("w-secret\n"), 0o600); err != nil {
		h.t.Fatal(err)
	}
	s, err := NewServer(ServerConfig{DSN: "http://" + h.addr + "/", DialTimeout: time.Second, Username: "writer", PasswordFile: pw})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { s.Close() })
	return s
}

// TestServerOverHTTPAllColumns writes through clickhouse-go/v2 over the HTTP
// interface (the production server code path) and reads back every column
// for IPv4 and IPv6 rows.
func TestServerOverHTTPAllColumns(t *testing.T) {
	h := newHTTPStore(t)
	checkAllColumns(t, h.server())
}

func TestServerOverHTTPPre0006Spool(t *testing.T) {
	h := newHTTPStore(t)
	checkPre0006Spool(t, h.server())
}

func TestServerOverHTTPPre0012Spool(t *testing.T) {
	h := newHTTPStore(t)
	checkPre0012Spool(t, h.server())
}

func TestServerQueryTSV(t *testing.T) {
	h := newHTTPStore(t)
	s := h.server()
	out, err := s.Query(context.Background(), "SELECT toIPv6('198.18.0.1'), toIPv6('fd00:10::1'), 42", "TSV")
	if err != nil {
		t.Fatal(err)
	}
	// The driver scans IPv6 into net.IP, which prints a mapped IPv4 dotted.
	if got, want := string(out), "198.18.0.1\tfd00:10::1\t42\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	// Other formats are rendered by the server, over plain HTTP (the web
	// API and the audit reports read JSONEachRow).
	out, err = s.Query(context.Background(), "SELECT toIPv6('fd00:10::1') AS a, 42 AS n", "JSONEachRow")
	if got, want := string(out), `{"a":"fd00:10::1","n":42}`+"\n"; err != nil || got != want {
		t.Errorf("JSONEachRow: got %q, %v, want %q", got, err, want)
	}
	if _, err := s.Query(context.Background(), "SELECT nope", "JSONEachRow"); err == nil || errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "nope") {
		t.Errorf("bad query: err = %v, want the server's exception, not unavailable", err)
	}
}

// idRecords returns n records whose ct_mark is a unique id from base.
func idRecords(base, n int) []flow.Record {
	recs := make([]flow.Record, n)
	now := time.Now().UTC()
	for i := range recs {
		recs[i] = sampleRecord(base+i, (base+i)%2 == 0)
		recs[i].Mark = uint32(base + i)
		recs[i].FlowEnd = now
	}
	return recs
}

// testWriterConfig retries fast, but gives an insert 30 s: on a loaded
// machine a 2 s timeout spooled batches of a healthy store (and the tests
// that expect nothing spooled failed).
func testWriterConfig(spool string) WriterConfig {
	cfg := WriterConfig{
		BatchRows: 1000, FlushInterval: 20 * time.Millisecond, MaxPending: 4,
		Retries: 1, RetryBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		InsertTimeout: 30 * time.Second, SpoolDir: spool, ShutdownTimeout: 2 * time.Second,
	}
	cfg.SetDefaults()
	return cfg
}

func countRows(t testing.TB, c Conn) (rows, unique int) {
	t.Helper()
	out := queryString(t, c, "SELECT count(), uniqExact(ct_mark) FROM dualflow.flows")
	var a, b int
	for i, f := range splitTab(out) {
		v, _ := strconv.Atoi(f)
		if i == 0 {
			a = v
		} else {
			b = v
		}
	}
	return a, b
}

func splitTab(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '\t' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// TestWriterOutageOverHTTP: the store goes away mid-stream, the writer spools, the
// store comes back, and every row arrives exactly once.
func TestWriterOutageOverHTTP(t *testing.T) {
	h := newHTTPStore(t)
	truncate(t, engine)
	w, err := NewWriter(testWriterConfig(t.TempDir()), h.server(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	write := func(base, n int) {
		for i := 0; i < n; i += 500 {
			if err := w.Write(ctx, idRecords(base+i, 500)); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(0, 5000)
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	h.down() // outage
	write(5000, 10000)
	waitFor(t, 10*time.Second, "batches spooled during the outage", func() bool { return w.Stats().SpoolRows > 0 })
	h.start() // back
	write(15000, 5000)
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the spool to drain", func() bool { return w.Stats().SpoolRows == 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	st := w.Stats()
	if rows, unique := countRows(t, engine); rows != 20000 || unique != 20000 {
		t.Fatalf("after the outage: %d rows, %d unique, want 20000 and 20000 (stats %+v)", rows, unique, st)
	}
	if st.DroppedRows != 0 || st.SpooledRows == 0 {
		t.Errorf("stats %+v: want rows spooled and none dropped", st)
	}
	t.Logf("outage: %d rows spooled and replayed, %d insert errors, %d retries", st.SpooledRows, st.InsertErrors, st.Retries)
}

// TestWriterRestartDuringOutage: a writer stops while the store is down; a
// new writer on the same spool replays it once the store is back.
func TestWriterRestartDuringOutage(t *testing.T) {
	h := newHTTPStore(t)
	truncate(t, engine)
	spoolDir := t.TempDir()
	h.down()
	w1, err := NewWriter(testWriterConfig(spoolDir), h.server(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx1, cancel1 := context.WithCancel(context.Background())
	done1 := make(chan error, 1)
	go func() { done1 <- w1.Run(ctx1) }()
	for i := 0; i < 3000; i += 500 {
		if err := w1.Write(ctx1, idRecords(i, 500)); err != nil {
			t.Fatal(err)
		}
	}
	cancel1() // clean shutdown while the store is down: everything goes to the spool
	if err := <-done1; err != nil {
		t.Fatal(err)
	}
	if st := w1.Stats(); st.SpoolRows != 3000 || st.DroppedRows != 0 {
		t.Fatalf("after shutdown during the outage: %+v, want 3000 rows spooled", st)
	}
	h.start()
	w2, err := NewWriter(testWriterConfig(spoolDir), h.server(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx2, cancel2 := context.WithCancel(context.Background())
	done2 := make(chan error, 1)
	go func() { done2 <- w2.Run(ctx2) }()
	if err := w2.Write(ctx2, idRecords(3000, 1000)); err != nil {
		t.Fatal(err)
	}
	if err := w2.Flush(ctx2); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the spool to drain", func() bool { return w2.Stats().SpoolRows == 0 })
	cancel2()
	if err := <-done2; err != nil {
		t.Fatal(err)
	}
	if rows, unique := countRows(t, engine); rows != 4000 || unique != 4000 {
		t.Fatalf("after restart: %d rows, %d unique, want 4000", rows, unique)
	}
}

func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestServerInsertsDistributedSync: the server backend asks for
// synchronous inserts through Distributed tables on inserts only (a
// readonly = 1 user may change no setting, so queries must not carry it),
// unless the DSN sets it under either name.
func TestServerInsertsDistributedSync(t *testing.T) {
	for dsn, want := range map[string]bool{
		"http://127.0.0.1:1/":                                 true,
		"http://127.0.0.1:1/?insert_distributed_sync=0":       false,
		"http://127.0.0.1:1/?distributed_foreground_insert=0": false,
		"clickhouse://127.0.0.1:1":                            true,
	} {
		s, err := NewServer(ServerConfig{DSN: dsn})
		if err != nil {
			t.Fatal(err)
		}
		if s.syncInserts != want {
			t.Errorf("%s: sync inserts %v, want %v", dsn, s.syncInserts, want)
		}
		if s.http != nil && s.http.settings.Has(distributedSyncSetting) != strings.Contains(dsn, distributedSyncSetting) {
			t.Errorf("%s: query settings %v", dsn, s.http.settings)
		}
		if got := s.insertSettings("")[distributedSyncSetting] == 1; got != want {
			t.Errorf("%s: native insert settings %v", dsn, s.insertSettings(""))
		}
		s.Close()
	}
	if q := insertQuery("dualflow.flows", []string{"a"}, "t1", "Native", true); !strings.Contains(q, "insert_distributed_sync = 1 FORMAT Native") {
		t.Errorf("insert %q", q)
	}
	if q := insertQuery("dualflow.flows", []string{"a"}, "", "Native", false); strings.Contains(q, "distributed") {
		t.Errorf("embedded insert %q", q)
	}
}

// TestServerHTTPProxyRefusals: a proxy's 408, 425 or 429 (chproxy's
// concurrency limit), or any answer with Retry-After, is temporary: the
// writer retries or spools the batch instead of dropping it; other 4xx
// answers without a ClickHouse exception are rejections.
func TestServerHTTPProxyRefusals(t *testing.T) {
	for code, temporary := range map[int]bool{408: true, 425: true, 429: true, 502: true, 503: true, 400: false, 404: false} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "proxy says no", code)
		}))
		s, err := NewServer(ServerConfig{DSN: srv.URL + "/"})
		if err != nil {
			t.Fatal(err)
		}
		err = s.InsertRowBinary(context.Background(), "t", []string{"a"}, "tok", 1, []byte{1})
		if err == nil || errors.Is(err, ErrUnavailable) != temporary {
			t.Errorf("HTTP %d: %v, temporary %v", code, err, errors.Is(err, ErrUnavailable))
		}
		s.Close()
		srv.Close()
	}
}
