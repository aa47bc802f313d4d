package api

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/chsql"
	"github.com/dualflow/dualflow/migrations"
	"github.com/dualflow/dualflow/traceflow"
)

// ReachabilityRequest is the body of POST /reachability.
type ReachabilityRequest struct {
	Sources      []audit.Endpoint `json:"sources"`
	Destinations []audit.Endpoint `json:"destinations"`
	// Protocol (name or number, default TCP) and Port (0: any) of the
	// question; observed flows are filtered on them too.
	Protocol string `json:"protocol,omitempty"`
	Port     uint16 `json:"port,omitempty"`
	// Since is the observation window: a duration ("1h", default) or RFC 3339.
	Since string `json:"since,omitempty"`
	// Trace runs a live traceflow per cell, over its families (operator
	// only).
	Trace bool `json:"trace,omitempty"`
}

// Reachability is the answer: Cells[i][j] is Sources[i] → Destinations[j].
type Reachability struct {
	Sources      []audit.Endpoint `json:"sources"`
	Destinations []audit.Endpoint `json:"destinations"`
	Cells        [][]Cell         `json:"cells"`
	// Asymmetric counts the cells where the families disagree.
	Asymmetric int   `json:"asymmetric"`
	SinceMs    int64 `json:"since_ms"`
	ElapsedMs  int64 `json:"elapsed_ms"`
}

// Cell is one source → destination pair.
type Cell struct {
	// Families is keyed "4" and "6".
	Families map[string]*CellFamily `json:"families"`
	// Asymmetric is true when the two families disagree; Reasons says how.
	Asymmetric bool     `json:"asymmetric"`
	Reasons    []string `json:"reasons,omitempty"`
}

// CellFamily is what is known about one family of a cell.
type CellFamily struct {
	// Outcome sums it up. From the evaluated policies of every pod pair
	// the cell covers: allow (all pairs), deny (none), partial
	// (PairsAllowed of PairsTotal); or why the family has no pair:
	// unavailable (an end has no address of the family), no_family (the
	// Service has no ClusterIP of the family), no_port (the Service
	// exposes no such port), no_backends (no backend pod serves it), self
	// (a pod to itself only); error (an end could not be resolved:
	// PolicyError). Without an evaluation: from a trace or the observed
	// flows, allow, deny, mixed or unknown.
	Outcome string `json:"outcome"`
	// Reason explains an outcome other than allow and deny ("no IPv6
	// ClusterIP", "the Service has no port 9090/TCP", "2 of 4 pod pairs
	// allowed").
	Reason string `json:"reason,omitempty"`
	// Policy sums the evaluated pairs up: Verdict is allowed, denied,
	// not_isolated or rejected when all pairs agree, partial otherwise;
	// the deciding policies and addresses when all pairs share them.
	Policy      *audit.PolicyVerdict `json:"policy,omitempty"`
	PolicyError string               `json:"policy_error,omitempty"`
	// PairsAllowed of PairsTotal pod pairs are allowed; Pairs lists them
	// (at most 64 per family; PairsTruncated when more).
	PairsAllowed   int                 `json:"pairs_allowed"`
	PairsTotal     int                 `json:"pairs_total"`
	Pairs          []audit.PairVerdict `json:"pairs,omitempty"`
	PairsTruncated bool                `json:"pairs_truncated,omitempty"`
	// Mismatch says how the evaluated policy and what was observed or
	// traced disagree ("policy allows every pair, but 133 of 271 observed
	// flows were dropped"); empty when they agree.
	Mismatch string   `json:"mismatch,omitempty"`
	Observed Observed `json:"observed"`
	// Trace is the family's result of the cell's trace TraceID (as GET
	// /traceflows/{id} answers it); TraceError says why the
	// cell could not be traced.
	Trace      *traceflow.FamilyResult `json:"trace,omitempty"`
	TraceID    string                  `json:"trace_id,omitempty"`
	TraceError string                  `json:"trace_error,omitempty"`
}

// Observed sums the flows recorded in the window.
type Observed struct {
	Flows      uint64            `json:"flows"`
	LastSeenMs int64             `json:"last_seen_ms,omitempty"`
	Verdicts   map[string]uint64 `json:"verdicts,omitempty"`
}

// Matrix bounds.
const (
	maxMatrixSide     = 25
	traceConcurrency  = 4
	defaultReachSince = time.Hour
)

type observedRow struct {
	Si        int    `json:"si"`
	Di        int    `json:"di"`
	IPVersion int    `json:"ip_version"`
	Verdict   string `json:"verdict"`
	Flows     uint64 `json:"flows"`
	LastMs    int64  `json:"last_ms"`
}

// endpointCond is the condition matching e on one side of a flow.
func endpointCond(side string, e audit.Endpoint, field string) (string, error) {
	if len(e.Namespace) > maxValueBytes || len(e.Name) > maxValueBytes {
		return "", fieldErr(field, "namespace or name longer than %d bytes", maxValueBytes)
	}
	switch e.Kind {
	case "pod", "workload":
		if e.Namespace == "" || e.Name == "" {
			return "", fieldErr(field, "%s needs namespace and name", e.Kind)
		}
		col := side + "_pod_name"
		if e.Kind == "workload" {
			col = side + "_workload_name"
		}
		return nsName(side+"_pod_namespace", col, e.Namespace, e.Name), nil
	case "service":
		if side != "dst" {
			return "", fieldErr(field, "a Service can only be a destination")
		}
		if e.Namespace == "" || e.Name == "" {
			return "", fieldErr(field, "service needs namespace and name")
		}
		return nsName("dst_service_namespace", "dst_service_name", e.Namespace, e.Name), nil
	case "ip":
		c, err := ipCond(side+"_ip_bin", e.Name)
		if err != nil {
			return "", fieldErr(field, "%v", err)
		}
		return c, nil
	}
	return "", fieldErr(field, "kind %q is not pod, workload, service or ip", e.Kind)
}

// matchArray renders the indices of the endpoints a row matches, for
// arrayJoin: a row counts in every cell it belongs to.
func matchArray(side string, eps []audit.Endpoint, field string) (string, error) {
	parts := make([]string, len(eps))
	for i, e := range eps {
		c, err := endpointCond(side, e, field+"["+strconv.Itoa(i)+"]")
		if err != nil {
			return "", err
		}
		parts[i] = "if(" + c + ", " + strconv.Itoa(i) + ", -1)"
	}
	return "arrayFilter(x -> x >= 0, [" + strings.Join(parts, ", ") + "])", nil
}

func (a *API) reachability(c *gin.Context) (any, error) {
	var req ReachabilityRequest
	if err := bindJSON(c, &req, maxBodyBytes); err != nil {
		return nil, err // 400 naming the field (unknown fields refused too)
	}
	var refs []scopeRef
	for _, side := range []struct {
		field string
		eps   []audit.Endpoint
	}{{"sources", req.Sources}, {"destinations", req.Destinations}} {
		for i, e := range side.eps {
			refs = append(refs, scopeRef{field: side.field + "[" + strconv.Itoa(i) + "]", ref: e.Namespace, ip: e.Kind == "ip"})
		}
	}
	if !outOfScope(c, "reachability", refs...) {
		return nil, nil
	}
	if req.Trace {
		msg, err := a.may(c, principalOf(c), PermTrace)
		if err != nil {
			return nil, nil // answered 503
		}
		if msg != "" {
			c.AbortWithStatusJSON(http.StatusForbidden, errorBody{Message: "live traces: " + msg, Field: "trace"})
			return nil, nil
		}
	}
	// Its traces count for the principal's rate.
	return a.runReachability(traceflow.WithCaller(c.Request.Context(), principalOf(c).Name), &req)
}

func (a *API) runReachability(ctx context.Context, req *ReachabilityRequest) (*Reachability, error) {
	start := time.Now()
	ns, nd := len(req.Sources), len(req.Destinations)
	if ns == 0 || ns > maxMatrixSide {
		return nil, fieldErr("sources", "want 1..%d endpoints", maxMatrixSide)
	}
	if nd == 0 || nd > maxMatrixSide {
		return nil, fieldErr("destinations", "want 1..%d endpoints", maxMatrixSide)
	}
	proto, err := audit.ParseProto(req.Protocol)
	if err != nil {
		return nil, fieldErr("protocol", "%v", err)
	}
	icmp := proto == flow.ProtoICMP || proto == flow.ProtoICMPv6
	if icmp && req.Port != 0 {
		return nil, fieldErr("port", "ICMP has no port")
	}
	now := a.cfg.Now()
	since := now.Add(-defaultReachSince)
	if req.Since != "" {
		t, err := parseTime(req.Since, now)
		if err != nil {
			return nil, fieldErr("since", "%v", err)
		}
		since = t
	}
	srcArr, err := matchArray("src", req.Sources, "sources")
	if err != nil {
		return nil, err
	}
	dstArr, err := matchArray("dst", req.Destinations, "destinations")
	if err != nil {
		return nil, err
	}
	protoCond := "protocol = " + strconv.Itoa(int(proto))
	if icmp {
		// One question over both families: ICMP over IPv4, ICMPv6 over IPv6.
		protoCond = "protocol IN (1, 58)"
	}
	// A trace is not traffic: the probes of the traces the matrix runs
	// would otherwise show as observed flows (migration 0012).
	where := []string{chsql.FlowEnd(since, now), "NOT is_probe", protoCond}
	if p := strconv.Itoa(int(req.Port)); req.Port != 0 {
		where = append(where, "(dst_port = "+p+" OR service_port = "+p+")")
	}
	// Aggregate first by the columns the endpoint conditions read (a few
	// rows per pod pair and family), then expand to cells: the conditions
	// and ARRAY JOIN then run on thousands of rows, not on every flow.
	keys := []string{"ip_version"}
	for _, sd := range []struct {
		side string
		eps  []audit.Endpoint
	}{{"src", req.Sources}, {"dst", req.Destinations}} {
		if hasKind(sd.eps, "pod") || hasKind(sd.eps, "workload") {
			keys = append(keys, sd.side+"_pod_namespace")
		}
		if hasKind(sd.eps, "pod") {
			keys = append(keys, sd.side+"_pod_name")
		}
		if hasKind(sd.eps, "workload") {
			keys = append(keys, sd.side+"_workload_name")
		}
		if hasKind(sd.eps, "service") {
			keys = append(keys, "dst_service_namespace", "dst_service_name")
		}
		if hasKind(sd.eps, "ip") {
			keys = append(keys, sd.side+"_ip_bin")
		}
	}
	// The verdict class is computed after the aggregation, from the two
	// Enum8 columns (cheap keys).
	inner := chsql.Select{Cols: "ingress_verdict, egress_verdict, " + strings.Join(keys, ", ") + ", count() AS n, max(flow_end) AS last", From: a.table, Where: where, GroupBy: "ALL"}
	sql := chsql.Select{Cols: "si, di, ip_version, " + migrations.VerdictClassExpr + " AS verdict, sum(n) AS flows, max(toUnixTimestamp64Milli(last)) AS last_ms",
		From: "(" + inner.String() + ") ARRAY JOIN " + srcArr + " AS si ARRAY JOIN " + dstArr + " AS di", GroupBy: "si, di, ip_version, verdict", Settings: jsonSettings}.String()

	out := &Reachability{Sources: req.Sources, Destinations: req.Destinations, SinceMs: since.UnixMilli()}
	out.Cells = make([][]Cell, ns)
	for i := range out.Cells {
		out.Cells[i] = make([]Cell, nd)
		for j := range out.Cells[i] {
			out.Cells[i][j].Families = map[string]*CellFamily{"4": {}, "6": {}}
		}
	}
	qctx, cancel := context.WithTimeout(ctx, a.cfg.QueryTimeout)
	defer cancel()
	var rows []observedRow
	if err := decodeRows(qctx, a, sql, &rows); err != nil {
		return nil, err
	}
	for _, r := range rows {
		if r.Si < 0 || r.Si >= ns || r.Di < 0 || r.Di >= nd || (r.IPVersion != 4 && r.IPVersion != 6) {
			continue
		}
		f := out.Cells[r.Si][r.Di].Families[strconv.Itoa(r.IPVersion)]
		f.Observed.Flows += r.Flows
		f.Observed.LastSeenMs = max(f.Observed.LastSeenMs, r.LastMs)
		if f.Observed.Verdicts == nil {
			f.Observed.Verdicts = map[string]uint64{}
		}
		f.Observed.Verdicts[r.Verdict] += r.Flows
	}
	if a.cfg.Evaluator != nil {
		var observed [][]uint16
		if req.Port == 0 && flow.HasPorts(proto) {
			// Any port of a pod that declares none: the ports flows to
			// each destination were seen on.
			if observed, err = a.observedPorts(qctx, inner, dstArr, nd); err != nil {
				return nil, err
			}
		}
		m, err := a.cfg.Evaluator.EvaluateMatrix(ctx, req.Sources, req.Destinations, proto, req.Port, observed...)
		if err != nil {
			return nil, err // an *audit.TooLargeError is a 422
		}
		for i := range out.Cells {
			for j := range out.Cells[i] {
				for fam, fp := range m[i][j] {
					setPolicy(out.Cells[i][j].Families[strconv.Itoa(fam)], fp)
				}
			}
		}
	}
	if req.Trace {
		if a.cfg.Traces == nil {
			return nil, fmt.Errorf("traceflow: %w", ErrNotConfigured)
		}
		a.traceCells(ctx, req, proto, out)
	}
	for i := range out.Cells {
		for j := range out.Cells[i] {
			cell := &out.Cells[i][j]
			for _, f := range cell.Families {
				if f.Outcome == "" {
					f.Outcome = outcome(f)
				}
				f.Mismatch = mismatch(f)
			}
			cell.Reasons = asymmetry(cell.Families["4"], cell.Families["6"])
			cell.Asymmetric = len(cell.Reasons) > 0
			if cell.Asymmetric {
				out.Asymmetric++
			}
		}
	}
	out.ElapsedMs = time.Since(start).Milliseconds()
	return out, nil
}

// observedPorts are, per destination (the indices of dstArr), the
// destination ports of the flows of inner's window and protocol to it:
// the most frequent audit.MaxObservedPorts, in increasing order.
func (a *API) observedPorts(ctx context.Context, inner chsql.Select, dstArr string, nd int) ([][]uint16, error) {
	inner.Cols = "dst_port, " + strings.TrimPrefix(inner.Cols, "ingress_verdict, egress_verdict, ")
	sql := chsql.Select{Cols: "di, arraySort(topKWeighted(" + strconv.Itoa(audit.MaxObservedPorts) + ")(dst_port, n)) AS ports",
		From: "(" + inner.String() + ") ARRAY JOIN " + dstArr + " AS di", GroupBy: "di", Settings: jsonSettings}.String()
	var rows []struct {
		Di    int      `json:"di"`
		Ports []uint16 `json:"ports"`
	}
	if err := decodeRows(ctx, a, sql, &rows); err != nil {
		return nil, err
	}
	out := make([][]uint16, nd)
	for _, r := range rows {
		if r.Di >= 0 && r.Di < nd {
			out[r.Di] = r.Ports
		}
	}
	return out, nil
}

// setPolicy puts one family's evaluation into its cell family.
func setPolicy(f *CellFamily, fp *audit.FamilyPolicy) {
	f.Outcome, f.Reason = fp.Outcome, fp.Reason
	f.PairsAllowed, f.PairsTotal, f.Pairs, f.PairsTruncated = fp.Allowed, fp.Total, fp.Pairs, fp.Truncated
	switch fp.Outcome {
	case audit.OutcomeAllow, audit.OutcomeDeny, audit.OutcomePartial:
		v := fp.Summary
		f.Policy = &v
	case audit.OutcomeError:
		f.PolicyError = fp.Reason
	case "": // not evaluated (audit.ErrNotEvaluated): summed up from the flows
		f.PolicyError, f.Reason = fp.Reason, ""
	}
}

// evaluated reports whether f's outcome is the evaluated policy of its
// pairs.
func evaluated(f *CellFamily) bool {
	return f.Outcome == audit.OutcomeAllow && f.PairsTotal > 0 || f.Outcome == audit.OutcomeDeny && f.PairsTotal > 0 || f.Outcome == audit.OutcomePartial
}

// mismatch says how the evaluated policy and the flows observed or the
// trace disagree.
func mismatch(f *CellFamily) string {
	if !evaluated(f) {
		return ""
	}
	var r []string
	o := f.Observed
	dropped, passed := o.Verdicts["dropped"], o.Verdicts["allowed"]+o.Verdicts["not_isolated"]
	switch f.Outcome {
	case audit.OutcomeAllow:
		if dropped > 0 {
			r = append(r, fmt.Sprintf("policy allows every pair, but %d of %d observed flows were dropped", dropped, o.Flows))
		}
		if traceStopped(f) {
			r = append(r, "policy allows every pair, but the trace was "+string(f.Trace.Outcome))
		}
	case audit.OutcomeDeny:
		if passed > 0 {
			r = append(r, fmt.Sprintf("policy denies every pair, but %d of %d observed flows passed", passed, o.Flows))
		}
		if f.Trace != nil && f.Trace.Outcome == traceflow.Delivered {
			r = append(r, "policy denies every pair, but the trace was delivered")
		}
	}
	return strings.Join(r, "; ")
}

func hasKind(eps []audit.Endpoint, kind string) bool {
	return slices.ContainsFunc(eps, func(e audit.Endpoint) bool { return e.Kind == kind })
}

// outcome sums up a family the evaluator left without one (none
// configured, or not evaluated): the trace if one ran, else what was
// observed.
func outcome(f *CellFamily) string {
	switch {
	case f.Trace != nil && f.Trace.Outcome == traceflow.Delivered:
		return "allow"
	case traceStopped(f):
		return "deny"
	}
	v := f.Observed.Verdicts
	switch {
	case f.Observed.Flows == 0:
		return "unknown"
	case v["dropped"] > 0 && v["dropped"] == f.Observed.Flows:
		return "deny"
	case v["dropped"] == 0:
		return "allow"
	}
	return "mixed"
}

// traceStopped reports whether f's trace was dropped or rejected.
func traceStopped(f *CellFamily) bool {
	return f.Trace != nil && (f.Trace.Outcome == traceflow.Dropped || f.Trace.Outcome == traceflow.Rejected)
}

// asymmetry lists how the two families of a cell disagree.
func asymmetry(v4, v6 *CellFamily) []string {
	var r []string
	switch {
	case v4.Outcome == "unknown" || v6.Outcome == "unknown" || v4.Outcome == audit.OutcomeError || v6.Outcome == audit.OutcomeError:
	case v4.Outcome == audit.OutcomePartial && v6.Outcome == audit.OutcomePartial:
		if v4.PairsAllowed*v6.PairsTotal != v6.PairsAllowed*v4.PairsTotal {
			r = append(r, fmt.Sprintf("IPv4 %d of %d pairs allowed, IPv6 %d of %d", v4.PairsAllowed, v4.PairsTotal, v6.PairsAllowed, v6.PairsTotal))
		}
	case v4.Outcome != v6.Outcome:
		r = append(r, fmt.Sprintf("IPv4 %s, IPv6 %s", v4.Outcome, v6.Outcome))
	}
	if v4.Policy != nil && v6.Policy != nil && v4.Policy.Verdict != v6.Policy.Verdict {
		r = append(r, fmt.Sprintf("policy: IPv4 %s, IPv6 %s", v4.Policy.Verdict, v6.Policy.Verdict))
	}
	d4, d6 := v4.Observed.Verdicts["dropped"] > 0, v6.Observed.Verdicts["dropped"] > 0
	if v4.Observed.Flows > 0 && v6.Observed.Flows > 0 && d4 != d6 {
		r = append(r, "observed drops over one family only")
	}
	if (v4.Observed.Flows == 0) != (v6.Observed.Flows == 0) && !noPair(v4) && !noPair(v6) {
		r = append(r, "traffic observed over one family only")
	}
	return r
}

// noPair reports an outcome that says the family has nothing to carry
// traffic between the ends.
func noPair(f *CellFamily) bool {
	switch f.Outcome {
	case audit.OutcomeUnavailable, audit.OutcomeNoFamily, audit.OutcomeNoPort, audit.OutcomeNoBackends, audit.OutcomeSelf, audit.OutcomeError:
		return true
	}
	return false
}

// traceCells runs one trace per cell over the families it has a pair in
// (a dual trace when both: the families leave from and go to the same
// pods), at most traceConcurrency at once, all within TraceTimeout.
func (a *API) traceCells(ctx context.Context, req *ReachabilityRequest, proto uint8, out *Reachability) {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.TraceTimeout)
	defer cancel()
	sem := make(chan struct{}, traceConcurrency)
	var wg sync.WaitGroup
	for i := range out.Cells {
		for j := range out.Cells[i] {
			fams := map[traceflow.Family]*CellFamily{}
			for k, f := range map[string]traceflow.Family{"4": traceflow.IPv4, "6": traceflow.IPv6} {
				if cf := out.Cells[i][j].Families[k]; !noPair(cf) {
					fams[f] = cf
				}
			}
			family := traceflow.Dual
			switch {
			case len(fams) == 0:
				continue
			case fams[traceflow.IPv6] == nil:
				family = traceflow.IPv4
			case fams[traceflow.IPv4] == nil:
				family = traceflow.IPv6
			}
			wg.Go(func() {
				res, err := a.traceCell(ctx, sem, req.Sources[i], req.Destinations[j], proto, req.Port, family)
				if err != nil {
					for _, f := range fams {
						f.TraceError = err.Error()
					}
					return
				}
				for _, fr := range res.Families {
					if f := fams[fr.Family]; f != nil {
						f.Trace, f.TraceID = &fr, res.ID
					}
				}
			})
		}
	}
	wg.Wait()
}

// traceCell traces src → dst over family once a place of sem is free.
func (a *API) traceCell(ctx context.Context, sem chan struct{}, src, dst audit.Endpoint, proto uint8, port uint16, family traceflow.Family) (traceflow.Result, error) {
	tr := traceflow.Request{Family: family, Destination: traceflow.Destination{Port: port}}
	switch src.Kind {
	case "pod":
		tr.Source = src.Namespace + "/" + src.Name
	case "workload":
		tr.SourceWorkload = src.Namespace + "/" + src.Name
	default:
		return traceflow.Result{}, fmt.Errorf("a trace leaves from a pod or a workload, not from %s", src)
	}
	switch ref := dst.Namespace + "/" + dst.Name; dst.Kind {
	case "pod":
		tr.Destination.Pod = ref
	case "workload":
		tr.Destination.Workload = ref
	case "service":
		tr.Destination.Service = ref
	default:
		ip, err := netip.ParseAddr(dst.Name)
		if err != nil {
			return traceflow.Result{}, fmt.Errorf("a trace goes to one address, not to %s", dst)
		}
		tr.Destination.IP = ip
	}
	switch proto {
	case flow.ProtoTCP:
		tr.Protocol = traceflow.TCP
	case flow.ProtoUDP:
		tr.Protocol = traceflow.UDP
	case flow.ProtoICMP, flow.ProtoICMPv6:
		tr.Protocol = traceflow.ICMP
	default:
		return traceflow.Result{}, fmt.Errorf("protocol %d cannot be traced (TCP, UDP and ICMP can)", proto)
	}
	select {
	case sem <- struct{}{}:
		defer func() { <-sem }()
	case <-ctx.Done():
		return traceflow.Result{}, ctx.Err()
	}
	return a.cfg.Traces.Trace(ctx, tr)
}
