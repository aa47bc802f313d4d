package api

import (
	"flag"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/recommend"
)

// Engine priorities (the ClickHouse setting priority: 1 is the highest,
// a query waits while one of a higher priority runs; 0, the collector's
// inserts, takes no part). The API's own reads run first, operator SQL
// yields to them.
const (
	uiPriority  = "1"
	sqlPriority = "5"
)

// Memory of one of the API's own queries: aggregation and sorting spill
// to disk past half of uiMaxMemory, and the engine ends a query past uiMaxMemory
// (the request fails with 502) rather than let it take the process's
// memory. With the follow and /sql caps (DefaultSQLMaxMemory per /sql
// query), the engine's share of the process stays bounded by the number
// of requests in flight; --clickhouse.max-memory bounds the whole engine.
const (
	uiMaxMemory = 1 << 30 // 1 GiB
)

// Retry-After of a refused request: a /sql query ends within SQLMaxTime,
// but most take a second or two; a follow stream lasts as long as its
// viewer keeps the page open; a what-if or a reachability matrix within
// its bound of policy checks takes a few seconds at most.
const (
	sqlRetryAfter    = 5 * time.Second
	followRetryAfter = 30 * time.Second
	workRetryAfter   = 5 * time.Second
)

// Caps of a gate, named in its 429 messages and in the cap label of
// dualflow_web_concurrency_refused_total.
const (
	capToken = "token" // the requests of one principal (one token)
	capRole  = "role"  // the requests of one role
	capAll   = "all"   // the requests of every role together
)

// gate caps the requests of one kind in flight per principal (a token:
// Principal.Name; without tokens the one local principal), per role and
// (optionally) for all roles together. It refuses rather than queues: a
// queued request would hold its connection and the client would not know
// why it waits. Safe for concurrent use.
type gate struct {
	kind         string // metric label: "sql", "follow", "whatif", "reachability"
	what         string // for messages: "SQL queries", "follow streams", ...
	perPrincipal int    // 0: no cap per principal
	perRole      int
	total        int                    // 0: no cap over the roles
	all          chan struct{}          // size total; nil without one
	byRole       map[Role]chan struct{} // size perRole each
	retryAfter   time.Duration

	mu sync.Mutex
	// held counts the places of each principal holding any; a principal
	// leaves the map with its last place, so it holds at most as many
	// entries as places are taken.
	held map[string]int
}

func newGate(kind, what string, perPrincipal, perRole, total int, retryAfter time.Duration) *gate {
	g := &gate{kind: kind, what: what, perPrincipal: perPrincipal, perRole: perRole, total: total, retryAfter: retryAfter,
		byRole: map[Role]chan struct{}{}, held: map[string]int{}}
	for _, r := range []Role{RoleViewer, RoleOperator} {
		g.byRole[r] = make(chan struct{}, perRole)
	}
	if total > 0 {
		g.all = make(chan struct{}, total)
	}
	return g
}

// caps lists the caps g has (the cap label's values).
func (g *gate) caps() []string {
	var out []string
	if g.perPrincipal > 0 {
		out = append(out, capToken)
	}
	out = append(out, capRole)
	if g.all != nil {
		out = append(out, capAll)
	}
	return out
}

// enter takes a place for p without waiting. ok is false when p's, its
// role's or the overall cap is reached (capName says which and why says
// it in words); otherwise the caller must call release once.
func (g *gate) enter(p Principal) (release func(), capName, why string, ok bool) {
	if g.perPrincipal > 0 {
		g.mu.Lock()
		n := g.held[p.Name]
		if n >= g.perPrincipal {
			g.mu.Unlock()
			return nil, capToken, fmt.Sprintf("%d %s of token %q are in flight, the most one token may have at once", n, g.what, p.Name), false
		}
		g.held[p.Name] = n + 1
		g.mu.Unlock()
	}
	leaveMine := func() {
		if g.perPrincipal > 0 {
			g.mu.Lock()
			if g.held[p.Name]--; g.held[p.Name] <= 0 {
				delete(g.held, p.Name)
			}
			g.mu.Unlock()
		}
	}
	role := g.byRole[p.Role]
	if role == nil { // no role: the strictest
		role = g.byRole[RoleViewer]
	}
	select {
	case role <- struct{}{}:
	default:
		leaveMine()
		return nil, capRole, fmt.Sprintf("%d %s of role %s are in flight, the most one role may have at once", g.perRole, g.what, p.Role), false
	}
	if g.all != nil {
		select {
		case g.all <- struct{}{}:
		default:
			<-role
			leaveMine()
			return nil, capAll, fmt.Sprintf("%d %s are in flight, the most allowed at once", g.total, g.what), false
		}
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if g.all != nil {
				<-g.all
			}
			<-role
			leaveMine()
		})
	}, "", "", true
}

// admit takes a place in g for the request's principal, or answers 429
// with Retry-After and a message saying which cap is reached, counts the
// refusal and returns false. The caller must call release when the
// request's work ends.
func (a *API) admit(c *gin.Context, g *gate) (release func(), ok bool) {
	p := principalOf(c)
	leave, capName, why, ok := g.enter(p)
	if !ok {
		a.metrics.refused.WithLabelValues(g.kind, p.Role.String(), capName).Inc()
		secs := int(math.Ceil(g.retryAfter.Seconds()))
		c.Header("Retry-After", strconv.Itoa(secs))
		c.AbortWithStatusJSON(http.StatusTooManyRequests, errorBody{
			Message: fmt.Sprintf("too many requests: %s; retry in %d s", why, secs),
		})
		return nil, false
	}
	inFlight := a.metrics.inFlight.WithLabelValues(g.kind)
	inFlight.Inc()
	return func() {
		inFlight.Dec()
		leave()
	}, true
}

// bounded is the middleware of a request whose work is bounded twice: it
// takes a place in g (429 past a cap), and it counts the requests the
// handler refused as too much work (422, see tooLarge) by g's kind. A
// handler of another package (the what-if) is bounded this way too.
func (a *API) bounded(g *gate) gin.HandlerFunc {
	return func(c *gin.Context) {
		release, ok := a.admit(c, g)
		if !ok {
			return
		}
		defer release()
		c.Next()
		if c.Writer.Status() == http.StatusUnprocessableEntity {
			a.metrics.tooLarge.WithLabelValues(g.kind).Inc()
		}
	}
}

// reasonTooLarge marks a FieldError about a request whose work would pass
// its bound: fail answers it 422 (the request is valid, the server will
// not do that much; the message says what to narrow) and bounded counts
// it in dualflow_web_too_large_total.
const reasonTooLarge = "too_large"

// tooLarge is the error of a request refused for its work; field names
// what to narrow.
func tooLarge(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Message: fmt.Sprintf(format, args...), reason: reasonTooLarge}
}

// Limits cap the requests that load the store or the CPU: POST
// /api/v1/sql queries, follow streams, what-ifs and reachability
// matrices, per token, per role and (follow streams) in all. A request
// past a cap is answered 429 with Retry-After and counted in
// dualflow_web_concurrency_refused_total; a what-if or a matrix past its
// bound of work is answered 422 and counted in
// dualflow_web_too_large_total.
type Limits struct {
	// SQLConcurrency is the /sql queries running at once per role (only
	// operators run SQL, so it is also the cap over all roles).
	SQLConcurrency int
	// SQLMaxThreads is the engine threads of one /sql query.
	SQLMaxThreads int
	// FollowStreams is the follow streams open at once, all roles
	// together; FollowStreamsPerRole those of one role.
	FollowStreams        int
	FollowStreamsPerRole int
	// SQLConcurrencyPerToken and FollowStreamsPerToken cap those of one
	// token (one principal; without tokens, the one local user).
	SQLConcurrencyPerToken int
	FollowStreamsPerToken  int
	// WhatIfConcurrency is the what-ifs running at once per role,
	// WhatIfConcurrencyPerToken per token; WhatIfMaxChecks and
	// WhatIfMaxFlowGroups bound one what-if (audit.WhatIfLimits).
	WhatIfConcurrency         int
	WhatIfConcurrencyPerToken int
	WhatIfMaxChecks           int64
	WhatIfMaxFlowGroups       int
	// RecommendMaxFlowGroups bounds the flow groups one policy
	// recommendation reads (recommend.Queries.MaxFlowGroups).
	RecommendMaxFlowGroups int
	// ReachabilityConcurrency is the reachability matrices computed at
	// once per role, ReachabilityConcurrencyPerToken per token;
	// ReachabilityMaxChecks bounds one matrix
	// (audit.PolicyEvaluator.MaxChecks).
	ReachabilityConcurrency         int
	ReachabilityConcurrencyPerToken int
	ReachabilityMaxChecks           int64
}

// BindFlags registers the --web.sql.*, --web.follow.*, --web.whatif.* and
// --web.reachability.* limit flags on fs.
func (l *Limits) BindFlags(fs *flag.FlagSet) {
	fs.IntVar(&l.SQLConcurrency, "web.sql.max-concurrent", DefaultSQLConcurrency, "POST /api/v1/sql queries running at once per role; more are answered 429 (the embedded engine runs 4 statements at once: keep room for the collector's inserts)")
	fs.IntVar(&l.SQLMaxThreads, "web.sql.max-threads", DefaultSQLMaxThreads, "engine threads (max_threads) of one /sql query")
	fs.IntVar(&l.FollowStreams, "web.follow.max-streams", DefaultFollowStreams, "follow streams (GET /api/v1/flows?follow=true) open at once, all roles together; more are answered 429 (each polls the store every second)")
	fs.IntVar(&l.FollowStreamsPerRole, "web.follow.max-streams-per-role", DefaultFollowStreamsPerRole, "follow streams open at once per role (viewer, operator), so viewers cannot take them all")
	fs.IntVar(&l.SQLConcurrencyPerToken, "web.sql.max-concurrent-per-token", DefaultSQLConcurrencyPerToken, "POST /api/v1/sql queries running at once per token (without tokens: for the local user), so one token cannot take its role's every place")
	fs.IntVar(&l.FollowStreamsPerToken, "web.follow.max-streams-per-token", DefaultFollowStreamsPerToken, "follow streams open at once per token (without tokens: for the local user), so one token cannot take its role's every stream")
	fs.IntVar(&l.WhatIfConcurrency, "web.whatif.max-concurrent", DefaultWhatIfConcurrency, "what-ifs (POST /api/v1/audit/whatif) and policy recommendations (GET /api/v1/policy/recommend) running at once per role; more are answered 429 (each holds up to --web.whatif.max-flow-groups or --web.recommend.max-flow-groups flow groups in memory)")
	fs.IntVar(&l.WhatIfConcurrencyPerToken, "web.whatif.max-concurrent-per-token", DefaultWhatIfConcurrencyPerToken, "what-ifs running at once per token (without tokens: for the local user)")
	fs.Int64Var(&l.WhatIfMaxChecks, "web.whatif.max-checks", audit.DefaultWhatIfMaxChecks, "policy checks of one what-if: its flow groups, each against the policies that may select its ends, before and after the proposal; a larger what-if is answered 422 before it reads any flow (10 to 60 ns a check)")
	fs.IntVar(&l.WhatIfMaxFlowGroups, "web.whatif.max-flow-groups", audit.DefaultWhatIfMaxFlowGroups, "flow groups one what-if reads, its largest limit (about 2 KiB of memory each)")
	fs.IntVar(&l.RecommendMaxFlowGroups, "web.recommend.max-flow-groups", recommend.DefaultMaxFlowGroups, "flow groups one policy recommendation (GET /api/v1/policy/recommend) reads, its largest limit: a window with more is answered 422 rather than recommended from part of its flows (about 250 bytes each held, some 10 KiB each allocated while the answer is built; a 2,000-workload cluster needed 220,000)")
	fs.IntVar(&l.ReachabilityConcurrency, "web.reachability.max-concurrent", DefaultReachabilityConcurrency, "reachability matrices (POST /api/v1/reachability) computed at once per role; more are answered 429")
	fs.IntVar(&l.ReachabilityConcurrencyPerToken, "web.reachability.max-concurrent-per-token", DefaultReachabilityConcurrencyPerToken, "reachability matrices computed at once per token (without tokens: for the local user)")
	fs.Int64Var(&l.ReachabilityMaxChecks, "web.reachability.max-checks", audit.DefaultReachabilityMaxChecks, "policy checks of one reachability matrix: its pod pairs, each against the policies that may select its ends; a larger matrix is answered 422 before any pair is evaluated (10 to 60 ns a check)")
}
