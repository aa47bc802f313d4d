package app

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/web/api"
)

// view answers the web's questions about the cluster from the collector's
// live Kubernetes view (collector.Inventory), so every answer follows the
// cluster as it changes.
type view struct {
	c       *collector.Collector
	reports *audit.Reports
}

var _ api.Resolver = (*view)(nil)

// inventory is the live cluster view; ErrUnavailable (503) while there is
// none.
func (v *view) inventory() (*audit.Inventory, error) {
	inv, err := v.c.Inventory()
	if errors.Is(err, collector.ErrNoCluster) {
		return nil, fmt.Errorf("%w: %w", audit.ErrUnavailable, err)
	}
	return inv, err
}

// Resolve implements api.Resolver from the live view: pods, workloads
// and Service backends from the inventory, the Service's families and
// ports from the enrichment's Service.
func (v *view) Resolve(ctx context.Context, e api.Endpoint) (*api.Target, error) {
	return api.InventoryResolver{Inventory: v.inventory, Service: v.service}.Resolve(ctx, e)
}

// service is a Service of the live view in reachability's terms.
func (v *view) service(namespace, name string) (*api.ServiceSpec, bool) {
	e := v.c.Enricher()
	if e == nil {
		return nil, false
	}
	s, ok := e.Service(namespace, name)
	if !ok {
		return nil, false
	}
	return serviceSpec(s), true
}

// serviceSpec converts an enrichment Service: its families are those of
// spec.ipFamilies it has a ClusterIP of (headless: of spec.ipFamilies).
func serviceSpec(s *enrich.Service) *api.ServiceSpec {
	out := &api.ServiceSpec{Namespace: s.Namespace, Name: s.Name, Headless: s.Headless, Selector: s.Selector}
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
		p := api.ServicePort{Name: sp.Name, Proto: policy.ProtoNumber(&sp.Protocol), Port: uint16(sp.Port)}
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

// portName names the destination's container port serving proto/port.
func (v *view) portName(dst api.Endpoint, proto uint8, port uint16) string {
	inv, err := v.inventory()
	if err != nil {
		return ""
	}
	p, ok := podFor(inv, dst)
	if !ok {
		return ""
	}
	return p.PortName(port, proto)
}

// podFor finds the pod an endpoint stands for: the pod, the first pod of
// a workload, or the first pod a Service selects.
func podFor(inv *audit.Inventory, e api.Endpoint) (*audit.Pod, bool) {
	switch e.Kind {
	case "pod":
		return inv.Pod(e.Namespace, e.Name)
	case "workload":
		for _, p := range inv.Pods() {
			if p.Namespace == e.Namespace && inv.Workload(p).Name == e.Name {
				return p, true
			}
		}
	case "service":
		for _, s := range inv.Services() {
			if s.Namespace != e.Namespace || s.Name != e.Name || len(s.Selector) == 0 {
				continue
			}
			sel := labels.SelectorFromSet(s.Selector)
			for _, p := range inv.Pods() {
				if p.Namespace == s.Namespace && !p.HostNetwork && sel.Matches(labels.Set(p.Labels)) {
					return p, true
				}
			}
		}
	}
	return nil, false
}

// trace runs one family of a traceflow for the web API's /traceflow and
// the reachability matrix.
func (v *view) trace(ctx context.Context, tf *traceflow.Controller, req api.TraceRequest) (*api.TraceResult, error) {
	inv, err := v.inventory()
	if err != nil {
		return nil, err
	}
	src, ok := podFor(inv, req.Source)
	if !ok {
		return nil, fmt.Errorf("source %s %s/%s not found", req.Source.Kind, req.Source.Namespace, req.Source.Name)
	}
	r := traceflow.Request{Source: src.Namespace + "/" + src.Name, Destination: traceflow.Destination{Port: req.Port}}
	switch req.Destination.Kind {
	case "service":
		r.Destination.Service = req.Destination.Namespace + "/" + req.Destination.Name
	case "ip":
		a, err := netip.ParseAddr(req.Destination.Name)
		if err != nil {
			return nil, fmt.Errorf("bad destination address: %w", err)
		}
		r.Destination.IP = a
	default:
		p, ok := podFor(inv, req.Destination)
		if !ok {
			return nil, fmt.Errorf("destination %s %s/%s not found", req.Destination.Kind, req.Destination.Namespace, req.Destination.Name)
		}
		r.Destination.Pod = p.Namespace + "/" + p.Name
	}
	switch req.Protocol {
	case flow.ProtoUDP:
		r.Protocol = traceflow.UDP
	case flow.ProtoICMP, flow.ProtoICMPv6:
		r.Protocol = traceflow.ICMP
	default:
		r.Protocol = traceflow.TCP
	}
	switch req.Family {
	case 4:
		r.Family = traceflow.IPv4
	case 6:
		r.Family = traceflow.IPv6
	default:
		return nil, errors.New("family must be 4 or 6")
	}
	res, err := tf.Trace(ctx, r)
	if err != nil {
		return nil, err
	}
	fr, ok := res.Family(r.Family)
	if !ok {
		return nil, fmt.Errorf("trace %s: no %s result (%s)", res.ID, r.Family, res.Reason)
	}
	if fr.Outcome == traceflow.NoAddress || fr.Outcome == traceflow.Error {
		if fr.Reason != "" {
			return nil, errors.New(fr.Reason)
		}
		return nil, errors.New(string(fr.Outcome))
	}
	return traceResult(req.Family, fr), nil
}

// traceResult is one family's path in the web API's terms.
func traceResult(family int, fr traceflow.FamilyResult) *api.TraceResult {
	out := &api.TraceResult{Family: family, Outcome: string(fr.Outcome)}
	if fr.Src.IsValid() {
		out.SrcIP = fr.Src.String()
	}
	if fr.Dst.IsValid() {
		out.DstIP = fr.Dst.String()
	}
	for _, o := range fr.Observations {
		var detail []string
		if o.Interface != "" {
			detail = append(detail, "via "+o.Interface)
		}
		if o.Pod != "" {
			detail = append(detail, "pod "+o.Pod)
		}
		if o.Service != "" {
			detail = append(detail, "service "+o.Service)
		}
		if o.TranslatedDst.IsValid() {
			detail = append(detail, "DNAT to "+o.TranslatedDst.String())
		}
		if o.Detail != "" {
			detail = append(detail, o.Detail)
		}
		pol := strings.TrimSpace(o.Policy + " " + o.Rule)
		out.Hops = append(out.Hops, api.TraceHop{Node: o.Node, Component: string(o.Component), Action: string(o.Action), Detail: strings.Join(detail, ", "), Policy: pol})
		if o.Action == traceflow.ActionDropped || o.Action == traceflow.ActionRejected {
			out.DropNode, out.Policy = o.Node, pol
		}
	}
	return out
}
