package api

import (
	"context"
	"io"
	"slices"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/flow"
)

// Audit answers the audit's questions: *audit.Queries over the live
// inventory and the store serves the audit routes; dualflow audit asks
// them of a Queries over manifest files, or of a server's routes.
type Audit interface {
	Findings(ctx context.Context, win audit.Window) (*audit.FindingsResponse, error)
	Unprotected(ctx context.Context) ([]audit.UnprotectedWorkload, error)
	Denied(ctx context.Context, opt audit.DeniedOptions) ([]audit.DeniedGroup, error)
	Unused(ctx context.Context, win audit.Window) (*audit.UnusedReport, error)
	WhatIf(ctx context.Context, r io.Reader, win audit.Window, limit int) (*audit.WhatIfReport, error)
	Evaluate(ctx context.Context, p audit.Probe) ([]audit.ProbeResult, error)
}

var _ Audit = (*audit.Queries)(nil)

// maxPolicyBody bounds a what-if request body: proposed policies.
const maxPolicyBody = 1 << 20

// auditRoutes mounts /audit/* on g: findings, unprotected, denied and
// unused (the report windows default to the last hour, or day for
// unused), evaluate (one flow, no traffic) and the what-if replay of
// proposed policies (bounded, as reachability is, per token and in all).
func (a *API) auditRoutes(scoped, g *gin.RouterGroup) {
	au := a.cfg.Audit
	scoped.GET("/findings", a.answer(func(c *gin.Context) (any, error) {
		win, err := a.auditWindow(c, time.Hour)
		if err != nil {
			return nil, err
		}
		r, err := au.Findings(c.Request.Context(), win)
		if scope := principalOf(c).scope; err == nil && scope != nil {
			r = scopeFindings(r, scope)
		}
		return r, err
	}))
	scoped.GET("/unprotected", a.answer(func(c *gin.Context) (any, error) {
		r, err := au.Unprotected(c.Request.Context())
		if scope := principalOf(c).scope; err == nil && scope != nil {
			r = slices.DeleteFunc(r, func(w audit.UnprotectedWorkload) bool { return !inScope(scope, w.Namespace) })
		}
		return r, err
	}))
	scoped.GET("/denied", a.answer(func(c *gin.Context) (any, error) {
		q := c.Request.URL.Query()
		scope := principalOf(c).scope
		opt := audit.DeniedOptions{Namespace: q.Get("namespace"), Namespaces: scope}
		var err error
		if opt.Window, err = a.auditWindow(c, time.Hour); err != nil {
			return nil, err
		}
		if opt.Family, err = flow.ParseFamily(q.Get("family")); err != nil {
			return nil, fieldErr("family", "%v", err)
		}
		if opt.Limit, err = intParam(q, "limit", 0, 0, 100_000); err != nil {
			return nil, err
		}
		r, err := au.Denied(c.Request.Context(), opt)
		if err == nil && scope != nil {
			r = scopeDenied(r, scope)
		}
		return r, err
	}))
	scoped.GET("/unused", a.answer(func(c *gin.Context) (any, error) {
		win, err := a.auditWindow(c, 24*time.Hour)
		if err != nil {
			return nil, err
		}
		r, err := au.Unused(c.Request.Context(), win)
		if scope := principalOf(c).scope; err == nil && scope != nil {
			scopeUnused(r, scope)
		}
		return r, err
	}))
	g.GET("/evaluate", a.answer(func(c *gin.Context) (any, error) {
		q := c.Request.URL.Query()
		p := audit.Probe{From: q.Get("from"), To: q.Get("to")}
		var err error
		if p.Proto, err = audit.ParseProto(q.Get("proto")); err != nil {
			return nil, fieldErr("proto", "%v", err)
		}
		if p.Family, err = flow.ParseFamily(q.Get("family")); err != nil {
			return nil, fieldErr("family", "%v", err)
		}
		port, err := intParam(q, "port", 0, 0, 65535)
		if err != nil {
			return nil, err
		}
		p.Port = uint16(port)
		return au.Evaluate(c.Request.Context(), p)
	}))
	g.POST("/whatif", a.bounded(a.whatifGate), a.answer(func(c *gin.Context) (any, error) {
		win, err := a.auditWindow(c, 6*time.Hour)
		if err != nil {
			return nil, err
		}
		limit, err := intParam(c.Request.URL.Query(), "limit", 0, 0, 1_000_000)
		if err != nil {
			return nil, err
		}
		return au.WhatIf(c.Request.Context(), io.LimitReader(c.Request.Body, maxPolicyBody), win, limit)
	}))
}

// auditWindow reads since (default def back from now) and until, as the
// flow routes do.
func (a *API) auditWindow(c *gin.Context, def time.Duration) (w audit.Window, err error) {
	w.Since, w.Until, err = parseWindow(c.Request.URL.Query(), a.cfg.Now(), def)
	return w, err
}
