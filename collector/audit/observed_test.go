package audit

import (
	"context"
	"errors"
	"net/netip"
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
