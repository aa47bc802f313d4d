package recommend

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// randPorts are the container ports a random workload picks from.
var randPorts = []struct {
	name  string
	port  int32
	proto corev1.Protocol
}{
	{"http", 8080, corev1.ProtocolTCP}, {"https", 8443, corev1.ProtocolTCP}, {"metrics", 9090, corev1.ProtocolTCP},
	{"pg", 5432, corev1.ProtocolTCP}, {"echo", 5353, corev1.ProtocolUDP}, {"sctp", 3868, corev1.ProtocolSCTP},
}

// randCluster is a random lab-shaped cluster of mode: 2 nodes, 1 to 3
// namespaces of 1 to 4 Deployments of 1 to 3 pods, each Deployment's
// pods with the same 1 to 3 container ports (named or not; one
// Deployment in four has pods that name them differently), some behind
// a Service. In dual mode a pod has both families or, one time in five,
// one of them.
func randCluster(r *rand.Rand, mode manifest.Mode) *enrich.Snapshot {
	fams := mode.Families()
	objs := []runtime.Object{}
	for i := 1; i <= 2; i++ {
		var addrs []string
		for _, f := range fams {
			addrs = append(addrs, manifest.NodeAddrFor(i, f).String())
		}
		objs = append(objs, node(manifest.NodeName(i), addrs...))
	}
	podN, svcN := 0, 0
	for n := range 1 + r.IntN(3) {
		namespace := fmt.Sprintf("ns%d", n)
		objs = append(objs, ns(namespace))
		for w := range 1 + r.IntN(4) {
			deploy := fmt.Sprintf("w%d%d", n, w)
			var ports []corev1.ContainerPort
			for _, i := range r.Perm(len(randPorts))[:1+r.IntN(3)] {
				p := randPorts[i]
				name := p.name
				if r.IntN(3) == 0 {
					name = ""
				}
				ports = append(ports, port(name, p.port, p.proto))
			}
			varied := r.IntN(4) == 0
			for k := range 1 + r.IntN(3) {
				podN++
				ports := slices.Clone(ports)
				if varied && k > 0 {
					// Pods of one workload with different named ports:
					// a port renamed or unnamed, or one name on
					// another number.
					i := r.IntN(len(ports))
					switch r.IntN(3) {
					case 0:
						if ports[i].Name != "" {
							ports[i].Name += "-x"
						}
					case 1:
						ports[i].Name = ""
					default:
						ports[i].ContainerPort++
					}
				}
				nodeI := 1 + r.IntN(2)
				var addrs []string
				pick := fams
				if len(fams) == 2 && r.IntN(5) == 0 {
					pick = fams[r.IntN(2):][:1]
				}
				for _, f := range pick {
					a := manifest.PodCIDRFor(nodeI, f).Addr().As16()
					if f == corev1.IPv4Protocol {
						a4 := manifest.PodCIDRFor(nodeI, f).Addr().As4()
						a4[3] = byte(podN)
						addrs = append(addrs, netip.AddrFrom4(a4).String())
						continue
					}
					a[15] = byte(podN)
					addrs = append(addrs, netip.AddrFrom16(a).String())
				}
				objs = append(objs, deployPod(namespace, deploy, fmt.Sprintf("%s-%d", deploy, k), manifest.NodeName(nodeI), addrs, ports...))
			}
			if r.IntN(2) == 0 && ports[0].Protocol != corev1.ProtocolSCTP {
				svcN++
				tp := intstr.FromInt32(ports[0].ContainerPort)
				if ports[0].Name != "" && r.IntN(2) == 0 {
					tp = intstr.FromString(ports[0].Name)
				}
				s := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: deploy},
					Spec: corev1.ServiceSpec{Selector: map[string]string{"app": deploy},
						Ports: []corev1.ServicePort{{Port: 80, TargetPort: tp, Protocol: ports[0].Protocol}}}}
				for _, f := range fams {
					s.Spec.IPFamilies = append(s.Spec.IPFamilies, f)
					if f == corev1.IPv4Protocol {
						s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, fmt.Sprintf("198.19.0.%d", svcN))
					} else {
						s.Spec.ClusterIPs = append(s.Spec.ClusterIPs, fmt.Sprintf("fd00:10:ff::%x", svcN))
					}
				}
				objs = append(objs, s)
			}
		}
	}
	return enrich.NewSnapshot(objs...)
}

// obsKey is what least-privilege allows: a workload to a workload on a
// protocol and port (proto 0: every protocol and port, for a ping).
type obsKey struct {
	src, dst string
	proto    uint8
	port     uint16
}

// randFlows observes random traffic between the pods of view and with
// outside addresses: each group allowed, or one time in six only denied
// or only probes. It returns the groups and what least-privilege must
// allow.
func randFlows(r *rand.Rand, view *enrich.Snapshot) ([]audit.ObservedFlow, map[obsKey]bool) {
	want := map[obsKey]bool{}
	var out []audit.ObservedFlow
	wl := func(p *enrich.Pod) string { return p.Namespace + "/" + view.Workload(p).Name }
	for range 1 + r.IntN(3*len(view.Pods)) {
		src, dst := view.Pods[r.IntN(len(view.Pods))], view.Pods[r.IntN(len(view.Pods))]
		var fams []uint8
		for _, v := range []uint8{4, 6} {
			_, ok1 := enrich.AddrOfFamily(src.Addrs, v)
			_, ok2 := enrich.AddrOfFamily(dst.Addrs, v)
			if ok1 && ok2 {
				fams = append(fams, v)
			}
		}
		if src == dst || len(fams) == 0 {
			continue
		}
		v := fams[r.IntN(len(fams))]
		f := audit.ObservedFlow{IPVersion: v, Allowed: 1 + uint64(r.IntN(100))}
		f.Src, _ = podEnd(view, src, v)
		f.Dst, _ = podEnd(view, dst, v)
		switch x := r.IntN(10); {
		case x == 0: // a ping
			f.Protocol = flow.ProtoICMP
			if v == 6 {
				f.Protocol = flow.ProtoICMPv6
			}
			f.DstPort = 8 << 8
		case x == 1: // a port the pod does not declare
			f.Protocol, f.DstPort = flow.ProtoTCP, uint16(7000+r.IntN(3))
		default:
			cp := dst.Ports[r.IntN(len(dst.Ports))]
			f.Protocol, f.DstPort = policy.ProtoNumber(&cp.Protocol), uint16(cp.Port)
			if svc, ok := view.Service(dst.Namespace, view.Workload(dst).Name); ok && r.IntN(2) == 0 && svc.Ports[0].Protocol == cp.Protocol {
				if tp, name := targetPort(svc, 80, f.Protocol); (name == "" && tp == f.DstPort) || (name != "" && name == cp.Name) {
					f.ServiceNamespace, f.ServiceName, f.ServicePort = svc.Namespace, svc.Name, 80
				}
			}
		}
		switch r.IntN(6) {
		case 0:
			f.Allowed, f.Denied = 0, 2
		case 1:
			f.Allowed, f.Probes = 0, 1
		default:
			k := obsKey{src: wl(src), dst: wl(dst), proto: f.Protocol, port: f.DstPort}
			if !flow.HasPorts(f.Protocol) {
				k.proto, k.port = 0, 0
			}
			want[k] = true
		}
		out = append(out, f)
	}
	// Outside peers, which only the replay checks.
	for range r.IntN(4) {
		p := view.Pods[r.IntN(len(view.Pods))]
		a := p.Addrs[r.IntN(len(p.Addrs))]
		v := flow.Version(a)
		ext := netip.MustParseAddr(fmt.Sprintf("198.19.255.%d", 1+r.IntN(200)))
		if v == 6 {
			ext = netip.MustParseAddr(fmt.Sprintf("fd00:10:ffff::%x", 1+r.IntN(200)))
		}
		pe, _ := podEnd(view, p, v)
		f := audit.ObservedFlow{Src: pe, Dst: addrEnd(ext), Protocol: flow.ProtoTCP, DstPort: 443, IPVersion: v, Allowed: 1}
		if r.IntN(2) == 0 {
			f.Src, f.Dst = f.Dst, f.Src
			f.DstPort = uint16(p.Ports[0].Port)
			f.Protocol = policy.ProtoNumber(&p.Ports[0].Protocol)
		}
		out = append(out, f)
	}
	return out, want
}

// TestPropertyLeastPrivilege: for random lab-shaped clusters in each IP
// mode and random observed flows, the least-privilege recommendation
// (over the cluster) replayed over the flows it was built from allows
// every group observed allowed, per family; and between every two pods
// of the cluster, over every family both have, on every port either
// declares or a flow used (and one nobody uses), it allows nothing that
// was not observed allowed between their workloads, and all of it when
// the destination's pods declare the same ports (selectors name
// workloads, so one observed pod pair stands for its workloads' pairs;
// a ping allows every port, as a rule without ports must).
func TestPropertyLeastPrivilege(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			for seed := range uint64(100) {
				r := rand.New(rand.NewPCG(seed, uint64(len(mode))))
				view := randCluster(r, mode)
				flows, want := randFlows(r, view)
				rec := recommend(t, view, flows, Options{Mode: LeastPrivilege})
				rep, err := Replay(view, rec.NetworkPolicies(), flows)
				if err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
				for _, f := range rep.Families {
					if f.Kept != f.Allowed {
						t.Fatalf("seed %d: IPv%d: %d of %d observed allowed groups kept; newly denied %+v\n%s", seed, f.Family, f.Kept, f.Allowed, f.NewlyDenied, yamlOf(t, rec))
					}
				}
				checkExact(t, seed, view, rec, flows, want)
			}
		})
	}
}

// checkExact checks that rec allows between the pods of view exactly
// what want says.
func checkExact(t *testing.T, seed uint64, view *enrich.Snapshot, rec *Recommendation, flows []audit.ObservedFlow, want map[obsKey]bool) {
	t.Helper()
	set, err := policy.Compile(rec.NetworkPolicies())
	if err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	type pp struct {
		proto uint8
		port  uint16
	}
	ports := []pp{{flow.ProtoTCP, 9999}, {flow.ProtoICMP, 8 << 8}}
	for _, f := range flows {
		if flow.HasPorts(f.Protocol) && !slices.Contains(ports, pp{f.Protocol, f.DstPort}) {
			ports = append(ports, pp{f.Protocol, f.DstPort})
		}
	}
	for _, p := range view.Pods {
		for _, cp := range p.Ports {
			if x := (pp{policy.ProtoNumber(&cp.Protocol), uint16(cp.Port)}); !slices.Contains(ports, x) {
				ports = append(ports, x)
			}
		}
	}
	wl := func(p *enrich.Pod) string { return p.Namespace + "/" + view.Workload(p).Name }
	for _, src := range view.Pods {
		for _, dst := range view.Pods {
			if src == dst {
				continue
			}
			for _, v := range []uint8{4, 6} {
				sa, ok1 := enrich.AddrOfFamily(src.Addrs, v)
				da, ok2 := enrich.AddrOfFamily(dst.Addrs, v)
				if !ok1 || !ok2 {
					continue
				}
				for _, pt := range ports {
					proto := pt.proto
					if proto == flow.ProtoICMP && v == 6 {
						proto = flow.ProtoICMPv6
					}
					f := audit.PodFlow(view, src, sa, dst, da, proto, pt.port)
					got := set.Evaluate(&f).Allowed()
					exp := want[obsKey{wl(src), wl(dst), 0, 0}] || flow.HasPorts(proto) && want[obsKey{wl(src), wl(dst), proto, pt.port}]
					// Named ports stand for other numbers on pods of one
					// workload that name them differently: there the
					// recommendation may allow less than the workloads'
					// numbers (the replay checks it allows what was
					// observed), never more.
					if got && !exp || exp && !got && uniform(view, dst) {
						t.Fatalf("seed %d: %s → %s (%s → %s) %s: allowed %t, want %t\n%s", seed, src.Name, dst.Name, sa, da, portText(proto, pt.port), got, exp, yamlOf(t, rec))
					}
				}
			}
		}
	}
}

// uniform reports whether the pods of p's workload declare the same
// ports.
func uniform(view *enrich.Snapshot, p *enrich.Pod) bool {
	w := view.Workload(p)
	for _, q := range view.Pods {
		if q.Namespace == p.Namespace && view.Workload(q) == w && !slices.Equal(q.Ports, p.Ports) {
			return false
		}
	}
	return true
}
