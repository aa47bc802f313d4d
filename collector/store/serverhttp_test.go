package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// serverDSN returns a backend for dsn with the store's writer credentials.
func (h *httpStore) serverDSN(dsn string, maxAnswer int64) *Server {
	pw := filepath.Join(h.t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte("w-secret\n"), 0o600); err != nil {
		h.t.Fatal(err)
	}
	s, err := NewServer(ServerConfig{DSN: dsn, DialTimeout: time.Second, Username: "writer", PasswordFile: pw, MaxQueryAnswer: maxAnswer})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { s.Close() })
	return s
}

// closedAddr returns a loopback address that refuses connections.
func closedAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// countingServer answers every request with handler and counts them.
func countingServer(t *testing.T, handler http.HandlerFunc) (*httptest.Server, *atomic.Int32) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		handler(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// TestServerHTTPFailover: a DSN listing several hosts uses them in order;
// a host that refuses connections or answers 5xx without an exception is
// skipped for that request; an exception of a live server (a bad query)
// ends the request there; when every host fails the error wraps
// ErrUnavailable. round_robin spreads the first attempts.
func TestServerHTTPFailover(t *testing.T) {
	h := newHTTPStore(t)
	ctx := context.Background()

	// Refused first host: inserts and queries reach the second.
	truncate(t, engine)
	s := h.serverDSN("http://"+closedAddr(t)+","+h.addr+"/", 0)
	insertRecords(t, s, "failover-1", idRecords(0, 100)...)
	out, err := s.Query(ctx, "SELECT count() AS n FROM dualflow.flows", "JSONEachRow")
	if got, want := string(out), `{"n":100}`+"\n"; err != nil || got != want {
		t.Errorf("through the second host: %q, %v, want %q", out, err, want)
	}
	// The same through the alt_hosts parameter of clickhouse-go.
	s = h.serverDSN("http://"+closedAddr(t)+"/?alt_hosts="+h.addr, 0)
	if out, err := s.Query(ctx, "SELECT 1 AS one", "JSONEachRow"); err != nil || string(out) != `{"one":1}`+"\n" {
		t.Errorf("alt_hosts: %q, %v", out, err)
	}

	// A 503 (a proxy, a server shutting down) moves on too.
	unavailable, hits := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "shutting down", http.StatusServiceUnavailable)
	})
	s = h.serverDSN(unavailable.URL+","+h.addr+"/", 0)
	insertRecords(t, s, "failover-2", idRecords(100, 100)...)
	if rows, unique := countRows(t, engine); rows != 200 || unique != 200 {
		t.Errorf("after failover inserts: %d rows, %d unique, want 200", rows, unique)
	}
	if hits.Load() != 1 {
		t.Errorf("the 503 host got %d requests, want 1", hits.Load())
	}

	// A bad query is the answer: the next host would say the same.
	refusing, _ := countingServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-ClickHouse-Exception-Code", "62")
		http.Error(w, "Code: 62. DB::Exception: Syntax error", http.StatusBadRequest)
	})
	second, secondHits := countingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}\n") })
	s = h.serverDSN(refusing.URL+","+strings.TrimPrefix(second.URL, "http://")+"/", 0)
	if _, err := s.Query(ctx, "SELEC 1", "JSONEachRow"); err == nil || errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "Syntax error") {
		t.Errorf("bad query: %v, want the exception of the first host", err)
	}
	if secondHits.Load() != 0 {
		t.Errorf("the second host got %d requests after an exception, want 0", secondHits.Load())
	}

	// Every host down: unavailable, naming each.
	a, b := closedAddr(t), closedAddr(t)
	s = h.serverDSN("http://"+a+","+b+"/", 0)
	err = s.InsertRowBinary(ctx, FlowsTable, FlowColumns, "tok", 0, nil)
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), a) || !strings.Contains(err.Error(), b) {
		t.Errorf("all hosts down: %v, want ErrUnavailable naming %s and %s", err, a, b)
	}
	if _, err := s.Query(ctx, "SELECT 1", "JSONEachRow"); !errors.Is(err, ErrUnavailable) {
		t.Errorf("all hosts down, query: %v", err)
	}

	// round_robin: each request starts at the next host.
	one, oneHits := countingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "1\n") })
	two, twoHits := countingServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "2\n") })
	s = h.serverDSN(one.URL+","+strings.TrimPrefix(two.URL, "http://")+"/?connection_open_strategy=round_robin", 0)
	for range 4 {
		if _, err := s.Query(ctx, "SELECT 1", "JSONEachRow"); err != nil {
			t.Fatal(err)
		}
	}
	if oneHits.Load() != 2 || twoHits.Load() != 2 {
		t.Errorf("round_robin: %d and %d requests, want 2 and 2", oneHits.Load(), twoHits.Load())
	}
}

// TestServerHTTPCompressInserts: the DSN's compress option compresses
// insert bodies as clickhouse-go does over HTTP (ClickHouse compressed
// blocks with decompress=1 for lz4, lz4hc and zstd; Content-Encoding for
// gzip, deflate and br), the store's HTTP interface decodes them, and a
// value clickhouse-go would silently ignore is refused.
func TestServerHTTPCompressInserts(t *testing.T) {
	h := newHTTPStore(t)
	target, _ := url.Parse("http://" + h.addr)
	type seen struct {
		decompress, encoding string
		bytes                int64
	}
	var mu sync.Mutex
	var inserts []seen
	proxy := httputil.NewSingleHostReverseProxy(target)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Query().Get("query"), "INSERT") {
			body, _ := io.ReadAll(r.Body)
			r.Body = io.NopCloser(strings.NewReader(string(body)))
			mu.Lock()
			inserts = append(inserts, seen{r.URL.Query().Get("decompress"), r.Header.Get("Content-Encoding"), int64(len(body))})
			mu.Unlock()
		}
		proxy.ServeHTTP(w, r)
	}))
	defer srv.Close()

	var plain int64
	base := 0
	for _, c := range []struct{ compress, decompress, encoding string }{
		{"", "", ""}, // first: the uncompressed size
		{"lz4", "1", ""}, {"true", "1", ""}, {"lz4hc", "1", ""}, {"zstd", "1", ""},
		{"gzip", "", "gzip"}, {"deflate", "", "deflate"}, {"br", "", "br"},
	} {
		truncate(t, engine)
		mu.Lock()
		inserts = nil
		mu.Unlock()
		dsn := srv.URL + "/"
		if c.compress != "" {
			dsn += "?compress=" + c.compress
		}
		s := h.serverDSN(dsn, 0)
		insertRecords(t, s, fmt.Sprintf("compress-%s", c.compress), idRecords(base, 500)...)
		base += 500
		if rows, unique := countRows(t, engine); rows != 500 || unique != 500 {
			t.Errorf("compress=%s: %d rows, %d unique, want 500", c.compress, rows, unique)
		}
		mu.Lock()
		got := inserts
		mu.Unlock()
		if len(got) != 1 || got[0].decompress != c.decompress || got[0].encoding != c.encoding {
			t.Errorf("compress=%s: inserts %+v, want decompress=%q Content-Encoding %q", c.compress, got, c.decompress, c.encoding)
			continue
		}
		if c.compress == "" {
			plain = got[0].bytes
		} else if got[0].bytes >= plain {
			t.Errorf("compress=%s: %d bytes sent, uncompressed %d", c.compress, got[0].bytes, plain)
		}
	}
	for _, bad := range []string{"xz", "snappy", "lz5", ""} {
		if _, err := NewServer(ServerConfig{DSN: "http://127.0.0.1:1/?compress=" + bad}); err == nil || !strings.Contains(err.Error(), "compress") {
			t.Errorf("compress=%s: %v, want a refusal", bad, err)
		}
	}
	for _, ok := range []string{"1", "false", "none", "zstd&compress_level=3"} {
		s, err := NewServer(ServerConfig{DSN: "http://127.0.0.1:1/?compress=" + ok})
		if err != nil {
			t.Errorf("compress=%s: %v", ok, err)
			continue
		}
		s.Close()
	}
}

// TestServerHTTPIdleConns: the inserters and the queries running at once
// keep their connections between bursts instead of reopening all but two.
func TestServerHTTPIdleConns(t *testing.T) {
	var opened atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(30 * time.Millisecond) // the burst's requests overlap
		io.WriteString(w, "{}\n")
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	s, err := NewServer(ServerConfig{DSN: srv.URL + "/"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	tr := s.http.client.Transport.(*http.Transport)
	if tr.MaxIdleConnsPerHost < DefaultInserters+4 || tr.IdleConnTimeout <= 0 {
		t.Errorf("transport: %d idle connections per host, idle timeout %v", tr.MaxIdleConnsPerHost, tr.IdleConnTimeout)
	}
	const burst, rounds = 6, 5
	for range rounds {
		var wg sync.WaitGroup
		for range burst {
			wg.Go(func() {
				if _, err := s.Query(context.Background(), "SELECT 1", "JSONEachRow"); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		time.Sleep(20 * time.Millisecond) // the connections return to the pool
	}
	if n := opened.Load(); n > burst+2 {
		t.Errorf("%d connections opened for %d rounds of %d concurrent requests, want about %d", n, rounds, burst, burst)
	}
}

// TestServerHTTPAnswerLimits: a query answer beyond MaxQueryAnswer fails
// with ErrAnswerTooLarge (not unavailable: a retry gets the same answer)
// instead of being read into memory whole; an insert answered with a large
// body (not ClickHouse) is unavailable, so the batch is retried under its
// token rather than dropped.
func TestServerHTTPAnswerLimits(t *testing.T) {
	h := newHTTPStore(t)
	s := h.serverDSN("http://"+h.addr+"/", 64<<10)
	ctx := context.Background()
	_, err := s.Query(ctx, "SELECT number FROM numbers(1000000)", "JSONEachRow")
	if !errors.Is(err, ErrAnswerTooLarge) || errors.Is(err, ErrUnavailable) {
		t.Errorf("runaway query: %v, want ErrAnswerTooLarge", err)
	}
	if out, err := s.Query(ctx, "SELECT number FROM numbers(10)", "JSONEachRow"); err != nil || strings.Count(string(out), "\n") != 10 {
		t.Errorf("small query: %q, %v", out, err)
	}

	var sent atomic.Int64
	endless := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := []byte(strings.Repeat("x", 64<<10) + "\n")
		for sent.Load() < 1<<30 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			sent.Add(int64(len(chunk)))
		}
	}))
	defer endless.Close()
	s, err = NewServer(ServerConfig{DSN: endless.URL + "/", MaxQueryAnswer: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Query(ctx, "SELECT 1", "JSONEachRow"); !errors.Is(err, ErrAnswerTooLarge) {
		t.Errorf("endless answer: %v, want ErrAnswerTooLarge", err)
	}
	if err := s.InsertRowBinary(ctx, "t", []string{"a"}, "tok", 1, []byte{1}); !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrAnswerTooLarge) {
		t.Errorf("insert with an endless answer: %v, want ErrUnavailable and ErrAnswerTooLarge", err)
	}
	if n := sent.Load(); n >= 1<<30 {
		t.Errorf("the client read %d bytes", n)
	}
}

// TestServerHTTPMidStreamException: an exception the server reports after
// it sent 200 and part of the answer is an error, with its code deciding
// whether it is temporary, in each form ClickHouse uses; data that merely
// looks like one is not.
func TestServerHTTPMidStreamException(t *testing.T) {
	const tag = "PU1FNUFH98"
	tagged := func(code int, msg string) string {
		m := fmt.Sprintf("Code: %d. DB::Exception: %s. (SOME_ERROR) (version 25.11.1.1 (official build))\n", code, msg)
		return "\r\n__exception__\r\n" + tag + "\r\n" + m + fmt.Sprintf("%d %s\r\n__exception__\r\n", len(m), tag)
	}
	for _, c := range []struct {
		name      string
		header    map[string]string
		body      string
		trailer   string // X-ClickHouse-Exception-Code trailer
		abort     bool   // break the framing after the body, as 25.11+ does
		code      int    // 0: no error expected
		temporary bool
		msg       string
	}{
		{name: "legacy text", body: "1\n2\nCode: 241. DB::Exception: Memory limit (total) exceeded. (MEMORY_LIMIT_EXCEEDED) (version 24.3.1.1)\n",
			code: 241, temporary: true, msg: "Memory limit"},
		{name: "old servers", body: "1\nCode: 159, e.displayText() = DB::Exception: Timeout exceeded (version 21.3.1.1)\n",
			code: 159, temporary: true, msg: "Timeout exceeded"},
		{name: "25.1 marker line", body: "0,\"a\"\n__exception__\nCode: 395. DB::Exception: There was an error in the stream!. (FUNCTION_THROW_IF_VALUE_IS_NON_ZERO) (version 25.1.6.34 (official build))\n",
			abort: true, code: 395, msg: "error in the stream"},
		{name: "25.11 tag", header: map[string]string{"X-ClickHouse-Exception-Tag": tag}, body: "1\n2\n" + tagged(395, "boom"),
			abort: true, code: 395, msg: "boom"},
		{name: "25.11 tag, temporary", header: map[string]string{"X-ClickHouse-Exception-Tag": tag}, body: "1\n2\n3" + tagged(241, "Memory limit exceeded"),
			abort: true, code: 241, temporary: true, msg: "Memory limit exceeded"},
		{name: "25.11 tag, cut short", header: map[string]string{"X-ClickHouse-Exception-Tag": tag}, body: "1\n2\n3" + tagged(241, "Memory limit exceeded")[:75],
			abort: true, code: 241, temporary: true, msg: "Memory limit"},
		{name: "trailer", body: "1\n2\n", trailer: "159", code: 159, temporary: true},
		{name: "header on 200", header: map[string]string{"X-ClickHouse-Exception-Code": "60"}, body: "1\n", code: 60},
		{name: "JSONEachRow in format", body: `{"n":1}` + "\n" + `{"exception": "Code: 241. DB::Exception: Memory limit exceeded: \"x\""}` + "\n",
			code: 241, temporary: true, msg: `exceeded: "x"`},
		{name: "JSON in format", body: "{\n\t\"meta\": [],\n\t\"data\": [],\n\t\"rows\": 0,\n\t\"exception\": \"Code: 60. DB::Exception: Unknown table\"\n}\n",
			code: 60, msg: "Unknown table"},

		{name: "plain answer", body: "1\n2\n"},
		{name: "tagged answer, data with the marker", header: map[string]string{"X-ClickHouse-Exception-Tag": tag},
			body: "__exception__\nCode: 60. DB::Exception: looks like one\n"},
		{name: "exception text in a row, not last", body: "Code: 60. DB::Exception: from query_log\n2\n"},
		{name: "text that is not an exception", body: "x\nCode: 60 is in the docs\n"},
		{name: "exception text inside a row", body: "q1\tCode: 60. DB::Exception: from query_log\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				for k, v := range c.header {
					w.Header().Set(k, v)
				}
				if c.trailer != "" {
					w.Header().Set("Trailer", "X-ClickHouse-Exception-Code")
				}
				w.WriteHeader(http.StatusOK)
				io.WriteString(w, c.body)
				if c.trailer != "" {
					w.(http.Flusher).Flush() // chunked, so the trailer follows the body
					w.Header().Set("X-ClickHouse-Exception-Code", c.trailer)
				}
				if c.abort {
					w.(http.Flusher).Flush()
					panic(http.ErrAbortHandler)
				}
			}))
			defer srv.Close()
			srv.Config.ErrorLog = nil
			s, err := NewServer(ServerConfig{DSN: srv.URL + "/"})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			out, err := s.Query(context.Background(), "SELECT 1", "JSONEachRow")
			if c.code == 0 {
				if err != nil || string(out) != c.body {
					t.Errorf("got %q, %v, want the answer unchanged", out, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("code %d", c.code)) || !strings.Contains(err.Error(), c.msg) {
				t.Fatalf("got %q, %v, want an exception with code %d and %q", out, err, c.code, c.msg)
			}
			if errors.Is(err, ErrUnavailable) != c.temporary {
				t.Errorf("%v: temporary %v, want %v", err, errors.Is(err, ErrUnavailable), c.temporary)
			}
			if strings.Contains(err.Error(), tag) {
				t.Errorf("%v: the tag is part of the message", err)
			}
		})
	}
}
