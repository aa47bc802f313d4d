package audit

import (
	"cmp"
	"fmt"
	"io"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/enrich/inventory"
)

// The cluster view the audit reads is the enrichment's (enrich.Snapshot
// for the static analyses and reports: the collector's live view, or
// manifests through enrich.LoadSnapshot; a Lookup for the Auditor).

var (
	_ Lookup = (*enrich.Enricher)(nil)
	_ Lookup = (*enrich.Snapshot)(nil)
)

// namespaceLabels returns the labels of namespace name; false when the
// view has no such namespace.
func namespaceLabels(l Lookup, name string) (map[string]string, bool) {
	if ns, ok := l.Namespace(name); ok {
		return ns.Labels, true
	}
	return nil, false
}

// portName returns the name of the container port of pod
// q.Namespace/q.Pod (or, when the view has no such pod, of the pod that
// held q.Addr at q.At: a late record) that serves q.Port over q.Proto, ""
// if none.
func portName(l Lookup, q PortQuery) string {
	p, ok := l.Pod(q.Namespace, q.Pod)
	if !ok && q.Addr.IsValid() {
		p, ok = l.LookupPod(q.Addr, q.At)
	}
	if !ok {
		return ""
	}
	return p.PortName(q.Port, q.Proto)
}

// dualStack reports whether p has an address of each family.
func dualStack(p *enrich.Pod) bool {
	_, v4 := enrich.AddrOfFamily(p.Addrs, 4)
	_, v6 := enrich.AddrOfFamily(p.Addrs, 6)
	return v4 && v6
}

// peerOf returns the policy view of pod p (nil or host-network: an
// address only) at address a.
func peerOf(s *enrich.Snapshot, p *enrich.Pod, a netip.Addr) policy.Peer {
	if p == nil || p.HostNetwork {
		return policy.Peer{Addr: a}
	}
	nsl, ok := namespaceLabels(s, p.Namespace)
	if !ok {
		nsl = map[string]string{corev1.LabelMetadataName: p.Namespace}
	}
	return policy.Peer{Addr: a, IsPod: true, Namespace: p.Namespace, Labels: p.Labels, NamespaceLabels: nsl}
}

// podFlow returns the policy view of a flow between two pods (nil: not a
// pod, only the address counts) over the addresses given, with the
// destination's named port resolved.
func podFlow(s *enrich.Snapshot, src *enrich.Pod, srcAddr netip.Addr, dst *enrich.Pod, dstAddr netip.Addr, proto uint8, port uint16) policy.Flow {
	f := policy.Flow{Src: peerOf(s, src, srcAddr), Dst: peerOf(s, dst, dstAddr), Proto: proto, DstPort: port}
	if f.Dst.IsPod {
		f.Dst.PortName = dst.PortName(port, proto)
	}
	return f
}

// DecodePolicies reads the NetworkPolicies of a YAML or JSON stream (for
// what-if), as every manifest is read (package enrich/inventory); a
// policy without a namespace gets defaultNS.
func DecodePolicies(name string, r io.Reader, defaultNS string) ([]*networkingv1.NetworkPolicy, error) {
	res, err := inventory.Decode(name, r)
	if err != nil {
		return nil, err
	}
	var out []*networkingv1.NetworkPolicy
	for _, o := range res.Objects {
		if p, ok := o.Object.(*networkingv1.NetworkPolicy); ok {
			p.Namespace = cmp.Or(p.Namespace, defaultNS)
			out = append(out, p)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no NetworkPolicy found", name)
	}
	return out, nil
}
