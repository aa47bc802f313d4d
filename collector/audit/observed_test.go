package audit

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/chsql"
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

// TestObservedFlowsTiers: the groups and counts ObservedFlows sums per
// tier (whole hours from the projection observed_1h of migration 0014,
// the minutes and milliseconds at either end as rows) equal those of
// grouping the window's rows at once, in order, for random records over
// six hours in three batches (IPv4-only, IPv6-only and dual-stack; pods,
// outside addresses, an end whose workload enrichment missed, Services,
// verdicts of either side evaluated or reported, probes) and windows
// that align with the hours and that do not, for the cluster, a
// namespace and a workload; and the engine does read the projection for
// the whole hours.
func TestObservedFlowsTiers(t *testing.T) {
	e := needEngine(t)
	ctx := context.Background()
	base := time.Date(2026, 12, 5, 6, 0, 0, 0, time.UTC)
	rep, _ := NewReports(e, "")
	for _, mode := range []manifest.Mode{manifest.ModeIPv4, manifest.ModeIPv6, manifest.ModeDual} {
		t.Run(string(mode), func(t *testing.T) {
			if err := e.Exec(ctx, "TRUNCATE TABLE dualflow.flows"); err != nil {
				t.Fatal(err)
			}
			family := map[manifest.Mode]string{manifest.ModeIPv4: "4", manifest.ModeIPv6: "6", manifest.ModeDual: "if(h(8) % 2 = 0, 4, 6)"}[mode]
			for batch := range 3 {
				// h(k) is the row's k-th pseudo-random number; ends 0 to 9
				// are pods of three namespaces, 10 and 11 outside
				// addresses.
				q := fmt.Sprintf(`INSERT INTO dualflow.flows (flow_end, ip_version, src_ip_in, dst_ip_in, src_port, dst_port, protocol,
       src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name, dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name,
       dst_service_namespace, dst_service_name, service_port, ingress_verdict, egress_verdict, ingress_reported_verdict, egress_reported_verdict, probe_trace_id)
WITH (n -> cityHash64(number, n)) AS h, h(1) %% 12 AS s, h(2) %% 12 AS d, %[2]s AS v,
     (e -> if(v = 4, toIPv6(toIPv4(3323068416 + e)), toIPv6(concat('fd00:10::', toString(e + 1))))) AS ip,
     ['unknown', 'not_isolated', 'allowed', 'denied', 'rejected'] AS verdicts
SELECT toDateTime64(%[1]d, 3, 'UTC') + toIntervalMillisecond(h(3) %% (6 * 3600000)), v, ip(s), ip(d), 30000 + h(4) %% 1000, [80, 443, 53][1 + h(5) %% 3], [6, 6, 17][1 + h(5) %% 3],
       if(s < 10, concat('ns', toString(s %% 3)), ''), if(s < 10, concat('p', toString(s)), ''), if(s < 10 AND h(6) %% 10 > 0, 'Deployment', ''), if(s < 10 AND h(6) %% 10 > 0, concat('w', toString(intDiv(s, 2))), ''),
       if(d < 10, concat('ns', toString(d %% 3)), ''), if(d < 10, concat('p', toString(d)), ''), if(d < 10, 'Deployment', ''), if(d < 10, concat('w', toString(intDiv(d, 2))), ''),
       if(d %% 4 = 0, 'ns0', ''), if(d %% 4 = 0, 'svc', ''), if(d %% 4 = 0, 8080, 0),
       verdicts[1 + h(7) %% 5], verdicts[1 + h(9) %% 5], verdicts[1 + h(10) %% 9 %% 5], verdicts[1 + h(11) %% 9 %% 5], if(h(12) %% 13 = 0, 'tf-random', '')
FROM numbers(%[3]d, 20000)`, base.Unix(), family, batch*20000)
				if err := e.Exec(ctx, q); err != nil {
					t.Fatalf("%v\n%s", err, q)
				}
			}
			rng := rand.New(rand.NewPCG(5, uint64(len(mode))))
			for i := range 12 {
				since := base.Add(-30*time.Minute + time.Duration(rng.Int64N(int64(5*time.Hour))))
				until := since.Add(time.Duration(rng.Int64N(int64(4 * time.Hour))))
				switch i {
				case 0: // whole hours only
					since, until = base.Add(time.Hour), base.Add(4*time.Hour)
				case 1: // hours, minutes and milliseconds
					since, until = base.Add(time.Hour-90*time.Second-7*time.Millisecond), base.Add(4*time.Hour+61*time.Second+3*time.Millisecond)
				case 2: // within an hour
					since, until = base.Add(2*time.Hour+time.Minute), base.Add(2*time.Hour+59*time.Minute)
				}
				w := Window{Since: since, Until: until}
				for _, sc := range [][2]string{{"", ""}, {"ns1", ""}, {"ns2", "w4"}} {
					name := fmt.Sprintf("[%s, %s) %s/%s", since.Format("15:04:05.000"), until.Format("15:04:05.000"), sc[0], sc[1])
					got, truncated, err := rep.ObservedFlows(ctx, ObservedOptions{Window: w, Namespace: sc[0], Workload: sc[1]})
					if err != nil || truncated {
						t.Fatalf("%s: %v (truncated %v)", name, err, truncated)
					}
					want := observedRows(t, w, sc[0], sc[1])
					var lines []string
					for _, f := range got {
						lines = append(lines, observedLine(f))
					}
					if strings.Join(lines, "\n") != strings.Join(want, "\n") {
						t.Errorf("%s: %d groups\n%s\nwant %d\n%s", name, len(lines), strings.Join(lines, "\n"), len(want), strings.Join(want, "\n"))
					}
					if i == 0 && sc[0] == "" && len(want) < 20 {
						t.Errorf("%s: %d groups, want a window with many", name, len(want))
					}
				}
			}
		})
	}
	var l lastQuery
	r, _ := NewReports(&l, "")
	if _, _, err := r.ObservedFlows(ctx, ObservedOptions{Window: Window{Since: base.Add(time.Hour - time.Second), Until: base.Add(3 * time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	plan := tsvLines(t, "EXPLAIN projections = 1 "+l.q, func(c []string) string { return strings.Join(c, "\t") })
	if !strings.Contains(strings.Join(plan, "\n"), "ReadFromMergeTree (observed_1h)") {
		t.Errorf("the hour tier does not read observed_1h:\n%s", strings.Join(plan, "\n"))
	}
}

// observedRows is the window's groups of the scope over its rows (the
// projections not used), as observedLine prints them, in ObservedFlows'
// order.
func observedRows(t *testing.T, w Window, ns, workload string) []string {
	t.Helper()
	where := chsql.FlowEnd(w.Since, w.Until)
	if ns != "" {
		side := func(end string) string {
			c := chsql.Eq(end+"_pod_namespace", ns)
			if workload != "" {
				c = chsql.And(c, chsql.Eq(end+"_workload_name", workload))
			}
			return c
		}
		where = chsql.And(where, chsql.Or(side("src"), side("dst")))
	}
	return tsvLines(t, fmt.Sprintf(`SELECT %[1]s, countIf(NOT is_probe AND NOT blocked) AS allowed, countIf(NOT is_probe AND blocked) AS denied, countIf(is_probe) AS probes
FROM (SELECT %[1]s, is_probe, %[2]s AS blocked FROM dualflow.flows WHERE %[3]s)
GROUP BY %[1]s ORDER BY allowed + denied + probes DESC, %[1]s
SETTINGS optimize_use_projections = 0`, observedGroup, observedBlocked, where), func(c []string) string { return strings.Join(c, " ") })
}

// observedLine prints a group as observedRows prints a row.
func observedLine(f ObservedFlow) string {
	return fmt.Sprint(f.Src.IP, " ", f.Dst.IP, " ", f.Protocol, " ", f.DstPort, " ", f.IPVersion, " ",
		f.Src.Namespace, " ", f.Src.Pod, " ", f.Src.WorkloadKind, " ", f.Src.WorkloadName, " ",
		f.Dst.Namespace, " ", f.Dst.Pod, " ", f.Dst.WorkloadKind, " ", f.Dst.WorkloadName, " ",
		f.ServiceNamespace, " ", f.ServiceName, " ", f.ServicePort, " ", f.Allowed, " ", f.Denied, " ", f.Probes)
}

// BenchmarkObservedFlowsLarge reads the flow groups of a window of
// 1,000,000 and of 10,000,000 flow records (the large scope)
// between the 6,000 pods of 2,000 workloads (100 namespaces): 204,000
// groups (each pod to 17 others, over each family), for the cluster. The
// records end within the window's last hour, and the window is whole
// hours: the hour is read from the projection observed_1h, as merged
// (OPTIMIZE FINAL stands for the background merges of a store that has
// held them for a while). It reports the process's CPU time per read
// (the embedded engine's threads included: on a shared machine it says
// more than the wall time) and its maximum RSS.
func BenchmarkObservedFlowsLarge(b *testing.B) {
	for _, records := range []int{1_000_000, 10_000_000} {
		b.Run(fmt.Sprintf("records=%dM", records/1_000_000), func(b *testing.B) { benchmarkObservedFlows(b, records) })
	}
}

func benchmarkObservedFlows(b *testing.B, records int) {
	e := needEngine(b)
	ctx := context.Background()
	if err := e.Exec(ctx, "TRUNCATE TABLE dualflow.flows"); err != nil {
		b.Fatal(err)
	}
	const pods, batch = 6000, 100_000
	end := time.Date(2025, 4, 1, 12, 0, 0, 0, time.UTC)
	// One label set per workload, shared by its pods' records as
	// enrichment shares them (the encoder caches a set's encoding).
	labels := make([]map[string]string, pods/3)
	for w := range labels {
		labels[w] = map[string]string{"app": fmt.Sprintf("w%02d", w%20)}
	}
	ep := func(n int) flow.Endpoint {
		w := n / 3
		ns, name := fmt.Sprintf("ns%03d", w/20), fmt.Sprintf("w%02d", w%20)
		return flow.Endpoint{PodNamespace: ns, PodName: fmt.Sprintf("%s-%d", name, n%3), WorkloadKind: "Deployment", WorkloadName: name,
			Labels: labels[w]}
	}
	addr := func(n, fam int) netip.Addr {
		if fam == 4 {
			return netip.AddrFrom4([4]byte{198, 18, byte(n >> 8), byte(n)})
		}
		return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 14: byte(n >> 8), 15: byte(n)})
	}
	recs := make([][]flow.Record, 2) // per inserter
	// The collector's bulk path: Native blocks from two inserters.
	err := e.InsertNativeBlocks(ctx, 2, records/batch, func(n, worker int) *store.NativeBlock {
		recs[worker] = recs[worker][:0]
		for i := n * batch; i < (n+1)*batch; i++ {
			fam := 4 + 2*(i%2)
			s := (i / 2) % pods
			d := (s + 1 + (i/(2*pods))%17) % pods
			r := flow.Record{Proto: flow.ProtoTCP, SrcPort: uint16(30000 + i%30000), DstPort: 8080, SrcAddr: addr(s, fam), DstAddr: addr(d, fam),
				Src: ep(s), Dst: ep(d), FlowStart: end.Add(-time.Hour), FlowEnd: end.Add(-time.Duration(1+i%3000) * time.Second), TimeReceived: end,
				Packets: 3, PacketsDelta: 3, Bytes: 180, BytesDelta: 180}
			r.Ingress.Verdict, r.Egress.Verdict = flow.VerdictNotIsolated, flow.VerdictNotIsolated
			r.Normalize()
			recs[worker] = append(recs[worker], r)
		}
		return store.NewNativeBlock(recs[worker])
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := e.Exec(ctx, "OPTIMIZE TABLE dualflow.flows FINAL"); err != nil {
		b.Fatal(err)
	}
	rep, _ := NewReports(e, "")
	win := Window{Since: end.Add(-2 * time.Hour), Until: end}
	b.ReportAllocs()
	rusage := func() (cpu time.Duration, maxRSS int64) {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			b.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Maxrss * 1024
	}
	start, _ := rusage()
	for b.Loop() {
		fs, truncated, err := rep.ObservedFlows(ctx, ObservedOptions{Window: win})
		if err != nil || truncated {
			b.Fatal(err, truncated)
		}
		b.ReportMetric(float64(len(fs)), "groups")
	}
	cpu, rss := rusage()
	b.ReportMetric((cpu-start).Seconds()/float64(b.N), "cpu-s/op")
	b.ReportMetric(float64(rss)/1e6, "maxRSS-MB")
}
