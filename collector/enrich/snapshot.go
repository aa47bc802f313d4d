package enrich

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich/inventory"
)

// Snapshot is the cluster as the Enricher sees it at one moment: every
// live object of each kind, sorted by namespace and name, with lookups
// by name and by address. It is the one cluster view that the policy
// audit, the reachability matrix, the catalog and traceflow's name
// resolution read (through the collector), so that they answer from the
// same view as the enrichment and follow the cluster as it changes; the
// CLI and tests build it from manifests (LoadSnapshot, NewSnapshot)
// through the same transforms. The objects are the Enricher's immutable
// views: read-only, shared, valid for as long as they are held. A
// Snapshot is read-only and safe for concurrent readers; build one
// literally only with the exported fields sorted as documented.
type Snapshot struct {
	// Generation is Enricher.Generation when the snapshot was taken: a
	// snapshot with the current generation is still the cluster's state.
	Generation uint64
	Namespaces []*Namespace
	Nodes      []*Node
	// Pods are the running pods (a terminated pod holds no address);
	// Workloads[i] is Pods[i]'s controller, resolved as for flow records.
	Pods            []*Pod
	Workloads       []Workload
	Services        []*Service
	EndpointSlices  []*EndpointSlice
	NetworkPolicies []*networkingv1.NetworkPolicy

	addrsOnce sync.Once
	podAddrs  map[netip.Addr]*Pod // the first pod off the host network holding each address; built on first use
}

// Generation counts the changes applied to the index (every add, update
// and delete of a watched object). It only grows; two equal values mean
// nothing changed in between.
func (e *Enricher) Generation() uint64 { return e.gen.Load() }

// Snapshot returns the live objects, taken under one read lock: a
// consistent state of the index. It costs a few sorted slices of
// pointers (no object is copied); callers that answer many requests
// cache it by Generation.
func (e *Enricher) Snapshot() *Snapshot {
	e.x.mu.RLock()
	defer e.x.mu.RUnlock()
	return e.x.snapshot(e.gen.Load())
}

// NewSnapshot builds the view of objs as the Enricher builds it from a
// cluster (the same transforms and index, IPv6 on), for manifests and
// tests. Kinds the Enricher does not watch are ignored.
func NewSnapshot(objs ...runtime.Object) *Snapshot { return indexOf(objs).snapshot(0) }

// LoadSnapshot reads manifest files (package inventory: kubectl get -o
// yaml output, the lab's manifest) into a Snapshot.
func LoadSnapshot(files ...string) (*Snapshot, error) {
	x, err := loadIndex(files)
	if err != nil {
		return nil, err
	}
	return x.snapshot(0), nil
}

// Nodes tells which node an address belongs to, from the objects of
// manifest files, as the Enricher tells it from a cluster (NodesForIPs, on
// the same index): the correlator's view under --collector.inventory. It
// is read-only and safe for concurrent use.
type Nodes struct{ x *index }

// LoadNodes reads manifest files into Nodes; files without a Node object
// are an error (nothing to correlate by).
func LoadNodes(files ...string) (*Nodes, error) {
	x, err := loadIndex(files)
	if err != nil {
		return nil, err
	}
	if len(x.nodes) == 0 {
		return nil, fmt.Errorf("inventory %s: no Node objects", strings.Join(files, ", "))
	}
	return &Nodes{x}, nil
}

// NodesForIPs is Enricher.NodesForIPs.
func (n *Nodes) NodesForIPs(addrs []netip.Addr, nodes []string) {
	n.x.nodesFor(addrs, nodes, n.x.now().UnixNano())
}

// Len returns the number of nodes.
func (n *Nodes) Len() int { return len(n.x.nodes) }

// indexOf indexes objs as the Enricher indexes a cluster's (IPv6 on).
func indexOf(objs []runtime.Object) *index {
	x := newIndex(time.Now, 0, true)
	tr := &transformer{in: newInterner(), ipv6: true}
	for _, o := range objs {
		v, _ := tr.transform(o)
		x.set(v)
	}
	return x
}

func loadIndex(files []string) (*index, error) {
	res, err := inventory.Load(files...)
	if err != nil {
		return nil, err
	}
	objs := make([]runtime.Object, len(res.Objects))
	for i := range res.Objects {
		objs[i] = res.Objects[i].Object
	}
	return indexOf(objs), nil
}

// snapshot takes the snapshot of x; the caller holds x.mu.
func (x *index) snapshot(gen uint64) *Snapshot {
	s := &Snapshot{
		Generation:     gen,
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
		if !p.Terminated {
			s.Pods = append(s.Pods, p)
		}
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
	s.NetworkPolicies = x.allPolicies()
	return s
}

// The lookups by name search the sorted slices (a snapshot is taken at
// most once a second, and most are read only a few times: indexing 100k
// pods by name would cost more than the searches).

func (s *Snapshot) podIndex(namespace, name string) (int, bool) {
	return slices.BinarySearchFunc(s.Pods, nsName{namespace, name}, func(p *Pod, k nsName) int {
		return cmpNames(p.Namespace, p.Name, k.ns, k.name)
	})
}

// Pod returns the running pod namespace/name.
func (s *Snapshot) Pod(namespace, name string) (*Pod, bool) {
	if i, ok := s.podIndex(namespace, name); ok {
		return s.Pods[i], true
	}
	return nil, false
}

// LookupPod returns the running pod holding address a, host-network pods
// excepted (their addresses are their node's). The time is not used: a
// snapshot is one moment. (The signature is Enricher.LookupPod's.) The
// first call indexes the addresses.
func (s *Snapshot) LookupPod(a netip.Addr, _ time.Time) (*Pod, bool) {
	s.addrsOnce.Do(func() {
		s.podAddrs = make(map[netip.Addr]*Pod, 2*len(s.Pods))
		for _, p := range s.Pods {
			for _, a := range p.Addrs {
				if _, dup := s.podAddrs[a]; !dup && !p.HostNetwork {
					s.podAddrs[a] = p
				}
			}
		}
	})
	p, ok := s.podAddrs[a.Unmap()]
	return p, ok
}

// Service returns the Service namespace/name.
func (s *Snapshot) Service(namespace, name string) (*Service, bool) {
	if i, ok := slices.BinarySearchFunc(s.Services, nsName{namespace, name}, func(v *Service, k nsName) int {
		return cmpNames(v.Namespace, v.Name, k.ns, k.name)
	}); ok {
		return s.Services[i], true
	}
	return nil, false
}

// Namespace returns the namespace called name.
func (s *Snapshot) Namespace(name string) (*Namespace, bool) {
	if i, ok := slices.BinarySearchFunc(s.Namespaces, name, func(n *Namespace, name string) int { return cmp.Compare(n.Name, name) }); ok {
		return s.Namespaces[i], true
	}
	return nil, false
}

// Workload returns the top-level controller of p, a pod of the snapshot
// (else p's own controller reference, or Pod for a bare pod).
func (s *Snapshot) Workload(p *Pod) Workload {
	if i, ok := s.podIndex(p.Namespace, p.Name); ok && s.Pods[i] == p && i < len(s.Workloads) {
		return s.Workloads[i]
	}
	if p.Owner.Kind == "" {
		return Workload{Kind: KindPod, Name: p.Name}
	}
	return p.Owner
}

// PortName returns the name of p's container port serving port over
// proto (an IANA number), "" if none (for named ports in policy rules).
func (p *Pod) PortName(port uint16, proto uint8) string {
	for i := range p.Ports {
		if cp := &p.Ports[i]; cp.Port == int32(port) && policy.ProtoNumber(&cp.Protocol) == proto {
			return cp.Name
		}
	}
	return ""
}

func cmpNames(ans, an, bns, bn string) int {
	if c := cmp.Compare(ans, bns); c != 0 {
		return c
	}
	return cmp.Compare(an, bn)
}
