package migrations

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFlowsObservedProjectionUpgrade: a database at migration 0013 with
// flows in both families over two hours, allowed, denied and probes, is
// migrated to 0014. Once its MATERIALIZE mutation is done every part of
// flows, the one written before the migration included, has the
// projection observed_1h, and the groups' hourly counts read from it (the
// engine made to use it) equal those summed from the rows.
func TestFlowsObservedProjectionUpgrade(t *testing.T) {
	r := newRunner(t, "df_observed")
	ctx := context.Background()
	var full, old []Migration // to 0014, and before it
	for _, m := range r.all {
		if m.Version <= 14 {
			full = append(full, m)
		}
		if m.Version < 14 {
			old = append(old, m)
		}
	}
	if len(old) == len(full) {
		t.Fatal("no migration 0014")
	}
	r.all = old
	if _, err := r.Up(ctx); err != nil {
		t.Fatal(err)
	}
	query := func(q string) string {
		t.Helper()
		out, err := db.Query(ctx, q, "TSV")
		if err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
		return strings.TrimSpace(string(out))
	}
	// 60 records a batch, a family each, over 07:00 to 08:57: web -> db
	// on 5432/TCP, the odd ones denied at ingress (evaluated) or egress
	// (reported), every seventh a probe: 31 records in the first hour (5
	// probes, 13 denied, 13 allowed), 29 in the second (4, 13, 12).
	insert := func(batch int) { // 0: IPv4, 1: IPv6
		t.Helper()
		q := `INSERT INTO df_observed.flows (flow_end, ip_version, src_ip_in, dst_ip_in, src_port, dst_port, protocol,
			src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name, dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name,
			ingress_verdict, egress_reported_verdict, probe_trace_id)
			SELECT toDateTime64('2026-12-05 07:00:00', 3, 'UTC') + toIntervalSecond(number * 119), v,
			if(v = 4, toIPv6('198.18.0.10'), toIPv6('fd00:10::a')), if(v = 4, toIPv6('198.18.1.20'), toIPv6('fd00:10:1::14')),
			40000 + number, 5432, 6, 'shop', 'web-1', 'Deployment', 'web', 'shop', 'db-0', 'StatefulSet', 'db',
			if(number % 4 = 1, 'denied', 'allowed'), if(number % 4 = 3, 'rejected', 'unknown'), if(number % 7 = 0, 'tf-up', '')
			FROM numbers(60) ARRAY JOIN [` + strconv.Itoa(4+2*batch) + `] AS v`
		if err := db.Exec(ctx, q); err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
	}
	insert(0)
	r.all = full
	done, err := r.Up(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 1 || done[0].Version != 14 {
		t.Fatalf("applied %v, want 0014 only", done)
	}
	insert(1)
	deadline := time.Now().Add(time.Minute)
	for query("SELECT count() FROM system.mutations WHERE database = 'df_observed' AND table = 'flows' AND NOT is_done") != "0" {
		if time.Now().After(deadline) {
			t.Fatal("MATERIALIZE PROJECTION observed_1h not done after a minute")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := query(`SELECT (SELECT count() FROM system.parts WHERE database = 'df_observed' AND table = 'flows' AND active),
		(SELECT count() FROM system.projection_parts WHERE database = 'df_observed' AND table = 'flows' AND name = 'observed_1h' AND active)`); got != "2\t2" {
		t.Errorf("parts of flows, and of them with observed_1h: %q, want both parts with it", got)
	}
	const counts = `countIf(NOT is_probe AND NOT (ingress_verdict IN ('denied', 'rejected') OR egress_verdict IN ('denied', 'rejected') OR ingress_reported_verdict IN ('denied', 'rejected') OR egress_reported_verdict IN ('denied', 'rejected'))),
            countIf(NOT is_probe AND (ingress_verdict IN ('denied', 'rejected') OR egress_verdict IN ('denied', 'rejected') OR ingress_reported_verdict IN ('denied', 'rejected') OR egress_reported_verdict IN ('denied', 'rejected'))),
            countIf(is_probe)`
	hourly := func(settings string) string {
		return query(`SELECT toStartOfHour(flow_end) AS h, ip_version, src_ip, dst_pod_name, dst_workload_kind, ` + counts + `
			FROM df_observed.flows WHERE toStartOfHour(flow_end) >= toDateTime('2026-12-05 07:00:00', 'UTC')
			GROUP BY h, src_ip, dst_ip, protocol, dst_port, ip_version, src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
			dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name, dst_service_namespace, dst_service_name, service_port
			ORDER BY h, ip_version SETTINGS ` + settings)
	}
	rows := hourly("optimize_use_projections = 0")
	const want = "2026-12-05 07:00:00\t4\t198.18.0.10\tdb-0\tStatefulSet\t13\t13\t5\n" +
		"2026-12-05 07:00:00\t6\tfd00:10::a\tdb-0\tStatefulSet\t13\t13\t5\n" +
		"2026-12-05 08:00:00\t4\t198.18.0.10\tdb-0\tStatefulSet\t12\t13\t4\n" +
		"2026-12-05 08:00:00\t6\tfd00:10::a\tdb-0\tStatefulSet\t12\t13\t4"
	if rows != want {
		t.Errorf("from the rows:\n%s\nwant\n%s", rows, want)
	}
	if got := hourly("force_optimize_projection_name = 'observed_1h'"); got != rows {
		t.Errorf("from observed_1h:\n%s\nfrom the rows:\n%s", got, rows)
	}
}
