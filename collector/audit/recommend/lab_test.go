package recommend

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// labView returns the default lab of mode (2 nodes) as the cluster view.
func labView(t testing.TB, mode manifest.Mode) *enrich.Snapshot {
	t.Helper()
	m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	return enrich.NewSnapshot(m.Objects()...)
}

// podOf returns the pod of workload ns/name on node (any node: "").
func podOf(t testing.TB, view *enrich.Snapshot, ns, name, node string) *enrich.Pod {
	t.Helper()
	for _, p := range view.Pods {
		if p.Namespace == ns && view.Workload(p).Name == name && (node == "" || p.NodeName == node) {
			return p
		}
	}
	t.Fatalf("no pod of %s/%s on %q", ns, name, node)
	return nil
}

// podEnd is pod p at its address of family v as a flow end; ok is false
// when it has none.
func podEnd(view *enrich.Snapshot, p *enrich.Pod, v uint8) (audit.FlowEnd, bool) {
	a, ok := enrich.AddrOfFamily(p.Addrs, v)
	w := view.Workload(p)
	return audit.FlowEnd{IP: a.String(), Namespace: p.Namespace, Pod: p.Name, WorkloadKind: w.Kind, WorkloadName: w.Name}, ok
}

func addrEnd(a netip.Addr) audit.FlowEnd { return audit.FlowEnd{IP: a.String()} }

// labFlows is traffic of the default lab in every family of view: web
// to api through Service backend/api (80 → http), probe-1 to api on
// udp-echo, an outside client to web, node-1 scraping api's metrics, a
// ping from web to api, a denied flow from probe-2 to web, and probes
// only from web to api on 9999. only, when not 0, keeps web → api on
// one family.
func labFlows(t testing.TB, view *enrich.Snapshot, only uint8) []audit.ObservedFlow {
	t.Helper()
	web := podOf(t, view, "frontend", "web", "node-1")
	api := podOf(t, view, "backend", "api", "node-2")
	probe1, probe2 := podOf(t, view, "tools", "probe-1", ""), podOf(t, view, "tools", "probe-2", "")
	var out []audit.ObservedFlow
	for _, v := range []uint8{4, 6} {
		w, ok := podEnd(view, web, v)
		if !ok {
			continue
		}
		a, _ := podEnd(view, api, v)
		p1, _ := podEnd(view, probe1, v)
		p2, _ := podEnd(view, probe2, v)
		ext := netip.MustParseAddr("198.19.255.7")
		icmp := flow.ProtoICMP
		if v == 6 {
			ext, icmp = netip.MustParseAddr("fd00:10:ffff::7"), flow.ProtoICMPv6
		}
		var nodeAddr netip.Addr
		for _, n := range view.Nodes {
			if n.Name == "node-1" {
				nodeAddr, _ = enrich.AddrOfFamily(n.InternalIPs, v)
			}
		}
		if only == 0 || only == v {
			out = append(out, audit.ObservedFlow{Src: w, Dst: a, Protocol: flow.ProtoTCP, DstPort: 8080, IPVersion: v,
				ServiceNamespace: "backend", ServiceName: "api", ServicePort: 80, Allowed: 10})
		}
		out = append(out,
			audit.ObservedFlow{Src: p1, Dst: a, Protocol: flow.ProtoUDP, DstPort: 5353, IPVersion: v, Allowed: 3},
			audit.ObservedFlow{Src: addrEnd(ext), Dst: w, Protocol: flow.ProtoTCP, DstPort: 8080, IPVersion: v, Allowed: 2},
			audit.ObservedFlow{Src: addrEnd(nodeAddr), Dst: a, Protocol: flow.ProtoTCP, DstPort: 9090, IPVersion: v, Allowed: 5},
			audit.ObservedFlow{Src: w, Dst: a, Protocol: icmp, DstPort: 8 << 8, IPVersion: v, Allowed: 1},
			audit.ObservedFlow{Src: p2, Dst: w, Protocol: flow.ProtoTCP, DstPort: 7070, IPVersion: v, Denied: 4},
			audit.ObservedFlow{Src: w, Dst: a, Protocol: flow.ProtoTCP, DstPort: 9999, IPVersion: v, Probes: 1},
		)
	}
	return out
}

func shuffled[T any](xs []T, seed uint64) []T {
	out := append([]T(nil), xs...)
	r := rand.New(rand.NewPCG(seed, seed))
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// recommend runs Recommend and fails the test on error.
func recommend(t testing.TB, view *enrich.Snapshot, flows []audit.ObservedFlow, opt Options) *Recommendation {
	t.Helper()
	rec, err := Recommend(view, flows, opt)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// yamlOf renders rec, failing the test on error.
func yamlOf(t testing.TB, rec *Recommendation) string {
	t.Helper()
	y, err := rec.YAML()
	if err != nil {
		t.Fatal(err)
	}
	return string(y)
}

// policyNamed returns the recommended policy ns/name.
func policyNamed(t testing.TB, rec *Recommendation, ns, name string) Policy {
	t.Helper()
	for _, p := range rec.Policies {
		if p.Policy.Namespace == ns && p.Policy.Name == name {
			return p
		}
	}
	t.Fatalf("no recommended policy %s/%s", ns, name)
	return Policy{}
}

// TestLabLeastPrivilege recommends for the default lab's traffic in
// each mode: the replay keeps every observed allowed flow group allowed
// in each family, probes and denied flows get no rule, the output is the
// same bytes whatever the order of the flows, and it decodes back into
// the same policies (what kubectl apply reads).
func TestLabLeastPrivilege(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			view := labView(t, mode)
			flows := labFlows(t, view, 0)
			rec := recommend(t, view, flows, Options{Mode: LeastPrivilege})
			y := yamlOf(t, rec)
			for seed := range uint64(5) {
				if y2 := yamlOf(t, recommend(t, view, shuffled(flows, seed), Options{Mode: LeastPrivilege})); y2 != y {
					t.Fatalf("seed %d: the YAML differs with the flows in another order:\n%s\n---- vs ----\n%s", seed, y, y2)
				}
			}
			decoded, err := audit.DecodePolicies("recommendation", strings.NewReader(y), "")
			if err != nil {
				t.Fatal(err)
			}
			if len(decoded) != len(rec.Policies) {
				t.Fatalf("the YAML holds %d policies, want %d", len(decoded), len(rec.Policies))
			}
			for i, p := range decoded {
				if !equality.Semantic.DeepEqual(p.Spec, rec.Policies[i].Policy.Spec) {
					t.Errorf("policy %s/%s: the YAML decodes to %+v, want %+v", p.Namespace, p.Name, p.Spec, rec.Policies[i].Policy.Spec)
				}
			}
			if _, err := policy.Compile(rec.NetworkPolicies()); err != nil {
				t.Fatalf("the recommendation does not compile: %v", err)
			}
			rep, err := Replay(view, rec.NetworkPolicies(), flows)
			if err != nil {
				t.Fatal(err)
			}
			fams := mode.Families()
			if len(rep.Families) != len(fams) {
				t.Fatalf("replay has %d families, want %d:\n%s", len(rep.Families), len(fams), rep)
			}
			for _, f := range rep.Families {
				if f.Kept != f.Allowed || len(f.NewlyDenied) > 0 || len(f.NewlyAllowed) > 0 || f.Allowed != 5 || f.Probes != 1 {
					t.Errorf("IPv%d: %d of %d kept, newly denied %v, newly allowed %v, %d probe groups; want 5 of 5, none, none, 1",
						f.Family, f.Kept, f.Allowed, f.NewlyDenied, f.NewlyAllowed, f.Probes)
				}
			}
			for _, want := range []string{"# 2 flow groups were only denied: no rule allows them.", "only traceflow probes: no rule allows them.",
				"port: udp-echo", "port: metrics", "kubernetes.io/metadata.name: frontend"} {
				if !strings.Contains(y, strings.Replace(want, "2 flow", fmt.Sprintf("%d flow", len(fams)), 1)) {
					t.Errorf("the YAML lacks %q:\n%s", want, y)
				}
			}
			for _, bad := range []string{"9999", "7070", "pod-template-hash", "topology.kubernetes.io"} {
				if strings.Contains(y, bad) {
					t.Errorf("the YAML has %q:\n%s", bad, y)
				}
			}
			// The node peer is named by all its addresses, the outside
			// client by each address seen.
			api := policyNamed(t, rec, "backend", "api-ingress")
			web := policyNamed(t, rec, "frontend", "web-ingress")
			var nodeBlocks, webBlocks []string
			for _, r := range api.Policy.Spec.Ingress {
				for _, pe := range r.From {
					if pe.IPBlock != nil {
						nodeBlocks = append(nodeBlocks, pe.IPBlock.CIDR)
					}
				}
			}
			for _, r := range web.Policy.Spec.Ingress {
				for _, pe := range r.From {
					webBlocks = append(webBlocks, pe.IPBlock.CIDR)
				}
			}
			var wantNode, wantWeb []string
			for _, f := range fams {
				if f == corev1.IPv6Protocol {
					wantNode, wantWeb = append(wantNode, "fd00:10::1/128"), append(wantWeb, "fd00:10:ffff::7/128")
				} else {
					wantNode, wantWeb = append(wantNode, "198.18.0.1/32"), append(wantWeb, "198.19.255.7/32")
				}
			}
			slices.Sort(nodeBlocks)
			slices.Sort(webBlocks)
			slices.Sort(wantNode)
			slices.Sort(wantWeb)
			if !slices.Equal(nodeBlocks, wantNode) || !slices.Equal(webBlocks, wantWeb) {
				t.Errorf("api's ipBlocks %v, web's %v; want %v and %v", nodeBlocks, webBlocks, wantNode, wantWeb)
			}
			if len(web.Policy.Spec.Ingress) != 1 {
				t.Errorf("web's ingress: %d rules, want one with the outside client's blocks of every family", len(web.Policy.Spec.Ingress))
			}
		})
	}
}

// TestServiceUsedOverOneFamily: a dual-stack Service whose client used
// IPv4 only gets a rule for its backends on the target port, which
// covers both families, and the comment says IPv6 was never observed.
func TestServiceUsedOverOneFamily(t *testing.T) {
	view := labView(t, manifest.ModeDual)
	flows := labFlows(t, view, 4)
	rec := recommend(t, view, flows, Options{Mode: LeastPrivilege, Scope: Scope{Namespace: "frontend", Workload: "web"}})
	if len(rec.Policies) != 2 {
		t.Fatalf("%d policies for one workload, want its ingress and egress", len(rec.Policies))
	}
	eg := policyNamed(t, rec, "frontend", "web-egress")
	if len(eg.Egress) != 1 || !strings.Contains(eg.Egress[0], "the backends of Service backend/api") || !strings.Contains(eg.Egress[0], "8080/TCP (Service port 80) over IPv4 (10 records); IPv6 never observed, the selector covers it") {
		t.Errorf("web's egress comments %q: want the Service's backends over IPv4 with IPv6 never observed", eg.Egress)
	}
	// Through the Service and from outside to web: what the lab's own
	// policies allow on api's side, and the recommendation on web's.
	var kept []audit.ObservedFlow
	for _, f := range flows {
		if f.DstPort == 8080 {
			kept = append(kept, f)
		}
	}
	rep, err := Replay(view, rec.NetworkPolicies(), kept)
	if err != nil {
		t.Fatal(err)
	}
	// The IPv6 flow that was never observed is allowed by the same rule.
	six := flows[0]
	for _, f := range labFlows(t, view, 6) {
		if f.ServiceName == "api" {
			six = f
		}
	}
	rep6, err := Replay(view, rec.NetworkPolicies(), []audit.ObservedFlow{six})
	if err != nil {
		t.Fatal(err)
	}
	if f := rep6.Families[0]; f.Family != 6 || f.Kept != 1 {
		t.Errorf("the IPv6 flow through the Service: %+v, want allowed", f)
	}
	for _, f := range rep.Families {
		if f.Kept != f.Allowed || f.Allowed == 0 {
			t.Errorf("IPv%d: %d of %d kept", f.Family, f.Kept, f.Allowed)
		}
	}
	// Seen denied over IPv6 (first in the list: the order does not
	// matter), the comment says so instead of "never observed".
	denied := six
	denied.Allowed, denied.Denied = 0, 3
	rec = recommend(t, view, append([]audit.ObservedFlow{denied}, flows...), Options{Mode: LeastPrivilege, Scope: Scope{Namespace: "frontend", Workload: "web"}})
	eg = policyNamed(t, rec, "frontend", "web-egress")
	if c := eg.Egress[0]; !strings.Contains(c, "over IPv4 (10 records); IPv6 observed only denied: the selector allows it too") || strings.Contains(c, "never observed") {
		t.Errorf("web's egress comment with IPv6 seen denied: %q", c)
	}
}

// TestScopeErrors: a scope without a workload of the view is an error.
func TestScopeErrors(t *testing.T) {
	view := labView(t, manifest.ModeIPv6)
	for _, s := range []Scope{{Namespace: "nope"}, {Namespace: "frontend", Workload: "nope"}, {Workload: "web"}} {
		if _, err := Recommend(view, nil, Options{Scope: s}); err == nil {
			t.Errorf("scope %+v: no error", s)
		}
	}
	if _, err := Recommend(view, nil, Options{Mode: "widest"}); err == nil {
		t.Error("mode widest: no error")
	}
}

// TestProbesFromOwnNode: kubelet probes reach a pod from its node's pod
// network gateway (a bridge CNI's): in three modes no rule is made for
// them (NetworkPolicy cannot restrict a pod's own node), a note says so,
// and the replay keeps them allowed. Scraped from the other node's
// address, the pod still gets that node's ipBlocks.
func TestProbesFromOwnNode(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			view := labView(t, mode)
			api := podOf(t, view, "backend", "api", "node-1")
			var n1, n2 *enrich.Node
			for _, n := range view.Nodes {
				switch n.Name {
				case "node-1":
					n1 = n
				case "node-2":
					n2 = n
				}
			}
			var flows []audit.ObservedFlow
			for _, v := range []uint8{4, 6} {
				a, ok := podEnd(view, api, v)
				if !ok {
					continue
				}
				cidr, _ := cidrOf(n1.PodCIDRs, v)
				gw := cidr.Addr().Next() // the bridge's address
				flows = append(flows, audit.ObservedFlow{Src: addrEnd(gw), Dst: a, Protocol: flow.ProtoTCP, DstPort: 8080, IPVersion: v, Allowed: 20})
				for _, na := range addrsOf(n2) {
					if flow.Version(na) == v {
						flows = append(flows, audit.ObservedFlow{Src: addrEnd(na), Dst: a, Protocol: flow.ProtoTCP, DstPort: 9090, IPVersion: v, Allowed: 5})
					}
				}
			}
			rec := recommend(t, view, flows, Options{Mode: LeastPrivilege, Scope: Scope{Namespace: "backend", Workload: "api"}})
			in := policyNamed(t, rec, "backend", "api-ingress")
			y := yamlOf(t, rec)
			if len(in.Policy.Spec.Ingress) != 1 || has(in.Ingress[0], "gateway") || has(y, "port: http") {
				t.Errorf("api's ingress has a rule for its own node's probes:\n%s", y)
			}
			if !slices.ContainsFunc(rec.Notes, func(n string) bool { return has(n, "came to pods from their own node") }) {
				t.Errorf("notes %q: want the own-node flows named", rec.Notes)
			}
			for _, a := range addrsOf(n2) {
				if !has(y, "cidr: "+netip.PrefixFrom(a, a.BitLen()).String()) {
					t.Errorf("no ipBlock for node-2's %s:\n%s", a, y)
				}
			}
			rep, err := Replay(view, rec.NetworkPolicies(), flows)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range rep.Families {
				if f.Kept != f.Allowed || f.Allowed != 2 {
					t.Errorf("IPv%d: %d of %d kept, want 2 of 2", f.Family, f.Kept, f.Allowed)
				}
			}
		})
	}
}
