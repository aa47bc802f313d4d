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
			if resp.StatusCode >= 400 && resp.StatusCode != http.StatusGone {
				// 410 Gone is an expired resource version: the reflector
				// lists again, which is its normal course.
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

// maxBusyRetries bounds the 429 answers a request waits out before the
// reflector gets one (and backs off): an API server overloaded for good
// is not hammered every second.
const maxBusyRetries = 30

// retryAfter reads a Retry-After of whole seconds, between least and 5 s.
func retryAfter(v string, least time.Duration) time.Duration {
	d := least
	if s, err := strconv.Atoi(v); err == nil && time.Duration(s)*time.Second > d {
		d = time.Duration(s) * time.Second
	}
	return min(d, 5*time.Second)
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
	if h.down--; h.down == 0 {
		h.stale.Store(false)
		if !h.lastLog.IsZero() { // an outage was logged: say it ended
			h.log.Info("kubernetes API watches restored; names are current again", "after", k.lastOK.Sub(h.lostAt).Round(time.Millisecond))
			h.lastLog = time.Time{}
		}
		return
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
		h.log.Warn("kubernetes API request failed; names may go stale until it answers (retrying every "+h.retry.String()+")",
			"kind", kind, "reason", reason, "err", err)
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
		if k.downSince.IsZero() {
			continue
		}
		if age := now.Sub(k.downSince); age >= h.staleAfter {
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

// KindStatus is the state of the view of one kind.
type KindStatus struct {
	Kind string `json:"kind"`
	// Watching is true while a watch of the kind is open: its view is
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
		s := KindStatus{Kind: kind, Watching: k.downSince.IsZero(), LastOK: k.lastOK}
		if !s.Watching {
			s.StaleFor = now.Sub(k.downSince)
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b KindStatus) int { return strings.Compare(a.Kind, b.Kind) })
	return out
}

func (h *apiHealth) stop() { h.timer.Stop() }
