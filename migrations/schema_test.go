package migrations

import (
	"context"
	"strings"
	"testing"
)

// TestRepairAfterDrop: a table dropped by a user (DROP TABLE dualflow.flows
// through dualflow sql as the admin) stayed dropped: the ledger said every
// migration ran, so nothing recreated it. Check finds what the migrations
// create and the database lacks, Repair recreates it, and the views that
// feed the rollups from it work again.
func TestRepairAfterDrop(t *testing.T) {
	r := newRunner(t, "df_repair")
	ctx := context.Background()
	if _, err := r.Up(ctx); err != nil {
		t.Fatal(err)
	}
	ref, err := r.Reference(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ref["flows"]; !ok || len(ref) < 5 {
		t.Fatalf("reference: %d objects, want flows and the rollups", len(ref))
	}
	if ps, err := r.Check(ctx, ref); err != nil || len(ps) != 0 {
		t.Fatalf("a migrated database: %v %v, want no problem", ps, err)
	}
	for _, q := range []string{
		"DROP TABLE df_repair.flows SYNC",
		"DROP TABLE df_repair.rollup_pod_to_pod_1m_mv SYNC",
		"ALTER TABLE df_repair.traceflows DROP COLUMN observations",
	} {
		if err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	ps, err := r.Check(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, p := range ps {
		kinds = append(kinds, p.Kind+" "+p.Object+" "+p.Column)
	}
	for _, want := range []string{"missing_table flows", "missing_view rollup_pod_to_pod_1m_mv", "missing_column traceflows observations"} {
		if !strings.Contains(strings.Join(kinds, "\n"), want) {
			t.Errorf("check found %q, want %s", kinds, want)
		}
	}
	fixed, err := r.Repair(ctx, ref, ps)
	if err != nil || len(fixed) != len(ps) {
		t.Fatalf("repair: fixed %d of %d: %v", len(fixed), len(ps), err)
	}
	if ps, err := r.Check(ctx, ref); err != nil || len(ps) != 0 {
		t.Errorf("after the repair: %v %v", ps, err)
	}
	// The recreated table takes rows, and every view reading it (the one
	// recreated and the others) still feeds its rollup.
	if err := db.Exec(ctx, "INSERT INTO df_repair.flows (flow_end, ip_version, src_ip_in, dst_ip_in, src_pod_namespace, dst_pod_namespace, packets, bytes) VALUES (now(), 6, 'fd00:10::1', 'fd00:10::2', 'a', 'b', 1, 100), (now(), 4, '::ffff:198.18.0.1', '::ffff:198.18.0.2', 'a', 'b', 1, 100)"); err != nil {
		t.Fatal(err)
	}
	for _, table := range []string{"flows", "rollup_pod_to_pod_1m", "rollup_node_to_node_1m"} {
		out, err := db.Query(ctx, "SELECT count() FROM df_repair."+table, "TSV")
		if err != nil || strings.TrimSpace(string(out)) == "0" {
			t.Errorf("%s after the repair and an insert: %q %v", table, out, err)
		}
	}
	// A column of another type is reported, not converted.
	if err := db.Exec(ctx, "ALTER TABLE df_repair.traceflows MODIFY COLUMN duration_ms String"); err == nil {
		ps, _ := r.Check(ctx, ref)
		if len(ps) > 0 {
			if _, err := r.Repair(ctx, ref, ps); err == nil {
				t.Errorf("a column of another type repaired without a word: %v", ps)
			}
		}
	}
	// No scratch database is left behind.
	out, err := db.Query(ctx, "SELECT count() FROM system.databases WHERE startsWith(name, 'df_repair_ref_')", "TSV")
	if err != nil || strings.TrimSpace(string(out)) != "0" {
		t.Errorf("scratch databases left: %q %v", out, err)
	}
}
