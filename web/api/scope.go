package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"k8s.io/apiserver/pkg/authorization/authorizer"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/internal/chsql"
)

// A Kubernetes user who may list pods in some namespaces only (not in
// all) reads the flows, the charts, the service map and the catalog of
// those namespaces: Principal.scope. Every read of the flows table goes
// through scopedSource, a subquery that keeps the rows with an end (or
// the Service addressed) in the scope, and reduces the other end of such
// a row, when it is a pod of another namespace, to its namespace: its
// pod, workload, labels, node, zone, address, NAT address, Service name
// and address, and the policies of its side are blanked. Filters, sorts
// and sums run on what the subquery returns, so no filter can ask about
// what it blanked. Audit findings are those all of whose objects are in
// the scope (scopeFindings); the unprotected workloads and the unused
// rules are those of its namespaces, and the denied flow groups those
// with an end in it, the other end reduced as a row's (scopeDenied). A
// reachability matrix and a trace's result are theirs when every end
// they name is of a namespace in the scope (an address may be any pod's:
// it is not; outOfScope). Other views (what-if and evaluate,
// recommendations, status, SQL, metrics) need list pods in all
// namespaces.

// endRedactions are, per end, the columns blanked when the end is a pod
// of a namespace out of scope, with their blank values.
var endRedactions = map[string][][2]string{
	"src": {
		{"src_ip", "''"}, {"src_ip_bin", "toIPv6('::')"}, {"snat_ip", "''"}, {"snat_port", "0"},
		{"src_pod_name", "''"}, {"src_pod_labels", "map()"}, {"src_workload_kind", "''"}, {"src_workload_name", "''"},
		{"src_node", "''"}, {"src_zone", "''"}, {"src_label", "src_pod_namespace"},
		{"egress_policy_namespace", "''"}, {"egress_policy_name", "''"}, {"egress_policy_rule", "-1"}, {"egress_reported_policy", "''"},
	},
	"dst": {
		{"dst_ip", "''"}, {"dst_ip_bin", "toIPv6('::')"},
		{"dst_pod_name", "''"}, {"dst_pod_labels", "map()"}, {"dst_workload_kind", "''"}, {"dst_workload_name", "''"},
		{"dst_node", "''"}, {"dst_zone", "''"},
		{"ingress_policy_namespace", "''"}, {"ingress_policy_name", "''"}, {"ingress_policy_rule", "-1"}, {"ingress_reported_policy", "''"},
	},
}

// materialized are the flows table's MATERIALIZED columns, which SELECT
// * leaves out: the scoped subquery names them so that the queries over
// it find them.
var materialized = []string{"protocol_name", "src_ip_bin", "dst_ip_bin", "is_probe", "src_label", "dst_label", "verdict_class"}

// scopedSource is table as a principal limited to namespaces ns sees it
// (a FROM expression).
func scopedSource(table string, ns []string) string {
	in := func(col string) string { return chsql.In(col, ns) }
	// An end is hidden when it is a pod (its namespace set) out of the
	// scope; the Service addressed when its namespace is.
	hidden := map[string]string{
		"src": "(src_pod_namespace != '' AND NOT " + in("src_pod_namespace") + ")",
		"dst": "(dst_pod_namespace != '' AND NOT " + in("dst_pod_namespace") + ")",
	}
	svcHidden := "(dst_service_namespace != '' AND NOT " + in("dst_service_namespace") + ")"
	var repl []string
	for _, end := range []string{"src", "dst"} {
		for _, r := range endRedactions[end] {
			repl = append(repl, "if("+hidden[end]+", "+r[1]+", "+r[0]+") AS "+r[0])
		}
	}
	// The destination's name: the Service's, or the pod's, reduced to
	// the namespace of what is hidden.
	repl = append(repl,
		"multiIf("+svcHidden+", dst_service_namespace, "+hidden["dst"]+" AND dst_service_namespace = '', dst_pod_namespace, dst_label) AS dst_label",
		"if("+svcHidden+", '', dst_service_name) AS dst_service_name",
		"if("+svcHidden+", '', dst_service_port_name) AS dst_service_port_name",
		"if("+svcHidden+", '', service_ip) AS service_ip",
		// The exporter that reported the row runs on a node of one of
		// its ends.
		"if("+hidden["src"]+" OR "+hidden["dst"]+", '', exporter_node) AS exporter_node",
		"if("+hidden["src"]+" OR "+hidden["dst"]+", '', exporter_ip) AS exporter_ip",
	)
	rows := chsql.Or(in("src_pod_namespace"), in("dst_pod_namespace"), in("dst_service_namespace"))
	inner := "SELECT *, " + strings.Join(materialized, ", ") + " FROM " + table + " WHERE " + rows
	return "(SELECT * REPLACE (" + strings.Join(repl, ", ") + ") FROM (" + inner + "))"
}

// from is the FROM expression of f's reads of table: table itself, or
// its scoped subquery when the request's principal is limited to some
// namespaces.
func (f *Filter) from(table string) string {
	if f.scope == nil {
		return table
	}
	return scopedSource(table, f.scope)
}

// namespaceScope is the namespaces of the cluster view in which pr may
// list pods, sorted: each an access review, cached as the others. An
// error is answered (503) here.
func (a *API) namespaceScope(c *gin.Context, pr Principal) ([]string, error) {
	if a.cfg.Catalog == nil {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.cfg.QueryTimeout)
	defer cancel()
	cat, err := a.cfg.Catalog.Catalog(ctx)
	if err != nil {
		a.fail(c, err)
		return nil, err
	}
	var scope []string
	for _, ns := range cat.Namespaces {
		attr := PermView.attributes(pr.kube)
		attr.Namespace = ns
		d, _, err := a.kube.authz.Authorize(ctx, attr)
		if err != nil {
			err = fmt.Errorf("%w: %v", errKubeUnavailable, err)
			a.reviewFailed(c, "permission", pr.Name, err)
			return nil, err
		}
		if d == authorizer.DecisionAllow {
			scope = append(scope, ns)
		}
	}
	slices.Sort(scope)
	return scope, nil
}

// outOfScope checks what a request names against its principal's scope:
// refs are "namespace/name" references or namespaces, and an ip ref
// (ip true) may be a pod of any namespace. It answers 403 naming what is
// out of scope and returns false; true when the principal is not scoped
// or every ref is in its scope.
func outOfScope(c *gin.Context, what string, refs ...scopeRef) bool {
	scope := principalOf(c).scope
	if scope == nil {
		return true
	}
	for _, r := range refs {
		ns, _, _ := strings.Cut(r.ref, "/")
		msg := ""
		switch {
		case r.ip:
			msg = what + ": " + r.field + " is an address, which may be a pod of any namespace: that needs list pods in all namespaces"
		case ns == "":
			continue
		default:
			if _, ok := slices.BinarySearch(scope, ns); !ok {
				msg = fmt.Sprintf("%s: %s is in namespace %q, where you may not list pods", what, r.field, ns)
			}
		}
		if msg != "" {
			c.AbortWithStatusJSON(http.StatusForbidden, errorBody{Message: msg, Field: r.field})
			return false
		}
	}
	return true
}

// scopeRef is one reference a request names, for outOfScope.
type scopeRef struct {
	field string // the request's field, for the answer
	ref   string // "namespace/name" or a namespace
	ip    bool   // an address
}

// inScope reports whether namespace ns is in scope (sorted).
func inScope(scope []string, ns string) bool {
	_, ok := slices.BinarySearch(scope, ns)
	return ok
}

// scopeDenied reduces denied flow groups (with an end in scope, as
// DeniedOptions.Namespaces reads them) as scopedSource reduces rows: the
// workload of an end out of scope and the name of a policy of another
// namespace are blanked, and the groups that become alike are summed.
func scopeDenied(gs []audit.DeniedGroup, scope []string) []audit.DeniedGroup {
	var out []audit.DeniedGroup
	at := map[audit.DeniedGroup]int{}
	for _, g := range gs {
		if !inScope(scope, g.SrcNamespace) && g.SrcNamespace != "" {
			g.SrcWorkload = ""
		}
		if !inScope(scope, g.DstNamespace) && g.DstNamespace != "" {
			g.DstWorkload = ""
		}
		if !inScope(scope, g.PolicyNamespace) {
			g.PolicyName = ""
		}
		k := g
		k.Records, k.Packets, k.Bytes, k.First, k.Last = 0, 0, 0, time.Time{}, time.Time{}
		i, ok := at[k]
		if !ok {
			at[k] = len(out)
			out = append(out, g)
			continue
		}
		o := &out[i]
		o.Records, o.Packets, o.Bytes = o.Records+g.Records, o.Packets+g.Packets, o.Bytes+g.Bytes
		if g.First.Before(o.First) {
			o.First = g.First
		}
		if g.Last.After(o.Last) {
			o.Last = g.Last
		}
	}
	return out
}

// scopeUnused keeps of r the rules of policies in scope, and their uses.
func scopeUnused(r *audit.UnusedReport, scope []string) {
	r.Rules = slices.DeleteFunc(r.Rules, func(u audit.UnusedRule) bool { return !inScope(scope, u.Namespace) })
	for k := range r.Used {
		// "<direction> rule <n> of NetworkPolicy <namespace>/<name>"
		_, ref, _ := strings.Cut(k, " of NetworkPolicy ")
		if ns, _, _ := strings.Cut(ref, "/"); !inScope(scope, ns) {
			delete(r.Used, k)
		}
	}
}

// scopeCatalog keeps of cat what a principal limited to scope may know:
// its namespaces' names, pods, workloads and Services, no node.
func scopeCatalog(cat *CatalogResponse, scope []string) {
	in := func(ns string) bool { _, ok := slices.BinarySearch(scope, ns); return ok }
	cat.Namespaces = slices.DeleteFunc(cat.Namespaces, func(ns string) bool { return !in(ns) })
	cat.Pods = slices.DeleteFunc(cat.Pods, func(p CatalogPod) bool { return !in(p.Namespace) })
	cat.Workloads = slices.DeleteFunc(cat.Workloads, func(w CatalogWorkload) bool { return !in(w.Namespace) })
	cat.Services = slices.DeleteFunc(cat.Services, func(s CatalogService) bool { return !in(s.Namespace) })
	cat.Nodes = nil
}

// scopeFindings keeps the findings whose every object is of a namespace
// in scope. A finding's message names its objects, so one that spans
// another namespace (or a cluster-wide object) is left out whole rather
// than shown in part.
func scopeFindings(r *audit.FindingsResponse, scope []string) *audit.FindingsResponse {
	out := *r
	out.Findings, out.DualStack = nil, 0
	for _, f := range r.Findings {
		if len(f.Objects) == 0 || slices.ContainsFunc(f.Objects, func(o audit.Ref) bool {
			_, ok := slices.BinarySearch(scope, o.Namespace)
			return !ok
		}) {
			continue
		}
		out.Findings = append(out.Findings, f)
		if f.DualStack() {
			out.DualStack++
		}
	}
	if out.Findings == nil {
		out.Findings = []audit.Finding{}
	}
	return &out
}
