package api

import (
	"strings"
	"time"

	"github.com/dualflow/dualflow/internal/chsql"
)

// A window [since, until) is read in tiers so that the summary, the
// service map and the traffic series are summed from the projections of
// migration 0009 (series_1m, edges_1m, edges_1h) where they give exactly
// the rows' answer:
//
//   - whole hours through toStartOfHour(flow_end): edges_1h;
//   - whole minutes through toStartOfMinute(flow_end): series_1m or
//     edges_1m;
//   - the partial minutes at either end through flow_end: rows.
//
// ClickHouse answers a tier from a projection only when the projection has
// every column the query needs (a filter on a column it lacks, such as a
// pod name or an address, reads rows, with the same result), and reads as
// rows the parts whose projection is not built yet. Each tier's
// conditions cover a disjoint part of the window, and together all of it.
type tier struct {
	// ts is the tier's time expression, a key of its projections.
	ts string
	// cond selects the tier's part of the window.
	cond string
}

const (
	tsRow    = "flow_end"
	tsMinute = "toStartOfMinute(flow_end)"
	tsHour   = "toStartOfHour(flow_end)"
)

// splitTiers cuts [since, until) into tiers: whole hours when hours is
// true, whole minutes, and rows at the edges.
func splitTiers(since, until time.Time, hours bool) []tier {
	var out []tier
	span := func(ts string, from, to time.Time) {
		if !from.Before(to) {
			return
		}
		cond := ts + " >= " + chsql.Time(from) + " AND " + ts + " < " + chsql.Time(to)
		if ts == tsRow {
			cond = chsql.FlowEnd(from, to)
		}
		out = append(out, tier{ts: ts, cond: cond})
	}
	m1, m2 := ceilTime(since, time.Minute), until.Truncate(time.Minute)
	if !m1.Before(m2) {
		span(tsRow, since, until)
		return out
	}
	span(tsRow, since, m1)
	span(tsRow, m2, until)
	h1, h2 := ceilTime(m1, time.Hour), m2.Truncate(time.Hour)
	if hours && h1.Before(h2) {
		span(tsHour, h1, h2)
		span(tsMinute, m1, h1)
		span(tsMinute, h2, m2)
	} else {
		span(tsMinute, m1, m2)
	}
	return out
}

// ceilTime rounds t up to a multiple of d (Unix time: UTC minutes and
// hours).
func ceilTime(t time.Time, d time.Duration) time.Time {
	if f := t.Truncate(d); f.Before(t) {
		return f.Add(d)
	}
	return t
}

// tieredSQL is one SELECT per tier of f's window, combined with UNION ALL:
// body(ts) is the SELECT list, ending before FROM, with the tier's time
// expression ts; group is the GROUP BY list.
func (a *API) tieredSQL(f *Filter, hours bool, body func(ts string) string, group string) string {
	var parts []string
	conds := f.condsSQL()
	for _, t := range splitTiers(f.Since, f.Until, hours) {
		parts = append(parts, "SELECT "+body(t.ts)+" FROM "+a.table+" WHERE "+t.cond+conds+" GROUP BY "+group)
	}
	return strings.Join(parts, "\nUNION ALL\n")
}
