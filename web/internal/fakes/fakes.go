// Package fakes implements web/api's dependencies over the seeded lab of
// webtest, for tests, browser tests and the demo UI.
package fakes

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/web/api"
	"github.com/dualflow/dualflow/web/internal/webtest"
)

// Evaluator answers from Pairs: the seeded verdicts, and both families
// for any other pair of lab workloads (not_isolated).
type Evaluator struct{}

// Evaluate implements api.Evaluator.
func (Evaluator) Evaluate(_ context.Context, src, dst api.Endpoint, _ uint8, _ uint16) (map[int]api.PolicyVerdict, error) {
	si, di := find(src), find(dst)
	if si < 0 || di < 0 {
		return nil, fmt.Errorf("unknown endpoint %s or %s", src, dst)
	}
	out := map[int]api.PolicyVerdict{
		4: {Verdict: "not_isolated", SrcIP: addr(4, si, 1), DstIP: addr(4, di, 101)},
		6: {Verdict: "not_isolated", SrcIP: addr(6, si, 1), DstIP: addr(6, di, 101)},
	}
	for _, p := range webtest.Pairs {
		if p.Src == si && p.Dst == di {
			for fam, v := range map[int]string{4: p.Verdict4, 6: p.Verdict6} {
				pv := out[fam]
				pv.Verdict = v
				if v == "" {
					pv.Verdict = "allowed"
				}
				if v == "denied" || v == "allowed" {
					pv.Ingress = webtest.Lab[di].Namespace + "/" + webtest.Lab[di].Name + "-policy"
				}
				out[fam] = pv
			}
		}
	}
	return out, nil
}

func find(e api.Endpoint) int {
	for i, w := range webtest.Lab {
		if w.Namespace == e.Namespace && (w.Name == e.Name || e.Kind == "pod" && strings.HasPrefix(e.Name, w.Name+"-")) {
			return i
		}
	}
	if e.Kind == "service" {
		for _, p := range webtest.Pairs {
			if p.Service == e.Name {
				return p.Dst
			}
		}
	}
	return -1
}

func addr(fam, w, k int) string {
	if fam == 4 {
		return fmt.Sprintf("198.18.%d.%d", w+1, k)
	}
	return fmt.Sprintf("fd00:10:244:%d::%x", w+1, k)
}

// Tracer traces by the evaluator: denied verdicts drop at the
// destination node's ingress policy.
type Tracer struct{ Delay time.Duration }

// Trace implements api.Tracer.
func (t Tracer) Trace(ctx context.Context, req api.TraceRequest) (*api.TraceResult, error) {
	if t.Delay > 0 {
		select {
		case <-time.After(t.Delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	vs, err := Evaluator{}.Evaluate(ctx, req.Source, req.Destination, req.Protocol, req.Port)
	if err != nil {
		return nil, err
	}
	v := vs[req.Family]
	si, di := find(req.Source), find(req.Destination)
	src, dst := webtest.Lab[si], webtest.Lab[di]
	res := &api.TraceResult{Family: req.Family, SrcIP: v.SrcIP, DstIP: v.DstIP, Outcome: "delivered"}
	res.Hops = append(res.Hops,
		api.TraceHop{Node: src.Node, Component: "egress-policy", Action: "forwarded"},
		api.TraceHop{Node: src.Node, Component: "routing", Action: "forwarded", Detail: "to " + dst.Node})
	if v.Verdict == "denied" {
		res.Outcome, res.DropNode, res.Policy = "dropped", dst.Node, v.Ingress
		res.Hops = append(res.Hops, api.TraceHop{Node: dst.Node, Component: "ingress-policy", Action: "dropped", Policy: v.Ingress})
		return res, nil
	}
	res.Hops = append(res.Hops,
		api.TraceHop{Node: dst.Node, Component: "ingress-policy", Action: "forwarded", Policy: v.Ingress},
		api.TraceHop{Node: dst.Node, Component: "forwarding", Action: "delivered", Detail: dst.Name})
	return res, nil
}

// AuditAPI serves GET /api/v1/audit/findings with fixed findings, as
// collector/audit's API answers them (the dual-stack gap first); the other
// audit routes answer 404.
type AuditAPI struct{}

// ServeHTTP implements http.Handler.
func (AuditAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || r.URL.Path != "/api/v1/audit/findings" {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(audit.FindingsResponse{DualStack: 1, Findings: []audit.Finding{
		{Kind: audit.KindVerdictGap, Message: "shop/frontend → shop/db on TCP 5432 is allowed over IPv4 and denied over IPv6", Objects: []audit.Ref{{Kind: "Deployment", Namespace: "shop", Name: "frontend"}, {Kind: "StatefulSet", Namespace: "shop", Name: "db"}}, Port: 5432, Protocol: "TCP", Count: 3},
		{Kind: audit.KindUnprotectedIngress, Message: "2 pods of Deployment infra/dns are not isolated for ingress", Objects: []audit.Ref{{Kind: "Deployment", Namespace: "infra", Name: "dns"}}, Count: 2},
	}})
}

// IdlePod, IdleWorkload and IdleService are objects of Catalog that no
// seeded flow names: only the live view knows them. They sort after the
// lab's, so the UI's default forms (the first names) stay seeded ones.
const (
	IdlePod      = "tools/idle-0"
	IdleWorkload = "tools/idle"
	IdleService  = "tools/idle"
)

// Catalog lists the lab (pods name-0..2 of each workload, a Service per
// Pairs service, on both families) and the idle objects.
type Catalog struct{}

var _ api.Catalog = Catalog{}

// Catalog implements api.Catalog.
func (Catalog) Catalog(context.Context) (api.CatalogResponse, error) {
	out := api.CatalogResponse{Nodes: []string{"node-a", "node-b"}}
	ns := map[string]bool{}
	add := func(w webtest.Workload, i, pods int) {
		if !ns[w.Namespace] {
			ns[w.Namespace] = true
			out.Namespaces = append(out.Namespaces, w.Namespace)
		}
		for k := range pods {
			out.Pods = append(out.Pods, api.CatalogPod{
				Namespace: w.Namespace, Name: fmt.Sprintf("%s-%d", w.Name, k), Node: w.Node,
				IPv4:         []netip.Addr{netip.MustParseAddr(addr(4, i, 100+k))},
				IPv6:         []netip.Addr{netip.MustParseAddr(addr(6, i, 100+k))},
				WorkloadKind: w.Kind, Workload: w.Name,
			})
		}
		out.Workloads = append(out.Workloads, api.CatalogWorkload{Kind: w.Kind, Namespace: w.Namespace, Name: w.Name, Pods: pods})
	}
	for i, w := range webtest.Lab {
		add(w, i, 3)
	}
	add(webtest.Workload{Namespace: "tools", Name: "idle", Kind: "Deployment", Node: "node-a"}, len(webtest.Lab), 1)
	svcs := map[string]bool{}
	for _, p := range webtest.Pairs {
		if p.Service == "" || svcs[p.Service] {
			continue
		}
		svcs[p.Service] = true
		proto := "TCP"
		if p.Port == 53 {
			proto = "UDP"
		}
		out.Services = append(out.Services, api.CatalogService{
			Namespace: webtest.Lab[p.Dst].Namespace, Name: p.Service, Type: "ClusterIP", Families: []int{4, 6},
			Ports: []api.CatalogPort{{Protocol: proto, Port: uint16(p.Port)}},
		})
	}
	out.Services = append(out.Services, api.CatalogService{
		Namespace: "tools", Name: "idle", Type: "ClusterIP", Families: []int{6},
		Ports: []api.CatalogPort{{Name: "http", Protocol: "TCP", Port: 9090}},
	})
	return out, nil
}

// Status answers /api/v1/status for a kubeconfig source whose view is
// stale while Stale is set: pods and services unwatched for 12 s.
type Status struct{ Stale *atomic.Bool }

// Status implements api.Status.
func (s Status) Status(context.Context) (api.StatusResponse, error) {
	k := api.KubernetesStatus{Source: "kubeconfig", Synced: true}
	for _, kind := range []string{"endpointslice", "namespace", "node", "pod", "service"} {
		kk := api.KubernetesKind{Kind: kind, Watching: true}
		if s.Stale != nil && s.Stale.Load() && (kind == "pod" || kind == "service") {
			kk.Watching, kk.StaleSeconds, k.Stale = false, 12.4, true
		}
		k.Kinds = append(k.Kinds, kk)
	}
	return api.StatusResponse{Kubernetes: k}, nil
}
