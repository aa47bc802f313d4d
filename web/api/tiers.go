package api

import "github.com/dualflow/dualflow/internal/chsql"

// tieredSQL is one SELECT per tier of f's window, combined with UNION
// ALL, so that the summary, the service map and the traffic series are
// summed from the projections of migration 0009 where they give exactly
// the rows' answer (chsql.Tiers): whole hours from edges_1h when hours is
// true, whole minutes from series_1m or edges_1m, the partial minutes at
// either end from rows. A filter on a column no projection has (a pod
// name, an address) reads rows, with the same result. body(key) is the
// SELECT list with the tier's time key; group is the GROUP BY list.
func (a *API) tieredSQL(f *Filter, hours bool, body func(key string) string, group string) string {
	var parts []string
	for _, t := range chsql.Tiers(chsql.FlowEndCol, f.Since, f.Until, hours) {
		parts = append(parts, chsql.Select{Cols: body(t.Key), From: a.table, Where: append([]string{t.Cond}, f.allConds()...), GroupBy: group}.String())
	}
	return chsql.Union(parts...)
}
