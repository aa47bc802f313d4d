package api

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/internal/chsql"
	"github.com/dualflow/dualflow/migrations"
)

// TestTiersEqualRows: the summary and the service map, summed per tier
// (hours and minutes from the projections, edges as rows), equal the same
// sums over the rows, for random windows over the seeded hour (some with
// whole hours, some within a minute) and filters per IP mode, some on
// columns no projection has.
func TestTiersEqualRows(t *testing.T) {
	e := needEngine(t)
	a, err := New(Config{Store: e, Now: func() time.Time { return seedNow }, Anonymous: RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	filters := []string{"", "ip_version=4", "ip_version=6", "namespace=shop", "verdict=dropped", "src_pod=frontend-0", "protocol=TCP&ip_version=6"}
	ctx := context.Background()
	for i := range 24 {
		// Windows from 2 h before the seed's end to 10 min after it, at
		// millisecond offsets, between 20 s and 2.5 h long.
		since := seedNow.Add(-2*time.Hour + time.Duration(rng.Int64N(int64(100*time.Minute))))
		since = since.Add(time.Duration(rng.IntN(60000)) * time.Millisecond)
		until := since.Add(20*time.Second + time.Duration(rng.Int64N(int64(150*time.Minute))))
		if i%4 == 0 { // whole hours
			since, until = seedNow.Add(-2*time.Hour), seedNow
		}
		fq := filters[i%len(filters)]
		q, _ := url.ParseQuery(fq)
		q.Set("since", fmt.Sprint(since.UnixMilli()))
		q.Set("until", fmt.Sprint(until.UnixMilli()))
		f, err := parseFilter(q, seedNow)
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("[%s, %s) %q", since.Format("15:04:05.000"), until.Format("15:04:05.000"), fq)
		for _, step := range []time.Duration{time.Minute, 5 * time.Minute, time.Hour, 90 * time.Second} {
			s, err := a.querySummary(ctx, f, step, 100)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			var got []string
			for _, p := range s.Series {
				got = append(got, fmt.Sprintf("%d/%d %d %d %d", p.TimeMs, p.IPVersion, p.Bytes, p.Flows, p.Dropped))
			}
			want := rowsTSV(t, a, fmt.Sprintf(`SELECT toUnixTimestamp(toStartOfInterval(flow_end, INTERVAL %d SECOND)) * 1000 AS t, ip_version,
 sum(bytes + reverse_bytes), count(), countIf(%s) FROM %s WHERE %s GROUP BY t, ip_version ORDER BY t, ip_version`, int(step.Seconds()), droppedExpr, a.table, strings.Join(f.where(), " AND ")),
				func(c []string) string { return fmt.Sprintf("%s/%s %s %s %s", c[0], c[1], c[2], c[3], c[4]) })
			if !slices.Equal(got, want) {
				t.Errorf("%s step %v: series\n got %v\nwant %v", name, step, got, want)
			}
			if step == time.Minute {
				got = got[:0]
				for _, p := range s.Talkers {
					got = append(got, fmt.Sprintf("%s>%s/%d %d %d", p.Src, p.Dst, p.IPVersion, p.Bytes, p.Flows))
				}
				want = rowsTSV(t, a, fmt.Sprintf(`SELECT `+srcLabelRows+`, `+dstLabelRows+`, ip_version, sum(bytes + reverse_bytes) AS b, count() AS n
 FROM %s WHERE %s GROUP BY 1, 2, 3 ORDER BY b DESC, n DESC, 1, 2, 3 LIMIT 100`, a.table, strings.Join(f.where(), " AND ")),
					func(c []string) string { return fmt.Sprintf("%s>%s/%s %s %s", c[0], c[1], c[2], c[3], c[4]) })
				if !slices.Equal(got, want) {
					t.Errorf("%s: talkers\n got %v\nwant %v", name, got, want)
				}
			}
		}
		r := do(t, a.Handler(), "GET", "/api/v1/servicemap?"+q.Encode(), "")
		m := decode[ServiceMap](t, r)
		var got []string
		for _, e := range m.Edges {
			got = append(got, fmt.Sprintf("%s>%s/%d %s %d %d", e.Src, e.Dst, e.IPVersion, e.Verdict, e.Flows, e.Bytes))
		}
		want := rowsTSV(t, a, fmt.Sprintf(`SELECT `+srcLabelRows+`, `+dstLabelRows+`, ip_version, `+migrations.VerdictClassExpr+` AS v, count() AS n, sum(bytes + reverse_bytes) AS b
 FROM %s WHERE %s GROUP BY 1, 2, 3, 4 ORDER BY b DESC, n DESC, 1, 2, 3, 4 LIMIT 500`, a.table, strings.Join(f.where(), " AND ")),
			func(c []string) string { return fmt.Sprintf("%s>%s/%s %s %s %s", c[0], c[1], c[2], c[3], c[4], c[5]) })
		if !slices.Equal(got, want) {
			t.Errorf("%s: service map\n got %v\nwant %v", name, got, want)
		}
	}
}

// The labels as expressions over the rows (what the columns of migration
// 0009 are materialized from), so the comparison does not read them.
const (
	srcLabelRows = `multiIf(src_workload_name != '', concat(src_pod_namespace, '/', src_workload_name), src_pod_name != '', concat(src_pod_namespace, '/', src_pod_name), src_ip)`
	dstLabelRows = `multiIf(dst_service_name != '', concat('svc:', dst_service_namespace, '/', dst_service_name), dst_workload_name != '', concat(dst_pod_namespace, '/', dst_workload_name), dst_pod_name != '', concat(dst_pod_namespace, '/', dst_pod_name), dst_ip)`
)

func rowsTSV(t *testing.T, a *API, sql string, line func([]string) string) []string {
	t.Helper()
	out, err := a.cfg.Store.Query(context.Background(), sql, "TabSeparated")
	if err != nil {
		t.Fatalf("%v\n%s", err, sql)
	}
	var rows []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if l != "" {
			rows = append(rows, line(strings.Split(l, "\t")))
		}
	}
	return rows
}

// TestTiersUseProjections: the engine answers the hour and minute tiers
// from the projections of migration 0009 (EXPLAIN names them), so a day
// of flows is summed from pre-aggregated rows; a filter on a column the
// projections lack reads rows.
func TestTiersUseProjections(t *testing.T) {
	e := needEngine(t)
	a, err := New(Config{Store: e, Now: func() time.Time { return seedNow }, Anonymous: RoleOperator})
	if err != nil {
		t.Fatal(err)
	}
	explain := func(sql string) string {
		out, err := e.Query(context.Background(), "EXPLAIN projections = 1 "+strings.TrimSuffix(sql, jsonSettings), "TSVRaw")
		if err != nil {
			t.Fatalf("%v\n%s", err, sql)
		}
		return string(out)
	}
	// The seed covers the hour before seedNow: a window with that whole
	// hour, and one with whole minutes of it.
	talkers := func(f *Filter) string {
		return a.tieredSQL(f, true, func(string) string {
			return "src_label AS src, dst_label AS dst, ip_version, sum(bytes + reverse_bytes) AS b, count() AS n"
		}, "src, dst, ip_version")
	}
	hour := &Filter{Since: seedNow.Add(-time.Hour - 30*time.Second), Until: seedNow.Add(30 * time.Second)}
	if plan := explain(talkers(hour)); !strings.Contains(plan, "ReadFromMergeTree (edges_1h)") {
		t.Errorf("talkers plan of %v..%v lacks edges_1h:\n%s", hour.Since, hour.Until, plan)
	}
	f := &Filter{Since: seedNow.Add(-50*time.Minute - 500*time.Millisecond), Until: seedNow.Add(-10*time.Minute - 30*time.Second)}
	if plan := explain(talkers(f)); !strings.Contains(plan, "ReadFromMergeTree (edges_1m)") {
		t.Errorf("talkers plan of %v..%v lacks edges_1m:\n%s", f.Since, f.Until, plan)
	}
	series := a.tieredSQL(f, false, func(ts string) string {
		return "toUnixTimestamp(toStartOfInterval(" + ts + ", INTERVAL 60 SECOND)) * 1000 AS time_ms, ip_version, verdict_class, sum(bytes + reverse_bytes) AS b, count() AS n"
	}, "time_ms, ip_version, verdict_class")
	if plan := explain(series); !strings.Contains(plan, "ReadFromMergeTree (series_1m)") {
		t.Errorf("series plan lacks series_1m:\n%s", plan)
	}
	f.conds = []string{"src_pod_name = 'frontend-0'"}
	if plan := explain(a.tieredSQL(f, true, func(string) string { return "src_label AS src, count() AS n" }, "src")); strings.Contains(plan, "(edges_") {
		t.Errorf("a filter on src_pod_name used a projection:\n%s", plan)
	}
}

// TestWindowUsesSortKey: a window's rows are selected through the head of
// the sort key, toStartOfMinute(flow_end), so the engine skips the
// granules of a merged part outside it (flow_end alone does not).
func TestWindowUsesSortKey(t *testing.T) {
	e := needEngine(t)
	w := chsql.FlowEnd(seedNow.Add(-10*time.Minute-500*time.Millisecond), seedNow.Add(-5*time.Minute))
	out, err := e.Query(context.Background(), "EXPLAIN indexes = 1 SELECT count() FROM dualflow.flows WHERE "+w+" SETTINGS optimize_use_projections = 0", "TSVRaw")
	if err != nil {
		t.Fatal(err)
	}
	plan := string(out)
	i := strings.Index(plan, "PrimaryKey")
	if i < 0 {
		t.Fatalf("no primary key analysis:\n%s", plan)
	}
	if pk := plan[i:]; !strings.Contains(pk[:strings.Index(pk, "Granules")], "toStartOfMinute(flow_end) in [") {
		t.Errorf("the primary key is not used for the window:\n%s", plan)
	}
}
