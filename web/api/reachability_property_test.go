package api

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"sort"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
)

// serviceObject is the Service whose view is s (audit.ServiceSpecOf),
// with ClusterIPs numbered by i in each of its families.
func serviceObject(s *audit.ServiceSpec, i int) *corev1.Service {
	o := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: s.Namespace, Name: s.Name}, Spec: corev1.ServiceSpec{Selector: s.Selector}}
	for _, f := range s.Families {
		fam, ip := corev1.IPv4Protocol, fmt.Sprintf("198.19.%d.%d", i/256, i%256)
		if f == 6 {
			fam, ip = corev1.IPv6Protocol, fmt.Sprintf("fd00:10:96::%x", i)
		}
		o.Spec.IPFamilies = append(o.Spec.IPFamilies, fam)
		o.Spec.ClusterIPs = append(o.Spec.ClusterIPs, ip)
	}
	for _, p := range s.Ports {
		sp := corev1.ServicePort{Name: p.Name, Port: int32(p.Port), TargetPort: intstr.FromInt32(int32(p.TargetPort))}
		if p.TargetPortName != "" {
			sp.TargetPort = intstr.FromString(p.TargetPortName)
		}
		sp.Protocol = map[uint8]corev1.Protocol{6: corev1.ProtocolTCP, 17: corev1.ProtocolUDP, 132: corev1.ProtocolSCTP}[p.Proto]
		o.Spec.Ports = append(o.Spec.Ports, sp)
	}
	return o
}

// labGen builds a random lab-shaped cluster: namespaces with team
// labels, workloads of 1-3 pods (each pod with the mode's families, in
// dual mode now and then one family only), container ports from the
// lab's set (sometimes unnamed or missing), Services with random
// families, ports and target ports (numbers, names, unset), and random
// NetworkPolicies (default denies, pod/namespace selectors, ipBlocks of
// either family with excepts, numbered and named ports, egress rules).
type labGen struct {
	r         *rand.Rand
	inv       *enrich.Snapshot
	services  map[string]*audit.ServiceSpec
	workloads []audit.Endpoint
	pods      []audit.Endpoint
	policies  []*networkingv1.NetworkPolicy
}

var controller = true

var genPorts = []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}, {Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}, {Name: "udp-echo", ContainerPort: 5353, Protocol: corev1.ProtocolUDP}}

func newLabGen(seed uint64, fams []int) *labGen {
	g := &labGen{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), services: map[string]*audit.ServiceSpec{}}
	nss := []string{"frontend", "backend", "tools"}[:1+g.r.IntN(3)]
	teams := []string{"web", "api", "ops"}
	apps := []string{"web", "api", "db", "probe"}
	k := 0
	var objs []runtime.Object
	for ni, ns := range nss {
		objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{corev1.LabelMetadataName: ns, "team": teams[g.r.IntN(len(teams))]}}})
		for wi := range 1 + g.r.IntN(3) {
			app := apps[g.r.IntN(len(apps))]
			wl := app + strconv.Itoa(wi)
			g.workloads = append(g.workloads, audit.Endpoint{Kind: "workload", Namespace: ns, Name: wl})
			var ports []corev1.ContainerPort
			for _, p := range genPorts {
				if g.r.IntN(4) > 0 {
					if g.r.IntN(5) == 0 {
						p.Name = ""
					}
					ports = append(ports, p)
				}
			}
			for pi := range 1 + g.r.IntN(3) {
				k++
				node := 1 + g.r.IntN(2)
				p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: fmt.Sprintf("%s-%d", wl, pi), Labels: map[string]string{"app": app},
					OwnerReferences: []metav1.OwnerReference{{Kind: "StatefulSet", Name: wl, Controller: &controller}}}}
				p.Spec.Containers = []corev1.Container{{Name: "c", Ports: ports}}
				v4 := corev1.PodIP{IP: netip.AddrFrom4([4]byte{198, 18, byte(node), byte(10 + k)}).String()}
				for _, f := range fams {
					if len(fams) == 2 && g.r.IntN(8) == 0 {
						continue // a pod with one family of a dual-stack cluster
					}
					if f == 4 {
						p.Status.PodIPs = append(p.Status.PodIPs, v4)
					} else {
						p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: fmt.Sprintf("fd00:10:0:%d::%d", node, 10+k)})
					}
				}
				if len(p.Status.PodIPs) == 0 {
					p.Status.PodIPs = append(p.Status.PodIPs, v4)
				}
				objs = append(objs, p)
				g.pods = append(g.pods, audit.Endpoint{Kind: "pod", Namespace: ns, Name: p.Name})
			}
			if g.r.IntN(3) > 0 {
				s := &audit.ServiceSpec{Namespace: ns, Name: "svc-" + wl, Selector: map[string]string{"app": app}}
				for _, f := range fams {
					if g.r.IntN(3) > 0 {
						s.Families = append(s.Families, f)
					}
				}
				for _, p := range genPorts {
					if g.r.IntN(2) == 0 {
						continue
					}
					sp := audit.ServicePort{Name: p.Name, Proto: policy.ProtoNumber(&p.Protocol), Port: uint16(p.ContainerPort)}
					switch g.r.IntN(4) {
					case 0:
						sp.Port = 80 + uint16(g.r.IntN(2))
						sp.TargetPortName = p.Name
					case 1:
						sp.TargetPort = uint16(p.ContainerPort)
						sp.Port = 80
					case 2:
						sp.TargetPortName = "nope"
					}
					s.Ports = append(s.Ports, sp)
				}
				g.services[ns+"/"+s.Name] = s
				objs = append(objs, serviceObject(s, len(g.services)))
			}
		}
		_ = ni
	}
	for i := range g.r.IntN(6) {
		g.policies = append(g.policies, g.policy(nss, apps, i))
	}
	for _, p := range g.policies {
		objs = append(objs, p)
	}
	g.inv = enrich.NewSnapshot(objs...)
	return g
}

func (g *labGen) policy(nss, apps []string, i int) *networkingv1.NetworkPolicy {
	ns := nss[g.r.IntN(len(nss))]
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p" + strconv.Itoa(i)}}
	if g.r.IntN(2) == 0 {
		np.Spec.PodSelector.MatchLabels = map[string]string{"app": apps[g.r.IntN(len(apps))]}
	}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	peers := func() []networkingv1.NetworkPolicyPeer {
		var out []networkingv1.NetworkPolicyPeer
		for range g.r.IntN(3) {
			var p networkingv1.NetworkPolicyPeer
			switch g.r.IntN(4) {
			case 0:
				p.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": apps[g.r.IntN(len(apps))]}}
			case 1:
				p.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": []string{"web", "api", "ops"}[g.r.IntN(3)]}}
			case 2:
				p.IPBlock = &networkingv1.IPBlock{CIDR: "198.18.0.0/16", Except: []string{"198.18." + strconv.Itoa(1+g.r.IntN(2)) + ".0/24"}}
			default:
				p.IPBlock = &networkingv1.IPBlock{CIDR: "fd00:10::/56"}
				if g.r.IntN(2) == 0 {
					p.IPBlock.Except = []string{"fd00:10:0:" + strconv.Itoa(1+g.r.IntN(2)) + "::/64"}
				}
			}
			out = append(out, p)
		}
		return out
	}
	ports := func() []networkingv1.NetworkPolicyPort {
		var out []networkingv1.NetworkPolicyPort
		for range g.r.IntN(3) {
			p := genPorts[g.r.IntN(len(genPorts))]
			proto := &tcp
			if p.Protocol == corev1.ProtocolUDP {
				proto = &udp
			}
			v := intstr.FromInt32(p.ContainerPort)
			if g.r.IntN(2) == 0 {
				v = intstr.FromString(p.Name)
			}
			out = append(out, networkingv1.NetworkPolicyPort{Protocol: proto, Port: &v})
		}
		return out
	}
	if g.r.IntN(3) > 0 {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress)
		for range g.r.IntN(3) {
			np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers(), Ports: ports()})
		}
	}
	if len(np.Spec.PolicyTypes) == 0 || g.r.IntN(3) == 0 {
		np.Spec.PolicyTypes = append(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
		for range g.r.IntN(3) {
			np.Spec.Egress = append(np.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peers(), Ports: ports()})
		}
	}
	return np
}

// oracle is what a cell family must say, computed pair by pair from the
// cluster view without the evaluator's code: the pods of each end, the
// Service's families and ports, and the policy flow of each pair.
type oracle struct {
	outcome        string
	allowed, total int
	pairs          []string
}

func (g *labGen) members(e audit.Endpoint) []*enrich.Pod {
	var out []*enrich.Pod
	for _, p := range g.inv.Pods {
		switch e.Kind {
		case "pod":
			if p.Namespace == e.Namespace && p.Name == e.Name {
				out = append(out, p)
			}
		case "workload":
			if p.Namespace == e.Namespace && p.Owner.Name == e.Name {
				out = append(out, p)
			}
		case "service":
			s := g.services[e.Namespace+"/"+e.Name]
			if p.Namespace == e.Namespace && p.Labels["app"] == s.Selector["app"] {
				out = append(out, p)
			}
		}
	}
	return out
}

func (g *labGen) peer(p *enrich.Pod, a netip.Addr) policy.Peer {
	ns, _ := g.inv.Namespace(p.Namespace)
	return policy.Peer{Addr: a, IsPod: true, Namespace: p.Namespace, Labels: p.Labels, NamespaceLabels: ns.Labels}
}

func (g *labGen) expect(set *policy.Set, src, dst audit.Endpoint, fam int, proto uint8, port uint16) oracle {
	svc := g.services[dst.Namespace+"/"+dst.Name]
	if dst.Kind != "service" {
		svc = nil
	}
	if svc != nil && !slices.Contains(svc.Families, fam) {
		return oracle{outcome: audit.OutcomeNoFamily}
	}
	type target struct {
		p        *enrich.Pod
		port, sp uint16
	}
	var srcs []*enrich.Pod
	for _, p := range g.members(src) {
		if _, ok := enrich.AddrOfFamily(p.Addrs, uint8(fam)); ok {
			srcs = append(srcs, p)
		}
	}
	if len(srcs) == 0 {
		return oracle{outcome: audit.OutcomeUnavailable}
	}
	var sps []audit.ServicePort
	if svc != nil {
		for _, sp := range svc.Ports {
			if sp.Proto == proto && (port == 0 || sp.Port == port) {
				sps = append(sps, sp)
			}
		}
		if len(sps) == 0 {
			return oracle{outcome: audit.OutcomeNoPort}
		}
	}
	var dsts []target
	for _, p := range g.members(dst) {
		if _, ok := enrich.AddrOfFamily(p.Addrs, uint8(fam)); !ok {
			continue
		}
		if svc == nil {
			// Any port of a pod: each port of proto it declares, else 0.
			n := len(dsts)
			for _, cp := range p.Ports {
				if port == 0 && slices.Contains([]uint8{6, 17, 132}, proto) && policy.ProtoNumber(&cp.Protocol) == proto &&
					!slices.ContainsFunc(dsts[n:], func(t target) bool { return t.port == uint16(cp.Port) }) {
					dsts = append(dsts, target{p, uint16(cp.Port), 0})
				}
			}
			if len(dsts) == n {
				dsts = append(dsts, target{p, port, 0})
			}
			continue
		}
		for _, sp := range sps {
			switch {
			case sp.TargetPortName != "":
				for _, cp := range p.Ports {
					if cp.Name == sp.TargetPortName && policy.ProtoNumber(&cp.Protocol) == proto {
						dsts = append(dsts, target{p, uint16(cp.Port), sp.Port})
						break
					}
				}
			case sp.TargetPort != 0:
				dsts = append(dsts, target{p, sp.TargetPort, sp.Port})
			default:
				dsts = append(dsts, target{p, sp.Port, sp.Port})
			}
		}
	}
	if len(dsts) == 0 {
		if svc != nil {
			return oracle{outcome: audit.OutcomeNoBackends}
		}
		return oracle{outcome: audit.OutcomeUnavailable}
	}
	var o oracle
	for _, s := range srcs {
		for _, d := range dsts {
			if s == d.p {
				continue
			}
			sa, _ := enrich.AddrOfFamily(s.Addrs, uint8(fam))
			da, _ := enrich.AddrOfFamily(d.p.Addrs, uint8(fam))
			f := policy.Flow{Src: g.peer(s, sa), Dst: g.peer(d.p, da), Proto: proto, DstPort: d.port}
			f.Dst.PortName = d.p.PortName(d.port, proto)
			res := set.Evaluate(&f)
			o.total++
			if res.Allowed() {
				o.allowed++
			}
			o.pairs = append(o.pairs, fmt.Sprintf("%s/%s→%s/%s:%d %v", s.Namespace, s.Name, d.p.Namespace, d.p.Name, d.port, res.Allowed()))
		}
	}
	switch {
	case o.total == 0:
		o.outcome = audit.OutcomeSelf
	case o.allowed == o.total:
		o.outcome = audit.OutcomeAllow
	case o.allowed == 0:
		o.outcome = audit.OutcomeDeny
	default:
		o.outcome = audit.OutcomePartial
	}
	return o
}

// TestReachabilityProperty: for random lab-shaped clusters and policies
// in each family setup, every cell of the matrix the API answers equals
// the policy evaluation of every pod pair it covers, in both families,
// and the Service rules hold (evaluated only in the Service's families,
// on its ports, mapped to each backend's target port).
func TestReachabilityProperty(t *testing.T) {
	needEngine(t)
	for _, setup := range []struct {
		name string
		fams []int
	}{{"ipv4", []int{4}}, {"ipv6", []int{6}}, {"dual", []int{4, 6}}} {
		t.Run(setup.name, func(t *testing.T) {
			cells := map[string]int{}
			for seed := range uint64(40) {
				g := newLabGen(seed, setup.fams)
				set, err := policy.Compile(g.policies)
				if err != nil {
					t.Fatalf("seed %d: compile: %v", seed, err)
				}
				h := testAPI(t, Config{Evaluator: audit.PolicyEvaluator{
					Policies: func() *policy.Set { return set },
					Resolver: audit.ClusterResolver{
						Cluster: func() (*enrich.Snapshot, error) { return g.inv, nil },
					},
				}})
				srcs := append(slices.Clone(g.workloads), g.pods[g.r.IntN(len(g.pods))])
				dsts := append(slices.Clone(g.workloads), g.pods[g.r.IntN(len(g.pods))])
				for _, s := range g.services {
					dsts = append(dsts, audit.Endpoint{Kind: "service", Namespace: s.Namespace, Name: s.Name})
				}
				sort.Slice(dsts[len(g.workloads)+1:], func(i, j int) bool {
					return dsts[len(g.workloads)+1+i].String() < dsts[len(g.workloads)+1+j].String()
				})
				srcs, dsts = srcs[:min(len(srcs), maxMatrixSide)], dsts[:min(len(dsts), maxMatrixSide)]
				q := []struct {
					proto string
					n     uint8
					port  uint16
				}{{"tcp", 6, 8080}, {"tcp", 6, 9090}, {"tcp", 6, 80}, {"udp", 17, 5353}, {"tcp", 6, 0}}[g.r.IntN(5)]
				body, _ := json.Marshal(ReachabilityRequest{Sources: srcs, Destinations: dsts, Protocol: q.proto, Port: q.port})
				r := do(t, h, "POST", "/api/v1/reachability", string(body))
				if r.code != 200 {
					t.Fatalf("seed %d: %s", seed, r)
				}
				m := decode[Reachability](t, r)
				for i, s := range srcs {
					for j, d := range dsts {
						for _, fam := range []int{4, 6} {
							got := m.Cells[i][j].Families[strconv.Itoa(fam)]
							want := g.expect(set, s, d, fam, q.n, q.port)
							cells[want.outcome]++
							var pairs []string
							for _, p := range got.Pairs {
								pairs = append(pairs, fmt.Sprintf("%s→%s:%d %v", p.Src, p.Dst, p.Port, p.Verdict != "denied" && p.Verdict != "rejected"))
							}
							sort.Strings(pairs)
							sort.Strings(want.pairs)
							if got.Outcome != want.outcome || got.PairsAllowed != want.allowed || got.PairsTotal != want.total ||
								!got.PairsTruncated && !slices.Equal(pairs, want.pairs) {
								t.Fatalf("seed %d %s → %s on %s/%d IPv%d:\n got %s %d/%d %v (%s)\nwant %s %d/%d %v",
									seed, s, d, q.proto, q.port, fam, got.Outcome, got.PairsAllowed, got.PairsTotal, pairs, got.Reason,
									want.outcome, want.allowed, want.total, want.pairs)
							}
						}
					}
				}
			}
			t.Logf("cells by outcome: %v", cells)
			// The generator must reach every kind of answer, or the
			// property says little.
			want := []string{audit.OutcomeAllow, audit.OutcomeDeny, audit.OutcomeSelf, audit.OutcomeNoPort}
			if len(setup.fams) == 2 {
				want = append(want, audit.OutcomePartial, audit.OutcomeNoFamily)
			}
			for _, o := range want {
				if cells[o] == 0 {
					t.Errorf("no cell came out %s", o)
				}
			}
		})
	}
}
