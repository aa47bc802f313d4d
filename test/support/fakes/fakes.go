// Package fakes implements web/api's dependencies over the seeded lab of
// webtest, for tests and browser tests.
package fakes

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/test/support/webtest"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/web/api"
)

// Evaluator answers from Pairs, each cell as two pod pairs (pod 1 of the
// source to pods 0 and 1 of the destination, on the port asked): the
// seeded verdicts, and both families for any other pair of lab workloads
// (not_isolated); an end outside the lab is an error cell.
type Evaluator struct{}

// EvaluateMatrix implements api.Evaluator.
func (Evaluator) EvaluateMatrix(_ context.Context, srcs, dsts []audit.Endpoint, _ uint8, port uint16, _ ...[]uint16) ([][]map[int]*audit.FamilyPolicy, error) {
	out := make([][]map[int]*audit.FamilyPolicy, len(srcs))
	for i, src := range srcs {
		for _, dst := range dsts {
			out[i] = append(out[i], evaluate(src, dst, port))
		}
	}
	return out, nil
}

func evaluate(src, dst audit.Endpoint, port uint16) map[int]*audit.FamilyPolicy {
	si, di := find(src), find(dst)
	if si < 0 || di < 0 {
		err := fmt.Sprintf("unknown endpoint %s or %s", src, dst)
		return map[int]*audit.FamilyPolicy{4: {Outcome: audit.OutcomeError, Reason: err}, 6: {Outcome: audit.OutcomeError, Reason: err}}
	}
	out := map[int]*audit.FamilyPolicy{}
	for _, fam := range []int{4, 6} {
		v := audit.PolicyVerdict{Verdict: "not_isolated", SrcIP: addr(fam, si, 1), DstIP: addr(fam, di, 101)}
		for _, p := range webtest.Pairs {
			if p.Src == si && p.Dst == di {
				v.Verdict = map[int]string{4: p.Verdict4, 6: p.Verdict6}[fam]
				if v.Verdict == "" {
					v.Verdict = "allowed"
				}
				if v.Verdict == "denied" || v.Verdict == "allowed" {
					v.Ingress = webtest.Lab[di].Namespace + "/" + webtest.Lab[di].Name + "-policy"
				}
			}
		}
		f := &audit.FamilyPolicy{Outcome: audit.OutcomeAllow, Summary: v}
		s, d := webtest.Lab[si], webtest.Lab[di]
		for k := range 2 {
			f.Pairs = append(f.Pairs, audit.PairVerdict{Src: s.Namespace + "/" + s.Name + "-1", Dst: d.Namespace + "/" + d.Name + "-" + strconv.Itoa(k),
				SrcIP: podAddr(fam, si, 1).String(), DstIP: podAddr(fam, di, k).String(), Port: port, Verdict: v.Verdict, Ingress: v.Ingress})
		}
		f.Total, f.Allowed = len(f.Pairs), len(f.Pairs)
		if v.Verdict == "denied" || v.Verdict == "rejected" {
			f.Outcome, f.Allowed = audit.OutcomeDeny, 0
		}
		out[fam] = f
	}
	return out
}

func find(e audit.Endpoint) int {
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

// Resolver resolves traceflow requests in the lab (traceflow.New's
// resolver): pod name-k of Lab[w] (k 0..2) has the addresses Catalog
// lists, a workload's pod is its name-0, and a Service of Pairs has a
// ClusterIP of each family (the one the seeded flows name) and its
// destination workload's pods as endpoints. Unknown names are invalid.
type Resolver struct{}

// WorkloadPod implements traceflow's resolver.
func (Resolver) WorkloadPod(ref string) (string, bool, error) {
	ns, name, _ := strings.Cut(ref, "/")
	if find(audit.Endpoint{Kind: "workload", Namespace: ns, Name: name}) < 0 {
		return "", false, nil
	}
	return ref + "-0", true, nil
}

// Resolve implements traceflow's resolver.
func (Resolver) Resolve(req traceflow.Request, f traceflow.Family) (traceflow.Probe, error) {
	v := 4
	if f == traceflow.IPv6 {
		v = 6
	}
	si, sk, ok := labPod(req.Source)
	if !ok {
		return traceflow.Probe{}, traceflow.Invalid("source", "pod %s not found", req.Source)
	}
	p := traceflow.Probe{SourcePod: req.Source, SourceNode: webtest.Lab[si].Node, Src: podAddr(v, si, sk), DstPort: req.Destination.Port}
	switch d := req.Destination; {
	case d.Pod != "":
		di, dk, ok := labPod(d.Pod)
		if !ok {
			return p, traceflow.Invalid("destination.pod", "pod %s not found", d.Pod)
		}
		p.Dst, p.DstPod = podAddr(v, di, dk), d.Pod
	case d.Service != "":
		ns, name, _ := strings.Cut(d.Service, "/")
		pi := -1
		for i, pr := range webtest.Pairs {
			if pr.Service == name && webtest.Lab[pr.Dst].Namespace == ns {
				pi = i
				break
			}
		}
		if pi < 0 {
			return p, traceflow.Invalid("destination.service", "service %s not found", d.Service)
		}
		p.Dst, p.Service = serviceAddr(v, pi), d.Service
	case d.IP.Is4() != (v == 4):
		return p, fmt.Errorf("%w: destination %s is not an IPv%d address", traceflow.ErrNoAddress, d.IP, v)
	default:
		p.Dst = d.IP
	}
	return p, nil
}

// labPod finds pod "ns/name-k" of the lab: its workload's index and k.
func labPod(ref string) (w, k int, ok bool) {
	ns, name, _ := strings.Cut(ref, "/")
	i := strings.LastIndexByte(name, '-')
	if i < 0 {
		return 0, 0, false
	}
	k, err := strconv.Atoi(name[i+1:])
	w = find(audit.Endpoint{Kind: "workload", Namespace: ns, Name: name[:i]})
	return w, k, err == nil && w >= 0 && k >= 0 && k < 3
}

func podAddr(v, w, k int) netip.Addr { return netip.MustParseAddr(addr(v, w, 100+k)) }

// serviceAddr is the ClusterIP of Pairs[i]'s Service, as SeedSQL writes it.
func serviceAddr(v, i int) netip.Addr {
	if v == 4 {
		return netip.MustParseAddr(fmt.Sprintf("198.19.0.%d", i+1))
	}
	return netip.MustParseAddr(fmt.Sprintf("fd00:10:96::%d", i+1))
}

// NodeTracer traces a probe of Resolver by the Evaluator's verdict (the
// node tracer of traceflow.New): a denied pair drops at the destination
// node's ingress policy, any other is delivered to the destination's pod
// (a Service's name-0). A trace takes Delay.
type NodeTracer struct{ Delay time.Duration }

// Trace implements traceflow's node tracer.
func (t NodeTracer) Trace(ctx context.Context, p traceflow.Probe) (traceflow.Path, error) {
	if t.Delay > 0 {
		select {
		case <-time.After(t.Delay):
		case <-ctx.Done():
			return traceflow.Path{Outcome: traceflow.TimedOut}, ctx.Err()
		}
	}
	endpoint := func(kind, ref string) audit.Endpoint {
		ns, name, _ := strings.Cut(ref, "/")
		return audit.Endpoint{Kind: kind, Namespace: ns, Name: name}
	}
	src, dst := endpoint("pod", p.SourcePod), endpoint("pod", p.DstPod)
	if p.Service != "" {
		dst = endpoint("service", p.Service)
	}
	fam := 4
	if !p.Src.Is4() {
		fam = 6
	}
	fp := evaluate(src, dst, p.DstPort)[fam]
	if fp.Outcome == audit.OutcomeError {
		return traceflow.Path{Outcome: traceflow.TimedOut, Reason: "no node of the lab saw the probe"}, nil
	}
	v := fp.Summary
	from, to := webtest.Lab[find(src)].Node, webtest.Lab[find(dst)].Node
	obs := []traceflow.Observation{{Node: from, Component: traceflow.NetworkPolicy, Action: traceflow.ActionForwarded, Detail: "egress"}}
	pod := p.DstPod
	if p.Service != "" {
		ns, _, _ := strings.Cut(p.Service, "/")
		pod = ns + "/" + webtest.Lab[find(dst)].Name + "-0"
		obs = append(obs, traceflow.Observation{Node: from, Component: traceflow.LoadBalancing, Action: traceflow.ActionForwarded,
			Service: p.Service, TranslatedDst: netip.AddrPortFrom(podAddr(fam, find(dst), 0), p.DstPort)})
	}
	obs = append(obs, traceflow.Observation{Node: from, Component: traceflow.Routing, Action: traceflow.ActionForwarded, Detail: "to " + to})
	if v.Verdict == "denied" {
		obs = append(obs, traceflow.Observation{Node: to, Component: traceflow.NetworkPolicy, Action: traceflow.ActionDropped, Policy: v.Ingress, Rule: "drop/ingress/" + pod})
		return traceflow.Path{Outcome: traceflow.Dropped, Observations: obs}, nil
	}
	obs = append(obs,
		traceflow.Observation{Node: to, Component: traceflow.NetworkPolicy, Action: traceflow.ActionForwarded, Policy: v.Ingress},
		traceflow.Observation{Node: to, Component: traceflow.Delivery, Action: traceflow.ActionDelivered, Pod: pod})
	return traceflow.Path{Outcome: traceflow.Delivered, Observations: obs}, nil
}

// Audit answers the findings with fixed ones, as collector/audit's
// Queries answers them (the dual-stack gap first); its other questions
// are the real Queries' over reports (nil: unavailable) and a view of the
// lab's pods and DBPolicy, so a what-if replays the seeded flows, and
// evaluates the reachability cells, with the product's policy
// evaluation.
type Audit struct{ *audit.Queries }

// NewAudit returns an Audit over reports (nil answers the store's
// questions with audit.ErrUnavailable) whose view holds the lab's pods
// (LabPods) with addresses of families fams (4, 6).
func NewAudit(reports *audit.Reports, fams ...int) Audit {
	objs := []runtime.Object{DBPolicy()}
	for _, p := range LabPods(fams...) {
		objs = append(objs, p)
	}
	view := enrich.NewSnapshot(objs...)
	return Audit{&audit.Queries{Reports: reports, Cluster: func() (*enrich.Snapshot, error) { return view, nil }}}
}

// labPorts are the container ports the lab's workloads declare: those
// of the seeded flows to them (frontend declares none).
var labPorts = map[string][]corev1.ContainerPort{
	"cart": {{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}},
	"db":   {{Name: "postgres", ContainerPort: 5432, Protocol: corev1.ProtocolTCP}},
	"dns":  {{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP}},
}

// LabPods are the running pods name-0..2 of each workload of the lab
// (label app=name, controlled by the workload), with the addresses of
// families fams that the seeded flows and Catalog give them.
func LabPods(fams ...int) []*corev1.Pod {
	var out []*corev1.Pod
	ctl := true
	for i, w := range webtest.Lab {
		for k := range 3 {
			p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: fmt.Sprintf("%s-%d", w.Name, k), Labels: map[string]string{"app": w.Name},
				OwnerReferences: []metav1.OwnerReference{{Kind: w.Kind, Name: w.Name, Controller: &ctl}}}}
			p.Spec.NodeName = w.Node
			p.Spec.Containers = []corev1.Container{{Name: w.Name, Ports: labPorts[w.Name]}}
			p.Status.Phase = corev1.PodRunning
			for _, fam := range fams {
				p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: addr(fam, i, 100+k)})
			}
			out = append(out, p)
		}
	}
	return out
}

// DBPolicy is the lab's one policy, shop/db-policy, as the seeded
// verdicts have it: the pods of shop/db admit TCP 5432 from IPv4
// addresses only (198.18.0.0/15, the lab's), so frontend → db is allowed
// over IPv4 and denied over IPv6.
func DBPolicy() *networkingv1.NetworkPolicy {
	tcp, port := corev1.ProtocolTCP, intstr.FromInt32(5432)
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db-policy"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "198.18.0.0/15"}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		},
	}
}

// Findings implements api.Audit.
func (Audit) Findings(context.Context, audit.Window) (*audit.FindingsResponse, error) {
	frontend := audit.Ref{Kind: "Deployment", Namespace: "shop", Name: "frontend"}
	db := audit.Ref{Kind: "StatefulSet", Namespace: "shop", Name: "db"}
	as := func(r audit.Ref, role string) audit.Ref { r.Role = role; return r }
	rule0 := int32(0)
	// One finding of each kind the UI links differently, over the seeded
	// flows.
	fs := []audit.Finding{
		{Kind: audit.KindVerdictGap, Message: "shop/frontend → shop/db on TCP 5432 is allowed over IPv4 and denied over IPv6", Objects: []audit.Ref{as(frontend, audit.RoleSource), as(db, audit.RoleDestination)}, Port: 5432, Protocol: "TCP", Count: 3},
		{Kind: audit.KindIPBlockOneFamily, Message: "The ipBlocks of ingress rule 0 of NetworkPolicy shop/db-policy are IPv4 only", Port: 5432, Protocol: "TCP", Count: 3,
			Objects: []audit.Ref{{Kind: "NetworkPolicy", Namespace: "shop", Name: "db-policy", Direction: "ingress", Rule: &rule0}, as(frontend, audit.RoleSource), as(db, audit.RoleDestination)}},
		{Kind: audit.KindServiceSingleStack, Message: "Service shop/db is single-stack (IPv4) while 2 of its 2 pods are dual-stack", Port: 5432, Protocol: "TCP", Count: 2,
			Objects: []audit.Ref{{Kind: "Service", Namespace: "shop", Name: "db", Role: audit.RoleDestination}, db}},
		{Kind: audit.KindUnprotectedIngress, Message: "2 pods of Deployment infra/dns are not isolated for ingress", Objects: []audit.Ref{{Kind: "Deployment", Namespace: "infra", Name: "dns", Role: audit.RoleDestination}}, Count: 2},
		{Kind: audit.KindUnprotectedEgress, Message: "3 pods of Deployment shop/cart are not isolated for egress", Objects: []audit.Ref{{Kind: "Deployment", Namespace: "shop", Name: "cart", Role: audit.RoleSource}}, Count: 3},
		{Kind: audit.KindObservedVerdictGap, Message: "Flows shop/frontend → shop/db on 5432/TCP were allowed over IPv4 but denied over IPv6", Objects: []audit.Ref{as(frontend, audit.RoleSource), as(db, audit.RoleDestination)}, Port: 5432, Protocol: "TCP", Count: 1},
	}
	audit.Describe(fs)
	return &audit.FindingsResponse{DualStack: 4, Findings: fs}, nil
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
