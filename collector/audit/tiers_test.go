package audit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/internal/chsql"
)

// TestPolicyTiers: the denied report and the rule use, summed per tier
// (whole hours from the projection policy_1h, the minutes at the ends as
// rows), equal the same sums over the rows of rollup_policy_1m selected
// by minutes(w), for random windows (second and sub-second bounds) over
// six hours of rows in both families; and the engine does read the
// projection for the whole hours.
func TestPolicyTiers(t *testing.T) {
	e := needEngine(t)
	ctx := context.Background()
	if err := e.Exec(ctx, "TRUNCATE TABLE dualflow.rollup_policy_1m"); err != nil {
		t.Fatal(err)
	}
	end := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	// A row per minute and combination: 6 hours x 4 rules x 2 verdicts x
	// 2 families, on a port of two protocols (and none: summed before
	// migration 0013), with counts that differ per row.
	err := e.Exec(ctx, fmt.Sprintf(`INSERT INTO dualflow.rollup_policy_1m (window_start, ip_version, direction, policy_namespace, policy_name, policy_rule,
       verdict, reported_verdict, src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, protocol, dst_port, records, packets, bytes)
SELECT toDateTime(%d - 60 * intDiv(number, 16), 'UTC'), if(number %% 2 = 0, 4, 6), if(number %% 4 < 2, 'ingress', 'egress'),
       'shop', concat('pol-', toString(number %% 8 >= 4)), toInt32(number %% 3) - 1, if(number %% 16 >= 8, 'denied', 'allowed'), 'unknown',
       'shop', 'web', 'shop', 'db', [0, 6, 17][1 + number %% 5 %% 3], [0, 5432, 53][1 + number %% 5 %% 3], 1 + number %% 7, 3, 100 + number %% 11
FROM numbers(360 * 16)`, end.Unix()-60))
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewReports(e, "")
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range 20 {
		since := end.Add(-6*time.Hour + time.Duration(rng.Int64N(int64(5*time.Hour))) + time.Duration(rng.IntN(60000))*time.Millisecond)
		until := since.Add(time.Duration(rng.Int64N(int64(4 * time.Hour))))
		if i == 0 {
			since, until = end.Add(-5*time.Hour), end.Add(-time.Hour)
		}
		w := Window{Since: since, Until: until}
		name := fmt.Sprintf("[%s, %s)", since.Format("15:04:05.000"), until.Format("15:04:05.000"))
		got, err := r.Denied(ctx, DeniedOptions{Window: w})
		if err != nil {
			t.Fatal(err)
		}
		var lines []string
		for _, g := range got {
			lines = append(lines, fmt.Sprintf("%s %s %d v%d %s/%d %d %d %d %d %d", g.Direction, g.PolicyName, g.Rule, g.IPVersion, g.Protocol, g.DstPort, g.Records, g.Packets, g.Bytes, g.First.Unix(), g.Last.Unix()))
		}
		want := tsvLines(t, fmt.Sprintf(`SELECT toString(direction), policy_name, policy_rule, ip_version,
 multiIf(protocol = 6, 'TCP', protocol = 17, 'UDP', ''), dst_port, sum(records) AS n, sum(packets), sum(bytes),
 toUnixTimestamp(min(window_start)), toUnixTimestamp(max(window_start)) FROM dualflow.rollup_policy_1m
 WHERE %s AND verdict IN ('denied', 'rejected')
 GROUP BY direction, policy_name, policy_rule, ip_version, protocol, dst_port
 ORDER BY n DESC, toString(direction), policy_name, policy_rule, ip_version, protocol, dst_port`,
			minutes(w)),
			func(c []string) string {
				return fmt.Sprintf("%s %s %s v%s %s/%s %s %s %s %s %s", c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10])
			})
		if strings.Join(lines, "\n") != strings.Join(want, "\n") {
			t.Errorf("%s: denied\n got %v\nwant %v", name, lines, want)
		}
		rep, err := r.Unused(ctx, nil, w)
		if err != nil {
			t.Fatal(err)
		}
		var used uint64
		for _, n := range rep.Used {
			used += n
		}
		wantUsed := tsvLines(t, fmt.Sprintf(`SELECT sum(records), countDistinct(direction, policy_name, policy_rule) FROM dualflow.rollup_policy_1m
 WHERE %s AND verdict = 'allowed' AND policy_rule >= 0`, minutes(w)), func(c []string) string { return c[0] + " " + c[1] })
		wantDec := tsvLines(t, fmt.Sprintf(`SELECT sum(records) FROM dualflow.rollup_policy_1m WHERE %s AND verdict != 'unknown'`, minutes(w)),
			func(c []string) string { return c[0] })
		if g := fmt.Sprintf("%d %d", used, len(rep.Used)); g != wantUsed[0] || fmt.Sprint(rep.Decisions) != wantDec[0] {
			t.Errorf("%s: used %s of %d decisions, want %s of %s", name, g, rep.Decisions, wantUsed[0], wantDec[0])
		}
	}
	w := Window{Since: end.Add(-5*time.Hour - 90*time.Second), Until: end.Add(-time.Hour)}
	plan := tsvLines(t, "EXPLAIN projections = 1 SELECT direction, dst_port, sum(r) FROM ("+w.policyUnion("dualflow", chsql.Select{Cols: "direction, dst_port, sum(records) AS r", Where: []string{"verdict IN ('denied', 'rejected')"}, GroupBy: "direction, dst_port"})+") GROUP BY direction, dst_port", func(c []string) string { return strings.Join(c, "\t") })
	if !strings.Contains(strings.Join(plan, "\n"), "ReadFromMergeTree (policy_1h)") {
		t.Errorf("the hour tier does not read policy_1h:\n%s", strings.Join(plan, "\n"))
	}
}

func tsvLines(t *testing.T, sql string, line func([]string) string) []string {
	t.Helper()
	out, err := needEngine(t).Query(context.Background(), sql, "TSVRaw")
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

// lastQuery records the last query it is given and answers nothing.
type lastQuery struct{ q string }

func (l *lastQuery) Query(_ context.Context, q, _ string) ([]byte, error) { l.q = q; return nil, nil }

// TestReportMemoryBound: the reports' queries carry the memory bounds the
// web API's own have (spill past 512 MiB, fail past 1 GiB).
func TestReportMemoryBound(t *testing.T) {
	var l lastQuery
	r, err := NewReports(&l, "")
	if err != nil {
		t.Fatal(err)
	}
	w := Window{Since: time.Now().Add(-time.Hour)}
	if _, err := r.Denied(context.Background(), DeniedOptions{Window: w}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"max_memory_usage = 1073741824", "max_bytes_before_external_group_by = 536870912"} {
		if !strings.Contains(l.q, s) {
			t.Errorf("denied report query without %s: %s", s, l.q)
		}
	}
}

// minutes selects the window's minutes of a rollup plainly, on
// window_start: what policyUnion must cover.
func minutes(w Window) string {
	return fmt.Sprintf("window_start >= toDateTime(%d) AND window_start < toDateTime(%d)", w.Since.Unix(), w.Until.Unix())
}
