package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/local"
	"github.com/dualflow/dualflow/web"
	"github.com/dualflow/dualflow/web/api"
)

// demoWeb builds the web server of the demo: flows and SQL from the
// collector's embedded store, policy evaluation and audit findings from the
// lab's Kubernetes objects, and traceflows injected in the lab.
func demoWeb(c *collector.Collector, l *lab.Lab, addr, tokensFile string) (*web.Server, *traceflow.Controller, error) {
	inv, err := audit.LoadInventory(l.ManifestPath())
	if err != nil {
		return nil, nil, err
	}
	tracer, err := local.NewTracer(l, local.Inventory{M: l.Manifest})
	if err != nil {
		return nil, nil, err
	}
	tf := traceflow.New(traceflow.Config{}, tracer, local.Inventory{M: l.Manifest}, traceflow.NewStore(c.Conn(), "dualflow"))
	cfg := web.Config{
		Addr:       addr,
		Store:      c.Conn(),
		Database:   "dualflow",
		TokensFile: tokensFile,
		Evaluator: api.PolicyEvaluator{
			Policies: func() *policy.Set {
				if a := c.Auditor(); a != nil {
					return a.Policies()
				}
				return nil
			},
			Resolver: invResolver{inv},
			PortName: func(dst api.Endpoint, proto uint8, port uint16) string {
				p, ok := invPod(inv, dst)
				if !ok {
					return ""
				}
				return inv.PortName(audit.PortQuery{Namespace: p.Namespace, Pod: p.Name, Port: port, Proto: proto})
			},
		},
		Auditor: api.AuditorFunc(func(context.Context) ([]audit.Finding, error) {
			return audit.Findings(inv, audit.Options{}), nil
		}),
		Tracer: api.TracerFunc(func(ctx context.Context, req api.TraceRequest) (*api.TraceResult, error) {
			return trace(ctx, tf, inv, req)
		}),
		Registerer: c.Registry(),
		Gatherer:   c.Registry(),
	}
	if e, ok := c.Conn().(*store.Embedded); ok {
		cfg.SQL = api.EngineSQL{Engine: e.DB()}
	}
	srv, err := web.New(cfg)
	if err != nil {
		return nil, nil, err
	}
	return srv, tf, nil
}

// invResolver resolves reachability endpoints through the inventory: a pod,
// one pod of a workload, or a Service's first selected pod; one peer per
// family the end has an address of.
type invResolver struct{ inv *audit.Inventory }

func (r invResolver) Resolve(_ context.Context, e api.Endpoint) (map[int]policy.Peer, error) {
	if e.Kind == "ip" {
		a, err := netip.ParseAddr(e.Name)
		if err != nil {
			return nil, fmt.Errorf("bad address %q: %w", e.Name, err)
		}
		a = a.Unmap()
		return map[int]policy.Peer{int(flow.Version(a)): {Addr: a}}, nil
	}
	p, ok := invPod(r.inv, e)
	if !ok {
		return nil, fmt.Errorf("%s %s/%s not found", e.Kind, e.Namespace, e.Name)
	}
	nsLabels, _ := r.inv.NamespaceLabels(p.Namespace)
	out := map[int]policy.Peer{}
	for _, a := range p.Addrs {
		out[int(flow.Version(a))] = policy.Peer{Addr: a, IsPod: !p.HostNetwork, Namespace: p.Namespace, Labels: p.Labels, NamespaceLabels: nsLabels}
	}
	return out, nil
}

// invPod finds the pod an endpoint stands for.
func invPod(inv *audit.Inventory, e api.Endpoint) (*audit.Pod, bool) {
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
				if p.Namespace == s.Namespace && sel.Matches(labels.Set(p.Labels)) {
					return p, true
				}
			}
		}
	}
	return nil, false
}

// trace runs one family of a traceflow for the web API.
func trace(ctx context.Context, tf *traceflow.Controller, inv *audit.Inventory, req api.TraceRequest) (*api.TraceResult, error) {
	src, ok := invPod(inv, req.Source)
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
		p, ok := invPod(inv, req.Destination)
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
	if fr.Outcome == "no-address" || fr.Outcome == "error" {
		return nil, fmt.Errorf("%s", cmpStr(fr.Reason, string(fr.Outcome)))
	}
	out := &api.TraceResult{Family: req.Family, Outcome: string(fr.Outcome)}
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
	return out, nil
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
