package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
)

// Queries answers the audit's questions over the live cluster view and
// the flow store: what web/api serves under /api/v1/audit and the CLI
// asks of a server. It holds no state of its own and is safe for
// concurrent use.
type Queries struct {
	// Reports runs the store reports; nil answers them with
	// ErrUnavailable.
	Reports *Reports
	// Cluster returns the cluster view (collector.Cluster, or manifests
	// through enrich.LoadSnapshot); nil answers the questions about the
	// cluster with ErrUnavailable.
	Cluster func() (*enrich.Snapshot, error)
	// Options bound the static analysis.
	Options Options
}

// ErrUnavailable says the cluster view or the store is not configured, or not
// ready (wrap it to say why); web/api answers it 503.
var ErrUnavailable = errors.New("not available on this server")

// ErrBadProbe is wrapped by Queries.Evaluate for a probe whose ends do not
// resolve: a bad request, not a failure.
var ErrBadProbe = errors.New("bad probe")

func (q *Queries) cluster() (*enrich.Snapshot, error) {
	if q.Cluster == nil {
		return nil, fmt.Errorf("cluster inventory: %w", ErrUnavailable)
	}
	return q.Cluster()
}

func (q *Queries) reports() (*Reports, error) {
	if q.Reports == nil {
		return nil, fmt.Errorf("flow store: %w", ErrUnavailable)
	}
	return q.Reports, nil
}

// FindingsResponse is the body of /api/v1/audit/findings.
type FindingsResponse struct {
	// Findings lists the dual-stack gaps first, then by kind and message.
	Findings []Finding `json:"findings"`
	// DualStack counts the dual-stack gaps (kinds dual-stack-*).
	DualStack int `json:"dual_stack"`
	// Observed says whether recorded flows were analysed too (the store
	// is configured); ObservedError is set if that part failed.
	Observed      bool   `json:"observed"`
	ObservedError string `json:"observed_error,omitempty"`
}

// Findings are the static findings of the cluster view and, with a store,
// the gaps observed in win's flows.
func (q *Queries) Findings(ctx context.Context, win Window) (*FindingsResponse, error) {
	view, err := q.cluster()
	if err != nil {
		return nil, err
	}
	res := &FindingsResponse{Findings: Findings(view, q.Options)}
	if q.Reports != nil {
		res.Observed = true
		obs, err := q.Reports.ObservedGaps(ctx, view, win, 0)
		if err != nil {
			res.ObservedError = err.Error()
		}
		res.Findings = append(res.Findings, obs...)
		settle(res.Findings)
	}
	if res.Findings == nil {
		res.Findings = []Finding{}
	}
	slices.SortStableFunc(res.Findings, func(a, b Finding) int {
		switch {
		case a.DualStack() == b.DualStack():
			return 0
		case a.DualStack():
			return -1
		}
		return 1
	})
	for _, f := range res.Findings {
		if f.DualStack() {
			res.DualStack++
		}
	}
	return res, nil
}

// Unprotected lists the workloads not isolated, per direction.
func (q *Queries) Unprotected(context.Context) ([]UnprotectedWorkload, error) {
	view, err := q.cluster()
	if err != nil {
		return nil, err
	}
	set, _ := policy.Compile(view.NetworkPolicies)
	return append([]UnprotectedWorkload{}, Unprotected(view, set)...), nil
}

// Denied groups the denied flows of opt's window.
func (q *Queries) Denied(ctx context.Context, opt DeniedOptions) ([]DeniedGroup, error) {
	rep, err := q.reports()
	if err != nil {
		return nil, err
	}
	g, err := rep.Denied(ctx, opt)
	return append([]DeniedGroup{}, g...), err
}

// Unused lists the rules of the cluster view's policies that allowed no
// flow of win.
func (q *Queries) Unused(ctx context.Context, win Window) (*UnusedReport, error) {
	rep, err := q.reports()
	if err != nil {
		return nil, err
	}
	view, err := q.cluster()
	if err != nil {
		return nil, err
	}
	return rep.Unused(ctx, view.NetworkPolicies, win)
}

// WhatIf replays win's flows (at most limit groups) under the proposed
// policies, read from r (YAML or JSON, several documents allowed); a
// document that does not decode or validate is an ErrInvalidPolicy.
func (q *Queries) WhatIf(ctx context.Context, r io.Reader, win Window, limit int) (*WhatIfReport, error) {
	rep, err := q.reports()
	if err != nil {
		return nil, err
	}
	view, err := q.cluster()
	if err != nil {
		return nil, err
	}
	pols, err := DecodePolicies("request body", r, "default")
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPolicy, err)
	}
	return rep.WhatIf(ctx, view, pols, win, limit)
}

// Evaluate answers a probe with the policies of the cluster view; ends
// that do not resolve are an ErrBadProbe.
func (q *Queries) Evaluate(_ context.Context, p Probe) ([]ProbeResult, error) {
	view, err := q.cluster()
	if err != nil {
		return nil, err
	}
	set, _ := policy.Compile(view.NetworkPolicies)
	out, err := Evaluate(view, set, p)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadProbe, err)
	}
	return out, nil
}
