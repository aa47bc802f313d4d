package policy

import (
	"errors"
	"fmt"
	"maps"
	"math/bits"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/flow"
)

// fam holds the addresses of one family for the feature tests.
type fam struct {
	name                  string
	web, api, ext, except netip.Addr
	block, exceptP        string // a block holding web and api, and an except holding only api
	other                 string // a block of the other family
}

var fams = []fam{
	{name: "ipv4", web: netip.MustParseAddr("198.18.0.10"), api: netip.MustParseAddr("198.18.1.10"), ext: netip.MustParseAddr("198.19.255.7"),
		block: "198.18.0.0/16", exceptP: "198.18.1.0/24", other: "fd00:10::/32"},
	{name: "ipv6", web: netip.MustParseAddr("fd00:10:1::10"), api: netip.MustParseAddr("fd00:10:1:1::10"), ext: netip.MustParseAddr("fd00:10:ffff::7"),
		block: "fd00:10:1::/48", exceptP: "fd00:10:1:1::/64", other: "198.18.0.0/15"},
}

var (
	nsFront = map[string]string{corev1.LabelMetadataName: "front", "team": "web"}
	nsBack  = map[string]string{corev1.LabelMetadataName: "back", "team": "api"}
)

func webPeer(f fam) Peer {
	return Peer{Addr: f.web, IsPod: true, Namespace: "front", Labels: map[string]string{"app": "web"}, NamespaceLabels: nsFront}
}

func apiPeer(f fam, portName string) Peer {
	return Peer{Addr: f.api, IsPod: true, Namespace: "back", Labels: map[string]string{"app": "api"}, NamespaceLabels: nsBack, PortName: portName}
}

func extPeer(f fam) Peer { return Peer{Addr: f.ext} }

func mustCompile(t testing.TB, ps ...*networkingv1.NetworkPolicy) *Set {
	t.Helper()
	s, err := Compile(ps)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func endPort(p networkingv1.NetworkPolicyPort, e int32) networkingv1.NetworkPolicyPort {
	p.EndPort = &e
	return p
}

func TestDecisions(t *testing.T) {
	apiSel := map[string]string{"app": "api"}
	type tc struct {
		name        string
		pols        func(f fam) []*networkingv1.NetworkPolicy
		flow        func(f fam) Flow
		egress, ing Decision
	}
	allowed := func(ns, name string, rule int32) Decision {
		return Decision{Verdict: flow.VerdictAllowed, Namespace: ns, Name: name, Rule: rule}
	}
	denied := func(ns, name string) Decision {
		return Decision{Verdict: flow.VerdictDenied, Namespace: ns, Name: name, Rule: -1}
	}
	webToAPI := func(port uint16, proto uint8, portName string) func(f fam) Flow {
		return func(f fam) Flow { return Flow{Src: webPeer(f), Dst: apiPeer(f, portName), Proto: proto, DstPort: port} }
	}
	cases := []tc{
		{
			name:   "no policy: not isolated both ways",
			pols:   func(fam) []*networkingv1.NetworkPolicy { return nil },
			flow:   webToAPI(8080, flow.ProtoTCP, "http"),
			egress: notIsolated, ing: notIsolated,
		},
		{
			name: "first allowing rule in namespace/name then rule order",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				return pols(
					ingress(netpol("back", "b-second", apiSel), from(namespaces(labels("team", "web")))),
					ingress(netpol("back", "a-first", apiSel), onPorts(from(), portNum(tcpP, 9090)), from(pods(&metav1.LabelSelector{})), from(namespaces(&metav1.LabelSelector{}))))
			},
			flow:   webToAPI(8080, flow.ProtoTCP, "http"),
			egress: notIsolated, ing: allowed("back", "a-first", 2),
		},
		{
			name: "denial names the default-deny policy over rule-bearing ones",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				return pols(
					ingress(netpol("back", "allow-metrics", apiSel), onPorts(from(), portNum(tcpP, 9090))),
					ingress(netpol("back", "zz-default-deny", all)))
			},
			flow:   webToAPI(8080, flow.ProtoTCP, "http"),
			egress: notIsolated, ing: denied("back", "zz-default-deny"),
		},
		{
			name: "denial names the first isolating policy when none is a pure deny",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				return pols(
					ingress(netpol("back", "b-allow", apiSel), onPorts(from(), portNum(tcpP, 9091))),
					ingress(netpol("back", "a-allow", apiSel), onPorts(from(), portNum(tcpP, 9090))))
			},
			flow:   webToAPI(8080, flow.ProtoTCP, "http"),
			egress: notIsolated, ing: denied("back", "a-allow"),
		},
		{
			name: "named port resolved on the destination, ingress",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				return pols(ingress(netpol("back", "named", apiSel), onPorts(from(), portNamed("http"))))
			},
			flow:   webToAPI(8080, flow.ProtoTCP, "http"),
			egress: notIsolated, ing: allowed("back", "named", 0),
		},
		{
			name: "named port of another protocol does not match",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				p := portNamed("dns")
				p.Protocol = &udpP
				return pols(ingress(netpol("back", "named", apiSel), onPorts(from(), p)))
			},
			flow:   webToAPI(53, flow.ProtoTCP, "dns"), // the pod names its TCP port dns too, the rule is UDP
			egress: notIsolated, ing: denied("back", "named"),
		},
		{
			name: "named port resolved on the destination, egress",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				return pols(egress(netpol("front", "egress-named", all), onPortsE(to(), portNamed("http"))))
			},
			flow:   webToAPI(8080, flow.ProtoTCP, "http"),
			egress: allowed("front", "egress-named", 0), ing: notIsolated,
		},
		{
			name: "named egress port never matches an external destination",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				return pols(egress(netpol("front", "egress-named", all), onPortsE(to(), portNamed("http"))))
			},
			flow: func(f fam) Flow {
				return Flow{Src: webPeer(f), Dst: extPeer(f), Proto: flow.ProtoTCP, DstPort: 8080}
			},
			egress: denied("front", "egress-named"), ing: unknown,
		},
		{
			name: "endPort range includes both ends",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				return pols(ingress(netpol("back", "range", apiSel), onPorts(from(), endPort(portNum(tcpP, 7000), 7100))))
			},
			flow:   webToAPI(7100, flow.ProtoTCP, ""),
			egress: notIsolated, ing: allowed("back", "range", 0),
		},
		{
			name: "endPort range excludes the next port",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				return pols(ingress(netpol("back", "range", apiSel), onPorts(from(), endPort(portNum(tcpP, 7000), 7100))))
			},
			flow:   webToAPI(7101, flow.ProtoTCP, ""),
			egress: notIsolated, ing: denied("back", "range"),
		},
		{
			name: "ICMP never matches a rule with ports",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				return pols(ingress(netpol("back", "tcp-only", apiSel), onPorts(from(), protoOnly(tcpP))))
			},
			flow: func(f fam) Flow {
				p := flow.ProtoICMP
				if f.name == "ipv6" {
					p = flow.ProtoICMPv6
				}
				return Flow{Src: webPeer(f), Dst: apiPeer(f, ""), Proto: p}
			},
			egress: notIsolated, ing: denied("back", "tcp-only"),
		},
		{
			name: "a rule without ports allows ICMP",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				return pols(ingress(netpol("back", "from-web", apiSel), from(namespaces(labels("team", "web")))))
			},
			flow: func(f fam) Flow {
				return Flow{Src: webPeer(f), Dst: apiPeer(f, ""), Proto: flow.ProtoICMPv6}
			},
			egress: notIsolated, ing: allowed("back", "from-web", 0),
		},
		{
			name: "ipBlock of the flow's family allows",
			pols: func(f fam) []*networkingv1.NetworkPolicy {
				return pols(ingress(netpol("back", "block", apiSel), from(block(f.block))))
			},
			flow:   webToAPI(8080, flow.ProtoTCP, ""),
			egress: notIsolated, ing: allowed("back", "block", 0),
		},
		{
			name: "ipBlock of the other family never matches",
			pols: func(f fam) []*networkingv1.NetworkPolicy {
				return pols(ingress(netpol("back", "block", apiSel), from(block(f.other))))
			},
			flow:   webToAPI(8080, flow.ProtoTCP, ""),
			egress: notIsolated, ing: denied("back", "block"),
		},
		{
			name: "ipBlock except removes an address",
			pols: func(f fam) []*networkingv1.NetworkPolicy {
				return pols(egress(netpol("front", "block", all), to(block(f.block, f.exceptP))))
			},
			flow:   webToAPI(8080, flow.ProtoTCP, ""),
			egress: denied("front", "block"), ing: notIsolated,
		},
		{
			name: "ipBlock matches an external source; selectors do not",
			pols: func(f fam) []*networkingv1.NetworkPolicy {
				return pols(ingress(netpol("back", "ext", apiSel), from(namespaces(&metav1.LabelSelector{})), from(block(f.block), block(netip.PrefixFrom(f.ext, f.ext.BitLen()).String()))))
			},
			flow: func(f fam) Flow {
				return Flow{Src: extPeer(f), Dst: apiPeer(f, ""), Proto: flow.ProtoUDP, DstPort: 53}
			},
			egress: unknown, ing: allowed("back", "ext", 1),
		},
		{
			name: "policyTypes defaulted: egress rules make the policy egress too",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				p := netpol("front", "both", all)
				p.Spec.Egress = []networkingv1.NetworkPolicyEgressRule{onPortsE(to(), portNum(udpP, 53))}
				return pols(p)
			},
			flow:   webToAPI(8080, flow.ProtoTCP, ""),
			egress: denied("front", "both"), ing: notIsolated,
		},
		{
			name: "policyTypes defaulted: an ingress-only policy leaves egress open",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				p := netpol("front", "in", all)
				p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{from()}
				return pols(p)
			},
			flow: func(f fam) Flow {
				return Flow{Src: webPeer(f), Dst: webPeer(f), Proto: flow.ProtoTCP, DstPort: 1}
			},
			egress: notIsolated, ing: allowed("front", "in", 0),
		},
		{
			name: "explicit Egress type ignores the ingress rules",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				p := netpol("back", "egress-only", apiSel)
				p.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{from()}
				p.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
				return pols(p)
			},
			flow:   webToAPI(8080, flow.ProtoTCP, ""),
			egress: notIsolated, ing: notIsolated,
		},
		{
			name: "a policy of another namespace does not select the pod",
			pols: func(fam) []*networkingv1.NetworkPolicy {
				return pols(ingress(netpol("front", "deny", all)))
			},
			flow:   webToAPI(8080, flow.ProtoTCP, ""),
			egress: notIsolated, ing: notIsolated,
		},
	}
	for _, f := range fams {
		for _, c := range cases {
			t.Run(f.name+"/"+c.name, func(t *testing.T) {
				s := mustCompile(t, c.pols(f)...)
				fl := c.flow(f)
				r := s.Evaluate(&fl)
				if r.Egress != c.egress || r.Ingress != c.ing {
					t.Errorf("got egress %+v ingress %+v\nwant egress %+v ingress %+v", r.Egress, r.Ingress, c.egress, c.ing)
				}
				var eg, in Decision
				s.Side(Egress, &fl, &eg)
				s.Side(Ingress, &fl, &in)
				if eg != r.Egress || in != r.Ingress {
					t.Errorf("Side disagrees with Evaluate")
				}
			})
		}
	}
}

func TestCompileErrors(t *testing.T) {
	p80 := intstr.FromInt32(80)
	bad := func(name string, mod func(p *networkingv1.NetworkPolicy)) *networkingv1.NetworkPolicy {
		p := netpol("ns", name, all)
		mod(p)
		return p
	}
	sctpOK := portNum(sctpP, 80)
	icmp := corev1.Protocol("ICMP")
	cases := []struct {
		pol  *networkingv1.NetworkPolicy
		want string
	}{
		{bad("bad-cidr", func(p *networkingv1.NetworkPolicy) { ingress(p, from(block("198.18.0.0/33"))) }), "ipBlock cidr"},
		{bad("bad-cidr6", func(p *networkingv1.NetworkPolicy) { ingress(p, from(block("fd00:10::/129"))) }), "ipBlock cidr"},
		{bad("except-outside", func(p *networkingv1.NetworkPolicy) { ingress(p, from(block("198.18.0.0/16", "198.19.0.0/24"))) }), "not inside"},
		{bad("except-family", func(p *networkingv1.NetworkPolicy) { ingress(p, from(block("fd00:10::/32", "198.18.0.0/24"))) }), "not inside"},
		{bad("port-zero", func(p *networkingv1.NetworkPolicy) { ingress(p, onPorts(from(), portNum(tcpP, 0))) }), "out of range"},
		{bad("endport-below", func(p *networkingv1.NetworkPolicy) { ingress(p, onPorts(from(), endPort(portNum(tcpP, 80), 79))) }), "endPort"},
		{bad("endport-named", func(p *networkingv1.NetworkPolicy) { ingress(p, onPorts(from(), endPort(portNamed("http"), 90))) }), "named port"},
		{bad("proto", func(p *networkingv1.NetworkPolicy) {
			ingress(p, onPorts(from(), networkingv1.NetworkPolicyPort{Protocol: &icmp, Port: &p80}))
		}), "unsupported protocol"},
		{bad("empty-peer", func(p *networkingv1.NetworkPolicy) { ingress(p, from(networkingv1.NetworkPolicyPeer{})) }), "empty peer"},
		{bad("block-and-selector", func(p *networkingv1.NetworkPolicy) {
			pe := block("198.18.0.0/15")
			pe.PodSelector = &metav1.LabelSelector{}
			ingress(p, from(pe))
		}), "cannot be combined"},
		{bad("bad-op", func(p *networkingv1.NetworkPolicy) { p.Spec.PodSelector = *expr("a", "Near", "b") }), "podSelector"},
		{bad("in-no-values", func(p *networkingv1.NetworkPolicy) { ingress(p, from(pods(expr("a", metav1.LabelSelectorOpIn)))) }), "podSelector"},
		{bad("bad-type", func(p *networkingv1.NetworkPolicy) { p.Spec.PolicyTypes = []networkingv1.PolicyType{"Sideways"} }), "policyTypes"},
	}
	for _, c := range cases {
		t.Run(c.pol.Name, func(t *testing.T) {
			good := ingress(netpol("ns", "good", all), onPorts(from(), sctpOK))
			s, err := Compile(pols(c.pol, good))
			var pe *Error
			if !errors.As(err, &pe) || pe.Name != c.pol.Name || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v, want an *Error for %s containing %q", err, c.pol.Name, c.want)
			}
			if s.Len() != 1 || s.Policies()[0].Name != "good" {
				t.Fatalf("set holds %d policies, want only the valid one", s.Len())
			}
		})
	}
	t.Run("twice", func(t *testing.T) {
		_, err := Compile(pols(netpol("ns", "p", all), netpol("ns", "p", all)))
		if err == nil || !strings.Contains(err.Error(), "twice") {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestMappedCIDR(t *testing.T) {
	b, err := ParseBlock(&networkingv1.IPBlock{CIDR: "::ffff:198.18.0.0/112", Except: []string{"198.18.1.0/24"}})
	if err != nil {
		t.Fatal(err)
	}
	if b.CIDR != netip.MustParsePrefix("198.18.0.0/16") {
		t.Fatalf("cidr %s, want 198.18.0.0/16", b.CIDR)
	}
	for _, c := range []struct {
		a    string
		want bool
	}{{"198.18.2.1", true}, {"::ffff:198.18.2.1", true}, {"198.18.1.1", false}, {"fd00:10::1", false}} {
		if got := b.Contains(netip.MustParseAddr(c.a)); got != c.want {
			t.Errorf("Contains(%s) = %v, want %v", c.a, got, c.want)
		}
	}
}

// TestIndexedMatchesLinear checks that the per-label index of a namespace
// with many policies gives the same decisions as a scan of every policy.
func TestIndexedMatchesLinear(t *testing.T) {
	w := genWorld(3, 40, 60)
	s := mustCompile(t, w.policies...)
	linear := &Set{policies: s.policies, byNS: map[string]*nsIndex{}}
	indexed := 0
	for k, v := range s.byNS {
		c := *v
		for d := range c.dir {
			if c.dir[d].byLabel != nil {
				indexed++
			}
			c.dir[d].byLabel, c.dir[d].rest = nil, nil
		}
		linear.byNS[k] = &c
	}
	if indexed == 0 {
		t.Fatal("no namespace was indexed: raise the policies per namespace")
	}
	for i := range w.flows {
		a, b := s.Evaluate(&w.flows[i]), linear.Evaluate(&w.flows[i])
		if a != b {
			t.Fatalf("flow %d %+v: indexed %+v, linear %+v", i, w.flows[i], a, b)
		}
	}
}

// TestTries: Tries counts, per side, the policies of the subject's
// namespace that isolate the direction (all of them without the label
// index), never fewer than those that select the subject (the index
// must not skip one), and nothing for an end that is not a pod.
func TestTries(t *testing.T) {
	w := genWorld(3, 40, 60)
	s := mustCompile(t, w.policies...)
	isolating := map[[2]string]int{} // namespace, direction
	for _, p := range w.policies {
		in, eg := Types(p)
		if in {
			isolating[[2]string{p.Namespace, Ingress.String()}]++
		}
		if eg {
			isolating[[2]string{p.Namespace, Egress.String()}]++
		}
	}
	narrowed := false
	for i := range w.flows {
		f := &w.flows[i]
		for _, side := range []struct {
			d       Direction
			subject *Peer
		}{{Egress, &f.Src}, {Ingress, &f.Dst}} {
			got := s.Tries(side.d, side.subject)
			if !side.subject.IsPod {
				if got != 0 {
					t.Fatalf("flow %d %s: %d tries for an end that is no pod", i, side.d, got)
				}
				continue
			}
			selecting := len(s.Isolating(side.d, side.subject))
			all := isolating[[2]string{side.subject.Namespace, side.d.String()}]
			if got < selecting || got > all {
				t.Fatalf("flow %d %s: %d tries, want %d..%d (selecting..isolating)", i, side.d, got, selecting, all)
			}
			narrowed = narrowed || got < all
		}
	}
	if !narrowed {
		t.Error("the label index never narrowed the tries")
	}
	unindexed := mustCompile(t, w.policies[:indexMin-1]...)
	for i := range w.flows {
		f := &w.flows[i]
		if f.Dst.IsPod && f.Dst.Namespace == w.policies[0].Namespace {
			if got, want := unindexed.Tries(Ingress, &f.Dst), isolatingIn(w.policies[:indexMin-1], Ingress); got != want {
				t.Errorf("without the index: %d tries, want every isolating policy, %d", got, want)
			}
			break
		}
	}
	if n := (*Set)(nil).Tries(Ingress, &Peer{IsPod: true}); n != 0 {
		t.Errorf("nil Set: %d tries", n)
	}
}

// TestTypes: policyTypes as given, or defaulted to Ingress plus Egress
// when the policy has egress rules.
func TestTypes(t *testing.T) {
	pol := func(types []networkingv1.PolicyType, eg []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
		return &networkingv1.NetworkPolicy{Spec: networkingv1.NetworkPolicySpec{PolicyTypes: types, Egress: eg}}
	}
	tests := []struct {
		name         string
		p            *networkingv1.NetworkPolicy
		ingr, egress bool
	}{
		{"unset, no egress rules", pol(nil, nil), true, false},
		{"unset, egress rules", pol(nil, []networkingv1.NetworkPolicyEgressRule{{}}), true, true},
		{"egress only", pol([]networkingv1.PolicyType{networkingv1.PolicyTypeEgress}, nil), false, true},
	}
	for _, tc := range tests {
		i, e := Types(tc.p)
		if i != tc.ingr || e != tc.egress {
			t.Errorf("%s: got %v/%v, want %v/%v", tc.name, i, e, tc.ingr, tc.egress)
		}
	}
}

// isolatingIn counts the policies of pols that isolate d.
func isolatingIn(pols []*networkingv1.NetworkPolicy, d Direction) int {
	n := 0
	for _, p := range pols {
		if in, eg := Types(p); d == Ingress && in || d == Egress && eg {
			n++
		}
	}
	return n
}

func TestEvaluateAllocs(t *testing.T) {
	w := genWorld(10, 10, 100)
	s := mustCompile(t, w.policies...)
	i := 0
	n := testing.AllocsPerRun(1000, func() {
		s.Evaluate(&w.flows[i%len(w.flows)])
		i++
	})
	if n != 0 {
		t.Fatalf("Evaluate allocates %v times per flow, want 0", n)
	}
}

func TestIsolated(t *testing.T) {
	s := mustCompile(t,
		ingress(netpol("back", "deny", all)),
		egress(netpol("back", "egress-api", map[string]string{"app": "api"})))
	for _, f := range fams {
		api := apiPeer(f, "")
		if !s.Isolated(Ingress, &api) || !s.Isolated(Egress, &api) {
			t.Errorf("api: want isolated both ways")
		}
		if got := s.Isolating(Egress, &api); len(got) != 1 || got[0].Name != "egress-api" {
			t.Errorf("Isolating(egress) = %v", got)
		}
		web := webPeer(f)
		if s.Isolated(Ingress, &web) || s.Isolated(Egress, &web) {
			t.Errorf("web: want not isolated")
		}
		ext := extPeer(f)
		if s.Isolated(Ingress, &ext) {
			t.Errorf("an external peer is never isolated")
		}
	}
	var nilSet *Set
	api := apiPeer(fams[0], "")
	if r := nilSet.Evaluate(&Flow{Src: api, Dst: api}); r.Egress != notIsolated || r.Ingress != notIsolated {
		t.Errorf("nil set: %+v", r)
	}
}

// world is a synthetic cluster for benchmarks and index tests.
type world struct {
	policies []*networkingv1.NetworkPolicy
	flows    []Flow
}

// genWorld builds nsCount namespaces with polPerNS policies and podsPerNS
// pods each, and 4096 flows between random pods (and some external
// addresses), half over IPv4 and half over IPv6.
func genWorld(nsCount, polPerNS, podsPerNS int) world {
	r := rand.New(rand.NewPCG(1, 2))
	var w world
	type pod struct {
		ns     string
		labels map[string]string
		v4, v6 netip.Addr
	}
	var podsAll []pod
	// IPv4 pods live in 198.18.0.0/16: namespace n holds the block of
	// 2^kb addresses starting at 198.18.0.0 + n<<kb (its /(32-kb)).
	kb := bits.Len(uint(podsPerNS - 1))
	if nsCount<<kb > 1<<16 {
		panic("genWorld: too many pods for 198.18.0.0/16")
	}
	addr4 := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}) }
	nsPrefix4 := func(n int) netip.Prefix { return netip.PrefixFrom(addr4(n<<kb), 32-kb) }
	nsLabels := map[string]map[string]string{}
	for n := range nsCount {
		ns := fmt.Sprintf("ns-%d", n)
		nsLabels[ns] = map[string]string{corev1.LabelMetadataName: ns, "team": fmt.Sprintf("team-%d", n%7)}
		for p := range polPerNS {
			app := map[string]string{"app": fmt.Sprintf("app-%d", p%20)}
			var np *networkingv1.NetworkPolicy
			switch p % 10 {
			case 0:
				np = ingress(netpol(ns, fmt.Sprintf("p%03d-deny", p), all))
			case 1, 2, 3:
				np = ingress(netpol(ns, fmt.Sprintf("p%03d-clients", p), app),
					onPorts(from(pods(labels("role", fmt.Sprintf("client-%d", p%7)))), portNum(tcpP, 8080)),
					onPorts(from(podsIn(labels("team", fmt.Sprintf("team-%d", p%7)), labels("role", "client-1"))), portNamed("metrics")))
			case 4, 5:
				np = egress(netpol(ns, fmt.Sprintf("p%03d-egress", p), app),
					onPortsE(to(block("198.18.0.0/16", nsPrefix4(n).String()), block("fd00:10::/48", fmt.Sprintf("fd00:10:0:%x::/64", n))), endPort(portNum(tcpP, 7000), 7100)),
					onPortsE(to(namespaces(labels("team", "team-3"))), portNamed("http")))
			case 6, 7:
				np = ingress(netpol(ns, fmt.Sprintf("p%03d-tier", p), nil),
					onPorts(from(namespaces(expr("team", metav1.LabelSelectorOpIn, "team-1", "team-2"))), portNum(udpP, 53)))
				np.Spec.PodSelector = *expr("tier", metav1.LabelSelectorOpIn, "web", "api")
			default:
				np = egress(ingress(netpol(ns, fmt.Sprintf("p%03d-mixed", p), app), from(block("0.0.0.0/0"))),
					to(pods(expr("tier", metav1.LabelSelectorOpNotIn, "db"))))
			}
			w.policies = append(w.policies, np)
		}
		for k := range podsPerNS {
			tiers := []string{"web", "api", "db"}
			podsAll = append(podsAll, pod{
				ns: ns,
				labels: map[string]string{"app": fmt.Sprintf("app-%d", k%20), "role": fmt.Sprintf("client-%d", k%7), "tier": tiers[k%3],
					"pod-template-hash": fmt.Sprintf("%08x", k)},
				v4: addr4(n<<kb | k),
				v6: netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0, byte(n >> 8), byte(n), 0, 0, 0, 0, 0, 0, byte(k >> 8), byte(k)}),
			})
		}
	}
	ports := []struct {
		port  uint16
		proto uint8
		name  string
	}{{8080, flow.ProtoTCP, "http"}, {9090, flow.ProtoTCP, "metrics"}, {7050, flow.ProtoTCP, ""}, {53, flow.ProtoUDP, "dns"}, {443, flow.ProtoTCP, ""}}
	for i := range 4096 {
		s, d := podsAll[r.IntN(len(podsAll))], podsAll[r.IntN(len(podsAll))]
		pt := ports[r.IntN(len(ports))]
		v6 := i%2 == 1
		peer := func(p pod) Peer {
			a := p.v4
			if v6 {
				a = p.v6
			}
			return Peer{Addr: a, IsPod: true, Namespace: p.ns, Labels: maps.Clone(p.labels), NamespaceLabels: nsLabels[p.ns]}
		}
		fl := Flow{Src: peer(s), Dst: peer(d), Proto: pt.proto, DstPort: pt.port}
		fl.Dst.PortName = pt.name
		if i%16 == 0 { // an external client
			fl.Src = Peer{Addr: netip.AddrFrom4([4]byte{198, 19, 255, byte(i)})}
			if v6 {
				fl.Src.Addr = netip.MustParseAddr("fd00:10:ffff::1")
			}
		}
		w.flows = append(w.flows, fl)
	}
	return w
}

// BenchmarkEvaluate measures verdicts (one flow, both sides) per second
// with 1,000 policies and 10,000 pods.
func BenchmarkEvaluate(b *testing.B) {
	for _, bc := range []struct {
		name                      string
		nsCount, polPerNS, podsNS int
	}{
		{"1000policies-100ns-10kpods", 100, 10, 100},
		{"1000policies-10ns-10kpods", 10, 100, 1000},
		{"1000policies-1ns-10kpods", 1, 1000, 10000},
	} {
		b.Run(bc.name, func(b *testing.B) {
			w := genWorld(bc.nsCount, bc.polPerNS, bc.podsNS)
			s := mustCompile(b, w.policies...)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				s.Evaluate(&w.flows[i&4095])
				i++
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "verdicts/s")
		})
	}
}

func BenchmarkCompile(b *testing.B) {
	w := genWorld(100, 10, 1)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Compile(w.policies); err != nil {
			b.Fatal(err)
		}
	}
}

// TestIngressFromTheNode: a pod's own node (its address, or its pods'
// gateway) always reaches it, however the pod is isolated; another node,
// or an address of no node, is judged by the rules; egress is not
// affected. Both families.
func TestIngressFromTheNode(t *testing.T) {
	apiSel := map[string]string{"app": "api"}
	for _, f := range fams {
		t.Run(f.name, func(t *testing.T) {
			// api admits only 9090 from an ipBlock that holds no node.
			s := mustCompile(t,
				ingress(netpol("back", "deny-all", apiSel)),
				ingress(netpol("back", "metrics", apiSel), onPorts(from(block(f.other)), portNum(corev1.ProtocolTCP, 9090))),
				egress(netpol("back", "no-egress", apiSel)))
			api := apiPeer(f, "http")
			api.Node = "n1"
			for _, c := range []struct {
				name string
				src  Peer
				want Decision
			}{
				{"its node", Peer{Addr: f.ext, Node: "n1"}, Decision{Verdict: flow.VerdictAllowed, Rule: RuleFromNode}},
				{"another node", Peer{Addr: f.ext, Node: "n2"}, Decision{Verdict: flow.VerdictDenied, Namespace: "back", Name: "deny-all", Rule: -1}},
				{"no node", Peer{Addr: f.ext}, Decision{Verdict: flow.VerdictDenied, Namespace: "back", Name: "deny-all", Rule: -1}},
				{"a pod on its node", func() Peer { p := webPeer(f); p.Node = "n1"; return p }(), Decision{Verdict: flow.VerdictDenied, Namespace: "back", Name: "deny-all", Rule: -1}},
			} {
				fl := Flow{Src: c.src, Dst: api, Proto: flow.ProtoTCP, DstPort: 8080}
				if got := s.Evaluate(&fl).Ingress; got != c.want {
					t.Errorf("%s → api:8080 ingress %+v, want %+v", c.name, got, c.want)
				}
			}
			// The pod's egress to its node stays the policies' to judge.
			fl := Flow{Src: api, Dst: Peer{Addr: f.ext, Node: "n1"}, Proto: flow.ProtoTCP, DstPort: 10250}
			if got := s.Evaluate(&fl).Egress; got.Verdict != flow.VerdictDenied {
				t.Errorf("api → its node egress %+v, want denied", got)
			}
		})
	}
}

// TestNamesPorts: NamesPorts is true exactly when a rule, of either
// direction, names a port; the auditor skips the port name's lookup
// otherwise.
func TestNamesPorts(t *testing.T) {
	cases := []struct {
		name string
		pols []*networkingv1.NetworkPolicy
		want bool
	}{
		{"none", nil, false},
		{"numbered ingress", pols(ingress(netpol("x", "p", all), onPorts(from(), portNum(tcpP, 80)))), false},
		{"named ingress", pols(ingress(netpol("x", "p", all), onPorts(from(), portNamed("http")))), true},
		{"named egress", pols(netpol("x", "deny", all), egress(netpol("y", "p", all), onPortsE(to(), portNamed("dns")))), true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := mustCompile(t, c.pols...).NamesPorts(); got != c.want {
				t.Errorf("NamesPorts() = %v, want %v", got, c.want)
			}
		})
	}
	if (*Set)(nil).NamesPorts() {
		t.Error("a nil Set names ports")
	}
}
