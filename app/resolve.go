package app

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/agent"
)

// resolver resolves traceflow requests through the collector's live
// Kubernetes view: the source pod's address of the family and its node,
// and the destination (a pod's address, the Service's ClusterIP of the
// family from spec.clusterIPs, or the given address and the pod holding
// it now).
type resolver struct{ c *collector.Collector }

func familyOf(f traceflow.Family) (version uint8, name string, k8s corev1.IPFamily) {
	if f == traceflow.IPv6 {
		return 6, "IPv6", corev1.IPv6Protocol
	}
	return 4, "IPv4", corev1.IPv4Protocol
}

func (r resolver) enricher() (*enrich.Enricher, error) {
	e := r.c.Enricher()
	if e == nil || !e.Synced() {
		return nil, fmt.Errorf("%w: no Kubernetes view to resolve names in (--k8s.source)", traceflow.ErrNotSupported)
	}
	return e, nil
}

// pod finds the pod ref of the request's field.
func (r resolver) pod(e *enrich.Enricher, ref, field string) (*enrich.Pod, error) {
	ns, name, _ := strings.Cut(ref, "/")
	p, ok := e.Pod(ns, name)
	if !ok || p.Terminated {
		return nil, traceflow.Invalid(field, "pod %s not found", ref)
	}
	return p, nil
}

// WorkloadPod implements traceflow's resolver: the workload's first pod
// (by name; the view has no terminated pods) off the host network (its
// addresses are its node's), in the live view.
func (r resolver) WorkloadPod(ref string) (string, bool, error) {
	s, err := r.c.Cluster()
	if err != nil {
		return "", false, fmt.Errorf("%w: %w", traceflow.ErrNotSupported, err)
	}
	ns, name, _ := strings.Cut(ref, "/")
	for i, p := range s.Pods {
		if p.Namespace == ns && !p.HostNetwork && s.Workloads[i].Name == name {
			return p.Namespace + "/" + p.Name, true, nil
		}
	}
	return "", false, nil
}

// Resolve implements traceflow's resolver.
func (r resolver) Resolve(req traceflow.Request, f traceflow.Family) (traceflow.Probe, error) {
	e, err := r.enricher()
	if err != nil {
		return traceflow.Probe{}, err
	}
	v, fam, kf := familyOf(f)
	src, err := r.pod(e, req.Source, "source")
	if err != nil {
		return traceflow.Probe{}, err
	}
	p := traceflow.Probe{SourcePod: req.Source, SourceNode: src.NodeName, DstPort: req.Destination.Port}
	var ok bool
	if p.Src, ok = enrich.AddrOfFamily(src.Addrs, v); !ok {
		return p, fmt.Errorf("%w: pod %s has no %s address", traceflow.ErrNoAddress, req.Source, fam)
	}
	d := req.Destination
	switch {
	case d.Pod != "":
		dst, err := r.pod(e, d.Pod, "destination.pod")
		if err != nil {
			return p, err
		}
		if p.Dst, ok = enrich.AddrOfFamily(dst.Addrs, v); !ok {
			return p, fmt.Errorf("%w: pod %s has no %s address", traceflow.ErrNoAddress, d.Pod, fam)
		}
		p.DstPod = d.Pod
	case d.Service != "":
		ns, name, _ := strings.Cut(d.Service, "/")
		svc, found := e.Service(ns, name)
		if !found {
			return p, traceflow.Invalid("destination.service", "service %s not found", d.Service)
		}
		if p.Dst, ok = enrich.AddrOfFamily(svc.ClusterIPs, v); !ok || !svc.HasFamily(kf) {
			return p, fmt.Errorf("%w: service %s has no %s ClusterIP", traceflow.ErrNoAddress, d.Service, fam)
		}
		hasPort := slices.ContainsFunc(svc.Ports, func(sp enrich.ServicePort) bool {
			return string(sp.Protocol) == string(req.Protocol) && sp.Port == int32(d.Port)
		})
		if (req.Protocol == traceflow.TCP || req.Protocol == traceflow.UDP) && !hasPort {
			return p, traceflow.Invalid("destination.port", "service %s has no port %d/%s", d.Service, d.Port, req.Protocol)
		}
		p.Service = d.Service
	default:
		a := d.IP.Unmap()
		if !a.IsValid() || (a.Is4() != (v == 4)) {
			return p, fmt.Errorf("%w: destination %s is not an %s address", traceflow.ErrNoAddress, d.IP, fam)
		}
		p.Dst = a
		if dp, ok := e.LookupPod(a, time.Time{}); ok && !dp.HostNetwork {
			p.DstPod = dp.Namespace + "/" + dp.Name
		}
	}
	r.targets(e, &p, v)
	return p, nil
}

// InCluster reports whether a is the cluster's in the live view: a pod's
// (host-network ones are their node's), a Service's (cluster, external or
// load-balancer IP), a node's, or in a node's pod CIDR. The traceflow
// controller refuses other IP destinations unless asked and allowed.
func (r resolver) InCluster(a netip.Addr) bool {
	e := r.c.Enricher()
	if e == nil {
		return false
	}
	if _, ok := e.LookupPod(a, time.Time{}); ok {
		return true
	}
	if _, ok := e.LookupService(a, time.Time{}); ok {
		return true
	}
	var node [1]string
	e.NodesForIPs([]netip.Addr{a}, node[:])
	return node[0] != ""
}

// targets fills where the probe may be delivered (the destination pod,
// or the Service's ready endpoints of the family, from its EndpointSlice
// of that family) and the nodes to watch: the source node and the
// targets'. A destination the view cannot place is watched on every node.
func (r resolver) targets(e *enrich.Enricher, p *traceflow.Probe, v uint8) {
	p.Nodes = []string{p.SourceNode}
	unplaced := false
	add := func(a netip.Addr, pod, node string) {
		p.Targets = append(p.Targets, traceflow.Target{Addr: a, Pod: pod})
		unplaced = unplaced || node == ""
		if node != "" && !slices.Contains(p.Nodes, node) {
			p.Nodes = append(p.Nodes, node)
		}
	}
	switch {
	case p.DstPod != "":
		ns, name, _ := strings.Cut(p.DstPod, "/")
		if dp, ok := e.Pod(ns, name); ok {
			add(p.Dst, p.DstPod, dp.NodeName)
		}
	case p.Service != "":
		ns, name, _ := strings.Cut(p.Service, "/")
		at := discoveryv1.AddressTypeIPv4
		if v == 6 {
			at = discoveryv1.AddressTypeIPv6
		}
		for _, es := range e.EndpointSlices(ns, name) {
			if es.AddressType != at {
				continue
			}
			for _, ep := range es.Endpoints {
				if !ep.Ready {
					continue
				}
				for _, a := range ep.Addrs {
					pod := ""
					if ep.Pod.Name != "" {
						pod = ep.Pod.Namespace + "/" + ep.Pod.Name
					}
					add(a, pod, ep.NodeName)
				}
			}
		}
	}
	switch {
	case len(p.Targets) == 0:
		p.Targets = []traceflow.Target{{Addr: p.Dst}}
		p.Nodes = nil // unplaced: every node watches
	case unplaced:
		p.Nodes = nil // a target of no known node: every node watches
	}
}

// Denial implements traceflow/agent.PolicyNamer: the packet goes through
// the collector's auditor as a stored flow does (its ends as the live view
// knows them now), so a trace explains a drop as the Flows page and the
// reachability pairs explain the same connection.
func (r resolver) Denial(src netip.Addr, dst netip.AddrPort, proto uint8) (agent.Denial, bool) {
	e, a := r.c.Enricher(), r.c.Auditor()
	if e == nil || a == nil {
		return agent.Denial{}, false
	}
	now := time.Now()
	rec := flow.Record{FlowStart: now, SrcAddr: src.Unmap(), DstAddr: dst.Addr().Unmap(), DstPort: dst.Port(), Proto: proto,
		IPVersion: flow.Version(src)}
	var nodes [2]string
	e.NodesForIPs([]netip.Addr{rec.SrcAddr, rec.DstAddr}, nodes[:])
	for i, end := range []struct {
		addr netip.Addr
		ep   *flow.Endpoint
	}{{rec.SrcAddr, &rec.Src}, {rec.DstAddr, &rec.Dst}} {
		if p, found := e.LookupPod(end.addr, now); found {
			*end.ep = flow.Endpoint{PodNamespace: p.Namespace, PodName: p.Name, NodeName: p.NodeName, Labels: p.Labels}
		} else {
			end.ep.NodeName = nodes[i]
		}
	}
	d, ok := a.Explain(&rec)
	return agent.Denial{Policy: d.Policy, Reason: d.Text}, ok
}

// nodeView gives the agent directory the nodes of the live view.
type nodeView struct{ c *collector.Collector }

func (v nodeView) NodeAddrs(node string) ([]netip.Addr, bool) {
	e := v.c.Enricher()
	if e == nil {
		return nil, false
	}
	n, ok := e.Node(node)
	if !ok {
		return nil, false
	}
	return n.InternalIPs, true
}

func (v nodeView) NodeNames() []string {
	if e := v.c.Enricher(); e != nil {
		return e.NodeNames()
	}
	return nil
}
