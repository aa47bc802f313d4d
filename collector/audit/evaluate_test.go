package audit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/lab/manifest"
)

// labEvaluator evaluates the default lab of mode with 2 nodes, changed
// by edit if given.
func labEvaluator(t testing.TB, mode manifest.Mode, edit ...func(*manifest.Manifest)) PolicyEvaluator {
	t.Helper()
	m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range edit {
		e(m)
	}
	inv := enrich.NewSnapshot(m.Objects()...)
	set, err := policy.Compile(inv.NetworkPolicies)
	if err != nil {
		t.Fatal(err)
	}
	return PolicyEvaluator{
		Policies: func() *policy.Set { return set },
		Resolver: ClusterResolver{
			Cluster: func() (*enrich.Snapshot, error) { return inv, nil },
		},
	}
}

// TestPolicyEvaluatorLab checks the cases of issue 19 in each lab mode:
// a Service is evaluated in its families and on its ports only, a
// workload cell covers every pod pair, a pod is never paired with itself,
// and an unknown endpoint is a clear error.
func TestPolicyEvaluatorLab(t *testing.T) {
	web := Endpoint{Kind: "workload", Namespace: manifest.NSFrontend, Name: "web"}
	api := Endpoint{Kind: "workload", Namespace: manifest.NSBackend, Name: "api"}
	single := Endpoint{Kind: "service", Namespace: manifest.NSBackend, Name: manifest.ServiceAPISingle}
	apiSvc := Endpoint{Kind: "service", Namespace: manifest.NSBackend, Name: manifest.ServiceAPI}
	missing := Endpoint{Kind: "workload", Namespace: "shop", Name: "frontend"}
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			ev := labEvaluator(t, mode)
			m, err := ev.EvaluateMatrix(context.Background(), []Endpoint{web, api}, []Endpoint{single, api, apiSvc, missing}, 6, 8080)
			if err != nil {
				t.Fatal(err)
			}
			m9090, err := ev.EvaluateMatrix(context.Background(), []Endpoint{web}, []Endpoint{single, api, apiSvc}, 6, 9090)
			if err != nil {
				t.Fatal(err)
			}
			// The single-stack Service has the mode's first family only.
			first := 4
			if mode == manifest.ModeIPv6 {
				first = 6
			}
			for _, fam := range []int{4, 6} {
				has := mode == manifest.ModeDual || fam == first
				got := m[0][0][fam]
				switch {
				case fam != first:
					if got.Outcome != OutcomeNoFamily || !strings.Contains(got.Reason, "no IPv"+string(rune('0'+fam))+" ClusterIP") {
						t.Errorf("web → api-single:8080 IPv%d: %+v, want no ClusterIP", fam, got)
					}
					if g := m9090[0][0][fam]; g.Outcome != OutcomeNoFamily {
						t.Errorf("web → api-single:9090 IPv%d: %+v, want no ClusterIP", fam, g)
					}
				default:
					if got.Outcome != OutcomeAllow || got.Total != 4 || got.Allowed != 4 || len(got.Pairs) != 4 || got.Pairs[0].Port != 8080 {
						t.Errorf("web → api-single:8080 IPv%d: %+v, want 4 pairs allowed", fam, got)
					}
					if g := m9090[0][0][fam]; g.Outcome != OutcomeNoPort || !strings.Contains(g.Reason, "no port 9090/TCP") {
						t.Errorf("web → api-single:9090 IPv%d: %+v, want no such port", fam, g)
					}
				}
				// web → api on 9090: the metrics policy admits IPv4 from
				// node 1's pod CIDR only: 2 of 4 pairs over IPv4, none
				// over IPv6.
				for _, c := range []*FamilyPolicy{m9090[0][1][fam], m9090[0][2][fam]} {
					switch {
					case !has:
						if c.Outcome != OutcomeUnavailable && c.Outcome != OutcomeNoFamily {
							t.Errorf("web → api:9090 IPv%d without the family: %+v", fam, c)
						}
					case fam == 4:
						if c.Outcome != OutcomePartial || c.Allowed != 2 || c.Total != 4 || c.Summary.Verdict != OutcomePartial {
							t.Errorf("web → api:9090 IPv4: %+v, want partial 2/4", c)
						}
					default:
						if c.Outcome != OutcomeDeny || c.Total != 4 {
							t.Errorf("web → api:9090 IPv6: %+v, want deny 0/4", c)
						}
					}
					// A denied pair says why (Auditor.Explain's sentence),
					// an allowed one does not.
					for _, p := range c.Pairs {
						want := "ingress denied by backend/default-deny-ingress, which isolates " + p.Dst
						if (p.Verdict == "denied") != strings.HasPrefix(p.Explanation, want) ||
							(fam == 6 && !strings.HasSuffix(p.Explanation, "nearest: backend/allow-metrics-ipv4-only rule 0 matches 9090/TCP but has no IPv6 ipBlock")) {
							t.Errorf("web → api:9090 IPv%d pair %+v: explanation %q", fam, p, p.Explanation)
						}
					}
				}
				if !has {
					continue
				}
				// api → api: 2 pods, 2 pairs (never a pod to itself),
				// denied by the default deny.
				if c := m[1][1][fam]; c.Outcome != OutcomeDeny || c.Total != 2 || c.Pairs[0].Src == c.Pairs[0].Dst {
					t.Errorf("api → api IPv%d: %+v, want 2 pairs denied", fam, c)
				}
				// web → service api:8080 has no such port (80 → http).
				if c := m[0][2][fam]; c.Outcome != OutcomeNoPort {
					t.Errorf("web → service api:8080 IPv%d: %+v", fam, c)
				}
				if c := m[0][3][fam]; c.Outcome != OutcomeError || !strings.Contains(c.Reason, "workload shop/frontend not found") {
					t.Errorf("web → missing IPv%d: %+v", fam, c)
				}
			}
			// Port 80 of Service api reaches the named target port http
			// (8080) on every backend.
			m80, err := ev.EvaluateMatrix(context.Background(), []Endpoint{web}, []Endpoint{apiSvc}, 6, 80)
			if err != nil {
				t.Fatal(err)
			}
			if c := m80[0][0][first]; c.Outcome != OutcomeAllow || c.Total != 4 || c.Pairs[0].Port != 8080 || c.Pairs[0].ServicePort != 80 {
				t.Errorf("web → service api:80: %+v", c)
			}
			// A pod to itself only is not evaluated.
			p := m80[0][0][first].Pairs[0].Dst
			ns, name, _ := strings.Cut(p, "/")
			self, err := ev.EvaluateMatrix(context.Background(), []Endpoint{{Kind: "pod", Namespace: ns, Name: name}}, []Endpoint{{Kind: "pod", Namespace: ns, Name: name}}, 6, 8080)
			if err != nil {
				t.Fatal(err)
			}
			if c := self[0][0][first]; c.Outcome != OutcomeSelf {
				t.Errorf("pod to itself: %+v", c)
			}
		})
	}
}

// TestPolicyEvaluatorBounds: a matrix of too many pod pairs is refused
// (*TooLargeError, which the web answers 422) before anything is
// evaluated; an ip prefix is not evaluated (its cell sums up the flows)
// but says why; an address of a pod is that pod.
func TestPolicyEvaluatorBounds(t *testing.T) {
	var objs []runtime.Object
	for i := range 320 {
		p := pod("big", fmt.Sprintf("w-%d", i), nil, []string{netip.AddrFrom4([4]byte{198, 18, byte(1 + i/200), byte(i % 200)}).String(), fmt.Sprintf("fd00:10:0:1::%x", i+1)})
		p.OwnerReferences = []metav1.OwnerReference{{Kind: "StatefulSet", Name: "w", Controller: ptr(true)}}
		objs = append(objs, p)
	}
	inv := enrich.NewSnapshot(objs...)
	ev := PolicyEvaluator{Resolver: ClusterResolver{Cluster: func() (*enrich.Snapshot, error) { return inv, nil }}}
	w := Endpoint{Kind: "workload", Namespace: "big", Name: "w"}
	_, err := ev.EvaluateMatrix(context.Background(), []Endpoint{w, w}, []Endpoint{w}, 6, 80)
	var tl *TooLargeError
	if !errors.As(err, &tl) || tl.Field != "destinations" || !strings.Contains(tl.Message, "409600 pod pairs") {
		t.Errorf("too many pairs: %v", err)
	}
	m, err := ev.EvaluateMatrix(context.Background(), []Endpoint{{Kind: "ip", Name: "198.18.1.5"}}, []Endpoint{{Kind: "ip", Name: "fd00:10::/64"}, w}, 6, 80)
	if err != nil {
		t.Fatal(err)
	}
	if f := m[0][0][4]; f.Outcome != "" || !strings.Contains(f.Reason, "not a prefix") {
		t.Errorf("prefix: %+v", f)
	}
	// 198.18.1.5 is pod w-5: its pairs to the other 319 pods, not to
	// itself; it has no IPv6 address as an ip endpoint.
	if f := m[0][1][4]; f.Outcome != OutcomeAllow || f.Total != 319 || len(f.Pairs) != maxListedPairs || !f.Truncated || f.Pairs[0].Src != "big/w-5" {
		t.Errorf("pod address → workload: %s %d/%d %d listed %v", f.Outcome, f.Allowed, f.Total, len(f.Pairs), f.Truncated)
	}
	if f := m[0][1][6]; f.Outcome != OutcomeUnavailable {
		t.Errorf("IPv4 address over IPv6: %+v", f)
	}
}

// TestHeadlessServiceEvaluatedOnThePortAsked: clients of a headless
// Service dial its pods directly, on the port they choose, so there is no
// port mapping and no "no such port".
func TestHeadlessServiceEvaluatedOnThePortAsked(t *testing.T) {
	ev := labEvaluator(t, manifest.ModeDual, func(m *manifest.Manifest) {
		for i := range m.Services {
			if s := &m.Services[i]; s.Name == manifest.ServiceAPI {
				s.Spec.ClusterIP, s.Spec.ClusterIPs = corev1.ClusterIPNone, []string{corev1.ClusterIPNone}
			}
		}
	})
	web := Endpoint{Kind: "workload", Namespace: manifest.NSFrontend, Name: "web"}
	api := Endpoint{Kind: "service", Namespace: manifest.NSBackend, Name: manifest.ServiceAPI}
	// 8080 is api's target port, not one of the Service's ports: a
	// headless Service answers on it (allowed by allow-web-to-api).
	m, err := ev.EvaluateMatrix(context.Background(), []Endpoint{web}, []Endpoint{api}, 6, 8080)
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range []int{4, 6} {
		got := m[0][0][fam]
		if got.Outcome != OutcomeAllow || got.Total != 4 || got.Pairs[0].Port != 8080 {
			t.Errorf("headless api:8080 IPv%d: %+v, want 4 pairs allowed on 8080", fam, got)
		}
	}
}

// TestAnyPortEvaluatesDeclaredPorts: a question on any port (port 0)
// evaluates a pod or workload destination on each port of the protocol
// its pods declare, as a Service on each of its ports; at port 0 only the
// rules without ports would match, and web → api would be denied although
// allow-web-to-api admits it on 8080.
func TestAnyPortEvaluatesDeclaredPorts(t *testing.T) {
	web := Endpoint{Kind: "workload", Namespace: manifest.NSFrontend, Name: "web"}
	api := Endpoint{Kind: "workload", Namespace: manifest.NSBackend, Name: "api"}
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			ev := labEvaluator(t, mode)
			m, err := ev.EvaluateMatrix(context.Background(), []Endpoint{web}, []Endpoint{api}, 6, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, fam := range []int{4, 6} {
				c := m[0][0][fam]
				if mode != manifest.ModeDual && (fam == 4) != (mode == manifest.ModeIPv4) {
					if c.Outcome != OutcomeUnavailable {
						t.Errorf("IPv%d without the family: %+v", fam, c)
					}
					continue
				}
				// 4 pod pairs on 8080 (http, allowed) and 9090 (metrics:
				// IPv4 from node 1's pod CIDR only).
				want := map[uint16]int{manifest.PortHTTP: 4, manifest.PortMetrics: 0}
				if fam == 4 {
					want[manifest.PortMetrics] = 2
				}
				got := map[uint16]int{}
				for _, p := range c.Pairs {
					if p.Verdict == "allowed" {
						got[p.Port]++
					} else if _, ok := want[p.Port]; !ok {
						t.Errorf("IPv%d pair on port %d, which api does not declare over TCP", fam, p.Port)
					}
				}
				if c.Outcome != OutcomePartial || c.Total != 8 || c.Allowed != want[manifest.PortHTTP]+want[manifest.PortMetrics] {
					t.Errorf("web → api any port IPv%d: %s %d/%d, want partial %d/8", fam, c.Outcome, c.Allowed, c.Total, want[manifest.PortHTTP]+want[manifest.PortMetrics])
				}
				for p, n := range want {
					if got[p] != n {
						t.Errorf("IPv%d port %d: %d pairs allowed, want %d", fam, p, got[p], n)
					}
				}
			}
			// Over UDP api declares udp-echo only: 4 pairs on 5353.
			u, err := ev.EvaluateMatrix(context.Background(), []Endpoint{web}, []Endpoint{api}, 17, 0)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, c := range u[0][0] {
				n += len(c.Pairs)
				for _, p := range c.Pairs {
					if p.Port != manifest.PortUDPEcho {
						t.Errorf("UDP any port: pair on %d, want %d", p.Port, manifest.PortUDPEcho)
					}
				}
			}
			if n == 0 {
				t.Error("UDP any port: no pair evaluated")
			}
		})
	}
}

// TestICMPEvaluated: ICMP (ICMPv6 over IPv6) is allowed only by rules
// without ports, as NetworkPolicy has no ICMP protocol; a Service does not
// forward it.
func TestICMPEvaluated(t *testing.T) {
	web := Endpoint{Kind: "workload", Namespace: manifest.NSFrontend, Name: "web"}
	api := Endpoint{Kind: "workload", Namespace: manifest.NSBackend, Name: "api"}
	apiSvc := Endpoint{Kind: "service", Namespace: manifest.NSBackend, Name: manifest.ServiceAPI}
	noPorts := func(m *manifest.Manifest) {
		for i := range m.NetworkPolicies {
			if np := &m.NetworkPolicies[i]; np.Name == manifest.PolicyAllowWeb {
				np.Spec.Ingress[0].Ports = nil
			}
		}
	}
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			for _, tc := range []struct {
				name string
				edit []func(*manifest.Manifest)
				want string
			}{
				{"rules with ports", nil, OutcomeDeny},
				{"a rule without ports", []func(*manifest.Manifest){noPorts}, OutcomeAllow},
			} {
				ev := labEvaluator(t, mode, tc.edit...)
				m, err := ev.EvaluateMatrix(context.Background(), []Endpoint{web}, []Endpoint{api, apiSvc}, 1, 0)
				if err != nil {
					t.Fatal(err)
				}
				for _, fam := range []int{4, 6} {
					if mode != manifest.ModeDual && (fam == 4) != (mode == manifest.ModeIPv4) {
						continue
					}
					if c := m[0][0][fam]; c.Outcome != tc.want || c.Total != 4 || c.Pairs[0].Port != 0 {
						t.Errorf("%s: web → api ICMP IPv%d: %+v, want %s 4 pairs", tc.name, fam, c, tc.want)
					}
					want := map[int]string{4: "ICMP to its ClusterIP", 6: "ICMPv6 to its ClusterIP"}[fam]
					if c := m[0][1][fam]; c.Outcome != OutcomeNoPort || !strings.Contains(c.Reason, want) {
						t.Errorf("%s: web → service api ICMP IPv%d: %+v, want no_port %q", tc.name, fam, c, want)
					}
				}
			}
		})
	}
}

// TestAnyPortEvaluatesObservedPorts: a pod that declares no port of the
// protocol (ports are optional in a pod spec) is evaluated, for a question
// on any port, at the ports flows to its destination were seen on, else at
// port 0; a pod that declares ports is evaluated at those.
func TestAnyPortEvaluatesObservedPorts(t *testing.T) {
	web := Endpoint{Kind: "workload", Namespace: manifest.NSFrontend, Name: "web"}
	api := Endpoint{Kind: "workload", Namespace: manifest.NSBackend, Name: "api"}
	// api declares no ports, and allow-web-to-api names 8080 by number
	// (a named port needs a declared one).
	undeclared := func(m *manifest.Manifest) {
		for i := range m.NetworkPolicies {
			if np := &m.NetworkPolicies[i]; np.Name == manifest.PolicyAllowWeb {
				http := intstr.FromInt32(manifest.PortHTTP)
				np.Spec.Ingress[0].Ports = []networkingv1.NetworkPolicyPort{{Port: &http}}
			}
		}
		for i := range m.Pods {
			if p := &m.Pods[i]; p.Namespace == manifest.NSBackend {
				for j := range p.Spec.Containers {
					p.Spec.Containers[j].Ports = nil
				}
			}
		}
	}
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			fams := map[manifest.Mode][]int{manifest.ModeIPv4: {4}, manifest.ModeIPv6: {6}, manifest.ModeDual: {4, 6}}[mode]
			ev := labEvaluator(t, mode, undeclared)
			for _, tc := range []struct {
				name     string
				observed [][]uint16
				outcome  string
				port     uint16
			}{
				{"seen on 8080", [][]uint16{{manifest.PortHTTP}}, OutcomeAllow, manifest.PortHTTP},
				{"nothing seen", nil, OutcomeDeny, 0},
			} {
				m, err := ev.EvaluateMatrix(context.Background(), []Endpoint{web}, []Endpoint{api}, 6, 0, tc.observed...)
				if err != nil {
					t.Fatal(err)
				}
				for _, fam := range fams {
					if c := m[0][0][fam]; c.Outcome != tc.outcome || c.Total != 4 || c.Pairs[0].Port != tc.port {
						t.Errorf("%s IPv%d: %s %d/%d on %d, want %s 4 pairs on %d", tc.name, fam, c.Outcome, c.Allowed, c.Total, c.Pairs[0].Port, tc.outcome, tc.port)
					}
				}
			}
			// Declared ports win over the observed ones.
			m, err := labEvaluator(t, mode).EvaluateMatrix(context.Background(), []Endpoint{web}, []Endpoint{api}, 6, 0, []uint16{7777})
			if err != nil {
				t.Fatal(err)
			}
			for _, fam := range fams {
				for _, p := range m[0][0][fam].Pairs {
					if p.Port != manifest.PortHTTP && p.Port != manifest.PortMetrics {
						t.Errorf("IPv%d: a declaring pod evaluated on observed port %d", fam, p.Port)
					}
				}
			}
		})
	}
}
