package audit

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// TestReportsLeaveOutProbes: the records of traceflow probes
// (probe_trace_id set) change none of the reports. The probes are what a
// user clicking through the reachability matrix sends: denied ones
// (tools/probe-1 -> backend/api, frontend/web -> backend/api on the
// metrics port over IPv6, over both families), allowed ones over one
// family only (frontend/web -> backend/api on a new port), so each would
// add a denied group, a used rule, an observed gap or a what-if change.
func TestReportsLeaveOutProbes(t *testing.T) {
	inv, now := labFlows(t)
	r, err := NewReports(engine, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w := Window{Since: now.Add(-time.Hour), Until: now.Add(time.Minute)}
	denyFrontend := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "backend", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	type reports struct {
		Denied []DeniedGroup
		Unused *UnusedReport
		Gaps   []Finding
		WhatIf *WhatIfReport
	}
	run := func() reports {
		t.Helper()
		var rep reports
		var err error
		if rep.Denied, err = r.Denied(ctx, DeniedOptions{Window: w}); err != nil {
			t.Fatal(err)
		}
		if rep.Unused, err = r.Unused(ctx, inv.NetworkPolicies, w); err != nil {
			t.Fatal(err)
		}
		if rep.Gaps, err = r.ObservedGaps(ctx, inv, w, 0); err != nil {
			t.Fatal(err)
		}
		if rep.WhatIf, err = r.WhatIf(ctx, inv, []*networkingv1.NetworkPolicy{denyFrontend}, w, 0); err != nil {
			t.Fatal(err)
		}
		return rep
	}
	before := run()

	m, _ := labInventory(t, manifest.ModeDual, 2)
	a, _ := New(Config{}, inv, nil)
	if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
		t.Fatal(err)
	}
	web1, api1, api2 := labPod(t, m, "frontend", "web", 1), labPod(t, m, "backend", "api", 1), labPod(t, m, "backend", "api", 2)
	probe1 := labPod(t, m, "tools", "probe", 1)
	var recs []flow.Record
	probe := func(id string, src, dst *corev1.Pod, f corev1.IPFamily, port uint16) {
		r := record(t, inv, src, dst, f, flow.ProtoTCP, port)
		r.SrcPort = uint16(50000 + len(recs))
		r.FlowStart, r.FlowEnd, r.TimeReceived = now.Add(-5*time.Minute), now.Add(-5*time.Minute), now
		r.Packets, r.PacketsDelta, r.Bytes, r.BytesDelta = 1, 1, 60, 60
		a.Audit(&r)
		r.ProbeTraceID = id
		recs = append(recs, r)
	}
	for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		probe("tf-00000000000000a1", probe1, api2, f, manifest.PortHTTP)
		probe("tf-00000000000000a2", web1, api1, f, manifest.PortMetrics)
	}
	probe("tf-00000000000000a3", web1, api2, corev1.IPv4Protocol, 7070)
	for i := range recs {
		if recs[i].Ingress.Verdict != flow.VerdictDenied && recs[i].Ingress.Verdict != flow.VerdictAllowed {
			t.Fatalf("probe record %d: ingress %v, want a policy decision", i, recs[i].Ingress.Verdict)
		}
	}
	var b []byte
	for i := range recs {
		b = store.AppendFlowRow(b, &recs[i])
	}
	if err := engine.InsertRowBinary(ctx, store.FlowsTable, store.FlowColumns, "", len(recs), b); err != nil {
		t.Fatal(err)
	}
	if out, err := engine.Query(ctx, "SELECT count() FROM dualflow.flows WHERE probe_trace_id != ''", "TSV"); err != nil || string(out) != "5\n" {
		t.Fatalf("probe rows stored: %q %v", out, err)
	}
	after := run()
	if !reflect.DeepEqual(before, after) {
		t.Errorf("probe records changed the reports:\nbefore %+v\nafter  %+v", before, after)
	}
}

// TestAuditorCountsNoProbes: a traceflow probe's record gets its verdicts
// (they are stored, and shown when probes are asked for) but does not
// count in dualflow_audit_verdicts_total, IPv4 or IPv6.
func TestAuditorCountsNoProbes(t *testing.T) {
	m, inv := labInventory(t, manifest.ModeDual, 2)
	a, _ := New(Config{}, inv, nil)
	if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
		t.Fatal(err)
	}
	probe1, api2 := labPod(t, m, "tools", "probe", 1), labPod(t, m, "backend", "api", 2)
	var recs []flow.Record
	for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		ordinary := record(t, inv, probe1, api2, f, flow.ProtoTCP, manifest.PortHTTP)
		probe := ordinary
		probe.SrcPort, probe.ProbeTraceID = 50001, "tf-00000000000000b1"
		recs = append(recs, ordinary, probe)
	}
	a.AuditBatch(recs)
	for i, r := range recs {
		if r.Ingress.Verdict != flow.VerdictDenied {
			t.Errorf("record %d (probe %q): ingress %v, want denied", i, r.ProbeTraceID, r.Ingress.Verdict)
		}
	}
	if n := testutil.ToFloat64(a.m.verdicts[policy.Ingress][flow.VerdictDenied]); n != 2 {
		t.Errorf("dualflow_audit_verdicts_total{ingress,denied} = %v, want 2 (the probes not counted)", n)
	}
}
