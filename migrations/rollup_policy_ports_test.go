package migrations

import (
	"context"
	"strconv"
	"strings"
	"testing"
)

// TestRollupPolicyPortsUpgrade: a database at migration 0012 with policy
// rows in both families is migrated to 0013. The old rows still count,
// with protocol and port 0; rows inserted after it carry their protocol
// and port, as key columns (a merge does not sum them, nor fold rows of
// two ports into one); and the hourly projection answers a query grouping
// by port.
func TestRollupPolicyPortsUpgrade(t *testing.T) {
	r := newRunner(t, "df_policy_ports")
	ctx := context.Background()
	var full, old []Migration // to 0013, and before it
	for _, m := range r.all {
		if m.Version <= 13 {
			full = append(full, m)
		}
		if m.Version < 13 {
			old = append(old, m)
		}
	}
	if len(old) == len(full) {
		t.Fatal("no migration 0013")
	}
	r.all = old
	if _, err := r.Up(ctx); err != nil {
		t.Fatal(err)
	}
	// Denied at ingress: 2 IPv4 and 3 IPv6 flows to 5432/TCP, one minute.
	insert := func(dport int) {
		t.Helper()
		q := `INSERT INTO df_policy_ports.flows (flow_end, ip_version, src_ip_in, dst_ip_in, src_port, dst_port, protocol, packets, bytes,
			src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, ingress_verdict, ingress_policy_namespace, ingress_policy_name, ingress_policy_rule)
			SELECT toDateTime64('2026-12-05 07:10:30', 3, 'UTC'), v, if(v = 4, toIPv6('198.18.0.10'), toIPv6('fd00:10::a')), if(v = 4, toIPv6('198.18.1.20'), toIPv6('fd00:10:1::14')),
			40000 + number, ` + strconv.Itoa(dport) + `, 6, 1, 60, 'shop', 'web', 'shop', 'db', 'denied', 'shop', 'db-deny', -1
			FROM numbers(5) ARRAY JOIN [if(number < 2, 4, 6)] AS v`
		if err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	insert(5432)
	r.all = full
	done, err := r.Up(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(done) != 1 || done[0].Version != 13 {
		t.Fatalf("applied %v, want 0013 only", done)
	}
	insert(5432)
	insert(6432)
	query := func(q string) string {
		t.Helper()
		out, err := db.Query(ctx, q, "TSV")
		if err != nil {
			t.Fatalf("%v\n%s", err, q)
		}
		return strings.TrimSpace(string(out))
	}
	const byPort = `SELECT ip_version, protocol, dst_port, sum(records), sum(bytes) FROM df_policy_ports.rollup_policy_1m
		WHERE verdict = 'denied' GROUP BY ip_version, protocol, dst_port ORDER BY ip_version, protocol, dst_port`
	const want = "4\t0\t0\t2\t120\n4\t6\t5432\t2\t120\n4\t6\t6432\t2\t120\n" +
		"6\t0\t0\t3\t180\n6\t6\t5432\t3\t180\n6\t6\t6432\t3\t180"
	if got := query(byPort); got != want {
		t.Errorf("before a merge:\n%s\nwant\n%s", got, want)
	}
	// A merge sums the rows of one key, and the key holds the port.
	query("OPTIMIZE TABLE df_policy_ports.rollup_policy_1m FINAL")
	if got := query(byPort); got != want {
		t.Errorf("after a merge:\n%s\nwant\n%s", got, want)
	}
	if got := query("SELECT count() FROM df_policy_ports.rollup_policy_1m"); got != "6" {
		t.Errorf("%s rows after the merge, want one per family and port (6)", got)
	}
	if got := query("SELECT sorting_key FROM system.tables WHERE database = 'df_policy_ports' AND name = 'rollup_policy_1m'"); !strings.HasSuffix(got, "dst_workload_name, protocol, dst_port") {
		t.Errorf("sorting key %q, want protocol and dst_port at its end", got)
	}
	// The hourly projection groups by port: the engine answers from it.
	plan := query(`EXPLAIN projections = 1 SELECT protocol, dst_port, sum(records) FROM df_policy_ports.rollup_policy_1m
		WHERE toStartOfHour(window_start) = toDateTime('2026-12-05 07:00:00', 'UTC') GROUP BY protocol, dst_port`)
	if !strings.Contains(plan, "ReadFromMergeTree (policy_1h)") {
		t.Errorf("a port query over whole hours does not read policy_1h:\n%s", plan)
	}
	if got := query(`SELECT dst_port, sum(records) FROM df_policy_ports.rollup_policy_1m
		WHERE toStartOfHour(window_start) = toDateTime('2026-12-05 07:00:00', 'UTC') GROUP BY dst_port ORDER BY dst_port`); got != "0\t5\n5432\t5\n6432\t5" {
		t.Errorf("per port from the projection: %q", got)
	}
}
