package audit

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/internal/chsql"
)

// ObservedFlow is the recorded flows of one group: between two ends
// (pods or addresses) over one family, protocol and destination port,
// addressed to one Service or none, with how many of their records were
// allowed, denied, or traceflow probes. Policy recommendations
// (package recommend) are built from a window's groups and replayed
// over them.
type ObservedFlow struct {
	// Src and Dst are the ends as enrichment named them: the address
	// (Dst after DNAT: a Service's endpoint), and for a pod its namespace,
	// name and workload.
	Src       FlowEnd `json:"src"`
	Dst       FlowEnd `json:"dst"`
	Protocol  uint8   `json:"protocol"` // IANA number
	DstPort   uint16  `json:"dst_port"`
	IPVersion uint8   `json:"ip_version"` // 4 or 6
	// ServiceNamespace and ServiceName are the Service the flows were
	// addressed to (dst_service_*, empty when none), ServicePort the
	// Service port (service_port).
	ServiceNamespace string `json:"service_namespace,omitempty"`
	ServiceName      string `json:"service_name,omitempty"`
	ServicePort      uint16 `json:"service_port,omitempty"`
	// Allowed and Denied count the ordinary records (not probes) whose
	// evaluated or reported verdict let them through, or denied or
	// rejected them on either side; Probes counts traceflow probe
	// records.
	Allowed uint64 `json:"allowed"`
	Denied  uint64 `json:"denied"`
	Probes  uint64 `json:"probes"`
}

// PodFlow is the policy view of a flow between two pods of view (nil:
// not a pod, or a host-network one: only the address counts) over the
// addresses given, with the destination's named port resolved: the flow
// the audit evaluates for the same ends.
func PodFlow(view *enrich.Snapshot, src *enrich.Pod, srcAddr netip.Addr, dst *enrich.Pod, dstAddr netip.Addr, proto uint8, port uint16) policy.Flow {
	return podFlow(view, src, srcAddr, dst, dstAddr, proto, port)
}

// VerdictsOf is a policy result as the audit's answers give it: both
// sides, each with its deciding policy and rule.
func VerdictsOf(r policy.Result) Verdicts { return verdicts(r) }

// WithProposed returns current with proposed added, a proposed policy
// replacing the current one of the same namespace and name: the policy
// set a what-if or a recommendation is evaluated with.
func WithProposed(current, proposed []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
	return withProposed(current, proposed)
}

// ObservedOptions select the flow groups ObservedFlows reads: those of a
// window with an end in a scope.
type ObservedOptions struct {
	Window
	// Namespace keeps the flows from or to a pod of it; with Workload,
	// from or to a pod of that workload of it. Neither: every flow.
	Namespace, Workload string
	// Limit bounds the groups read (default and at most
	// DefaultObservedMaxGroups): they are held in memory.
	Limit int
}

// DefaultObservedMaxGroups bounds the flow groups one ObservedFlows
// reads: about 250 bytes each in memory, with their strings, so at most
// about 250 MiB.
const DefaultObservedMaxGroups = 1_000_000

// observedGroup is the key of an observed flow group: the ends
// (addresses and pods), protocol, destination port, family and the
// Service addressed.
const observedGroup = whatIfGroup + `,
         dst_service_namespace, dst_service_name, service_port`

// observedBlocked is a record denied or rejected by either side, as
// dualflow evaluated it or the datapath reported it.
const observedBlocked = `(ingress_verdict IN ('denied', 'rejected') OR egress_verdict IN ('denied', 'rejected') OR ingress_reported_verdict IN ('denied', 'rejected') OR egress_reported_verdict IN ('denied', 'rejected'))`

// observedCounts are a group's allowed (a), denied (d) and probe (p)
// records, as the projection observed_1h of flows (migration 0014) sums
// them per hour: ClickHouse answers from it only for these very
// aggregates.
const observedCounts = `countIf(NOT is_probe AND NOT ` + observedBlocked + `) AS a,
       countIf(NOT is_probe AND ` + observedBlocked + `) AS d,
       countIf(is_probe) AS p`

// ObservedFlows returns the flow groups of the window with an end in the
// scope (the most records first, then by key: the same window gives the
// same groups), at most opt.Limit; truncated says more were left out.
// Records count as denied when the evaluated or reported verdict of
// either side denied or rejected them, and traceflow probes apart.
func (r *Reports) ObservedFlows(ctx context.Context, opt ObservedOptions) (flows []ObservedFlow, truncated bool, err error) {
	w, err := opt.Window.resolve()
	if err != nil {
		return nil, false, err
	}
	limit := cmp.Or(opt.Limit, DefaultObservedMaxGroups)
	if limit > DefaultObservedMaxGroups {
		return nil, false, &TooLargeError{Field: "limit", Message: fmt.Sprintf("limit %d: at most %d flow groups are read", limit, DefaultObservedMaxGroups)}
	}
	var scope []string
	side := func(end string) string {
		c := chsql.Eq(end+"_pod_namespace", opt.Namespace)
		if opt.Workload != "" {
			c = chsql.And(c, chsql.Eq(end+"_workload_name", opt.Workload))
		}
		return c
	}
	switch {
	case opt.Workload != "" && opt.Namespace == "":
		return nil, false, fmt.Errorf("workload %q needs its namespace", opt.Workload)
	case opt.Namespace != "":
		scope = append(scope, chsql.Or(side("src"), side("dst")))
	}
	// Each tier of the window (chsql.Tiers: whole hours, answered from
	// the projection observed_1h of migration 0014 when it covers them,
	// and the minutes and rows at either end) is grouped apart, with the
	// projection's own aggregates; the tiers are disjoint, so their sums
	// are the window's.
	var parts []string
	for _, t := range chsql.Tiers(chsql.FlowEndCol, w.Since, w.Until, true) {
		parts = append(parts, chsql.Select{Cols: observedGroup + ",\n       " + observedCounts, From: r.db + ".flows",
			Where: append([]string{t.Cond}, scope...), GroupBy: observedGroup}.String())
	}
	// The groups are read unordered and sorted here (sorting them by 17
	// columns took the engine a CPU-second per 100,000); only when there
	// are more than the limit does the engine order them, to keep the
	// first.
	read := func(order string) ([]observedRow, error) {
		return rows[observedRow](ctx, r.q, fmt.Sprintf(`SELECT %[1]s,
       sum(a) AS allowed, sum(d) AS denied, sum(p) AS probes
FROM (
%[2]s
)
GROUP BY %[1]s
%[3]sLIMIT %[4]d`, observedGroup, chsql.Union(parts...), order, limit+1), reportMaxMemory)
	}
	rs, err := read("")
	if err == nil && len(rs) > limit {
		rs, err = read("ORDER BY allowed + denied + probes DESC, " + observedGroup + "\n")
	}
	if err != nil {
		return nil, false, fmt.Errorf("observed flows: %w", err)
	}
	if len(rs) > limit {
		rs, truncated = rs[:limit], true
	}
	flows = make([]ObservedFlow, len(rs))
	for i, x := range rs {
		src, dst := x.ends()
		flows[i] = ObservedFlow{
			Src: src, Dst: dst,
			Protocol: x.Protocol, DstPort: x.DstPort, IPVersion: x.IPVersion,
			ServiceNamespace: x.SvcNS, ServiceName: x.SvcName, ServicePort: x.ServicePort,
			Allowed: x.Allowed, Denied: x.Denied, Probes: x.Probes,
		}
	}
	slices.SortFunc(flows, compareObserved)
	return flows, truncated, nil
}

// observedRow is a row of ObservedFlows' query.
type observedRow struct {
	flowGroupRow
	SvcNS       string `json:"dst_service_namespace"`
	SvcName     string `json:"dst_service_name"`
	ServicePort uint16 `json:"service_port"`
	Allowed     uint64 `json:"allowed"`
	Denied      uint64 `json:"denied"`
	Probes      uint64 `json:"probes"`
}

// compareObserved orders groups as ORDER BY allowed + denied + probes
// DESC, observedGroup orders them (strings byte by byte, as ClickHouse
// compares them without a collation).
func compareObserved(a, b ObservedFlow) int {
	return cmp.Or(
		cmp.Compare(b.Allowed+b.Denied+b.Probes, a.Allowed+a.Denied+a.Probes),
		strings.Compare(a.Src.IP, b.Src.IP), strings.Compare(a.Dst.IP, b.Dst.IP),
		cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.DstPort, b.DstPort), cmp.Compare(a.IPVersion, b.IPVersion),
		compareEnds(a.Src, b.Src), compareEnds(a.Dst, b.Dst),
		strings.Compare(a.ServiceNamespace, b.ServiceNamespace), strings.Compare(a.ServiceName, b.ServiceName),
		cmp.Compare(a.ServicePort, b.ServicePort))
}

// compareEnds orders two ends' pods by namespace, name, workload kind
// and name.
func compareEnds(a, b FlowEnd) int {
	return cmp.Or(strings.Compare(a.Namespace, b.Namespace), strings.Compare(a.Pod, b.Pod),
		strings.Compare(a.WorkloadKind, b.WorkloadKind), strings.Compare(a.WorkloadName, b.WorkloadName))
}
