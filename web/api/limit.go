package api

import (
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
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
// to disk past uiSpillBytes, and the engine ends a query past uiMaxMemory
// (the request fails with 502) rather than let it take the process's
// memory. With the follow and /sql caps (DefaultSQLMaxMemory per /sql
// query), the engine's share of the process stays bounded by the number
// of requests in flight; --clickhouse.max-memory bounds the whole engine.
const (
	uiMaxMemory  = "1073741824" // 1 GiB
	uiSpillBytes = "536870912"  // 512 MiB
)

// Retry-After of a refused request: a /sql query ends within SQLMaxTime,
// but most take a second or two; a follow stream lasts as long as its
// viewer keeps the page open.
const (
	sqlRetryAfter    = 5 * time.Second
	followRetryAfter = 30 * time.Second
)

// gate caps the requests of one kind in flight, per role and (optionally)
// for all roles together. It refuses rather than queues: a queued request
// would hold its connection and the client would not know why it waits.
// Safe for concurrent use.
type gate struct {
	kind       string // metric label and message: "sql", "follow"
	what       string // for messages: "SQL queries", "follow streams"
	perRole    int
	total      int                    // 0: no cap over the roles
	all        chan struct{}          // size total; nil without one
	byRole     map[Role]chan struct{} // size perRole each
	retryAfter time.Duration
}

func newGate(kind, what string, perRole, total int, retryAfter time.Duration) *gate {
	g := &gate{kind: kind, what: what, perRole: perRole, total: total, retryAfter: retryAfter,
		byRole: map[Role]chan struct{}{}}
	for _, r := range []Role{RoleViewer, RoleOperator} {
		g.byRole[r] = make(chan struct{}, perRole)
	}
	if total > 0 {
		g.all = make(chan struct{}, total)
	}
	return g
}

// enter takes a place for role without waiting. ok is false when the
// role's or the overall cap is reached (why says which); otherwise the
// caller must call release once.
func (g *gate) enter(role Role) (release func(), why string, ok bool) {
	mine := g.byRole[role]
	if mine == nil { // no role: the strictest
		mine = g.byRole[RoleViewer]
	}
	select {
	case mine <- struct{}{}:
	default:
		return nil, fmt.Sprintf("%d %s of role %s are running, the most allowed at once", g.perRole, g.what, role), false
	}
	if g.all != nil {
		select {
		case g.all <- struct{}{}:
		default:
			<-mine
			return nil, fmt.Sprintf("%d %s are running, the most allowed at once", g.total, g.what), false
		}
	}
	return func() {
		if g.all != nil {
			<-g.all
		}
		<-mine
	}, "", true
}

// admit takes a place in g for the request's principal, or answers 429
// with Retry-After, counts the refusal and returns false. The caller
// must call release when the request's work ends.
func (a *API) admit(c *gin.Context, g *gate) (release func(), ok bool) {
	role := principalOf(c).Role
	leave, why, ok := g.enter(role)
	if !ok {
		a.metrics.refused.WithLabelValues(g.kind, role.String()).Inc()
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
