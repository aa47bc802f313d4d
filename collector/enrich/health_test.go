package enrich

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// fakeAPI serves watches of pods that stream until the server goes away,
// on a fixed loopback address so that it can come back on it.
type fakeAPI struct {
	t    *testing.T
	addr string
	mu   sync.Mutex
	srv  *httptest.Server
	code int // answer to lists and watches (0: 200)
	busy int // answers 429 to this many requests first
}

func newFakeAPI(t *testing.T) *fakeAPI {
	f := &fakeAPI{t: t}
	f.start("127.0.0.1:0")
	f.addr = f.srv.Listener.Addr().String()
	t.Cleanup(f.stop)
	return f
}

func (f *fakeAPI) start(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		f.t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		code := f.code
		if f.busy > 0 {
			f.busy--
			code = http.StatusTooManyRequests
			w.Header().Set("Retry-After", "1")
		}
		f.mu.Unlock()
		if code != 0 {
			http.Error(w, "no", code)
			return
		}
		if r.URL.Query().Get("watch") != "true" {
			fmt.Fprintln(w, `{"kind":"PodList"}`)
			return
		}
		fl := w.(http.Flusher)
		for {
			if _, err := fmt.Fprintln(w, `{"type":"BOOKMARK"}`); err != nil {
				return
			}
			fl.Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	f.mu.Lock()
	f.srv = srv
	f.mu.Unlock()
}

// stop kills the server and every connection, as a killed API server.
func (f *fakeAPI) stop() {
	f.mu.Lock()
	srv := f.srv
	f.srv = nil
	f.mu.Unlock()
	if srv != nil {
		srv.CloseClientConnections()
		srv.Listener.Close()
		srv.Close()
	}
}

func (f *fakeAPI) setCode(c int) {
	f.mu.Lock()
	f.code = c
	f.mu.Unlock()
}

func newTestHealth(t *testing.T) (*apiHealth, *http.Client) {
	h := newAPIHealth(50*time.Millisecond, 100*time.Millisecond, newWatchErrors(), discard())
	t.Cleanup(h.stop)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	return h, &http.Client{Transport: h.wrap(tr)}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func kindState(h *apiHealth, kind string) KindStatus {
	for _, s := range h.status() {
		if s.Kind == kind {
			return s
		}
	}
	return KindStatus{}
}

// watchPods opens a pods watch and reads it until it ends; done receives the
// end.
func watchPods(ctx context.Context, c *http.Client, url string, done chan<- error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/api/v1/pods?watch=true&resourceVersion=1", nil)
	resp, err := c.Do(req)
	if err != nil {
		done <- err
		return
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	done <- err
}

func TestHealthOutageAndRecovery(t *testing.T) {
	f := newFakeAPI(t)
	h, c := newTestHealth(t)
	url := "http://" + f.addr
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	// Before any watch every kind is down, and stale once staleAfter
	// has passed.
	waitUntil(t, "stale before the first watch", h.stale.Load)

	done := make(chan error, 1)
	go watchPods(ctx, c, url, done)
	waitUntil(t, "pod watch open", func() bool { return kindState(h, "pod").Watching })
	if s := kindState(h, "pod"); s.StaleFor != 0 || s.LastOK.IsZero() {
		t.Errorf("pod while watching: %+v", s)
	}
	// The other kinds are still without a watch: stale.
	if !h.stale.Load() {
		t.Error("not stale with seven kinds unwatched")
	}
	for k := range h.kinds {
		if k != "pod" {
			h.opened(k) // as if their informers watched too
		}
	}
	if h.stale.Load() {
		t.Fatal("stale with every kind watched")
	}

	// The API server dies: the stream breaks, the kind goes down, and
	// the view is stale after staleAfter, not before.
	killed := time.Now()
	f.stop()
	if err := <-done; err == nil {
		t.Log("watch ended cleanly") // either way the kind is down
	}
	if s := kindState(h, "pod"); s.Watching {
		t.Fatalf("pod still watching after the server died: %+v", s)
	}
	waitUntil(t, "stale after the outage", h.stale.Load)
	if d := time.Since(killed); d < h.staleAfter {
		t.Errorf("stale %v after the loss, before staleAfter %v", d, h.staleAfter)
	}

	// A watch started meanwhile is held (connection refused, retried),
	// not failed: it opens as soon as the server is back.
	go watchPods(ctx, c, url, done)
	waitUntil(t, "refused attempts counted", func() bool {
		return testutil.ToFloat64(h.errs.WithLabelValues("pod", "refused")) >= 2
	})
	select {
	case err := <-done:
		t.Fatalf("watch returned during the outage: %v", err)
	default:
	}
	back := time.Now()
	f.start(f.addr)
	waitUntil(t, "pod watch reopened", func() bool { return kindState(h, "pod").Watching })
	t.Logf("watch reopened %v after the server came back (retry interval %v)", time.Since(back).Round(time.Millisecond), h.retry)
	if h.stale.Load() {
		t.Error("still stale once every kind watches again")
	}
	if n := testutil.ToFloat64(h.errs.WithLabelValues("pod", "stream")) + testutil.ToFloat64(h.errs.WithLabelValues("pod", "error")); n > 2 {
		t.Errorf("broken stream counted %v times", n)
	}

	// Shutting down (the request's context ends) is no failure.
	before := testutil.ToFloat64(h.errs.WithLabelValues("pod", "stream"))
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Logf("watch ended with %v", err)
	}
	waitUntil(t, "pod watch closed", func() bool { return !kindState(h, "pod").Watching })
	if n := testutil.ToFloat64(h.errs.WithLabelValues("pod", "stream")); n != before {
		t.Errorf("a cancelled watch counted as broken (%v → %v)", before, n)
	}
}

func TestHealthHTTPErrorsAndPassThrough(t *testing.T) {
	f := newFakeAPI(t)
	h, c := newTestHealth(t)
	url := "http://" + f.addr
	f.setCode(http.StatusForbidden)
	resp, err := c.Get(url + "/apis/batch/v1/jobs?limit=500")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("status %d", resp.StatusCode)
	}
	if n := testutil.ToFloat64(h.errs.WithLabelValues("job", "http_403")); n != 1 {
		t.Errorf("403 counted %v", n)
	}
	// 410 Gone is the reflector's normal relist, not a failure.
	f.setCode(http.StatusGone)
	resp, err = c.Get(url + "/apis/networking.k8s.io/v1/namespaces/x/networkpolicies?watch=true")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if n := testutil.CollectAndCount(h.errs, "dualflow_enrich_watch_errors_total"); n != 1 {
		t.Errorf("%d series after a 410, want only the 403's", n)
	}
	// Requests that are not lists or watches of a watched kind pass
	// through untracked, and one that cannot be retried (not a GET)
	// fails at once.
	f.stop()
	start := time.Now()
	if _, err := c.Get(url + "/version"); err == nil {
		t.Error("GET /version succeeded with the server down")
	}
	req, _ := http.NewRequest(http.MethodPost, url+"/api/v1/pods", nil)
	if _, err := c.Do(req); err == nil {
		t.Error("POST succeeded with the server down")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("untracked requests took %v: held?", d)
	}
	if n := testutil.ToFloat64(h.errs.WithLabelValues("pod", "error")); n != 1 {
		t.Errorf("failed POST counted %v", n)
	}
}

func TestKindOf(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/pods":                                "pod",
		"/api/v1/namespaces/x/pods":                   "pod",
		"/api/v1/namespaces":                          "namespace",
		"/apis/discovery.k8s.io/v1/endpointslices":    "endpointslice",
		"/apis/networking.k8s.io/v1/networkpolicies/": "networkpolicy",
		"/apis/apps/v1/replicasets":                   "replicaset",
		"/version":                                    "",
		"/api/v1/namespaces/x/pods/p/log":             "",
		"/apis/coordination.k8s.io/v1/leases":         "",
	} {
		req, _ := http.NewRequest(http.MethodGet, "https://127.0.0.1"+path, nil)
		if got := kindOf(req); got != want {
			t.Errorf("kindOf(%s) = %q, want %q", path, got, want)
		}
	}
}

var _ prometheus.Collector = (*healthCollector)(nil)

// TestHealthWaitsOutStartup: an API server whose watch cache is not ready
// answers 429 with Retry-After; the request waits it out instead of
// handing the reflector a failure (and its backoff), a bounded number of
// times.
func TestHealthWaitsOutStartup(t *testing.T) {
	f := newFakeAPI(t)
	h, c := newTestHealth(t)
	f.mu.Lock()
	f.busy = 2
	f.mu.Unlock()
	start := time.Now()
	resp, err := c.Get("http://" + f.addr + "/api/v1/nodes?limit=500")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("status %d after two 429s", resp.StatusCode)
	}
	if d := time.Since(start); d < 2*time.Second {
		t.Errorf("answered after %v: Retry-After: 1 not honoured", d)
	}
	if n := testutil.ToFloat64(h.errs.WithLabelValues("node", "http_429")); n != 2 {
		t.Errorf("429s counted %v", n)
	}
	if d := retryAfter("3600", time.Second); d != 5*time.Second {
		t.Errorf("Retry-After 3600 waits %v", d)
	}
	if d := retryAfter("", time.Second); d != time.Second {
		t.Errorf("no Retry-After waits %v", d)
	}
}

// freezingProxy forwards TCP to addr until frozen, then keeps every
// connection open and forwards nothing: a partition, or a host that
// stopped answering.
type freezingProxy struct {
	ln     net.Listener
	mu     sync.Mutex
	frozen bool
}

func newFreezingProxy(t *testing.T, addr string) *freezingProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{ln: ln}
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			cc, err := ln.Accept()
			if err != nil {
				return
			}
			sc, err := net.Dial("tcp", addr)
			if err != nil {
				cc.Close()
				continue
			}
			p.mu.Lock()
			conns = append(conns, cc, sc)
			p.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 4096)
				for {
					n, err := src.Read(buf)
					if err != nil {
						return
					}
					if !p.isFrozen() {
						dst.Write(buf[:n])
					}
				}
			}
			go pipe(cc, sc)
			go pipe(sc, cc)
		}
	}()
	return p
}

func (p *freezingProxy) isFrozen() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.frozen
}

func (p *freezingProxy) freeze(v bool) {
	p.mu.Lock()
	p.frozen = v
	p.mu.Unlock()
}

// TestHealthPartition: a host that stops answering without closing its
// connections leaves the watches open and silent; the readiness probe
// notices, the view goes stale, and comes back when the host answers.
func TestHealthPartition(t *testing.T) {
	f := newFakeAPI(t)
	p := newFreezingProxy(t, f.addr)
	h, c := newTestHealth(t)
	url := "http://" + p.ln.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go watchPods(ctx, c, url, done)
	for k := range h.kinds {
		if k != "pod" {
			h.opened(k)
		}
	}
	waitUntil(t, "pod watch open", func() bool { return kindState(h, "pod").Watching })
	probe := func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		return nil
	}
	probing := make(chan struct{})
	go func() { defer close(probing); h.runProbe(ctx, 100*time.Millisecond, probe) }()
	defer func() { cancel(); <-probing }()
	time.Sleep(300 * time.Millisecond) // probes pass meanwhile
	if h.stale.Load() {
		t.Fatal("stale while the API server answers")
	}
	p.freeze(true)
	waitUntil(t, "stale during the partition", h.stale.Load)
	if s := kindState(h, "pod"); s.Watching || s.StaleFor < h.staleAfter {
		t.Errorf("pod during the partition: %+v", s)
	}
	if n := testutil.ToFloat64(h.errs.WithLabelValues("apiserver", "probe")); n < 1 {
		t.Errorf("failed probes counted %v", n)
	}
	p.freeze(false)
	waitUntil(t, "current once the host answers", func() bool { return !h.stale.Load() })
}

// TestHealthExpectedRefusals: a 422 to a streaming list (an API server
// without WatchList; client-go falls back to a list) and a 410 Gone are
// the informer's normal course: not counted, not logged.
func TestHealthExpectedRefusals(t *testing.T) {
	f := newFakeAPI(t)
	h, c := newTestHealth(t)
	for code, path := range map[int]string{
		http.StatusUnprocessableEntity: "/api/v1/pods?watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan",
		http.StatusGone:                "/api/v1/pods?watch=true&resourceVersion=5",
	} {
		f.setCode(code)
		resp, err := c.Get("http://" + f.addr + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	if n := testutil.CollectAndCount(h.errs, "dualflow_enrich_watch_errors_total"); n != 0 {
		t.Errorf("%d failure series after expected refusals", n)
	}
	// A cancelled request (the informer stopping) is no failure either.
	f.stop()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.addr+"/api/v1/pods", nil)
	if _, err := c.Do(req); err == nil {
		t.Error("cancelled request succeeded")
	}
	if n := testutil.CollectAndCount(h.errs, "dualflow_enrich_watch_errors_total"); n != 0 {
		t.Errorf("%d failure series after a cancelled request", n)
	}
}
