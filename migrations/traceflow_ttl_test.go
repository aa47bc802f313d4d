package migrations

import (
	"context"
	"strings"
	"testing"
)

// TestTraceflowDays: traceflow results are kept 7 days, or the flows'
// retention when shorter, or as set; forever only with the flows.
func TestTraceflowDays(t *testing.T) {
	for _, tc := range []struct {
		opt  Options
		want int
	}{
		{Options{TTLDays: 30}, 7},
		{Options{TTLDays: 3}, 3},
		{Options{TTLDays: 30, TraceflowTTLDays: 2}, 2},
		{Options{TTLDays: 0, TraceflowTTLDays: 14}, 14},
		{Options{}, 0},
	} {
		if got := tc.opt.TraceflowDays(); got != tc.want {
			t.Errorf("%+v: %d days, want %d", tc.opt, got, tc.want)
		}
	}
	if err := (Options{Database: "ok", TraceflowTTLDays: -1}).Validate(); err == nil {
		t.Error("negative traceflow ttl accepted")
	}
}

// TestTraceflowsTTLRendered: migration 0011 gives the traceflows table
// (the local one on a cluster) its own TTL, and nothing when results are
// kept forever.
func TestTraceflowsTTLRendered(t *testing.T) {
	for _, tc := range []struct {
		opt  Options
		want string
	}{
		{Options{TTLDays: 30}, "ALTER TABLE dualflow.traceflows MODIFY TTL toDateTime(started) + INTERVAL 7 DAY"},
		{Options{TTLDays: 30, Cluster: "flows"}, "ALTER TABLE dualflow.traceflows_local ON CLUSTER 'flows' MODIFY TTL toDateTime(started) + INTERVAL 7 DAY"},
		{Options{TTLDays: 2}, "ALTER TABLE dualflow.traceflows MODIFY TTL toDateTime(started) + INTERVAL 2 DAY"},
		{Options{}, ""},
	} {
		got, err := RenderAll(tc.opt)
		if err != nil {
			t.Fatal(err)
		}
		_, after, _ := strings.Cut(got, "-- 0011_traceflows_ttl.sql\n")
		if i := strings.Index(after, "-- 00"); i >= 0 { // the next migration's header
			after = after[:i]
		}
		if strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(after), ";")) != tc.want {
			t.Errorf("%+v: 0011 renders %q, want %q", tc.opt, after, tc.want)
		}
	}
}

// TestRunnerTraceflowsTTL: on the engine, the traceflows table keeps its
// own TTL after Up, follows a change of the options, and the flows keep
// theirs.
func TestRunnerTraceflowsTTL(t *testing.T) {
	r := newRunner(t, "df_traceflow_ttl")
	r.opt.TTLDays = 30
	ctx := context.Background()
	engine := func(table string) string {
		t.Helper()
		out, err := db.Query(ctx, "SELECT engine_full FROM system.tables WHERE database = 'df_traceflow_ttl' AND name = '"+table+"'", "TabSeparatedRaw")
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	for _, step := range []struct {
		ttl, traceflowTTL int
		flows, traceflows string // "" : no TTL
	}{
		{30, 0, "toIntervalDay(30)", "toIntervalDay(7)"},
		{2, 0, "toIntervalDay(2)", "toIntervalDay(2)"},
		{30, 1, "toIntervalDay(30)", "toIntervalDay(1)"},
		{0, 0, "", ""},
		{0, 5, "", "toIntervalDay(5)"},
	} {
		r.opt.TTLDays, r.opt.TraceflowTTLDays = step.ttl, step.traceflowTTL
		if _, err := r.Up(ctx); err != nil {
			t.Fatal(err)
		}
		for table, want := range map[string]string{"flows": step.flows, "traceflows": step.traceflows} {
			got := engine(table)
			if (want == "") == strings.Contains(got, " TTL ") || (want != "" && !strings.Contains(got, want)) {
				t.Errorf("ttl %d, traceflow ttl %d: %s: %s, want %q", step.ttl, step.traceflowTTL, table, got, want)
			}
		}
	}
}
