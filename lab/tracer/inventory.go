// Package tracer is traceflow's in-process node tracer for the lab: it
// resolves requests against the lab manifest (Inventory), injects the probe
// from inside the source pod's network namespace, watches it on every node
// with nftables tracing and conntrack, and captures it in the destination
// pod (Tracer). It is what the exporter agents will run per node; here one
// process reaches every node namespace of the lab.
package tracer

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/traceflow"
)

// Inventory resolves traceflow requests against a lab manifest. It is
// read-only and safe for concurrent use.
type Inventory struct {
	M *manifest.Manifest
}

func k8sFamily(f traceflow.Family) corev1.IPFamily {
	if f == traceflow.IPv6 {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

func familyName(f traceflow.Family) string {
	if f == traceflow.IPv6 {
		return "IPv6"
	}
	return "IPv4"
}

func (inv Inventory) pod(ref string) (*corev1.Pod, error) {
	ns, name, _ := strings.Cut(ref, "/")
	p, ok := inv.M.Pod(ns, name)
	if !ok {
		return nil, fmt.Errorf("%w: pod %s not found", traceflow.ErrInvalid, ref)
	}
	return p, nil
}

// Resolve returns family f's probe for req: the source pod's address and
// node, and the destination address (a pod's, a Service's ClusterIP of
// family f from spec.clusterIPs, or the given IP).
func (inv Inventory) Resolve(req traceflow.Request, f traceflow.Family) (traceflow.Probe, error) {
	kf := k8sFamily(f)
	src, err := inv.pod(req.Source)
	if err != nil {
		return traceflow.Probe{}, err
	}
	p := traceflow.Probe{SourcePod: req.Source, SourceNode: src.Spec.NodeName, DstPort: req.Destination.Port}
	var ok bool
	if p.Src, ok = manifest.PodAddr(src, kf); !ok {
		return p, fmt.Errorf("%w: pod %s has no %s address", traceflow.ErrNoAddress, req.Source, familyName(f))
	}
	d := req.Destination
	switch {
	case d.Pod != "":
		dst, err := inv.pod(d.Pod)
		if err != nil {
			return p, err
		}
		if p.Dst, ok = manifest.PodAddr(dst, kf); !ok {
			return p, fmt.Errorf("%w: pod %s has no %s address", traceflow.ErrNoAddress, d.Pod, familyName(f))
		}
		p.DstPod = d.Pod
	case d.Service != "":
		ns, name, _ := strings.Cut(d.Service, "/")
		svc, found := inv.M.Service(ns, name)
		if !found {
			return p, fmt.Errorf("%w: service %s not found", traceflow.ErrInvalid, d.Service)
		}
		if p.Dst, ok = manifest.ServiceAddr(svc, kf); !ok {
			return p, fmt.Errorf("%w: service %s has no %s ClusterIP", traceflow.ErrNoAddress, d.Service, familyName(f))
		}
		if req.Protocol == traceflow.TCP || req.Protocol == traceflow.UDP {
			if !servicePort(svc, req.Protocol, d.Port) {
				return p, fmt.Errorf("%w: service %s has no port %d/%s", traceflow.ErrInvalid, d.Service, d.Port, req.Protocol)
			}
		}
		p.Service = d.Service
	default:
		if manifest.FamilyOf(d.IP) != kf {
			return p, fmt.Errorf("%w: destination %s is not an %s address", traceflow.ErrNoAddress, d.IP, familyName(f))
		}
		p.Dst = d.IP.Unmap()
		if dp := inv.podByAddr(p.Dst); dp != nil {
			p.DstPod = dp.Namespace + "/" + dp.Name
		}
	}
	p.Family = f
	nodes := []string{p.SourceNode}
	for _, dp := range inv.Endpoints(p) {
		if a, ok := manifest.PodAddr(dp, kf); ok {
			p.Targets = append(p.Targets, traceflow.Target{Addr: a, Pod: dp.Namespace + "/" + dp.Name})
		}
		if !slices.Contains(nodes, dp.Spec.NodeName) {
			nodes = append(nodes, dp.Spec.NodeName)
		}
	}
	if len(p.Targets) == 0 {
		p.Targets = []traceflow.Target{{Addr: p.Dst}}
		nodes = nil // anywhere: every node watches
	}
	p.Nodes = nodes
	return p, nil
}

func servicePort(svc *corev1.Service, proto traceflow.Protocol, port uint16) bool {
	for _, sp := range svc.Spec.Ports {
		pp := sp.Protocol
		if pp == "" {
			pp = corev1.ProtocolTCP
		}
		if string(pp) == string(proto) && sp.Port == int32(port) {
			return true
		}
	}
	return false
}

func (inv Inventory) podByAddr(a netip.Addr) *corev1.Pod {
	for i := range inv.M.Pods {
		for _, pa := range manifest.PodAddrs(&inv.M.Pods[i]) {
			if pa == a {
				return &inv.M.Pods[i]
			}
		}
	}
	return nil
}

// Endpoints returns the pods that may receive a probe to p.Dst: the
// destination pod, or the ready endpoints of family f of the Service.
func (inv Inventory) Endpoints(p traceflow.Probe) []*corev1.Pod {
	if p.DstPod != "" {
		if dp, err := inv.pod(p.DstPod); err == nil {
			return []*corev1.Pod{dp}
		}
	}
	if p.Service == "" {
		if dp := inv.podByAddr(p.Dst); dp != nil {
			return []*corev1.Pod{dp}
		}
		return nil
	}
	ns, name, _ := strings.Cut(p.Service, "/")
	kf := k8sFamily(p.Family)
	var out []*corev1.Pod
	seen := map[string]bool{}
	for _, es := range inv.M.EndpointSlices {
		if es.Namespace != ns || es.Labels[manifest.LabelServiceName] != name || string(es.AddressType) != string(kf) {
			continue
		}
		for _, ep := range es.Endpoints {
			for _, a := range ep.Addresses {
				addr, err := netip.ParseAddr(a)
				if err != nil {
					continue
				}
				if dp := inv.podByAddr(addr.Unmap()); dp != nil && !seen[dp.Namespace+"/"+dp.Name] {
					seen[dp.Namespace+"/"+dp.Name] = true
					out = append(out, dp)
				}
			}
		}
	}
	return out
}

// IsolatingPolicies returns the policies ("ns/name") that isolate pod
// namespace/name in direction d: the ones whose default deny a drop rule
// (nft.DropName) enforces.
func (inv Inventory) IsolatingPolicies(namespace, name string, d nft.Direction) []string {
	pod, ok := inv.M.Pod(namespace, name)
	if !ok {
		return nil
	}
	var out []string
	for i := range inv.M.NetworkPolicies {
		np := &inv.M.NetworkPolicies[i]
		if np.Namespace != namespace {
			continue
		}
		in, eg := nft.PolicyTypes(np)
		if (d == nft.Ingress && !in) || (d == nft.Egress && !eg) {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		out = append(out, np.Namespace+"/"+np.Name)
	}
	return out
}
