package recommend

import (
	"cmp"
	"fmt"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
)

// ReplayReport is a recommendation replayed over observed flows, per
// family.
type ReplayReport struct {
	// Families are IPv4 then IPv6 (a family without flows is left out).
	Families []FamilyReplay `json:"families"`
}

// FamilyReplay is the replay of one family's flow groups.
type FamilyReplay struct {
	Family uint8 `json:"family"`
	// Allowed is the number of flow groups observed allowed (ordinary
	// records); Kept how many of them the policies with the
	// recommendation still allow.
	Allowed int `json:"allowed"`
	Kept    int `json:"kept"`
	// NewlyDenied are the groups observed allowed that the policies with
	// the recommendation deny; NewlyAllowed those observed only denied
	// that they allow.
	NewlyDenied  []ReplayedFlow `json:"newly_denied"`
	NewlyAllowed []ReplayedFlow `json:"newly_allowed"`
	// Probes is the number of groups of traceflow probes only: not
	// replayed.
	Probes int `json:"probes"`
}

// ReplayedFlow is a flow group whose verdict the recommendation changes.
type ReplayedFlow struct {
	audit.ObservedFlow
	// After is the verdict of both sides with the recommendation.
	After audit.Verdicts `json:"after"`
}

// Replay evaluates flows (any order) with the view's policies plus
// proposed (a proposed policy replaces the current one of the same
// namespace and name), with the audit's policy engine and the ends as
// the audit sees them (audit.PodFlow): per family, whether every group
// observed allowed stays allowed. A proposed policy the API would reject
// is an error.
func Replay(view *enrich.Snapshot, proposed []*networkingv1.NetworkPolicy, flows []audit.ObservedFlow) (*ReplayReport, error) {
	if _, err := policy.Compile(proposed); err != nil {
		return nil, fmt.Errorf("%w: %w", audit.ErrInvalidPolicy, err)
	}
	after, _ := policy.Compile(audit.WithProposed(view.NetworkPolicies, proposed)) // invalid current policies are ignored, as the Auditor does
	c := newCluster(view)
	var fams [2]FamilyReplay
	fams[0].Family, fams[1].Family = 4, 6
	var seen [2]bool
	for i := range flows {
		f := &flows[i]
		v := fi(f.IPVersion)
		seen[v] = true
		fr := &fams[v]
		if f.Allowed == 0 && f.Denied == 0 {
			fr.Probes++
			continue
		}
		pf := c.policyFlow(f)
		res := after.Evaluate(&pf)
		switch {
		case f.Allowed > 0:
			fr.Allowed++
			if res.Allowed() {
				fr.Kept++
			} else {
				fr.NewlyDenied = append(fr.NewlyDenied, ReplayedFlow{*f, audit.VerdictsOf(res)})
			}
		case res.Allowed():
			fr.NewlyAllowed = append(fr.NewlyAllowed, ReplayedFlow{*f, audit.VerdictsOf(res)})
		}
	}
	rep := &ReplayReport{}
	for v := range fams {
		if !seen[v] {
			continue
		}
		sortFlows(fams[v].NewlyDenied)
		sortFlows(fams[v].NewlyAllowed)
		rep.Families = append(rep.Families, fams[v])
	}
	return rep, nil
}

// policyFlow is observed flow f as the policy engine sees it: its ends
// resolved on the view (a pod that is gone stands for its workload
// through one of its pods), each with its node.
func (c *cluster) policyFlow(f *audit.ObservedFlow) policy.Flow {
	src, dst := c.resolve(f.Src), c.resolve(f.Dst)
	pod := func(e end) *enrich.Pod {
		if e.kind != endPod {
			return nil
		}
		if e.pod != nil {
			return e.pod
		}
		return e.wl.pods[0]
	}
	sp, dp := pod(src), pod(dst)
	pf := audit.PodFlow(c.view, sp, src.addr, dp, dst.addr, f.Protocol, f.DstPort)
	node := func(e end, p *enrich.Pod) string {
		switch {
		case p != nil:
			return p.NodeName
		case e.node != nil:
			return e.node.Name
		}
		return ""
	}
	pf.Src.Node, pf.Dst.Node = node(src, sp), node(dst, dp)
	return pf
}

func sortFlows(fs []ReplayedFlow) {
	slices.SortFunc(fs, func(a, b ReplayedFlow) int {
		return cmp.Or(cmp.Compare(a.Src.IP, b.Src.IP), cmp.Compare(a.Dst.IP, b.Dst.IP),
			cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.DstPort, b.DstPort))
	})
}

// String sums the replay up, one line per family.
func (r *ReplayReport) String() string {
	s := ""
	for _, f := range r.Families {
		s += fmt.Sprintf("IPv%d: %d of %d observed allowed flow groups stay allowed, %d newly denied, %d newly allowed, %d probe-only groups not replayed\n",
			f.Family, f.Kept, f.Allowed, len(f.NewlyDenied), len(f.NewlyAllowed), f.Probes)
	}
	return s
}
