package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/collector/audit"
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

// auditRoutes mounts /audit/*: findings, unprotected, denied and unused
// (the report windows default to the last hour, or day for unused),
// evaluate (one flow, no traffic) and the what-if replay of proposed
// policies (bounded, as reachability is, per token and in all).
func (a *API) auditRoutes(viewer *gin.RouterGroup) {
	viewer.GET("/audit/findings", a.auditRoute(func(c *gin.Context, au Audit) (any, error) {
		win, err := a.auditWindow(c, time.Hour)
		if err != nil {
			return nil, err
		}
		return au.Findings(c.Request.Context(), win)
	}))
	viewer.GET("/audit/unprotected", a.auditRoute(func(c *gin.Context, au Audit) (any, error) {
		return au.Unprotected(c.Request.Context())
	}))
	viewer.GET("/audit/denied", a.auditRoute(func(c *gin.Context, au Audit) (any, error) {
		q := c.Request.URL.Query()
		opt := audit.DeniedOptions{Namespace: q.Get("namespace")}
		var err error
		if opt.Window, err = a.auditWindow(c, time.Hour); err != nil {
			return nil, err
		}
		if opt.Family, err = audit.ParseFamily(q.Get("family")); err != nil {
			return nil, fieldErr("family", "%v", err)
		}
		if opt.Limit, err = intParam(q, "limit", 0, 0, 100_000); err != nil {
			return nil, err
		}
		return au.Denied(c.Request.Context(), opt)
	}))
	viewer.GET("/audit/unused", a.auditRoute(func(c *gin.Context, au Audit) (any, error) {
		win, err := a.auditWindow(c, 24*time.Hour)
		if err != nil {
			return nil, err
		}
		return au.Unused(c.Request.Context(), win)
	}))
	viewer.GET("/audit/evaluate", a.auditRoute(func(c *gin.Context, au Audit) (any, error) {
		q := c.Request.URL.Query()
		p := audit.Probe{From: q.Get("from"), To: q.Get("to")}
		var err error
		if p.Proto, err = audit.ParseProto(q.Get("proto")); err != nil {
			return nil, fieldErr("proto", "%v", err)
		}
		if p.Family, err = audit.ParseFamily(q.Get("family")); err != nil {
			return nil, fieldErr("family", "%v", err)
		}
		port, err := intParam(q, "port", 0, 0, 65535)
		if err != nil {
			return nil, err
		}
		p.Port = uint16(port)
		return au.Evaluate(c.Request.Context(), p)
	}))
	viewer.POST("/audit/whatif", a.bounded(a.whatifGate), a.auditRoute(func(c *gin.Context, au Audit) (any, error) {
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

// auditRoute serves one audit question: ask reads the request and asks
// it of the configured Audit (none: 501), and its answer or error is
// answered as auditAnswer says.
func (a *API) auditRoute(ask func(c *gin.Context, au Audit) (any, error)) gin.HandlerFunc {
	return func(c *gin.Context) {
		if a.cfg.Audit == nil {
			a.fail(c, fmt.Errorf("audit: %w", ErrNotConfigured))
			return
		}
		v, err := ask(c, a.cfg.Audit)
		a.auditAnswer(c, v, err)
	}
}

// auditAnswer answers v, or err as the audit's errors map: an
// unavailable inventory or store 503, a what-if too large 422, a bad
// probe or proposed policy 400; the rest as fail does.
func (a *API) auditAnswer(c *gin.Context, v any, err error) {
	var tl *audit.TooLargeError
	switch {
	case err == nil:
		c.JSON(http.StatusOK, v)
	case errors.Is(err, audit.ErrUnavailable):
		c.AbortWithStatusJSON(http.StatusServiceUnavailable, errorBody{Message: err.Error()})
	case errors.As(err, &tl):
		a.fail(c, tooLarge(tl.Field, "%s", err.Error()))
	case errors.Is(err, audit.ErrBadProbe):
		a.fail(c, &FieldError{Message: err.Error()})
	case errors.Is(err, audit.ErrInvalidPolicy):
		a.fail(c, &FieldError{Field: "body", Message: err.Error()})
	default:
		a.fail(c, err)
	}
}

// auditWindow reads since (default def back from now) and until, as the
// flow routes do.
func (a *API) auditWindow(c *gin.Context, def time.Duration) (w audit.Window, err error) {
	w.Since, w.Until, err = parseWindow(c.Request.URL.Query(), a.cfg.Now(), def)
	return w, err
}
