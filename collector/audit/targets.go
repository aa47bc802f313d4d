package audit

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
)

// ClusterResolver is a Resolver over the cluster view: pods, workloads
// and Service backends from the enrichment's Snapshot, Services
// (families, ports) from Service.
type ClusterResolver struct {
	// Cluster returns the cluster view (collector.Cluster).
	Cluster func() (*enrich.Snapshot, error)
}

var _ Resolver = ClusterResolver{}

// Resolve implements Resolver: a pod; every pod of a workload (the pods
// of the namespace whose top-level controller has the name); a Service
// and every pod its selector selects; an address, as the pod holding it
// when there is one. An endpoint that does not exist is an error naming
// it ("workload shop/frontend not found").
func (r ClusterResolver) Resolve(_ context.Context, e Endpoint) (*Target, error) {
	if e.Kind == "ip" {
		a, err := netip.ParseAddr(e.Name)
		if err != nil {
			if _, perr := netip.ParsePrefix(e.Name); perr == nil {
				return nil, fmt.Errorf("%w: policies are evaluated for an address, not a prefix (%s)", ErrNotEvaluated, e.Name)
			}
			return nil, fmt.Errorf("bad address %q: %w", e.Name, err)
		}
		a = a.Unmap()
		if view, err := r.Cluster(); err == nil {
			if p, ok := view.LookupPod(a, time.Time{}); ok {
				m := member(view, p)
				m.Peers = map[int]policy.Peer{int(flow.Version(a)): peerOf(view, p, a)}
				return &Target{Members: []Member{m}}, nil
			}
		}
		return &Target{Members: []Member{{Name: a.String(), Peers: map[int]policy.Peer{int(flow.Version(a)): {Addr: a}}}}}, nil
	}
	view, err := r.Cluster()
	if err != nil {
		return nil, err
	}
	t := &Target{}
	switch e.Kind {
	case "pod":
		p, ok := view.Pod(e.Namespace, e.Name)
		if !ok {
			return nil, fmt.Errorf("pod %s/%s not found", e.Namespace, e.Name)
		}
		t.Members = []Member{member(view, p)}
	case "workload":
		for _, p := range view.Pods {
			if p.Namespace == e.Namespace && view.Workload(p).Name == e.Name {
				t.Members = append(t.Members, member(view, p))
			}
		}
		if len(t.Members) == 0 {
			return nil, fmt.Errorf("workload %s/%s not found", e.Namespace, e.Name)
		}
	case "service":
		v, ok := view.Service(e.Namespace, e.Name)
		if !ok {
			return nil, fmt.Errorf("service %s/%s not found", e.Namespace, e.Name)
		}
		svc := ServiceSpecOf(v)
		t.Service = svc
		if svc.Selector != nil {
			sel := labels.SelectorFromSet(svc.Selector)
			for _, p := range view.Pods {
				if p.Namespace == svc.Namespace && sel.Matches(labels.Set(p.Labels)) {
					t.Members = append(t.Members, member(view, p))
				}
			}
		}
	default:
		return nil, fmt.Errorf("kind %q is not pod, workload, service or ip", e.Kind)
	}
	return t, nil
}

// member is pod p as a Target member: its first address of each family.
func member(view *enrich.Snapshot, p *enrich.Pod) Member {
	m := Member{Name: p.Namespace + "/" + p.Name, Pod: true, Peers: map[int]policy.Peer{}, pod: p}
	for _, a := range p.Addrs {
		if fam := int(flow.Version(a)); m.Peers[fam].Addr == (netip.Addr{}) {
			m.Peers[fam] = peerOf(view, p, a)
		}
	}
	for _, cp := range p.Ports {
		if cp.Port > 0 && cp.Port <= 65535 {
			m.Ports = append(m.Ports, ContainerPort{Name: cp.Name, Proto: policy.ProtoNumber(&cp.Protocol), Port: uint16(cp.Port)})
		}
	}
	return m
}

// ServiceSpecOf is an enrichment Service in reachability's terms: its
// families are those of spec.ipFamilies it has a ClusterIP of (headless:
// of spec.ipFamilies).
func ServiceSpecOf(s *enrich.Service) *ServiceSpec {
	out := &ServiceSpec{Namespace: s.Namespace, Name: s.Name, Headless: s.Headless, Selector: s.Selector}
	for _, f := range []struct {
		v  uint8
		kf corev1.IPFamily
	}{{4, corev1.IPv4Protocol}, {6, corev1.IPv6Protocol}} {
		_, hasIP := enrich.AddrOfFamily(s.ClusterIPs, f.v)
		if s.HasFamily(f.kf) && (hasIP || s.Headless) {
			out.Families = append(out.Families, int(f.v))
		}
	}
	for _, sp := range s.Ports {
		if sp.Port <= 0 || sp.Port > 65535 {
			continue
		}
		p := ServicePort{Name: sp.Name, Proto: policy.ProtoNumber(&sp.Protocol), Port: uint16(sp.Port)}
		switch {
		case sp.TargetPort.Type == intstr.String:
			p.TargetPortName = sp.TargetPort.StrVal
		case sp.TargetPort.IntVal > 0 && sp.TargetPort.IntVal <= 65535:
			p.TargetPort = uint16(sp.TargetPort.IntVal)
		}
		out.Ports = append(out.Ports, p)
	}
	return out
}
