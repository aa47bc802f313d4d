package enrich

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dualflow/dualflow/flow"
)

func snapshotObjects() []runtime.Object {
	done := mkPod("backend", "job-x", "node-1", []string{"198.18.1.99", "fd00:10:1::99"})
	done.Status.Phase = corev1.PodSucceeded
	return append(baseObjects(),
		mkRS("backend", "api-6b7f9c5d84", "api"),
		mkPod("backend", "api-6b7f9c5d84-a", "node-1", []string{"198.18.1.11", "fd00:10:1::11"}, owned("ReplicaSet", "api-6b7f9c5d84")),
		mkPod("frontend", "web", "node-2", []string{"198.18.2.10"}),
		mkPod("kube-system", "proxy", "node-1", []string{"198.19.200.1", "fd00:10:ff::1"}, hostNet, owned("DaemonSet", "proxy")),
		done,
		mkService("backend", "api", corev1.IPFamilyPolicyPreferDualStack, "198.19.0.10", "fd00:10:96::10"),
		mkPolicy("backend", "deny"),
	)
}

// TestSnapshotLookups: the view built from objects (manifests, tests)
// keeps running pods only, resolves workloads through their ReplicaSet,
// and finds pods by name and by address (IPv4 and IPv6; host-network
// pods by name only), namespaces and Services by name and container ports
// by number.
func TestSnapshotLookups(t *testing.T) {
	s := NewSnapshot(snapshotObjects()...)
	if len(s.Pods) != 3 || len(s.Services) != 1 || len(s.NetworkPolicies) != 1 || len(s.Nodes) != 2 || len(s.Namespaces) != 2 {
		t.Fatalf("snapshot: %d pods, %d services, %d policies, %d nodes, %d namespaces", len(s.Pods), len(s.Services), len(s.NetworkPolicies), len(s.Nodes), len(s.Namespaces))
	}
	if _, ok := s.Pod("backend", "job-x"); ok {
		t.Error("terminated pod in the view")
	}
	for _, c := range []struct{ addr, pod string }{
		{"198.18.1.11", "api-6b7f9c5d84-a"}, {"fd00:10:1::11", "api-6b7f9c5d84-a"}, {"::ffff:198.18.2.10", "web"},
		{"198.19.200.1", ""}, {"fd00:10:ff::1", ""}, {"198.18.1.99", ""},
	} {
		p, ok := s.LookupPod(ip(c.addr), time.Time{})
		if ok != (c.pod != "") || ok && p.Name != c.pod {
			t.Errorf("LookupPod(%s) = %v, %v; want %q", c.addr, p, ok, c.pod)
		}
	}
	api, ok := s.Pod("backend", "api-6b7f9c5d84-a")
	if !ok {
		t.Fatal("pod by name")
	}
	if w := s.Workload(api); w != (Workload{KindDeployment, "api"}) {
		t.Errorf("workload %+v", w)
	}
	if px, _ := s.Pod("kube-system", "proxy"); px == nil || s.Workload(px) != (Workload{KindDaemonSet, "proxy"}) {
		t.Errorf("host-network pod %+v", px)
	}
	if api.PortName(8080, flow.ProtoTCP) != "http" || api.PortName(8080, flow.ProtoUDP) != "" {
		t.Error("port name")
	}
	if ns, ok := s.Namespace("frontend"); !ok || ns.Labels["team"] != "web" {
		t.Errorf("namespace %+v", ns)
	}
	if svc, ok := s.Service("backend", "api"); !ok || len(svc.ClusterIPs) != 2 {
		t.Errorf("service %+v", svc)
	}
	if _, ok := s.Service("frontend", "api"); ok {
		t.Error("a Service found in the wrong namespace")
	}
}

// TestSnapshotOfLiveView: the Enricher's snapshot and the one built from
// the same objects are the same view.
func TestSnapshotOfLiveView(t *testing.T) {
	objs := snapshotObjects()
	live := newEnv(t, testConfig(), objs...).e.Snapshot()
	built := NewSnapshot(objs...)
	names := func(s *Snapshot) (out []string) {
		for i, p := range s.Pods {
			out = append(out, p.Namespace+"/"+p.Name+" "+s.Workloads[i].Kind+"/"+s.Workloads[i].Name)
		}
		return out
	}
	if a, b := names(live), names(built); len(a) != len(b) || len(a) == 0 {
		t.Fatalf("live %v, built %v", a, b)
	} else {
		for i := range a {
			if a[i] != b[i] {
				t.Errorf("pod %d: live %s, built %s", i, a[i], b[i])
			}
		}
	}
}
