// Package agent is the node agent API of traceflow and its controller
// side. The exporter on every node serves Handler (a node's tracer:
// package traceflow/node); the collector's traceflow controller reaches
// the agents through Cluster, which asks every node the probe may cross to
// watch for it, asks the source node to inject it, and merges what the
// nodes saw into one path.
//
//	POST /agent/v1/watch   {"probe": Probe, "timeout": "3s"} → 200 JSON lines of traceflow.WatchEvent:
//	                       {"ready":true} once the node observes, then what it sees, until the
//	                       caller closes the request or the timeout ends
//	POST /agent/v1/inject  {"probe": Probe} → 200 {"node": …}; 404 when the source pod is not on the node;
//	                       400 for a probe a trace does not need (Probe.Sendable); 429 with
//	                       Retry-After beyond the caller's or the node's rate (Limits)
//	GET  /agent/v1/info    → 200 {"node": …, "datapath": …}
//
// Every call needs "Authorization: Bearer <token>" (the scheme in any
// case, RFC 7235; the token compared in constant time); the token comes
// from the environment or a file of mode 0600 (or 0640/0440 for the
// process's own group), never from a flag. TLS, with client certificates
// when the agent is given a client CA, comes from files reloaded when they
// change (package reload): the exporter serves the agent with them, and
// NewDirectory gives the controller's client its own.
package agent

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/internal/secretfile"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/node"
	"github.com/dualflow/dualflow/traceflow/ratelimit"
)

// Paths of the agent API.
const (
	WatchPath  = "/agent/v1/watch"
	InjectPath = "/agent/v1/inject"
	InfoPath   = "/agent/v1/info"
)

// TokenEnv is the environment variable holding the bearer token.
const TokenEnv = "DUALFLOW_TRACEFLOW_TOKEN"

// maxBody caps request bodies and one line of a watch stream.
const maxBody = 1 << 20

// MaxTimeout caps the timeout of a watch.
const MaxTimeout = time.Minute

// setupWait is how long a watch may take to become ready (its trace table
// loaded and echoed by the node's monitor) before its timeout starts: a
// node asked for many watches at once loads their tables a few at a
// time, and the caller's timeout is how long to observe, not to queue.
const setupWait = 30 * time.Second

// writeTimeout bounds writing one watch event to the controller.
const writeTimeout = 10 * time.Second

// MaxWatches bounds the watches an agent serves at once (a controller has
// at most 63 probes in flight).
const MaxWatches = 128

// ErrUnauthorized is returned by Client when the agent refuses the token.
var ErrUnauthorized = errors.New("unauthorized (wrong or missing traceflow token)")

// Node is a node's tracer (traceflow/node.Tracer).
type Node interface {
	Watch(ctx context.Context, p traceflow.Probe, emit func(traceflow.WatchEvent) error) error
	Inject(ctx context.Context, p traceflow.Probe) error
}

// Info describes an agent.
type Info struct {
	Node     string `json:"node"`
	Datapath string `json:"datapath"`
}

type watchRequest struct {
	Probe   traceflow.Probe    `json:"probe"`
	Timeout traceflow.Duration `json:"timeout"`
}

type injectRequest struct {
	Probe traceflow.Probe `json:"probe"`
}

type errorBody struct {
	Error string `json:"error"`
}

// LoadToken reads the token from $DUALFLOW_TRACEFLOW_TOKEN, else from
// file (trailing whitespace trimmed). An empty token is an error, and so
// is a file others may read or write, or its group write, or its group
// read unless the process is in that group (package secretfile: a
// Kubernetes Secret mounted 0440 for the pod's fsGroup passes; 0644 does
// not).
func LoadToken(file string) (string, error) {
	tok := strings.TrimSpace(os.Getenv(TokenEnv))
	if tok == "" && file != "" {
		b, err := secretfile.Read("traceflow token file", file)
		if err != nil {
			return "", err
		}
		tok = strings.TrimSpace(string(b))
	}
	if tok == "" {
		return "", fmt.Errorf("traceflow token: set $%s or a token file", TokenEnv)
	}
	return tok, nil
}

// Metrics of an agent.
type Metrics struct {
	requests *prometheus.CounterVec
	watches  prometheus.Gauge
}

// NewMetrics registers the agent's metrics with reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "dualflow_traceflow_agent_requests_total",
			Help: "Traceflow agent calls by call (watch, inject, info) and result (ok, unauthorized, invalid, not_found, not_supported, busy, rate_limited, error)."},
			[]string{"call", "result"}),
		watches: prometheus.NewGauge(prometheus.GaugeOpts{Name: "dualflow_traceflow_agent_watches",
			Help: "Traceflow probes the agent is watching for now."}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.watches)
	}
	return m
}

// Limits bound the probes an agent sends (POST /agent/v1/inject): per
// caller (its TLS client certificate's subject, else its address) and for
// the node, all callers together.
type Limits struct {
	Caller, Node ratelimit.Limit
}

// DefaultLimits are an agent's limits unless WithLimits says otherwise.
// A trace sends its probe at most 3 times, 1 s apart, most are delivered
// at the first send, and the controller holds each source node to 10
// family traces a second after a burst of 40 (traceflow.DefaultNodeLimit):
// a controller stays within its caller's bucket (a resend beyond it waits
// for the Retry-After), two controllers within the node's, and one holding
// the agent token sends 10 SYNs a second (after 40) instead of a thousand.
var DefaultLimits = Limits{
	Caller: ratelimit.Limit{Rate: 10, Burst: 40},
	Node:   ratelimit.Limit{Rate: 20, Burst: 80},
}

// HandlerOption tunes Handler.
type HandlerOption func(*handlerConfig)

type handlerConfig struct{ limits Limits }

// WithLimits sets the probe rate limits (a Rate below 0: no limit).
func WithLimits(l Limits) HandlerOption { return func(c *handlerConfig) { c.limits = l } }

// nodeKey is the key of the node's bucket.
const nodeKey = "node"

// Handler serves the agent API of node n, accepting only "Authorization:
// Bearer <token>" (the scheme in any case). It panics if token is empty:
// an open agent would inject packets for anyone.
func Handler(n Node, info Info, token string, m *Metrics, opts ...HandlerOption) http.Handler {
	if token == "" {
		panic("traceflow agent: empty token")
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	cfg := handlerConfig{limits: DefaultLimits}
	for _, o := range opts {
		o(&cfg)
	}
	callers, nodeBucket := ratelimit.NewKeyed(cfg.limits.Caller), ratelimit.NewKeyed(cfg.limits.Node).Bucket(nodeKey)
	// Compared by their SHA-256, so that the time taken says nothing of
	// the length either.
	want := sha256.Sum256([]byte(token))
	var active atomic.Int64
	auth := func(call string, h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			got := sha256.Sum256([]byte(bearer(r.Header.Get("Authorization"))))
			if subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
				m.requests.WithLabelValues(call, "unauthorized").Inc()
				w.Header().Set("WWW-Authenticate", `Bearer realm="dualflow-traceflow"`)
				writeJSON(w, http.StatusUnauthorized, errorBody{"unauthorized"})
				return
			}
			h(w, r)
		}
	}
	fail := func(w http.ResponseWriter, call string, err error) {
		status, result := http.StatusInternalServerError, "error"
		var rl *traceflow.RateLimitError
		switch {
		case errors.As(err, &rl):
			status, result = http.StatusTooManyRequests, "rate_limited"
			w.Header().Set("Retry-After", strconv.Itoa(ratelimit.RetryAfterSeconds(rl.RetryAfter)))
		case errors.Is(err, traceflow.ErrInvalid):
			status, result = http.StatusBadRequest, "invalid"
		case errors.Is(err, node.ErrPodNotOnNode):
			status, result = http.StatusNotFound, "not_found"
		case errors.Is(err, traceflow.ErrNotSupported):
			status, result = http.StatusNotImplemented, "not_supported"
		}
		m.requests.WithLabelValues(call, result).Inc()
		writeJSON(w, status, errorBody{err.Error()})
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+InfoPath, auth("info", func(w http.ResponseWriter, r *http.Request) {
		m.requests.WithLabelValues("info", "ok").Inc()
		writeJSON(w, http.StatusOK, info)
	}))
	mux.HandleFunc("POST "+InjectPath, auth("inject", func(w http.ResponseWriter, r *http.Request) {
		var req injectRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&req); err != nil {
			fail(w, "inject", fmt.Errorf("%w: decode request: %v", traceflow.ErrInvalid, err))
			return
		}
		if err := req.Probe.Sendable(); err != nil {
			fail(w, "inject", err)
			return
		}
		caller := callerOf(r)
		if wait, slowest, ok := ratelimit.Take(time.Now(), 1, 0, callers.Bucket(caller), nodeBucket); !ok {
			scope := "caller " + caller
			if slowest == 1 {
				scope = "node " + info.Node
			}
			fail(w, "inject", &traceflow.RateLimitError{Scope: scope, RetryAfter: wait})
			return
		}
		if err := n.Inject(r.Context(), req.Probe); err != nil {
			fail(w, "inject", err)
			return
		}
		m.requests.WithLabelValues("inject", "ok").Inc()
		writeJSON(w, http.StatusOK, Info{Node: info.Node})
	}))
	mux.HandleFunc("POST "+WatchPath, auth("watch", func(w http.ResponseWriter, r *http.Request) {
		var req watchRequest
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&req); err != nil {
			fail(w, "watch", fmt.Errorf("%w: decode request: %v", traceflow.ErrInvalid, err))
			return
		}
		timeout := time.Duration(req.Timeout)
		if timeout <= 0 || timeout > MaxTimeout {
			fail(w, "watch", fmt.Errorf("%w: timeout %v: want 0 < timeout <= %v", traceflow.ErrInvalid, timeout, MaxTimeout))
			return
		}
		if active.Add(1) > MaxWatches {
			active.Add(-1)
			m.requests.WithLabelValues("watch", "busy").Inc()
			writeJSON(w, http.StatusTooManyRequests, errorBody{fmt.Sprintf("more than %d watches at once", MaxWatches)})
			return
		}
		defer active.Add(-1)
		m.watches.Inc()
		defer m.watches.Dec()
		ctx, cancel := context.WithCancelCause(r.Context())
		defer cancel(nil)
		deadline := time.AfterFunc(setupWait+timeout, func() { cancel(context.DeadlineExceeded) })
		defer deadline.Stop()
		rc := http.NewResponseController(w)
		enc := json.NewEncoder(w)
		started := false
		err := n.Watch(ctx, req.Probe, func(ev traceflow.WatchEvent) error {
			if ev.Ready {
				deadline.Reset(timeout) // observe for timeout from now
			}
			if !started {
				started = true
				w.Header().Set("Content-Type", "application/x-ndjson")
				w.WriteHeader(http.StatusOK)
			}
			// A controller that stops reading ends the watch instead of
			// blocking it (and the node's monitor) until TCP gives up.
			rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			if err := enc.Encode(ev); err != nil {
				return err
			}
			return rc.Flush()
		})
		switch {
		case err == nil || ctx.Err() != nil && started:
			m.requests.WithLabelValues("watch", "ok").Inc()
		case !started:
			fail(w, "watch", err)
		default:
			m.requests.WithLabelValues("watch", "error").Inc()
			enc.Encode(traceflow.WatchEvent{Error: err.Error()})
		}
	}))
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v) // status already sent; nothing to do on error
}

// bearer returns the token of an "Authorization: Bearer <token>" header
// value, the scheme matched in any case (RFC 7235); "" when it is not one.
func bearer(h string) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// callerOf names the caller of r for its rate limit: the subject of its
// verified TLS client certificate (mutual TLS), else its address. Every
// caller holds the same token, so the token cannot tell them apart.
func callerOf(r *http.Request) string {
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		return "cert:" + r.TLS.PeerCertificates[0].Subject.String()
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "addr:" + host
}

// Client calls one node's agent. It is safe for concurrent use.
type Client struct {
	// Node is the node's name (in errors).
	Node string
	// URL is the agent's base URL, e.g. https://[fd00:10::1]:9444.
	URL string
	// Fallback are other base URLs of the same agent, tried in order when
	// URL cannot be reached (the node's other family).
	Fallback []string
	Token    string
	// HTTP is the client to use (default http.DefaultClient); give it the
	// TLS settings of a real deployment (NewDirectory). Its Timeout must be
	// zero: a watch lasts as long as its context.
	HTTP *http.Client
}

func (c *Client) hc() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// AgentError is an agent call that failed: the node, what was asked, and
// why (unreachable, unauthorized, an error of the agent).
type AgentError struct {
	Node, URL, Call string
	Err             error
}

func (e *AgentError) Error() string {
	return fmt.Sprintf("node %s: traceflow agent %s: %s: %v", e.Node, e.URL, e.Call, e.Err)
}

func (e *AgentError) Unwrap() error { return e.Err }

func (c *Client) fail(call string, err error) error {
	return &AgentError{Node: c.Node, URL: c.URL, Call: call, Err: err}
}

func (c *Client) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	// The agent's URL, then its other addresses (a dual-stack node's IPv4
	// one when the agent does not answer on IPv6), on connection errors.
	var resp *http.Response
	var errs []error
	for _, base := range append([]string{c.URL}, c.Fallback...) {
		req, err := http.NewRequestWithContext(ctx, method, strings.TrimRight(base, "/")+path, bytes.NewReader(b))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Authorization", "Bearer "+c.Token)
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err = c.hc().Do(req)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		errs = append(errs, err)
	}
	if resp == nil {
		return nil, fmt.Errorf("unreachable: %w", errors.Join(errs...))
	}
	if resp.StatusCode == http.StatusOK {
		return resp, nil
	}
	defer resp.Body.Close()
	b, _ = io.ReadAll(io.LimitReader(resp.Body, maxBody))
	var eb errorBody
	json.Unmarshal(b, &eb)
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		return nil, ErrUnauthorized
	case http.StatusTooManyRequests:
		secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
		if err != nil || secs < 1 {
			secs = 1
		}
		return nil, &traceflow.RateLimitError{Scope: "probes sent by this agent", RetryAfter: time.Duration(secs) * time.Second}
	case http.StatusNotFound:
		if eb.Error == "" { // not the agent's answer: a wrong URL or port
			return nil, fmt.Errorf("%s (is this a dualflow traceflow agent?)", resp.Status)
		}
		return nil, fmt.Errorf("%w: %s", node.ErrPodNotOnNode, eb.Error)
	case http.StatusNotImplemented:
		return nil, fmt.Errorf("%w: %s", traceflow.ErrNotSupported, eb.Error)
	case http.StatusBadRequest:
		return nil, fmt.Errorf("%w: %s", traceflow.ErrInvalid, eb.Error)
	}
	return nil, fmt.Errorf("%s: %s", resp.Status, cmp.Or(eb.Error, strings.TrimSpace(string(b))))
}

// Info asks the agent who it is.
func (c *Client) Info(ctx context.Context) (Info, error) {
	resp, err := c.do(ctx, http.MethodGet, InfoPath, nil)
	if err != nil {
		return Info{}, c.fail("info", err)
	}
	defer resp.Body.Close()
	var in Info
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxBody)).Decode(&in); err != nil {
		return Info{}, c.fail("info", err)
	}
	return in, nil
}

// Inject asks the agent to send p from its source pod.
func (c *Client) Inject(ctx context.Context, p traceflow.Probe) error {
	resp, err := c.do(ctx, http.MethodPost, InjectPath, injectRequest{Probe: p})
	if err != nil {
		return c.fail("inject", err)
	}
	resp.Body.Close()
	return nil
}

// Stream is a watch in progress.
type Stream struct {
	c    *Client
	body io.ReadCloser
	sc   *bufio.Scanner
}

// Watch asks the agent to watch for p until ctx ends (it needs a
// deadline) and returns once the agent observes.
func (c *Client) Watch(ctx context.Context, p traceflow.Probe) (*Stream, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		return nil, c.fail("watch", errors.New("the context needs a deadline"))
	}
	timeout := min(time.Until(dl), MaxTimeout)
	if timeout <= 0 {
		return nil, c.fail("watch", context.DeadlineExceeded)
	}
	resp, err := c.do(ctx, http.MethodPost, WatchPath, watchRequest{Probe: p, Timeout: traceflow.Duration(timeout)})
	if err != nil {
		return nil, c.fail("watch", err)
	}
	s := &Stream{c: c, body: resp.Body, sc: bufio.NewScanner(resp.Body)}
	s.sc.Buffer(make([]byte, 4096), maxBody)
	ev, err := s.Next()
	if err != nil {
		s.Close()
		return nil, err
	}
	if !ev.Ready {
		s.Close()
		return nil, c.fail("watch", fmt.Errorf("first event is not ready: %+v", ev))
	}
	return s, nil
}

// Next returns the next event; io.EOF when the agent ended the stream.
func (s *Stream) Next() (traceflow.WatchEvent, error) {
	if !s.sc.Scan() {
		if err := s.sc.Err(); err != nil {
			return traceflow.WatchEvent{}, s.c.fail("watch", err)
		}
		return traceflow.WatchEvent{}, io.EOF
	}
	var ev traceflow.WatchEvent
	if err := json.Unmarshal(s.sc.Bytes(), &ev); err != nil {
		return ev, s.c.fail("watch", fmt.Errorf("bad event: %w", err))
	}
	if ev.Error != "" {
		return ev, s.c.fail("watch", errors.New(ev.Error))
	}
	return ev, nil
}

// Close ends the watch.
func (s *Stream) Close() error { return s.body.Close() }
