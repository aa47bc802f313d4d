package main

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"sort"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Shape is the stated cluster shape of a data set. Together with Seed,
// Rows, Days and End it determines every generated row.
type Shape struct {
	Namespaces int `json:"namespaces"`
	Pods       int `json:"pods"`
	Services   int `json:"services"`
	Nodes      int `json:"nodes"`
	Zones      int `json:"zones"`
	// WorkloadsPerNamespace splits each namespace's pods into workloads.
	WorkloadsPerNamespace int `json:"workloads_per_namespace"`
}

// DefaultShape is the cluster: 2,000 pods in 40 namespaces, 300
// Services, 50 nodes in 3 zones.
var DefaultShape = Shape{Namespaces: 40, Pods: 2000, Services: 300, Nodes: 50, Zones: 3, WorkloadsPerNamespace: 8}

// Lab address plan (strict): IPv4 inside 198.18.0.0/15, IPv6 inside
// fd00:10::/32.
//
//	pods      198.18.0.0/17 (by pod index)     fd00:10:244::/48 (pod index in the last 32 bits)
//	Services  198.19.0.0/17                    fd00:10:96::/112
//	nodes     198.18.254.0/24                  fd00:10:ff::/64
//	external  198.19.255.0/24                  fd00:10:ffff::/48
var (
	labV4 = netip.MustParsePrefix("198.18.0.0/15")
	labV6 = netip.MustParsePrefix("fd00:10::/32")
)

func v4(base [2]byte, n int) netip.Addr {
	return netip.AddrFrom4([4]byte{base[0], base[1] + byte(n>>16), byte(n >> 8), byte(n)})
}

func v6(prefix [6]byte, n int) netip.Addr {
	var b [16]byte
	copy(b[:], prefix[:])
	b[12], b[13], b[14], b[15] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	return netip.AddrFrom16(b)
}

// Node is a cluster node (the exporter of its pods' flows).
type Node struct {
	Name, Zone   string
	Addr4, Addr6 netip.Addr
}

// Pod is one pod. Families are those of its namespace.
type Pod struct {
	Namespace, Name string
	Workload        *Workload
	Node            *Node
	Addr4, Addr6    netip.Addr // invalid when the family is absent
	Labels          map[string]string
}

// Workload is a Deployment or StatefulSet and its pods; Port is what its
// pods serve.
type Workload struct {
	Index           int
	Namespace, Name string
	Kind            string
	Pods            []*Pod
	Port            uint16
	Proto           uint8
	PortName        string
	Service         *Service // nil: no Service selects it
	Has4, Has6      bool
	// AllowedFrom are the client workloads its ingress policy allows, in
	// rule order (ingress rule i allows AllowedFrom[i]).
	AllowedFrom []*Workload
}

// Service is a ClusterIP Service in front of one workload.
type Service struct {
	Namespace, Name string
	Workload        *Workload
	VIP4, VIP6      netip.Addr // invalid when the family is absent
	Port            uint16
}

// Verdict classes of an edge per family.
const (
	edgeNotIsolated = iota // destination namespace has no policy
	edgeAllowed            // allowed by the destination's ingress rule
	edgeDenied             // isolated, no rule allows it
	edgeRejected           // denied with a reject
)

// Edge is a conversation the generator draws flows from: a client workload
// to a Service, a workload directly, or an outside address.
type Edge struct {
	Src      *Workload
	Dst      *Workload // nil for external
	Svc      *Service  // nil: pod to pod
	External bool
	Fams     []uint8 // families the edge is used over
	Verdict  [7]int  // by family (index 4 and 6)
	Rule     int32   // ingress rule index when allowed
	Weight   float64
	Egress   bool // the source namespace has an egress policy (allows all)
}

// Cluster is the generated cluster.
type Cluster struct {
	Shape      Shape
	Namespaces []string
	// Isolated namespaces have one ingress NetworkPolicy per workload;
	// Family says 46 (dual-stack), 4 or 6 per namespace.
	Isolated   map[string]bool
	EgressPol  map[string]bool
	Family     map[string]int
	Nodes      []*Node
	Workloads  []*Workload
	Pods       []*Pod
	Services   []*Service
	Edges      []*Edge
	cumWeights []float64
	External4  []netip.Addr
	External6  []netip.Addr
}

var nsBase = []string{"kube-system", "monitoring", "ingress", "shop", "payments", "checkout", "catalog", "search", "identity", "billing",
	"orders", "shipping", "inventory", "reviews", "recommendations", "ads", "media", "notifications", "analytics", "reporting"}
var wlBase = []string{"api", "web", "worker", "db", "cache", "queue", "auth", "gateway", "scheduler", "indexer", "exporter", "proxy"}
var ports = []struct {
	port uint16
	name string
}{{8080, "http"}, {80, "http"}, {443, "https"}, {5432, "postgres"}, {6379, "redis"}, {9090, "metrics"}, {3306, "mysql"}, {9092, "kafka"}, {8443, "https-alt"}, {27017, "mongo"}}

// NewCluster builds the cluster of shape s from seed, deterministically.
func NewCluster(s Shape, seed uint64) *Cluster {
	rng := rand.New(rand.NewPCG(seed, 0x5ca1e))
	c := &Cluster{Shape: s, Isolated: map[string]bool{}, EgressPol: map[string]bool{}, Family: map[string]int{}}
	for i := range s.Namespaces {
		name := fmt.Sprintf("team-%02d", i)
		if i < len(nsBase) {
			name = nsBase[i]
		}
		c.Namespaces = append(c.Namespaces, name)
		// Families: about 75% dual-stack, 15% IPv4 only, 10% IPv6 only
		// (kube-system is dual-stack: everyone resolves names).
		switch f := rng.IntN(20); {
		case i == 0 || f < 15:
			c.Family[name] = 46
		case f < 18:
			c.Family[name] = 4
		default:
			c.Family[name] = 6
		}
		c.Isolated[name] = i != 0 && rng.IntN(4) != 0 // ~75% isolated
		c.EgressPol[name] = rng.IntN(4) == 0
	}
	for i := range s.Nodes {
		c.Nodes = append(c.Nodes, &Node{Name: fmt.Sprintf("node-%02d", i), Zone: fmt.Sprintf("zone-%c", 'a'+i%s.Zones),
			Addr4: v4([2]byte{198, 18}, 254<<8|(i+1)), Addr6: v6([6]byte{0xfd, 0, 0, 0x10, 0, 0xff}, i+1)})
	}
	// Workloads: WorkloadsPerNamespace per namespace, sharing the
	// namespace's pods with random weights (at least one pod each).
	podsPerNS := s.Pods / s.Namespaces
	for ni, ns := range c.Namespaces {
		nw := s.WorkloadsPerNamespace
		n := podsPerNS
		if ni < s.Pods%s.Namespaces {
			n++
		}
		weights := make([]float64, nw)
		sum := 0.0
		for i := range weights {
			weights[i] = 0.3 + rng.ExpFloat64()
			sum += weights[i]
		}
		counts := make([]int, nw)
		left := n - nw
		for i := range counts {
			counts[i] = 1 + int(float64(n-nw)*weights[i]/sum)
			left -= counts[i] - 1
		}
		for i := 0; left > 0; i, left = (i+1)%nw, left-1 {
			counts[i]++
		}
		for wi := range nw {
			name := fmt.Sprintf("%s-%d", wlBase[(ni+wi)%len(wlBase)], wi)
			if ni == 0 && wi == 0 {
				name = "coredns"
			}
			p := ports[rng.IntN(len(ports))]
			w := &Workload{Index: len(c.Workloads), Namespace: ns, Name: name, Kind: "Deployment", Port: p.port, PortName: p.name, Proto: 6,
				Has4: c.Family[ns] != 6, Has6: c.Family[ns] != 4}
			if name == "coredns" {
				w.Port, w.PortName, w.Proto = 53, "dns", 17
			}
			if rng.IntN(5) == 0 {
				w.Kind = "StatefulSet"
			}
			hash := fmt.Sprintf("%09x", rng.Uint64()>>28)
			for k := range counts[wi] {
				pi := len(c.Pods)
				pod := &Pod{Namespace: ns, Workload: w, Node: c.Nodes[rng.IntN(len(c.Nodes))]}
				pod.Labels = map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": ns, "team": fmt.Sprintf("t%d", ni%7)}
				if w.Kind == "StatefulSet" {
					pod.Name = fmt.Sprintf("%s-%d", name, k)
					pod.Labels["statefulset.kubernetes.io/pod-name"] = pod.Name
				} else {
					pod.Name = fmt.Sprintf("%s-%s-%05x", name, hash, rng.Uint32()&0xfffff)
					pod.Labels["pod-template-hash"] = hash
				}
				if w.Has4 {
					pod.Addr4 = v4([2]byte{198, 18}, pi+1)
				}
				if w.Has6 {
					pod.Addr6 = v6([6]byte{0xfd, 0, 0, 0x10, 0x02, 0x44}, pi+1)
				}
				w.Pods = append(w.Pods, pod)
				c.Pods = append(c.Pods, pod)
			}
			c.Workloads = append(c.Workloads, w)
		}
	}
	// Services: s.Services of the workloads (coredns always), named as
	// the workload; families: the namespace's, a dual-stack namespace's
	// Services are 80% dual-stack, 10% each single-stack.
	order := rng.Perm(len(c.Workloads))
	sort.SliceStable(order, func(i, j int) bool { return order[i] == 0 && order[j] != 0 })
	for k, wi := range order[:min(s.Services, len(order))] {
		w := c.Workloads[wi]
		svc := &Service{Namespace: w.Namespace, Name: w.Name, Workload: w, Port: w.Port}
		if w.Port == 8080 {
			svc.Port = 80
		}
		has4, has6 := w.Has4, w.Has6
		if has4 && has6 && w.Name != "coredns" {
			switch rng.IntN(10) {
			case 0:
				has6 = false
			case 1:
				has4 = false
			}
		}
		if has4 {
			svc.VIP4 = v4([2]byte{198, 19}, k+1)
		}
		if has6 {
			svc.VIP6 = v6([6]byte{0xfd, 0, 0, 0x10, 0, 0x96}, k+1)
		}
		w.Service = svc
		c.Services = append(c.Services, svc)
	}
	for i := range 16 {
		c.External4 = append(c.External4, v4([2]byte{198, 19}, 255<<8|(i+10)))
		c.External6 = append(c.External6, v6([6]byte{0xfd, 0, 0, 0x10, 0xff, 0xff}, i+10))
	}
	c.buildEdges(rng)
	return c
}

// buildEdges gives each workload a DNS edge and 2-5 edges to other
// workloads (75% in its namespace), through their Service when they have
// one (90%); 5% also talk to outside addresses. About 4% of the edges are
// denied, 0.5% rejected, and 3% of dual-stack edges are allowed over IPv4
// only (an ipBlock policy that forgot IPv6).
func (c *Cluster) buildEdges(rng *rand.Rand) {
	dns := c.Workloads[0]
	byNS := map[string][]*Workload{}
	for _, w := range c.Workloads {
		byNS[w.Namespace] = append(byNS[w.Namespace], w)
	}
	for _, w := range c.Workloads {
		if w != dns {
			c.addEdge(rng, w, dns, dns.Service, 0.4+0.4*rng.Float64())
		}
		n := 2 + rng.IntN(4)
		for range n {
			var d *Workload
			if rng.IntN(4) != 0 {
				l := byNS[w.Namespace]
				d = l[rng.IntN(len(l))]
			} else {
				d = c.Workloads[rng.IntN(len(c.Workloads))]
			}
			if d == w || d == dns {
				continue
			}
			svc := d.Service
			if svc != nil && rng.IntN(10) == 0 {
				svc = nil
			}
			c.addEdge(rng, w, d, svc, 0.2+rng.ExpFloat64())
		}
		if rng.IntN(20) == 0 {
			e := &Edge{Src: w, External: true, Weight: 0.5 + rng.ExpFloat64(), Egress: c.EgressPol[w.Namespace]}
			if w.Has4 {
				e.Fams = append(e.Fams, 4)
			}
			if w.Has6 {
				e.Fams = append(e.Fams, 6)
			}
			e.Verdict[4], e.Verdict[6] = edgeNotIsolated, edgeNotIsolated
			c.Edges = append(c.Edges, e)
		}
	}
	sum := 0.0
	for _, e := range c.Edges {
		sum += e.Weight
		c.cumWeights = append(c.cumWeights, sum)
	}
}

func (c *Cluster) addEdge(rng *rand.Rand, src, dst *Workload, svc *Service, weight float64) {
	e := &Edge{Src: src, Dst: dst, Svc: svc, Weight: weight, Rule: -1, Egress: c.EgressPol[src.Namespace]}
	d4, d6 := dst.Has4, dst.Has6
	if svc != nil {
		d4, d6 = svc.VIP4.IsValid(), svc.VIP6.IsValid()
	}
	if src.Has4 && d4 {
		e.Fams = append(e.Fams, 4)
	}
	if src.Has6 && d6 {
		e.Fams = append(e.Fams, 6)
	}
	if len(e.Fams) == 0 {
		return // no common family: no such traffic
	}
	v := edgeNotIsolated
	if c.Isolated[dst.Namespace] {
		switch r := rng.IntN(1000); {
		case r < 40:
			v = edgeDenied
		case r < 45:
			v = edgeRejected
		default:
			v = edgeAllowed
			for i, a := range dst.AllowedFrom {
				if a == src {
					e.Rule = int32(i)
				}
			}
			if e.Rule < 0 {
				e.Rule = int32(len(dst.AllowedFrom))
				dst.AllowedFrom = append(dst.AllowedFrom, src)
			}
		}
	}
	e.Verdict[4], e.Verdict[6] = v, v
	if v == edgeAllowed && len(e.Fams) == 2 && rng.IntN(100) < 3 {
		e.Verdict[6] = edgeDenied
	}
	c.Edges = append(c.Edges, e)
}

// pickEdge draws an edge by weight.
func (c *Cluster) pickEdge(rng *rand.Rand) *Edge {
	x := rng.Float64() * c.cumWeights[len(c.cumWeights)-1]
	i := sort.SearchFloat64s(c.cumWeights, x)
	if i >= len(c.Edges) {
		i = len(c.Edges) - 1
	}
	return c.Edges[i]
}

// Policies returns the NetworkPolicies of the cluster: per isolated
// namespace and workload an ingress policy allow-<workload> with one rule
// per allowed client workload plus one rule for a client that never
// calls (so the unused-rules audit has something to find), and per
// namespace with egress policy an allow-all egress.
func (c *Cluster) Policies() []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	tcp := func(port uint16, proto uint8) []networkingv1.NetworkPolicyPort {
		p := intstr.FromInt32(int32(port))
		pr := "TCP"
		if proto == 17 {
			pr = "UDP"
		}
		pp := corev1.Protocol(pr)
		return []networkingv1.NetworkPolicyPort{{Protocol: &pp, Port: &p}}
	}
	for _, w := range c.Workloads {
		if !c.Isolated[w.Namespace] {
			continue
		}
		np := &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: w.Namespace, Name: "allow-" + w.Name},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": w.Name}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			},
		}
		for _, a := range append(append([]*Workload{}, w.AllowedFrom...), c.Workloads[(w.Index+7)%len(c.Workloads)]) {
			np.Spec.Ingress = append(np.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{
				Ports: tcp(w.Port, w.Proto),
				From: []networkingv1.NetworkPolicyPeer{{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": a.Namespace}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": a.Name}},
				}},
			})
		}
		out = append(out, np)
	}
	for _, ns := range c.Namespaces {
		if !c.EgressPol[ns] {
			continue
		}
		out = append(out, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "allow-egress"},
			Spec: networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress:      []networkingv1.NetworkPolicyEgressRule{{}},
			},
		})
	}
	return out
}
