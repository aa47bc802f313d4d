package recommend

import (
	"fmt"
	"net/netip"
	goruntime "runtime"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
)

// largeScope is the large scope: 2,000 Deployments (100
// namespaces of 20) of 3 dual-stack pods each, every Deployment calling
// the next 5 (the first of them in another namespace) on 8080/TCP from
// each pod to each pod over both families (18 groups per pair), and 10
// outside addresses of each family on 443/TCP: 220,000 flow groups, what
// a window of about 10M flow records between them aggregates to.
func largeScope(tb testing.TB) (*enrich.Snapshot, []audit.ObservedFlow) {
	tb.Helper()
	const namespaces, perNS, pods, calls, outside = 100, 20, 3, 5, 10
	objs := []runtime.Object{}
	v4 := func(n int) string { return netip.AddrFrom4([4]byte{198, 18, byte(n >> 8), byte(n)}).String() }
	v6 := func(n int) string {
		return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 14: byte(n >> 8), 15: byte(n)}).String()
	}
	type wl struct{ ns, name string }
	var wls []wl
	n := 0
	for i := range namespaces {
		namespace := fmt.Sprintf("ns%03d", i)
		objs = append(objs, ns(namespace))
		for j := range perNS {
			name := fmt.Sprintf("w%02d", j)
			wls = append(wls, wl{namespace, name})
			for k := range pods {
				n++
				objs = append(objs, deployPod(namespace, name, fmt.Sprintf("%s-%d", name, k), "node-1", []string{v4(n), v6(n)}, port("http", 8080, corev1.ProtocolTCP)))
			}
		}
	}
	view := enrich.NewSnapshot(objs...)
	var flows []audit.ObservedFlow
	for i, w := range wls {
		for c := 1; c <= calls; c++ {
			d := wls[(i+c*perNS/calls+c)%len(wls)]
			for a := range pods {
				for b := range pods {
					for _, v := range []uint8{4, 6} {
						src, _ := podEnd(view, mustPod(view, w.ns, fmt.Sprintf("%s-%d", w.name, a)), v)
						dst, _ := podEnd(view, mustPod(view, d.ns, fmt.Sprintf("%s-%d", d.name, b)), v)
						flows = append(flows, audit.ObservedFlow{Src: src, Dst: dst, Protocol: flow.ProtoTCP, DstPort: 8080, IPVersion: v, Allowed: 50})
					}
				}
			}
		}
		src4, _ := podEnd(view, mustPod(view, w.ns, w.name+"-0"), 4)
		src6, _ := podEnd(view, mustPod(view, w.ns, w.name+"-0"), 6)
		for x := range outside {
			flows = append(flows,
				audit.ObservedFlow{Src: src4, Dst: audit.FlowEnd{IP: fmt.Sprintf("198.19.%d.%d", i%200, x+1)}, Protocol: flow.ProtoTCP, DstPort: 443, IPVersion: 4, Allowed: 10},
				audit.ObservedFlow{Src: src6, Dst: audit.FlowEnd{IP: fmt.Sprintf("fd00:10:ffff:%x::%x", i, x+1)}, Protocol: flow.ProtoTCP, DstPort: 443, IPVersion: 6, Allowed: 10})
		}
	}
	return view, flows
}

func mustPod(view *enrich.Snapshot, namespace, name string) *enrich.Pod {
	p, ok := view.Pod(namespace, name)
	if !ok {
		panic("no pod " + namespace + "/" + name)
	}
	return p
}

// BenchmarkRecommendLarge: the answer for the whole large scope, as the
// server builds it from the groups read (Build): least-privilege (4,000
// policies) rendered as YAML, its replay over the 220,000 groups, the
// static audit and the diff against the policies in force.
func BenchmarkRecommendLarge(b *testing.B) {
	view, flows := largeScope(b)
	b.Logf("%d pods, %d flow groups", len(view.Pods), len(flows))
	b.ReportAllocs()
	var ms goruntime.MemStats
	goruntime.GC()
	goruntime.ReadMemStats(&ms)
	base := ms.HeapAlloc
	for b.Loop() {
		rep, err := Build(view, flows, Request{Options: Options{Mode: LeastPrivilege}})
		if err != nil {
			b.Fatal(err)
		}
		for _, f := range rep.Replay {
			if f.Kept != f.Allowed {
				b.Fatalf("IPv%d: %d of %d kept", f.Family, f.Kept, f.Allowed)
			}
		}
		if len(rep.Diff) != len(rep.Policies) {
			b.Fatalf("%d diffs for %d policies", len(rep.Diff), len(rep.Policies))
		}
		y := rep.YAML
		// What the answer holds (the policies, their YAML, the replay)
		// once the work is done and collected.
		goruntime.GC()
		goruntime.ReadMemStats(&ms)
		b.ReportMetric(float64(ms.HeapAlloc-base)/(1<<20), "MiB-held")
		b.ReportMetric(float64(len(y))/(1<<20), "MiB-yaml")
		goruntime.KeepAlive(rep)
	}
}
