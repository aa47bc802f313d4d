// Package manifest describes a dualflow lab as Kubernetes objects: Nodes,
// Namespaces, Deployments, ReplicaSets, Pods, Services, EndpointSlices and
// NetworkPolicies, all k8s.io/api types. The lab writes one multi-document
// YAML file that the collector's inventory mode (and kubectl) can read.
//
// Generate builds the default lab for a Mode; Encode and Decode convert to
// and from YAML, Load reads a file. The package does no other I/O than
// that and the io.Reader/io.Writer it is given, and is safe for concurrent
// readers of a Manifest.
package manifest

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// Mode is the IP family setup of a lab.
type Mode string

// The three lab modes.
const (
	ModeIPv4 Mode = "ipv4"
	ModeIPv6 Mode = "ipv6"
	ModeDual Mode = "dual"
)

// Modes lists every mode, in the order tests run them.
var Modes = []Mode{ModeIPv4, ModeIPv6, ModeDual}

// ParseMode accepts ipv4, ipv6 and dual (and the aliases 4, 6, dualstack).
func ParseMode(s string) (Mode, error) {
	switch s {
	case "ipv4", "4", "v4":
		return ModeIPv4, nil
	case "ipv6", "6", "v6":
		return ModeIPv6, nil
	case "dual", "dualstack", "dual-stack":
		return ModeDual, nil
	}
	return "", fmt.Errorf("unknown lab mode %q (want ipv4, ipv6 or dual)", s)
}

// Families returns the IP families of the mode, IPv4 first in dual mode
// (the Kubernetes default for dual-stack clusters).
func (m Mode) Families() []corev1.IPFamily {
	switch m {
	case ModeIPv4:
		return []corev1.IPFamily{corev1.IPv4Protocol}
	case ModeIPv6:
		return []corev1.IPFamily{corev1.IPv6Protocol}
	case ModeDual:
		return []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol}
	}
	return nil
}

// Has reports whether the mode includes family f.
func (m Mode) Has(f corev1.IPFamily) bool { return slices.Contains(m.Families(), f) }

// Annotations the lab puts on objects so that the manifest alone says where
// each object lives on the machine.
const (
	// AnnotationNetNS names the network namespace of a Node or Pod.
	AnnotationNetNS = "lab.dualflow.io/netns"
	// AnnotationHostIface names the pod's veth on the node side.
	AnnotationHostIface = "lab.dualflow.io/host-iface"
	// AnnotationMode is the lab mode, on every Node.
	AnnotationMode = "lab.dualflow.io/mode"
)

// Well-known Kubernetes labels used by the lab.
const (
	LabelZone        = "topology.kubernetes.io/zone"
	LabelRegion      = "topology.kubernetes.io/region"
	LabelHostname    = "kubernetes.io/hostname"
	LabelNSName      = "kubernetes.io/metadata.name"
	LabelServiceName = discoveryv1.LabelServiceName
	LabelManagedBy   = discoveryv1.LabelManagedBy
)

// Manifest is the whole lab as Kubernetes objects.
type Manifest struct {
	Nodes           []corev1.Node
	Namespaces      []corev1.Namespace
	Deployments     []appsv1.Deployment
	ReplicaSets     []appsv1.ReplicaSet
	Pods            []corev1.Pod
	Services        []corev1.Service
	EndpointSlices  []discoveryv1.EndpointSlice
	NetworkPolicies []networkingv1.NetworkPolicy
}

// Mode returns the lab mode recorded on the nodes, or the mode implied by the
// pod addresses when the annotation is missing.
func (m *Manifest) Mode() Mode {
	for _, n := range m.Nodes {
		if md, err := ParseMode(n.Annotations[AnnotationMode]); err == nil {
			return md
		}
	}
	var v4, v6 bool
	for _, p := range m.Pods {
		for _, a := range PodAddrs(&p) {
			v4 = v4 || a.Is4()
			v6 = v6 || a.Is6()
		}
	}
	switch {
	case v4 && v6:
		return ModeDual
	case v6:
		return ModeIPv6
	}
	return ModeIPv4
}

// Node returns the node called name.
func (m *Manifest) Node(name string) (*corev1.Node, bool) {
	for i := range m.Nodes {
		if m.Nodes[i].Name == name {
			return &m.Nodes[i], true
		}
	}
	return nil, false
}

// Service returns the service namespace/name.
func (m *Manifest) Service(namespace, name string) (*corev1.Service, bool) {
	for i := range m.Services {
		if m.Services[i].Namespace == namespace && m.Services[i].Name == name {
			return &m.Services[i], true
		}
	}
	return nil, false
}

// PodsOnNode returns the pods scheduled on node, in manifest order.
func (m *Manifest) PodsOnNode(node string) []*corev1.Pod {
	var out []*corev1.Pod
	for i := range m.Pods {
		if m.Pods[i].Spec.NodeName == node {
			out = append(out, &m.Pods[i])
		}
	}
	return out
}

// PodAddrs returns the parsed status.podIPs of p (unmapped, invalid ones skipped).
func PodAddrs(p *corev1.Pod) []netip.Addr {
	var out []netip.Addr
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}

// PodAddr returns the address of family f of p, if it has one.
func PodAddr(p *corev1.Pod, f corev1.IPFamily) (netip.Addr, bool) {
	for _, a := range PodAddrs(p) {
		if FamilyOf(a) == f {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// ServiceAddr returns the cluster IP of family f of s, if it has one.
func ServiceAddr(s *corev1.Service, f corev1.IPFamily) (netip.Addr, bool) {
	for _, ip := range s.Spec.ClusterIPs {
		if a, err := netip.ParseAddr(ip); err == nil && FamilyOf(a) == f {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

// NodeAddr returns the InternalIP of family f of n, if it has one.
func NodeAddr(n *corev1.Node, f corev1.IPFamily) (netip.Addr, bool) {
	for _, na := range n.Status.Addresses {
		if na.Type != corev1.NodeInternalIP {
			continue
		}
		if a, err := netip.ParseAddr(na.Address); err == nil && FamilyOf(a) == f {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

// NodePodCIDR returns the pod CIDR of family f of n, if it has one.
func NodePodCIDR(n *corev1.Node, f corev1.IPFamily) (netip.Prefix, bool) {
	for _, c := range n.Spec.PodCIDRs {
		if p, err := netip.ParsePrefix(c); err == nil && FamilyOf(p.Addr()) == f {
			return p.Masked(), true
		}
	}
	return netip.Prefix{}, false
}

// FamilyOf returns the Kubernetes IP family of a.
func FamilyOf(a netip.Addr) corev1.IPFamily {
	if a.Is4() || a.Is4In6() {
		return corev1.IPv4Protocol
	}
	return corev1.IPv6Protocol
}

// ContainerPort returns the port number and protocol that the pod declares
// under name, for the protocol proto (TCP when empty).
func ContainerPort(p *corev1.Pod, name string, proto corev1.Protocol) (int32, bool) {
	proto = cmp.Or(proto, corev1.ProtocolTCP)
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == name && cmp.Or(cp.Protocol, corev1.ProtocolTCP) == proto {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

// Ports returns every container port of p with its protocol (TCP when unset).
func Ports(p *corev1.Pod) []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			cp.Protocol = cmp.Or(cp.Protocol, corev1.ProtocolTCP)
			out = append(out, cp)
		}
	}
	return out
}

// Annotate fills in the lab annotations (namespace names, host veth names)
// that a hand-written manifest may lack, for the given netns prefix.
func (m *Manifest) Annotate(prefix string) {
	for i := range m.Nodes {
		n := &m.Nodes[i]
		if n.Annotations == nil {
			n.Annotations = map[string]string{}
		}
		if n.Annotations[AnnotationNetNS] == "" {
			n.Annotations[AnnotationNetNS] = NodeNetNS(prefix, n.Name)
		}
	}
	for i := range m.Pods {
		p := &m.Pods[i]
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		if p.Annotations[AnnotationNetNS] == "" {
			p.Annotations[AnnotationNetNS] = PodNetNS(prefix, p.Namespace, p.Name)
		}
		if p.Annotations[AnnotationHostIface] == "" {
			p.Annotations[AnnotationHostIface] = HostIface(p.Namespace, p.Name)
		}
	}
}
