package enrich

import (
	"cmp"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"
)

// Snapshot is the cluster as the Enricher sees it at one moment: every
// live object of each kind, sorted by namespace and name. It is what the
// policy audit, the reachability matrix and traceflow's name resolution
// read (through the collector), so that they answer from the same view
// as the enrichment, and follow the cluster as it changes. The objects
// are the Enricher's immutable views: read-only, shared, valid for as
// long as they are held.
type Snapshot struct {
	// Generation is Enricher.Generation when the snapshot was taken: a
	// snapshot with the current generation is still the cluster's state.
	Generation uint64
	Namespaces []*Namespace
	Nodes      []*Node
	// Pods includes terminated pods (Pod.Terminated); Workloads[i] is
	// Pods[i]'s controller, resolved as for flow records.
	Pods            []*Pod
	Workloads       []Workload
	Services        []*Service
	EndpointSlices  []*EndpointSlice
	NetworkPolicies []*networkingv1.NetworkPolicy
}

// Generation counts the changes applied to the index (every add, update
// and delete of a watched object). It only grows; two equal values mean
// nothing changed in between.
func (e *Enricher) Generation() uint64 { return e.gen.Load() }

// Snapshot returns the live objects, taken under one read lock: a
// consistent state of the index. It costs a few slices of pointers (no
// object is copied); callers that answer many requests cache it by
// Generation.
func (e *Enricher) Snapshot() *Snapshot {
	x := e.x
	x.mu.RLock()
	defer x.mu.RUnlock()
	s := &Snapshot{
		Generation:     e.gen.Load(),
		Namespaces:     make([]*Namespace, 0, len(x.namespaces)),
		Nodes:          make([]*Node, 0, len(x.nodes)),
		Pods:           make([]*Pod, 0, len(x.pods)),
		Services:       make([]*Service, 0, len(x.services)),
		EndpointSlices: make([]*EndpointSlice, 0, len(x.slices)),
	}
	for _, n := range x.namespaces {
		s.Namespaces = append(s.Namespaces, n)
	}
	for _, n := range x.nodes {
		s.Nodes = append(s.Nodes, n)
	}
	for _, p := range x.pods {
		s.Pods = append(s.Pods, p)
	}
	for _, v := range x.services {
		s.Services = append(s.Services, v)
	}
	for _, v := range x.slices {
		s.EndpointSlices = append(s.EndpointSlices, v)
	}
	slices.SortFunc(s.Namespaces, func(a, b *Namespace) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(s.Nodes, func(a, b *Node) int { return cmp.Compare(a.Name, b.Name) })
	slices.SortFunc(s.Pods, func(a, b *Pod) int { return cmpNames(a.Namespace, a.Name, b.Namespace, b.Name) })
	slices.SortFunc(s.Services, func(a, b *Service) int { return cmpNames(a.Namespace, a.Name, b.Namespace, b.Name) })
	slices.SortFunc(s.EndpointSlices, func(a, b *EndpointSlice) int { return cmpNames(a.Namespace, a.Name, b.Namespace, b.Name) })
	s.Workloads = make([]Workload, len(s.Pods))
	for i, p := range s.Pods {
		s.Workloads[i] = x.workload(p)
	}
	namespaces := make([]string, 0, len(x.policies))
	for ns := range x.policies {
		namespaces = append(namespaces, ns)
	}
	slices.Sort(namespaces)
	for _, ns := range namespaces {
		s.NetworkPolicies = append(s.NetworkPolicies, x.policies[ns]...)
	}
	return s
}

func cmpNames(ans, an, bns, bn string) int {
	if c := cmp.Compare(ans, bns); c != 0 {
		return c
	}
	return cmp.Compare(an, bn)
}
