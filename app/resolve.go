package app

import (
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/traceflow"
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

func (r resolver) pod(e *enrich.Enricher, ref string) (*enrich.Pod, error) {
	ns, name, _ := strings.Cut(ref, "/")
	p, ok := e.Pod(ns, name)
	if !ok || p.Terminated {
		return nil, fmt.Errorf("%w: pod %s not found", traceflow.ErrInvalid, ref)
	}
	return p, nil
}

// Resolve implements traceflow's resolver.
func (r resolver) Resolve(req traceflow.Request, f traceflow.Family) (traceflow.Probe, error) {
	e, err := r.enricher()
	if err != nil {
		return traceflow.Probe{}, err
	}
	v, fam, kf := familyOf(f)
	src, err := r.pod(e, req.Source)
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
		dst, err := r.pod(e, d.Pod)
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
			return p, fmt.Errorf("%w: service %s not found", traceflow.ErrInvalid, d.Service)
		}
		if p.Dst, ok = enrich.AddrOfFamily(svc.ClusterIPs, v); !ok || !svc.HasFamily(kf) {
			return p, fmt.Errorf("%w: service %s has no %s ClusterIP", traceflow.ErrNoAddress, d.Service, fam)
		}
		if req.Protocol == traceflow.TCP || req.Protocol == traceflow.UDP {
			if !hasServicePort(svc, req.Protocol, d.Port) {
				return p, fmt.Errorf("%w: service %s has no port %d/%s", traceflow.ErrInvalid, d.Service, d.Port, req.Protocol)
			}
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
	return p, nil
}

func hasServicePort(svc *enrich.Service, proto traceflow.Protocol, port uint16) bool {
	for _, sp := range svc.Ports {
		if string(sp.Protocol) == string(proto) && sp.Port == int32(port) {
			return true
		}
	}
	return false
}
