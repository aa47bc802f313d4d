package api

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/internal/chsql"
)

// Summary is the answer of GET /flows/summary.
type Summary struct {
	StepSeconds int64         `json:"step_seconds"`
	Series      []SeriesPoint `json:"series"`
	Talkers     []Talker      `json:"top_talkers"`
	Families    []FamilyTotal `json:"families"`
	// DropsByPolicy is asked for with policies=N: the dropped flows of
	// the N policies that dropped most, per family.
	DropsByPolicy []PolicyDrops `json:"drops_by_policy,omitempty"`
	// Dimension, Side and Groups are asked for with dimension=D (and
	// side=src|dst, dst unless asked): the traffic per step, family and
	// group of D on that side of the flows, for the top groups of the
	// window (both families together; the rest summed as OtherGroup).
	Dimension string       `json:"dimension,omitempty"`
	Side      string       `json:"side,omitempty"`
	Groups    []GroupPoint `json:"groups,omitempty"`
	// PairsDimension and Pairs are asked for with pairs=D: the window's
	// traffic per family from each source group of D to each destination
	// group of D (a Sankey's links), the top groups of each side by bytes
	// (both families together) and the rest of that side as OtherGroup.
	PairsDimension string   `json:"pairs_dimension,omitempty"`
	Pairs          []Talker `json:"pairs,omitempty"`
}

// GroupPoint is the traffic of one group of the summary's dimension, in
// one family and step.
type GroupPoint struct {
	TimeMs    int64  `json:"time_ms"`
	IPVersion int    `json:"ip_version"`
	Group     string `json:"group"`
	Bytes     uint64 `json:"bytes"`
	Flows     uint64 `json:"flows"`
}

// OtherGroup is the group of all but the top groups; NoNamespace that of
// flows to an end with no pod namespace (an address outside the cluster,
// a node). Neither can be a Kubernetes name, a port or a family.
const (
	OtherGroup  = "(other)"
	NoNamespace = "(none)"
)

// dimension is a group-by of the summary as an expression over the flows
// table for each side of a flow: src where the flow comes from, dst where
// it goes; "" where the side means nothing (a source port is ephemeral).
type dimension struct{ src, dst string }

// side is the expression of d on side "src" or "dst".
func (d dimension) side(s string) string {
	if s == "src" {
		return d.src
	}
	return d.dst
}

// dimensions are the group-by columns of the summary. namespace and
// workload are columns of the edges projections, on both sides; the port
// is read from rows; a family is the same at both ends.
var dimensions = map[string]dimension{
	"namespace": {src: "if(src_pod_namespace = '', '" + NoNamespace + "', src_pod_namespace)", dst: "if(dst_pod_namespace = '', '" + NoNamespace + "', dst_pod_namespace)"},
	"workload":  {src: "src_label", dst: "dst_label"},
	"port":      {dst: "toString(dst_port)"},
	"family":    {src: "concat('IPv', toString(ip_version))", dst: "concat('IPv', toString(ip_version))"},
}

// PolicyDrops counts the dropped flows of one family that one policy
// decided: the egress policy when egress dropped the flow (the packet
// meets it first), else the ingress one; "" for a default deny that no
// policy names.
type PolicyDrops struct {
	Policy    string `json:"policy"`
	IPVersion int    `json:"ip_version"`
	Dropped   uint64 `json:"dropped"`
}

// SeriesPoint is the traffic of one family in one step.
type SeriesPoint struct {
	TimeMs    int64  `json:"time_ms"`
	IPVersion int    `json:"ip_version"`
	Bytes     uint64 `json:"bytes"`
	Flows     uint64 `json:"flows"`
	Dropped   uint64 `json:"dropped"`
}

// Talker is a source→destination pair of one family.
type Talker struct {
	Src       string `json:"src"`
	Dst       string `json:"dst"`
	IPVersion int    `json:"ip_version"`
	Bytes     uint64 `json:"bytes"`
	Flows     uint64 `json:"flows"`
}

// FamilyTotal is the traffic of one family over the range.
type FamilyTotal struct {
	IPVersion int    `json:"ip_version"`
	Bytes     uint64 `json:"bytes"`
	Flows     uint64 `json:"flows"`
	Dropped   uint64 `json:"dropped"`
}

// Flows name their ends by the columns src_label and dst_label (migration
// 0009: workload, else pod, else address; a destination Service first) and
// class their verdicts by verdict_class.
const (
	droppedExpr = `(ingress_verdict IN ('denied', 'rejected') OR egress_verdict IN ('denied', 'rejected'))`
	// maxPoints bounds the series length per family.
	maxPoints = 720
)

func (a *API) summary(c *gin.Context) (any, error) {
	q := c.Request.URL.Query()
	f, err := parseFilter(q, a.cfg.Now(), "step", "top", "policies", "dimension", "side", "pairs")
	if err != nil {
		return nil, err
	}
	f.scope = principalOf(c).scope
	span := f.Until.Sub(f.Since)
	// About 60 points; past a minute, whole minutes, which the minute
	// tier sums from the series_1m projection (tieredSQL).
	step := span / 60
	if step > time.Minute {
		step = (step + time.Minute - 1).Truncate(time.Minute) // whole minutes, rounded up
	}
	if v := q.Get("step"); v != "" {
		if step, err = time.ParseDuration(v); err != nil || step <= 0 {
			return nil, fieldErr("step", "want a positive duration like 1m")
		}
	}
	step = max(step, time.Second)
	if span/step > maxPoints {
		return nil, fieldErr("step", "at most %d points: use a step of at least %s", maxPoints, (span/maxPoints).Round(time.Second)+time.Second)
	}
	top, err := intParam(q, "top", 10, 1, 100)
	if err != nil {
		return nil, err
	}
	policies, err := intParam(q, "policies", 0, 0, 1000)
	if err != nil {
		return nil, err
	}
	dim := q.Get("dimension")
	if _, ok := dimensions[dim]; dim != "" && !ok {
		return nil, fieldErr("dimension", "want namespace, workload, port or family")
	}
	side := cmp.Or(q.Get("side"), "dst")
	switch {
	case side != "src" && side != "dst":
		return nil, fieldErr("side", "want src or dst")
	case q.Has("side") && dim == "":
		return nil, fieldErr("side", "side is the side of a dimension: ask for one with dimension=")
	case dim != "" && dimensions[dim].side(side) == "":
		return nil, fieldErr("side", "dimension %s has no %s side: want side=dst", dim, side)
	}
	pairs := q.Get("pairs")
	if pairs != "" && pairs != "namespace" && pairs != "workload" {
		return nil, fieldErr("pairs", "want namespace or workload")
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.cfg.QueryTimeout)
	defer cancel()
	s, err := a.querySummary(ctx, f, step, top)
	if err != nil {
		return nil, err
	}
	if dim != "" {
		s.Dimension, s.Side = dim, side
		if s.Groups, err = a.queryGroups(ctx, f, step, dimensions[dim].side(side), top); err != nil {
			return nil, err
		}
	}
	if pairs != "" {
		s.PairsDimension = pairs
		if s.Pairs, err = a.queryPairs(ctx, f, dimensions[pairs], top); err != nil {
			return nil, err
		}
	}
	if policies > 0 {
		s.DropsByPolicy, err = a.queryDropsByPolicy(ctx, f, policies)
	}
	return s, err
}

// seriesSQL is the per-step rows of f grouped by group plus the step's
// time_ms: the buckets are whole minutes (or hours) when the step is, and
// then the minute (hour) tiers sum them from the projections; any other
// step reads rows. cols is the SELECT list after time_ms.
func (a *API) seriesSQL(f *Filter, secs int64, cols, group string) string {
	body := func(ts string) string {
		return fmt.Sprintf(`toUnixTimestamp(toStartOfInterval(%s, INTERVAL %d SECOND)) * 1000 AS time_ms, %s`, ts, secs, cols)
	}
	group = "time_ms, " + group
	if secs%60 == 0 {
		return a.tieredSQL(f, secs%3600 == 0, body, group)
	}
	return chsql.Select{Cols: body(chsql.FlowEndCol), From: f.from(a.table), Where: f.where(), GroupBy: group}.String()
}

// queryGroups sums f's traffic per step, family and group of the
// dimension expression dim, for the top groups by bytes over the window
// (both families together); the others' traffic is summed as OtherGroup.
func (a *API) queryGroups(ctx context.Context, f *Filter, step time.Duration, dim string, top int) ([]GroupPoint, error) {
	parts := "(" + a.seriesSQL(f, int64(step/time.Second), "ip_version, "+dim+" AS grp, sum(bytes + reverse_bytes) AS b, count() AS n", "ip_version, grp") + ")"
	topGroups := chsql.Select{Cols: "grp", From: parts, GroupBy: "grp", OrderBy: "sum(b) DESC, sum(n) DESC, grp", Limit: top}.String()
	q := chsql.Select{Cols: "time_ms, ip_version, if(grp IN (" + topGroups + "), grp, '" + OtherGroup + "') AS `group`, sum(b) AS bytes, sum(n) AS flows",
		From: parts, GroupBy: "time_ms, ip_version, `group`", OrderBy: "time_ms, ip_version, `group`", Settings: jsonSettings}.String()
	rows := []GroupPoint{}
	if err := decodeRows(ctx, a, q, &rows); err != nil {
		return nil, err
	}
	return rows, nil
}

// queryPairs sums f's traffic over the window per family, source group
// and destination group of dim, whole hours and minutes from the edges
// projections; each side keeps its top groups by bytes (both families
// together) and sums the rest as OtherGroup. Biggest pairs first. The
// flows are read once: window functions total and rank each side's
// groups over the pairs.
func (a *API) queryPairs(ctx context.Context, f *Filter, dim dimension, top int) ([]Talker, error) {
	parts := a.tieredSQL(f, true, func(string) string {
		return "ip_version, " + dim.src + " AS s, " + dim.dst + " AS d, sum(bytes + reverse_bytes) AS b, count() AS n"
	}, "ip_version, s, d")
	totals := chsql.Select{Cols: "ip_version, s, d, b, n, sum(b) OVER (PARTITION BY s) AS sb, sum(n) OVER (PARTITION BY s) AS sn, sum(b) OVER (PARTITION BY d) AS db, sum(n) OVER (PARTITION BY d) AS dn",
		From: "(" + parts + ")"}.String()
	ranked := chsql.Select{Cols: "ip_version, s, d, b, n, dense_rank() OVER (ORDER BY sb DESC, sn DESC, s) AS sr, dense_rank() OVER (ORDER BY db DESC, dn DESC, d) AS dr",
		From: "(" + totals + ")"}.String()
	q := chsql.Select{Cols: fmt.Sprintf("if(sr <= %d, s, '%s') AS src, if(dr <= %d, d, '%s') AS dst, ip_version, sum(b) AS bytes, sum(n) AS flows", top, OtherGroup, top, OtherGroup),
		From: "(" + ranked + ")", GroupBy: "src, dst, ip_version", OrderBy: "bytes DESC, flows DESC, src, dst, ip_version", Settings: jsonSettings}.String()
	rows := []Talker{}
	if err := decodeRows(ctx, a, q, &rows); err != nil {
		return nil, err
	}
	return rows, nil
}

func (a *API) querySummary(ctx context.Context, f *Filter, step time.Duration, top int) (*Summary, error) {
	secs := int64(step / time.Second)
	s := &Summary{StepSeconds: secs, Series: []SeriesPoint{}, Talkers: []Talker{}, Families: []FamilyTotal{}}
	// A bucket of a minute's start holds all of that minute's rows, which
	// the minute (hour) tiers sum from series_1m (edges_1h).
	parts := a.seriesSQL(f, secs, "ip_version, verdict_class, sum(bytes + reverse_bytes) AS b, count() AS n", "ip_version, verdict_class")
	series := chsql.Select{Cols: "time_ms, ip_version, sum(b) AS bytes, sum(n) AS flows, sumIf(n, verdict_class = 'dropped') AS dropped",
		From: "(" + parts + ")", GroupBy: "time_ms, ip_version", OrderBy: "time_ms, ip_version", Settings: jsonSettings}.String()
	talkers := chsql.Select{Cols: "src, dst, ip_version, sum(b) AS bytes, sum(n) AS flows", From: "(" + a.tieredSQL(f, true, func(string) string {
		return "src_label AS src, dst_label AS dst, ip_version, sum(bytes + reverse_bytes) AS b, count() AS n"
	}, "src, dst, ip_version") + ")", GroupBy: "src, dst, ip_version", OrderBy: "bytes DESC, flows DESC, src, dst, ip_version", Limit: top, Settings: jsonSettings}.String()
	if err := decodeRows(ctx, a, series, &s.Series); err != nil {
		return nil, err
	}
	if err := decodeRows(ctx, a, talkers, &s.Talkers); err != nil {
		return nil, err
	}
	for _, v := range ipVersions {
		t := FamilyTotal{IPVersion: v}
		for _, p := range s.Series {
			if p.IPVersion == v {
				t.Bytes, t.Flows, t.Dropped = t.Bytes+p.Bytes, t.Flows+p.Flows, t.Dropped+p.Dropped
			}
		}
		s.Families = append(s.Families, t)
	}
	return s, nil
}

// decidingPolicy names the policy that dropped a flow (see PolicyDrops).
const decidingPolicy = `if(egress_verdict IN ('denied', 'rejected'),
 if(egress_policy_name = '', '', concat(egress_policy_namespace, '/', egress_policy_name)),
 if(ingress_policy_name = '', '', concat(ingress_policy_namespace, '/', ingress_policy_name)))`

// queryDropsByPolicy counts f's dropped flows per deciding policy and
// family, for the n policies with the most (both families together). The
// rows are few (policies × 2), so the cut to n is made here.
func (a *API) queryDropsByPolicy(ctx context.Context, f *Filter, n int) ([]PolicyDrops, error) {
	q := chsql.Select{Cols: decidingPolicy + " AS policy, ip_version, count() AS dropped", From: f.from(a.table),
		Where: append(f.where(), droppedExpr), GroupBy: "policy, ip_version", OrderBy: "policy, ip_version", Settings: jsonSettings}.String()
	var rows []PolicyDrops
	if err := decodeRows(ctx, a, q, &rows); err != nil {
		return nil, err
	}
	total := map[string]uint64{}
	for _, r := range rows {
		total[r.Policy] += r.Dropped
	}
	names := slices.SortedFunc(maps.Keys(total), func(x, y string) int {
		return cmp.Or(cmp.Compare(total[y], total[x]), cmp.Compare(x, y))
	})
	keep := names[:min(n, len(names))]
	out := []PolicyDrops{}
	for _, r := range rows {
		if slices.Contains(keep, r.Policy) {
			out = append(out, r)
		}
	}
	slices.SortStableFunc(out, func(x, y PolicyDrops) int {
		return cmp.Compare(slices.Index(keep, x.Policy), slices.Index(keep, y.Policy))
	})
	return out, nil
}

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
		parts = append(parts, chsql.Select{Cols: body(t.Key), From: f.from(a.table), Where: append([]string{t.Cond}, f.allConds()...), GroupBy: group}.String())
	}
	return chsql.Union(parts...)
}
