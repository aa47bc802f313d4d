// Package api serves dualflow's REST API under /api/v1 with gin: flows
// (filtered, paginated, followed over server-sent events), summaries, the
// service map, reachability matrices per IP family, traceflow, audit
// findings and read-only SQL. It reads ClickHouse through the small
// interfaces below, declared here so tests run on fakes; the caller wires
// the collector's store, evaluator, tracer and auditor into Config.
package api

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/internal/defaults"
)

// Store runs queries against the dualflow database; store.Conn
// implements it. Queries are built, and values quoted, by chsql.
type Store interface {
	Query(ctx context.Context, query, format string) ([]byte, error)
}

// SQLRunner runs operator SQL with limits the engine enforces: settings
// holds readonly=1 and the row, time and memory limits, and the runner
// must apply them as engine settings of the query (not by editing the
// text). store.Embedded and store.Server are SQLRunners.
type SQLRunner interface {
	RunSQL(ctx context.Context, query, format string, settings map[string]string) ([]byte, error)
}

// Evaluator evaluates the NetworkPolicies of a reachability matrix:
// every pod pair of every cell, per IP family ([source][destination]
// then 4 or 6; audit.PolicyEvaluator). An end that cannot be resolved is
// an audit.OutcomeError family; an error fails the whole matrix (an
// *audit.TooLargeError is answered 422).
type Evaluator interface {
	EvaluateMatrix(ctx context.Context, srcs, dsts []audit.Endpoint, proto uint8, port uint16, observed ...[]uint16) ([][]map[int]*audit.FamilyPolicy, error)
}

var _ Evaluator = audit.PolicyEvaluator{}

// ErrNotConfigured is answered as 501 by endpoints whose service is not wired.
var ErrNotConfigured = errors.New("not configured in this process")

// Config configures the API.
type Config struct {
	Store Store
	// Database holds the flows table; default "dualflow".
	Database string
	// SQL runs POST /sql. nil: the Store, when it is a SQLRunner
	// (store.Embedded, store.Server), else 501.
	SQL SQLRunner
	// Evaluator is optional (nil: reachability has unknown verdicts).
	Evaluator Evaluator
	// Traces serves POST /api/v1/traceflows (operators), GET
	// /api/v1/traceflows/:id (viewers) and reachability's live traces;
	// nil answers them 501.
	Traces Traces
	// Audit serves /api/v1/audit/{findings,unprotected,denied,unused,
	// whatif,evaluate} for viewers; nil answers them 501.
	Audit Audit
	// Recommend serves GET /api/v1/policy/recommend for viewers; nil
	// answers it 501.
	Recommend Recommender
	// Catalog answers GET /api/v1/catalog (the live Kubernetes view's
	// names); nil answers it 501.
	Catalog Catalog
	// Status answers GET /api/v1/status (the state of the collector's
	// view of the cluster); nil answers it 501.
	Status Status
	// Tokens authorizes requests that carry a bearer token.
	Tokens *Tokens
	// Kube, when set, authenticates and authorizes Kubernetes users
	// (KubeAuth) besides Tokens.
	Kube *KubeAuth
	// Anonymous is the role of a request without a token: 0 refuses it
	// (401), RoleViewer is the loopback viewer of a collector without a
	// tokens file (the caller then binds to loopback only). Operator
	// actions always need a token.
	Anonymous Role
	// LocalTokenFile names, in the 401 of an operator action without a
	// token, the file holding the local operator token.
	LocalTokenFile string
	// SQL limits, enforced as engine settings.
	SQLMaxRows     int
	SQLMaxTime     time.Duration
	SQLMaxMemory   int64
	QueryTimeout   time.Duration // bound of every store query of a request
	TraceTimeout   time.Duration // bound of a reachability matrix's traces
	FollowInterval time.Duration // poll period of follow mode
	Registerer     prometheus.Registerer
	Gatherer       prometheus.Gatherer
	Logger         *slog.Logger
	Now            func() time.Time // for tests
	// Ready says whether the server serves (/readyz 503 with its error
	// otherwise): the collector's readiness (its schema whole, the flows
	// table taking rows). nil: the store answers SELECT 1.
	Ready func(context.Context) error

	// Limits cap the heavy requests in flight (0: the defaults).
	Limits
}

// Defaults.
const (
	DefaultSQLMaxRows     = 10000
	DefaultSQLMaxTime     = 15 * time.Second
	DefaultSQLMaxMemory   = 1 << 30 // 1 GiB per query
	DefaultQueryTimeout   = 30 * time.Second
	DefaultTraceTimeout   = 20 * time.Second
	DefaultFollowInterval = time.Second
	// DefaultSQLConcurrency leaves the embedded engine's other
	// connections (chdb.DefaultMaxConns, 4) to the collector's inserts and
	// the UI's reads: eight heavy queries at once stalled both.
	DefaultSQLConcurrency = 2
	// DefaultSQLMaxThreads keeps one /sql query to two cores of the
	// engine, whatever the machine has.
	DefaultSQLMaxThreads = 2
	// DefaultFollowStreams: each stream polls the store every
	// FollowInterval, about 15 ms of engine time each (100 streams took
	// 1.4 cores), so 20 take at most about a third of a core.
	DefaultFollowStreams        = 20
	DefaultFollowStreamsPerRole = 16
	// DefaultFollowStreamsPerToken: a token (one person, or one shared
	// dashboard) keeps a few tabs following; four tokens are needed to
	// take a role's every stream.
	DefaultFollowStreamsPerToken = 4
	// DefaultSQLConcurrencyPerToken: one token cannot take both of its
	// role's /sql places.
	DefaultSQLConcurrencyPerToken = 1
	// DefaultWhatIfConcurrency: a what-if within its bounds takes up to
	// about half a GiB (the engine's share of its read, whatIfMaxMemory in
	// collector/audit, and the flow groups decoded), so two per role
	// keep the four of both roles near 2 GiB; one per token.
	DefaultWhatIfConcurrency         = 2
	DefaultWhatIfConcurrencyPerToken = 1
	// DefaultReachabilityConcurrency: a matrix within
	// audit.DefaultReachabilityMaxChecks takes at most about a CPU-second, so
	// four per role take the two cores of a small collector for about
	// two seconds; two per token (a page reloaded while it asks).
	DefaultReachabilityConcurrency         = 4
	DefaultReachabilityConcurrencyPerToken = 2
)

func (c *Config) setDefaults() {
	c.Database = cmp.Or(c.Database, "dualflow")
	if r, ok := c.Store.(SQLRunner); ok && c.SQL == nil {
		c.SQL = r
	}
	c.SQLMaxRows = defaults.Positive(c.SQLMaxRows, DefaultSQLMaxRows)
	c.SQLMaxTime = defaults.Positive(c.SQLMaxTime, DefaultSQLMaxTime)
	c.SQLMaxMemory = defaults.Positive(c.SQLMaxMemory, DefaultSQLMaxMemory)
	c.QueryTimeout = defaults.Positive(c.QueryTimeout, DefaultQueryTimeout)
	c.TraceTimeout = defaults.Positive(c.TraceTimeout, DefaultTraceTimeout)
	c.FollowInterval = defaults.Positive(c.FollowInterval, DefaultFollowInterval)
	c.SQLMaxThreads = defaults.Positive(c.SQLMaxThreads, DefaultSQLMaxThreads)
	c.SQLConcurrency = defaults.Positive(c.SQLConcurrency, DefaultSQLConcurrency)
	c.FollowStreams = defaults.Positive(c.FollowStreams, DefaultFollowStreams)
	c.FollowStreamsPerRole = defaults.Positive(c.FollowStreamsPerRole, DefaultFollowStreamsPerRole)
	c.SQLConcurrencyPerToken = defaults.Positive(c.SQLConcurrencyPerToken, DefaultSQLConcurrencyPerToken)
	c.FollowStreamsPerToken = defaults.Positive(c.FollowStreamsPerToken, DefaultFollowStreamsPerToken)
	c.WhatIfConcurrency = defaults.Positive(c.WhatIfConcurrency, DefaultWhatIfConcurrency)
	c.WhatIfConcurrencyPerToken = defaults.Positive(c.WhatIfConcurrencyPerToken, DefaultWhatIfConcurrencyPerToken)
	c.ReachabilityConcurrency = defaults.Positive(c.ReachabilityConcurrency, DefaultReachabilityConcurrency)
	c.ReachabilityConcurrencyPerToken = defaults.Positive(c.ReachabilityConcurrencyPerToken, DefaultReachabilityConcurrencyPerToken)
	c.Logger = cmp.Or(c.Logger, slog.Default())
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Ready == nil {
		st := c.Store
		c.Ready = func(ctx context.Context) error {
			_, err := st.Query(ctx, "SELECT 1", "TabSeparated")
			return err
		}
	}
}

// API is the REST handler. Create it with New.
type API struct {
	cfg     Config
	log     *slog.Logger
	engine  *gin.Engine
	metrics *metrics
	table   string // qualified flows table
	// The gates cap the /sql queries, follow streams, what-ifs and
	// reachability matrices in flight.
	sqlGate, followGate, whatifGate, reachGate *gate
	// virtualRow is whether the server knows virtualRowSetting: 0 not
	// asked yet, 1 yes, 2 no.
	virtualRow atomic.Int32
	kube       *kubeAuth // nil without Config.Kube
}

// New builds the router. It fails when Store is nil.
func New(cfg Config) (*API, error) {
	if cfg.Store == nil {
		return nil, errors.New("api: Config.Store is required")
	}
	cfg.setDefaults()
	gin.SetMode(gin.ReleaseMode)
	a := &API{cfg: cfg, log: cfg.Logger, table: cfg.Database + ".flows", metrics: newMetrics(cfg.Registerer, cfg.Tokens)}
	a.sqlGate = newGate("sql", "SQL queries", cfg.SQLConcurrencyPerToken, cfg.SQLConcurrency, 0, sqlRetryAfter)
	a.followGate = newGate("follow", "follow streams", cfg.FollowStreamsPerToken, cfg.FollowStreamsPerRole, cfg.FollowStreams, followRetryAfter)
	a.whatifGate = newGate("whatif", "what-ifs", cfg.WhatIfConcurrencyPerToken, cfg.WhatIfConcurrency, 0, workRetryAfter)
	a.reachGate = newGate("reachability", "reachability matrices", cfg.ReachabilityConcurrencyPerToken, cfg.ReachabilityConcurrency, 0, workRetryAfter)
	for _, g := range []*gate{a.sqlGate, a.followGate, a.whatifGate, a.reachGate} { // export zeros, not absent series
		a.metrics.inFlight.WithLabelValues(g.kind)
		for _, r := range []Role{RoleViewer, RoleOperator} {
			for _, cp := range g.caps() {
				a.metrics.refused.WithLabelValues(g.kind, r.String(), cp)
			}
		}
	}
	for _, g := range []*gate{a.whatifGate, a.reachGate} {
		a.metrics.tooLarge.WithLabelValues(g.kind)
	}
	if cfg.Kube != nil {
		reg := cfg.Registerer
		if reg == nil {
			reg = a.metrics.reg
		}
		k, err := newKubeAuth(cfg.Kube, a.metrics, reg, cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("api: kubernetes identities: %w", err)
		}
		a.kube = k
	}
	a.engine = a.routes()
	return a, nil
}

// Handler returns the handler of /api/v1, /healthz, /readyz and /metrics.
func (a *API) Handler() http.Handler { return a.engine }
