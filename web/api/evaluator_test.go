package api

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit/policy"
)

type mapResolver map[string]map[int]policy.Peer

func (m mapResolver) Resolve(_ context.Context, e Endpoint) (map[int]policy.Peer, error) {
	p, ok := m[e.String()]
	if !ok {
		return nil, fmt.Errorf("unknown %s", e)
	}
	return p, nil
}

func pod(ns, app, v4, v6 string) map[int]policy.Peer {
	out := map[int]policy.Peer{}
	for fam, a := range map[int]string{4: v4, 6: v6} {
		if a != "" {
			out[fam] = policy.Peer{Addr: netip.MustParseAddr(a), IsPod: true, Namespace: ns, Labels: map[string]string{"app": app}, NamespaceLabels: map[string]string{"kubernetes.io/metadata.name": ns}}
		}
	}
	return out
}

// TestPolicyEvaluator: db admits its clients by ipBlock, written for IPv4
// only, so frontend → db is allowed over IPv4 and denied over IPv6.
func TestPolicyEvaluator(t *testing.T) {
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(5432)
	set, err := policy.Compile([]*networkingv1.NetworkPolicy{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "198.18.0.0/16"}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
			}},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ev := PolicyEvaluator{
		Policies: func() *policy.Set { return set },
		Resolver: mapResolver{
			"workload:shop/frontend": pod("shop", "frontend", "198.18.1.1", "fd00:10:244:1::1"),
			"workload:shop/db":       pod("shop", "db", "198.18.3.1", "fd00:10:244:3::1"),
			"workload:shop/legacy":   pod("shop", "legacy", "198.18.4.1", ""),
			"ip:fd00:10:99::1":       {6: {Addr: netip.MustParseAddr("fd00:10:99::1")}},
		},
	}
	ep := func(s string) Endpoint { return Endpoint{Kind: "workload", Namespace: "shop", Name: s} }
	got, err := ev.Evaluate(context.Background(), ep("frontend"), ep("db"), 6, 5432)
	if err != nil {
		t.Fatal(err)
	}
	if got[4].Verdict != "allowed" || got[6].Verdict != "denied" || got[4].Ingress != "shop/db rule 0 (allowed)" || got[6].DstIP != "fd00:10:244:3::1" {
		t.Errorf("frontend→db %+v", got)
	}
	got, _ = ev.Evaluate(context.Background(), ep("frontend"), ep("db"), 6, 80)
	if got[4].Verdict != "denied" {
		t.Errorf("other port %+v", got)
	}
	got, _ = ev.Evaluate(context.Background(), ep("legacy"), ep("frontend"), 6, 80)
	if _, ok := got[6]; ok || got[4].Verdict != "not_isolated" {
		t.Errorf("IPv4-only source %+v", got)
	}
	got, _ = ev.Evaluate(context.Background(), Endpoint{Kind: "ip", Name: "fd00:10:99::1"}, ep("db"), 6, 5432)
	if got[6].Verdict != "denied" || len(got) != 1 {
		t.Errorf("outside IPv6 address %+v", got)
	}
	if _, err := ev.Evaluate(context.Background(), ep("nope"), ep("db"), 6, 5432); err == nil {
		t.Error("unknown endpoint accepted")
	}
	// No policies yet: nothing is isolated.
	none := PolicyEvaluator{Resolver: ev.Resolver}
	if got, _ := none.Evaluate(context.Background(), ep("frontend"), ep("db"), 6, 5432); got[6].Verdict != "not_isolated" {
		t.Errorf("without policies %+v", got)
	}
}
