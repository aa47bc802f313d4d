package enrich

import (
	"slices"

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
	return e.x.allPolicies()
}

// allPolicies is AllNetworkPolicies; the caller holds x.mu.
func (x *index) allPolicies() []*networkingv1.NetworkPolicy {
	namespaces := make([]string, 0, len(x.policies))
	n := 0
	for ns, l := range x.policies {
		namespaces = append(namespaces, ns)
		n += len(l)
	}
	slices.Sort(namespaces)
	out := make([]*networkingv1.NetworkPolicy, 0, n)
	for _, ns := range namespaces {
		out = append(out, x.policies[ns]...)
	}
	return out
}
