package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
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
	viewer.GET("/audit/findings", a.auditFindings)
	viewer.GET("/audit/unprotected", a.auditUnprotected)
	viewer.GET("/audit/denied", a.auditDenied)
	viewer.GET("/audit/unused", a.auditUnused)
	viewer.GET("/audit/evaluate", a.auditEvaluate)
	viewer.POST("/audit/whatif", a.bounded(a.whatifGate), a.auditWhatIf)
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

// audit returns the configured Audit, or answers 501.
func (a *API) audit(c *gin.Context) (Audit, bool) {
	if a.cfg.Audit == nil {
		a.fail(c, fmt.Errorf("audit: %w", ErrNotConfigured))
		return nil, false
	}
	return a.cfg.Audit, true
}

// auditWindow reads since (default def back from now) and until, as the
// flow routes do.
func (a *API) auditWindow(c *gin.Context, def time.Duration) (audit.Window, error) {
	now := a.cfg.Now()
	w := audit.Window{Since: now.Add(-def), Until: now}
	var err error
	if v := c.Query("since"); v != "" {
		if w.Since, err = parseTime(v, now); err != nil {
			return w, fieldErr("since", "%v", err)
		}
	}
	if v := c.Query("until"); v != "" {
		if w.Until, err = parseTime(v, now); err != nil {
			return w, fieldErr("until", "%v", err)
		}
	}
	if !w.Since.Before(w.Until) {
		return w, fieldErr("since", "since must be before until")
	}
	return w, nil
}

// intQuery reads parameter name, 0 when absent, else 0-max.
func intQuery(c *gin.Context, name string, max int) (int, error) {
	s := c.Query(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > max {
		return 0, fieldErr(name, "%s %q: want 0-%d", name, s, max)
	}
	return n, nil
}

func (a *API) auditFindings(c *gin.Context) {
	au, ok := a.audit(c)
	if !ok {
		return
	}
	win, err := a.auditWindow(c, time.Hour)
	if err != nil {
		a.fail(c, err)
		return
	}
	res, err := au.Findings(c.Request.Context(), win)
	a.auditAnswer(c, res, err)
}

func (a *API) auditUnprotected(c *gin.Context) {
	if au, ok := a.audit(c); ok {
		res, err := au.Unprotected(c.Request.Context())
		a.auditAnswer(c, res, err)
	}
}

func (a *API) auditDenied(c *gin.Context) {
	au, ok := a.audit(c)
	if !ok {
		return
	}
	opt, err := func() (opt audit.DeniedOptions, err error) {
		if opt.Window, err = a.auditWindow(c, time.Hour); err != nil {
			return opt, err
		}
		if opt.Family, err = audit.ParseFamily(c.Query("family")); err != nil {
			return opt, fieldErr("family", "%v", err)
		}
		opt.Namespace = c.Query("namespace")
		opt.Limit, err = intQuery(c, "limit", 100_000)
		return opt, err
	}()
	if err != nil {
		a.fail(c, err)
		return
	}
	res, err := au.Denied(c.Request.Context(), opt)
	a.auditAnswer(c, res, err)
}

func (a *API) auditUnused(c *gin.Context) {
	au, ok := a.audit(c)
	if !ok {
		return
	}
	win, err := a.auditWindow(c, 24*time.Hour)
	if err != nil {
		a.fail(c, err)
		return
	}
	res, err := au.Unused(c.Request.Context(), win)
	a.auditAnswer(c, res, err)
}

func (a *API) auditWhatIf(c *gin.Context) {
	au, ok := a.audit(c)
	if !ok {
		return
	}
	win, err := a.auditWindow(c, 6*time.Hour)
	if err != nil {
		a.fail(c, err)
		return
	}
	limit, err := intQuery(c, "limit", 1_000_000)
	if err != nil {
		a.fail(c, err)
		return
	}
	res, err := au.WhatIf(c.Request.Context(), io.LimitReader(c.Request.Body, maxPolicyBody), win, limit)
	a.auditAnswer(c, res, err)
}

func (a *API) auditEvaluate(c *gin.Context) {
	au, ok := a.audit(c)
	if !ok {
		return
	}
	p, err := func() (p audit.Probe, err error) {
		p.From, p.To = c.Query("from"), c.Query("to")
		if p.Proto, err = audit.ParseProto(c.Query("proto")); err != nil {
			return p, fieldErr("proto", "%v", err)
		}
		if p.Family, err = audit.ParseFamily(c.Query("family")); err != nil {
			return p, fieldErr("family", "%v", err)
		}
		port, err := intQuery(c, "port", 65535)
		p.Port = uint16(port)
		return p, err
	}()
	if err != nil {
		a.fail(c, err)
		return
	}
	res, err := au.Evaluate(c.Request.Context(), p)
	a.auditAnswer(c, res, err)
}
