package recommend

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
)

// The hand-built cluster of the edge cases: addresses in 198.18.0.0/15
// and fd00:10::/32 only.

func ns(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelMetadataName: name}}}
}

// deployPod is pod name of Deployment deploy (through ReplicaSet
// deploy-hash) on node, with labels app=deploy plus extra, addresses and
// container ports.
func deployPod(namespace, deploy, name, node string, addrs []string, ports ...corev1.ContainerPort) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name,
		Labels:          map[string]string{"app": deploy, "pod-template-hash": "5d8f9", corev1.LabelTopologyZone: node},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: deploy + "-5d8f9", Controller: ptr.To(true), UID: "u"}}}}
	p.Spec.NodeName = node
	p.Spec.Containers = []corev1.Container{{Name: "c", Ports: ports}}
	p.Status.Phase = corev1.PodRunning
	for _, a := range addrs {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: a})
	}
	return p
}

func port(name string, n int32, proto corev1.Protocol) corev1.ContainerPort {
	return corev1.ContainerPort{Name: name, ContainerPort: n, Protocol: proto}
}

func node(name string, addrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
	}
	return n
}

func flowEnd(view *enrich.Snapshot, namespace, name string, v uint8) audit.FlowEnd {
	p, ok := view.Pod(namespace, name)
	if !ok {
		panic("no pod " + namespace + "/" + name)
	}
	e, _ := podEnd(view, p, v)
	if p.HostNetwork {
		e.Namespace, e.Pod, e.WorkloadKind, e.WorkloadName = namespace, name, "", ""
	}
	return e
}

// edgeView is a dual-stack cluster with the edge cases: db pods
// naming one port "pg" on two numbers, cache pods naming 6379 two ways,
// a host-network agent, a Service of namespace shared whose hand-made
// endpoints are db pods of namespace data, and the cluster DNS.
func edgeView() *enrich.Snapshot {
	objs := []runtime.Object{
		ns("app"), ns("data"), ns("shared"), ns("kube-system"),
		node("node-1", "198.18.0.1", "fd00:10::1"), node("node-2", "198.18.0.2", "fd00:10::2"),
		deployPod("app", "client", "client-a", "node-1", []string{"198.18.1.10", "fd00:10:0:1::10"}),
		deployPod("data", "db", "db-a", "node-1", []string{"198.18.1.20", "fd00:10:0:1::20"}, port("pg", 5432, corev1.ProtocolTCP)),
		deployPod("data", "db", "db-b", "node-2", []string{"198.18.2.20", "fd00:10:0:2::20"}, port("pg", 5433, corev1.ProtocolTCP)),
		deployPod("data", "cache", "cache-a", "node-1", []string{"198.18.1.30", "fd00:10:0:1::30"}, port("redis", 6379, corev1.ProtocolTCP)),
		deployPod("data", "cache", "cache-b", "node-2", []string{"198.18.2.30", "fd00:10:0:2::30"}, port("cache", 6379, corev1.ProtocolTCP)),
		deployPod("kube-system", "coredns", "coredns-a", "node-2", []string{"198.18.2.53", "fd00:10:0:2::53"},
			port("dns", 53, corev1.ProtocolUDP), port("dns-tcp", 53, corev1.ProtocolTCP)),
	}
	agent := deployPod("kube-system", "agent", "agent-a", "node-2", []string{"198.18.0.2", "fd00:10::2"})
	agent.Spec.HostNetwork = true
	objs = append(objs, agent)
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "shared", Name: "pg"},
		Spec: corev1.ServiceSpec{ClusterIPs: []string{"198.19.0.10", "fd00:10:ff::10"}, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports: []corev1.ServicePort{{Port: 5432, TargetPort: intstr.FromInt32(5432), Protocol: corev1.ProtocolTCP}}}}
	objs = append(objs, svc)
	return enrich.NewSnapshot(objs...)
}

func TestEdgeCases(t *testing.T) {
	view := edgeView()
	ext := func(a string) audit.FlowEnd { return addrEnd(netip.MustParseAddr(a)) }
	var flows []audit.ObservedFlow
	for _, v := range []uint8{4, 6} {
		c := flowEnd(view, "app", "client-a", v)
		flows = append(flows,
			// One name, two numbers: one named port.
			audit.ObservedFlow{Src: c, Dst: flowEnd(view, "data", "db-a", v), Protocol: flow.ProtoTCP, DstPort: 5432, IPVersion: v, Allowed: 1},
			audit.ObservedFlow{Src: c, Dst: flowEnd(view, "data", "db-b", v), Protocol: flow.ProtoTCP, DstPort: 5433, IPVersion: v, Allowed: 1},
			// One number, two names: the number.
			audit.ObservedFlow{Src: c, Dst: flowEnd(view, "data", "cache-a", v), Protocol: flow.ProtoTCP, DstPort: 6379, IPVersion: v, Allowed: 1},
			audit.ObservedFlow{Src: c, Dst: flowEnd(view, "data", "cache-b", v), Protocol: flow.ProtoTCP, DstPort: 6379, IPVersion: v, Allowed: 1},
			// A host-network pod: its node's addresses, both families.
			audit.ObservedFlow{Src: flowEnd(view, "kube-system", "agent-a", v), Dst: flowEnd(view, "data", "db-a", v), Protocol: flow.ProtoTCP, DstPort: 5432, IPVersion: v, Allowed: 1},
			// DNS over UDP: UDP and TCP to the DNS pods.
			audit.ObservedFlow{Src: c, Dst: flowEnd(view, "kube-system", "coredns-a", v), Protocol: flow.ProtoUDP, DstPort: 53, IPVersion: v, Allowed: 9},
		)
	}
	// A Service of namespace shared whose backend is in data (IPv6 only).
	flows = append(flows, audit.ObservedFlow{Src: flowEnd(view, "app", "client-a", 6), Dst: flowEnd(view, "data", "db-a", 6), Protocol: flow.ProtoTCP, DstPort: 5432, IPVersion: 6,
		ServiceNamespace: "shared", ServiceName: "pg", ServicePort: 5432, Allowed: 1})
	// Outside peers: two IPv4 addresses of one /24 become one prefix;
	// another seen over IPv4 only is said so.
	for _, a := range []string{"198.19.255.5", "198.19.255.9"} {
		flows = append(flows, audit.ObservedFlow{Src: flowEnd(view, "app", "client-a", 4), Dst: ext(a), Protocol: flow.ProtoTCP, DstPort: 443, IPVersion: 4, Allowed: 1})
	}

	rec := recommend(t, view, flows, Options{Mode: LeastPrivilege})
	y := yamlOf(t, rec)
	if testing.Verbose() {
		t.Logf("\n%s", y)
	}
	eg := policyNamed(t, rec, "app", "client-egress")
	text := yamlOf(t, &Recommendation{Mode: LeastPrivilege, Policies: []Policy{eg}})
	for _, want := range []string{
		"port: pg\n", "port: 6379\n", "protocol: UDP\n      port: dns\n", "protocol: TCP\n      port: dns-tcp\n",
		"cidr: 198.19.255.0/28", "Only IPv4 was seen for these peers", "DNS: both UDP and TCP port 53",
		"kubernetes.io/metadata.name: data", "Deployment data/db through Service shared/pg on 5432/TCP over IPv6",
	} {
		if !has(text, want) {
			t.Errorf("client's egress lacks %q:\n%s", want, text)
		}
	}
	in := policyNamed(t, rec, "data", "db-ingress")
	text = yamlOf(t, &Recommendation{Mode: LeastPrivilege, Policies: []Policy{in}})
	for _, want := range []string{"cidr: 198.18.0.2/32", "cidr: fd00:10::2/128", "host-network pod kube-system/agent-a", "port: pg\n"} {
		if !has(text, want) {
			t.Errorf("db's ingress lacks %q:\n%s", want, text)
		}
	}
	for _, p := range rec.Policies {
		if strings.HasPrefix(p.Policy.Name, "agent-") {
			t.Errorf("a policy for the host-network agent: %s", p.Policy.Name)
		}
	}
	rep, err := Replay(view, rec.NetworkPolicies(), flows)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Families {
		if f.Kept != f.Allowed || len(f.NewlyAllowed) > 0 {
			t.Errorf("IPv%d: %d of %d kept, newly denied %v", f.Family, f.Kept, f.Allowed, f.NewlyDenied)
		}
	}
}

// commentBreak is where a comment wraps.
var commentBreak = regexp.MustCompile(`\n *# `)

// has reports whether YAML text holds want, as written or in a comment
// that wraps.
func has(text, want string) bool {
	return strings.Contains(text, want) || strings.Contains(commentBreak.ReplaceAllString(text, " "), want)
}

// TestUnlabelledWorkload: a workload whose pods share no label gets no
// policy (an empty selector would select its whole namespace), and a
// note says so.
func TestUnlabelledWorkload(t *testing.T) {
	p := deployPod("app", "bare", "bare-0", "node-1", []string{"198.18.1.40", "fd00:10:0:1::40"})
	p.Labels = nil
	p.OwnerReferences = nil
	view := enrich.NewSnapshot(ns("app"), p)
	rec := recommend(t, view, nil, Options{Mode: LeastPrivilege, Scope: Scope{Namespace: "app"}})
	if len(rec.Policies) != 0 || len(rec.Notes) != 1 || !strings.Contains(rec.Notes[0], "Pod app/bare-0 has no label") {
		t.Errorf("policies %d, notes %q: want none and a note on bare-0", len(rec.Policies), rec.Notes)
	}
}
