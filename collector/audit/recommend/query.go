package recommend

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
)

// Queries are the audit's queries with recommendations over its cluster
// view and flow store: what web/api serves under
// /api/v1/policy/recommend and dualflow policy recommend asks of a
// server or works out locally. Recommend lives here rather than on
// audit.Queries because this package builds on audit. Safe for
// concurrent use.
type Queries struct {
	*audit.Queries
	// MaxFlowGroups bounds the flow groups one recommendation reads
	// (default DefaultMaxFlowGroups).
	MaxFlowGroups int
}

// DefaultMaxFlowGroups bounds the flow groups one recommendation reads:
// a cluster of 2,000 workloads each calling 5 others over both families
// has 220,000. They are held at about 250 bytes each, and building the
// answer allocates some 10 KiB per group (2.2 GB for 220,000 groups in
// BenchmarkRecommendLarge), most of it short-lived.
const DefaultMaxFlowGroups = 300_000

// Request is what to recommend, from the flows of which window.
type Request struct {
	Options
	// Kind, when set, is the kind of Scope.Workload (Deployment,
	// StatefulSet, DaemonSet, ...): it must match.
	Kind string
	audit.Window
	// Limit bounds the flow groups read (default and at most
	// Queries.MaxFlowGroups): a window with more is refused rather than
	// recommended from part of its flows.
	Limit int
}

// ScopeError is a Request whose scope or limit is wrong: Field names the
// parameter (namespace, workload or limit). The API answers it 400.
type ScopeError struct {
	Field, Message string
}

func (e *ScopeError) Error() string { return e.Message }

// Report is a recommendation with its proof: the replay of the window's
// flows and the static audit of the policies with it.
type Report struct {
	Mode      Mode      `json:"mode"`
	Namespace string    `json:"namespace,omitempty"`
	Workload  string    `json:"workload,omitempty"`
	Since     time.Time `json:"since"`
	Until     time.Time `json:"until"`
	// Flows is the number of flow groups the recommendation was built
	// from.
	Flows int `json:"flows"`
	// YAML is the recommended policies as kubectl apply takes them.
	YAML string `json:"yaml"`
	// Policies names the recommended policies, namespace/name.
	Policies []string `json:"policies"`
	// Notes are the recommendation's notes (flows no rule was made for,
	// and why).
	Notes []string `json:"notes"`
	// Replay is the window's flows with the policies in force plus the
	// recommendation, per family.
	Replay []FamilyReplay `json:"replay"`
	// Findings are the static audit of the policies with the
	// recommendation (Audit): workloads of the scope left unprotected,
	// dual-stack gaps.
	Findings []audit.Finding `json:"findings"`
	// Diff is each recommended policy against the policies in force, in
	// words and as YAML.
	Diff []PolicyDiff `json:"diff"`
}

// Recommend reads the flow groups of req's window with an end in its
// scope, recommends policies for the scope, replays the flows and
// audits the result. A scope naming no workload of the cluster view is
// a *ScopeError; a window with more flow groups than the bound an
// *audit.TooLargeError.
func (q *Queries) Recommend(ctx context.Context, req Request) (*Report, error) {
	if q.Queries == nil || q.Reports == nil {
		return nil, fmt.Errorf("flow store: %w", audit.ErrUnavailable)
	}
	if q.Cluster == nil {
		return nil, fmt.Errorf("cluster inventory: %w", audit.ErrUnavailable)
	}
	mode, err := ParseMode(string(req.Mode))
	if err != nil {
		return nil, &ScopeError{Field: "mode", Message: err.Error()}
	}
	req.Mode = mode
	sc := req.Scope
	if sc.Workload != "" && sc.Namespace == "" {
		return nil, &ScopeError{Field: "namespace", Message: fmt.Sprintf("workload %q needs its namespace", sc.Workload)}
	}
	if req.Kind != "" && sc.Workload == "" {
		return nil, &ScopeError{Field: "workload", Message: "a workload kind needs the workload's name"}
	}
	bound := cmp.Or(q.MaxFlowGroups, DefaultMaxFlowGroups)
	limit := cmp.Or(req.Limit, bound)
	switch {
	case limit < 0:
		return nil, &ScopeError{Field: "limit", Message: fmt.Sprintf("limit %d: must not be negative", limit)}
	case limit > bound:
		return nil, &audit.TooLargeError{Field: "limit", Message: fmt.Sprintf("limit %d: at most %d flow groups are read for a recommendation", limit, bound)}
	}
	view, err := q.Cluster()
	if err != nil {
		return nil, err
	}
	if err := checkScope(view, sc, req.Kind); err != nil {
		return nil, err
	}
	if req.Until.IsZero() {
		req.Until = time.Now()
	}
	flows, truncated, err := q.Reports.ObservedFlows(ctx, audit.ObservedOptions{Window: req.Window, Namespace: sc.Namespace, Workload: sc.Workload, Limit: limit})
	if err != nil {
		return nil, err
	}
	if truncated {
		return nil, &audit.TooLargeError{Field: "since", Message: fmt.Sprintf("the window has more than %d flow groups in %s: a recommendation from part of them would deny the rest; narrow since, the scope, or raise limit", limit, sc)}
	}
	return Build(view, flows, req)
}

// Build recommends for req from the flow groups of its window read from
// the store (or given), replays them and audits the result: the Report
// Queries.Recommend answers. A scope with no pod off the host network is
// a *ScopeError.
func Build(view *enrich.Snapshot, flows []audit.ObservedFlow, req Request) (*Report, error) {
	sc := req.Scope
	rec, err := Recommend(view, flows, req.Options)
	if err != nil { // the scope has no pod off the host network
		field := "namespace"
		if sc.Workload != "" {
			field = "workload"
		}
		return nil, &ScopeError{Field: field, Message: err.Error()}
	}
	y, docs, err := rec.render()
	if err != nil {
		return nil, err
	}
	diff, err := Diff(view, rec, docs)
	if err != nil {
		return nil, err
	}
	pols := rec.NetworkPolicies()
	rep, err := Replay(view, pols, flows)
	if err != nil {
		return nil, err
	}
	findings, err := Audit(view, pols, sc)
	if err != nil {
		return nil, err
	}
	out := &Report{Mode: rec.Mode, Namespace: sc.Namespace, Workload: sc.Workload, Since: req.Since, Until: req.Until,
		Flows: len(flows), YAML: string(y), Policies: []string{}, Notes: append([]string{}, rec.Notes...),
		Replay: []FamilyReplay{}, Findings: append([]audit.Finding{}, findings...), Diff: diff}
	for _, p := range pols {
		out.Policies = append(out.Policies, p.Namespace+"/"+p.Name)
	}
	for _, f := range rep.Families {
		f.NewlyDenied, f.NewlyAllowed = append([]ReplayedFlow{}, f.NewlyDenied...), append([]ReplayedFlow{}, f.NewlyAllowed...)
		out.Replay = append(out.Replay, f)
	}
	return out, nil
}

// ParseWorkload reads a workload as the API and the CLI take it:
// KIND/NAME (Deployment/web) or NAME.
func ParseWorkload(s string) (kind, name string, err error) {
	kind, name, ok := strings.Cut(s, "/")
	if !ok {
		return "", s, nil
	}
	if kind == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("workload %q: want KIND/NAME (Deployment/web) or NAME", s)
	}
	return kind, name, nil
}

// checkScope says which parameter names nothing of view: a namespace
// that does not exist, a workload (of kind, when given) with no pod in
// it.
func checkScope(view *enrich.Snapshot, sc Scope, kind string) error {
	if sc.Namespace == "" {
		return nil
	}
	if !slices.ContainsFunc(view.Namespaces, func(n *enrich.Namespace) bool { return n.Name == sc.Namespace }) {
		return &ScopeError{Field: "namespace", Message: fmt.Sprintf("namespace %q: not in the cluster", sc.Namespace)}
	}
	if sc.Workload == "" {
		return nil
	}
	for i, p := range view.Pods {
		w := view.Workloads[i]
		if p.Namespace == sc.Namespace && w.Name == sc.Workload && (kind == "" || w.Kind == kind) {
			return nil
		}
	}
	what := "workload"
	if kind != "" {
		what = kind
	}
	return &ScopeError{Field: "workload", Message: fmt.Sprintf("%s %s/%s: no pod of it in the cluster", what, sc.Namespace, sc.Workload)}
}
