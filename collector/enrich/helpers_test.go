package enrich

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
	"unique"

	"github.com/prometheus/client_golang/prometheus"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/dualflow/dualflow/flow"
)

// t0 is "now" in the tests; objects are created an hour before.
var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

var created = metav1.NewTime(t0.Add(-time.Hour))

// rvSeq hands out resourceVersions: the fake clientset keeps the one in
// the object, and an informer ignores an update whose resourceVersion did
// not change.
var rvSeq atomic.Int64

func nextRV() string { return strconv.FormatInt(rvSeq.Add(1), 10) }

// clock is a settable clock.
type clock struct{ ns atomic.Int64 }

func newClock(t time.Time) *clock {
	c := &clock{}
	c.ns.Store(t.UnixNano())
	return c
}

func (c *clock) Now() time.Time           { return time.Unix(0, c.ns.Load()).UTC() }
func (c *clock) Add(d time.Duration)      { c.ns.Add(int64(d)) }
func (c *clock) Set(t time.Time)          { c.ns.Store(t.UnixNano()) }
func uid(kind, ns, name string) types.UID { return types.UID(kind + ":" + ns + "/" + name) }

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func objMeta(kind, ns, name string) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: ns, Name: name, UID: uid(kind, ns, name), ResourceVersion: nextRV(), CreationTimestamp: created}
}

func mkNode(name, zone string, addrs []string, cidrs ...string) *corev1.Node {
	n := &corev1.Node{ObjectMeta: objMeta("node", "", name)}
	if zone != "" {
		n.Labels = map[string]string{labelZone: zone}
	}
	for _, a := range addrs {
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: a})
	}
	n.Spec.PodCIDRs = cidrs
	return n
}

func mkNS(name string, labels map[string]string) *corev1.Namespace {
	n := &corev1.Namespace{ObjectMeta: objMeta("namespace", "", name)}
	n.Labels = labels
	return n
}

type podOpt func(*corev1.Pod)

func owned(kind, name string) podOpt {
	return func(p *corev1.Pod) {
		p.OwnerReferences = []metav1.OwnerReference{{Kind: kind, Name: name, Controller: ptr.To(true)}}
	}
}

func labeled(kv ...string) podOpt {
	return func(p *corev1.Pod) {
		for i := 0; i+1 < len(kv); i += 2 {
			p.Labels[kv[i]] = kv[i+1]
		}
	}
}

func hostNet(p *corev1.Pod) { p.Spec.HostNetwork = true }

func createdAt(t time.Time) podOpt {
	return func(p *corev1.Pod) { p.CreationTimestamp = metav1.NewTime(t) }
}

func mkPod(ns, name, node string, ips []string, opts ...podOpt) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: objMeta("pod", ns, name)}
	p.Labels = map[string]string{"app": name}
	p.Spec.NodeName = node
	p.Spec.Containers = []corev1.Container{{Name: "c", Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080}}}}
	p.Status.Phase = corev1.PodRunning
	for _, a := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: a})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	for _, o := range opts {
		o(p)
	}
	return p
}

func familyOf(a string) corev1.IPFamily {
	if ip(a).Is6() {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

// mkService returns a ClusterIP Service with ports http 80→http/TCP and
// dns 53→5353/UDP; its families follow the addresses.
func mkService(ns, name string, policy corev1.IPFamilyPolicy, ips ...string) *corev1.Service {
	s := &corev1.Service{ObjectMeta: objMeta("service", ns, name)}
	s.Spec.Type = corev1.ServiceTypeClusterIP
	s.Spec.IPFamilyPolicy = &policy
	s.Spec.ClusterIPs = ips
	if len(ips) > 0 {
		s.Spec.ClusterIP = ips[0]
	}
	for _, a := range ips {
		s.Spec.IPFamilies = append(s.Spec.IPFamilies, familyOf(a))
	}
	s.Spec.Ports = []corev1.ServicePort{
		{Name: "http", Port: 80, TargetPort: intstr.FromString("http"), Protocol: corev1.ProtocolTCP},
		{Name: "dns", Port: 53, TargetPort: intstr.FromInt32(5353), Protocol: corev1.ProtocolUDP},
	}
	return s
}

// ep is an endpoint of mkSlice: address, node, zone (optional) and pod.
type ep struct{ addr, node, zone, pod string }

func mkSlice(ns, name, svc string, eps ...ep) *discoveryv1.EndpointSlice {
	s := &discoveryv1.EndpointSlice{ObjectMeta: objMeta("endpointslice", ns, name)}
	s.Labels = map[string]string{discoveryv1.LabelServiceName: svc}
	s.AddressType = discoveryv1.AddressTypeIPv4
	if len(eps) > 0 && ip(eps[0].addr).Is6() {
		s.AddressType = discoveryv1.AddressTypeIPv6
	}
	s.Ports = []discoveryv1.EndpointPort{
		{Name: ptr.To("http"), Port: ptr.To(int32(8080)), Protocol: ptr.To(corev1.ProtocolTCP)},
		{Name: ptr.To("dns"), Port: ptr.To(int32(5353)), Protocol: ptr.To(corev1.ProtocolUDP)},
	}
	for _, e := range eps {
		x := discoveryv1.Endpoint{Addresses: []string{e.addr}, Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)}}
		if e.node != "" {
			x.NodeName = ptr.To(e.node)
		}
		if e.zone != "" {
			x.Zone = ptr.To(e.zone)
		}
		if e.pod != "" {
			x.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: e.pod}
		}
		s.Endpoints = append(s.Endpoints, x)
	}
	return s
}

func mkRS(ns, name, deployment string) *appsv1.ReplicaSet {
	r := &appsv1.ReplicaSet{ObjectMeta: objMeta("replicaset", ns, name)}
	if deployment != "" {
		r.OwnerReferences = []metav1.OwnerReference{{Kind: "Deployment", Name: deployment, Controller: ptr.To(true)}}
	}
	return r
}

func mkJob(ns, name, cronjob string) *batchv1.Job {
	j := &batchv1.Job{ObjectMeta: objMeta("job", ns, name)}
	if cronjob != "" {
		j.OwnerReferences = []metav1.OwnerReference{{Kind: "CronJob", Name: cronjob, Controller: ptr.To(true)}}
	}
	return j
}

func mkPolicy(ns, name string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{
		ObjectMeta: objMeta("networkpolicy", ns, name),
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
	}
}

// The standard cluster of the tests: two dual-stack nodes in two zones.
//
//	node-1 zone-a 198.19.200.1 fd00:10:ff::1  pods 198.18.1.0/24 fd00:10:1::/64
//	node-2 zone-b 198.19.200.2 fd00:10:ff::2  pods 198.18.2.0/24 fd00:10:2::/64
func baseObjects() []runtime.Object {
	return []runtime.Object{
		mkNode("node-1", "zone-a", []string{"198.19.200.1", "fd00:10:ff::1"}, "198.18.1.0/24", "fd00:10:1::/64"),
		mkNode("node-2", "zone-b", []string{"198.19.200.2", "fd00:10:ff::2"}, "198.18.2.0/24", "fd00:10:2::/64"),
		mkNS("frontend", map[string]string{"team": "web"}),
		mkNS("backend", map[string]string{"team": "api"}),
	}
}

// env is an Enricher running informers on a fake clientset, with a
// settable clock.
type env struct {
	t   *testing.T
	cs  *fake.Clientset
	e   *Enricher
	clk *clock
	reg *prometheus.Registry
}

func discard() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newEnv(t *testing.T, cfg Config, objs ...runtime.Object) *env {
	t.Helper()
	cs := fake.NewClientset(objs...)
	reg := prometheus.NewRegistry()
	e, err := NewForClient(cfg, cs, reg, discard())
	if err != nil {
		t.Fatal(err)
	}
	clk := newClock(t0)
	e.x.now = clk.Now
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	})
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := e.WaitForSync(wctx); err != nil {
		t.Fatalf("sync: %v", err)
	}
	return &env{t: t, cs: cs, e: e, clk: clk, reg: reg}
}

func testConfig() Config {
	c := NewConfig()
	c.Source = SourceOff // NewForClient ignores the source
	return c
}

// eventually polls cond until it holds (events are applied asynchronously).
func (v *env) eventually(what string, cond func() bool) {
	v.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			v.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

var bg = context.Background()

// apply creates or updates objects through the clientset (bumping the
// resourceVersion) and waits until each is indexed.
func (v *env) apply(objs ...runtime.Object) {
	v.t.Helper()
	for _, o := range objs {
		o = o.DeepCopyObject()
		m := o.(metav1.Object)
		m.SetResourceVersion(nextRV())
		var err error
		create := func() error { return v.cs.Tracker().Add(o) }
		switch x := o.(type) {
		case *corev1.Pod:
			if _, err = v.cs.CoreV1().Pods(x.Namespace).Update(bg, x, metav1.UpdateOptions{}); err != nil {
				err = create()
			}
		case *corev1.Service:
			if _, err = v.cs.CoreV1().Services(x.Namespace).Update(bg, x, metav1.UpdateOptions{}); err != nil {
				err = create()
			}
		case *discoveryv1.EndpointSlice:
			if _, err = v.cs.DiscoveryV1().EndpointSlices(x.Namespace).Update(bg, x, metav1.UpdateOptions{}); err != nil {
				err = create()
			}
		case *corev1.Node:
			if _, err = v.cs.CoreV1().Nodes().Update(bg, x, metav1.UpdateOptions{}); err != nil {
				err = create()
			}
		case *corev1.Namespace:
			if _, err = v.cs.CoreV1().Namespaces().Update(bg, x, metav1.UpdateOptions{}); err != nil {
				err = create()
			}
		case *appsv1.ReplicaSet:
			if _, err = v.cs.AppsV1().ReplicaSets(x.Namespace).Update(bg, x, metav1.UpdateOptions{}); err != nil {
				err = create()
			}
		case *batchv1.Job:
			if _, err = v.cs.BatchV1().Jobs(x.Namespace).Update(bg, x, metav1.UpdateOptions{}); err != nil {
				err = create()
			}
		case *networkingv1.NetworkPolicy:
			if _, err = v.cs.NetworkingV1().NetworkPolicies(x.Namespace).Update(bg, x, metav1.UpdateOptions{}); err != nil {
				err = create()
			}
		default:
			v.t.Fatalf("apply %T", o)
		}
		if err != nil {
			v.t.Fatalf("apply %T %s: %v", o, m.GetName(), err)
		}
		v.waitRV(o, m.GetResourceVersion())
	}
}

// remove deletes objects through the clientset and waits until each is
// gone from the index.
func (v *env) remove(objs ...runtime.Object) {
	v.t.Helper()
	for _, o := range objs {
		m := o.(metav1.Object)
		ns, name := m.GetNamespace(), m.GetName()
		var err error
		var gone func() bool
		x := v.e.x
		read := func(f func() bool) func() bool {
			return func() bool { x.mu.RLock(); defer x.mu.RUnlock(); return f() }
		}
		switch o.(type) {
		case *corev1.Pod:
			err = v.cs.CoreV1().Pods(ns).Delete(bg, name, metav1.DeleteOptions{})
			gone = read(func() bool { return x.pods[nsName{ns, name}] == nil })
		case *corev1.Service:
			err = v.cs.CoreV1().Services(ns).Delete(bg, name, metav1.DeleteOptions{})
			gone = read(func() bool { return x.services[nsName{ns, name}] == nil })
		case *discoveryv1.EndpointSlice:
			err = v.cs.DiscoveryV1().EndpointSlices(ns).Delete(bg, name, metav1.DeleteOptions{})
			gone = read(func() bool { return x.slices[nsName{ns, name}] == nil })
		case *corev1.Node:
			err = v.cs.CoreV1().Nodes().Delete(bg, name, metav1.DeleteOptions{})
			gone = read(func() bool { return x.nodes[name] == nil })
		case *networkingv1.NetworkPolicy:
			err = v.cs.NetworkingV1().NetworkPolicies(ns).Delete(bg, name, metav1.DeleteOptions{})
			gone = read(func() bool {
				for _, p := range x.policies[ns] {
					if p.Name == name {
						return false
					}
				}
				return true
			})
		default:
			v.t.Fatalf("remove %T", o)
		}
		if err != nil {
			v.t.Fatalf("remove %T %s: %v", o, name, err)
		}
		v.eventually("deletion of "+name, gone)
	}
}

// waitRV waits until the index holds o at resourceVersion rv.
func (v *env) waitRV(o runtime.Object, rv string) {
	v.t.Helper()
	m := o.(metav1.Object)
	ns, name := m.GetNamespace(), m.GetName()
	x := v.e.x
	v.eventually(name+" at rv "+rv, func() bool {
		x.mu.RLock()
		defer x.mu.RUnlock()
		switch o.(type) {
		case *corev1.Pod:
			p := x.pods[nsName{ns, name}]
			return p != nil && p.rv == rv
		case *corev1.Service:
			s := x.services[nsName{ns, name}]
			return s != nil && s.rv == rv
		case *discoveryv1.EndpointSlice:
			s := x.slices[nsName{ns, name}]
			return s != nil && s.rv == rv
		case *corev1.Node:
			n := x.nodes[name]
			return n != nil && n.rv == rv
		case *corev1.Namespace:
			n := x.namespaces[name]
			return n != nil && n.rv == rv
		case *appsv1.ReplicaSet:
			r, ok := x.owners[unique.Make(ownerKey{KindReplicaSet, ns, name})]
			return ok && r.rv == rv
		case *batchv1.Job:
			r, ok := x.owners[unique.Make(ownerKey{KindJob, ns, name})]
			return ok && r.rv == rv
		case *networkingv1.NetworkPolicy:
			for _, p := range x.policies[ns] {
				if p.Name == name && p.ResourceVersion == rv {
					return true
				}
			}
		}
		return false
	})
}

// record returns a TCP record src → dst:8080 that started a second ago.
func (v *env) record(src, dst string) flow.Record {
	now := v.clk.Now()
	r := flow.Record{SrcAddr: ip(src), DstAddr: ip(dst), Proto: flow.ProtoTCP, SrcPort: 40000, DstPort: 8080,
		FlowStart: now.Add(-time.Second), FlowEnd: now}
	r.Normalize()
	return r
}

// viaService returns a record src → vip:80 DNAT-ed to endpoint:8080.
func (v *env) viaService(src, vip, endpoint string) flow.Record {
	r := v.record(src, endpoint)
	r.ServiceAddr, r.ServicePort = ip(vip), 80
	return r
}

func (v *env) enrich(r flow.Record) flow.Record {
	v.e.enrichOne(&r)
	return r
}

// nodeForIP asks e for the node of one address (NodesForIPs of one).
func nodeForIP(e interface{ NodesForIPs([]netip.Addr, []string) }, a netip.Addr) (string, bool) {
	var n [1]string
	e.NodesForIPs([]netip.Addr{a}, n[:])
	return n[0], n[0] != ""
}
