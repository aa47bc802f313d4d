package api

import (
	"context"
	"fmt"
	"strconv"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/flow"
)

// Resolver turns an endpoint into the policy peer of each IP family it
// has an address of (4 and/or 6): for a workload or Service a
// representative pod, for an ip endpoint the address alone. It is what
// the caller provides from the enrichment indexes.
type Resolver interface {
	Resolve(ctx context.Context, e Endpoint) (map[int]policy.Peer, error)
}

// PolicyEvaluator is an Evaluator over compiled NetworkPolicies: it
// resolves both ends per family and evaluates the flow with each family's
// addresses, so ipBlock rules that cover one family only show up as a
// difference between the families.
type PolicyEvaluator struct {
	// Policies returns the policies in use (audit.Auditor.Policies); nil
	// or a nil Set isolates nothing.
	Policies func() *policy.Set
	Resolver Resolver
	// PortName returns the name of the destination's container port that
	// serves proto/port (named-port rules); nil: unnamed.
	PortName func(dst Endpoint, proto uint8, port uint16) string
}

var _ Evaluator = PolicyEvaluator{}

// Evaluate implements Evaluator.
func (p PolicyEvaluator) Evaluate(ctx context.Context, src, dst Endpoint, proto uint8, port uint16) (map[int]PolicyVerdict, error) {
	sp, err := p.Resolver.Resolve(ctx, src)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", src, err)
	}
	dp, err := p.Resolver.Resolve(ctx, dst)
	if err != nil {
		return nil, fmt.Errorf("destination %s: %w", dst, err)
	}
	var set *policy.Set
	if p.Policies != nil {
		set = p.Policies()
	}
	out := map[int]PolicyVerdict{}
	for _, fam := range []int{4, 6} {
		s, ok1 := sp[fam]
		d, ok2 := dp[fam]
		if !ok1 || !ok2 {
			continue
		}
		if p.PortName != nil {
			d.PortName = p.PortName(dst, proto, port)
		}
		f := policy.Flow{Src: s, Dst: d, Proto: proto, DstPort: port}
		res := set.Evaluate(&f)
		out[fam] = PolicyVerdict{
			Verdict: overall(res),
			Egress:  decisionText(res.Egress),
			Ingress: decisionText(res.Ingress),
			SrcIP:   s.Addr.String(),
			DstIP:   d.Addr.String(),
		}
	}
	return out, nil
}

// overall is the verdict of the flow: denied if a side denies, allowed if
// a rule allowed a side, not_isolated if no policy applies.
func overall(r policy.Result) string {
	e, i := r.Egress.Verdict, r.Ingress.Verdict
	switch {
	case e == flow.VerdictRejected || i == flow.VerdictRejected:
		return flow.VerdictRejected.String()
	case e == flow.VerdictDenied || i == flow.VerdictDenied:
		return flow.VerdictDenied.String()
	case e == flow.VerdictAllowed || i == flow.VerdictAllowed:
		return flow.VerdictAllowed.String()
	case e == flow.VerdictNotIsolated || i == flow.VerdictNotIsolated:
		return flow.VerdictNotIsolated.String()
	}
	return flow.VerdictUnknown.String()
}

func decisionText(d policy.Decision) string {
	if d.Name == "" {
		return ""
	}
	s := d.Namespace + "/" + d.Name
	if d.Rule >= 0 {
		s += " rule " + strconv.Itoa(int(d.Rule))
	}
	return s + " (" + d.Verdict.String() + ")"
}
