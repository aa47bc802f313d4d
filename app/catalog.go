package app

import (
	"context"
	"fmt"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/web/api"
)

var _ api.Catalog = (*view)(nil)

// Catalog implements api.Catalog from the cluster view: every live
// object, whether or not it had flows. api.ErrUnavailable (503) while the
// enrichment is off or not synced.
func (v *view) Catalog(ctx context.Context) (api.CatalogResponse, error) {
	var out api.CatalogResponse
	s, err := v.c.Cluster()
	if err != nil {
		return out, fmt.Errorf("catalog: %w: %w", api.ErrUnavailable, err)
	}
	for _, n := range s.Namespaces {
		out.Namespaces = append(out.Namespaces, n.Name)
	}
	for _, n := range s.Nodes {
		out.Nodes = append(out.Nodes, n.Name)
	}
	type wkey struct{ kind, ns, name string }
	workloads := map[wkey]int{}
	for i, p := range s.Pods {
		cp := api.CatalogPod{Namespace: p.Namespace, Name: p.Name, Node: p.NodeName, HostNetwork: p.HostNetwork}
		for _, a := range p.Addrs {
			if a.Is4() {
				cp.IPv4 = append(cp.IPv4, a)
			} else {
				cp.IPv6 = append(cp.IPv6, a)
			}
		}
		if w := s.Workloads[i]; w.Kind != enrich.KindPod && w.Name != "" {
			cp.WorkloadKind, cp.Workload = w.Kind, w.Name
			workloads[wkey{w.Kind, p.Namespace, w.Name}]++
		}
		out.Pods = append(out.Pods, cp)
	}
	for k, n := range workloads {
		out.Workloads = append(out.Workloads, api.CatalogWorkload{Kind: k.kind, Namespace: k.ns, Name: k.name, Pods: n})
	}
	for _, svc := range s.Services {
		spec := audit.ServiceSpecOf(svc)
		cs := api.CatalogService{Namespace: svc.Namespace, Name: svc.Name, Type: string(svc.Type), Headless: svc.Headless, Families: spec.Families}
		for _, sp := range svc.Ports {
			if sp.Port <= 0 || sp.Port > 65535 {
				continue
			}
			cs.Ports = append(cs.Ports, api.CatalogPort{Name: sp.Name, Protocol: string(sp.Protocol), Port: uint16(sp.Port)})
		}
		out.Services = append(out.Services, cs)
	}
	return out, ctx.Err()
}
