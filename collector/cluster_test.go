package collector

import (
	"fmt"
	"net/netip"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
)

// snapshotOf is a synthetic enrichment snapshot: pods of 10-replica
// Deployments, dual-stack, in 40 namespaces, with Services per Deployment.
func snapshotOf(pods int) *enrich.Snapshot {
	s := &enrich.Snapshot{}
	for n := range 40 {
		s.Namespaces = append(s.Namespaces, &enrich.Namespace{Name: fmt.Sprintf("ns-%02d", n), Labels: map[string]string{"team": fmt.Sprint(n)}})
	}
	ports := []enrich.ContainerPort{{Name: "http", Port: 8080, Protocol: corev1.ProtocolTCP}, {Name: "dns", Port: 53, Protocol: corev1.ProtocolUDP}}
	for i := range pods {
		d := i / 10
		labels := map[string]string{"app": fmt.Sprintf("app-%d", d)}
		v4 := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		v6 := netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 12: byte(i >> 24), 13: byte(i >> 16), 14: byte(i >> 8), 15: byte(i)})
		s.Pods = append(s.Pods, &enrich.Pod{Namespace: fmt.Sprintf("ns-%02d", d%40), Name: fmt.Sprintf("app-%d-%d", d, i%10),
			Labels: labels, Addrs: []netip.Addr{v4, v6}, Ports: ports, Terminated: i%97 == 0})
		s.Workloads = append(s.Workloads, enrich.Workload{Kind: enrich.KindDeployment, Name: fmt.Sprintf("app-%d", d)})
		if i%10 == 0 {
			s.Services = append(s.Services, &enrich.Service{Namespace: fmt.Sprintf("ns-%02d", d%40), Name: fmt.Sprintf("app-%d", d),
				Selector: labels, IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
				ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{198, 19, byte(d >> 8), byte(d)})}})
		}
	}
	return s
}

// TestInventoryFromSnapshot: every running pod with its addresses of both
// families, ports, labels and resolved workload; terminated pods left out;
// Services with selector, families and ClusterIPs.
func TestInventoryFromSnapshot(t *testing.T) {
	s := snapshotOf(200)
	inv := InventoryFromSnapshot(s)
	running := 0
	for _, p := range s.Pods {
		got, ok := inv.Pod(p.Namespace, p.Name)
		if p.Terminated {
			if ok {
				t.Errorf("terminated pod %s/%s in the inventory", p.Namespace, p.Name)
			}
			continue
		}
		running++
		if !ok {
			t.Fatalf("pod %s/%s missing", p.Namespace, p.Name)
		}
		a4, ok4 := got.Addr(4)
		a6, ok6 := got.Addr(6)
		if !ok4 || !ok6 || a4 != p.Addrs[0] || a6 != p.Addrs[1] || got.PortName(53, flow.ProtoUDP) != "dns" || got.Labels["app"] != p.Labels["app"] {
			t.Errorf("pod %s/%s: %+v", p.Namespace, p.Name, got)
		}
		if w := inv.Workload(got); w.Kind != enrich.KindDeployment || w.Name != p.Labels["app"] {
			t.Errorf("pod %s/%s workload %+v", p.Namespace, p.Name, w)
		}
	}
	if len(inv.Pods()) != running || len(inv.Services()) != len(s.Services) || len(inv.Namespaces()) != len(s.Namespaces) {
		t.Errorf("%d pods, %d services, %d namespaces; want %d, %d, %d", len(inv.Pods()), len(inv.Services()), len(inv.Namespaces()), running, len(s.Services), len(s.Namespaces))
	}
	if svc := inv.Services()[0]; svc.Selector["app"] != "app-0" || len(svc.IPFamilies) != 2 {
		t.Errorf("service %+v", svc)
	}
}

// BenchmarkInventoryFromSnapshot converts a 100k-pod snapshot into the
// audit's inventory (what Collector.Inventory does at most once a second
// while the cluster changes).
func BenchmarkInventoryFromSnapshot(b *testing.B) {
	const pods = 100_000
	s := snapshotOf(pods)
	b.ReportAllocs()
	for b.Loop() {
		InventoryFromSnapshot(s)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/pods, "ns/pod")
}
