package audit

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/lab/manifest"
)

func findingsOf(fs []Finding, kind string) []Finding {
	var out []Finding
	for _, f := range fs {
		if f.Kind == kind {
			out = append(out, f)
		}
	}
	return out
}

func hasRef(f Finding, want Ref) bool {
	for _, r := range f.Objects {
		if r.String() == want.String() && r.Role == want.Role {
			return true
		}
	}
	return false
}

func rule(i int32) *int32 { return &i }

// TestLabFindings: the default lab's IPv4-only metrics ipBlock and
// single-stack Service are dual-stack gaps in dual mode, and nothing is in
// the single-family modes; unprotected workloads are the same everywhere.
func TestLabFindings(t *testing.T) {
	metricsRule := Ref{Kind: "NetworkPolicy", Namespace: "backend", Name: manifest.PolicyMetricsIPv4, Direction: "ingress", Rule: rule(0)}
	web := Ref{Kind: "Deployment", Namespace: "frontend", Name: "web"}
	api := Ref{Kind: "Deployment", Namespace: "backend", Name: "api"}
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			_, inv := labInventory(t, mode, 2)
			fs := Findings(inv, Options{})
			for _, f := range fs {
				t.Logf("%s: %s", f.Kind, f.Message)
				if f.Message == "" || len(f.Objects) == 0 || !strings.HasSuffix(f.Message, ".") {
					t.Errorf("finding %+v: want a sentence and objects", f)
				}
				// Each kind says how grave it is, what it counts and
				// what to change; a count is never of flows unless it is.
				want := map[string][2]string{
					KindVerdictGap: {SeverityHigh, "pod pairs"}, KindIPBlockOneFamily: {SeverityMedium, "pods"}, KindServiceSingleStack: {SeverityMedium, "pods"},
					KindUnprotectedIngress: {SeverityMedium, "pods"}, KindUnprotectedEgress: {SeverityLow, "pods"},
				}[f.Kind]
				if f.Severity != want[0] || f.Unit != want[1] || f.Fix == "" || !strings.HasSuffix(f.Fix, ".") {
					t.Errorf("%s: severity %q unit %q fix %q, want %q %q and a fix", f.Kind, f.Severity, f.Unit, f.Fix, want[0], want[1])
				}
			}
			var dual []Finding
			for _, f := range fs {
				if f.DualStack() {
					dual = append(dual, f)
				}
			}
			unprot := map[string]bool{}
			for _, f := range fs {
				if !f.DualStack() {
					unprot[f.Kind+" "+f.Objects[0].String()] = true
					// Unprotected ingress is about traffic to the
					// workload, egress about traffic from it.
					if want := map[string]string{KindUnprotectedIngress: RoleDestination, KindUnprotectedEgress: RoleSource}[f.Kind]; f.Objects[0].Role != want {
						t.Errorf("%s %s: role %q, want %q", f.Kind, f.Objects[0], f.Objects[0].Role, want)
					}
				}
			}
			for _, want := range []string{
				"unprotected-ingress Deployment frontend/web", "unprotected-egress Deployment frontend/web",
				"unprotected-egress Deployment backend/api", "unprotected-ingress Pod tools/probe-1", "unprotected-ingress Pod tools/probe-2",
			} {
				if !unprot[want] {
					t.Errorf("missing %s", want)
				}
			}
			if len(unprot) != 5 {
				t.Errorf("%d non-dual-stack findings, want 5: %v", len(unprot), unprot)
			}
			if mode != manifest.ModeDual {
				if len(dual) != 0 {
					t.Errorf("single-family mode: %d dual-stack findings, want none", len(dual))
				}
				return
			}
			gaps := findingsOf(fs, KindVerdictGap)
			var webAPI *Finding
			for i, g := range gaps {
				if g.Objects[0] == web.as(RoleSource) && g.Objects[1] == api.as(RoleDestination) && g.Port == manifest.PortMetrics {
					webAPI = &gaps[i]
				}
			}
			if webAPI == nil {
				t.Fatalf("no verdict gap frontend/web -> backend/api:9090 in %v", gaps)
			}
			if !hasRef(*webAPI, metricsRule) || webAPI.Count != 2 || !strings.Contains(webAPI.Message, "allowed over IPv4 but denied over IPv6") {
				t.Errorf("gap %+v: want the metrics rule, 2 pod pairs (web@1 to both api), allowed over IPv4", webAPI)
			}
			for _, g := range gaps {
				if g.Port != manifest.PortMetrics {
					t.Errorf("unexpected gap on port %d: %s", g.Port, g.Message)
				}
			}
			ib := findingsOf(fs, KindIPBlockOneFamily)
			// The rule admits its covered pods as sources to the pods
			// its policy selects, on its port: the links' question.
			if len(ib) != 1 || !hasRef(ib[0], metricsRule) || !hasRef(ib[0], web.as(RoleSource)) || !hasRef(ib[0], api.as(RoleDestination)) ||
				ib[0].Port != manifest.PortMetrics || ib[0].Protocol != "TCP" {
				t.Errorf("ipBlock findings %+v: want one, for the metrics rule, covering frontend/web as sources to backend/api on 9090/TCP", ib)
			}
			svc := findingsOf(fs, KindServiceSingleStack)
			if len(svc) != 1 || svc[0].Objects[0] != (Ref{Kind: "Service", Namespace: "backend", Name: manifest.ServiceAPISingle, Role: RoleDestination}) || svc[0].Count != 2 ||
				svc[0].Port != manifest.PortHTTP || svc[0].Protocol != "TCP" || slices.ContainsFunc(svc[0].Objects, func(r Ref) bool { return r.Role == RoleSource }) {
				t.Errorf("service findings %+v: want backend/api-single as the destination on 8080/TCP, no source, with 2 dual-stack pods", svc)
			}
		})
	}
}

// TestIPBlockBothFamilies: a rule with blocks of both families that cover
// a pod's two addresses differently is reported for that workload.
func TestIPBlockBothFamilies(t *testing.T) {
	objs := []runtime.Object{namespace("ns")}
	for i, a := range [][2]string{{"198.18.0.1", "fd00:10::1"}, {"198.18.0.2", "fd00:10:1::2"}} {
		objs = append(objs, pod("ns", fmt.Sprintf("p%d", i), map[string]string{"app": "p"}, a[:]))
	}
	p := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "egress"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
			Egress: []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: "198.18.0.0/16"}},
				{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10::/64"}},
			}}}}}
	inv := enrich.NewSnapshot(append(objs, p)...)
	set, err := policy.Compile(inv.NetworkPolicies)
	if err != nil {
		t.Fatal(err)
	}
	fs := findingsOf(DualStackGaps(inv, set, Options{}), KindIPBlockOneFamily)
	if len(fs) != 1 || fs[0].Count != 1 || !strings.Contains(fs[0].Message, "cover the IPv4 addresses of 1 dual-stack pods of Pod ns/p1 but not their IPv6") {
		t.Fatalf("findings %+v", fs)
	}
	// p0 -> p1: IPv4 allowed by the block, IPv6 not (fd00:10:1::2 is outside fd00:10::/64).
	gaps := findingsOf(DualStackGaps(inv, set, Options{}), KindVerdictGap)
	if len(gaps) != 0 {
		t.Fatalf("no ports declared: want no verdict gap, got %v", gaps)
	}
	objs[2].(*corev1.Pod).Spec.Containers[0].Ports = []corev1.ContainerPort{{Name: "http", ContainerPort: 80}}
	inv = enrich.NewSnapshot(append(objs, p)...)
	gaps = findingsOf(DualStackGaps(inv, set, Options{}), KindVerdictGap)
	if len(gaps) != 1 || !strings.Contains(gaps[0].Message, "Pod ns/p0 → Pod ns/p1 on 80/TCP is allowed over IPv4 but denied over IPv6") ||
		!strings.HasSuffix(gaps[0].Message, "IPv6: egress denied by ns/egress, which isolates ns/p0: no egress rule of ns/egress allows IPv6 TCP/80 (http) to ns/p1; "+
			"nearest: ns/egress rule 0 matches every port but no ipBlock contains fd00:10:1::2.") {
		t.Fatalf("gaps %+v", gaps)
	}
	if fs := findingsOf(DualStackGaps(inv, set, Options{MaxPairs: 1}), KindTruncated); len(fs) != 1 {
		t.Fatalf("MaxPairs 1: want a truncated finding, got %v", fs)
	}
}

func TestInvalidPolicyFinding(t *testing.T) {
	inv := enrich.NewSnapshot(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "bad"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "300.0.0.0/8"}}}}}}})
	fs := findingsOf(Findings(inv, Options{}), KindInvalidPolicy)
	if len(fs) != 1 || fs[0].Objects[0].Name != "bad" {
		t.Fatalf("findings %+v", fs)
	}
}
