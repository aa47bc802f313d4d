package enrich

import (
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/flow"
)

// Lookups. Everything here runs under x.mu.RLock and allocates nothing:
// the record's string and map fields are set to the interned, immutable
// values of the views.

// flowTimes returns the times a record's addresses are resolved at: its
// start and end, either standing in for the other, now when it has none.
func flowTimes(r *flow.Record, now int64) (start, end int64) {
	start, end = unixNano(r.FlowStart), unixNano(r.FlowEnd)
	switch {
	case start == 0 && end == 0:
		return now, now
	case start == 0:
		return end, end
	case end == 0 || end < start:
		return start, start
	}
	return start, end
}

// place is where an address is, as far as the index knows.
type place struct {
	pod  *Pod   // the pod holding it (not host-network)
	node string // the node hosting it (pod's node, node address, pod CIDR)
	// host is true for a node address (or a host-network pod's).
	host bool
	// in is true for an address inside the cluster: a pod, a node, a pod
	// CIDR, a Service address, a configured cluster or service CIDR.
	in bool
}

// place takes a by pointer: see history.has.
func (x *index) place(a *netip.Addr, start, end int64) place {
	if !a.IsValid() {
		return place{}
	}
	if p, ok := x.podIPs.resolve(a, start, end, nil); ok {
		return place{pod: p, node: p.NodeName, in: true}
	}
	if n, ok := x.hostIPs.resolve(a, start, end, nil); ok {
		return place{node: n.node, host: true, in: true}
	}
	if n, ok := x.cidrNode(*a, start, end); ok {
		return place{node: n.node, in: true}
	}
	if x.svcIPs.has(a) || inPrefixes(x.clusterCIDRs, *a) || inPrefixes(x.serviceCIDRs, *a) {
		return place{in: true}
	}
	return place{}
}

func inPrefixes(ps []netip.Prefix, a netip.Addr) bool {
	return slices.ContainsFunc(ps, func(p netip.Prefix) bool { return p.Contains(a) })
}

// cidrNode returns the node whose pod CIDR holds a (longest prefix).
func (x *index) cidrNode(a netip.Addr, start, end int64) (nodeClaim, bool) {
	f := 0
	if a.Is6() {
		f = 1
	}
	for _, bits := range x.lens[f] {
		p, err := a.Prefix(bits)
		if err != nil {
			continue
		}
		if n, ok := x.podCIDRs.resolve(&p, start, end, nil); ok {
			return n, true
		}
	}
	return nodeClaim{}, false
}

// workload resolves p's owner to the top-level controller.
func (x *index) workload(p *Pod) Workload {
	o := p.Owner
	switch o.Kind {
	case "":
		return Workload{Kind: KindPod, Name: p.Name}
	case KindReplicaSet:
		if rs, ok := x.owners[p.ownerKey]; ok {
			if rs.controller.Kind != "" {
				return rs.controller // a Deployment (or another controller of ReplicaSets)
			}
			return o
		}
		if p.deployment != "" {
			// ReplicaSet not (yet) known: its name is <deployment>-<pod-template-hash>.
			return Workload{Kind: KindDeployment, Name: p.deployment}
		}
	case KindJob:
		if j, ok := x.owners[p.ownerKey]; ok && j.controller.Kind != "" {
			return j.controller // a CronJob
		}
	}
	return o
}

func (x *index) zone(node string) string { return x.zones[node] }

// fill sets e from pl (fields pl knows nothing about are left alone).
func (x *index) fill(e *flow.Endpoint, pl place) {
	if p := pl.pod; p != nil {
		w := x.workload(p)
		e.PodNamespace, e.PodName, e.Labels, e.PodAddrs = p.Namespace, p.Name, p.Labels, p.Addrs
		e.WorkloadKind, e.WorkloadName = w.Kind, w.Name
	}
	if pl.node != "" {
		e.NodeName = pl.node
		if z := x.zone(pl.node); z != "" {
			e.Zone = z
		}
	}
}

// serviceAt returns the Service holding address a at the flow's time,
// preferring one with a port port/proto (external and load-balancer IPs
// may be shared by Services with different ports).
func (x *index) serviceAt(a *netip.Addr, port uint16, proto uint8, start, end int64) *Service {
	l, ok := x.svcIPs.m[*a]
	if !ok {
		return nil
	}
	if s, ok := resolve(&l, start, end, func(s *Service) bool { return s.hasPort(port, proto) }); ok {
		return s
	}
	s, _ := resolve(&l, start, end, nil)
	return s
}

func (s *Service) hasPort(port uint16, proto uint8) bool {
	for i := range s.Ports {
		if s.Ports[i].Port == int32(port) && policy.ProtoNumber(&s.Ports[i].Protocol) == proto {
			return true
		}
	}
	return false
}

// nodePortService returns the Service of a NodePort flow: one addressed to
// a node address on a node port.
func (x *index) nodePortService(a *netip.Addr, port uint16, proto uint8) *Service {
	if port == 0 || !x.hostIPs.has(a) {
		return nil
	}
	if l := x.nodePorts[portKey{proto, port}]; len(l) > 0 {
		return l[0]
	}
	return nil
}

// endpointOf returns the endpoint of svc at address a.
func (x *index) endpointOf(a *netip.Addr, svc *Service, start, end int64) *Endpoint {
	ep, _ := x.epIPs.resolve(a, start, end, func(e *Endpoint) bool { return e.svc == svc.id })
	return ep
}

// portName returns the name of the Service port a flow used: by the
// Service port (or node port) it was addressed to, else by the endpoint's
// port in its slice.
func portName(svc *Service, ep *Endpoint, svcPort, dstPort uint16, proto uint8) string {
	if svcPort != 0 {
		for i := range svc.Ports {
			p := &svc.Ports[i]
			if (p.Port == int32(svcPort) || p.NodePort == int32(svcPort)) && policy.ProtoNumber(&p.Protocol) == proto {
				return p.Name
			}
		}
	}
	if ep != nil {
		for i := range ep.Slice.Ports {
			p := &ep.Slice.Ports[i]
			if p.Port == int32(dstPort) && policy.ProtoNumber(&p.Protocol) == proto {
				return p.Name
			}
		}
	}
	return ""
}

// flowType classifies a flow from where its ends are.
func flowType(s, d place) flow.FlowType {
	switch {
	case s.in && d.in:
		if s.node == "" || d.node == "" {
			return flow.FlowTypeUnknown
		}
		if s.node == d.node {
			return flow.FlowTypeIntraNode
		}
		return flow.FlowTypeInterNode
	case s.in:
		return flow.FlowTypeToExternal
	case d.in:
		return flow.FlowTypeFromExternal
	}
	return flow.FlowTypeUnknown
}

// result says what a record's lookups found, for the metrics.
type result struct {
	srcHit, dstHit bool
	skipped        bool // IPv6 record with IPv6 disabled
}

// enrich fills rec's Kubernetes fields. Only what is found is set: a
// field the index knows nothing about keeps its value (a foreign exporter
// may have filled it).
func (x *index) enrich(rec *flow.Record, now int64) result {
	// The addresses are looked up where they are (see history.has): in
	// the record, unmapped when it was decoded.
	var src4, dst4, svc4 netip.Addr
	src, dst := unmapped(&rec.SrcAddr, &src4), unmapped(&rec.DstAddr, &dst4)
	if !x.ipv6 && (src.Is6() || dst.Is6()) {
		return result{skipped: true}
	}
	start, end := flowTimes(rec, now)
	s := x.place(src, start, end)
	d := x.place(dst, start, end)

	var svc *Service
	svcPort := rec.ServicePort
	if sa := unmapped(&rec.ServiceAddr, &svc4); sa.IsValid() {
		svc = x.serviceAt(sa, svcPort, rec.Proto, start, end)
		if svc == nil {
			svc = x.nodePortService(sa, svcPort, rec.Proto)
		}
	} else if d.pod == nil && !d.host {
		// Not translated (no endpoint, or seen before DNAT): the
		// destination itself may be a Service address.
		if svc = x.serviceAt(dst, rec.DstPort, rec.Proto, start, end); svc != nil {
			svcPort = rec.DstPort
		}
	}
	var ep *Endpoint
	if svc != nil {
		ep = x.endpointOf(dst, svc, start, end)
		rec.Service = flow.Service{Namespace: svc.Namespace, Name: svc.Name, PortName: portName(svc, ep, svcPort, rec.DstPort, rec.Proto)}
	}
	if ep != nil && d.pod == nil && ep.Pod.Name != "" {
		// The endpoint names its pod, whose address the index lacks
		// (its Pod event has not arrived): use the pod by name.
		if p := x.pods[nsName{ep.Pod.Namespace, ep.Pod.Name}]; p != nil {
			d.pod = p
			d.node = p.NodeName
			d.in = true
		}
	}
	if ep != nil && d.node == "" && ep.NodeName != "" {
		d.node = ep.NodeName
		d.in = true
	}

	x.fill(&rec.Src, s)
	x.fill(&rec.Dst, d)
	if ep != nil {
		if d.pod == nil && ep.Pod.Name != "" {
			rec.Dst.PodNamespace, rec.Dst.PodName = ep.Pod.Namespace, ep.Pod.Name
		}
		if ep.Zone != "" {
			// An endpoint's zone is its slice's, the same in both families.
			rec.Dst.Zone = ep.Zone
		}
	}
	if t := flowType(s, d); t != flow.FlowTypeUnknown {
		rec.Type = t
	}
	return result{srcHit: s.pod != nil || s.node != "", dstHit: d.pod != nil || d.node != ""}
}

// unmapped returns a when it is not an IPv4-mapped IPv6 address (a
// record's addresses are unmapped when decoded), else a's IPv4 address,
// in *buf.
func unmapped(a, buf *netip.Addr) *netip.Addr {
	if a.Is4In6() {
		*buf = a.Unmap()
		return buf
	}
	return a
}

// nodesFor sets nodes[i] to the node hosting addrs[i] at time t ("" when
// none): the node of the pod holding it (or that held it last, within the
// grace period), the node owning it as a node address (likewise), or the
// node whose pod CIDR contains it.
func (x *index) nodesFor(addrs []netip.Addr, nodes []string, t int64) {
	nodes = nodes[:len(addrs)]
	for i := range addrs {
		nodes[i] = x.nodeFor(&addrs[i], t)
	}
}

// nodeFor takes a by pointer: see history.has.
func (x *index) nodeFor(a *netip.Addr, t int64) string {
	if !a.IsValid() {
		return "" // an invalid address has no node
	}
	var a4 netip.Addr
	a = unmapped(a, &a4)
	if p, ok := x.podIPs.resolve(a, t, t, nil); ok {
		return p.NodeName
	}
	if n, ok := x.hostIPs.resolve(a, t, t, nil); ok {
		return n.node
	}
	if p, ok := x.podIPs.latest(a); ok && p.NodeName != "" {
		return p.NodeName
	}
	if n, ok := x.hostIPs.latest(a); ok {
		return n.node
	}
	if n, ok := x.cidrNode(*a, t, t); ok {
		return n.node
	}
	return ""
}

// endpointSlices returns the live slices of Service ns/name of the
// families the Service has (all of them when the Service is unknown),
// sorted by name.
func (x *index) endpointSlices(ns, name string) []*EndpointSlice {
	svc := x.services[nsName{ns, name}]
	var out []*EndpointSlice
	for _, s := range x.slicesBySvc[nsName{ns, name}] {
		if svc != nil {
			f := corev1.IPv4Protocol
			if s.AddressType == "IPv6" {
				f = corev1.IPv6Protocol
			}
			if s.AddressType != "FQDN" && !svc.HasFamily(f) {
				continue // a stale slice of a family the Service dropped
			}
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b *EndpointSlice) int { return strings.Compare(a.Name, b.Name) })
	return out
}
