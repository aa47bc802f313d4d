package api

import (
	"context"
	"errors"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/collector/audit/recommend"
)

// Recommender recommends NetworkPolicies from a window's observed flows,
// with their replay and static audit: *recommend.Queries over the live
// inventory and the store serves GET /api/v1/policy/recommend; dualflow
// policy recommend asks it of a server's route or of a local
// recommend.Queries.
type Recommender interface {
	Recommend(ctx context.Context, req recommend.Request) (*recommend.Report, error)
}

var _ Recommender = (*recommend.Queries)(nil)

// recommendRoutes mounts /policy/recommend on g: reads flows, writes
// nothing, so viewers may ask; it runs under the what-if's gate (each
// holds up to --web.recommend.max-flow-groups flow groups) and its window
// defaults to the last hour.
func (a *API) recommendRoutes(g *gin.RouterGroup) {
	g.GET("/recommend", a.configured("policy recommendations", a.cfg.Recommend != nil), a.bounded(a.whatifGate), a.answer(a.recommend))
}

func (a *API) recommend(c *gin.Context) (any, error) {
	q := c.Request.URL.Query()
	req := recommend.Request{}
	var err error
	if req.Mode, err = recommend.ParseMode(q.Get("mode")); err != nil {
		return nil, fieldErr("mode", "%v", err)
	}
	req.Scope.Namespace = q.Get("namespace")
	if req.Kind, req.Scope.Workload, err = recommend.ParseWorkload(q.Get("workload")); err != nil {
		return nil, fieldErr("workload", "%v", err)
	}
	if req.Window, err = a.auditWindow(c, time.Hour); err != nil {
		return nil, err
	}
	if req.Limit, err = intParam(q, "limit", 0, 0, 1_000_000); err != nil {
		return nil, err
	}
	rep, err := a.cfg.Recommend.Recommend(c.Request.Context(), req)
	if se := (*recommend.ScopeError)(nil); errors.As(err, &se) {
		return nil, fieldErr(se.Field, "%s", se.Message)
	}
	return rep, err
}
