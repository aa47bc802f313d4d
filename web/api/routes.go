package api

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/docs"
	"github.com/dualflow/dualflow/internal/reload"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

//go:embed openapi.json
var openapiFS embed.FS

var identRe = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// errorBody is every error answer: a message and, for bad input, the field.
type errorBody struct {
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// Detail is the store's whole answer when Message is its summary
	// (an engine error names the generated SQL: a details line, not the
	// message).
	Detail string `json:"detail,omitempty"`
}

func (a *API) routes() *gin.Engine {
	r := gin.New()
	r.Use(a.recover, a.observe)
	r.GET("/healthz", func(c *gin.Context) { c.String(http.StatusOK, "ok\n") })
	r.GET("/readyz", a.readyz)
	v1 := r.Group("/api/v1", a.sameSite)
	v1.GET("/openapi.json", func(c *gin.Context) {
		b, _ := openapiFS.ReadFile("openapi.json")
		c.Data(http.StatusOK, "application/json", b)
	})
	// What a Kubernetes user who may list pods in some namespaces only
	// reads, of those namespaces.
	scoped := v1.Group("", a.auth(PermViewNamespaces))
	scoped.GET("/whoami", a.whoami)
	scoped.GET("/flows", a.answer(a.flows))
	scoped.GET("/flows/summary", a.answer(a.summary))
	scoped.GET("/servicemap", a.answer(a.servicemap))
	scoped.GET("/catalog", a.configured("catalog", a.cfg.Catalog != nil), a.answer(a.catalog))
	scoped.GET("/filters", a.filterDoc)
	scoped.GET("/schema", func(c *gin.Context) { c.Data(http.StatusOK, "text/markdown; charset=utf-8", docs.Schema) })
	viewer := v1.Group("", a.auth(PermView))
	viewer.GET("/status", a.configured("status", a.cfg.Status != nil), a.answer(a.status))
	scoped.POST("/reachability", a.bounded(a.reachGate), a.answer(a.reachability))
	// The SQL interface's reference (docs/schema.md), for the SQL page,
	// is scoped's.
	audited := a.configured("audit", a.cfg.Audit != nil)
	a.auditRoutes(scoped.Group("/audit", audited), viewer.Group("/audit", audited))
	a.recommendRoutes(viewer.Group("/policy"))
	tracing := a.configured("traceflow", a.cfg.Traces != nil)
	scoped.GET("/traceflows/:id", tracing, a.getTrace)
	v1.POST("/traceflows", a.auth(PermTrace), tracing, a.startTrace)
	v1.POST("/sql", a.auth(PermSQL), a.configured("sql", a.cfg.SQL != nil), a.answer(a.sql))
	metricsHandler := promhttp.HandlerFor(a.metrics.gatherer(a.cfg.Gatherer), promhttp.HandlerOpts{})
	r.GET("/metrics", a.auth(PermMetrics), gin.WrapH(metricsHandler))
	r.NoRoute(func(c *gin.Context) {
		c.JSON(http.StatusNotFound, errorBody{Message: "no route " + c.Request.Method + " " + c.Request.URL.Path})
	})
	r.HandleMethodNotAllowed = true
	r.NoMethod(func(c *gin.Context) {
		c.JSON(http.StatusMethodNotAllowed, errorBody{Message: "method " + c.Request.Method + " not allowed on " + c.Request.URL.Path})
	})
	return r
}

// configured is the middleware of a route served by an optional
// service (what): 501 when it is not wired (ok false).
func (a *API) configured(what string, ok bool) gin.HandlerFunc {
	return func(c *gin.Context) {
		if !ok {
			a.fail(c, fmt.Errorf("%s: %w", what, ErrNotConfigured))
		}
	}
}

// answer serves a route whose handler returns its answer: 200 with v as
// JSON, or err as fail answers it. A handler that answered itself (a
// stream, a refusal) returns nil, nil.
func (a *API) answer(h func(c *gin.Context) (any, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		if v, err := h(c); err != nil {
			a.fail(c, err)
		} else if !c.Writer.Written() {
			c.JSON(http.StatusOK, v)
		}
	}
}

// fail answers err: a FieldError or bad JSON is 400 (422 for too much
// work, see tooLarge, and an *audit.TooLargeError), a bad probe or
// proposed policy of the audit 400, ErrNotConfigured 501, a service not
// ready (ErrUnavailable, audit.ErrUnavailable) 503, a store failure
// 502/503/504, anything else 500 (and is logged once here).
func (a *API) fail(c *gin.Context, err error) {
	var fe *FieldError
	var qe *queryError
	var tl *audit.TooLargeError
	switch {
	case errors.Is(err, ErrUnavailable), errors.Is(err, audit.ErrUnavailable):
		c.AbortWithStatusJSON(http.StatusServiceUnavailable, errorBody{Message: err.Error()})
	case errors.As(err, &tl):
		a.fail(c, tooLarge(tl.Field, "%s", tl.Message))
	case errors.Is(err, audit.ErrBadProbe):
		a.fail(c, &FieldError{Message: err.Error()})
	case errors.Is(err, audit.ErrInvalidPolicy):
		a.fail(c, &FieldError{Field: "body", Message: err.Error()})
	case errors.As(err, &fe) && fe.reason == reasonTooLarge:
		c.AbortWithStatusJSON(http.StatusUnprocessableEntity, errorBody{Message: fe.Message, Field: fe.Field})
	case errors.As(err, &fe):
		a.badRequest(c, cmp.Or(fe.reason, reasonInvalid))
		c.AbortWithStatusJSON(http.StatusBadRequest, errorBody{Message: fe.Message, Field: fe.Field})
	case errors.Is(err, ErrNotConfigured), errors.Is(err, errors.ErrUnsupported):
		c.AbortWithStatusJSON(http.StatusNotImplemented, errorBody{Message: err.Error()})
	case errors.Is(err, context.DeadlineExceeded):
		c.AbortWithStatusJSON(http.StatusGatewayTimeout, errorBody{Message: "query timed out"})
	case errors.Is(err, context.Canceled):
		c.AbortWithStatus(499)
	case errors.As(err, &qe) && qe.user:
		a.badRequest(c, reasonQuery)
		msg, detail := engineSummary(qe.Error())
		c.AbortWithStatusJSON(http.StatusBadRequest, errorBody{Message: msg, Field: qe.field, Detail: detail})
	default:
		a.log.Error("api request failed", "method", c.Request.Method, "path", c.FullPath(), "err", err)
		msg, detail := engineSummary(err.Error())
		c.AbortWithStatusJSON(http.StatusBadGateway, errorBody{Message: "the store failed: " + msg, Detail: detail})
	}
}

// engineExceptionRe finds a ClickHouse exception in an error's text:
// "Code: 60. DB::Exception: Table dualflow.flows does not exist. (UNKNOWN_TABLE)".
var engineExceptionRe = regexp.MustCompile(`Code: (\d+)\. DB::Exception: (.*?)(?:: In scope .*?)?(?:\. \(([A-Z_]+)\))?(?: \(version [^)]*\))?\s*$`)

// maxSummary bounds an error's summary.
const maxSummary = 240

// engineSummary returns a short message for an error text and, when it
// had to shorten it, the whole text as detail: an engine error carries the
// query it refused (for the API's own queries, the generated SQL), which
// is a details line, not the message.
func engineSummary(text string) (msg, detail string) {
	text = strings.TrimSpace(text)
	short := text
	if m := engineExceptionRe.FindStringSubmatch(strings.ReplaceAll(text, "\n", " ")); m != nil {
		short = strings.TrimSuffix(m[2], ".")
		// "Unknown identifier `x` in scope SELECT ...": the scope is SQL.
		if i := strings.Index(strings.ToLower(short), " in scope "); i > 0 {
			short = short[:i]
		}
		if m[3] != "" {
			short += " (" + m[3] + ")"
		}
	}
	if i := strings.IndexByte(short, '\n'); i >= 0 {
		short = short[:i]
	}
	if len(short) > maxSummary {
		short = short[:maxSummary] + "…"
	}
	if short == text {
		return text, ""
	}
	return short, text
}

// badRequest counts a request answered 400, by route and reason.
func (a *API) badRequest(c *gin.Context, reason string) {
	a.metrics.badRequests.WithLabelValues(cmp.Or(c.FullPath(), "unmatched"), reason).Inc()
}

// queryError is a store error; user means the input caused it (bad SQL).
type queryError struct {
	err   error
	user  bool
	field string
}

func (e *queryError) Error() string { return e.err.Error() }
func (e *queryError) Unwrap() error { return e.err }

func (a *API) recover(c *gin.Context) {
	defer func() {
		if p := recover(); p != nil {
			if p == http.ErrAbortHandler {
				panic(p)
			}
			a.log.Error("api handler panic", "path", c.Request.URL.Path, "panic", p)
			c.AbortWithStatusJSON(http.StatusInternalServerError, errorBody{Message: "internal error"})
		}
	}()
	c.Next()
}

func (a *API) observe(c *gin.Context) {
	start := time.Now()
	c.Next()
	route := cmp.Or(c.FullPath(), "unmatched")
	a.metrics.requests.WithLabelValues(route, strconv.Itoa(c.Writer.Status())).Inc()
	a.metrics.duration.WithLabelValues(route).Observe(time.Since(start).Seconds())
}

// sameSite refuses requests a browser sends for another site: with no
// tokens configured, any page the user opens could otherwise POST SQL to
// the loopback API.
func (a *API) sameSite(c *gin.Context) {
	r := c.Request
	site := r.Header.Get("Sec-Fetch-Site")
	origin := r.Header.Get("Origin")
	if (site != "" && site != "same-origin" && site != "none") ||
		(origin != "" && origin != "http://"+r.Host && origin != "https://"+r.Host) {
		c.AbortWithStatusJSON(http.StatusForbidden, errorBody{Message: "cross-site browser requests are refused"})
	}
}

func (a *API) readyz(c *gin.Context) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), 5*time.Second)
	defer cancel()
	if err := a.cfg.Ready(ctx); err != nil {
		c.JSON(http.StatusServiceUnavailable, errorBody{Message: "not ready: " + err.Error()})
		return
	}
	c.String(http.StatusOK, "ok\n")
}

func (a *API) whoami(c *gin.Context) {
	p := principalOf(c)
	role := p.Role.String()
	if p.kube != nil {
		role = "kubernetes"
	}
	out := gin.H{"name": p.Name, "role": role, "auth": a.cfg.Anonymous == 0}
	if p.scope != nil {
		out["namespaces"] = p.scope
	}
	c.JSON(http.StatusOK, out)
}

func (a *API) filterDoc(c *gin.Context) {
	out := map[string]string{}
	for k, v := range filterFields {
		out[k] = v.doc
	}
	c.JSON(http.StatusOK, out)
}

type metrics struct {
	reg        *prometheus.Registry
	requests   *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	sqlRefused *prometheus.CounterVec
	// badRequests has no field label: the field at fault comes from the
	// client, it is in the answer.
	badRequests *prometheus.CounterVec
	refused     *prometheus.CounterVec
	inFlight    *prometheus.GaugeVec
	tooLarge    *prometheus.CounterVec
	pageRereads prometheus.Counter
	kubeReviews *prometheus.CounterVec
}

func newMetrics(r prometheus.Registerer, tokens *Tokens) *metrics {
	var reg *prometheus.Registry
	if r == nil {
		reg = prometheus.NewRegistry()
		r = reg
	}
	f := promauto.With(r)
	m := &metrics{reg: reg,
		requests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_web_requests_total", Help: "API requests by route and status.",
		}, []string{"route", "status"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dualflow_web_request_duration_seconds", Help: "API request duration by route.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 9),
		}, []string{"route"}),
		sqlRefused: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_web_sql_refused_total",
			Help: "POST /sql queries refused before they ran, by reason: statement (not SELECT, SHOW, DESCRIBE or EXISTS), outfile, table_function, function (reaches the host), engine (not one statement the engine accepts read-only).",
		}, []string{"reason"}),
		badRequests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_web_bad_requests_total",
			Help: "API requests answered 400 {message, field}, by route and reason: invalid (a value out of its domain; every 400 of /audit/* and /traceflows), bad_json (a body that is not the JSON wanted), unknown_field (a body field the request does not have), query (SQL or a filter the engine refused).",
		}, []string{"route", "reason"}),
		refused: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_web_concurrency_refused_total",
			Help: "Requests answered 429 because as many of their kind as allowed were in flight, by kind (sql: POST /sql queries, follow: GET /flows?follow=true streams, whatif: POST /audit/whatif and GET /policy/recommend, reachability: POST /reachability), role, and the cap reached (token: the requester's own, role: its role's, all: every role's together).",
		}, []string{"kind", "role", "cap"}),
		inFlight: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dualflow_web_in_flight",
			Help: "Requests of a gated kind in flight: POST /sql queries (kind sql), follow streams (follow), what-ifs and recommendations (whatif), reachability matrices (reachability).",
		}, []string{"kind"}),
		tooLarge: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_web_too_large_total",
			Help: "Requests answered 422 before their work ran because it would pass its bound, by kind (whatif: flow groups times the policies checked for each, --web.whatif.max-checks and --web.whatif.max-flow-groups; reachability: pod pairs times the policies checked for each, --web.reachability.max-checks).",
		}, []string{"kind"}),
		kubeReviews: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_web_kubernetes_reviews_total",
			Help: "TokenReview and SubjectAccessReview calls made to authenticate and authorize web requests of Kubernetes users (answers from the cache make none), by kind (tokenreview, subjectaccessreview) and HTTP code (<error> when none came).",
		}, []string{"kind", "code"}),
		pageRereads: f.NewCounter(prometheus.CounterOpts{
			Name: "dualflow_web_flow_page_rereads_total",
			Help: "Flow pages read a second time without their minute bound, because the page's read found fewer rows than the bound's (on a cluster: a replica behind the other).",
		}),
	}
	r.MustRegister(reload.Metrics(tokens.reloads()))
	return m
}

// gatherer is what /metrics serves: the caller's, or our own registry.
func (m *metrics) gatherer(g prometheus.Gatherer) prometheus.Gatherer {
	if g != nil {
		return g
	}
	if m.reg != nil {
		return m.reg
	}
	return prometheus.DefaultGatherer
}
