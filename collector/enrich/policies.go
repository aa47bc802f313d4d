package enrich

import (
	"sort"

	networkingv1 "k8s.io/api/networking/v1"
)

// PoliciesChanged receives after NetworkPolicies were added, changed or
// removed (one receive may stand for several changes; then read them with
// AllNetworkPolicies), so that the auditor follows a change at once
// rather than at its next refresh. There is one channel: one reader.
func (e *Enricher) PoliciesChanged() <-chan struct{} { return e.x.policiesChanged }

// AllNetworkPolicies returns every NetworkPolicy of every namespace, sorted
// by namespace then name, for the policy evaluator. The policies are shared
// and never modified; the slice is the caller's.
func (e *Enricher) AllNetworkPolicies() []*networkingv1.NetworkPolicy {
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	namespaces := make([]string, 0, len(e.x.policies))
	n := 0
	for ns, l := range e.x.policies {
		namespaces = append(namespaces, ns)
		n += len(l)
	}
	sort.Strings(namespaces)
	out := make([]*networkingv1.NetworkPolicy, 0, n)
	for _, ns := range namespaces {
		out = append(out, e.x.policies[ns]...)
	}
	return out
}
