package recommend

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// TestLabCloseGaps: the lab's IPv4-only metrics rule (198.18.0.0/16
// except node-2's pod CIDR) gets, in dual mode, node-1's IPv6 pod CIDR
// and the nodes' IPv6 addresses, node-2's pods staying excepted; the
// replay then allows metrics from web (node-1) over IPv6 and still
// denies them from probe-2 (node-2). A single-stack lab has no gap to
// close.
func TestLabCloseGaps(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			view := labView(t, mode)
			rec := recommend(t, view, nil, Options{Mode: CloseGaps, Scope: Scope{Namespace: "backend"}})
			if mode != manifest.ModeDual {
				if len(rec.Policies) != 0 {
					t.Fatalf("%d policies changed in a single-stack lab", len(rec.Policies))
				}
				return
			}
			if len(rec.Policies) != 1 {
				t.Fatalf("%d policies, want allow-metrics-ipv4-only only:\n%s", len(rec.Policies), yamlOf(t, rec))
			}
			p := rec.Policies[0]
			if p.Policy.Name != "allow-metrics-ipv4-only" || p.Policy.ResourceVersion != "" {
				t.Fatalf("policy %s (resourceVersion %q), want allow-metrics-ipv4-only without server fields", p.Policy.Name, p.Policy.ResourceVersion)
			}
			var cidrs []string
			for _, pe := range p.Policy.Spec.Ingress[0].From {
				cidrs = append(cidrs, pe.IPBlock.CIDR)
			}
			want := []string{"198.18.0.0/16", "fd00:10::1/128", "fd00:10::2/128", "fd00:10:0:1::/64"}
			if !slices.Equal(cidrs, want) {
				t.Errorf("ipBlocks %v, want %v", cidrs, want)
			}
			y := yamlOf(t, rec)
			if !has(y, "added their IPv6 counterpart") || !has(y, "node-2's pods stay excepted") {
				t.Errorf("the comment does not say what was added:\n%s", y)
			}
			api := podOf(t, view, "backend", "api", "node-2")
			web := podOf(t, view, "frontend", "web", "node-1")
			probe2 := podOf(t, view, "tools", "probe-2", "")
			a, _ := podEnd(view, api, 6)
			w, _ := podEnd(view, web, 6)
			p2, _ := podEnd(view, probe2, 6)
			flows := []audit.ObservedFlow{
				{Src: w, Dst: a, Protocol: flow.ProtoTCP, DstPort: 9090, IPVersion: 6, Denied: 3},
				{Src: p2, Dst: a, Protocol: flow.ProtoTCP, DstPort: 9090, IPVersion: 6, Denied: 3},
			}
			rep, err := Replay(view, rec.NetworkPolicies(), flows)
			if err != nil {
				t.Fatal(err)
			}
			if f := rep.Families[0]; len(f.NewlyAllowed) != 1 || f.NewlyAllowed[0].Src.Pod != web.Name {
				t.Errorf("newly allowed %v, want web's metrics over IPv6 only", f.NewlyAllowed)
			}
		})
	}
}

// TestCloseGapsWorkloadScope: a workload's scope keeps the policies that
// select its pods: api's metrics rule is closed, web has none to close.
func TestCloseGapsWorkloadScope(t *testing.T) {
	view := labView(t, manifest.ModeDual)
	api := recommend(t, view, nil, Options{Mode: CloseGaps, Scope: Scope{Namespace: "backend", Workload: "api"}})
	if len(api.Policies) != 1 || api.Policies[0].Policy.Name != "allow-metrics-ipv4-only" {
		t.Errorf("api: %d policies, want allow-metrics-ipv4-only", len(api.Policies))
	}
	web := recommend(t, view, nil, Options{Mode: CloseGaps, Scope: Scope{Namespace: "frontend", Workload: "web"}})
	if len(web.Policies) != 0 {
		t.Errorf("web: %d policies, want none", len(web.Policies))
	}
}

// TestAuditAfter: the static audit of the lab's policies with a
// recommendation. Least-privilege for the cluster leaves no workload
// unprotected; close-gaps removes the one-family ipBlock finding of the
// metrics rule in dual mode.
func TestAuditAfter(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			view := labView(t, mode)
			kinds := func(fs []audit.Finding) map[string]int {
				out := map[string]int{}
				for _, f := range fs {
					out[f.Kind]++
				}
				return out
			}
			before, err := Audit(view, nil, Scope{})
			if err != nil {
				t.Fatal(err)
			}
			lp := recommend(t, view, labFlows(t, view, 0), Options{Mode: LeastPrivilege})
			after, err := Audit(view, lp.NetworkPolicies(), Scope{})
			if err != nil {
				t.Fatal(err)
			}
			b, a := kinds(before), kinds(after)
			if b[audit.KindUnprotectedIngress] == 0 || a[audit.KindUnprotectedIngress]+a[audit.KindUnprotectedEgress] != 0 {
				t.Errorf("unprotected before %v, after least-privilege %v: want some, then none", b, a)
			}
			cg := recommend(t, view, nil, Options{Mode: CloseGaps})
			closed, err := Audit(view, cg.NetworkPolicies(), Scope{})
			if err != nil {
				t.Fatal(err)
			}
			if c := kinds(closed); c[audit.KindIPBlockOneFamily] != 0 || mode == manifest.ModeDual && b[audit.KindIPBlockOneFamily] == 0 {
				t.Errorf("one-family ipBlock findings before %d, after close-gaps %d: want some in dual mode, then none", b[audit.KindIPBlockOneFamily], c[audit.KindIPBlockOneFamily])
			}
		})
	}
}

// TestDiff: the diff against the policies in force, in three modes.
// Least-privilege adds policies: api's ingress was isolated by the lab's
// default deny (which still adds up), web's egress by none. Close-gaps
// (dual only) replaces the metrics policy, and its unified diff adds the
// IPv6 blocks and nothing else.
func TestDiff(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			view := labView(t, mode)
			diff := func(rec *Recommendation) []PolicyDiff {
				_, docs, err := rec.render()
				if err != nil {
					t.Fatal(err)
				}
				d, err := Diff(view, rec, docs)
				if err != nil {
					t.Fatal(err)
				}
				if len(d) != len(rec.Policies) {
					t.Fatalf("%d diffs for %d policies", len(d), len(rec.Policies))
				}
				return d
			}
			byName := map[string]PolicyDiff{}
			for _, d := range diff(recommend(t, view, labFlows(t, view, 0), Options{Mode: LeastPrivilege})) {
				if d.Change != Added || d.Current != "" || d.Unified != "" || !has(d.Proposed, "kind: NetworkPolicy") || !has(d.Proposed, "name: "+d.Name) {
					t.Errorf("%s/%s: %+v, want added with its YAML", d.Namespace, d.Name, d)
				}
				byName[d.Namespace+"/"+d.Name] = d
			}
			api, web := byName["backend/api-ingress"], byName["frontend/web-egress"]
			if s := strings.Join(api.Summary, "\n"); !has(s, "isolates the ingress of Deployment backend/api") || !has(s, "already isolated by backend/allow-metrics-ipv4-only, backend/allow-web-to-api, backend/default-deny-ingress, which still allow") || !has(s, "from pods {app=web} of frontend") {
				t.Errorf("api-ingress summary:\n%s", s)
			}
			if s := strings.Join(web.Summary, "\n"); !has(s, "no policy isolated it") || !has(s, "Egress rule 0 allows") {
				t.Errorf("web-egress summary:\n%s", s)
			}
			cg := diff(recommend(t, view, nil, Options{Mode: CloseGaps, Scope: Scope{Namespace: "backend"}}))
			if mode != manifest.ModeDual {
				return
			}
			if len(cg) != 1 || cg[0].Change != Changed || !has(cg[0].Current, "198.18.0.0/16") {
				t.Fatalf("close-gaps diff %+v, want allow-metrics-ipv4-only changed", cg)
			}
			var plus, minus []string
			for _, l := range strings.Split(cg[0].Unified, "\n") {
				switch {
				case strings.HasPrefix(l, "+++"), strings.HasPrefix(l, "---"):
				case strings.HasPrefix(l, "+") && !strings.HasPrefix(strings.TrimSpace(l[1:]), "#"):
					plus = append(plus, strings.TrimSpace(l[1:]))
				case strings.HasPrefix(l, "-"):
					minus = append(minus, l)
				}
			}
			if len(minus) != 0 || !slices.Contains(plus, "cidr: fd00:10:0:1::/64") || !slices.Contains(plus, "cidr: fd00:10::2/128") {
				t.Errorf("unified diff removes %q, adds %q:\n%s", minus, plus, cg[0].Unified)
			}
			if s := strings.Join(cg[0].Summary, "\n"); !has(s, "Ingress rule 0 (TCP/") || !has(s, "ipBlock fd00:10:0:1::/64") {
				t.Errorf("close-gaps summary:\n%s", s)
			}
		})
	}
}

// TestCloseGapsMixedFamilies: a rule with blocks of both families that
// cover node-2's pods over IPv4 only (198.18.0.0/16 holds both nodes'
// IPv4 pod CIDRs and addresses, fd00:10:0:1::/64 is node-1's IPv6 pod
// CIDR) gets node-2's IPv6 pod CIDR and the nodes' IPv6 addresses, and
// nothing for the IPv6 block, whose IPv4 counterpart is covered already.
// The replay then allows node-2's pods over IPv6 too.
func TestCloseGapsMixedFamilies(t *testing.T) {
	view := labView(t, manifest.ModeDual)
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(8080)
	mixed := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "backend", Name: "mixed-blocks", ResourceVersion: "7"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "198.18.0.0/16"}}, {IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10:0:1::/64"}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		},
	}
	view.NetworkPolicies = append(slices.Clone(view.NetworkPolicies), mixed)
	rec := recommend(t, view, nil, Options{Mode: CloseGaps, Scope: Scope{Namespace: "backend", Workload: "api"}})
	var got *Policy
	for i := range rec.Policies {
		if rec.Policies[i].Policy.Name == "mixed-blocks" {
			got = &rec.Policies[i]
		}
	}
	if got == nil {
		t.Fatalf("mixed-blocks not changed:\n%s", yamlOf(t, rec))
	}
	var n2 netip.Prefix
	for _, n := range view.Nodes {
		if n.Name == "node-2" {
			n2, _ = cidrOf(n.PodCIDRs, 6)
		}
	}
	var cidrs []string
	for _, pe := range got.Policy.Spec.Ingress[0].From {
		cidrs = append(cidrs, pe.IPBlock.CIDR)
	}
	want := []string{"198.18.0.0/16", "fd00:10:0:1::/64", "fd00:10::1/128", "fd00:10::2/128", n2.String()}
	if !slices.Equal(cidrs, want) {
		t.Errorf("ipBlocks %v, want %v", cidrs, want)
	}
	if c := got.Ingress[0]; !has(c, "The IPv4 ipBlocks of this rule cover pods or nodes its IPv6 ipBlocks do not") || has(c, "IPv4 counterpart") {
		t.Errorf("comment %q", c)
	}
	api := podOf(t, view, "backend", "api", "node-1")
	probe2 := podOf(t, view, "tools", "probe-2", "")
	a, _ := podEnd(view, api, 6)
	p2, _ := podEnd(view, probe2, 6)
	flows := []audit.ObservedFlow{{Src: p2, Dst: a, Protocol: flow.ProtoTCP, DstPort: 8080, IPVersion: 6, Denied: 1}}
	for _, tc := range []struct {
		proposed []*networkingv1.NetworkPolicy
		allowed  int
	}{{nil, 0}, {rec.NetworkPolicies(), 1}} {
		rep, err := Replay(view, tc.proposed, flows)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(rep.Families[0].NewlyAllowed); n != tc.allowed {
			t.Errorf("probe-2 (node-2) to api over IPv6 with %d proposed policies: %d newly allowed, want %d", len(tc.proposed), n, tc.allowed)
		}
	}
}
