package enrich

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dualflow/dualflow/flow"
)

// TestOrderIndependence replays the events of a small cluster's life in
// many random interleavings and checks that the index, and what it
// answers, is the same as for the chronological order. Events of one
// object keep their order (an informer delivers them so); events of
// different objects are shuffled, so slices arrive before their Service,
// an address's new holder before its old holder's deletion, a Service's
// family change before or after its slices change, and so on. Each event
// carries its own time (the clock is set to it when it is applied), and
// some events are delivered twice, as a resync or relist does.
func TestOrderIndependence(t *testing.T) {
	histories := clusterLife()
	want := replay(t, chronological(histories), nil)
	if !strings.Contains(want, "svc b/api") || !strings.Contains(want, "pod b/reuse") {
		t.Fatalf("the reference state misses objects:\n%s", want)
	}
	n := 300
	if testing.Short() {
		n = 30
	}
	for seed := range uint64(n) {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		got := replay(t, shuffle(histories, rng), rng)
		if got != want {
			t.Fatalf("seed %d: state differs from the chronological replay:\n%s", seed, diffLines(want, got))
		}
	}
}

// event is one informer event: set (add/update) or delete obj at time at.
type event struct {
	at     time.Time
	obj    runtime.Object
	delete bool
}

func set(at time.Duration, o runtime.Object) event { return event{at: t0.Add(at), obj: o} }
func del(at time.Duration, o runtime.Object) event {
	return event{at: t0.Add(at), obj: o, delete: true}
}

// clusterLife returns, per object, its events in order. Times: T0 = 0,
// T1 = 1m, T2 = 2m, T3 = 3m after t0.
func clusterLife() [][]event {
	const T0, T1, T2, T3 = 0, time.Minute, 2 * time.Minute, 3 * time.Minute
	at := func(d time.Duration) metav1.Time { return metav1.NewTime(t0.Add(d)) }
	withRV := func(o runtime.Object) runtime.Object {
		o = o.DeepCopyObject()
		o.(metav1.Object).SetResourceVersion(nextRV())
		return o
	}
	node2b := mkNode("node-2", "zone-b2", []string{"198.19.200.2", "fd00:10:ff::2"}, "198.18.2.0/24", "fd00:10:2::/64")
	nsB := mkNS("b", map[string]string{"team": "api"})
	nsB2 := mkNS("b", map[string]string{"team": "api", "env": "prod"})

	pending := mkPod("b", "api-rs-1", "", nil, owned("ReplicaSet", "api-rs"))
	running := mkPod("b", "api-rs-1", "node-1", []string{"198.18.1.10", "fd00:10:1::10"}, owned("ReplicaSet", "api-rs"))
	old := mkPod("b", "old", "node-1", []string{"198.18.1.50", "fd00:10:1::50"})
	// Created before old's deletion is seen: the claims overlap, and the
	// newer holder must win there whatever the order.
	reuse := mkPod("b", "reuse", "node-2", []string{"198.18.1.50", "fd00:10:1::50"}, createdAt(t0.Add(30*time.Second)))
	job := mkPod("b", "cj-100-x", "node-1", []string{"198.18.1.60", "fd00:10:1::60"}, owned("Job", "cj-100"))
	jobDone := job.DeepCopy()
	jobDone.Status.Phase = corev1.PodSucceeded
	jobDone.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{FinishedAt: at(30 * time.Second)}}}}
	db1 := mkPod("b", "db-0", "node-1", []string{"198.18.1.70"}, owned("StatefulSet", "db"))
	db2 := mkPod("b", "db-0", "node-2", []string{"198.18.2.70", "fd00:10:2::70"}, owned("StatefulSet", "db"), createdAt(t0.Add(T2)))
	db2.UID = "db-0-second"

	api := mkService("b", "api", corev1.IPFamilyPolicyPreferDualStack, "198.19.0.10", "fd00:10:96::10")
	apiSingle := mkService("b", "api", corev1.IPFamilyPolicySingleStack, "198.19.0.10")
	apiDual := mkService("b", "api", corev1.IPFamilyPolicyPreferDualStack, "198.19.0.10", "fd00:10:96::20")
	lb := mkService("b", "lb", corev1.IPFamilyPolicyRequireDualStack, "198.19.0.20", "fd00:10:96::20:1")
	lb.Spec.Type = corev1.ServiceTypeLoadBalancer
	lb.Spec.Ports[0].NodePort = 30080
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.251.20"}, {IP: "fd00:10:e::20"}}
	gone := mkService("b", "gone", corev1.IPFamilyPolicySingleStack, "198.19.0.30")

	p1b := mkPolicy("b", "p1")
	p1b.Spec.PolicyTypes = append(p1b.Spec.PolicyTypes, "Egress")

	return [][]event{
		{set(T0, mkNode("node-1", "zone-a", []string{"198.19.200.1", "fd00:10:ff::1"}, "198.18.1.0/24", "fd00:10:1::/64"))},
		{set(T0, mkNode("node-2", "zone-b", []string{"198.19.200.2", "fd00:10:ff::2"}, "198.18.2.0/24", "fd00:10:2::/64")), set(T2, withRV(node2b))},
		{set(T0, mkNode("node-3", "zone-c", []string{"198.19.200.3"}, "198.18.3.0/25")), del(T2, mkNode("node-3", "", nil))},
		{set(T0, mkNS("a", nil))},
		{set(T0, nsB), set(T1, withRV(nsB2))},
		{set(T0, mkRS("b", "api-rs", "api"))},
		{set(T0, mkJob("b", "cj-100", "cj"))},
		{set(T0, pending), set(T1, withRV(running))},
		{set(T0, mkPod("b", "api-rs-2", "node-2", []string{"198.18.2.10", "fd00:10:2::10"}, owned("ReplicaSet", "api-rs")))},
		{set(T0, old), del(T1, old)},
		{set(T2, reuse)},
		{set(T0, job), set(T1, withRV(jobDone))},
		{set(T0, mkPod("kube-system", "hostnet", "node-1", []string{"198.19.200.1", "fd00:10:ff::1"}, hostNet))},
		{set(T0, db1), del(T1, db1), set(T2, db2)},
		{set(T0, mkPod("b", "on-n3", "node-3", []string{"198.18.3.10"}))},
		{set(T0, api), set(T1, withRV(apiSingle)), set(T3, withRV(apiDual))},
		{set(T0, lb)},
		{set(T0, gone), del(T2, gone)},
		{set(T0, mkSlice("b", "api-v4", "api", ep{"198.18.2.10", "node-2", "", "api-rs-2"})),
			set(T1, withRV(mkSlice("b", "api-v4", "api", ep{"198.18.1.10", "node-1", "zone-a", "api-rs-1"}, ep{"198.18.2.10", "node-2", "zone-b", "api-rs-2"})))},
		{set(T0, mkSlice("b", "api-v6", "api", ep{"fd00:10:2::10", "node-2", "", "api-rs-2"})), del(T1, mkSlice("b", "api-v6", "api"))},
		{set(T3, mkSlice("b", "api-v6b", "api", ep{"fd00:10:1::10", "node-1", "zone-a", "api-rs-1"}, ep{"fd00:10:2::10", "node-2", "zone-b", "api-rs-2"}))},
		{set(T0, mkSlice("b", "lb-v4", "lb", ep{"198.18.2.10", "node-2", "zone-x", "api-rs-2"}))},
		{set(T0, mkSlice("b", "lb-v6", "lb", ep{"fd00:10:2::10", "node-2", "zone-x", "api-rs-2"}))},
		{set(T0, mkSlice("b", "orphan", "nosvc", ep{"198.18.2.99", "node-2", "zone-b", "late"}))},
		{set(T0, mkPolicy("b", "p1")), set(T1, withRV(p1b))},
		{set(T0, mkPolicy("b", "p2")), del(T2, mkPolicy("b", "p2"))},
	}
}

// chronological orders all events by time, objects in list order.
func chronological(h [][]event) []event {
	var out []event
	for _, evs := range h {
		out = append(out, evs...)
	}
	slices.SortStableFunc(out, func(a, b event) int { return a.at.Compare(b.at) })
	return out
}

// shuffle interleaves the histories at random, keeping each one's order.
func shuffle(h [][]event, rng *rand.Rand) []event {
	next := make([]int, len(h))
	var out []event
	for {
		var open []int
		for i := range h {
			if next[i] < len(h[i]) {
				open = append(open, i)
			}
		}
		if len(open) == 0 {
			return out
		}
		i := open[rng.IntN(len(open))]
		out = append(out, h[i][next[i]])
		next[i]++
	}
}

// replay applies events to a fresh index through the informer transform
// and the handlers' index methods, then dumps the index and the answers
// to a grid of lookups. With rng set, some events are delivered twice.
func replay(t *testing.T, evs []event, rng *rand.Rand) string {
	t.Helper()
	clk := newClock(t0)
	x := newIndex(clk.Now, 5*time.Minute, true)
	tr := &transformer{in: newInterner(), ipv6: true}
	for _, ev := range evs {
		times := 1
		if rng != nil && rng.IntN(5) == 0 {
			times = 2
		}
		for range times {
			clk.Set(ev.at)
			obj, err := tr.transform(ev.obj.DeepCopyObject())
			if err != nil {
				t.Fatal(err)
			}
			apply(x, obj, ev.delete)
		}
	}
	clk.Set(t0.Add(4 * time.Minute))
	return dump(x)
}

// apply is what the informers' handlers do with a transformed object.
func apply(x *index, obj any, remove bool) {
	switch o := obj.(type) {
	case *podObj:
		if remove {
			x.removePod((*Pod)(o))
		} else {
			x.setPod((*Pod)(o))
		}
	case *serviceObj:
		if remove {
			x.removeService((*Service)(o))
		} else {
			x.setService((*Service)(o))
		}
	case *sliceObj:
		if remove {
			x.removeEndpointSlice((*EndpointSlice)(o))
		} else {
			x.setEndpointSlice((*EndpointSlice)(o))
		}
	case *nodeObj:
		if remove {
			x.removeNode((*Node)(o))
		} else {
			x.setNode((*Node)(o))
		}
	case *namespaceObj:
		if remove {
			x.removeNamespace((*Namespace)(o))
		} else {
			x.setNamespace((*Namespace)(o))
		}
	case *ownerObj:
		if remove {
			x.removeOwner((*owner)(o))
		} else {
			x.setOwner((*owner)(o))
		}
	case *networkingv1.NetworkPolicy:
		if remove {
			x.removePolicy(o)
		} else {
			x.setPolicy(o)
		}
	default:
		panic(fmt.Sprintf("apply %T", obj))
	}
}

// dump renders the index: live objects, every history with its claims,
// and the answers of Enrich and NodesForIPs for a grid of addresses and
// times.
func dump(x *index) string {
	x.mu.RLock()
	var b strings.Builder
	line := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	for _, k := range sortedKeys(x.pods, func(k nsName) string { return k.ns + "/" + k.name }) {
		p := x.pods[k]
		line("pod %s/%s uid=%s rv=%s node=%s addrs=%v term=%v", p.Namespace, p.Name, p.UID, p.rv, p.NodeName, p.Addrs, p.Terminated)
	}
	for _, k := range sortedKeys(x.services, func(k nsName) string { return k.ns + "/" + k.name }) {
		s := x.services[k]
		line("svc %s/%s rv=%s ips=%v fam=%v", s.Namespace, s.Name, s.rv, s.ClusterIPs, s.IPFamilies)
	}
	for _, k := range sortedKeys(x.slices, func(k nsName) string { return k.ns + "/" + k.name }) {
		line("slice %s/%s rv=%s svc=%s", k.ns, k.name, x.slices[k].rv, x.slices[k].Service)
	}
	for _, k := range sortedKeys(x.slicesBySvc, func(k nsName) string { return k.ns + "/" + k.name }) {
		line("slices of %s/%s: %d", k.ns, k.name, len(x.slicesBySvc[k]))
	}
	for _, k := range sortedKeys(x.nodes, func(k string) string { return k }) {
		n := x.nodes[k]
		line("node %s rv=%s zone=%s ips=%v cidrs=%v", n.Name, n.rv, n.Zone, n.InternalIPs, n.PodCIDRs)
	}
	for _, k := range sortedKeys(x.zones, func(k string) string { return k }) {
		line("zone %s=%s", k, x.zones[k])
	}
	for _, k := range sortedKeys(x.namespaces, func(k string) string { return k }) {
		line("ns %s labels=%v", k, x.namespaces[k].Labels)
	}
	for _, k := range sortedKeys(x.owners, func(h unique.Handle[ownerKey]) string { k := h.Value(); return k.kind + " " + k.ns + "/" + k.name }) {
		line("owner %v -> %v", k.Value(), x.owners[k].controller)
	}
	for _, k := range sortedKeys(x.policies, func(k string) string { return k }) {
		for _, p := range x.policies[k] {
			line("policy %s/%s rv=%s types=%v", k, p.Name, p.ResourceVersion, p.Spec.PolicyTypes)
		}
	}
	for _, k := range sortedKeys(x.nodePorts, func(k portKey) string { return fmt.Sprint(k) }) {
		line("nodeport %v -> %s", k, x.nodePorts[k][0].Name)
	}
	line("lens %v", x.lens)
	dumpHistory(&b, "podIP", x.podIPs, func(p *Pod) string { return p.Namespace + "/" + p.Name + "@" + p.rv })
	dumpHistory(&b, "hostIP", x.hostIPs, func(n nodeClaim) string { return n.node })
	dumpHistory(&b, "cidr", x.podCIDRs, func(n nodeClaim) string { return n.node })
	dumpHistory(&b, "svcIP", x.svcIPs, func(s *Service) string { return s.Namespace + "/" + s.Name + "@" + s.rv })
	dumpHistory(&b, "epIP", x.epIPs, func(e *Endpoint) string {
		return fmt.Sprintf("%s/%s@%s node=%s zone=%s pod=%v", e.Slice.Namespace, e.Slice.Name, e.Slice.rv, e.NodeName, e.Zone, e.Pod)
	})
	line("slices b/api: %v", names(x.endpointSlices("b", "api")))
	x.mu.RUnlock()

	// Answers.
	addrs := []string{"198.18.1.10", "fd00:10:1::10", "198.18.2.10", "fd00:10:2::10", "198.18.1.50", "fd00:10:1::50", "198.18.1.60",
		"fd00:10:1::60", "198.18.1.70", "198.18.2.70", "fd00:10:2::70", "198.19.200.1", "fd00:10:ff::1", "198.19.200.3", "198.18.3.10",
		"198.18.3.99", "198.18.2.99", "198.19.252.8", "fd00:10:4861::8888"}
	vips := []string{"", "198.19.0.10", "fd00:10:96::10", "fd00:10:96::20", "198.19.0.30", "198.19.251.20", "fd00:10:e::20", "198.19.200.2"}
	e := &Enricher{x: x, m: newMetrics(nil, x, nil)}
	for _, at := range []time.Duration{-30 * time.Minute, 10 * time.Second, 45 * time.Second, 90 * time.Second, 150 * time.Second, 4 * time.Minute} {
		for i, src := range addrs {
			dst := addrs[(i+3)%len(addrs)]
			for _, vip := range vips {
				r := flow.Record{SrcAddr: ip(src), DstAddr: ip(dst), Proto: flow.ProtoTCP, DstPort: 8080, ServicePort: 80,
					FlowStart: t0.Add(at), FlowEnd: t0.Add(at + time.Second)}
				if vip != "" {
					r.ServiceAddr = ip(vip)
					if vip == "198.19.200.2" {
						r.ServicePort = 30080
					}
				}
				e.enrichOne(&r)
				line("at %v %s->%s via %s: src=%v dst=%v svc=%v type=%v", at, src, dst, vip, stripLabels(r.Src), stripLabels(r.Dst), r.Service, r.Type)
			}
		}
	}
	for _, a := range addrs {
		n, ok := nodeForIP(e, ip(a))
		line("node for %s: %s %v", a, n, ok)
	}
	return b.String()
}

func names(s []*EndpointSlice) []string {
	var out []string
	for _, x := range s {
		out = append(out, x.Name)
	}
	return out
}

func sortedKeys[K comparable, V any](m map[K]V, str func(K) string) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b K) int { return strings.Compare(str(a), str(b)) })
	return keys
}

func dumpHistory[K interface {
	comparable
	String() string
}, V claimer](b *strings.Builder, name string, h history[K, V], val func(V) string) {
	for _, k := range sortedKeys(h.m, func(k K) string { return k.String() }) {
		var cs []string
		l := h.m[k]
		for i := range l.n() {
			c := l.get(i)
			until := "active"
			if c.until != active {
				until = time.Unix(0, c.until).Sub(t0).String()
			}
			cs = append(cs, fmt.Sprintf("[%s %s..%s]", val(c.v), time.Unix(0, c.from).Sub(t0), until))
		}
		slices.Sort(cs)
		fmt.Fprintf(b, "%s %s: %s\n", name, k, strings.Join(cs, " "))
	}
	fmt.Fprintf(b, "%s retained=%d\n", name, h.retained)
}

// diffLines shows the first lines that differ.
func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for i := 0; i < max(len(w), len(g)) && len(out) < 10; i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			out = append(out, fmt.Sprintf("line %d:\n  want %s\n  got  %s", i+1, a, b))
		}
	}
	return strings.Join(out, "\n")
}
