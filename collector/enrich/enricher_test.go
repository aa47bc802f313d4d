package enrich

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/dualflow/dualflow/collector/correlate"
	"github.com/dualflow/dualflow/flow"
)

// Every kind and family through the real informers on a fake clientset.

func TestPodsEveryFamily(t *testing.T) {
	objs := append(baseObjects(),
		mkRS("frontend", "web-6b7f9c5d84", "web"),
		mkPod("frontend", "web-6b7f9c5d84-abcde", "node-1", []string{"198.18.1.10", "fd00:10:1::10"},
			owned("ReplicaSet", "web-6b7f9c5d84"), labeled("pod-template-hash", "6b7f9c5d84")),
		mkPod("backend", "v4only", "node-2", []string{"198.18.2.20"}),
		mkPod("backend", "v6only", "node-2", []string{"fd00:10:2::21"}),
		// IPv6 first, as in an IPv6-primary dual-stack cluster.
		mkPod("backend", "v6first", "node-1", []string{"fd00:10:1::22", "198.18.1.22"}),
	)
	v := newEnv(t, testConfig(), objs...)
	for _, tc := range []struct {
		name, src, dst   string
		wantSrc, wantDst flow.Endpoint
		wantType         flow.FlowType
	}{
		{"ipv4 primary to ipv4-only pod", "198.18.1.10", "198.18.2.20",
			flow.Endpoint{PodNamespace: "frontend", PodName: "web-6b7f9c5d84-abcde", WorkloadKind: KindDeployment, WorkloadName: "web", NodeName: "node-1", Zone: "zone-a"},
			flow.Endpoint{PodNamespace: "backend", PodName: "v4only", WorkloadKind: KindPod, WorkloadName: "v4only", NodeName: "node-2", Zone: "zone-b"},
			flow.FlowTypeInterNode},
		{"ipv6 secondary to ipv6-only pod", "fd00:10:1::10", "fd00:10:2::21",
			flow.Endpoint{PodNamespace: "frontend", PodName: "web-6b7f9c5d84-abcde", WorkloadKind: KindDeployment, WorkloadName: "web", NodeName: "node-1", Zone: "zone-a"},
			flow.Endpoint{PodNamespace: "backend", PodName: "v6only", WorkloadKind: KindPod, WorkloadName: "v6only", NodeName: "node-2", Zone: "zone-b"},
			flow.FlowTypeInterNode},
		{"ipv6 primary, same node", "fd00:10:1::22", "fd00:10:1::10",
			flow.Endpoint{PodNamespace: "backend", PodName: "v6first", WorkloadKind: KindPod, WorkloadName: "v6first", NodeName: "node-1", Zone: "zone-a"},
			flow.Endpoint{PodNamespace: "frontend", PodName: "web-6b7f9c5d84-abcde", WorkloadKind: KindDeployment, WorkloadName: "web", NodeName: "node-1", Zone: "zone-a"},
			flow.FlowTypeIntraNode},
		{"ipv4 secondary, same node", "198.18.1.22", "198.18.1.10",
			flow.Endpoint{PodNamespace: "backend", PodName: "v6first", WorkloadKind: KindPod, WorkloadName: "v6first", NodeName: "node-1", Zone: "zone-a"},
			flow.Endpoint{PodNamespace: "frontend", PodName: "web-6b7f9c5d84-abcde", WorkloadKind: KindDeployment, WorkloadName: "web", NodeName: "node-1", Zone: "zone-a"},
			flow.FlowTypeIntraNode},
		{"ipv4 to external", "198.18.2.20", "198.19.250.9", flow.Endpoint{PodNamespace: "backend", PodName: "v4only", WorkloadKind: KindPod, WorkloadName: "v4only", NodeName: "node-2", Zone: "zone-b"},
			flow.Endpoint{}, flow.FlowTypeToExternal},
		{"ipv6 from external", "fd00:10:ffff::9", "fd00:10:2::21", flow.Endpoint{},
			flow.Endpoint{PodNamespace: "backend", PodName: "v6only", WorkloadKind: KindPod, WorkloadName: "v6only", NodeName: "node-2", Zone: "zone-b"},
			flow.FlowTypeFromExternal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := v.enrich(v.record(tc.src, tc.dst))
			if got := stripLabels(r.Src); got != stripLabels(tc.wantSrc) {
				t.Errorf("src %+v, want %+v", got, tc.wantSrc)
			}
			if got := stripLabels(r.Dst); got != stripLabels(tc.wantDst) {
				t.Errorf("dst %+v, want %+v", got, tc.wantDst)
			}
			if r.Type != tc.wantType {
				t.Errorf("type %v, want %v", r.Type, tc.wantType)
			}
			if tc.wantSrc.PodName != "" && r.Src.Labels["app"] != tc.wantSrc.PodName {
				t.Errorf("src labels %v", r.Src.Labels)
			}
		})
	}
	p, ok := v.e.Pod("backend", "v6first")
	if !ok || len(p.Addrs) != 2 || p.Addrs[0] != ip("fd00:10:1::22") || p.Addrs[1] != ip("198.18.1.22") {
		t.Errorf("pod addresses %v, want both podIPs in order", p.Addrs)
	}
}

// plainEndpoint is flow.Endpoint without its labels map, comparable.
type plainEndpoint struct {
	PodNamespace, PodName, WorkloadKind, WorkloadName, NodeName, Zone string
}

func stripLabels(e flow.Endpoint) plainEndpoint {
	return plainEndpoint{e.PodNamespace, e.PodName, e.WorkloadKind, e.WorkloadName, e.NodeName, e.Zone}
}

func TestWorkloads(t *testing.T) {
	pods := []struct {
		name    string
		opts    []podOpt
		want    Workload
		v4, v6  string
		comment string
	}{
		{"web-6b7f9c5d84-x1", []podOpt{owned("ReplicaSet", "web-6b7f9c5d84"), labeled("pod-template-hash", "6b7f9c5d84")}, Workload{KindDeployment, "web"}, "", "", "Deployment via a known ReplicaSet"},
		{"api-58d4c7f9b6-x2", []podOpt{owned("ReplicaSet", "api-58d4c7f9b6"), labeled("pod-template-hash", "58d4c7f9b6")}, Workload{KindDeployment, "api"}, "", "", "ReplicaSet unknown: name minus pod-template-hash"},
		{"plain-x3", []podOpt{owned("ReplicaSet", "plain")}, Workload{KindReplicaSet, "plain"}, "", "", "ReplicaSet unknown, no hash label"},
		{"bare-rs-x4", []podOpt{owned("ReplicaSet", "bare-rs")}, Workload{KindReplicaSet, "bare-rs"}, "", "", "known ReplicaSet without owner"},
		{"db-0", []podOpt{owned("StatefulSet", "db")}, Workload{KindStatefulSet, "db"}, "", "", "StatefulSet"},
		{"agent-x5", []podOpt{owned("DaemonSet", "agent")}, Workload{KindDaemonSet, "agent"}, "", "", "DaemonSet"},
		{"nightly-29000000-x6", []podOpt{owned("Job", "nightly-29000000")}, Workload{KindCronJob, "nightly"}, "", "", "CronJob via its Job"},
		{"once-x7", []podOpt{owned("Job", "once")}, Workload{KindJob, "once"}, "", "", "Job without CronJob"},
		{"bare", nil, Workload{KindPod, "bare"}, "", "", "no owner"},
	}
	objs := append(baseObjects(), mkRS("backend", "web-6b7f9c5d84", "web"), mkRS("backend", "bare-rs", ""),
		mkJob("backend", "nightly-29000000", "nightly"), mkJob("backend", "once", ""))
	for i := range pods {
		pods[i].v4 = fmt.Sprintf("198.18.1.%d", 50+i)
		pods[i].v6 = fmt.Sprintf("fd00:10:1::%d", 50+i)
		objs = append(objs, mkPod("backend", pods[i].name, "node-1", []string{pods[i].v4, pods[i].v6}, pods[i].opts...))
	}
	v := newEnv(t, testConfig(), objs...)
	for _, p := range pods {
		for _, a := range []string{p.v4, p.v6} {
			t.Run(p.comment+"/"+a, func(t *testing.T) {
				r := v.enrich(v.record(a, "198.19.250.1"))
				if r.Src.PodName != p.name || (Workload{r.Src.WorkloadKind, r.Src.WorkloadName}) != p.want {
					t.Errorf("pod %q workload %s/%s, want %q %v", r.Src.PodName, r.Src.WorkloadKind, r.Src.WorkloadName, p.name, p.want)
				}
			})
		}
	}
	// The ReplicaSet arriving later wins over the name heuristic.
	v.apply(mkRS("backend", "api-58d4c7f9b6", "api-renamed"))
	if r := v.enrich(v.record("fd00:10:1::51", "fd00:10:ffff::1")); r.Src.WorkloadName != "api-renamed" {
		t.Errorf("after the ReplicaSet: workload %s", r.Src.WorkloadName)
	}
}

// dualService is backend/api (PreferDualStack) with one EndpointSlice per
// family: api-1 on node-1 (zone-a), api-2 on node-2 (zone-b).
func dualService() (*corev1.Service, *corev1.Pod, *corev1.Pod, [2]runtime.Object) {
	svc := mkService("backend", "api", corev1.IPFamilyPolicyPreferDualStack, "198.19.0.10", "fd00:10:96::10")
	api1 := mkPod("backend", "api-1", "node-1", []string{"198.18.1.11", "fd00:10:1::11"})
	api2 := mkPod("backend", "api-2", "node-2", []string{"198.18.2.12", "fd00:10:2::12"})
	v4 := mkSlice("backend", "api-v4", "api", ep{"198.18.1.11", "node-1", "zone-a", "api-1"}, ep{"198.18.2.12", "node-2", "zone-b", "api-2"})
	v6 := mkSlice("backend", "api-v6", "api", ep{"fd00:10:1::11", "node-1", "zone-a", "api-1"}, ep{"fd00:10:2::12", "node-2", "zone-b", "api-2"})
	return svc, api1, api2, [2]runtime.Object{v4, v6}
}

func TestServiceSlicesAnyOrder(t *testing.T) {
	svc, api1, api2, sl := dualService()
	web := mkPod("frontend", "web", "node-1", []string{"198.18.1.10", "fd00:10:1::10"})
	for _, order := range []struct {
		name string
		objs []runtime.Object
	}{
		{"service, ipv4 slice, ipv6 slice", []runtime.Object{svc, sl[0], sl[1]}},
		{"service, ipv6 slice, ipv4 slice", []runtime.Object{svc, sl[1], sl[0]}},
		{"slices before their service", []runtime.Object{sl[1], sl[0], svc}},
		{"ipv6 slice, service, ipv4 slice", []runtime.Object{sl[1], svc, sl[0]}},
	} {
		t.Run(order.name, func(t *testing.T) {
			v := newEnv(t, testConfig(), append(baseObjects(), web, api1, api2)...)
			v.apply(order.objs...)
			for _, f := range []struct{ src, vip, endpoint, pod, zone string }{
				{"198.18.1.10", "198.19.0.10", "198.18.2.12", "api-2", "zone-b"},
				{"fd00:10:1::10", "fd00:10:96::10", "fd00:10:2::12", "api-2", "zone-b"},
				{"198.18.1.10", "198.19.0.10", "198.18.1.11", "api-1", "zone-a"},
				{"fd00:10:1::10", "fd00:10:96::10", "fd00:10:1::11", "api-1", "zone-a"},
			} {
				r := v.enrich(v.viaService(f.src, f.vip, f.endpoint))
				if r.Service != (flow.Service{Namespace: "backend", Name: "api", PortName: "http"}) {
					t.Errorf("%s via %s: service %+v", f.endpoint, f.vip, r.Service)
				}
				if r.Dst.PodName != f.pod || r.Dst.Zone != f.zone || r.Src.PodName != "web" {
					t.Errorf("%s via %s: dst %+v src %s", f.endpoint, f.vip, r.Dst, r.Src.PodName)
				}
				// Port name from the endpoint's slice when the Service port is unknown.
				r = v.viaService(f.src, f.vip, f.endpoint)
				r.ServicePort = 0
				if v.e.enrichOne(&r); r.Service.PortName != "http" {
					t.Errorf("%s: port name from the slice %q", f.endpoint, r.Service.PortName)
				}
			}
			if got := v.e.EndpointSlices("backend", "api"); len(got) != 2 || got[0].Name != "api-v4" || got[1].Name != "api-v6" {
				t.Errorf("EndpointSlices: %v", got)
			}
			// Deleting one family's slice leaves the other family's endpoints.
			v.remove(sl[0])
			v.clk.Add(time.Minute)
			for _, f := range []struct {
				vip, endpoint string
				want          string
			}{{"198.19.0.10", "198.18.2.12", ""}, {"fd00:10:96::10", "fd00:10:2::12", "http"}} {
				r := v.viaService("198.18.1.10", f.vip, f.endpoint)
				if ip(f.vip).Is6() {
					r.SrcAddr = ip("fd00:10:1::10")
				}
				r.ServicePort = 0
				if v.e.enrichOne(&r); r.Service.Name != "api" || r.Service.PortName != f.want {
					t.Errorf("after deleting the IPv4 slice, %s: service %+v, want port name %q", f.endpoint, r.Service, f.want)
				}
			}
		})
	}
}

func TestServiceFamilyChange(t *testing.T) {
	svc, api1, api2, sl := dualService()
	web := mkPod("frontend", "web", "node-1", []string{"198.18.1.10", "fd00:10:1::10"})
	v := newEnv(t, testConfig(), append(baseObjects(), web, api1, api2, svc, sl[0], sl[1])...)
	flowAt := func(vip, endpoint string, start time.Time) flow.Record {
		src := "198.18.1.10"
		if ip(vip).Is6() {
			src = "fd00:10:1::10"
		}
		r := v.viaService(src, vip, endpoint)
		r.FlowStart, r.FlowEnd = start, start.Add(time.Second)
		return v.enrich(r)
	}
	tDual := v.clk.Now()

	// Dual → single-stack IPv4: the IPv6 ClusterIP goes, the controller
	// deletes the IPv6 slice.
	v.clk.Add(time.Minute)
	single := svc.DeepCopy()
	single.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicySingleStack)
	single.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	single.Spec.ClusterIPs = []string{"198.19.0.10"}
	v.apply(single)
	if got := v.e.EndpointSlices("backend", "api"); len(got) != 1 || got[0].Name != "api-v4" {
		t.Errorf("single-stack Service with a stale IPv6 slice: EndpointSlices %v, want only api-v4", got)
	}
	v.remove(sl[1])
	tSingle := v.clk.Now()
	v.clk.Add(time.Minute)
	if r := flowAt("fd00:10:96::10", "fd00:10:2::12", tDual); r.Service.Name != "api" || r.Dst.PodName != "api-2" {
		t.Errorf("late IPv6 record from the dual-stack time: service %+v dst %s", r.Service, r.Dst.PodName)
	}
	if r := flowAt("fd00:10:96::10", "fd00:10:2::12", tSingle.Add(30*time.Second)); r.Service.Name != "" {
		t.Errorf("IPv6 ClusterIP after it was dropped: service %+v", r.Service)
	}
	if r := flowAt("198.19.0.10", "198.18.2.12", v.clk.Now()); r.Service.Name != "api" || r.Service.PortName != "http" {
		t.Errorf("IPv4 while single-stack: %+v", r.Service)
	}
	if s, _ := v.e.Service("backend", "api"); !slices.Equal(s.ClusterIPs, []netip.Addr{ip("198.19.0.10")}) || s.IPFamilyPolicy != corev1.IPFamilyPolicySingleStack {
		t.Errorf("single-stack view %v %v", s.ClusterIPs, s.IPFamilyPolicy)
	}

	// Back to dual-stack with a new IPv6 ClusterIP and a new IPv6 slice.
	v.clk.Add(time.Minute)
	dual := svc.DeepCopy()
	dual.Spec.ClusterIPs = []string{"198.19.0.10", "fd00:10:96::20"}
	v.apply(dual)
	v6 := mkSlice("backend", "api-v6b", "api", ep{"fd00:10:1::11", "node-1", "zone-a", "api-1"}, ep{"fd00:10:2::12", "node-2", "zone-b", "api-2"})
	v.apply(v6)
	v.clk.Add(time.Minute)
	if r := flowAt("fd00:10:96::20", "fd00:10:1::11", v.clk.Now()); r.Service.Name != "api" || r.Service.PortName != "http" || r.Dst.Zone != "zone-a" {
		t.Errorf("new IPv6 ClusterIP: service %+v dst %+v", r.Service, r.Dst)
	}
	if r := flowAt("fd00:10:96::10", "fd00:10:1::11", v.clk.Now()); r.Service.Name != "" {
		t.Errorf("old IPv6 ClusterIP resolved after the change back: %+v", r.Service)
	}
	if got := v.e.EndpointSlices("backend", "api"); len(got) != 2 {
		t.Errorf("EndpointSlices after the change back: %v", got)
	}
	s, _ := v.e.Service("backend", "api")
	if !slices.Contains(s.ClusterIPs, ip("fd00:10:96::20")) {
		t.Errorf("ClusterIPs %v after the change back", s.ClusterIPs)
	}
}

func TestPodIPReuse(t *testing.T) {
	for _, fam := range []struct{ name, addr, peer string }{
		{"ipv4", "198.18.1.5", "198.18.2.99"},
		{"ipv6", "fd00:10:1::5", "fd00:10:2::99"},
	} {
		t.Run(fam.name, func(t *testing.T) {
			cfg := testConfig()
			cfg.GracePeriod = 5 * time.Minute
			old := mkPod("backend", "old", "node-1", []string{fam.addr}, createdAt(t0.Add(-time.Hour)))
			v := newEnv(t, cfg, append(baseObjects(), old)...)
			at := func(start time.Time) flow.Record {
				r := v.record(fam.peer, fam.addr)
				r.FlowStart, r.FlowEnd = start, start.Add(time.Second)
				return v.enrich(r)
			}
			v.remove(old) // at t0
			v.clk.Add(time.Minute)
			reuse := mkPod("frontend", "new", "node-2", []string{fam.addr}, createdAt(v.clk.Now()))
			v.apply(reuse) // at t0+1m: the address is reused by a pod on another node
			v.clk.Add(time.Minute)
			for _, c := range []struct {
				start          time.Time
				wantPod, where string
			}{
				{t0.Add(-30 * time.Minute), "old", "node-1"},
				{t0.Add(-time.Second), "old", "node-1"},
				{t0.Add(30 * time.Second), "", "node-1"}, // nobody held it: only node-1's pod CIDR says where it is
				{t0.Add(90 * time.Second), "new", "node-2"},
				{v.clk.Now(), "new", "node-2"},
			} {
				if r := at(c.start); r.Dst.PodName != c.wantPod || r.Dst.NodeName != c.where {
					t.Errorf("flow at %v: pod %q on %q, want %q on %q", c.start.Sub(t0), r.Dst.PodName, r.Dst.NodeName, c.wantPod, c.where)
				}
			}
			if p, ok := v.e.LookupPod(ip(fam.addr), t0.Add(-time.Minute)); !ok || p.Name != "old" {
				t.Errorf("LookupPod before the deletion: %v", p)
			}
			// After the grace period the deleted pod is forgotten.
			v.clk.Set(t0.Add(6 * time.Minute))
			if n := v.e.x.collect(); n != 1 {
				t.Errorf("collected %d claims, want 1", n)
			}
			if r := at(t0.Add(-30 * time.Minute)); r.Dst.PodName != "" {
				t.Errorf("after the grace period a record from the old pod's time resolves to %q", r.Dst.PodName)
			}
			if r := at(v.clk.Now()); r.Dst.PodName != "new" {
				t.Errorf("current holder lost: %q", r.Dst.PodName)
			}
		})
	}
}

func TestTerminatedPodReleasesAddresses(t *testing.T) {
	done := mkPod("backend", "job-x", "node-1", []string{"198.18.1.7", "fd00:10:1::7"}, owned("Job", "once"))
	v := newEnv(t, testConfig(), append(baseObjects(), done)...)
	v.clk.Add(time.Minute)
	finished := done.DeepCopy()
	finished.Status.Phase = corev1.PodSucceeded
	finished.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{FinishedAt: metav1.NewTime(t0.Add(30 * time.Second))}}}}
	v.apply(finished)
	v.clk.Add(time.Minute)
	v.apply(mkPod("backend", "next", "node-2", []string{"198.18.1.7", "fd00:10:1::7"}, createdAt(v.clk.Now())))
	for _, a := range []string{"198.18.1.7", "fd00:10:1::7"} {
		if p, ok := v.e.LookupPod(ip(a), t0.Add(10*time.Second)); !ok || p.Name != "job-x" {
			t.Errorf("%s while the job ran: %v", a, p)
		}
		if p, ok := v.e.LookupPod(ip(a), time.Time{}); !ok || p.Name != "next" {
			t.Errorf("%s now: %v", a, p)
		}
	}
}

func TestPodFinishedBeforeStart(t *testing.T) {
	// A Job's pod that finished before the collector started still
	// resolves for the time it ran, within the grace period.
	done := mkPod("backend", "job-y", "node-1", []string{"198.18.1.8", "fd00:10:1::8"}, owned("Job", "once"))
	done.Status.Phase = corev1.PodFailed
	done.Status.ContainerStatuses = []corev1.ContainerStatus{{State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{FinishedAt: metav1.NewTime(t0.Add(-time.Minute))}}}}
	old := done.DeepCopy()
	old.Name, old.UID = "job-z", "job-z"
	old.Status.ContainerStatuses[0].State.Terminated.FinishedAt = metav1.NewTime(t0.Add(-time.Hour))
	v := newEnv(t, testConfig(), append(baseObjects(), done, old)...)
	for _, a := range []string{"198.18.1.8", "fd00:10:1::8"} {
		if p, ok := v.e.LookupPod(ip(a), t0.Add(-2*time.Minute)); !ok || p.Name != "job-y" {
			t.Errorf("%s while job-y ran: %v", a, p)
		}
		if p, ok := v.e.LookupPod(ip(a), t0); ok {
			t.Errorf("%s after job-y finished: %v", a, p.Name)
		}
	}
}

func TestRecreatedWithNewUID(t *testing.T) {
	// A StatefulSet pod comes back with the same name, a new UID and new
	// addresses: the old addresses stay attributed to the old instance.
	db := mkPod("backend", "db-0", "node-1", []string{"198.18.1.30", "fd00:10:1::30"}, owned("StatefulSet", "db"))
	v := newEnv(t, testConfig(), append(baseObjects(), db)...)
	v.clk.Add(time.Minute)
	again := mkPod("backend", "db-0", "node-2", []string{"198.18.2.31", "fd00:10:2::31"}, owned("StatefulSet", "db"), createdAt(v.clk.Now()))
	again.UID = "db-0-second"
	v.apply(again)
	v.clk.Add(time.Minute)
	for _, c := range []struct {
		addr string
		at   time.Time
		node string
	}{{"198.18.1.30", t0.Add(-time.Minute), "node-1"}, {"fd00:10:1::30", t0.Add(-time.Minute), "node-1"},
		{"198.18.2.31", v.clk.Now(), "node-2"}, {"fd00:10:2::31", v.clk.Now(), "node-2"}} {
		p, ok := v.e.LookupPod(ip(c.addr), c.at)
		if !ok || p.Name != "db-0" || p.NodeName != c.node {
			t.Errorf("%s at %v: %+v", c.addr, c.at, p)
		}
	}
	if p, ok := v.e.LookupPod(ip("198.18.1.30"), v.clk.Now()); ok {
		t.Errorf("old address still held now by %s", p.UID)
	}
}

func TestIPv6Disabled(t *testing.T) {
	cfg := testConfig()
	cfg.EnableIPv6 = false
	svc, api1, api2, sl := dualService()
	web := mkPod("frontend", "web", "node-1", []string{"198.18.1.10", "fd00:10:1::10"})
	v := newEnv(t, cfg, append(baseObjects(), web, api1, api2, svc, sl[0], sl[1])...)

	if p, _ := v.e.Pod("frontend", "web"); !slices.Equal(p.Addrs, []netip.Addr{ip("198.18.1.10")}) {
		t.Errorf("pod addresses %v: IPv6 must be dropped", p.Addrs)
	}
	s, _ := v.e.Service("backend", "api")
	if !slices.Equal(s.ClusterIPs, []netip.Addr{ip("198.19.0.10")}) {
		t.Errorf("ClusterIPs %v", s.ClusterIPs)
	}
	if n, _ := v.e.Node("node-1"); len(n.PodCIDRs) != 1 || len(n.InternalIPs) != 1 {
		t.Errorf("node %v %v", n.PodCIDRs, n.InternalIPs)
	}
	if _, ok := v.e.LookupPod(ip("fd00:10:1::10"), time.Time{}); ok {
		t.Error("IPv6 address indexed")
	}
	r6 := v.enrich(v.viaService("fd00:10:1::10", "fd00:10:96::10", "fd00:10:2::12"))
	if stripLabels(r6.Src) != (plainEndpoint{}) || stripLabels(r6.Dst) != (plainEndpoint{}) || r6.Service != (flow.Service{}) || r6.Type != 0 {
		t.Errorf("IPv6 record enriched: %+v", r6)
	}
	r4 := v.enrich(v.viaService("198.18.1.10", "198.19.0.10", "198.18.2.12"))
	if r4.Src.PodName != "web" || r4.Dst.PodName != "api-2" || r4.Service.Name != "api" || r4.Type != flow.FlowTypeInterNode {
		t.Errorf("IPv4 record: %+v", r4)
	}
	if got := testutil.ToFloat64(v.e.m.lookups[1][1]); got != 2 {
		t.Errorf("IPv6 misses %v, want 2", got)
	}
	// The switch turns off IPv6 enrichment, not correlation: the node of
	// an IPv6 pod, node address or pod CIDR is still known (issue 24).
	for a, want := range map[string]string{"fd00:10:1::10": "node-1", "fd00:10:2::12": "node-2", "fd00:10:ff::2": "node-2", "fd00:10:2::99": "node-2"} {
		if n, ok := nodeForIP(v.e, ip(a)); !ok || n != want {
			t.Errorf("NodesForIPs(%s) = %q, %v; want %s", a, n, ok, want)
		}
	}
	// Both node halves of an IPv6 connection merge into one row.
	c := correlate.New(correlate.Config{}, v.e, nil)
	src := v.record("fd00:10:1::10", "fd00:10:2::12")
	src.ExporterNode = "node-1"
	dst := src
	dst.ExporterNode = "node-2"
	var out []flow.Record
	out = c.Add(&src, out)
	out = c.Add(&dst, out)
	if len(out) != 1 || out[0].Correlation != flow.CorrelationMerged || c.Held() != 0 {
		t.Errorf("IPv6 halves: %d rows, held %d: %+v", len(out), c.Held(), out)
	}
}

func TestHostNetworkPods(t *testing.T) {
	objs := append(baseObjects(),
		// kube-proxy shares node-1's addresses; the agent has an address
		// the Node object does not list.
		mkPod("kube-system", "kube-proxy-1", "node-1", []string{"198.19.200.1", "fd00:10:ff::1"}, hostNet, owned("DaemonSet", "kube-proxy")),
		mkPod("kube-system", "agent-2", "node-2", []string{"198.19.200.77", "fd00:10:ff::77"}, hostNet, owned("DaemonSet", "agent")),
		mkPod("backend", "api-1", "node-1", []string{"198.18.1.11", "fd00:10:1::11"}),
		mkPod("backend", "api-2", "node-2", []string{"198.18.2.12", "fd00:10:2::12"}),
	)
	v := newEnv(t, testConfig(), objs...)
	for _, c := range []struct {
		src, dst string
		node     string
		zone     string
		typ      flow.FlowType
	}{
		{"198.19.200.1", "198.18.1.11", "node-1", "zone-a", flow.FlowTypeIntraNode},
		{"fd00:10:ff::1", "fd00:10:1::11", "node-1", "zone-a", flow.FlowTypeIntraNode},
		{"198.19.200.77", "198.18.1.11", "node-2", "zone-b", flow.FlowTypeInterNode},
		{"fd00:10:ff::77", "fd00:10:2::12", "node-2", "zone-b", flow.FlowTypeIntraNode},
	} {
		r := v.enrich(v.record(c.src, c.dst))
		if want := (plainEndpoint{NodeName: c.node, Zone: c.zone}); stripLabels(r.Src) != want || r.Src.Labels != nil {
			t.Errorf("%s: src %+v, want the node only %+v", c.src, r.Src, want)
		}
		if r.Type != c.typ {
			t.Errorf("%s -> %s: type %v, want %v", c.src, c.dst, r.Type, c.typ)
		}
		if n, ok := nodeForIP(v.e, ip(c.src)); !ok || n != c.node {
			t.Errorf("NodesForIPs(%s) = %q", c.src, n)
		}
	}
	if _, ok := v.e.LookupPod(ip("198.19.200.1"), time.Time{}); ok {
		t.Error("a host-network pod is returned for its node's address")
	}
}

func TestDualStackServiceAcrossZones(t *testing.T) {
	svc, api1, api2, sl := dualService()
	web := mkPod("frontend", "web", "node-1", []string{"198.18.1.10", "fd00:10:1::10"})
	v := newEnv(t, testConfig(), append(baseObjects(), web, api1, api2, svc, sl[0], sl[1])...)
	type key struct {
		version uint8
		cross   bool
	}
	count := map[key]int{}
	for _, f := range []struct{ src, vip, endpoint, zone string }{
		{"198.18.1.10", "198.19.0.10", "198.18.1.11", "zone-a"},
		{"198.18.1.10", "198.19.0.10", "198.18.2.12", "zone-b"},
		{"fd00:10:1::10", "fd00:10:96::10", "fd00:10:1::11", "zone-a"},
		{"fd00:10:1::10", "fd00:10:96::10", "fd00:10:2::12", "zone-b"},
	} {
		r := v.enrich(v.viaService(f.src, f.vip, f.endpoint))
		if r.Src.Zone != "zone-a" || r.Dst.Zone != f.zone || r.Service.Name != "api" {
			t.Errorf("%s: zones %s -> %s service %s, want zone-a -> %s", f.endpoint, r.Src.Zone, r.Dst.Zone, r.Service.Name, f.zone)
		}
		count[key{r.IPVersion, r.Src.Zone != r.Dst.Zone}]++
	}
	if want := map[key]int{{4, false}: 1, {4, true}: 1, {6, false}: 1, {6, true}: 1}; fmt.Sprint(count) != fmt.Sprint(want) {
		t.Errorf("cross-zone counts per family %v, want %v", count, want)
	}

	// The slice's zone is the endpoint's zone, in both families, even
	// where the node says otherwise; without one the node's zone is used.
	moved := [2]runtime.Object{
		mkSlice("backend", "api-v4", "api", ep{"198.18.1.11", "node-1", "zone-c", "api-1"}, ep{"198.18.2.12", "node-2", "", "api-2"}),
		mkSlice("backend", "api-v6", "api", ep{"fd00:10:1::11", "node-1", "zone-c", "api-1"}, ep{"fd00:10:2::12", "node-2", "", "api-2"}),
	}
	v.apply(moved[0], moved[1])
	for _, f := range []struct{ src, vip, endpoint, zone string }{
		{"198.18.1.10", "198.19.0.10", "198.18.1.11", "zone-c"},
		{"fd00:10:1::10", "fd00:10:96::10", "fd00:10:1::11", "zone-c"},
		{"198.18.1.10", "198.19.0.10", "198.18.2.12", "zone-b"},
		{"fd00:10:1::10", "fd00:10:96::10", "fd00:10:2::12", "zone-b"},
	} {
		if r := v.enrich(v.viaService(f.src, f.vip, f.endpoint)); r.Dst.Zone != f.zone {
			t.Errorf("%s: zone %s, want %s", f.endpoint, r.Dst.Zone, f.zone)
		}
	}
}

func TestEndpointWithoutPodEvent(t *testing.T) {
	// The slice names a pod whose Pod event has not arrived: the
	// destination still gets the pod name, node and zone from the slice.
	svc := mkService("backend", "api", corev1.IPFamilyPolicyPreferDualStack, "198.19.0.10", "fd00:10:96::10")
	objs := append(baseObjects(), svc,
		mkSlice("backend", "api-v4", "api", ep{"198.18.2.40", "node-2", "zone-b", "late-pod"}),
		mkSlice("backend", "api-v6", "api", ep{"fd00:10:2::40", "node-2", "zone-b", "late-pod"}))
	v := newEnv(t, testConfig(), objs...)
	for _, f := range [][2]string{{"198.19.0.10", "198.18.2.40"}, {"fd00:10:96::10", "fd00:10:2::40"}} {
		src := "198.19.250.5"
		if ip(f[0]).Is6() {
			src = "fd00:10:ffff::5"
		}
		r := v.enrich(v.viaService(src, f[0], f[1]))
		if r.Dst.PodNamespace != "backend" || r.Dst.PodName != "late-pod" || r.Dst.NodeName != "node-2" || r.Dst.Zone != "zone-b" ||
			r.Type != flow.FlowTypeFromExternal || r.Service.PortName != "http" {
			t.Errorf("%s: %+v %v %+v", f[1], r.Dst, r.Type, r.Service)
		}
	}
}

func TestExternalAndLoadBalancerIPs(t *testing.T) {
	lb := mkService("backend", "ingress", corev1.IPFamilyPolicyRequireDualStack, "198.19.0.50", "fd00:10:96::50")
	lb.Spec.Type = corev1.ServiceTypeLoadBalancer
	lb.Spec.ExternalIPs = []string{"198.19.251.10", "fd00:10:e::10"}
	lb.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.251.20"}, {IP: "fd00:10:e::20"}, {Hostname: "lb.example"}}
	lb.Spec.Ports[0].NodePort = 30080
	// A second Service sharing the IPv4 load-balancer IP on another port.
	other := mkService("backend", "other", corev1.IPFamilyPolicySingleStack, "198.19.0.51")
	other.Spec.Type = corev1.ServiceTypeLoadBalancer
	other.Spec.Ports = []corev1.ServicePort{{Name: "smtp", Port: 25, Protocol: corev1.ProtocolTCP}}
	other.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: "198.19.251.20"}}
	api := mkPod("backend", "api-2", "node-2", []string{"198.18.2.12", "fd00:10:2::12"})
	v := newEnv(t, testConfig(), append(baseObjects(), lb, other, api)...)
	for _, c := range []struct {
		name, src, svcAddr string
		port               uint16
		want               flow.Service
	}{
		{"ipv4 external IP", "198.19.250.1", "198.19.251.10", 80, flow.Service{Namespace: "backend", Name: "ingress", PortName: "http"}},
		{"ipv6 external IP", "fd00:10:ffff::1", "fd00:10:e::10", 80, flow.Service{Namespace: "backend", Name: "ingress", PortName: "http"}},
		{"ipv4 load balancer", "198.19.250.1", "198.19.251.20", 80, flow.Service{Namespace: "backend", Name: "ingress", PortName: "http"}},
		{"ipv4 shared load balancer, other port", "198.19.250.1", "198.19.251.20", 25, flow.Service{Namespace: "backend", Name: "other", PortName: "smtp"}},
		{"ipv6 load balancer", "fd00:10:ffff::1", "fd00:10:e::20", 80, flow.Service{Namespace: "backend", Name: "ingress", PortName: "http"}},
		{"ipv4 node port", "198.19.250.1", "198.19.200.1", 30080, flow.Service{Namespace: "backend", Name: "ingress", PortName: "http"}},
		{"ipv6 node port", "fd00:10:ffff::1", "fd00:10:ff::2", 30080, flow.Service{Namespace: "backend", Name: "ingress", PortName: "http"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			dst := "198.18.2.12"
			if ip(c.src).Is6() {
				dst = "fd00:10:2::12"
			}
			r := v.record(c.src, dst)
			r.ServiceAddr, r.ServicePort = ip(c.svcAddr), c.port
			v.e.enrichOne(&r)
			if r.Service != c.want || r.Dst.PodName != "api-2" || r.Type != flow.FlowTypeFromExternal {
				t.Errorf("service %+v dst %s type %v, want %+v", r.Service, r.Dst.PodName, r.Type, c.want)
			}
		})
	}
	if s, ok := v.e.LookupService(ip("fd00:10:e::20"), time.Time{}); !ok || s.Name != "ingress" ||
		!slices.Equal(s.LoadBalancerIPs, []netip.Addr{ip("198.19.251.20"), ip("fd00:10:e::20")}) {
		t.Errorf("LookupService: %+v", s)
	}
}

func TestFlowTypes(t *testing.T) {
	cfg := testConfig()
	cfg.ServiceCIDRs = []netip.Prefix{netip.MustParsePrefix("198.19.0.0/17"), netip.MustParsePrefix("fd00:10:96::/108")}
	cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.200.0/21"), netip.MustParsePrefix("fd00:10:200::/56")}
	objs := append(baseObjects(),
		mkPod("a", "p1", "node-1", []string{"198.18.1.10", "fd00:10:1::10"}),
		mkPod("a", "p2", "node-1", []string{"198.18.1.11", "fd00:10:1::11"}),
		mkPod("a", "p3", "node-2", []string{"198.18.2.10", "fd00:10:2::10"}),
		mkService("a", "svc", corev1.IPFamilyPolicyPreferDualStack, "198.19.0.7", "fd00:10:96::7"))
	v := newEnv(t, cfg, objs...)
	for _, c := range []struct {
		name, src, dst string
		want           flow.FlowType
	}{
		{"ipv4 pods on one node", "198.18.1.10", "198.18.1.11", flow.FlowTypeIntraNode},
		{"ipv6 pods on one node", "fd00:10:1::10", "fd00:10:1::11", flow.FlowTypeIntraNode},
		{"ipv4 pods on two nodes", "198.18.1.10", "198.18.2.10", flow.FlowTypeInterNode},
		{"ipv6 pods on two nodes", "fd00:10:1::10", "fd00:10:2::10", flow.FlowTypeInterNode},
		{"ipv4 pod to the internet", "198.18.1.10", "198.19.252.8", flow.FlowTypeToExternal},
		{"ipv6 pod to the internet", "fd00:10:1::10", "fd00:10:4860::8888", flow.FlowTypeToExternal},
		{"ipv4 from the internet", "198.19.252.8", "198.18.2.10", flow.FlowTypeFromExternal},
		{"ipv6 from the internet", "fd00:10:4860::8888", "fd00:10:2::10", flow.FlowTypeFromExternal},
		{"ipv4 unknown address in node-2's pod CIDR", "198.18.1.10", "198.18.2.200", flow.FlowTypeInterNode},
		{"ipv6 unknown address in node-1's pod CIDR", "fd00:10:1::10", "fd00:10:1::200", flow.FlowTypeIntraNode},
		{"ipv4 node to its pod", "198.19.200.1", "198.18.1.10", flow.FlowTypeIntraNode},
		{"ipv6 node to another node's pod", "fd00:10:ff::1", "fd00:10:2::10", flow.FlowTypeInterNode},
		{"ipv4 external to a ClusterIP, no endpoint", "198.19.252.8", "198.19.0.7", flow.FlowTypeFromExternal},
		{"ipv6 pod to a ClusterIP, no endpoint: node unknown", "fd00:10:1::10", "fd00:10:96::7", flow.FlowTypeUnknown},
		{"ipv4 pod to the service CIDR", "198.18.1.10", "198.19.99.1", flow.FlowTypeUnknown},
		{"ipv6 external to the cluster CIDR", "fd00:10:4860::8888", "fd00:10:200::1", flow.FlowTypeFromExternal},
		{"ipv4 external to external", "198.19.252.8", "198.19.252.1", flow.FlowTypeUnknown},
		{"ipv6 external to external", "fd00:10:4860::8888", "fd00:10:4700::1111", flow.FlowTypeUnknown},
	} {
		t.Run(c.name, func(t *testing.T) {
			if r := v.enrich(v.record(c.src, c.dst)); r.Type != c.want {
				t.Errorf("type %v, want %v", r.Type, c.want)
			}
		})
	}
	// An untranslated flow to a ClusterIP names the Service.
	if r := v.enrich(v.record("fd00:10:1::10", "fd00:10:96::7")); r.Service.Name != "svc" {
		t.Errorf("flow to a ClusterIP: service %+v", r.Service)
	}
}

// TestMappedRecordAddresses: a record that was not normalized, with its
// IPv4 addresses 4-in-6 mapped (source, destination, Service address),
// is enriched as the same record unmapped (the lookups read unmapped
// addresses in place, and unmap others first).
func TestMappedRecordAddresses(t *testing.T) {
	objs := append(baseObjects(),
		mkPod("a", "p1", "node-1", []string{"198.18.1.10", "fd00:10:1::10"}),
		mkPod("a", "p3", "node-2", []string{"198.18.2.10", "fd00:10:2::10"}),
		mkService("a", "svc", corev1.IPFamilyPolicyPreferDualStack, "198.19.0.7", "fd00:10:96::7"))
	v := newEnv(t, testConfig(), objs...)
	for _, c := range []struct{ name, src, dst, svc string }{
		{"pods", "198.18.1.10", "198.18.2.10", ""},
		{"via a Service", "198.18.1.10", "198.18.2.10", "198.19.0.7"},
		{"to a ClusterIP", "198.18.2.10", "198.19.0.7", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			want := v.record(c.src, c.dst)
			mapped := want
			mapped.SrcAddr = netip.AddrFrom16(want.SrcAddr.As16())
			mapped.DstAddr = netip.AddrFrom16(want.DstAddr.As16())
			if c.svc != "" {
				want.ServiceAddr, want.ServicePort = ip(c.svc), 80
				mapped.ServiceAddr, mapped.ServicePort = netip.AddrFrom16(want.ServiceAddr.As16()), 80
			}
			if !mapped.SrcAddr.Is4In6() || !mapped.DstAddr.Is4In6() {
				t.Fatal("addresses not mapped")
			}
			got, wantR := v.enrich(mapped), v.enrich(want)
			if !reflect.DeepEqual(got.Src, wantR.Src) || !reflect.DeepEqual(got.Dst, wantR.Dst) || got.Service != wantR.Service || got.Type != wantR.Type {
				t.Errorf("mapped: %+v %+v %+v %v\nunmapped: %+v %+v %+v %v", got.Src, got.Dst, got.Service, got.Type,
					wantR.Src, wantR.Dst, wantR.Service, wantR.Type)
			}
			if wantR.Src.PodName != "p1" && wantR.Src.PodName != "p3" {
				t.Errorf("source not enriched: %+v", wantR.Src)
			}
		})
	}
}

func TestNodesForIPs(t *testing.T) {
	objs := append(baseObjects(),
		mkPod("a", "p1", "node-1", []string{"198.18.1.10", "fd00:10:1::10"}),
		mkPod("a", "gone", "node-2", []string{"198.18.2.66", "fd00:10:2::66"}),
		mkPod("kube-system", "hostnet", "node-2", []string{"198.19.200.99", "fd00:10:ff::99"}, hostNet))
	v := newEnv(t, testConfig(), objs...)
	v.remove(mkPod("a", "gone", "node-2", nil))
	v.clk.Add(time.Minute)
	cases := []struct {
		addr, want string
	}{
		{"198.18.1.10", "node-1"}, {"fd00:10:1::10", "node-1"}, // pods
		{"198.19.200.2", "node-2"}, {"fd00:10:ff::2", "node-2"}, // node InternalIPs
		{"198.19.200.99", "node-2"}, {"fd00:10:ff::99", "node-2"}, // host-network pod
		{"198.18.2.250", "node-2"}, {"fd00:10:2::250", "node-2"}, // pod CIDR
		{"198.18.2.66", "node-2"}, {"fd00:10:2::66", "node-2"}, // deleted pod within the grace period
		{"::ffff:198.18.1.10", "node-1"}, // mapped
		{"198.19.252.8", ""}, {"fd00:10:4860::8888", ""},
	}
	// One call answers every address, as the correlator asks for a
	// batch's; an invalid address (one it does not ask about) has none.
	addrs := []netip.Addr{{}}
	for _, c := range cases {
		addrs = append(addrs, ip(c.addr))
	}
	got := make([]string, len(addrs))
	for i := range got {
		got[i] = "stale"
	}
	v.e.NodesForIPs(addrs, got)
	if got[0] != "" {
		t.Errorf("NodesForIPs(invalid) = %q", got[0])
	}
	for i, c := range cases {
		if got[i+1] != c.want {
			t.Errorf("NodesForIPs(%s) = %q; want %q", c.addr, got[i+1], c.want)
		}
	}
}

func TestPolicyAccessors(t *testing.T) {
	objs := append(baseObjects(), mkPolicy("backend", "zz-last"), mkPolicy("backend", "default-deny"), mkPolicy("frontend", "egress"),
		mkPod("backend", "api-1", "node-1", []string{"198.18.1.11", "fd00:10:1::11"}, labeled("tier", "api")))
	v := newEnv(t, testConfig(), objs...)
	ns, ok := v.e.Namespace("backend")
	if !ok || ns.Labels["team"] != "api" {
		t.Fatalf("namespace %+v", ns)
	}
	names := func(ns string) []string {
		var out []string
		for _, p := range v.e.NetworkPolicies(ns) {
			out = append(out, p.Name)
		}
		return out
	}
	before := v.e.NetworkPolicies("backend")
	if got := names("backend"); !slices.Equal(got, []string{"default-deny", "zz-last"}) {
		t.Errorf("policies %v", got)
	}
	if p := before[0]; p.ManagedFields != nil || p.Spec.PolicyTypes[0] != "Ingress" {
		t.Errorf("trimmed policy %+v", p)
	}
	// Each change is signalled to the auditor (one pending signal).
	select {
	case <-v.e.PoliciesChanged():
	default:
	}
	v.apply(mkPolicy("backend", "allow-web"))
	select {
	case <-v.e.PoliciesChanged():
	default:
		t.Error("no change signal after a policy was added")
	}
	v.remove(mkPolicy("backend", "zz-last"))
	select {
	case <-v.e.PoliciesChanged():
	default:
		t.Error("no change signal after a policy was removed")
	}
	if got := names("backend"); !slices.Equal(got, []string{"allow-web", "default-deny"}) {
		t.Errorf("policies after changes %v", got)
	}
	if len(before) != 2 || before[1].Name != "zz-last" {
		t.Error("a policy list handed out earlier changed")
	}
	p, ok := v.e.Pod("backend", "api-1")
	if !ok || p.Labels["tier"] != "api" || len(p.Ports) != 1 || p.Ports[0] != (ContainerPort{"http", 8080, corev1.ProtocolTCP}) {
		t.Errorf("pod %+v", p)
	}
	if w := v.e.Workload(p); w != (Workload{KindPod, "api-1"}) {
		t.Errorf("workload %v", w)
	}
	if n, ok := v.e.Node("node-2"); !ok || n.Zone != "zone-b" || len(n.PodCIDRs) != 2 || v.e.Zone("node-2") != "zone-b" {
		t.Errorf("node %+v", n)
	}
}

func TestLabelSetsShared(t *testing.T) {
	var objs []runtime.Object
	for i := range 3 {
		objs = append(objs, mkPod("a", fmt.Sprintf("web-%d", i), "node-1", []string{fmt.Sprintf("198.18.1.%d", i+1)},
			func(p *corev1.Pod) { p.Labels = map[string]string{"app": "web", "pod-template-hash": "abc"} }))
	}
	v := newEnv(t, testConfig(), objs...)
	p0, _ := v.e.Pod("a", "web-0")
	p2, _ := v.e.Pod("a", "web-2")
	if fmt.Sprintf("%p", p0.Labels) != fmt.Sprintf("%p", p2.Labels) || &p0.Ports[0] != &p2.Ports[0] {
		t.Error("replicas do not share their label set and ports")
	}
}

func TestMetrics(t *testing.T) {
	objs := append(baseObjects(), mkPod("a", "p1", "node-1", []string{"198.18.1.10", "fd00:10:1::10"}))
	v := newEnv(t, testConfig(), objs...)
	v.enrich(v.record("198.18.1.10", "198.19.252.8"))
	v.enrich(v.record("fd00:10:1::10", "fd00:10:1::10"))
	v.e.Enrich([]flow.Record{v.record("fd00:10:1::10", "fd00:10:4861::1"), v.record("198.19.252.1", "198.19.252.8")})
	want := `
# HELP dualflow_enrich_lookups_total Flow endpoint addresses looked up in the Kubernetes index, by family; hit means a pod or a node was found.
# TYPE dualflow_enrich_lookups_total counter
dualflow_enrich_lookups_total{family="ipv4",result="hit"} 1
dualflow_enrich_lookups_total{family="ipv4",result="miss"} 3
dualflow_enrich_lookups_total{family="ipv6",result="hit"} 3
dualflow_enrich_lookups_total{family="ipv6",result="miss"} 1
# HELP dualflow_enrich_objects Live Kubernetes objects indexed, by kind.
# TYPE dualflow_enrich_objects gauge
dualflow_enrich_objects{kind="endpointslice"} 0
dualflow_enrich_objects{kind="job"} 0
dualflow_enrich_objects{kind="namespace"} 2
dualflow_enrich_objects{kind="networkpolicy"} 0
dualflow_enrich_objects{kind="node"} 2
dualflow_enrich_objects{kind="pod"} 1
dualflow_enrich_objects{kind="replicaset"} 0
dualflow_enrich_objects{kind="service"} 0
# HELP dualflow_enrich_synced 1 once the initial list of every watched kind is indexed.
# TYPE dualflow_enrich_synced gauge
dualflow_enrich_synced 1
`
	if err := testutil.GatherAndCompare(v.reg, strings.NewReader(want), "dualflow_enrich_lookups_total", "dualflow_enrich_objects", "dualflow_enrich_synced"); err != nil {
		t.Error(err)
	}
}

func TestInvalidAddressesCounted(t *testing.T) {
	bad := mkPod("a", "bad", "node-1", []string{"198.18.1.300", "fd00:10:1::7"})
	sl := mkSlice("a", "mixed", "svc", ep{"198.18.1.5", "", "", ""})
	sl.Endpoints = append(sl.Endpoints, sl.Endpoints[0])
	sl.Endpoints[1].Addresses = []string{"fd00:10::5"} // IPv6 in an IPv4 slice
	v := newEnv(t, testConfig(), append(baseObjects(), bad, sl)...)
	if p, _ := v.e.Pod("a", "bad"); !slices.Equal(p.Addrs, []netip.Addr{ip("fd00:10:1::7")}) {
		t.Errorf("addresses %v", p.Addrs)
	}
	if n := testutil.ToFloat64(v.e.m.invalid.WithLabelValues("pod", "invalid_ip")); n != 1 {
		t.Errorf("invalid pod IPs counted %v", n)
	}
	if n := testutil.ToFloat64(v.e.m.invalid.WithLabelValues("endpointslice", "family_mismatch")); n != 1 {
		t.Errorf("family mismatches counted %v", n)
	}
}

func TestSyncTimeoutNamesKind(t *testing.T) {
	cs := fake.NewClientset(baseObjects()...)
	cs.PrependReactor("list", "jobs", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "batch", Resource: "jobs"}, "", errors.New("rbac"))
	})
	cfg := testConfig()
	cfg.SyncTimeout = 300 * time.Millisecond
	e, err := NewForClient(cfg, cs, nil, discard())
	if err != nil {
		t.Fatal(err)
	}
	err = e.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "initial list of job ") {
		t.Fatalf("Run: %v, want an error naming job", err)
	}
	if werr := e.WaitForSync(context.Background()); werr != err {
		t.Errorf("WaitForSync: %v", werr)
	}
	if n := testutil.ToFloat64(e.m.watchErrors.WithLabelValues("job", "informer")); n < 1 {
		t.Errorf("watch errors %v", n)
	}
	if err := e.Run(context.Background()); err == nil {
		t.Error("second Run accepted")
	}
}

func TestWaitForSyncCancelled(t *testing.T) {
	e, err := NewForClient(testConfig(), fake.NewClientset(), nil, discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := e.WaitForSync(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitForSync on a cancelled context: %v", err)
	}
}

func TestEnrichAllocatesNothing(t *testing.T) {
	svc, api1, api2, sl := dualService()
	web := mkPod("frontend", "web", "node-1", []string{"198.18.1.10", "fd00:10:1::10"}, owned("ReplicaSet", "web-abc"), labeled("pod-template-hash", "abc"))
	v := newEnv(t, testConfig(), append(baseObjects(), web, api1, api2, svc, sl[0], sl[1], mkRS("frontend", "web-abc", "web"))...)
	for _, r := range []flow.Record{
		v.viaService("198.18.1.10", "198.19.0.10", "198.18.2.12"),
		v.viaService("fd00:10:1::10", "fd00:10:96::10", "fd00:10:2::12"),
		v.record("fd00:10:1::10", "fd00:10:4861::1"),
		v.record("198.19.252.8", "198.19.252.1"),
	} {
		batch := []flow.Record{r, r}
		if n := testing.AllocsPerRun(100, func() {
			rec := r
			v.e.enrichOne(&rec)
			v.e.Enrich(batch)
			nodeForIP(v.e, r.DstAddr)
		}); n != 0 {
			t.Errorf("%v -> %v: %v allocations", r.SrcAddr, r.DstAddr, n)
		}
	}
}

// TestConcurrentEnrich runs lookups while events change the index (run
// with -race).
func TestConcurrentEnrich(t *testing.T) {
	svc, api1, api2, sl := dualService()
	web := mkPod("frontend", "web", "node-1", []string{"198.18.1.10", "fd00:10:1::10"})
	v := newEnv(t, testConfig(), append(baseObjects(), web, api1, api2, svc, sl[0], sl[1])...)
	recs := []flow.Record{v.viaService("198.18.1.10", "198.19.0.10", "198.18.2.12"), v.viaService("fd00:10:1::10", "fd00:10:96::10", "fd00:10:2::12")}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				r := recs[(i+n)%2]
				v.e.enrichOne(&r)
				if r.Service.Name != "api" || r.Src.PodName != "web" {
					t.Errorf("concurrent enrich: %+v", r)
					return
				}
				nodeForIP(v.e, r.DstAddr)
				v.e.NetworkPolicies("backend")
			}
		})
	}
	for i := range 20 {
		p := mkPod("backend", fmt.Sprintf("churn-%d", i), "node-2", []string{fmt.Sprintf("198.18.2.%d", 100+i), fmt.Sprintf("fd00:10:2::%d", 100+i)})
		v.apply(p, mkPolicy("backend", fmt.Sprintf("p-%d", i)))
		v.remove(p)
		v.e.x.collect()
	}
	close(stop)
	wg.Wait()
}

func TestBatchAdapter(t *testing.T) {
	v := newEnv(t, testConfig(), append(baseObjects(), mkPod("a", "p", "node-1", []string{"198.18.1.10", "fd00:10:1::10"}))...)
	recs := []flow.Record{v.record("198.18.1.10", "198.19.252.8"), v.record("fd00:10:1::10", "fd00:10:4861::1")}
	var stage interface{ Enrich([]flow.Record) } = v.e
	stage.Enrich(recs)
	for _, r := range recs {
		if r.Src.PodName != "p" || r.Type != flow.FlowTypeToExternal {
			t.Errorf("%v: %+v", r.SrcAddr, r)
		}
	}
}

// TestOneEndpointTwoServices: a pod behind two Services has one claim per
// slice on its address; objects without UIDs (hand-written inventories)
// are told apart by name.
func TestOneEndpointTwoServices(t *testing.T) {
	a := mkService("backend", "a", corev1.IPFamilyPolicyPreferDualStack, "198.19.0.1", "fd00:10:96::1")
	b := mkService("backend", "b", corev1.IPFamilyPolicyPreferDualStack, "198.19.0.2", "fd00:10:96::2")
	b.Spec.Ports[0].Name = "web"
	objs := []runtime.Object{a, b,
		mkSlice("backend", "a-v4", "a", ep{"198.18.2.12", "node-2", "zone-b", "api-2"}),
		mkSlice("backend", "a-v6", "a", ep{"fd00:10:2::12", "node-2", "zone-b", "api-2"}),
		mkSlice("backend", "b-v4", "b", ep{"198.18.2.12", "node-2", "zone-x", "api-2"}),
		mkSlice("backend", "b-v6", "b", ep{"fd00:10:2::12", "node-2", "zone-x", "api-2"}),
		mkPod("backend", "api-2", "node-2", []string{"198.18.2.12", "fd00:10:2::12"}),
	}
	for _, o := range objs {
		o.(metav1.Object).SetUID("")
	}
	v := newEnv(t, testConfig(), append(baseObjects(), objs...)...)
	sl := mkSlice("backend", "b-v4", "b", ep{"198.18.2.12", "node-2", "zone-x", "api-2"})
	sl.UID = ""
	v.apply(sl) // an update of one slice leaves the other Service's claim alone
	for _, c := range []struct{ src, vip, dst, svc, zone string }{
		{"198.18.1.10", "198.19.0.1", "198.18.2.12", "a", "zone-b"},
		{"198.18.1.10", "198.19.0.2", "198.18.2.12", "b", "zone-x"},
		{"fd00:10:1::10", "fd00:10:96::1", "fd00:10:2::12", "a", "zone-b"},
		{"fd00:10:1::10", "fd00:10:96::2", "fd00:10:2::12", "b", "zone-x"},
	} {
		r := v.viaService(c.src, c.vip, c.dst)
		r.ServicePort = 0 // port name from the endpoint's own slice
		v.e.enrichOne(&r)
		if r.Service.Name != c.svc || r.Service.PortName != "http" || r.Dst.Zone != c.zone || r.Dst.PodName != "api-2" {
			t.Errorf("via %s: service %+v dst %+v", c.vip, r.Service, r.Dst)
		}
	}
	v.remove(mkSlice("backend", "b-v6", "b"))
	v.clk.Add(time.Minute)
	if r := v.enrich(v.viaService("fd00:10:1::10", "fd00:10:96::1", "fd00:10:2::12")); r.Dst.Zone != "zone-b" {
		t.Errorf("after deleting b's slice, a's endpoint: %+v", r.Dst)
	}
}
