package enrich

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Why the client's transport is watched, not only the informers.
//
// client-go's reflector treats a refused watch as "the API server is
// restarting": it retries with its own backoff (0.8 s doubling to 30 s,
// with jitter) and tells nobody, since its error handler only hears of a
// ListAndWatch that failed as a whole. After a 13 s outage names stayed
// stale for 16-20 s more, with no metric or log saying so. apiHealth sits
// in the client's transport, where every list and watch of every kind
// passes:
//
//   - It knows, per kind, whether a watch stream is open: the view of that
//     kind is current while one is, and goes stale from the moment the
//     last one ends until the next opens.
//   - A GET that cannot reach the API server (refused, unreachable) is
//     held and tried again every RetryInterval (1 s, jittered) until it
//     gets through or its request ends, instead of failing into the
//     reflector's growing backoff: the watch resumes, from the resource
//     version it had, within about a second of the API server answering
//     again. Nothing was sent, so the retry is safe.
//   - Failures are counted per kind and reason, and the loss and the
//     recovery of the API server are logged.

// Defaults of the API health tracking.
const (
	// DefaultRetryInterval is how often an unreachable API server is
	// tried again.
	DefaultRetryInterval = time.Second
	// DefaultStaleAfter is how long a kind may be without an open watch
	// before its view counts as stale. A watch the API server ends on
	// its timeout (every 5-10 min) is reopened within milliseconds.
	DefaultStaleAfter = 3 * time.Second
)

// resourceKinds maps the resources watched (the last element of the URL
// path) to the kind labels of the metrics.
var resourceKinds = map[string]string{
	"pods": "pod", "services": "service", "endpointslices": "endpointslice", "nodes": "node",
	"namespaces": "namespace", "replicasets": "replicaset", "jobs": "job", "networkpolicies": "networkpolicy",
}

// apiHealth tracks the client's lists and watches per kind; see above.
type apiHealth struct {
	retry      time.Duration
	staleAfter time.Duration
	log        *slog.Logger
	errs       *prometheus.CounterVec // kind, reason
	now        func() time.Time

	mu      sync.Mutex
	kinds   map[string]*kindHealth // by kind; fixed at construction
	down    int                    // kinds without an open watch
	lostAt  time.Time              // when down became > 0
	lastLog time.Time              // of the last "unreachable" warning
	timer   *time.Timer            // marks stale staleAfter after a loss
	// unreachableSince is when the API server stopped answering its
	// readiness probe (zero while it answers): the watches may look open
	// and be dead.
	unreachableSince time.Time

	stale atomic.Bool // some kind has been without a watch for staleAfter
}

// kindHealth is one kind's state, under apiHealth.mu.
type kindHealth struct {
	open      int       // watch streams open
	downSince time.Time // when the last one ended (or tracking began); zero while one is open
	lastOK    time.Time // last successful response or stream read
}

func newAPIHealth(retry, staleAfter time.Duration, errs *prometheus.CounterVec, log *slog.Logger) *apiHealth {
	h := &apiHealth{retry: retry, staleAfter: staleAfter, log: log, errs: errs, now: time.Now, kinds: map[string]*kindHealth{}}
	now := h.now()
	for _, k := range resourceKinds {
		h.kinds[k] = &kindHealth{downSince: now}
	}
	h.down, h.lostAt = len(h.kinds), now
	h.timer = time.AfterFunc(staleAfter, h.recheck)
	return h
}

// wrap is the rest.Config WrapTransport hook.
func (h *apiHealth) wrap(rt http.RoundTripper) http.RoundTripper {
	return &healthTransport{h: h, next: rt}
}

// kindOf returns the kind a request lists or watches, "" for others.
func kindOf(r *http.Request) string {
	p := strings.TrimSuffix(r.URL.Path, "/")
	return resourceKinds[p[strings.LastIndexByte(p, '/')+1:]]
}

func isWatch(r *http.Request) bool {
	v := r.URL.Query().Get("watch")
	return v == "true" || v == "1"
}

// unreachable says err is a failure to reach the API server at all (no
// request was sent), as opposed to a failure of a request it received.
func unreachable(err error) (reason string, ok bool) {
	if errors.Is(err, syscall.ECONNREFUSED) {
		return "refused", true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return "unreachable", true
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return "unreachable", true
	}
	return "", false
}

type healthTransport struct {
	h    *apiHealth
	next http.RoundTripper
}

func (t *healthTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	kind := kindOf(req)
	if kind == "" {
		return t.next.RoundTrip(req)
	}
	h := t.h
	retryable := req.Method == http.MethodGet && (req.Body == nil || req.Body == http.NoBody)
	for busy := 0; ; {
		resp, err := t.next.RoundTrip(req)
		if err == nil && resp.StatusCode == http.StatusTooManyRequests && retryable && busy < maxBusyRetries {
			// An API server that just started answers 429 until its
			// watch cache is ready, with the wait in Retry-After; the
			// reflector would back off for longer.
			busy++
			h.failed(kind, "http_429", errors.New("HTTP 429: "+resp.Header.Get("Retry-After")))
			wait := retryAfter(resp.Header.Get("Retry-After"), h.retry)
			io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			if !sleepCtx(req.Context(), wait) {
				return nil, req.Context().Err()
			}
			continue
		}
		if err == nil {
			if resp.StatusCode >= 400 && !expectedRefusal(req, resp.StatusCode) {
				h.failed(kind, fmt.Sprintf("http_%d", resp.StatusCode), fmt.Errorf("HTTP %s", resp.Status))
				return resp, nil
			}
			if resp.StatusCode < 300 && isWatch(req) {
				h.opened(kind)
				resp.Body = &watchBody{ReadCloser: resp.Body, h: h, kind: kind}
			} else {
				h.ok(kind)
			}
			return resp, nil
		}
		if req.Context().Err() != nil {
			return nil, err // the informer stopped: no failure
		}
		reason, ok := unreachable(err)
		if !ok || !retryable {
			h.failed(kind, "error", err)
			return nil, err
		}
		h.failed(kind, reason, err)
		// Jitter keeps the informers of many collectors from retrying in
		// step when the API server comes back.
		if !sleepCtx(req.Context(), h.retry/2+rand.N(h.retry)) {
			return nil, err
		}
	}
}

// expectedRefusal says whether an error status is the informer's normal
// course rather than a failure: 410 Gone (an expired resource version:
// it lists again), and 4xx to a streaming list (sendInitialEvents) from an
// API server without the WatchList feature (client-go falls back to a
// list, at every start and relist).
func expectedRefusal(req *http.Request, code int) bool {
	if code == http.StatusGone {
		return true
	}
	return code < 500 && code != http.StatusTooManyRequests && req.URL.Query().Get("sendInitialEvents") == "true"
}

// maxBusyRetries bounds the 429 answers a request waits out before the
// reflector gets one (and backs off): an API server overloaded for good
// is not hammered every second.
const maxBusyRetries = 30

// retryAfter reads a Retry-After of whole seconds, between least and 5 s.
func retryAfter(v string, least time.Duration) time.Duration {
	s, _ := strconv.Atoi(v) // not a number: 0, so least
	return min(max(time.Duration(s)*time.Second, least), 5*time.Second)
}

// sleepCtx waits d; false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// watchBody marks the end of a watch stream.
type watchBody struct {
	io.ReadCloser
	h    *apiHealth
	kind string
	once sync.Once
	n    atomic.Int64 // reads, to note lastOK without taking the lock on every one
}

func (b *watchBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.end(err)
	} else if b.n.Add(1)%64 == 1 {
		b.h.ok(b.kind)
	}
	return n, err
}

func (b *watchBody) Close() error {
	b.end(nil)
	return b.ReadCloser.Close()
}

func (b *watchBody) end(err error) {
	b.once.Do(func() {
		if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, context.Canceled) {
			b.h.failed(b.kind, "stream", err)
		}
		b.h.closed(b.kind)
	})
}

// opened notes a watch stream of kind opened.
func (h *apiHealth) opened(kind string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := h.kinds[kind]
	k.lastOK = h.now()
	if k.open++; k.open > 1 {
		return
	}
	k.downSince = time.Time{}
	if h.down--; h.down == 0 && h.unreachableSince.IsZero() && !h.lastLog.IsZero() {
		// An outage was logged: say it ended.
		h.log.Info("kubernetes API watches restored; names are current again", "after", k.lastOK.Sub(h.lostAt).Round(time.Millisecond))
		h.lastLog = time.Time{}
	}
	h.recheckLocked()
}

// closed notes a watch stream of kind ended.
func (h *apiHealth) closed(kind string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	k := h.kinds[kind]
	if k.open--; k.open > 0 {
		return
	}
	now := h.now()
	k.downSince = now
	if h.down++; h.down == 1 {
		h.lostAt = now
	}
	h.recheckLocked()
}

func (h *apiHealth) ok(kind string) {
	h.mu.Lock()
	h.kinds[kind].lastOK = h.now()
	h.mu.Unlock()
}

// failed counts and, at most once a minute, logs a failure.
func (h *apiHealth) failed(kind, reason string, err error) {
	h.errs.WithLabelValues(kind, reason).Inc()
	h.mu.Lock()
	defer h.mu.Unlock()
	if now := h.now(); now.Sub(h.lastLog) >= time.Minute {
		h.lastLog = now
		msg := "kubernetes API request failed; names may go stale until it answers"
		if reason == "refused" || reason == "unreachable" || reason == "http_429" {
			msg += " (retrying every " + h.retry.String() + ")"
		}
		h.log.Warn(msg, "kind", kind, "reason", reason, "err", err)
	}
}

// recheck sets stale from the kinds' state (the timer's callback).
func (h *apiHealth) recheck() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recheckLocked()
}

func (h *apiHealth) recheckLocked() {
	now := h.now()
	var next time.Duration
	stale := false
	for _, k := range h.kinds {
		since := h.downSince(k)
		if since.IsZero() {
			continue
		}
		if age := now.Sub(since); age >= h.staleAfter {
			stale = true
		} else if left := h.staleAfter - age; next == 0 || left < next {
			next = left
		}
	}
	h.stale.Store(stale)
	if next > 0 {
		h.timer.Reset(next)
	}
}

// downSince is since when k has had no trustworthy watch: its own loss,
// or the API server's silence to the probe, whichever came first; zero
// while it has one. Under h.mu.
func (h *apiHealth) downSince(k *kindHealth) time.Time {
	switch {
	case h.unreachableSince.IsZero():
		return k.downSince
	case k.downSince.IsZero() || h.unreachableSince.Before(k.downSince):
		return h.unreachableSince
	}
	return k.downSince
}

// KindStatus is the state of the view of one kind.
type KindStatus struct {
	Kind string `json:"kind"`
	// Watching is true while a watch of the kind is open and the API
	// server answers its readiness probe: its view is
	// current.
	Watching bool `json:"watching"`
	// StaleFor is how long the kind has been without a watch (0 while
	// watching).
	StaleFor time.Duration `json:"stale_for_ns"`
	// LastOK is the last successful response or watch data.
	LastOK time.Time `json:"last_ok"`
}

// status returns every kind's state, sorted by kind.
func (h *apiHealth) status() []KindStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	out := make([]KindStatus, 0, len(h.kinds))
	for kind, k := range h.kinds {
		since := h.downSince(k)
		s := KindStatus{Kind: kind, Watching: since.IsZero(), LastOK: k.lastOK}
		if !s.Watching {
			s.StaleFor = now.Sub(since)
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b KindStatus) int { return strings.Compare(a.Kind, b.Kind) })
	return out
}

func (h *apiHealth) stop() { h.timer.Stop() }

// DefaultProbeInterval is how often the API server's /readyz is probed.
const DefaultProbeInterval = 5 * time.Second

// runProbe asks probe every interval (each bounded by the interval) until
// ctx ends. It catches what the streams do not show: a host that stops
// answering without closing its connections (a partition) leaves every
// watch open and silent until HTTP/2's own health check gives up, about
// 45 s later. While probes fail, every kind counts as without a watch.
func (h *apiHealth) runProbe(ctx context.Context, interval time.Duration, probe func(context.Context) error) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, interval)
		err := probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		h.probed(err)
	}
}

// probed records a probe's outcome.
func (h *apiHealth) probed(err error) {
	if err != nil {
		h.errs.WithLabelValues("apiserver", "probe").Inc()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	switch {
	case err != nil && h.unreachableSince.IsZero():
		h.unreachableSince = now
		if now.Sub(h.lastLog) >= time.Minute {
			h.lastLog = now
			h.log.Warn("kubernetes API server does not answer its readiness probe; names may go stale until it does", "err", err)
		}
	case err == nil && !h.unreachableSince.IsZero():
		h.unreachableSince = time.Time{}
		if h.down == 0 && !h.lastLog.IsZero() {
			h.log.Info("kubernetes API server answers again", "after", now.Sub(h.lostAt).Round(time.Millisecond))
			h.lastLog = time.Time{}
		}
	}
	h.recheckLocked()
}
