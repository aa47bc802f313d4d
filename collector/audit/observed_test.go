package audit

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// TestObservedFlows: the lab's stored flows (labFlows) and two traceflow
// probes become flow groups with their allowed, denied and probe records,
// for the cluster, a namespace and a workload, the same on each read.
func TestObservedFlows(t *testing.T) {
	inv, now := labFlows(t)
	m, _ := labInventory(t, manifest.ModeDual, 2)
	web1, api2 := labPod(t, m, "frontend", "web", 1), labPod(t, m, "backend", "api", 2)
	var b []byte
	for i := range 2 {
		r := record(t, inv, web1, api2, corev1.IPv6Protocol, flow.ProtoTCP, 9999)
		r.SrcPort = uint16(50000 + i)
		r.ProbeTraceID = "tf-observed"
		r.FlowStart, r.FlowEnd, r.TimeReceived = now.Add(-2*time.Minute), now.Add(-time.Minute), now
		b = store.AppendFlowRow(b, &r)
	}
	if err := needEngine(t).InsertRowBinary(context.Background(), store.FlowsTable, store.FlowColumns, "", 2, b); err != nil {
		t.Fatal(err)
	}
	rep, _ := NewReports(engine, "")
	win := Window{Since: now.Add(-time.Hour), Until: now.Add(time.Second)}
	ctx := context.Background()
	for _, tc := range []struct {
		ns, workload            string
		groups                  int
		allowed, denied, probes uint64
	}{
		{"", "", 9, 12, 5, 2},
		{"tools", "", 3, 0, 3, 0},
		{"frontend", "web", 8, 12, 4, 2},
		{"backend", "api", 6, 8, 3, 2},
	} {
		fs, truncated, err := rep.ObservedFlows(ctx, ObservedOptions{Window: win, Namespace: tc.ns, Workload: tc.workload})
		if err != nil || truncated {
			t.Fatalf("%s/%s: %v (truncated %v)", tc.ns, tc.workload, err, truncated)
		}
		var allowed, denied, probes uint64
		for _, f := range fs {
			allowed, denied, probes = allowed+f.Allowed, denied+f.Denied, probes+f.Probes
			if a, err := netip.ParseAddr(f.Src.IP); err != nil || f.IPVersion != flow.Version(a) {
				t.Errorf("%s/%s: group %+v: family %d", tc.ns, tc.workload, f, f.IPVersion)
			}
		}
		if len(fs) != tc.groups || allowed != tc.allowed || denied != tc.denied || probes != tc.probes {
			t.Errorf("%s/%s: %d groups, %d allowed, %d denied, %d probe records; want %d, %d, %d, %d:\n%+v",
				tc.ns, tc.workload, len(fs), allowed, denied, probes, tc.groups, tc.allowed, tc.denied, tc.probes, fs)
		}
		again, _, _ := rep.ObservedFlows(ctx, ObservedOptions{Window: win, Namespace: tc.ns, Workload: tc.workload})
		for i := range again {
			if again[i] != fs[i] {
				t.Errorf("%s/%s: group %d differs on a second read: %+v vs %+v", tc.ns, tc.workload, i, again[i], fs[i])
			}
		}
	}
	// The most records first: web@1 -> web@2 (4 records, IPv4 only).
	fs, truncated, err := rep.ObservedFlows(ctx, ObservedOptions{Window: win, Limit: 1})
	if err != nil || !truncated || len(fs) != 1 || fs[0].Dst.WorkloadName != "web" || fs[0].Allowed != 4 {
		t.Errorf("limit 1: %+v, truncated %v, %v", fs, truncated, err)
	}
	var tl *TooLargeError
	if _, _, err := rep.ObservedFlows(ctx, ObservedOptions{Window: win, Limit: DefaultObservedMaxGroups + 1}); !errors.As(err, &tl) {
		t.Errorf("limit past the bound: %v, want a TooLargeError", err)
	}
	if _, _, err := rep.ObservedFlows(ctx, ObservedOptions{Window: win, Workload: "web"}); err == nil {
		t.Error("a workload without its namespace: no error")
	}
}

// BenchmarkObservedFlowsLarge reads the flow groups of a window of
// 1,000,000 flow records between the 6,000 pods of 2,000 workloads (100
// namespaces): 204,000 groups (each pod to 17 others, over each family),
// for the cluster. The window has ten times the records.
func BenchmarkObservedFlowsLarge(b *testing.B) {
	e := needEngine(b)
	ctx := context.Background()
	if err := e.Exec(ctx, "TRUNCATE TABLE dualflow.flows"); err != nil {
		b.Fatal(err)
	}
	const records, pods, batch = 1_000_000, 6000, 100_000
	end := time.Date(2025, 4, 1, 12, 0, 0, 0, time.UTC)
	ep := func(n int) flow.Endpoint {
		w := n / 3
		ns, name := fmt.Sprintf("ns%03d", w/20), fmt.Sprintf("w%02d", w%20)
		return flow.Endpoint{PodNamespace: ns, PodName: fmt.Sprintf("%s-%d", name, n%3), WorkloadKind: "Deployment", WorkloadName: name,
			Labels: map[string]string{"app": name}}
	}
	addr := func(n, fam int) netip.Addr {
		if fam == 4 {
			return netip.AddrFrom4([4]byte{198, 18, byte(n >> 8), byte(n)})
		}
		return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 14: byte(n >> 8), 15: byte(n)})
	}
	var buf []byte
	for start := 0; start < records; start += batch {
		buf = buf[:0]
		for i := start; i < start+batch; i++ {
			fam := 4 + 2*(i%2)
			s := (i / 2) % pods
			d := (s + 1 + (i/(2*pods))%17) % pods
			r := flow.Record{Proto: flow.ProtoTCP, SrcPort: uint16(30000 + i%30000), DstPort: 8080, SrcAddr: addr(s, fam), DstAddr: addr(d, fam),
				Src: ep(s), Dst: ep(d), FlowStart: end.Add(-time.Hour), FlowEnd: end.Add(-time.Duration(1+i%3000) * time.Second), TimeReceived: end,
				Packets: 3, PacketsDelta: 3, Bytes: 180, BytesDelta: 180}
			r.Ingress.Verdict, r.Egress.Verdict = flow.VerdictNotIsolated, flow.VerdictNotIsolated
			r.Normalize()
			buf = store.AppendFlowRow(buf, &r)
		}
		if err := e.InsertRowBinary(ctx, store.FlowsTable, store.FlowColumns, "", batch, buf); err != nil {
			b.Fatal(err)
		}
	}
	rep, _ := NewReports(e, "")
	win := Window{Since: end.Add(-2 * time.Hour), Until: end}
	b.ReportAllocs()
	// The process's CPU time covers the embedded engine's threads: on a
	// shared machine it says more than the wall time.
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start := cpu()
	for b.Loop() {
		fs, truncated, err := rep.ObservedFlows(ctx, ObservedOptions{Window: win})
		if err != nil || truncated {
			b.Fatal(err, truncated)
		}
		b.ReportMetric(float64(len(fs)), "groups")
	}
	b.ReportMetric((cpu()-start).Seconds()/float64(b.N), "cpu-s/op")
}
