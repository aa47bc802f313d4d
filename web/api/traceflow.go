package api

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"strconv"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/ratelimit"
)

// Traces runs traces: *traceflow.Controller. POST /traceflows starts one
// (Start, refusing a caller beyond its rate) and may wait for it (Wait);
// GET /traceflows/:id reads one (Get); a reachability matrix's live traces
// are paced rather than refused (Trace).
type Traces interface {
	Start(ctx context.Context, req traceflow.Request) (string, error)
	Wait(ctx context.Context, id string) (traceflow.Result, error)
	Get(ctx context.Context, id string) (traceflow.Result, error)
	Trace(ctx context.Context, req traceflow.Request) (traceflow.Result, error)
}

var _ Traces = (*traceflow.Controller)(nil)

// startTrace serves POST /traceflows: 202 {"id", "phase": "running"} with
// a Location, or with ?wait=true 200 and the Result once it finished. The
// caller's rate limit and share of the results kept are the principal's.
func (a *API) startTrace(c *gin.Context) {
	t := a.cfg.Traces
	var req traceflow.Request
	if err := bindJSON(c, &req, maxBodyBytes); err != nil {
		a.fail(c, err)
		return
	}
	ctx := traceflow.WithCaller(c.Request.Context(), principalOf(c).Name)
	id, err := t.Start(ctx, req)
	if err != nil {
		a.traceFail(c, err)
		return
	}
	if c.Query("wait") != "true" {
		c.Header("Location", "/api/v1/traceflows/"+id)
		c.JSON(http.StatusAccepted, gin.H{"id": id, "phase": traceflow.Running})
		return
	}
	// The trace ends within its timeout; the request's end stops the wait.
	res, err := t.Wait(c.Request.Context(), id)
	if err != nil {
		a.traceFail(c, err)
		return
	}
	c.JSON(http.StatusOK, res)
}

// getTrace serves GET /traceflows/:id, from the controller's memory or
// the store: a trace running on another replica is not found (404) until
// it has finished and been saved.
func (a *API) getTrace(c *gin.Context) {
	res, err := a.cfg.Traces.Get(c.Request.Context(), c.Param("id"))
	if err != nil {
		a.traceFail(c, err)
		return
	}
	d := res.Request.Destination
	if !outOfScope(c, "trace "+res.ID,
		scopeRef{field: "source", ref: cmp.Or(res.Request.Source, res.Request.SourceWorkload)},
		scopeRef{field: "destination", ref: cmp.Or(d.Pod, d.Workload, d.Service), ip: d.IP.IsValid()}) {
		return
	}
	c.JSON(http.StatusOK, res)
}

// traceFail answers a controller error: invalid 400 (naming the field of a
// FieldError), not supported 501, unknown id 404, a caller or node beyond
// its rate or too many traces in flight 429 with Retry-After, a trace
// past the request's deadline 504.
func (a *API) traceFail(c *gin.Context, err error) {
	var rl *traceflow.RateLimitError
	var fe *traceflow.FieldError
	code := http.StatusInternalServerError
	switch {
	case errors.As(err, &fe):
		a.fail(c, &FieldError{Field: fe.Field, Message: fe.Message})
		return
	case errors.Is(err, traceflow.ErrInvalid):
		a.fail(c, &FieldError{Message: err.Error()})
		return
	case errors.As(err, &rl):
		code = http.StatusTooManyRequests
		c.Header("Retry-After", strconv.Itoa(ratelimit.RetryAfterSeconds(rl.RetryAfter)))
	case errors.Is(err, traceflow.ErrBusy):
		// A tag frees when a trace ends: within its timeout, mostly
		// within a second.
		code = http.StatusTooManyRequests
		c.Header("Retry-After", "1")
	case errors.Is(err, traceflow.ErrNotSupported):
		code = http.StatusNotImplemented
	case errors.Is(err, traceflow.ErrNotFound):
		code = http.StatusNotFound
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		code = http.StatusGatewayTimeout
	default:
		a.log.Error("trace failed", "path", c.FullPath(), "err", err)
	}
	c.AbortWithStatusJSON(code, errorBody{Message: err.Error()})
}
