package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/chsql"
)

// querier runs one read-only query and returns its output in a ClickHouse
// output format. store.Conn satisfies it, and so does a client of the
// ClickHouse HTTP interface.
type querier interface {
	Query(ctx context.Context, query, format string) ([]byte, error)
}

// Reports runs the audit reports over the flows table and the
// rollup_policy_1m rollup (docs/schema.md). Every query filters on time
// first, builds its literals from typed values (numbers, escaped strings),
// and never concatenates caller text into SQL unescaped. Safe for
// concurrent use if the querier is.
type Reports struct {
	q  querier
	db string
	// WhatIfLimits bound WhatIf; set them before the Reports are used.
	WhatIfLimits WhatIfLimits
}

// WhatIfLimits bound the work and the memory of one what-if. Zero fields
// take the defaults.
type WhatIfLimits struct {
	// MaxChecks bounds the policy checks of one what-if: every flow group
	// it reads, checked against the policies that may select its ends
	// (policy.Set.Tries), with the policies in force and with the
	// proposal. They are counted from the window's flow groups before any
	// is read; a what-if over more is refused (*TooLargeError). 0:
	// DefaultWhatIfMaxChecks.
	MaxChecks int64
	// MaxFlowGroups bounds the flow groups one what-if reads, its limit:
	// they are held in memory (about 2 KiB each, with the engine's share).
	// 0: DefaultWhatIfMaxFlowGroups.
	MaxFlowGroups int
}

// Defaults of WhatIfLimits. A policy check costs 10 to 60 ns (the more
// rules and peers, the more), so a what-if within DefaultWhatIfMaxChecks
// takes at most a few CPU-seconds; DefaultWhatIfMaxFlowGroups is the
// what-if's default limit, about 200 MiB.
const (
	DefaultWhatIfMaxChecks     = 50_000_000
	DefaultWhatIfMaxFlowGroups = 100_000
)

// whatIfMaxMemory bounds the engine's memory for the query that reads a
// what-if's flow groups; its aggregation spills to disk past half of it.
// It aggregates every flow group of the window that touches the proposal
// (MaxFlowGroups bounds the rows it returns, not the groups it sorts).
const whatIfMaxMemory = 512 << 20

// TooLargeError is returned by WhatIf for a what-if whose work would pass
// its bounds (WhatIfLimits), before it reads any flow: Field is the
// parameter to narrow (since or limit), Message says how. The API
// answers it 422.
type TooLargeError struct {
	Field, Message string
}

func (e *TooLargeError) Error() string { return e.Message }

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// NewReports returns reports over q in database db ("" is "dualflow").
func NewReports(q querier, db string) (*Reports, error) {
	db = cmp.Or(db, "dualflow")
	if !identRE.MatchString(db) {
		return nil, fmt.Errorf("audit reports: database %q: must be an identifier", db)
	}
	if q == nil {
		return nil, errors.New("audit reports: nil querier")
	}
	return &Reports{q: q, db: db}, nil
}

// Window is a time range [Since, Until). A zero Until is now.
type Window struct {
	Since, Until time.Time
}

func (w Window) resolve() (Window, error) {
	if w.Until.IsZero() {
		w.Until = time.Now()
	}
	if w.Since.IsZero() || !w.Since.Before(w.Until) {
		return w, fmt.Errorf("time window %s – %s: since must be set and before until", w.Since.Format(time.RFC3339), w.Until.Format(time.RFC3339))
	}
	return w, nil
}

// policyUnion is q over rollup_policy_1m of database db, once per tier
// of the window with the tier's condition first in Where, joined by UNION
// ALL. The tiers (chsql.Tiers on window_start) are whole hours, which the
// projection policy_1h answers (migration 0010), and the minutes at
// either end. They select the minutes window_start >= since AND
// window_start < until selects, since and until to the second.
func (w Window) policyUnion(db string, q chsql.Select) string {
	var parts []string
	q.From, q.Where = db+".rollup_policy_1m", append([]string{""}, q.Where...)
	for _, t := range chsql.Tiers("window_start", w.Since.Truncate(time.Second), w.Until.Truncate(time.Second), true) {
		q.Where[0] = t.Cond
		parts = append(parts, q.String())
	}
	return chsql.Union(parts...)
}

// ordinary leaves out the rows of traceflow probes (migration 0012): a
// trace is not traffic, and each click on a reachability cell sends one.
// The rollups the other reports read never sum them.
const ordinary = "NOT is_probe"

// reportMaxMemory bounds a report's memory as the web API bounds its own
// queries: aggregation and sorting spill to disk past half of it, the
// engine ends the query past it rather than let it take the process's
// memory.
const reportMaxMemory = 1 << 30

// rows runs query within maxMemory and decodes each JSONEachRow line into
// a new T.
func rows[T any](ctx context.Context, q querier, query string, maxMemory int64) ([]T, error) {
	out, err := q.Query(ctx, query+chsql.JSONSettings(maxMemory), "JSONEachRow")
	if err != nil {
		return nil, err
	}
	return chsql.Decode[T](out)
}

// DeniedOptions filter the denied-flows report.
type DeniedOptions struct {
	Window
	// Namespace keeps flows whose source or destination pod is in it.
	Namespace string
	// Namespaces, when not nil, keeps flows whose source or destination
	// pod is in one of them (what a namespace-scoped user may read).
	Namespaces []string
	// Family keeps IPv4 (4) or IPv6 (6) flows; 0 keeps both.
	Family uint8
	// Limit bounds the groups returned (default 1000).
	Limit int
}

// DeniedGroup is the denied flows of one policy rule between two workloads
// over one family, protocol and destination port, in one direction.
type DeniedGroup struct {
	Direction       string `json:"direction"`
	PolicyNamespace string `json:"policy_namespace"`
	PolicyName      string `json:"policy_name"`
	// Rule is -1 for a denial (the policy isolates, no rule allows).
	Rule int32 `json:"rule"`
	// Verdict is what dualflow evaluated, ReportedVerdict what the
	// datapath reported (either one denied or rejected).
	Verdict         string `json:"verdict"`
	ReportedVerdict string `json:"reported_verdict"`
	SrcNamespace    string `json:"src_namespace"`
	SrcWorkload     string `json:"src_workload"`
	DstNamespace    string `json:"dst_namespace"`
	DstWorkload     string `json:"dst_workload"`
	IPVersion       uint8  `json:"ip_version"`
	// Protocol is the flows' protocol (flow.ProtoName: TCP, UDP, SCTP,
	// ICMP, ICMPv6 or the number) and DstPort their destination port
	// after DNAT (for ICMP and ICMPv6 type*256+code, as in flows.dst_port).
	// Flows summed before migration 0013 have neither: "" and 0.
	Protocol string `json:"protocol"`
	DstPort  uint16 `json:"dst_port"`
	Records  uint64 `json:"records"`
	Packets  uint64 `json:"packets"`
	Bytes    uint64 `json:"bytes"`
	// First and Last are the first and last minute with such flows.
	First time.Time `json:"first"`
	Last  time.Time `json:"last"`
}

// Denied returns denied flows grouped by direction, policy and rule,
// source and destination workload, family, protocol and destination
// port, most records first. It
// reads rollup_policy_1m, where a flow counts once per direction that
// denied it (evaluated or reported).
func (r *Reports) Denied(ctx context.Context, opt DeniedOptions) ([]DeniedGroup, error) {
	w, err := opt.Window.resolve()
	if err != nil {
		return nil, err
	}
	where := []string{"(verdict IN ('denied', 'rejected') OR reported_verdict IN ('denied', 'rejected'))"}
	if opt.Namespace != "" {
		where = append(where, chsql.Or(chsql.Eq("src_pod_namespace", opt.Namespace), chsql.Eq("dst_pod_namespace", opt.Namespace)))
	}
	if opt.Namespaces != nil {
		where = append(where, chsql.Or(chsql.In("src_pod_namespace", opt.Namespaces), chsql.In("dst_pod_namespace", opt.Namespaces)))
	}
	switch opt.Family {
	case 0:
	case 4, 6:
		where = append(where, fmt.Sprintf("ip_version = %d", opt.Family))
	default:
		return nil, fmt.Errorf("family %d: want 4, 6 or 0 (both)", opt.Family)
	}
	limit := cmp.Or(opt.Limit, 1000)
	// Summed per tier: whole hours from the projection policy_1h, the
	// minutes at the ends as rows (policyUnion).
	const keys = `direction, policy_namespace, policy_name, policy_rule, verdict, reported_verdict,
         src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name, ip_version, protocol, dst_port`
	inner := w.policyUnion(r.db, chsql.Select{Cols: keys + ", sum(records) AS r, sum(packets) AS p, sum(bytes) AS b, min(window_start) AS f, max(window_start) AS l",
		Where: where, GroupBy: keys})
	q := fmt.Sprintf(`SELECT toString(direction) AS direction, policy_namespace, policy_name, policy_rule AS rule,
       toString(verdict) AS verdict, toString(reported_verdict) AS reported_verdict,
       src_pod_namespace AS src_namespace, src_workload_name AS src_workload,
       dst_pod_namespace AS dst_namespace, dst_workload_name AS dst_workload, ip_version,
       protocol AS protocol_number, dst_port,
       sum(r) AS records, sum(p) AS packets, sum(b) AS bytes,
       toUnixTimestamp(min(f)) AS first_unix, toUnixTimestamp(max(l)) AS last_unix
FROM (%s)
GROUP BY %s
ORDER BY records DESC, direction, policy_namespace, policy_name, rule, src_namespace, src_workload, dst_namespace, dst_workload, ip_version, protocol_number, dst_port
LIMIT %d`, inner, keys, limit)
	type row struct {
		DeniedGroup
		ProtocolNumber uint8 `json:"protocol_number"`
		FirstUnix      int64 `json:"first_unix"`
		LastUnix       int64 `json:"last_unix"`
	}
	rs, err := rows[row](ctx, r.q, q, reportMaxMemory)
	if err != nil {
		return nil, fmt.Errorf("denied flows: %w", err)
	}
	out := make([]DeniedGroup, len(rs))
	for i, x := range rs {
		out[i] = x.DeniedGroup
		out[i].First, out[i].Last = time.Unix(x.FirstUnix, 0).UTC(), time.Unix(x.LastUnix, 0).UTC()
		if x.ProtocolNumber != 0 { // 0: summed before migration 0013
			out[i].Protocol = flow.ProtoName(x.ProtocolNumber)
		}
	}
	return out, nil
}

// RuleRef names one rule of a NetworkPolicy.
type RuleRef struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Direction string `json:"direction"`
	Rule      int32  `json:"rule"`
}

func (r RuleRef) String() string {
	return fmt.Sprintf("%s rule %d of NetworkPolicy %s/%s", r.Direction, r.Rule, r.Namespace, r.Name)
}

// UnusedReport lists the policy rules that allowed no flow in a window.
type UnusedReport struct {
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// Decisions is the number of evaluated (flow, direction) decisions in
	// the window: with none, every rule is unused for lack of data.
	Decisions uint64 `json:"decisions"`
	// Rules are the unused rules, in policy and rule order.
	Rules []UnusedRule `json:"rules"`
	// Used is how many flow records each rule allowed.
	Used map[string]uint64 `json:"used"`
}

// UnusedRule is a rule that allowed no flow.
type UnusedRule struct {
	RuleRef
	Message string `json:"message"`
}

// Unused returns the rules of pols (in their effective directions) that
// were the deciding rule of no flow in the window. A rule shadowed by an
// earlier rule that allows the same flows counts as unused too: the
// report is about the rules that decided.
func (r *Reports) Unused(ctx context.Context, pols []*networkingv1.NetworkPolicy, win Window) (*UnusedReport, error) {
	w, err := win.resolve()
	if err != nil {
		return nil, err
	}
	type useRow struct {
		Direction string `json:"direction"`
		Namespace string `json:"policy_namespace"`
		Name      string `json:"policy_name"`
		Rule      int32  `json:"policy_rule"`
		Records   uint64 `json:"records"`
	}
	const rule = "direction, policy_namespace, policy_name, policy_rule"
	inner := w.policyUnion(r.db, chsql.Select{Cols: rule + ", sum(records) AS r", Where: []string{"verdict = 'allowed'", "policy_rule >= 0"}, GroupBy: rule})
	q := `SELECT toString(direction) AS direction, policy_namespace, policy_name, policy_rule, sum(r) AS records FROM (` + inner + `) GROUP BY ` + rule
	used, err := rows[useRow](ctx, r.q, q, reportMaxMemory)
	if err != nil {
		return nil, fmt.Errorf("rule use: %w", err)
	}
	type totalRow struct {
		Decisions uint64 `json:"decisions"`
	}
	total, err := rows[totalRow](ctx, r.q, "SELECT sum(n) AS decisions FROM ("+w.policyUnion(r.db, chsql.Select{Cols: "sum(records) AS n", Where: []string{"verdict != 'unknown'"}})+")", reportMaxMemory)
	if err != nil {
		return nil, fmt.Errorf("rule use: %w", err)
	}
	rep := &UnusedReport{Since: w.Since.UTC(), Until: w.Until.UTC(), Used: map[string]uint64{}, Rules: []UnusedRule{}}
	if len(total) == 1 {
		rep.Decisions = total[0].Decisions
	}
	for _, u := range used {
		rep.Used[RuleRef{u.Namespace, u.Name, u.Direction, u.Rule}.String()] += u.Records
	}
	sorted := slices.Clone(pols)
	slices.SortFunc(sorted, func(a, b *networkingv1.NetworkPolicy) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for _, p := range sorted {
		in, eg := policy.Types(p)
		check := func(dir string, n int) {
			for i := range n {
				ref := RuleRef{p.Namespace, p.Name, dir, int32(i)}
				if rep.Used[ref.String()] > 0 {
					continue
				}
				rep.Rules = append(rep.Rules, UnusedRule{RuleRef: ref,
					Message: fmt.Sprintf("%s allowed no flow between %s and %s.", ref, w.Since.UTC().Format(time.RFC3339), w.Until.UTC().Format(time.RFC3339))})
			}
		}
		if in {
			check("ingress", len(p.Spec.Ingress))
		}
		if eg {
			check("egress", len(p.Spec.Egress))
		}
	}
	return rep, nil
}

// ObservedGaps finds dual-stack gaps in the recorded flows of a window,
// per source workload, destination workload, protocol and destination
// port: traffic allowed over one family and denied over the other
// (KindObservedVerdictGap, from the evaluated or reported verdicts), and,
// when view is given, traffic seen over one family only although both
// workloads have dual-stack pods (KindObservedOneFamily). ICMP and ICMPv6
// count as one protocol (see icmpProtoKey): a ping over both families is
// not "IPv4 only" and "IPv6 only". At most limit
// (default 10000) workload pairs and ports are examined.
func (r *Reports) ObservedGaps(ctx context.Context, view *enrich.Snapshot, win Window, limit int) ([]Finding, error) {
	w, err := win.resolve()
	if err != nil {
		return nil, err
	}
	const blocked = "('denied', 'rejected')"
	q := fmt.Sprintf(`SELECT src_pod_namespace AS src_namespace, src_workload_kind AS src_kind, src_workload_name AS src_name,
       dst_pod_namespace AS dst_namespace, dst_workload_kind AS dst_kind, dst_workload_name AS dst_name,
       proto_key AS protocol, port_key AS dst_port,
       countIf(ip_version = 4 AND NOT blocked) AS allowed4, countIf(ip_version = 6 AND NOT blocked) AS allowed6,
       countIf(ip_version = 4 AND blocked) AS blocked4, countIf(ip_version = 6 AND blocked) AS blocked6
FROM (
    SELECT src_pod_namespace, src_workload_kind, src_workload_name, dst_pod_namespace, dst_workload_kind, dst_workload_name,
           %[5]s AS proto_key, %[6]s AS port_key, ip_version,
           ingress_verdict IN %[3]s OR egress_verdict IN %[3]s OR ingress_reported_verdict IN %[3]s OR egress_reported_verdict IN %[3]s AS blocked
    FROM %[1]s.flows
    WHERE %[2]s AND `+ordinary+` AND src_workload_name != '' AND dst_workload_name != ''
)
GROUP BY src_namespace, src_kind, src_name, dst_namespace, dst_kind, dst_name, proto_key, port_key
HAVING NOT (allowed4 > 0 AND allowed6 > 0)
ORDER BY src_namespace, src_kind, src_name, dst_namespace, dst_kind, dst_name, proto_key, port_key
LIMIT %[4]d`, r.db, chsql.FlowEnd(w.Since, w.Until), blocked, cmp.Or(limit, 10000), icmpProtoKey, icmpPortKey)
	type row struct {
		SrcNamespace string `json:"src_namespace"`
		SrcKind      string `json:"src_kind"`
		SrcName      string `json:"src_name"`
		DstNamespace string `json:"dst_namespace"`
		DstKind      string `json:"dst_kind"`
		DstName      string `json:"dst_name"`
		Protocol     uint8  `json:"protocol"`
		DstPort      uint16 `json:"dst_port"`
		Allowed4     uint64 `json:"allowed4"`
		Allowed6     uint64 `json:"allowed6"`
		Blocked4     uint64 `json:"blocked4"`
		Blocked6     uint64 `json:"blocked6"`
	}
	rs, err := rows[row](ctx, r.q, q, reportMaxMemory)
	if err != nil {
		return nil, fmt.Errorf("observed dual-stack gaps: %w", err)
	}
	dual := map[Ref]bool{}
	if view != nil {
		for _, p := range view.Pods {
			if dualStack(p) && !p.HostNetwork {
				dual[workloadRef(p.Namespace, view.Workload(p))] = true
			}
		}
	}
	window := fmt.Sprintf("between %s and %s", w.Since.UTC().Format(time.RFC3339), w.Until.UTC().Format(time.RFC3339))
	var out []Finding
	for _, x := range rs {
		src := Ref{Kind: x.SrcKind, Namespace: x.SrcNamespace, Name: x.SrcName}
		dst := Ref{Kind: x.DstKind, Namespace: x.DstNamespace, Name: x.DstName}
		proto, on := flow.ProtoName(x.Protocol), portText(x.Protocol, x.DstPort)
		switch {
		case x.Allowed4 > 0 && x.Blocked6 > 0 || x.Allowed6 > 0 && x.Blocked4 > 0:
			ok, bad, nOK, nBad := 4, 6, x.Allowed4, x.Blocked6
			if x.Allowed6 > 0 {
				ok, bad, nOK, nBad = 6, 4, x.Allowed6, x.Blocked4
			}
			out = append(out, Finding{Kind: KindObservedVerdictGap, Objects: []Ref{src.as(RoleSource), dst.as(RoleDestination)}, Port: x.DstPort, Protocol: proto, Count: nOK + nBad,
				Message: fmt.Sprintf("Flows %s → %s on %s were allowed over IPv%d (%d records) but denied over IPv%d (%d records) %s.",
					src, dst, on, ok, nOK, bad, nBad, window)})
		case view != nil && dual[src] && dual[dst] && (x.Allowed4 > 0) != (x.Allowed6 > 0) && x.Blocked4+x.Blocked6 == 0:
			seen, missing, n := 4, 6, x.Allowed4
			if x.Allowed6 > 0 {
				seen, missing, n = 6, 4, x.Allowed6
			}
			out = append(out, Finding{Kind: KindObservedOneFamily, Objects: []Ref{src.as(RoleSource), dst.as(RoleDestination)}, Port: x.DstPort, Protocol: proto, Count: n,
				Message: fmt.Sprintf("%s → %s on %s was seen over IPv%d only (%d records) %s although both have dual-stack pods, so IPv%d is never used or never works.",
					src, dst, on, seen, n, window, missing)})
		}
	}
	Describe(out)
	return out, nil
}

// ICMP and ICMPv6 are one protocol when the families are compared: a
// ping over each family is the same ping. icmpProtoKey groups ICMPv6
// (58) with ICMP (1); icmpPortKey maps the ICMPv6 echo types in dst_port
// (type<<8 | code: echo request 128, echo reply 129) to their ICMP
// numbers (8, 0), so both families' pings share a key.
const (
	icmpProtoKey = "if(protocol = 58, toUInt8(1), protocol)"
	icmpPortKey  = "toUInt16(if(protocol = 58, multiIf(intDiv(dst_port, 256) = 128, 2048 + dst_port % 256, intDiv(dst_port, 256) = 129, dst_port % 256, dst_port), dst_port))"
)

// portText names a destination port of a finding: "9090/TCP", or for
// ICMP (the ICMP numbering, see icmpPortKey) the message type.
func portText(proto uint8, port uint16) string {
	if proto != flow.ProtoICMP {
		return fmt.Sprintf("%d/%s", port, flow.ProtoName(proto))
	}
	switch typ, code := port>>8, port&0xff; {
	case typ == 8 && code == 0:
		return "ping (ICMP/ICMPv6 echo request)"
	case typ == 0 && code == 0:
		return "ping reply (ICMP/ICMPv6 echo reply)"
	default:
		return fmt.Sprintf("ICMP type %d code %d", typ, code)
	}
}

// SideVerdict is one side's decision in report form.
type SideVerdict struct {
	Verdict   string `json:"verdict"`
	Namespace string `json:"policy_namespace,omitempty"`
	Name      string `json:"policy_name,omitempty"`
	Rule      int32  `json:"rule"`
}

func sideVerdict(d policy.Decision) SideVerdict {
	return SideVerdict{Verdict: d.Verdict.String(), Namespace: d.Namespace, Name: d.Name, Rule: d.Rule}
}

// Verdicts are both sides of a flow.
type Verdicts struct {
	Allowed bool        `json:"allowed"`
	Egress  SideVerdict `json:"egress"`
	Ingress SideVerdict `json:"ingress"`
}

func verdicts(r policy.Result) Verdicts {
	return Verdicts{Allowed: r.Allowed(), Egress: sideVerdict(r.Egress), Ingress: sideVerdict(r.Ingress)}
}

// FlowEnd is one end of a recorded flow.
type FlowEnd struct {
	IP           string `json:"ip"`
	Namespace    string `json:"namespace,omitempty"`
	Pod          string `json:"pod,omitempty"`
	WorkloadKind string `json:"workload_kind,omitempty"`
	WorkloadName string `json:"workload_name,omitempty"`
}

// Change values of WhatIfFlow.
const (
	ChangeNewlyDenied  = "newly-denied"
	ChangeNewlyAllowed = "newly-allowed"
)

// WhatIfFlow is a recorded flow whose verdict the proposed policies change.
type WhatIfFlow struct {
	Src       FlowEnd   `json:"src"`
	Dst       FlowEnd   `json:"dst"`
	Protocol  string    `json:"protocol"`
	DstPort   uint16    `json:"dst_port"`
	IPVersion uint8     `json:"ip_version"`
	Records   uint64    `json:"records"`
	LastSeen  time.Time `json:"last_seen"`
	Change    string    `json:"change"`
	Before    Verdicts  `json:"before"`
	After     Verdicts  `json:"after"`
}

// WhatIfReport is the result of WhatIf.
type WhatIfReport struct {
	Since time.Time `json:"since"`
	Until time.Time `json:"until"`
	// Flows is the number of distinct flows (addresses, protocol,
	// destination port) re-evaluated; Truncated says the limit cut them.
	Flows     int          `json:"flows"`
	Truncated bool         `json:"truncated"`
	Changes   []WhatIfFlow `json:"changes"`
	// Cells are the reachability cells whose verdict changes in a
	// family, Pairs their pod pairs that change (each once); a cell lists
	// at most 64 pairs per family, and a what-if 10,000 in all:
	// PairsTruncated says pairs of a changed cell were not listed.
	Cells          []WhatIfCell `json:"cells"`
	Pairs          []WhatIfPair `json:"pairs"`
	PairsTruncated bool         `json:"pairs_truncated"`
	// CellsSkipped, when not empty, says why the cells were not
	// evaluated (they cover more pod pairs, or need more policy checks,
	// than a what-if makes): the flows are still answered.
	CellsSkipped string `json:"cells_skipped,omitempty"`
}

// whatIfGroup is the key of a what-if's flow group: a flow (addresses,
// protocol, destination port) between two pods (or addresses).
const whatIfGroup = `src_ip, dst_ip, protocol, dst_port, ip_version,
         src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name,
         dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name`

// flowGroupRow is a row's whatIfGroup columns: the flow and its two ends.
type flowGroupRow struct {
	SrcIP     string `json:"src_ip"`
	DstIP     string `json:"dst_ip"`
	Protocol  uint8  `json:"protocol"`
	DstPort   uint16 `json:"dst_port"`
	IPVersion uint8  `json:"ip_version"`
	SrcNS     string `json:"src_pod_namespace"`
	SrcPod    string `json:"src_pod_name"`
	SrcKind   string `json:"src_workload_kind"`
	SrcName   string `json:"src_workload_name"`
	DstNS     string `json:"dst_pod_namespace"`
	DstPod    string `json:"dst_pod_name"`
	DstKind   string `json:"dst_workload_kind"`
	DstName   string `json:"dst_workload_name"`
}

// ends returns the row's source and destination as FlowEnds.
func (x *flowGroupRow) ends() (src, dst FlowEnd) {
	return FlowEnd{IP: x.SrcIP, Namespace: x.SrcNS, Pod: x.SrcPod, WorkloadKind: x.SrcKind, WorkloadName: x.SrcName},
		FlowEnd{IP: x.DstIP, Namespace: x.DstNS, Pod: x.DstPod, WorkloadKind: x.DstKind, WorkloadName: x.DstName}
}

// WhatIf re-evaluates the distinct flows recorded in the window (source and
// destination address, protocol, destination port; the most frequent
// first, at most limit, default WhatIfLimits.MaxFlowGroups) with the
// policies of view and with those policies plus proposed (a proposed
// policy replaces the one of the same namespace and name), and returns
// the flows whose verdict changes. Only the flows from or to a pod of a
// namespace of the proposed policies can change (a policy selects pods of
// its own namespace), so only those are read. Pod labels are the recorded
// ones; namespace labels and named ports come from view.
//
// It evaluates the reachability cells of view the same way (whatif.go):
// every workload with a pod in those namespaces from every workload of
// view and to every other one, and the Services in front of them or of
// the others, on any port of TCP (and of UDP and SCTP where a
// destination declares or was seen on one: the matrix's ports, declared
// or observed in the flows read), and returns the cells and pod pairs
// whose verdict changes, per family.
//
// An invalid proposed policy is an error; so is a what-if past
// r.WhatIfLimits (*TooLargeError), before any flow is read or pair
// evaluated: the flow groups and the cells' pod pairs share MaxChecks.
func (r *Reports) WhatIf(ctx context.Context, view *enrich.Snapshot, proposed []*networkingv1.NetworkPolicy, win Window, limit int) (*WhatIfReport, error) {
	w, err := win.resolve()
	if err != nil {
		return nil, err
	}
	if _, err := policy.Compile(proposed); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidPolicy, err)
	}
	lim := r.WhatIfLimits
	lim.MaxChecks = cmp.Or(lim.MaxChecks, DefaultWhatIfMaxChecks)
	lim.MaxFlowGroups = cmp.Or(lim.MaxFlowGroups, DefaultWhatIfMaxFlowGroups)
	limit = cmp.Or(limit, lim.MaxFlowGroups)
	if limit > lim.MaxFlowGroups {
		return nil, &TooLargeError{Field: "limit", Message: fmt.Sprintf("limit %d: a what-if reads at most %d flow groups", limit, lim.MaxFlowGroups)}
	}
	before, _ := policy.Compile(view.NetworkPolicies) // invalid current policies are ignored, as the Auditor does
	after, _ := policy.Compile(withProposed(view.NetworkPolicies, proposed))
	rep := &WhatIfReport{Since: w.Since.UTC(), Until: w.Until.UTC(), Changes: []WhatIfFlow{}, Cells: []WhatIfCell{}, Pairs: []WhatIfPair{}}
	var touched []string
	for _, p := range proposed {
		touched = append(touched, p.Namespace)
	}
	slices.Sort(touched)
	touched = slices.Compact(touched)
	if len(touched) == 0 {
		return rep, nil
	}
	where := chsql.FlowEnd(w.Since, w.Until) + " AND " + ordinary + " AND " + chsql.Or(chsql.In("src_pod_namespace", touched), chsql.In("dst_pod_namespace", touched))
	groups, checks, err := r.whatIfWork(ctx, where, before, after, limit)
	if err != nil {
		return nil, fmt.Errorf("what-if: %w", err)
	}
	var observed map[observedKey][]uint16
	if mine, _ := scopeWorkloads(view, touched); len(mine) > 0 {
		if observed, err = r.whatIfObserved(ctx, where); err != nil {
			return nil, fmt.Errorf("what-if: %w", err)
		}
	}
	cells, err := whatIfCells(ctx, view, touched, observed)
	if err != nil {
		return nil, fmt.Errorf("what-if: %w", err)
	}
	pairs, cellChecks := cells.cost(before, after)
	ns := "namespace "
	if len(touched) > 1 {
		ns = "namespaces "
	}
	ns += strings.Join(touched, ", ")
	// The flows are the what-if's answer; its cells are evaluated when
	// they fit in what the flows leave of the bound, and otherwise
	// skipped with the reason (a proposal in a large or heavily policied
	// cluster still gets its flows).
	if checks > lim.MaxChecks {
		return nil, &TooLargeError{Field: "since", Message: fmt.Sprintf("the what-if would read about %d flow groups from or to %s and make about %d policy checks "+
			"(each group against the policies that may select its ends, before and after the proposal), more than the %d allowed: "+
			"narrow the window (since, until) or lower limit",
			min(groups, int64(limit)), ns, checks, lim.MaxChecks)}
	}
	switch {
	case pairs > whatIfMaxPairs:
		rep.CellsSkipped = fmt.Sprintf("the reachability cells of %s (its workloads to and from every workload and Service) cover %d pod pairs, more than the %d a what-if evaluates: propose policies for fewer namespaces to see them", ns, pairs, whatIfMaxPairs)
	case checks+cellChecks > lim.MaxChecks:
		rep.CellsSkipped = fmt.Sprintf("the reachability cells of %s (%d pod pairs) need about %d policy checks, more than the %d the flows leave of the what-if's %d: propose policies for fewer namespaces, or narrow the window, to see them", ns, pairs, cellChecks, lim.MaxChecks-checks, lim.MaxChecks)
	}
	if err := r.whatIfFlows(ctx, view, where, before, after, groups, limit, rep); err != nil {
		return nil, err
	}
	if rep.CellsSkipped == "" {
		cells.evaluate(before, after, rep)
	}
	return rep, nil
}

// whatIfFlows reads where's flow groups (at most limit; none if groups
// is 0) and puts those whose verdict changes from before to after into
// rep.
func (r *Reports) whatIfFlows(ctx context.Context, view *enrich.Snapshot, where string, before, after *policy.Set, groups int64, limit int, rep *WhatIfReport) error {
	if groups == 0 {
		return nil
	}
	q := fmt.Sprintf(`SELECT src_ip, dst_ip, protocol, dst_port, ip_version,
       src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name, any(src_pod_labels) AS src_labels,
       dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name, any(dst_pod_labels) AS dst_labels,
       count() AS records, toUnixTimestamp64Milli(max(flow_end)) AS last_ms
FROM %s.flows
WHERE %s
GROUP BY %s
ORDER BY records DESC, src_ip, dst_ip, protocol, dst_port
LIMIT %d`, r.db, where, whatIfGroup, limit+1)
	type row struct {
		flowGroupRow
		SrcLabels map[string]string `json:"src_labels"`
		DstLabels map[string]string `json:"dst_labels"`
		Records   uint64            `json:"records"`
		LastMS    int64             `json:"last_ms"`
	}
	rs, err := rows[row](ctx, r.q, q, whatIfMaxMemory)
	if err != nil {
		return fmt.Errorf("what-if: %w", err)
	}
	if len(rs) > limit {
		rs, rep.Truncated = rs[:limit], true
	}
	rep.Flows = len(rs)
	peer := func(ip, ns string, lbls map[string]string) policy.Peer {
		a, _ := netip.ParseAddr(ip)
		p := policy.Peer{Addr: a.Unmap()}
		if ns != "" {
			p.IsPod, p.Namespace, p.Labels = true, ns, lbls
			p.NamespaceLabels, _ = namespaceLabels(view, ns)
		}
		return p
	}
	for _, x := range rs {
		f := policy.Flow{Src: peer(x.SrcIP, x.SrcNS, x.SrcLabels), Dst: peer(x.DstIP, x.DstNS, x.DstLabels), Proto: x.Protocol, DstPort: x.DstPort}
		if f.Dst.IsPod {
			f.Dst.PortName = portName(view, PortQuery{Namespace: x.DstNS, Pod: x.DstPod, Addr: f.Dst.Addr, Port: x.DstPort, Proto: x.Protocol})
		}
		b, a := before.Evaluate(&f), after.Evaluate(&f)
		if b.Allowed() == a.Allowed() {
			continue
		}
		change := ChangeNewlyDenied
		if a.Allowed() {
			change = ChangeNewlyAllowed
		}
		src, dst := x.ends()
		rep.Changes = append(rep.Changes, WhatIfFlow{
			Src: src, Dst: dst,
			Protocol: flow.ProtoName(x.Protocol), DstPort: x.DstPort, IPVersion: x.IPVersion, Records: x.Records,
			LastSeen: time.UnixMilli(x.LastMS).UTC(), Change: change, Before: verdicts(b), After: verdicts(a),
		})
	}
	return nil
}

// whatIfWork counts, without reading them, the flow groups a what-if
// reads (those of where, at most limit) and the policy checks it makes
// for them with the policies before and after. The groups are counted per
// side and pod (namespace and labels, which decide the policies that may
// select an end) with uniqCombined64(12): a few KiB per pod whatever the
// groups, within about 2% above a few thousand groups. Past limit, the
// costliest groups are counted: the what-if reads the most frequent
// ones, which may be those.
func (r *Reports) whatIfWork(ctx context.Context, where string, before, after *policy.Set, limit int) (groups, checks int64, err error) {
	count := func(side string) string {
		return fmt.Sprintf(`SELECT '%[1]s' AS side, %[1]s_pod_namespace AS namespace, %[1]s_pod_labels AS labels, uniqCombined64(12)(%[2]s) AS groups
FROM %[3]s.flows WHERE %[4]s GROUP BY namespace, labels`, side, whatIfGroup, r.db, where)
	}
	type row struct {
		Side      string            `json:"side"`
		Namespace string            `json:"namespace"`
		Labels    map[string]string `json:"labels"`
		Groups    int64             `json:"groups"`
	}
	rs, err := rows[row](ctx, r.q, chsql.Union(count("src"), count("dst")), reportMaxMemory)
	if err != nil {
		return 0, 0, fmt.Errorf("count flow groups: %w", err)
	}
	type cost struct{ groups, tries int64 }
	var src, dst []cost
	for _, x := range rs {
		peer := policy.Peer{IsPod: x.Namespace != "", Namespace: x.Namespace, Labels: x.Labels}
		d, side := policy.Egress, &src
		if x.Side == "dst" {
			d, side = policy.Ingress, &dst
			groups += x.Groups
		}
		*side = append(*side, cost{x.Groups, int64(before.Tries(d, &peer) + after.Tries(d, &peer))})
	}
	for _, side := range [][]cost{src, dst} {
		slices.SortFunc(side, func(a, b cost) int { return cmp.Compare(b.tries, a.tries) })
		left := int64(limit)
		for _, c := range side {
			n := min(c.groups, left)
			checks += n * c.tries
			if left -= n; left == 0 {
				break
			}
		}
	}
	return groups, checks, nil
}

// ErrInvalidPolicy is returned by WhatIf for a proposed policy the API
// would reject.
var ErrInvalidPolicy = errors.New("invalid proposed policy")

// withProposed returns current with proposed added, a proposed policy
// replacing the current one of the same namespace and name.
func withProposed(current, proposed []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
	replaced := map[[2]string]bool{}
	for _, p := range proposed {
		replaced[[2]string{p.Namespace, p.Name}] = true
	}
	var out []*networkingv1.NetworkPolicy
	for _, p := range current {
		if !replaced[[2]string{p.Namespace, p.Name}] {
			out = append(out, p)
		}
	}
	return append(out, proposed...)
}

// ParseProto accepts tcp, udp, sctp, icmp, icmpv6 or an IANA number.
func ParseProto(s string) (uint8, error) {
	switch strings.ToLower(s) {
	case "", "tcp":
		return flow.ProtoTCP, nil
	case "udp":
		return flow.ProtoUDP, nil
	case "sctp":
		return flow.ProtoSCTP, nil
	case "icmp":
		return flow.ProtoICMP, nil
	case "icmpv6":
		return flow.ProtoICMPv6, nil
	}
	n, err := strconv.ParseUint(s, 10, 8)
	if err != nil {
		return 0, fmt.Errorf("protocol %q: want tcp, udp, sctp, icmp, icmpv6 or a number", s)
	}
	return uint8(n), nil
}

// ParseSince reads a duration back from now ("1h", "90m") or an RFC 3339
// time.
func ParseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("%q: want a positive duration", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q: want a duration (1h) or an RFC 3339 time", s)
	}
	return t, nil
}
