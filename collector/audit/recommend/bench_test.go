package recommend

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	goruntime "runtime"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/migrations"
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

// BenchmarkRecommendStoreLarge is the large scope end to end, as
// the server answers it: 10,000,000 flow records of largeScope's 220,000
// flow groups stored in the embedded engine (merged, as a store that has
// held them for a while), then Queries.Recommend for the cluster over a
// window of whole hours (the store read through the projection
// observed_1h, the recommendation, its YAML, replay, static audit and
// diff). It reports the wall time (ns/op), the process's CPU time per
// answer (the engine's threads included) and its maximum RSS (engine,
// seeded records and answer). Run it alone: the seeding takes minutes.
//
//	go test -run '^$' -bench RecommendStoreLarge -benchtime 1x -count 2 ./collector/audit/recommend/
func BenchmarkRecommendStoreLarge(b *testing.B) {
	dir := b.TempDir()
	e, err := store.NewEmbedded(store.EmbeddedConfig{DataDir: dir})
	if errors.Is(err, chdb.ErrLibraryNotFound) && os.Getenv("DUALFLOW_REQUIRE_CHDB") != "1" {
		b.Skip("libchdb not available (make deps)")
	}
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	r, err := migrations.NewRunner(e, migrations.Options{})
	if err == nil {
		_, err = r.Up(ctx)
	}
	if err != nil {
		b.Fatal(err)
	}
	view, groups := largeScope(b)
	const records, batch = 10_000_000, 100_000
	end := time.Date(2025, 4, 1, 12, 0, 0, 0, time.UTC)
	// One endpoint per pod, shared by its records as enrichment shares
	// them (the encoder caches a label set's encoding).
	eps := map[string]flow.Endpoint{}
	endpoint := func(f audit.FlowEnd) flow.Endpoint {
		if f.Pod == "" {
			return flow.Endpoint{}
		}
		k := f.Namespace + "/" + f.Pod
		if ep, ok := eps[k]; ok {
			return ep
		}
		p := mustPod(view, f.Namespace, f.Pod)
		ep := flow.Endpoint{PodNamespace: f.Namespace, PodName: f.Pod, WorkloadKind: f.WorkloadKind, WorkloadName: f.WorkloadName, Labels: p.Labels}
		eps[k] = ep
		return ep
	}
	type proto struct {
		src, dst flow.Endpoint
		sa, da   netip.Addr
		port     uint16
	}
	protos := make([]proto, len(groups))
	for i, g := range groups {
		protos[i] = proto{endpoint(g.Src), endpoint(g.Dst), netip.MustParseAddr(g.Src.IP), netip.MustParseAddr(g.Dst.IP), g.DstPort}
	}
	recs := make([][]flow.Record, 2) // per inserter
	seeded := time.Now()
	err = e.InsertNativeBlocks(ctx, 2, records/batch, func(n, worker int) *store.NativeBlock {
		recs[worker] = recs[worker][:0]
		for i := n * batch; i < (n+1)*batch; i++ {
			p := &protos[i%len(protos)]
			r := flow.Record{Proto: flow.ProtoTCP, SrcPort: uint16(30000 + i%30000), DstPort: p.port, SrcAddr: p.sa, DstAddr: p.da,
				Src: p.src, Dst: p.dst, FlowStart: end.Add(-time.Hour), FlowEnd: end.Add(-time.Duration(1+i%3000) * time.Second), TimeReceived: end,
				Packets: 3, PacketsDelta: 3, Bytes: 180, BytesDelta: 180}
			r.Ingress.Verdict, r.Egress.Verdict = flow.VerdictNotIsolated, flow.VerdictNotIsolated
			r.Normalize()
			recs[worker] = append(recs[worker], r)
		}
		return store.NewNativeBlock(recs[worker])
	})
	if err == nil {
		err = e.Exec(ctx, "OPTIMIZE TABLE dualflow.flows FINAL")
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d records of %d flow groups seeded and merged in %s", records, len(groups), time.Since(seeded).Round(time.Second))
	rep, err := audit.NewReports(e, "")
	if err != nil {
		b.Fatal(err)
	}
	q := &Queries{Queries: &audit.Queries{Reports: rep, Cluster: func() (*enrich.Snapshot, error) { return view, nil }}}
	rusage := func() (cpu time.Duration, maxRSS int64) {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Maxrss * 1024
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, _ := rusage()
	for b.Loop() {
		out, err := q.Recommend(ctx, Request{Options: Options{Mode: LeastPrivilege}, Window: audit.Window{Since: end.Add(-2 * time.Hour), Until: end}})
		if err != nil {
			b.Fatal(err)
		}
		if out.Flows != len(groups) {
			b.Fatalf("%d flow groups read, want %d", out.Flows, len(groups))
		}
		for _, f := range out.Replay {
			if f.Kept != f.Allowed {
				b.Fatalf("IPv%d: %d of %d kept", f.Family, f.Kept, f.Allowed)
			}
		}
		b.ReportMetric(float64(len(out.Policies)), "policies")
	}
	cpu, rss := rusage()
	b.ReportMetric((cpu-start).Seconds()/float64(b.N), "cpu-s/op")
	b.ReportMetric(float64(rss)/1e6, "maxRSS-MB")
}
