package audit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
)

// This file is the one evaluation of NetworkPolicies for pairs of
// endpoints: the web's reachability matrix (PolicyEvaluator) and the
// probe (Evaluate) resolve their ends into Members and build each pair's
// policy.Flow the same way (pairFlow).

// Endpoint names one end of a reachability question or a trace.
type Endpoint struct {
	// Kind is pod, workload, service or ip.
	Kind      string `json:"kind"`
	Namespace string `json:"namespace,omitempty"`
	// Name is the pod, workload or Service name, or for kind ip the address.
	Name string `json:"name"`
}

// String renders e as kind:namespace/name.
func (e Endpoint) String() string {
	if e.Namespace == "" {
		return e.Kind + ":" + e.Name
	}
	return e.Kind + ":" + e.Namespace + "/" + e.Name
}

// PolicyVerdict sums up the evaluated policy of one family.
type PolicyVerdict struct {
	// Verdict is allowed, denied, not_isolated or unknown for the flow as a
	// whole (denied if either direction denies).
	Verdict string `json:"verdict"`
	// Egress and Ingress are the deciding policies ("ns/name rule N"), or
	// empty.
	Egress  string `json:"egress,omitempty"`
	Ingress string `json:"ingress,omitempty"`
	// SrcIP and DstIP are the addresses evaluated.
	SrcIP string `json:"src_ip,omitempty"`
	DstIP string `json:"dst_ip,omitempty"`
}

// Resolver turns an endpoint into what it stands for: every pod of a pod,
// workload or Service endpoint (a Service's backends, with the Service's
// families and ports), or the address of an ip endpoint. It is what the
// caller provides from the cluster view (ClusterResolver).
type Resolver interface {
	Resolve(ctx context.Context, e Endpoint) (*Target, error)
}

// ErrNotEvaluated is wrapped by a Resolver for an endpoint that policies
// cannot be evaluated for (an ip endpoint naming a prefix): its cells
// carry the reason as policy_error and are summed up from what was
// observed or traced.
var ErrNotEvaluated = errors.New("not evaluated")

// Target is what an endpoint stands for in policy terms.
type Target struct {
	// Members are the pods of the endpoint (for a Service its backend
	// pods), or the one address of an ip endpoint.
	Members []Member
	// Service is set for a Service endpoint.
	Service *ServiceSpec
}

// Member is one pod (or address) of a Target.
type Member struct {
	// Name is namespace/pod, or the address of an end that is no pod.
	Name string
	// Pod says Name names a pod (a pod is never evaluated to itself).
	Pod bool
	// Peers is the member as policies see it, per family (4, 6) it has an
	// address of.
	Peers map[int]policy.Peer
	// Ports are the pod's container ports (Service named target ports
	// and named-port rules are resolved on them).
	Ports []ContainerPort
	// pod is the view's pod (ClusterResolver), for the probe's
	// answer.
	pod *enrich.Pod
}

// ContainerPort is a port a pod's container declares.
type ContainerPort struct {
	Name  string
	Proto uint8
	Port  uint16
}

// ServiceSpec is what reachability needs of a Service.
type ServiceSpec struct {
	Namespace, Name string
	// Families are the families (4, 6) the Service has: a ClusterIP of the
	// family in spec.clusterIPs (and the family in spec.ipFamilies), or for
	// a headless Service the family in spec.ipFamilies.
	Families []int
	Headless bool
	// Selector selects the backend pods in the Service's namespace (nil: no
	// selector, endpoints managed by hand: no backend is known).
	Selector map[string]string
	Ports    []ServicePort
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name  string
	Proto uint8
	Port  uint16
	// TargetPort is the backend's port number, or TargetPortName the name
	// of the backend's container port, resolved per backend pod; neither
	// set: Port.
	TargetPort     uint16
	TargetPortName string
}

// Outcomes of one family of a matrix cell (FamilyPolicy.Outcome). The
// first three sum up every pod pair the cell covers; the next five say
// why the family has no pair to evaluate.
const (
	OutcomeAllow   = "allow"   // every pair allowed
	OutcomeDeny    = "deny"    // every pair denied
	OutcomePartial = "partial" // some pairs allowed (pairs_allowed of pairs_total)
	// OutcomeUnavailable: an end has no address of the family.
	OutcomeUnavailable = "unavailable"
	// OutcomeNoFamily: the destination Service has no ClusterIP of the
	// family ("no IPv6 ClusterIP").
	OutcomeNoFamily = "no_family"
	// OutcomeNoPort: the destination Service exposes no such port.
	OutcomeNoPort = "no_port"
	// OutcomeNoBackends: no backend pod of the Service serves the port in
	// the family.
	OutcomeNoBackends = "no_backends"
	// OutcomeSelf: the only pair is a pod to itself, which policies do not
	// govern.
	OutcomeSelf = "self"
	// OutcomeError: an end could not be resolved (reason says why).
	OutcomeError = "error"
)

// DefaultReachabilityMaxChecks bounds the policy checks of one matrix
// (PolicyEvaluator.MaxChecks): a check costs 10 to 60 ns (the more rules
// and peers, the more), so a matrix takes at most about a CPU-second. The
// issue's request, 200,000 pod pairs under 3,000 policies of one
// namespace, makes over a billion checks.
const DefaultReachabilityMaxChecks = 20_000_000

// MaxObservedPorts bounds the ports observed to one destination that a
// question on any port evaluates its undeclared pods at (each port is one
// more check per pod pair): the reachability matrix's and the what-if's.
const MaxObservedPorts = 16

// Bounds of a matrix evaluation.
const (
	// maxMatrixPairs bounds the pod pairs one request evaluates (both
	// families, every Service port), for the size of the answer and of
	// the work apart from the policy checks (~1 µs each).
	maxMatrixPairs = 200_000
	// maxListedPairs bounds the pairs listed per cell and family, and
	// maxListedTotal per response (~150 bytes each in JSON); the counts
	// always cover every pair.
	maxListedPairs = 64
	maxListedTotal = 10_000
)

// FamilyPolicy is the evaluated policy of one family of a cell: every pod
// pair the cell covers.
type FamilyPolicy struct {
	// Outcome is one of the Outcome constants; Reason explains the ones
	// that are not allow, deny or partial ("no IPv6 ClusterIP").
	Outcome string
	Reason  string
	// Allowed of Total pairs are allowed.
	Allowed, Total int
	// Pairs lists the pairs (at most maxListedPairs; Truncated when more).
	Pairs     []PairVerdict
	Truncated bool
	// Summary sums the pairs up (see PolicyEvaluator.Evaluate).
	Summary PolicyVerdict
}

// PairVerdict is the policy verdict of one pod pair of a cell.
type PairVerdict struct {
	// Src and Dst are namespace/pod (or the address of an end that is no
	// pod); SrcIP and DstIP the addresses evaluated.
	Src   string `json:"src"`
	Dst   string `json:"dst"`
	SrcIP string `json:"src_ip"`
	DstIP string `json:"dst_ip"`
	// Port is the destination port evaluated (a Service's target port on
	// this backend; for a question on any port, each port of the protocol
	// the pod declares; 0: any, for a pod that declares none);
	// ServicePort the Service port it came from.
	Port        uint16 `json:"port,omitempty"`
	ServicePort uint16 `json:"service_port,omitempty"`
	// Verdict is allowed, denied, rejected, not_isolated or unknown;
	// Egress and Ingress the deciding policies.
	Verdict string `json:"verdict"`
	Egress  string `json:"egress,omitempty"`
	Ingress string `json:"ingress,omitempty"`
	// Explanation says why a denied pair is denied (Auditor.Explain's
	// sentence): the isolating policy, what no rule allowed, and the
	// nearest rule with what it lacks.
	Explanation string `json:"explanation,omitempty"`
}

// PolicyEvaluator evaluates compiled NetworkPolicies for the web: it
// resolves both ends into their pods and evaluates, per family, every pod
// pair with that family's addresses, so ipBlock rules that cover one
// family only show up as a difference between the families. A Service
// destination is evaluated only in the families it has and on the ports
// it exposes, mapped to each backend's target port.
type PolicyEvaluator struct {
	// Policies returns the policies in use (audit.Auditor.Policies); nil
	// or a nil Set isolates nothing.
	Policies func() *policy.Set
	Resolver Resolver
	// MaxChecks bounds the policy checks of one matrix: each pod pair
	// checked against the policies that may select its source (egress)
	// and its destination (ingress), policy.Set.Tries. A larger matrix is
	// refused (*TooLargeError) before any pair is evaluated. 0:
	// DefaultReachabilityMaxChecks.
	MaxChecks int64
}

// Evaluate answers one cell (web/api's Evaluator): the summary of each
// family that has pairs to evaluate (allowed, denied, not_isolated when
// every pair says so, or partial).
func (p PolicyEvaluator) Evaluate(ctx context.Context, src, dst Endpoint, proto uint8, port uint16) (map[int]PolicyVerdict, error) {
	m, err := p.EvaluateMatrix(ctx, []Endpoint{src}, []Endpoint{dst}, proto, port)
	if err != nil {
		return nil, err
	}
	out := map[int]PolicyVerdict{}
	for fam, f := range m[0][0] {
		switch f.Outcome {
		case OutcomeAllow, OutcomeDeny, OutcomePartial:
			out[fam] = f.Summary
		case "", OutcomeError:
			return nil, errors.New(f.Reason)
		}
	}
	return out, nil
}

type resolved struct {
	t   *Target
	err error
}

// EvaluateMatrix evaluates every pod pair of every cell of the matrix.
// The result is indexed [source][destination] then family (4, 6); an
// error is a failure of the whole matrix (a *TooLargeError for one too
// large); an end that cannot be resolved is an OutcomeError family, not
// an error.
//
// A question on any port (port 0) evaluates a pod on each port of proto
// it declares; observed, if given, holds per destination (observed[j] for
// dsts[j]) the ports flows to it were seen on, at which a pod that
// declares none is evaluated instead of port 0 (which only rules without
// ports match).
func (p PolicyEvaluator) EvaluateMatrix(ctx context.Context, srcs, dsts []Endpoint, proto uint8, port uint16, observed ...[]uint16) ([][]map[int]*FamilyPolicy, error) {
	m, err := p.plan(ctx, srcs, dsts, proto, port, observed)
	if err != nil {
		return nil, err
	}
	var set *policy.Set
	if p.Policies != nil {
		set = p.Policies()
	}
	pairs, checks := m.cost(set)
	if pairs > maxMatrixPairs {
		return nil, &TooLargeError{Field: "destinations", Message: fmt.Sprintf("the matrix covers %d pod pairs, more than %d: ask about fewer or smaller endpoints", pairs, maxMatrixPairs)}
	}
	if maxChecks := cmp.Or(p.MaxChecks, DefaultReachabilityMaxChecks); checks > maxChecks {
		return nil, &TooLargeError{Field: "destinations", Message: fmt.Sprintf("the matrix would make %d policy checks (its pod pairs, each against the policies that may select its ends: %d in all), more than the %d allowed: ask about fewer or smaller endpoints", checks, set.Len(), maxChecks)}
	}
	listed := 0
	return m.evaluate(set, &listed), nil
}

// matrix is a matrix's ends, resolved, and its question: what
// EvaluateMatrix costs (cost) before it evaluates (evaluate), with one
// set of policies or, for a what-if, with two.
type matrix struct {
	rs, rd   []resolved
	proto    uint8
	port     uint16
	observed [][]uint16
}

// plan resolves the ends of a matrix.
func (p PolicyEvaluator) plan(ctx context.Context, srcs, dsts []Endpoint, proto uint8, port uint16, observed [][]uint16) (*matrix, error) {
	resolve := func(eps []Endpoint, side string) []resolved {
		out := make([]resolved, len(eps))
		for i, e := range eps {
			t, err := p.Resolver.Resolve(ctx, e)
			if err != nil {
				err = fmt.Errorf("%s %s: %w", side, e, err)
			}
			out[i] = resolved{t, err}
		}
		return out
	}
	m := &matrix{rs: resolve(srcs, "source"), rd: resolve(dsts, "destination"), proto: proto, port: port, observed: observed}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

// seen are the ports observed to destination j, for a question on any
// port of a protocol with ports.
func (m *matrix) seen(j int) []uint16 {
	if j < len(m.observed) && m.port == 0 && flow.HasPorts(m.proto) {
		return m.observed[j]
	}
	return nil
}

// cost counts the pod pairs of the matrix (both families, every port)
// and the policy checks evaluating them with set makes, without
// evaluating any.
func (m *matrix) cost(set *policy.Set) (pairs int, checks int64) {
	costs := func(rs []resolved) []targetCost {
		out := make([]targetCost, len(rs))
		for i, r := range rs {
			if r.t != nil {
				out[i] = costOf(set, r.t)
			}
		}
		return out
	}
	cs, cd := costs(m.rs), costs(m.rd)
	for i, s := range m.rs {
		for j, d := range m.rd {
			if s.t == nil || d.t == nil {
				continue
			}
			k := max(1, len(d.t.servicePorts(m.proto, m.port)), d.t.anyPorts(m.proto, m.port), len(m.seen(j)))
			pairs += 2 * len(s.t.Members) * len(d.t.Members) * k
			for f := range cs[i].members {
				checks += int64(k) * (cs[i].egress[f]*cd[j].members[f] + cs[i].members[f]*cd[j].ingress[f])
			}
		}
	}
	return pairs, checks
}

// evaluate evaluates every pod pair of every cell with set; listed
// counts the pairs listed (maxListedTotal) over the calls that share it.
func (m *matrix) evaluate(set *policy.Set, listed *int) [][]map[int]*FamilyPolicy {
	out := make([][]map[int]*FamilyPolicy, len(m.rs))
	for i, s := range m.rs {
		out[i] = make([]map[int]*FamilyPolicy, len(m.rd))
		for j, d := range m.rd {
			cell := map[int]*FamilyPolicy{}
			for _, fam := range []int{4, 6} {
				var f *FamilyPolicy
				switch err := errors.Join(s.err, d.err); {
				case errors.Is(err, ErrNotEvaluated):
					f = &FamilyPolicy{Reason: err.Error()}
				case err != nil:
					f = &FamilyPolicy{Outcome: OutcomeError, Reason: err.Error()}
				default:
					f = evaluateFamily(set, s.t, d.t, fam, m.proto, m.port, m.seen(j), listed)
				}
				cell[fam] = f
			}
			out[i][j] = cell
		}
	}
	return out
}

// targetCost is what the members of a target weigh in a matrix, per
// family (index 0 IPv4, 1 IPv6): how many have an address of it, and the
// policies tried for them as a source (egress) and as a destination
// (ingress), summed.
type targetCost struct {
	members, egress, ingress [2]int64
}

func costOf(set *policy.Set, t *Target) targetCost {
	var c targetCost
	for i := range t.Members {
		for f, fam := range []int{4, 6} {
			peer, ok := t.Members[i].Peers[fam]
			if !ok {
				continue
			}
			c.members[f]++
			c.egress[f] += int64(set.Tries(policy.Egress, &peer))
			c.ingress[f] += int64(set.Tries(policy.Ingress, &peer))
		}
	}
	return c
}

// familyProto is the protocol of a question in family fam: ICMP and
// ICMPv6 are one question, asked with each family's number.
func familyProto(proto uint8, fam int) uint8 {
	if proto == flow.ProtoICMP || proto == flow.ProtoICMPv6 {
		if fam == 6 {
			return flow.ProtoICMPv6
		}
		return flow.ProtoICMP
	}
	return proto
}

// servicePorts are the ports of t's Service a question on proto/port
// reaches (port 0: every port of proto); nil for other targets and
// protocols without ports.
func (t *Target) servicePorts(proto uint8, port uint16) []ServicePort {
	if t.Service == nil || !flow.HasPorts(proto) {
		return nil
	}
	var out []ServicePort
	for _, sp := range t.Service.Ports {
		if sp.Proto == proto && (port == 0 || sp.Port == port) {
			out = append(out, sp)
		}
	}
	return out
}

// anyPorts is, for a question on any port (port 0) of a protocol with
// ports, the most ports of proto a member of t declares: the slots each
// pair of a pod, workload or headless Service destination is evaluated
// at (evaluateFamily); 0 otherwise.
func (t *Target) anyPorts(proto uint8, port uint16) int {
	if port != 0 || !flow.HasPorts(proto) {
		return 0
	}
	n := 0
	for i := range t.Members {
		n = max(n, len(t.Members[i].declared(proto)))
	}
	return n
}

// declared are the container ports of proto m declares, each once.
func (m *Member) declared(proto uint8) []uint16 {
	var out []uint16
	for _, cp := range m.Ports {
		if cp.Proto == proto && !slices.Contains(out, cp.Port) {
			out = append(out, cp.Port)
		}
	}
	return out
}

func familyName(fam int) string { return "IPv" + strconv.Itoa(fam) }

// slot is one place a pair's destination is evaluated at: a member on a
// port.
type slot struct {
	m           *Member
	port, svcPt uint16
}

// evaluateFamily evaluates every pair of one family of a cell; observed
// are the ports seen to the destination, for its pods that declare none
// (EvaluateMatrix).
func evaluateFamily(set *policy.Set, src, dst *Target, fam int, proto uint8, port uint16, observed []uint16, listed *int) *FamilyPolicy {
	fname := familyName(fam)
	fproto := familyProto(proto, fam)
	if svc := dst.Service; svc != nil && !slices.Contains(svc.Families, fam) {
		reason := "no " + fname + " ClusterIP"
		if svc.Headless {
			reason = "the headless Service has no " + fname + " family"
		}
		return &FamilyPolicy{Outcome: OutcomeNoFamily, Reason: reason}
	}
	var srcs []*Member
	for i := range src.Members {
		if _, ok := src.Members[i].Peers[fam]; ok {
			srcs = append(srcs, &src.Members[i])
		}
	}
	if len(srcs) == 0 {
		return &FamilyPolicy{Outcome: OutcomeUnavailable, Reason: "the source has no " + fname + " address"}
	}
	// A Service forwards TCP, UDP and SCTP: ICMP to its ClusterIP never
	// reaches its pods (kube-proxy does not forward it), whatever the
	// policies say.
	if dst.Service != nil && !dst.Service.Headless && !flow.HasPorts(proto) {
		return &FamilyPolicy{Outcome: OutcomeNoPort, Reason: "a Service forwards TCP, UDP and SCTP only: " + flow.ProtoName(fproto) + " to its ClusterIP does not reach its pods (ask about its pods or workload)"}
	}
	var sps []ServicePort
	// A headless Service's clients dial the pods' addresses on the port
	// they choose: no port mapping, no "no such port"; its pods are
	// evaluated on the port asked.
	if dst.Service != nil && !dst.Service.Headless && flow.HasPorts(proto) {
		sps = dst.servicePorts(proto, port)
		if len(sps) == 0 {
			what := fmt.Sprintf("no port %d/%s", port, flow.ProtoName(proto))
			if port == 0 {
				what = "no " + flow.ProtoName(proto) + " port"
			}
			return &FamilyPolicy{Outcome: OutcomeNoPort, Reason: "the Service has " + what}
		}
	}
	var slots []slot
	for i := range dst.Members {
		m := &dst.Members[i]
		if _, ok := m.Peers[fam]; !ok {
			continue
		}
		if sps == nil {
			// Any port of a pod is each port of proto it declares, as
			// any port of a Service is each of its ports: port 0 would
			// match only the rules without ports. A pod that declares
			// none is evaluated at the ports observed to the
			// destination, else at port 0.
			ports := []uint16{port}
			if port == 0 && flow.HasPorts(proto) {
				if d := m.declared(proto); len(d) > 0 {
					ports = d
				} else if len(observed) > 0 {
					ports = observed
				}
			}
			for _, p := range ports {
				slots = append(slots, slot{m: m, port: p})
			}
			continue
		}
		for _, sp := range sps {
			tp := sp.Port
			switch {
			case sp.TargetPortName != "":
				tp = 0
				for _, cp := range m.Ports {
					if cp.Name == sp.TargetPortName && cp.Proto == proto {
						tp = cp.Port
						break
					}
				}
			case sp.TargetPort != 0:
				tp = sp.TargetPort
			}
			if tp != 0 {
				slots = append(slots, slot{m: m, port: tp, svcPt: sp.Port})
			}
		}
	}
	if len(slots) == 0 {
		switch {
		case dst.Service == nil:
			return &FamilyPolicy{Outcome: OutcomeUnavailable, Reason: "the destination has no " + fname + " address"}
		case dst.Service.Selector == nil:
			return &FamilyPolicy{Outcome: OutcomeNoBackends, Reason: "the Service has no selector: its backends are not known"}
		case sps != nil:
			return &FamilyPolicy{Outcome: OutcomeNoBackends, Reason: "no " + fname + " backend pod serves the port"}
		}
		return &FamilyPolicy{Outcome: OutcomeNoBackends, Reason: "the Service selects no " + fname + " pod"}
	}
	out := &FamilyPolicy{}
	var first PairVerdict
	same := struct{ verdict, egress, ingress, src, dst bool }{true, true, true, true, true}
	self := 0
	for _, s := range srcs {
		for _, sl := range slots {
			if s.Pod && sl.m.Pod && s.Name == sl.m.Name {
				self++
				continue
			}
			f := pairFlow(s, sl.m, fam, fproto, sl.port)
			res := set.Evaluate(&f)
			pv := PairVerdict{Src: s.Name, Dst: sl.m.Name, SrcIP: f.Src.Addr.String(), DstIP: f.Dst.Addr.String(),
				Port: sl.port, ServicePort: sl.svcPt, Verdict: overall(res), Egress: decisionText(res.Egress), Ingress: decisionText(res.Ingress)}
			if res.Allowed() {
				out.Allowed++
			}
			if out.Total == 0 {
				first = pv
			} else {
				same.verdict = same.verdict && pv.Verdict == first.Verdict
				same.egress = same.egress && pv.Egress == first.Egress
				same.ingress = same.ingress && pv.Ingress == first.Ingress
				same.src = same.src && pv.SrcIP == first.SrcIP
				same.dst = same.dst && pv.DstIP == first.DstIP
			}
			out.Total++
			if len(out.Pairs) < maxListedPairs && *listed < maxListedTotal {
				if !res.Allowed() {
					d, _ := explainDenial(set, &f, s.Name, sl.m.Name)
					pv.Explanation = d.Text
				}
				out.Pairs = append(out.Pairs, pv)
				*listed++
			} else {
				out.Truncated = true
			}
		}
	}
	if out.Total == 0 {
		return &FamilyPolicy{Outcome: OutcomeSelf, Reason: fmt.Sprintf("only a pod to itself (%d pairs), which NetworkPolicies do not govern", self)}
	}
	switch out.Allowed {
	case out.Total:
		out.Outcome = OutcomeAllow
	case 0:
		out.Outcome = OutcomeDeny
	default:
		out.Outcome = OutcomePartial
		out.Reason = fmt.Sprintf("%d of %d pod pairs allowed", out.Allowed, out.Total)
	}
	sum := PolicyVerdict{Verdict: first.Verdict}
	if !same.verdict {
		switch out.Outcome {
		case OutcomeAllow:
			sum.Verdict = flow.VerdictAllowed.String()
		case OutcomeDeny:
			sum.Verdict = flow.VerdictDenied.String()
		default:
			sum.Verdict = OutcomePartial
		}
	}
	if same.egress {
		sum.Egress = first.Egress
	}
	if same.ingress {
		sum.Ingress = first.Ingress
	}
	if same.src {
		sum.SrcIP = first.SrcIP
	}
	if same.dst {
		sum.DstIP = first.DstIP
	}
	out.Summary = sum
	return out
}

// pairFlow is the policy view of src → dst over family fam, which both
// have an address of, with the destination pod's named port resolved.
func pairFlow(src, dst *Member, fam int, proto uint8, port uint16) policy.Flow {
	f := policy.Flow{Src: src.Peers[fam], Dst: dst.Peers[fam], Proto: proto, DstPort: port}
	if f.Dst.IsPod && port != 0 {
		for _, cp := range dst.Ports {
			if cp.Port == port && cp.Proto == proto {
				f.Dst.PortName = cp.Name
				break
			}
		}
	}
	return f
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
