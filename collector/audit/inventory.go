package audit

import (
	"cmp"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich/inventory"
	"github.com/dualflow/dualflow/flow"
)

// Inventory is an in-memory snapshot of what auditing reads about a
// cluster: namespaces (labels), pods (labels, addresses, container ports,
// workload), Services (selector, IP families) and NetworkPolicies. It is
// built from Kubernetes objects (manifest files, listers) or field by
// field (AddPod, ...), by one goroutine; once built it is read-only and
// safe for concurrent readers. It implements Lookup, so it can feed an
// Auditor directly (tests, the CLI, the lab).
type Inventory struct {
	namespaces map[string]*Namespace
	pods       []*Pod
	podByName  map[[2]string]*Pod
	services   []*Service
	policies   []*networkingv1.NetworkPolicy
	// rsOwner maps namespace/ReplicaSet to its controller, to resolve pod
	// workloads to Deployments.
	rsOwner map[[2]string]Workload
	// Skipped counts the objects of kinds an inventory does not keep, by
	// kind.
	Skipped map[string]int
}

// Namespace is a namespace and its labels.
type Namespace struct {
	Name   string
	Labels map[string]string
}

// Pod is what auditing needs of a pod.
type Pod struct {
	Namespace, Name string
	Labels          map[string]string
	// Addrs are status.podIPs, unmapped, at most one per family matters.
	Addrs []netip.Addr
	Ports []Port
	// Owner is the controller owner reference as written (ReplicaSet
	// web-6b7f9c5d84); Inventory.Workload resolves it.
	Owner       Workload
	HostNetwork bool
}

// Port is a container port.
type Port struct {
	Name  string
	Port  int32
	Proto uint8 // flow.ProtoTCP, flow.ProtoUDP or flow.ProtoSCTP
}

// Workload is a pod's top-level controller (Deployment, StatefulSet, ...),
// or Kind Pod for a bare pod.
type Workload struct {
	Kind, Name string
}

// Service is what auditing needs of a Service.
type Service struct {
	Namespace, Name string
	// Selector selects the Service's pods (nil: no selector, endpoints
	// managed by hand).
	Selector       map[string]string
	IPFamilies     []corev1.IPFamily
	IPFamilyPolicy corev1.IPFamilyPolicy
	ClusterIPs     []netip.Addr
}

// NewInventory returns an empty inventory.
func NewInventory() *Inventory {
	return &Inventory{
		namespaces: map[string]*Namespace{},
		podByName:  map[[2]string]*Pod{},
		rsOwner:    map[[2]string]Workload{},
		Skipped:    map[string]int{},
	}
}

// AddNamespace adds (or replaces) a namespace.
func (inv *Inventory) AddNamespace(ns Namespace) {
	inv.namespaces[ns.Name] = &ns
}

// AddPod adds (or replaces) a pod. Its addresses are unmapped in place.
func (inv *Inventory) AddPod(p Pod) {
	for i, a := range p.Addrs {
		p.Addrs[i] = a.Unmap()
	}
	key := [2]string{p.Namespace, p.Name}
	if old := inv.podByName[key]; old != nil {
		*old = p
		return
	}
	pp := &p
	inv.pods = append(inv.pods, pp)
	inv.podByName[key] = pp
}

// AddService adds a Service.
func (inv *Inventory) AddService(s Service) { inv.services = append(inv.services, &s) }

// AddPolicy adds a NetworkPolicy (kept by reference: do not modify it).
func (inv *Inventory) AddPolicy(p *networkingv1.NetworkPolicy) {
	inv.policies = append(inv.policies, p)
}

// AddObject adds a Kubernetes object: Namespace, Pod, Service,
// NetworkPolicy, or ReplicaSet (to resolve pods to their Deployment).
// Other kinds are counted in Skipped.
func (inv *Inventory) AddObject(obj runtime.Object) error {
	switch o := obj.(type) {
	case *corev1.Namespace:
		inv.AddNamespace(Namespace{Name: o.Name, Labels: o.Labels})
	case *corev1.Pod:
		inv.AddPod(podFromObject(o))
	case *corev1.Service:
		inv.AddService(serviceFromObject(o))
	case *networkingv1.NetworkPolicy:
		inv.AddPolicy(o)
	case *appsv1.ReplicaSet:
		if w, ok := controllerOf(o.OwnerReferences); ok {
			inv.rsOwner[[2]string{o.Namespace, o.Name}] = w
		}
	default:
		kind := obj.GetObjectKind().GroupVersionKind().Kind
		if kind == "" {
			kind = fmt.Sprintf("%T", obj)
		}
		inv.Skipped[kind]++
	}
	return nil
}

func controllerOf(refs []metav1.OwnerReference) (Workload, bool) {
	for _, r := range refs {
		if r.Controller != nil && *r.Controller {
			return Workload{Kind: r.Kind, Name: r.Name}, true
		}
	}
	return Workload{}, false
}

func podFromObject(o *corev1.Pod) Pod {
	p := Pod{Namespace: o.Namespace, Name: o.Name, Labels: o.Labels, HostNetwork: o.Spec.HostNetwork}
	for _, ip := range o.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			p.Addrs = append(p.Addrs, a.Unmap())
		}
	}
	if len(p.Addrs) == 0 && o.Status.PodIP != "" {
		if a, err := netip.ParseAddr(o.Status.PodIP); err == nil {
			p.Addrs = append(p.Addrs, a.Unmap())
		}
	}
	for _, c := range o.Spec.Containers {
		for _, cp := range c.Ports {
			proto := policy.ProtoNumber(&cp.Protocol)
			if cp.Protocol == "" {
				proto = flow.ProtoTCP
			}
			p.Ports = append(p.Ports, Port{Name: cp.Name, Port: cp.ContainerPort, Proto: proto})
		}
	}
	if w, ok := controllerOf(o.OwnerReferences); ok {
		p.Owner = w
	}
	return p
}

func serviceFromObject(o *corev1.Service) Service {
	s := Service{Namespace: o.Namespace, Name: o.Name, Selector: o.Spec.Selector, IPFamilies: o.Spec.IPFamilies}
	if o.Spec.IPFamilyPolicy != nil {
		s.IPFamilyPolicy = *o.Spec.IPFamilyPolicy
	}
	ips := o.Spec.ClusterIPs
	if len(ips) == 0 && o.Spec.ClusterIP != "" {
		ips = []string{o.Spec.ClusterIP}
	}
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip); err == nil {
			s.ClusterIPs = append(s.ClusterIPs, a.Unmap())
		}
	}
	if len(s.IPFamilies) == 0 {
		for _, a := range s.ClusterIPs {
			s.IPFamilies = append(s.IPFamilies, familyOf(a))
		}
	}
	return s
}

// Decode adds every object of a multi-document YAML or JSON stream
// ("---" separated, Lists accepted), read as the enrichment reads its
// inventory files (package enrich/inventory: objects checked, errors
// naming the file, line and object). Kinds an audit does not use are
// counted in Skipped.
func (inv *Inventory) Decode(name string, r io.Reader) error {
	res, err := inventory.Decode(name, r)
	if err != nil {
		return err
	}
	return inv.addResult(res)
}

func (inv *Inventory) addResult(res *inventory.Result) error {
	for k, n := range res.Skipped { // "apiVersion kind"
		_, kind, _ := strings.Cut(k, " ")
		inv.Skipped[kind] += n
	}
	for _, o := range res.Objects {
		if err := inv.AddObject(o.Object); err != nil {
			return fmt.Errorf("%s: %w", o.Where(), err)
		}
	}
	return nil
}

// LoadInventory reads manifest files (kubectl get -o yaml output, the
// lab's manifest.yaml) into a new inventory.
func LoadInventory(files ...string) (*Inventory, error) {
	res, err := inventory.Load(files...)
	if err != nil {
		return nil, err
	}
	inv := NewInventory()
	return inv, inv.addResult(res)
}

// InventoryFromObjects builds an inventory from objects (see AddObject).
func InventoryFromObjects(objs ...runtime.Object) (*Inventory, error) {
	inv := NewInventory()
	for _, o := range objs {
		if err := inv.AddObject(o); err != nil {
			return nil, err
		}
	}
	return inv, nil
}

// DecodePolicies reads the NetworkPolicies of a YAML or JSON stream (for
// what-if); a policy without a namespace gets defaultNS.
func DecodePolicies(name string, r io.Reader, defaultNS string) ([]*networkingv1.NetworkPolicy, error) {
	inv := NewInventory()
	if err := inv.Decode(name, r); err != nil {
		return nil, err
	}
	if len(inv.policies) == 0 {
		return nil, fmt.Errorf("%s: no NetworkPolicy found", name)
	}
	for _, p := range inv.policies {
		if p.Namespace == "" {
			p.Namespace = defaultNS
		}
	}
	return inv.policies, nil
}

// Lookups.

// NamespaceLabels returns the labels of namespace name; false when the
// inventory has no such namespace.
func (inv *Inventory) NamespaceLabels(name string) (map[string]string, bool) {
	if ns := inv.namespaces[name]; ns != nil {
		return ns.Labels, true
	}
	return nil, false
}

// PortName returns the name of the container port of pod
// q.Namespace/q.Pod (or, when the inventory has no such pod, of the pod
// holding q.Addr) that serves q.Port over q.Proto, "" if none.
func (inv *Inventory) PortName(q PortQuery) string {
	p := inv.podByName[[2]string{q.Namespace, q.Pod}]
	if p == nil && q.Addr.IsValid() {
		p, _ = inv.PodByAddr(q.Addr)
	}
	if p == nil {
		return ""
	}
	return p.PortName(q.Port, q.Proto)
}

// PortName returns the name of p's container port serving port over
// proto, "" if none.
func (p *Pod) PortName(port uint16, proto uint8) string {
	for i := range p.Ports {
		if pt := &p.Ports[i]; pt.Port == int32(port) && pt.Proto == proto {
			return pt.Name
		}
	}
	return ""
}

// Addr returns p's address of IP version v (4 or 6).
func (p *Pod) Addr(v uint8) (netip.Addr, bool) {
	for _, a := range p.Addrs {
		if flow.Version(a) == v {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// DualStack reports whether p has an address of each family.
func (p *Pod) DualStack() bool {
	_, v4 := p.Addr(4)
	_, v6 := p.Addr(6)
	return v4 && v6
}

// NetworkPolicies returns the inventory's policies (read-only).
func (inv *Inventory) NetworkPolicies() []*networkingv1.NetworkPolicy { return inv.policies }

// Pods returns the pods in the order they were added (read-only).
func (inv *Inventory) Pods() []*Pod { return inv.pods }

// Pod returns pod namespace/name.
func (inv *Inventory) Pod(namespace, name string) (*Pod, bool) {
	p, ok := inv.podByName[[2]string{namespace, name}]
	return p, ok
}

// PodByAddr returns the pod holding address a (host-network pods excepted).
func (inv *Inventory) PodByAddr(a netip.Addr) (*Pod, bool) {
	a = a.Unmap()
	for _, p := range inv.pods {
		if !p.HostNetwork && slices.Contains(p.Addrs, a) {
			return p, true
		}
	}
	return nil, false
}

// Services returns the Services (read-only).
func (inv *Inventory) Services() []*Service { return inv.services }

// Namespaces returns the namespaces sorted by name.
func (inv *Inventory) Namespaces() []*Namespace {
	out := make([]*Namespace, 0, len(inv.namespaces))
	for _, ns := range inv.namespaces {
		out = append(out, ns)
	}
	slices.SortFunc(out, func(a, b *Namespace) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

// Workload returns p's top-level controller: the Deployment of its
// ReplicaSet (from the ReplicaSet's owner when the inventory has it, else
// from the pod-template-hash naming convention), its other controller, or
// Kind Pod for a bare pod.
func (inv *Inventory) Workload(p *Pod) Workload {
	switch o := p.Owner; {
	case o.Kind == "":
		return Workload{Kind: "Pod", Name: p.Name}
	case o.Kind == "ReplicaSet":
		if w, ok := inv.rsOwner[[2]string{p.Namespace, o.Name}]; ok {
			return w
		}
		if h := p.Labels[appsv1.DefaultDeploymentUniqueLabelKey]; h != "" && strings.HasSuffix(o.Name, "-"+h) {
			return Workload{Kind: "Deployment", Name: strings.TrimSuffix(o.Name, "-"+h)}
		}
		return o
	default:
		return o
	}
}

// Compile compiles the inventory's policies (see policy.Compile).
func (inv *Inventory) Compile() (*policy.Set, error) { return policy.Compile(inv.policies) }

// Peer returns the policy view of pod p at address a.
func (inv *Inventory) Peer(p *Pod, a netip.Addr) policy.Peer {
	if p == nil || p.HostNetwork {
		return policy.Peer{Addr: a}
	}
	nsl, ok := inv.NamespaceLabels(p.Namespace)
	if !ok {
		nsl = map[string]string{corev1.LabelMetadataName: p.Namespace}
	}
	return policy.Peer{Addr: a, IsPod: true, Namespace: p.Namespace, Labels: p.Labels, NamespaceLabels: nsl}
}

// Flow returns the policy view of a flow between two pods (nil: not a
// pod, only the address counts) over the addresses given, with the
// destination's named port resolved.
func (inv *Inventory) Flow(src *Pod, srcAddr netip.Addr, dst *Pod, dstAddr netip.Addr, proto uint8, port uint16) policy.Flow {
	f := policy.Flow{Src: inv.Peer(src, srcAddr), Dst: inv.Peer(dst, dstAddr), Proto: proto, DstPort: port}
	if f.Dst.IsPod {
		f.Dst.PortName = dst.PortName(port, proto)
	}
	return f
}

func familyOf(a netip.Addr) corev1.IPFamily {
	if a.Unmap().Is4() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}
