package nft

import (
	"slices"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/lab/manifest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// fixture is the default dual-stack lab (2 nodes). On node-1:
// frontend web 198.18.1.10 / fd00:10:0:1::10, backend api .11 / ::11,
// tools probe-1 .12 / ::12; node-2 holds the same at 198.18.2.x.
func fixture(t *testing.T, mode manifest.Mode, pols ...networkingv1.NetworkPolicy) *manifest.Manifest {
	t.Helper()
	m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	m.NetworkPolicies = pols
	return m
}

func apiPod(t *testing.T, m *manifest.Manifest, node string) *corev1.Pod {
	t.Helper()
	for _, p := range m.PodsOnNode(node) {
		if p.Labels["app"] == "api" {
			return p
		}
	}
	t.Fatalf("no api pod on %s", node)
	return nil
}

func pol(ns, name string, sel map[string]string, types []networkingv1.PolicyType, in []networkingv1.NetworkPolicyIngressRule, eg []networkingv1.NetworkPolicyEgressRule) networkingv1.NetworkPolicy {
	return networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: sel}, PolicyTypes: types, Ingress: in, Egress: eg,
		},
	}
}

var (
	tcp, udp, sctp = corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP
	ingressOnly    = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly     = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
)

func port(p intstr.IntOrString, proto *corev1.Protocol) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Port: &p, Protocol: proto}
}

func TestRenderPolicies(t *testing.T) {
	api := map[string]string{"app": "api"}
	tests := []struct {
		name    string
		mode    manifest.Mode
		pols    []networkingv1.NetworkPolicy
		want    []string // lines (trimmed) that must appear
		notWant []string // substrings that must not appear
	}{
		{
			name: "default deny ingress: only the drop rule",
			mode: manifest.ModeDual,
			pols: []networkingv1.NetworkPolicy{pol("backend", "deny", nil, ingressOnly, nil, nil)},
			want: []string{
				`counter name drop/ingress/backend/API log prefix "drop/ingress/backend/API" group 100 drop comment "drop/ingress/backend/API"`,
				`oifname vmap { "IFACE" : jump ingress/backend/API } comment "ingress policy of local pods"`,
			},
			notWant: []string{"accept comment \"backend/deny", "egress/backend"},
		},
		{
			name: "pod selector, numeric port, IPv4 row",
			mode: manifest.ModeIPv4,
			pols: []networkingv1.NetworkPolicy{pol("backend", "p", api, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: api}}},
				Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromInt32(8080), &tcp)},
			}}, nil)},
			want:    []string{`ip saddr { 198.18.1.11, 198.18.2.11 } tcp dport 8080 counter name backend/p/ingress/0 accept comment "backend/p/ingress/0"`},
			notWant: []string{"ip6 saddr"},
		},
		{
			name: "pod selector, numeric port, IPv6 row",
			mode: manifest.ModeIPv6,
			pols: []networkingv1.NetworkPolicy{pol("backend", "p", api, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: api}}},
				Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromInt32(8080), nil)},
			}}, nil)},
			want:    []string{`ip6 saddr { fd00:10:0:1::11, fd00:10:0:2::11 } tcp dport 8080 counter name backend/p/ingress/0 accept comment "backend/p/ingress/0"`},
			notWant: []string{"ip saddr"},
		},
		{
			name: "namespace selector and named port, dual-stack",
			mode: manifest.ModeDual,
			pols: []networkingv1.NetworkPolicy{pol("backend", "ns", api, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "ops"}}}},
				Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromString("metrics"), &tcp)},
			}}, nil)},
			want: []string{
				`ip saddr { 198.18.1.12, 198.18.2.12 } tcp dport 9090 counter name backend/ns/ingress/0 accept comment "backend/ns/ingress/0"`,
				`ip6 saddr { fd00:10:0:1::12, fd00:10:0:2::12 } tcp dport 9090 counter name backend/ns/ingress/0 accept comment "backend/ns/ingress/0"`,
			},
		},
		{
			name: "namespace and pod selector in one peer",
			mode: manifest.ModeDual,
			pols: []networkingv1.NetworkPolicy{pol("backend", "both", api, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "team", Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "ops"}}}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				}},
			}}, nil)},
			want: []string{
				`ip saddr { 198.18.1.10, 198.18.2.10 } counter name backend/both/ingress/0 accept comment "backend/both/ingress/0"`,
				`ip6 saddr { fd00:10:0:1::10, fd00:10:0:2::10 } counter name backend/both/ingress/0 accept comment "backend/both/ingress/0"`,
			},
			notWant: []string{"198.18.1.12"},
		},
		{
			name: "ipBlock with except, IPv4 only: the dual-stack gap",
			mode: manifest.ModeDual,
			pols: []networkingv1.NetworkPolicy{pol("backend", "blk", api, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "198.18.0.0/16", Except: []string{"198.18.2.0/24", "fd00:10:0:2::/64"}}}},
				Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromInt32(9090), &tcp)},
			}}, nil)},
			want:    []string{`ip saddr 198.18.0.0/16 ip saddr != { 198.18.2.0/24 } tcp dport 9090 counter name backend/blk/ingress/0 accept comment "backend/blk/ingress/0"`},
			notWant: []string{"ip6 saddr", "fd00:10:0:2::/64"},
		},
		{
			name: "ipBlock with except, IPv6",
			mode: manifest.ModeIPv6,
			pols: []networkingv1.NetworkPolicy{pol("backend", "blk6", api, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10::/56", Except: []string{"fd00:10:0:2::/64", "fd00:10:0:3::/64"}}}},
			}}, nil)},
			want: []string{`ip6 saddr fd00:10::/56 ip6 saddr != { fd00:10:0:2::/64, fd00:10:0:3::/64 } counter name backend/blk6/ingress/0 accept comment "backend/blk6/ingress/0"`},
		},
		{
			name: "endPort range and protocol without port",
			mode: manifest.ModeDual,
			pols: []networkingv1.NetworkPolicy{pol("backend", "rng", api, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{
				Ports: []networkingv1.NetworkPolicyPort{
					{Protocol: &tcp, Port: new(intstr.FromInt32(7000)), EndPort: new(int32(7100))},
					{Protocol: &udp},
					{Protocol: &sctp, Port: new(intstr.FromInt32(5000))},
				},
			}}, nil)},
			want: []string{
				`meta nfproto ipv4 tcp dport 7000-7100 counter name backend/rng/ingress/0 accept comment "backend/rng/ingress/0"`,
				`meta nfproto ipv6 tcp dport 7000-7100 counter name backend/rng/ingress/0 accept comment "backend/rng/ingress/0"`,
				`meta nfproto ipv6 meta l4proto udp counter name backend/rng/ingress/0 accept comment "backend/rng/ingress/0"`,
				`meta nfproto ipv4 sctp dport 5000 counter name backend/rng/ingress/0 accept comment "backend/rng/ingress/0"`,
			},
		},
		{
			name: "empty ingress rule allows everything",
			mode: manifest.ModeDual,
			pols: []networkingv1.NetworkPolicy{pol("backend", "all", api, nil, []networkingv1.NetworkPolicyIngressRule{{}}, nil)},
			want: []string{
				`meta nfproto ipv4 counter name backend/all/ingress/0 accept comment "backend/all/ingress/0"`,
				`meta nfproto ipv6 counter name backend/all/ingress/0 accept comment "backend/all/ingress/0"`,
			},
		},
		{
			name: "egress: named port resolved on destination pods, return verdict",
			mode: manifest.ModeDual,
			pols: []networkingv1.NetworkPolicy{pol("tools", "eg", nil, egressOnly, nil, []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}}},
				Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromString("metrics"), &tcp)},
			}})},
			want: []string{
				`ip daddr { 198.18.1.10, 198.18.1.11, 198.18.1.12, 198.18.2.10, 198.18.2.11, 198.18.2.12 } ip daddr { 198.18.1.11, 198.18.2.11 } tcp dport 9090 counter name tools/eg/egress/0 return comment "tools/eg/egress/0"`,
				`ip6 daddr { fd00:10:0:1::10, fd00:10:0:1::11, fd00:10:0:1::12, fd00:10:0:2::10, fd00:10:0:2::11, fd00:10:0:2::12 } ip6 daddr { fd00:10:0:1::11, fd00:10:0:2::11 } tcp dport 9090 counter name tools/eg/egress/0 return comment "tools/eg/egress/0"`,
				`counter name drop/egress/tools/probe-1 log prefix "drop/egress/tools/probe-1" group 100 drop comment "drop/egress/tools/probe-1"`,
				`iifname vmap { "PROBEIFACE" : jump egress/tools/probe-1 } comment "egress policy of local pods"`,
			},
			notWant: []string{"probe-2"},
		},
		{
			name: "egress ipBlock v4 and v6 with except",
			mode: manifest.ModeDual,
			pols: []networkingv1.NetworkPolicy{pol("tools", "eb", nil, egressOnly, nil, []networkingv1.NetworkPolicyEgressRule{{
				To: []networkingv1.NetworkPolicyPeer{
					{IPBlock: &networkingv1.IPBlock{CIDR: "198.18.0.0/16", Except: []string{"198.18.1.0/24"}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10::/56", Except: []string{"fd00:10:0:1::/64"}}},
				},
				Ports: []networkingv1.NetworkPolicyPort{port(intstr.FromInt32(53), &udp)},
			}})},
			want: []string{
				`ip daddr 198.18.0.0/16 ip daddr != { 198.18.1.0/24 } udp dport 53 counter name tools/eb/egress/0 return comment "tools/eb/egress/0"`,
				`ip6 daddr fd00:10::/56 ip6 daddr != { fd00:10:0:1::/64 } udp dport 53 counter name tools/eb/egress/0 return comment "tools/eb/egress/0"`,
			},
		},
		{
			name: "policy types defaulted from egress rules",
			mode: manifest.ModeIPv6,
			pols: []networkingv1.NetworkPolicy{pol("backend", "def", api, nil, nil, []networkingv1.NetworkPolicyEgressRule{{}})},
			want: []string{
				`meta nfproto ipv6 counter name backend/def/egress/0 return comment "backend/def/egress/0"`,
				`counter name drop/ingress/backend/API log prefix`,
				`counter name drop/egress/backend/API log prefix`,
			},
		},
		{
			name:    "peer selecting no pod adds no rule",
			mode:    manifest.ModeDual,
			pols:    []networkingv1.NetworkPolicy{pol("backend", "none", api, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "nope"}}}}}}, nil)},
			want:    []string{`counter backend/none/ingress/0 {`},
			notWant: []string{`accept comment "backend/none/ingress/0"`},
		},
		{
			name:    "policy in another namespace selects nothing here",
			mode:    manifest.ModeDual,
			pols:    []networkingv1.NetworkPolicy{pol("frontend", "deny", nil, ingressOnly, nil, nil)},
			want:    []string{`counter name drop/ingress/frontend/`},
			notWant: []string{"drop/ingress/backend"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := fixture(t, tc.mode, tc.pols...)
			out, err := Render(m, "node-1", Options{})
			if err != nil {
				t.Fatal(err)
			}
			api := apiPod(t, m, "node-1")
			probe := m.Pods[slices.IndexFunc(m.Pods, func(p corev1.Pod) bool { return p.Name == "probe-1" })]
			lines := map[string]bool{}
			for l := range strings.Lines(out) {
				lines[strings.TrimSpace(l)] = true
			}
			r := strings.NewReplacer("API", api.Name, "PROBEIFACE", probe.Annotations[manifest.AnnotationHostIface], "IFACE", api.Annotations[manifest.AnnotationHostIface])
			for _, w := range tc.want {
				w = r.Replace(w)
				if strings.HasSuffix(w, "log prefix") || strings.HasSuffix(w, "{") || strings.HasSuffix(w, "/") {
					if !strings.Contains(out, w) {
						t.Errorf("missing %q in\n%s", w, out)
					}
					continue
				}
				if !lines[w] {
					t.Errorf("missing line %q in\n%s", w, out)
				}
			}
			for _, nw := range tc.notWant {
				if strings.Contains(out, r.Replace(nw)) {
					t.Errorf("unexpected %q in\n%s", nw, out)
				}
			}
		})
	}
}

func TestRenderServices(t *testing.T) {
	tests := []struct {
		name    string
		mode    manifest.Mode
		want    []string
		notWant []string
	}{
		{
			name: "IPv4",
			mode: manifest.ModeIPv4,
			want: []string{
				"ip daddr 198.19.0.11 tcp dport 80 jump svc/backend/api/http/v4",
				"ip daddr 198.19.0.11 udp dport 53 jump svc/backend/api/udp-echo/v4",
				"numgen random mod 2 vmap { 0 : jump ep/backend/api/http/v4/0, 1 : jump ep/backend/api/http/v4/1 }",
				`meta l4proto tcp counter dnat ip to 198.18.2.11:8080 comment "endpoint 198.18.2.11:8080 of backend/api/http/v4"`,
				`meta l4proto udp counter dnat ip to 198.18.1.11:5353 comment "endpoint 198.18.1.11:5353 of backend/api/udp-echo/v4"`,
			},
			notWant: []string{"ip6 daddr"},
		},
		{
			name: "IPv6",
			mode: manifest.ModeIPv6,
			want: []string{
				"ip6 daddr fd00:10:ff::11 tcp dport 80 jump svc/backend/api/http/v6",
				`meta l4proto tcp counter dnat ip6 to [fd00:10:0:2::11]:8080 comment "endpoint [fd00:10:0:2::11]:8080 of backend/api/http/v6"`,
				"ip6 daddr fd00:10:ff::12 tcp dport 8080 jump svc/backend/api-single/http/v6",
			},
			notWant: []string{"ip daddr"},
		},
		{
			name: "dual: single-stack service has no IPv6 DNAT",
			mode: manifest.ModeDual,
			want: []string{
				"ip daddr 198.19.0.12 tcp dport 8080 jump svc/backend/api-single/http/v4",
				"ip6 daddr fd00:10:ff::10 tcp dport 80 jump svc/frontend/web/http/v6",
			},
			notWant: []string{"api-single/http/v6"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := fixture(t, tc.mode)
			out, err := Render(m, "node-2", Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("missing %q in\n%s", w, out)
				}
			}
			for _, nw := range tc.notWant {
				if strings.Contains(out, nw) {
					t.Errorf("unexpected %q", nw)
				}
			}
		})
	}
}

func TestRenderServiceWithoutEndpoints(t *testing.T) {
	m := fixture(t, manifest.ModeDual)
	m.EndpointSlices = nil
	out, err := Render(m, "node-1", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		`ip daddr 198.19.0.11 tcp dport 80 counter reject comment "no endpoints backend/api/http/v4"`,
		`ip6 daddr fd00:10:ff::11 tcp dport 80 counter reject comment "no endpoints backend/api/http/v6"`,
	} {
		if !strings.Contains(out, w) {
			t.Errorf("missing %q", w)
		}
	}
}

func TestRenderUnknownNode(t *testing.T) {
	if _, err := Render(fixture(t, manifest.ModeDual), "node-9", Options{}); err == nil {
		t.Fatal("want error for unknown node")
	}
}

func TestRenderBadIPBlock(t *testing.T) {
	api := map[string]string{"app": "api"}
	m := fixture(t, manifest.ModeDual, pol("backend", "bad", api, ingressOnly, []networkingv1.NetworkPolicyIngressRule{{
		From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "not-a-cidr"}}},
	}}, nil))
	if _, err := Render(m, "node-1", Options{}); err == nil {
		t.Fatal("want error for a bad CIDR")
	}
}

func TestNames(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{RuleName("backend", "allow-web", Ingress, 0), "backend/allow-web/ingress/0"},
		{RuleName("backend", "a.b", Egress, 12), "backend/a.b/egress/12"},
		{RuleName("1ns", "p", Ingress, 0), "_1ns/p/ingress/0"},
		{DropName(Ingress, "backend", "api-1"), "drop/ingress/backend/api-1"},
		{ident("a:b[c]"), "a_b_c_"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
	long := ident(strings.Repeat("x", 400))
	if len(long) != maxName || long == ident(strings.Repeat("x", 401)) {
		t.Errorf("long names must be cut to %d bytes and stay unique: %q", maxName, long)
	}
}
