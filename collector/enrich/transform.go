package enrich

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"unique"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Informer transforms. Each informer's SetTransform turns the decoded API
// object into the trimmed view of types.go before it enters the informer's
// queue and store, so the store holds only what enrichment and policy
// evaluation read (see README.md for the memory this costs per pod). The
// views are wrapped in unexported types that satisfy runtime.Object and
// metav1.ObjectMetaAccessor, which is all the informer machinery needs
// (keys, namespace index, resourceVersion comparison): the typed listers
// of these informers must not be used.

// Well-known labels read by the transforms.
const (
	labelZone           = "topology.kubernetes.io/zone"
	labelZoneDeprecated = "failure-domain.beta.kubernetes.io/zone"
	labelTemplateHash   = appsv1.DefaultDeploymentUniqueLabelKey // pod-template-hash
)

// invalidFunc counts a value the transforms had to drop (kind, reason).
type invalidFunc func(kind, reason string)

type transformer struct {
	in      *interner
	ipv6    bool // keep IPv6 addresses (--k8s.enable-ipv6)
	invalid invalidFunc
}

func (tr *transformer) bad(kind, reason string) {
	if tr.invalid != nil {
		tr.invalid(kind, reason)
	}
}

// addr parses an address of any family, unmapped; ok is false for an
// invalid one and for IPv6 when IPv6 is disabled (dropped entirely).
func (tr *transformer) addr(kind, s string) (netip.Addr, bool) {
	a, ok := tr.anyAddr(kind, s)
	if ok && a.Is6() && !tr.ipv6 {
		return netip.Addr{}, false
	}
	return a, ok
}

// anyAddr parses an address of any family, unmapped, whatever
// --k8s.enable-ipv6 says; ok is false for an invalid one.
func (tr *transformer) anyAddr(kind, s string) (netip.Addr, bool) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		tr.bad(kind, "invalid_ip")
		return netip.Addr{}, false
	}
	return a.Unmap().WithZone(""), true
}

// place files a, an address that tells which node something is on, into
// visible, or into hidden when it is IPv6 and IPv6 is disabled: hidden
// addresses only answer NodesForIPs, so that the correlator still pairs
// the two node halves of an IPv6 connection (a switch that turns off
// IPv6 enrichment must not double IPv6 rows).
func (tr *transformer) place(a netip.Addr, visible, hidden *[]netip.Addr) {
	list := visible
	if a.Is6() && !tr.ipv6 {
		list = hidden
	}
	if !slices.Contains(*list, a) {
		*list = append(*list, a)
	}
}

// addrs parses a list, skipping invalid, disabled and repeated addresses.
func (tr *transformer) addrs(kind string, ss []string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if a, ok := tr.addr(kind, s); ok && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

// known returns the package-level constant equal to v, when one of known
// is, so that no object keeps its own copy of a well-known string.
func known[T ~string](v T, known ...T) T {
	if i := slices.Index(known, v); i >= 0 {
		return known[i]
	}
	return v
}

// protocol returns the constant for p (TCP when empty).
func protocol(p corev1.Protocol) corev1.Protocol {
	return known(cmp.Or(p, corev1.ProtocolTCP), corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP)
}

// controllerKinds are the well-known kinds of owners.
var controllerKinds = []string{KindReplicaSet, KindDeployment, KindStatefulSet, KindDaemonSet, KindJob, KindCronJob, "ReplicationController", "Node"}

// uidOf returns uid, or for an object without one (a hand-written
// inventory manifest) a stand-in made of its kind and name: claims are
// told apart by their claimant's UID.
func uidOf(kind string, uid types.UID, ns, name string) types.UID {
	if uid != "" {
		return uid
	}
	return types.UID("nouid:" + kind + "/" + ns + "/" + name)
}

// controllerOf returns the controller owner reference of m.
func controllerOf(refs []metav1.OwnerReference) (Workload, bool) {
	for _, r := range refs {
		if r.Controller != nil && *r.Controller {
			return Workload{Kind: known(r.Kind, controllerKinds...), Name: r.Name}, true
		}
	}
	return Workload{}, false
}

func (tr *transformer) pod(p *corev1.Pod) *Pod {
	in := tr.in
	out := &Pod{
		Namespace:   in.name(p.Namespace),
		Name:        p.Name,
		UID:         uidOf("pod", p.UID, p.Namespace, p.Name),
		NodeName:    in.name(p.Spec.NodeName),
		HostNetwork: p.Spec.HostNetwork,
		Terminated:  p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed,
		Created:     p.CreationTimestamp.Time,
		rv:          p.ResourceVersion,
	}
	if out.labelsRef = in.labelSet(p.Labels); out.labelsRef != nil {
		out.Labels = *out.labelsRef
	}
	ips := make([]string, 0, max(len(p.Status.PodIPs), 1))
	for _, ip := range p.Status.PodIPs {
		ips = append(ips, ip.IP)
	}
	if len(ips) == 0 && p.Status.PodIP != "" {
		ips = append(ips, p.Status.PodIP)
	}
	for _, ip := range ips {
		if a, ok := tr.anyAddr("pod", ip); ok {
			tr.place(a, &out.Addrs, &out.hidden6)
		}
	}
	var ports []ContainerPort
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			ports = append(ports, ContainerPort{Name: cp.Name, Port: cp.ContainerPort, Protocol: protocol(cp.Protocol)})
		}
	}
	if out.portsRef = in.portList(ports); out.portsRef != nil {
		out.Ports = *out.portsRef
	}
	if w, ok := controllerOf(p.OwnerReferences); ok {
		out.Owner = w
		if w.Kind == KindReplicaSet || w.Kind == KindJob {
			out.ownerKey = unique.Make(ownerKey{w.Kind, out.Namespace, w.Name})
		}
		if h := p.Labels[labelTemplateHash]; w.Kind == KindReplicaSet && h != "" && strings.HasSuffix(w.Name, "-"+h) {
			out.deployment = w.Name[:len(w.Name)-len(h)-1]
		}
	}
	if out.Terminated {
		for _, cs := range p.Status.ContainerStatuses {
			if t := cs.State.Terminated; t != nil && t.FinishedAt.UnixNano() > out.finished {
				out.finished = t.FinishedAt.UnixNano()
			}
		}
	}
	return out
}

func (tr *transformer) service(s *corev1.Service) *Service {
	in := tr.in
	out := &Service{
		Namespace: in.name(s.Namespace),
		Name:      s.Name,
		UID:       uidOf("service", s.UID, s.Namespace, s.Name),
		Type:      known(cmp.Or(s.Spec.Type, corev1.ServiceTypeClusterIP), corev1.ServiceTypeClusterIP, corev1.ServiceTypeNodePort, corev1.ServiceTypeLoadBalancer, corev1.ServiceTypeExternalName),
		Created:   s.CreationTimestamp.Time,
		rv:        s.ResourceVersion,
	}
	out.id = unique.Make(nsName{out.Namespace, out.Name})
	if out.selectorRef = in.labelSet(s.Spec.Selector); out.selectorRef != nil {
		out.Selector = *out.selectorRef
	}
	ips := s.Spec.ClusterIPs
	if len(ips) == 0 && s.Spec.ClusterIP != "" {
		ips = []string{s.Spec.ClusterIP}
	}
	switch {
	case len(ips) > 0 && ips[0] == corev1.ClusterIPNone:
		out.Headless = true
	case out.Type != corev1.ServiceTypeExternalName:
		out.ClusterIPs = tr.addrs("service", ips)
	}
	for _, f := range s.Spec.IPFamilies {
		out.IPFamilies = append(out.IPFamilies, known(f, corev1.IPv4Protocol, corev1.IPv6Protocol))
	}
	if p := s.Spec.IPFamilyPolicy; p != nil {
		out.IPFamilyPolicy = known(*p, corev1.IPFamilyPolicySingleStack, corev1.IPFamilyPolicyPreferDualStack, corev1.IPFamilyPolicyRequireDualStack)
	}
	out.ExternalIPs = tr.addrs("service", s.Spec.ExternalIPs)
	for _, ing := range s.Status.LoadBalancer.Ingress {
		if ing.IP == "" {
			continue // hostname-only ingress
		}
		if a, ok := tr.addr("service", ing.IP); ok && !slices.Contains(out.LoadBalancerIPs, a) {
			out.LoadBalancerIPs = append(out.LoadBalancerIPs, a)
		}
	}
	for _, p := range s.Spec.Ports {
		out.Ports = append(out.Ports, ServicePort{Name: p.Name, Protocol: protocol(p.Protocol), Port: p.Port, TargetPort: p.TargetPort, NodePort: p.NodePort})
	}
	return out
}

func (tr *transformer) endpointSlice(s *discoveryv1.EndpointSlice) *EndpointSlice {
	in := tr.in
	out := &EndpointSlice{
		Namespace:   in.name(s.Namespace),
		Name:        s.Name,
		UID:         uidOf("endpointslice", s.UID, s.Namespace, s.Name),
		Service:     s.Labels[discoveryv1.LabelServiceName],
		AddressType: known(s.AddressType, discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6, discoveryv1.AddressTypeFQDN),
		Created:     s.CreationTimestamp.Time,
		rv:          s.ResourceVersion,
	}
	for _, p := range s.Ports {
		out.Ports = append(out.Ports, EndpointPort{Name: ptr.Deref(p.Name, ""), Port: ptr.Deref(p.Port, 0), Protocol: protocol(ptr.Deref(p.Protocol, ""))})
	}
	if out.AddressType != discoveryv1.AddressTypeIPv4 && out.AddressType != discoveryv1.AddressTypeIPv6 {
		return out // FQDN slices have no addresses to index
	}
	want6 := out.AddressType == discoveryv1.AddressTypeIPv6
	svc := unique.Make(nsName{out.Namespace, out.Service})
	out.Endpoints = make([]Endpoint, 0, len(s.Endpoints))
	for _, e := range s.Endpoints {
		ep := Endpoint{Slice: out, svc: svc}
		for _, a := range e.Addresses {
			addr, ok := tr.addr("endpointslice", a)
			if !ok {
				continue
			}
			if addr.Is6() != want6 {
				// The API server validates this; a hand-written
				// inventory might not.
				tr.bad("endpointslice", "family_mismatch")
				continue
			}
			if !slices.Contains(ep.Addrs, addr) {
				ep.Addrs = append(ep.Addrs, addr)
			}
		}
		if len(ep.Addrs) == 0 {
			continue
		}
		ep.NodeName, ep.Zone = in.name(ptr.Deref(e.NodeName, "")), in.name(ptr.Deref(e.Zone, ""))
		ep.Ready = ptr.Deref(e.Conditions.Ready, true)
		ep.Serving = ptr.Deref(e.Conditions.Serving, ep.Ready)
		ep.Terminating = ptr.Deref(e.Conditions.Terminating, false)
		if r := e.TargetRef; r != nil && r.Kind == KindPod {
			ep.Pod = PodRef{Namespace: in.name(cmp.Or(r.Namespace, s.Namespace)), Name: r.Name}
		}
		out.Endpoints = append(out.Endpoints, ep)
	}
	return out
}

func (tr *transformer) node(n *corev1.Node) *Node {
	in := tr.in
	out := &Node{
		Name:    in.name(n.Name),
		UID:     uidOf("node", n.UID, "", n.Name),
		Created: n.CreationTimestamp.Time,
		rv:      n.ResourceVersion,
	}
	out.Zone = in.name(cmp.Or(n.Labels[labelZone], n.Labels[labelZoneDeprecated]))
	for _, a := range n.Status.Addresses {
		var list *[]netip.Addr
		switch a.Type {
		case corev1.NodeInternalIP:
			list = &out.InternalIPs
		case corev1.NodeExternalIP:
			list = &out.ExternalIPs
		default:
			continue
		}
		if addr, ok := tr.anyAddr("node", a.Address); ok {
			tr.place(addr, list, &out.hidden6)
		}
	}
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			tr.bad("node", "invalid_cidr")
			continue
		}
		p = p.Masked()
		list := &out.PodCIDRs
		if p.Addr().Is6() && !tr.ipv6 {
			list = &out.hidden6CIDRs // for NodesForIPs only, as addresses
		}
		if !slices.Contains(*list, p) {
			*list = append(*list, p)
		}
	}
	return out
}

func (tr *transformer) namespace(n *corev1.Namespace) *Namespace {
	out := &Namespace{Name: tr.in.name(n.Name), UID: uidOf("namespace", n.UID, "", n.Name), Created: n.CreationTimestamp.Time, rv: n.ResourceVersion}
	if out.labelsRef = tr.in.labelSet(n.Labels); out.labelsRef != nil {
		out.Labels = *out.labelsRef
	}
	return out
}

func (tr *transformer) owner(k string, m *metav1.ObjectMeta) *owner {
	o := &owner{kind: k, namespace: tr.in.name(m.Namespace), name: m.Name, uid: uidOf(k, m.UID, m.Namespace, m.Name), rv: m.ResourceVersion}
	o.key = unique.Make(ownerKey{k, o.namespace, o.name})
	if w, ok := controllerOf(m.OwnerReferences); ok {
		o.controller = w
	}
	return o
}

// networkPolicy keeps what policy evaluation reads: identity and spec.
func (tr *transformer) networkPolicy(p *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: tr.in.name(p.Namespace), Name: p.Name, UID: p.UID,
			ResourceVersion: p.ResourceVersion, Generation: p.Generation, CreationTimestamp: p.CreationTimestamp,
		},
		Spec: p.Spec,
	}
}

// transform is the informers' TransformFunc. It is idempotent: a view
// passes through unchanged, as do cache.DeletedFinalStateUnknown
// tombstones (which hold views already).
func (tr *transformer) transform(obj any) (any, error) {
	switch o := obj.(type) {
	case *corev1.Pod:
		return (*podObj)(tr.pod(o)), nil
	case *corev1.Service:
		return (*serviceObj)(tr.service(o)), nil
	case *discoveryv1.EndpointSlice:
		return (*sliceObj)(tr.endpointSlice(o)), nil
	case *corev1.Node:
		return (*nodeObj)(tr.node(o)), nil
	case *corev1.Namespace:
		return (*namespaceObj)(tr.namespace(o)), nil
	case *appsv1.ReplicaSet:
		return (*ownerObj)(tr.owner(KindReplicaSet, &o.ObjectMeta)), nil
	case *batchv1.Job:
		return (*ownerObj)(tr.owner(KindJob, &o.ObjectMeta)), nil
	case *networkingv1.NetworkPolicy:
		return tr.networkPolicy(o), nil
	}
	return obj, nil
}

// The stored types. Each satisfies runtime.Object and
// metav1.ObjectMetaAccessor; GetObjectMeta builds a small ObjectMeta on
// each call (informers call it per event, never on the lookup path).
type (
	podObj       Pod
	serviceObj   Service
	sliceObj     EndpointSlice
	nodeObj      Node
	namespaceObj Namespace
	ownerObj     owner
)

func meta(ns, name string, uid types.UID, rv string) metav1.Object {
	return &metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid, ResourceVersion: rv}
}

func (o *podObj) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (o *podObj) DeepCopyObject() runtime.Object   { c := *o; return &c }
func (o *podObj) GetObjectMeta() metav1.Object     { return meta(o.Namespace, o.Name, o.UID, o.rv) }

func (o *serviceObj) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (o *serviceObj) DeepCopyObject() runtime.Object   { c := *o; return &c }
func (o *serviceObj) GetObjectMeta() metav1.Object     { return meta(o.Namespace, o.Name, o.UID, o.rv) }

func (o *sliceObj) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (o *sliceObj) DeepCopyObject() runtime.Object   { c := *o; return &c }
func (o *sliceObj) GetObjectMeta() metav1.Object     { return meta(o.Namespace, o.Name, o.UID, o.rv) }

func (o *nodeObj) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (o *nodeObj) DeepCopyObject() runtime.Object   { c := *o; return &c }
func (o *nodeObj) GetObjectMeta() metav1.Object     { return meta("", o.Name, o.UID, o.rv) }

func (o *namespaceObj) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (o *namespaceObj) DeepCopyObject() runtime.Object   { c := *o; return &c }
func (o *namespaceObj) GetObjectMeta() metav1.Object     { return meta("", o.Name, o.UID, o.rv) }

func (o *ownerObj) GetObjectKind() schema.ObjectKind { return schema.EmptyObjectKind }
func (o *ownerObj) DeepCopyObject() runtime.Object   { c := *o; return &c }
func (o *ownerObj) GetObjectMeta() metav1.Object     { return meta(o.namespace, o.name, o.uid, o.rv) }

var _, _, _, _, _, _ interface {
	runtime.Object
	metav1.ObjectMetaAccessor
} = (*podObj)(nil), (*serviceObj)(nil), (*sliceObj)(nil), (*nodeObj)(nil), (*namespaceObj)(nil), (*ownerObj)(nil)
