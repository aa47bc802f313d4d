package recommend

import (
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
)

// Audit is the static audit of the policies in force with proposed
// added (a proposed policy replaces the one of the same namespace and
// name): the workloads of scope left unprotected in a direction, and
// every dual-stack gap of the resulting set (audit.DualStackGaps), as
// the audit's findings. A proposed policy the API would reject is an
// error.
func Audit(view *enrich.Snapshot, proposed []*networkingv1.NetworkPolicy, scope Scope) ([]audit.Finding, error) {
	if _, err := policy.Compile(proposed); err != nil {
		return nil, err
	}
	set, _ := policy.Compile(audit.WithProposed(view.NetworkPolicies, proposed)) // invalid current policies are ignored, as the Auditor does
	var out []audit.Finding
	for _, u := range audit.Unprotected(view, set) {
		if (scope.Namespace == "" || u.Namespace == scope.Namespace) && (scope.Workload == "" || u.Workload.Name == scope.Workload) {
			out = append(out, u.Findings()...)
		}
	}
	out = append(out, audit.DualStackGaps(view, set, audit.Options{})...)
	audit.Describe(out)
	slices.SortStableFunc(out, func(a, b audit.Finding) int {
		if a.Kind != b.Kind {
			return strings.Compare(a.Kind, b.Kind)
		}
		return strings.Compare(a.Message, b.Message)
	})
	return out, nil
}
