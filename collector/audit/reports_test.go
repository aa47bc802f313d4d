package audit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/migrations"
)

// engine is the embedded ClickHouse of this package's tests (one per
// process), nil when libchdb is missing.
var engine *store.Embedded

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dualflow-audit-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	e, err := store.NewEmbedded(store.EmbeddedConfig{DataDir: dir})
	switch {
	case errors.Is(err, chdb.ErrLibraryNotFound) && os.Getenv("DUALFLOW_REQUIRE_CHDB") != "1":
		fmt.Fprintln(os.Stderr, "libchdb not found: report tests will skip (run make deps)")
	case err != nil:
		fmt.Fprintln(os.Stderr, "open embedded clickhouse:", err)
		return 1
	default:
		engine = e
		defer e.Close()
		r, err := migrations.NewRunner(e, migrations.Options{})
		if err == nil {
			_, err = r.Up(context.Background())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "migrate:", err)
			return 1
		}
	}
	return m.Run()
}

func needEngine(t testing.TB) *store.Embedded {
	t.Helper()
	if engine == nil {
		t.Skip("libchdb not available (make deps)")
	}
	return engine
}

// labFlows audits flows of the default dual-stack lab and stores them:
// web@1 -> api@2 http in both families, metrics allowed over IPv4 and
// denied over IPv6 (the gap), probe@1 -> web@2 denied by egress, probe@1
// -> api@1 denied by ingress, web@1 -> web@2 over IPv4 only.
func labFlows(t *testing.T) (*enrich.Snapshot, time.Time) {
	t.Helper()
	return labFlowsWith(t, false)
}

// labFlowsWith stores labFlows' flows and, with pings, web@1 -> web@2
// pings in both families (ICMP echo request 8<<8, ICMPv6 128<<8) and
// web@2 -> web@1 pings over IPv4 only.
func labFlowsWith(t *testing.T, pings bool) (*enrich.Snapshot, time.Time) {
	t.Helper()
	e := needEngine(t)
	for _, tbl := range []string{"flows", "rollup_pod_to_pod_1m", "rollup_pod_to_service_1m", "rollup_node_to_node_1m", "rollup_policy_1m"} {
		if err := e.Exec(context.Background(), "TRUNCATE TABLE dualflow."+tbl); err != nil {
			t.Fatal(err)
		}
	}
	m, inv := labInventory(t, manifest.ModeDual, 2)
	a, _ := New(Config{}, inv, nil)
	if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
		t.Fatal(err)
	}
	web1, web2 := labPod(t, m, "frontend", "web", 1), labPod(t, m, "frontend", "web", 2)
	api1, api2 := labPod(t, m, "backend", "api", 1), labPod(t, m, "backend", "api", 2)
	probe1 := labPod(t, m, "tools", "probe", 1)
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	now := time.Now().UTC().Truncate(time.Millisecond)
	var recs []flow.Record
	addProto := func(n int, src, dst *corev1.Pod, f corev1.IPFamily, proto uint8, port uint16) {
		for i := range n {
			r := record(t, inv, src, dst, f, proto, port)
			r.SrcPort = uint16(30000 + len(recs))
			r.FlowStart, r.FlowEnd, r.TimeReceived = now.Add(-10*time.Minute), now.Add(-time.Duration(i+1)*time.Minute), now
			r.Packets, r.PacketsDelta, r.Bytes, r.BytesDelta = 3, 3, 180, 180
			a.Audit(&r)
			recs = append(recs, r)
		}
	}
	add := func(n int, src, dst *corev1.Pod, f corev1.IPFamily, port uint16) {
		addProto(n, src, dst, f, flow.ProtoTCP, port)
	}
	add(3, web1, api2, v4, manifest.PortHTTP)
	add(3, web1, api2, v6, manifest.PortHTTP)
	add(2, web1, api2, v4, manifest.PortMetrics)
	add(2, web1, api2, v6, manifest.PortMetrics)
	add(1, probe1, web2, v4, manifest.PortHTTP)
	add(1, probe1, web2, v6, manifest.PortHTTP)
	add(1, probe1, api1, v4, manifest.PortHTTP)
	add(4, web1, web2, v4, manifest.PortHTTP)
	if pings {
		addProto(2, web1, web2, v4, flow.ProtoICMP, 8<<8)
		addProto(3, web1, web2, v6, flow.ProtoICMPv6, 128<<8)
		addProto(5, web2, web1, v4, flow.ProtoICMP, 8<<8)
	}
	var b []byte
	for i := range recs {
		b = store.AppendFlowRow(b, &recs[i])
	}
	if err := e.InsertRowBinary(context.Background(), store.FlowsTable, store.FlowColumns, "", len(recs), b); err != nil {
		t.Fatal(err)
	}
	return inv, now
}

func TestDeniedReport(t *testing.T) {
	_, now := labFlows(t)
	r, err := NewReports(engine, "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	w := Window{Since: now.Add(-time.Hour), Until: now.Add(time.Minute)}
	got, err := r.Denied(ctx, DeniedOptions{Window: w})
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, g := range got {
		if g.First.IsZero() || g.Last.Before(g.First) || g.Packets != 3*g.Records {
			t.Errorf("group %+v: times or counters wrong", g)
		}
		lines = append(lines, fmt.Sprintf("%s %s/%s %d %s %s/%s -> %s/%s v%d %d", g.Direction, g.PolicyNamespace, g.PolicyName, g.Rule, g.Verdict,
			g.SrcNamespace, g.SrcWorkload, g.DstNamespace, g.DstWorkload, g.IPVersion, g.Records))
	}
	want := []string{
		"ingress backend/default-deny-ingress -1 denied frontend/web -> backend/api v6 2",
		"egress tools/restrict-egress -1 denied tools/probe-1 -> frontend/web v4 1",
		"egress tools/restrict-egress -1 denied tools/probe-1 -> frontend/web v6 1",
		"ingress backend/default-deny-ingress -1 denied tools/probe-1 -> backend/api v4 1",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("denied groups:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
	got, err = r.Denied(ctx, DeniedOptions{Window: w, Family: 6, Namespace: "tools"})
	if err != nil || len(got) != 1 || got[0].SrcWorkload != "probe-1" || got[0].IPVersion != 6 {
		t.Errorf("family 6, namespace tools: %+v %v", got, err)
	}
	// A namespace-scoped user's: the groups with an end in frontend.
	got, err = r.Denied(ctx, DeniedOptions{Window: w, Namespaces: []string{"frontend", "x' OR '1'='1"}})
	if err != nil || len(got) != 3 || slices.ContainsFunc(got, func(g DeniedGroup) bool { return g.SrcNamespace != "frontend" && g.DstNamespace != "frontend" }) {
		t.Errorf("namespaces [frontend]: %+v %v", got, err)
	}
	// A namespace with a quote is escaped, not injected.
	if got, err := r.Denied(ctx, DeniedOptions{Window: w, Namespace: `x' OR '1'='1`}); err != nil || len(got) != 0 {
		t.Errorf("quoted namespace: %+v %v", got, err)
	}
	if _, err := r.Denied(ctx, DeniedOptions{Window: Window{Since: now, Until: now.Add(-time.Hour)}}); err == nil {
		t.Error("inverted window: want an error")
	}
}

// TestDeniedPorts: the denied groups keep the protocol and destination
// port of their flows (migration 0013), in IPv4-only, IPv6-only and
// dual-stack labs: tools/probe-1 -> backend/api, which the backend's
// default deny refuses at ingress, on 8080/TCP and 5353/UDP in each family
// of the mode. A row summed before the migration (protocol and port 0)
// still counts, with neither.
func TestDeniedPorts(t *testing.T) {
	e := needEngine(t)
	ctx := context.Background()
	r, err := NewReports(e, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			for _, tbl := range []string{"flows", "rollup_policy_1m"} {
				if err := e.Exec(ctx, "TRUNCATE TABLE dualflow."+tbl); err != nil {
					t.Fatal(err)
				}
			}
			m, inv := labInventory(t, mode, 2)
			a, _ := New(Config{}, inv, nil)
			if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
				t.Fatal(err)
			}
			probe1, api1 := labPod(t, m, "tools", "probe", 1), labPod(t, m, "backend", "api", 1)
			now := time.Now().UTC().Truncate(time.Millisecond)
			var recs []flow.Record
			var want []string
			fams := mode.Families()
			for _, c := range []struct {
				proto uint8
				port  uint16
				n     int
			}{{flow.ProtoTCP, manifest.PortHTTP, 2}, {flow.ProtoUDP, manifest.PortUDPEcho, 1}} {
				for _, f := range fams {
					for range c.n {
						rec := record(t, inv, probe1, api1, f, c.proto, c.port)
						rec.SrcPort = uint16(30000 + len(recs))
						rec.FlowStart, rec.FlowEnd, rec.TimeReceived = now.Add(-3*time.Minute), now.Add(-2*time.Minute), now
						rec.Packets, rec.PacketsDelta, rec.Bytes, rec.BytesDelta = 3, 3, 180, 180
						a.Audit(&rec)
						recs = append(recs, rec)
					}
					want = append(want, fmt.Sprintf("ingress backend/default-deny-ingress -1 tools/probe-1 -> backend/api v%d %s %d %d",
						recs[len(recs)-1].IPVersion, flow.ProtoName(c.proto), c.port, c.n))
				}
			}
			var b []byte
			for i := range recs {
				b = store.AppendFlowRow(b, &recs[i])
			}
			if err := e.InsertRowBinary(ctx, store.FlowsTable, store.FlowColumns, "", len(recs), b); err != nil {
				t.Fatal(err)
			}
			// Summed before migration 0013, in the family an address is
			// chosen in (IPv6 when the lab has it): no protocol, no port.
			old := recs[len(recs)-1].IPVersion
			if err := e.Exec(ctx, fmt.Sprintf(`INSERT INTO dualflow.rollup_policy_1m (window_start, ip_version, direction, policy_namespace, policy_name, policy_rule,
    verdict, reported_verdict, src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, records, packets, bytes)
VALUES (toStartOfMinute(now() - INTERVAL 5 MINUTE), %d, 'ingress', 'backend', 'default-deny-ingress', -1, 'denied', 'unknown', 'tools', 'probe-1', 'backend', 'api', 5, 15, 900)`, old)); err != nil {
				t.Fatal(err)
			}
			want = append([]string{fmt.Sprintf("ingress backend/default-deny-ingress -1 tools/probe-1 -> backend/api v%d  0 5", old)}, want...)
			got, err := r.Denied(ctx, DeniedOptions{Window: Window{Since: now.Add(-time.Hour), Until: now.Add(time.Minute)}})
			if err != nil {
				t.Fatal(err)
			}
			var lines []string
			for _, g := range got {
				lines = append(lines, fmt.Sprintf("%s %s/%s %d %s/%s -> %s/%s v%d %s %d %d", g.Direction, g.PolicyNamespace, g.PolicyName, g.Rule,
					g.SrcNamespace, g.SrcWorkload, g.DstNamespace, g.DstWorkload, g.IPVersion, g.Protocol, g.DstPort, g.Records))
			}
			if strings.Join(lines, "\n") != strings.Join(want, "\n") {
				t.Errorf("denied groups:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}

func TestUnusedReport(t *testing.T) {
	inv, now := labFlows(t)
	r, _ := NewReports(engine, "dualflow")
	rep, err := r.Unused(context.Background(), inv.NetworkPolicies, Window{Since: now.Add(-time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Rules) != 1 || rep.Rules[0].RuleRef != (RuleRef{"tools", manifest.PolicyToolsEgress, "egress", 1}) {
		t.Errorf("unused rules %+v: want only tools/restrict-egress egress rule 1", rep.Rules)
	}
	if rep.Used["ingress rule 0 of NetworkPolicy backend/allow-web-to-api"] != 6 || rep.Decisions == 0 {
		t.Errorf("used %v, decisions %d", rep.Used, rep.Decisions)
	}
}

func TestObservedGaps(t *testing.T) {
	inv, now := labFlowsWith(t, true)
	r, _ := NewReports(engine, "")
	fs, err := r.ObservedGaps(context.Background(), inv, Window{Since: now.Add(-time.Hour)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		t.Logf("%s: %s", f.Kind, f.Message)
	}
	gaps, one := findingsOf(fs, KindObservedVerdictGap), findingsOf(fs, KindObservedOneFamily)
	if len(gaps) != 1 || gaps[0].Port != manifest.PortMetrics || gaps[0].Objects[1].Name != "api" || !strings.Contains(gaps[0].Message, "allowed over IPv4 (2 records) but denied over IPv6 (2 records)") {
		t.Errorf("verdict gaps %+v", gaps)
	}
	// Observed findings count flow records, and say so.
	for _, f := range append(gaps, one...) {
		if f.Unit != "flow records" || f.Severity == "" || f.Fix == "" || f.Objects[0].Role != RoleSource || f.Objects[1].Role != RoleDestination {
			t.Errorf("%s: unit %q severity %q fix %q roles %q %q", f.Kind, f.Unit, f.Severity, f.Fix, f.Objects[0].Role, f.Objects[1].Role)
		}
	}
	// web -> web on 8080/TCP over IPv4 only; the pings over both
	// families (ICMP and ICMPv6) are no gap; the IPv4-only ping of web@2
	// is in the same workload pair and protocol as the dual ones.
	if len(one) != 1 || one[0].Objects[0].Name != "web" || one[0].Objects[1].Name != "web" || one[0].Count != 4 || one[0].Protocol != "TCP" {
		t.Errorf("one-family %+v: want web -> web on TCP over IPv4 only", one)
	}
	for _, f := range fs {
		if strings.Contains(f.Message, "ICMP") {
			t.Errorf("a ping over both families is reported: %s", f.Message)
		}
	}
	// probe@1 -> api@1 over IPv4 only was denied: not an observed gap.
	fs, err = r.ObservedGaps(context.Background(), nil, Window{Since: now.Add(-time.Hour)}, 0)
	if err != nil || len(findingsOf(fs, KindObservedOneFamily)) != 0 || len(findingsOf(fs, KindObservedVerdictGap)) != 1 {
		t.Errorf("without inventory: %+v %v", fs, err)
	}
}

func TestWhatIf(t *testing.T) {
	inv, now := labFlows(t)
	r, _ := NewReports(engine, "")
	tcp := corev1.ProtocolTCP
	metrics := intstr.FromInt32(manifest.PortMetrics)
	allowV6 := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "backend", Name: "allow-metrics-ipv6"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: manifest.ClusterCIDRv6.String()}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &metrics}},
			}},
		},
	}
	denyFrontend := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "frontend", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	rep, err := r.WhatIf(context.Background(), inv, []*networkingv1.NetworkPolicy{allowV6, denyFrontend}, Window{Since: now.Add(-time.Hour)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, c := range rep.Changes {
		got = append(got, fmt.Sprintf("%s %s/%s -> %s/%s:%d v%d %d %s/%s %d", c.Change, c.Src.Namespace, c.Src.WorkloadName, c.Dst.Namespace, c.Dst.WorkloadName,
			c.DstPort, c.IPVersion, c.Records, c.After.Ingress.Namespace, c.After.Ingress.Name, c.After.Ingress.Rule))
	}
	want := []string{
		"newly-denied frontend/web -> frontend/web:8080 v4 4 frontend/deny -1",
		"newly-allowed frontend/web -> backend/api:9090 v6 2 backend/allow-metrics-ipv6 0",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") || rep.Flows != 8 || rep.Truncated {
		t.Errorf("what-if (%d flows, truncated %v):\n%s\nwant:\n%s", rep.Flows, rep.Truncated, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// probe@1 -> web@2 is denied by egress before and after: no change.
	rep, err = r.WhatIf(context.Background(), inv, []*networkingv1.NetworkPolicy{denyFrontend}, Window{Since: now.Add(-time.Hour)}, 1)
	if err != nil || !rep.Truncated || rep.Flows != 1 {
		t.Errorf("limit 1: %+v %v", rep, err)
	}
	bad := denyFrontend.DeepCopy()
	bad.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{}}}}
	if _, err := r.WhatIf(context.Background(), inv, []*networkingv1.NetworkPolicy{bad}, Window{Since: now.Add(-time.Hour)}, 0); err == nil {
		t.Error("invalid proposed policy: want an error")
	}
}

func TestNewReportsRejectsBadDatabase(t *testing.T) {
	if _, err := NewReports(engine, "x; DROP TABLE flows"); err == nil {
		t.Fatal("want an error")
	}
}
