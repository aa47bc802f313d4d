package policy

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/flow"
)

// The truth tables below re-express the reachability cases of the upstream
// Kubernetes NetworkPolicy conformance tests (test/e2e/network/netpol) on
// their classic model: namespaces x, y and z, each with pods a, b and c,
// every pod serving ports 80 and 81 over TCP, UDP and SCTP under the
// container port names serve-<port>-<proto>. Pods are labelled pod=<name>,
// namespaces kubernetes.io/metadata.name=<name>. Every case starts from
// "everything reaches everything" and states what the policies change;
// traffic from a pod to itself is not checked (upstream ignores it too, as
// implementations differ). Each case runs with IPv4 and with IPv6 pod
// addresses; ipBlock CIDRs are built from the addresses of the family.

var (
	modelNamespaces = []string{"x", "y", "z"}
	modelPods       = []string{"a", "b", "c"}
	modelPorts      = []uint16{80, 81}
	modelProtos     = []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP}
)

type modelPod struct {
	ns, name string
	addr     netip.Addr
	labels   map[string]string
}

type model struct {
	family   corev1.IPFamily
	pods     []*modelPod
	nsLabels map[string]map[string]string
}

// newModel builds the 9 pods. x/a is 198.18.1.1 or fd00:10:0:1::1, z/c is
// 198.18.3.3 or fd00:10:0:3::3: all inside 198.18.0.0/16 and fd00:10::/48.
func newModel(f corev1.IPFamily) *model {
	m := &model{family: f, nsLabels: map[string]map[string]string{}}
	for i, ns := range modelNamespaces {
		m.nsLabels[ns] = map[string]string{corev1.LabelMetadataName: ns}
		for j, p := range modelPods {
			a := netip.AddrFrom4([4]byte{198, 18, byte(i + 1), byte(j + 1)})
			if f == corev1.IPv6Protocol {
				a = netip.MustParseAddr(fmt.Sprintf("fd00:10:0:%d::%d", i+1, j+1))
			}
			m.pods = append(m.pods, &modelPod{ns: ns, name: p, addr: a, labels: map[string]string{"pod": p}})
		}
	}
	return m
}

func (m *model) pod(ref string) *modelPod {
	for _, p := range m.pods {
		if p.ns+"/"+p.name == ref {
			return p
		}
	}
	panic("no pod " + ref)
}

// host returns the /32 or /128 of a pod.
func (m *model) host(ref string) string {
	a := m.pod(ref).addr
	return netip.PrefixFrom(a, a.BitLen()).String()
}

// wide returns the /16 or /48 holding a pod's address and every other pod
// (upstream's "large CIDR").
func (m *model) wide(ref string) string {
	a := m.pod(ref).addr
	bits := 16
	if a.Is6() {
		bits = 48
	}
	p, _ := a.Prefix(bits)
	return p.String()
}

func portName(port uint16, proto uint8) string {
	names := map[uint8]string{flow.ProtoTCP: "tcp", flow.ProtoUDP: "udp", flow.ProtoSCTP: "sctp"}
	return fmt.Sprintf("serve-%d-%s", port, names[proto])
}

func (m *model) peer(p *modelPod, dstPort uint16, proto uint8) Peer {
	return Peer{Addr: p.addr, IsPod: true, Namespace: p.ns, Labels: p.labels, NamespaceLabels: m.nsLabels[p.ns],
		PortName: portName(dstPort, proto)}
}

// reach is an expected truth table: allowed[from][to].
type reach map[string]map[string]bool

func newReach() reach {
	r := reach{}
	for _, from := range allRefs() {
		r[from] = map[string]bool{}
		for _, to := range allRefs() {
			r[from][to] = true
		}
	}
	return r
}

func allRefs() []string {
	var out []string
	for _, ns := range modelNamespaces {
		for _, p := range modelPods {
			out = append(out, ns+"/"+p)
		}
	}
	return out
}

// match reports whether pattern ("x", "x/a", or "" for any) covers ref.
func match(pattern, ref string) bool {
	if pattern == "" || pattern == ref {
		return true
	}
	return !strings.Contains(pattern, "/") && strings.HasPrefix(ref, pattern+"/")
}

// set marks every pair from→to matching the patterns.
func (r reach) set(from, to string, v bool) reach {
	for f, row := range r {
		for t := range row {
			if match(from, f) && match(to, t) {
				row[t] = v
			}
		}
	}
	return r
}

type probe struct {
	port  uint16
	proto uint8
	want  func() reach
}

func tcp(port uint16, want func() reach) probe  { return probe{port, flow.ProtoTCP, want} }
func udp(port uint16, want func() reach) probe  { return probe{port, flow.ProtoUDP, want} }
func sctp(port uint16, want func() reach) probe { return probe{port, flow.ProtoSCTP, want} }

// everyone: nothing changes.
func everyone() reach { return newReach() }

// Policy builders, named after what they do.

func netpol(ns, name string, podSel map[string]string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: podSel}},
	}
}

func ingress(p *networkingv1.NetworkPolicy, rules ...networkingv1.NetworkPolicyIngressRule) *networkingv1.NetworkPolicy {
	p.Spec.Ingress = append(p.Spec.Ingress, rules...)
	p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
	return p
}

func egress(p *networkingv1.NetworkPolicy, rules ...networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	p.Spec.Egress = append(p.Spec.Egress, rules...)
	p.Spec.PolicyTypes = append(p.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
	return p
}

func from(peers ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: peers}
}

func to(peers ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: peers}
}

func onPorts(r networkingv1.NetworkPolicyIngressRule, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyIngressRule {
	r.Ports = ports
	return r
}

func onPortsE(r networkingv1.NetworkPolicyEgressRule, ports ...networkingv1.NetworkPolicyPort) networkingv1.NetworkPolicyEgressRule {
	r.Ports = ports
	return r
}

func labels(kv ...string) *metav1.LabelSelector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &metav1.LabelSelector{MatchLabels: m}
}

func expr(key string, op metav1.LabelSelectorOperator, vals ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: vals}}}
}

func pods(sel *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: sel}
}

func namespaces(sel *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: sel}
}

func podsIn(ns, pod *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: ns, PodSelector: pod}
}

func block(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func nsNamed(ns string) *metav1.LabelSelector { return labels(corev1.LabelMetadataName, ns) }

func portNum(proto corev1.Protocol, n int32) networkingv1.NetworkPolicyPort {
	p := intstr.FromInt32(n)
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &p}
}

// portNumNoProto leaves the protocol unset (TCP by default).
func portNumNoProto(n int32) networkingv1.NetworkPolicyPort {
	p := intstr.FromInt32(n)
	return networkingv1.NetworkPolicyPort{Port: &p}
}

func portNamed(name string) networkingv1.NetworkPolicyPort {
	p := intstr.FromString(name)
	return networkingv1.NetworkPolicyPort{Port: &p}
}

func protoOnly(proto corev1.Protocol) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: &proto}
}

var (
	tcpP  = corev1.ProtocolTCP
	udpP  = corev1.ProtocolUDP
	sctpP = corev1.ProtocolSCTP
	all   = map[string]string{} // empty pod selector: every pod of the namespace
	podA  = map[string]string{"pod": "a"}
)

type upstreamCase struct {
	name string
	// extra labels on namespaces and pods (the "updated" cases)
	nsLabels  map[string]map[string]string
	podLabels map[string]map[string]string
	policies  func(m *model) []*networkingv1.NetworkPolicy
	probes    []probe
}

var upstreamCases = []upstreamCase{
	{
		name:     "default deny ingress isolates the whole namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy { return pols(ingress(netpol("x", "deny-ingress", all))) },
		probes:   []probe{tcp(80, func() reach { return newReach().set("", "x", false) })},
	},
	{
		name: "default deny all cuts the namespace off both ways",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(egress(ingress(netpol("x", "deny-all", all))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("", "x", false).set("x", "", false) })},
	},
	{
		name: "pod selector admits one pod of the same namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "x-a-allows-x-b", podA), from(pods(labels("pod", "b")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("", "x/a", false).set("x/b", "x/a", true) })},
	},
	{
		name: "allow-everything policy on one pod beside a namespace default deny",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(
				ingress(netpol("x", "deny-all", all)),
				ingress(netpol("x", "allow-all-to-a", podA), from(podsIn(&metav1.LabelSelector{}, &metav1.LabelSelector{}))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("", "x", false).set("", "x/a", true) })},
	},
	{
		name: "empty namespace selector admits every namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-from-another-ns", podA), from(namespaces(&metav1.LabelSelector{}))))
		},
		probes: []probe{tcp(80, everyone)},
	},
	{
		name: "namespace selector admits one other namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-client-a-via-ns-selector", podA), from(namespaces(nsNamed("y")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("x", "x/a", false).set("z", "x/a", false) })},
	},
	{
		name: "pod selector with an In expression",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "x-a-allows-x-b", podA), from(pods(expr("pod", metav1.LabelSelectorOpIn, "b")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("", "x/a", false).set("x/b", "x/a", true) })},
	},
	{
		name: "namespace selector with an In expression",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ns-y-match-selector", podA),
				from(namespaces(expr(corev1.LabelMetadataName, metav1.LabelSelectorOpIn, "y")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("x", "x/a", false).set("z", "x/a", false) })},
	},
	{
		name: "two peers are alternatives: other namespaces or pod b",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ns-y-match-selector", podA),
				from(namespaces(expr(corev1.LabelMetadataName, metav1.LabelSelectorOpNotIn, "x")), pods(labels("pod", "b")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("x/c", "x/a", false) })},
	},
	{
		name: "namespace and pod selector in one peer must both match",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ns-y-podselector-and-nsselector", podA),
				from(podsIn(expr(corev1.LabelMetadataName, metav1.LabelSelectorOpNotIn, "x"), labels("pod", "b")))))
		},
		probes: []probe{tcp(80, func() reach {
			return newReach().set("", "x/a", false).set("y/b", "x/a", true).set("z/b", "x/a", true)
		})},
	},
	{
		name: "namespace and pod expressions in one peer",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ns-y-z-pod-b-c", podA),
				from(podsIn(expr(corev1.LabelMetadataName, metav1.LabelSelectorOpNotIn, "x"), expr("pod", metav1.LabelSelectorOpIn, "b", "c")))))
		},
		probes: []probe{tcp(80, func() reach {
			return newReach().set("", "x/a", false).set("y/b", "x/a", true).set("y/c", "x/a", true).set("z/b", "x/a", true).set("z/c", "x/a", true)
		})},
	},
	{
		name: "several pod selector peers",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ns-x-pod-b-c", podA), from(pods(labels("pod", "b")), pods(labels("pod", "c")))))
		},
		probes: []probe{tcp(80, func() reach {
			return newReach().set("", "x/a", false).set("x/b", "x/a", true).set("x/c", "x/a", true)
		})},
	},
	{
		name: "one pod of another namespace through both selectors",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ns-y-pod-a-via-namespace-pod-selector", podA),
				from(podsIn(nsNamed("y"), labels("pod", "a")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("", "x/a", false).set("y/a", "x/a", true) })},
	},
	{
		name: "numbered port: other ports stay closed",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-client-a-via-ns-selector", podA), onPorts(from(namespaces(nsNamed("y"))), portNum(tcpP, 81))))
		},
		probes: []probe{
			tcp(81, func() reach { return newReach().set("x", "x/a", false).set("z", "x/a", false) }),
			tcp(80, func() reach { return newReach().set("", "x/a", false) }),
		},
	},
	{
		name: "stacked policies with overlapping pod selectors add their ports",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(
				ingress(netpol("x", "allow-client-a-via-ns-selector", podA), onPorts(from(namespaces(nsNamed("y"))), portNum(tcpP, 81))),
				ingress(netpol("x", "allow-client-a-via-ns-selector-80", podA), onPorts(from(namespaces(nsNamed("y"))), portNum(tcpP, 80))))
		},
		probes: []probe{
			tcp(80, func() reach { return newReach().set("x", "x/a", false).set("z", "x/a", false) }),
			tcp(81, func() reach { return newReach().set("x", "x/a", false).set("z", "x/a", false) }),
		},
	},
	{
		name: "allow-all ingress rule",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-all", all), from()))
		},
		probes: []probe{tcp(80, everyone), tcp(81, everyone)},
	},
	{
		name: "one named port for the whole namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-all", all), onPorts(from(), portNamed("serve-81-tcp"))))
		},
		probes: []probe{tcp(81, everyone), tcp(80, func() reach { return newReach().set("", "x", false) })},
	},
	{
		name: "named port from one namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			np := portNamed("serve-80-tcp")
			np.Protocol = &tcpP
			return pols(ingress(netpol("x", "allow-client-a-via-ns-selector-80", podA), onPorts(from(namespaces(nsNamed("y"))), np)))
		},
		probes: []probe{
			tcp(80, func() reach { return newReach().set("x", "x/a", false).set("z", "x/a", false) }),
			tcp(81, func() reach { return newReach().set("", "x/a", false) }),
		},
	},
	{
		name: "egress on one named port",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(egress(netpol("x", "allow-egress", all), onPortsE(to(), portNamed("serve-80-tcp"))))
		},
		probes: []probe{tcp(80, everyone), tcp(81, func() reach { return newReach().set("x", "", false) })},
	},
	{
		name: "policy updated from allow-all to deny-all",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			p := ingress(netpol("x", "allow-all-mutate-to-deny-all", all), from())
			p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{}
			return pols(p)
		},
		probes: []probe{tcp(81, func() reach { return newReach().set("", "x", false) })},
	},
	{
		name: "namespace selector before the namespace gets its label",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-client-a-via-ns-selector", podA), from(namespaces(labels("ns2", "updated")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("", "x/a", false) })},
	},
	{
		name:     "namespace selector after the namespace got its label",
		nsLabels: map[string]map[string]string{"y": {"ns2": "updated"}},
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-client-a-via-ns-selector", podA), from(namespaces(labels("ns2", "updated")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("", "x/a", false).set("y", "x/a", true) })},
	},
	{
		name: "pod selector before the pod gets its label",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-client-a-via-pod-selector", podA), from(pods(labels("pod", "b", "pod2", "updated")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("", "x/a", false) })},
	},
	{
		name:      "pod selector after the pod got its label",
		podLabels: map[string]map[string]string{"x/b": {"pod2": "updated"}},
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-client-a-via-pod-selector", podA), from(pods(labels("pod", "b", "pod2", "updated")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("", "x/a", false).set("x/b", "x/a", true) })},
	},
	{
		name: "empty pod selector peer admits only the policy's namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "deny-empty-policy", all), from(pods(&metav1.LabelSelector{}))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("y", "x", false).set("z", "x", false) })},
	},
	{
		name: "deny-ingress selector before the pod matches it",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "deny-ingress-via-label-selector", map[string]string{"target": "isolated"})))
		},
		probes: []probe{tcp(80, everyone)},
	},
	{
		name:      "deny-ingress selector after the pod matches it",
		podLabels: map[string]map[string]string{"x/a": {"target": "isolated"}},
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "deny-ingress-via-label-selector", map[string]string{"target": "isolated"})))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("", "x/a", false) })},
	},
	{
		name: "egress deny for one pod",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(egress(netpol("x", "deny-egress-pod-a", podA)))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("x/a", "", false) })},
	},
	{
		name:     "egress deny for a whole namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy { return pols(egress(netpol("x", "deny-egress-ns-x", all))) },
		probes:   []probe{tcp(80, func() reach { return newReach().set("x", "", false) })},
	},
	{
		name: "ingress and egress in one policy",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			p := ingress(netpol("x", "allow-client-a-via-pod-selector", podA), from(pods(labels("pod", "b"))))
			p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{onPortsE(to(), portNumNoProto(80))}
			p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress, networkingv1.PolicyTypeIngress}
			return pols(p)
		},
		probes: []probe{
			tcp(80, func() reach { return newReach().set("", "x/a", false).set("x/b", "x/a", true) }),
			tcp(81, func() reach {
				return newReach().set("", "x/a", false).set("x/a", "", false).set("x/b", "x/a", true)
			}),
		},
	},
	{
		name: "client egress deny wins over a server that allows",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			toYA := podsIn(nsNamed("y"), labels("pod", "a"))
			fromXA := podsIn(nsNamed("x"), labels("pod", "a"))
			return pols(
				egress(netpol("x", "allow-to-ns-y-pod-a", podA), to(toYA)),
				ingress(netpol("y", "allow-from-xa-on-ya-match-selector", podA), from(fromXA)),
				ingress(netpol("y", "allow-from-xa-on-yb-match-selector", map[string]string{"pod": "b"}), from(fromXA)))
		},
		probes: []probe{tcp(80, func() reach {
			return newReach().set("x/a", "", false).set("", "y/a", false).set("x/a", "y/a", true).set("", "y/b", false)
		})},
	},
	{
		name: "egress to one pod of another namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(egress(netpol("x", "allow-to-ns-y-pod-a", podA), to(podsIn(nsNamed("y"), labels("pod", "a")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("x/a", "", false).set("x/a", "y/a", true) })},
	},
	{
		name: "protocol without port allows every port of that protocol only",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ingress-by-proto", podA), onPorts(from(), protoOnly(tcpP))))
		},
		probes: []probe{tcp(80, everyone), udp(80, func() reach { return newReach().set("", "x/a", false) })},
	},
	{
		name: "port-restricted ingress policy alone",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ingress-port-80", all), onPorts(from(), portNumNoProto(80))))
		},
		probes: []probe{tcp(81, func() reach { return newReach().set("", "x", false) })},
	},
	{
		name: "an allow-all ingress policy adds to a port-restricted one",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(
				ingress(netpol("x", "allow-ingress-port-80", all), onPorts(from(), portNumNoProto(80))),
				ingress(netpol("x", "allow-ingress", all), from()))
		},
		probes: []probe{tcp(81, everyone)},
	},
	{
		name: "port-restricted egress policy alone",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(egress(netpol("x", "allow-egress-port-80", all), onPortsE(to(), portNumNoProto(80))))
		},
		probes: []probe{tcp(81, func() reach { return newReach().set("x", "", false) })},
	},
	{
		name: "an allow-all egress policy adds to a port-restricted one",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(
				egress(netpol("x", "allow-egress-port-80", all), onPortsE(to(), portNumNoProto(80))),
				egress(netpol("x", "allow-egress", all), to()))
		},
		probes: []probe{tcp(81, everyone)},
	},
	{
		name:     "no policy: everything flows (policies deleted)",
		policies: func(*model) []*networkingv1.NetworkPolicy { return nil },
		probes:   []probe{tcp(80, everyone), udp(81, everyone), sctp(80, everyone)},
	},
	{
		name: "egress to a server by its host CIDR",
		policies: func(m *model) []*networkingv1.NetworkPolicy {
			return pols(egress(netpol("x", "allow-client-a-via-cidr-egress-rule", podA), to(block(m.host("y/b")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("x/a", "", false).set("x/a", "y/b", true) })},
	},
	{
		name: "ipBlock except carves a server out of a wide CIDR",
		policies: func(m *model) []*networkingv1.NetworkPolicy {
			return pols(egress(netpol("x", "allow-client-a-via-cidr-egress-rule", podA), to(block(m.wide("x/b"), m.host("x/b")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("x/a", "x/b", false) })},
	},
	{
		name: "ipBlock policy replaced by one for the excepted address only",
		policies: func(m *model) []*networkingv1.NetworkPolicy {
			return pols(egress(netpol("x", "allow-client-a-via-cidr-egress-rule", podA), to(block(m.host("x/b")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("x/a", "", false).set("x/a", "x/b", true) })},
	},
	{
		name: "an address excepted by one policy and allowed by another is allowed",
		policies: func(m *model) []*networkingv1.NetworkPolicy {
			return pols(
				egress(netpol("x", "allow-wide-except-b", podA), to(block(m.wide("x/b"), m.host("x/b")))),
				egress(netpol("x", "allow-b", podA), to(block(m.host("x/b")))))
		},
		probes: []probe{tcp(80, everyone)},
	},
	{
		name: "egress allow-all policy alone",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(egress(netpol("x", "allow-egress-for-target", podA), to()))
		},
		probes: []probe{tcp(80, everyone)},
	},
	{
		name: "ingress and egress are controlled independently",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(
				egress(netpol("x", "allow-egress-for-target", podA), to()),
				ingress(netpol("x", "deny-ingress-via-label-selector", podA)))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("", "x/a", false) })},
	},
	{
		name: "an SCTP rule does not open TCP",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(
				ingress(netpol("x", "deny-ingress", all)),
				ingress(netpol("x", "allow-only-sctp-ingress-on-port-81", podA), onPorts(from(), portNum(sctpP, 81))))
		},
		probes: []probe{
			tcp(81, func() reach { return newReach().set("", "x", false) }),
			sctp(81, func() reach { return newReach().set("", "x", false).set("", "x/a", true) }),
		},
	},
	{
		name: "an SCTP-only policy still isolates the pod for TCP",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-only-sctp-ingress-on-port-80", podA), onPorts(from(), portNum(sctpP, 80))))
		},
		probes: []probe{tcp(81, func() reach { return newReach().set("", "x/a", false) })},
	},
	{
		name: "a UDP rule does not open TCP",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-only-udp-ingress-on-port-81", podA), onPorts(from(), portNum(udpP, 81))))
		},
		probes: []probe{
			tcp(81, func() reach { return newReach().set("", "x/a", false) }),
			udp(81, everyone),
		},
	},
	{
		name: "namespace selector on the immutable name label",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-client-a-via-ns-selector-for-immutable-ns-label", podA), from(namespaces(nsNamed("y")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("x", "x/a", false).set("z", "x/a", false) })},
	},
	{
		name: "egress namespace selector NotIn on the name label",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(egress(netpol("x", "allow-ns-y-match-selector-for-immutable-ns-label", podA),
				to(namespaces(expr(corev1.LabelMetadataName, metav1.LabelSelectorOpNotIn, "y")))))
		},
		probes: []probe{tcp(80, func() reach { return newReach().set("x/a", "y", false) })},
	},
	{
		name:     "UDP: default deny ingress",
		policies: func(*model) []*networkingv1.NetworkPolicy { return pols(ingress(netpol("x", "deny-all", all))) },
		probes:   []probe{udp(80, func() reach { return newReach().set("", "x", false) })},
	},
	{
		name: "UDP: numbered port from one namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ingress-on-port-81-ns-x", podA), onPorts(from(namespaces(nsNamed("y"))), portNum(udpP, 81))))
		},
		probes: []probe{udp(81, func() reach { return newReach().set("x", "x/a", false).set("z", "x/a", false) })},
	},
	{
		name: "UDP: one pod of another namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ns-y-pod-a-via-namespace-pod-selector", podA), from(podsIn(nsNamed("y"), labels("pod", "a")))))
		},
		probes: []probe{udp(80, func() reach { return newReach().set("", "x/a", false).set("y/a", "x/a", true) })},
	},
	{
		name:     "SCTP: default deny ingress",
		policies: func(*model) []*networkingv1.NetworkPolicy { return pols(ingress(netpol("x", "deny-all", all))) },
		probes:   []probe{sctp(80, func() reach { return newReach().set("", "x", false) })},
	},
	{
		name: "SCTP: numbered port from one namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ingress-on-port-81-ns-x", podA), onPorts(from(namespaces(nsNamed("y"))), portNum(sctpP, 81))))
		},
		probes: []probe{sctp(81, func() reach { return newReach().set("x", "x/a", false).set("z", "x/a", false) })},
	},
	{
		name: "SCTP: one pod of another namespace",
		policies: func(*model) []*networkingv1.NetworkPolicy {
			return pols(ingress(netpol("x", "allow-ns-y-pod-a-via-namespace-pod-selector", podA), from(podsIn(nsNamed("y"), labels("pod", "a")))))
		},
		probes: []probe{sctp(80, func() reach { return newReach().set("", "x/a", false).set("y/a", "x/a", true) })},
	},
}

func pols(ps ...*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy { return ps }

// TestUpstreamTruthTables checks every pair of the 9-pod model, in each
// family, against the case's truth table.
func TestUpstreamTruthTables(t *testing.T) {
	for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		for _, tc := range upstreamCases {
			t.Run(string(f)+"/"+tc.name, func(t *testing.T) {
				m := newModel(f)
				for ns, extra := range tc.nsLabels {
					for k, v := range extra {
						m.nsLabels[ns][k] = v
					}
				}
				for ref, extra := range tc.podLabels {
					for k, v := range extra {
						m.pod(ref).labels[k] = v
					}
				}
				set, err := Compile(tc.policies(m))
				if err != nil {
					t.Fatal(err)
				}
				for _, pr := range tc.probes {
					want := pr.want()
					var wrong []string
					for _, src := range m.pods {
						for _, dst := range m.pods {
							if src == dst {
								continue // loopback is implementation-defined
							}
							fl := Flow{Src: m.peer(src, pr.port, pr.proto), Dst: m.peer(dst, pr.port, pr.proto), Proto: pr.proto, DstPort: pr.port}
							res := set.Evaluate(&fl)
							sref, dref := src.ns+"/"+src.name, dst.ns+"/"+dst.name
							if got := res.Allowed(); got != want[sref][dref] {
								wrong = append(wrong, fmt.Sprintf("%s -> %s: allowed=%v, want %v (egress %+v, ingress %+v)", sref, dref, got, want[sref][dref], res.Egress, res.Ingress))
							}
							checkDecision(t, res)
						}
					}
					if len(wrong) > 0 {
						t.Errorf("port %d proto %d: %d of 72 pairs wrong:\n  %s", pr.port, pr.proto, len(wrong), strings.Join(wrong, "\n  "))
					}
				}
			})
		}
	}
}

// checkDecision checks the shape of decisions: an allow names a policy and
// a rule, a deny names a policy and rule -1, not isolated names nothing.
func checkDecision(t *testing.T, r Result) {
	t.Helper()
	for _, d := range []Decision{r.Egress, r.Ingress} {
		switch d.Verdict {
		case flow.VerdictAllowed:
			if d.Name == "" || d.Rule < 0 {
				t.Fatalf("allowed decision %+v: want a policy and a rule", d)
			}
		case flow.VerdictDenied:
			if d.Name == "" || d.Rule != -1 {
				t.Fatalf("denied decision %+v: want a policy and rule -1", d)
			}
		case flow.VerdictNotIsolated:
			if d.Name != "" || d.Rule != -1 {
				t.Fatalf("not isolated decision %+v: want no policy", d)
			}
		default:
			t.Fatalf("decision %+v: want allowed, denied or not isolated for a pod", d)
		}
	}
}
