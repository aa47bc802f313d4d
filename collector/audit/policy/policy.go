// Package policy evaluates Kubernetes networking.k8s.io/v1 NetworkPolicies
// for one flow: for the egress side (the source pod) and the ingress side
// (the destination pod) it says whether the flow is allowed, denied or not
// isolated, and which policy and rule decided.
//
// Compile turns a list of NetworkPolicies into an immutable Set: selectors
// become matchers, CIDRs become netip.Prefix values, ports become ranges,
// and policies are indexed per namespace and direction (and, inside a
// namespace, by one label requirement of their pod selector). Evaluate
// reads the Set only, allocates nothing and is safe for concurrent use.
//
// Semantics are those of the Kubernetes API:
//
//   - A pod is isolated for a direction when a policy of its namespace
//     selects it (spec.podSelector) and has that direction in its
//     policyTypes (explicit, or defaulted: Ingress, plus Egress when the
//     policy has egress rules).
//   - An isolated pod accepts (ingress) or sends (egress) only what at
//     least one rule of one of those policies allows: rules and policies
//     are a union of allows. A rule allows a flow when one of its peers
//     matches the remote end (none listed: every peer) and one of its
//     ports matches the destination port (none listed: every port and
//     protocol, ICMP included).
//   - Peers: podSelector (pods of the policy's namespace),
//     namespaceSelector (every pod of the selected namespaces), both (AND),
//     ipBlock with except (any address, pod addresses included, of the
//     block's family only: an IPv4 block never matches IPv6).
//   - Ports: TCP (the default), UDP, SCTP; a number, a range (endPort), no
//     port (every port of the protocol), or a name, resolved on the
//     destination pod's container ports for ingress and egress alike.
//
// The deciding rule of an allowed side is the first rule that allows it,
// with policies taken in namespace/name order and rules in spec order (the
// order the lab's nftables datapath evaluates them in). A denied side names
// the policy that isolates the pod, rule -1: the first isolating policy
// without rules for that direction (a default deny) when there is one, the
// first isolating policy otherwise.
package policy

import (
	"net/netip"

	"github.com/dualflow/dualflow/flow"
)

// Direction is a policy direction.
type Direction uint8

// The two directions. Ingress is checked on the destination pod, Egress
// on the source pod.
const (
	Ingress Direction = 0
	Egress  Direction = 1
)

func (d Direction) String() string {
	if d == Egress {
		return "egress"
	}
	return "ingress"
}

// Peer is one end of a flow as policy evaluation sees it.
type Peer struct {
	// Addr is the end's address, unmapped. ipBlock peers match it.
	Addr netip.Addr
	// IsPod says the end is a pod (not host-network): policies select it
	// and pod or namespace selectors can match it. For any other end (an
	// address outside the cluster, a node) only Addr matters, and no policy
	// applies to its side of the flow.
	IsPod     bool
	Namespace string
	// Labels are the pod's labels, NamespaceLabels its namespace's.
	// Read-only; nil matches only empty selectors.
	Labels, NamespaceLabels map[string]string
	// PortName is, on the destination, the name of the container port
	// that serves Flow.DstPort over Flow.Proto ("" when unnamed or not a
	// pod). Named ports in rules match against it.
	PortName string
	// Node is the node of the end: a pod's node, or for any other end the
	// node whose address it is (a node address, or its pods' gateway in
	// its pod CIDR); "" when unknown. Ingress from a pod's own node is
	// always allowed: NetworkPolicy cannot restrict it (Kubernetes
	// documents that pods cannot block access from their resident node,
	// and every implementation lets the kubelet's probes in).
	Node string
}

// RuleFromNode is Decision.Rule of an ingress allowed because it comes
// from the pod's own node, which no policy can restrict.
const RuleFromNode = -2

// Flow is what Evaluate needs to know about a connection. Dst is the end
// actually reached: after DNAT, a Service's endpoint, never its ClusterIP.
type Flow struct {
	Src, Dst Peer
	Proto    uint8 // IANA protocol number (flow.ProtoTCP, ...)
	DstPort  uint16
}

// Decision is the verdict of one side of a flow and what decided it.
type Decision struct {
	// Verdict is flow.VerdictAllowed, flow.VerdictDenied,
	// flow.VerdictNotIsolated, or flow.VerdictUnknown when the side's end
	// is not a pod (policies do not apply to it).
	Verdict flow.Verdict
	// Namespace and Name are the deciding policy: the one whose rule
	// allowed the flow, or the one that isolates the pod for a denial.
	// Empty when not isolated or unknown.
	Namespace, Name string
	// Rule is the index of the allowing rule in the policy's ingress or
	// egress list; -1 for a denial, not isolated or unknown.
	Rule int32
}

// Allowed reports whether the side lets the flow through: allowed, not
// isolated, or not subject to policy.
func (d Decision) Allowed() bool {
	return d.Verdict != flow.VerdictDenied && d.Verdict != flow.VerdictRejected
}

// Result is the verdict of both sides of a flow.
type Result struct {
	Egress, Ingress Decision
}

// Allowed reports whether both sides let the flow through.
func (r Result) Allowed() bool { return r.Egress.Allowed() && r.Ingress.Allowed() }

// Side returns the decision of direction d.
func (r Result) Side(d Direction) Decision {
	if d == Egress {
		return r.Egress
	}
	return r.Ingress
}

var (
	unknown     = Decision{Verdict: flow.VerdictUnknown, Rule: -1}
	notIsolated = Decision{Verdict: flow.VerdictNotIsolated, Rule: -1}
)

// Evaluate returns the egress decision (policies selecting f.Src) and the
// ingress decision (policies selecting f.Dst) for f. It allocates nothing
// and is safe for concurrent use. A nil Set isolates nothing.
func (s *Set) Evaluate(f *Flow) (r Result) {
	s.side(&r.Egress, Egress, &f.Src, &f.Dst, f)
	s.side(&r.Ingress, Ingress, &f.Dst, &f.Src, f)
	return r
}

// Side sets *dec to the decision of one direction only: subject is the
// end the policies select (the source for Egress, the destination for
// Ingress). A caller that copies the decisions' fields on at once should
// use it rather than Evaluate: a Result is returned in memory, and copying
// it right after it was stored field by field stalls the CPU (the
// auditor's copy did).
func (s *Set) Side(d Direction, f *Flow, dec *Decision) {
	if d == Egress {
		s.side(dec, Egress, &f.Src, &f.Dst, f)
	} else {
		s.side(dec, Ingress, &f.Dst, &f.Src, f)
	}
}

// Tries returns how many policies the evaluation of direction d tries
// for subject (the source for Egress, the destination for Ingress): those
// of its namespace that isolate d, less those the label index rules out
// for its labels. Each try matches the policy's selector and, when it
// selects subject, its rules, so a flow costs about Tries(Egress, &f.Src)
// + Tries(Ingress, &f.Dst) policy checks; callers bound their work with
// it before evaluating. It allocates nothing and is safe for concurrent
// use.
func (s *Set) Tries(d Direction, subject *Peer) int {
	if s == nil || !subject.IsPod {
		return 0
	}
	ns := s.byNS[subject.Namespace]
	if ns == nil {
		return 0
	}
	ix := &ns.dir[d]
	if ix.byLabel == nil {
		return len(ix.all)
	}
	n := len(ix.rest)
	for k, v := range subject.Labels {
		if vals := ix.byLabel[k]; vals != nil {
			n += len(vals[v])
		}
	}
	return n
}

// search is the state of one side's evaluation over candidate policies.
type search struct {
	allowPol  int32 // index of the first allowing policy, -1 if none yet
	allowRule int32
	isolating int32 // first isolating policy
	pureDeny  int32 // first isolating policy without rules for the direction
}

// side sets *dec to the decision of direction d for subject. It writes
// dec's fields one by one: returned, a Decision (48 bytes, in memory) was
// stored field by field and then copied 16 bytes at a time, loads the CPU
// does not forward from those stores (0.19 s of Evaluate's 1.72 in the
// end-to-end benchmark's profile).
func (s *Set) side(dec *Decision, d Direction, subject, remote *Peer, f *Flow) {
	if !subject.IsPod {
		*dec = unknown
		return
	}
	if s == nil {
		*dec = notIsolated
		return
	}
	ns := s.byNS[subject.Namespace]
	if ns == nil {
		*dec = notIsolated
		return
	}
	ix := &ns.dir[d]
	st := search{allowPol: -1, allowRule: -1, isolating: -1, pureDeny: -1}
	if ix.byLabel == nil {
		for _, pi := range ix.all {
			s.try(&st, pi, d, subject, remote, f)
		}
	} else {
		for _, pi := range ix.rest {
			s.try(&st, pi, d, subject, remote, f)
		}
		for k, v := range subject.Labels {
			if vals := ix.byLabel[k]; vals != nil {
				for _, pi := range vals[v] {
					s.try(&st, pi, d, subject, remote, f)
				}
			}
		}
	}
	switch {
	case st.allowPol >= 0:
		dec.set(flow.VerdictAllowed, s.policies[st.allowPol], st.allowRule)
	case st.isolating >= 0 && d == Ingress && !remote.IsPod && remote.Node != "" && remote.Node == subject.Node:
		dec.set(flow.VerdictAllowed, nil, RuleFromNode)
	case st.pureDeny >= 0:
		dec.set(flow.VerdictDenied, s.policies[st.pureDeny], -1)
	case st.isolating >= 0:
		dec.set(flow.VerdictDenied, s.policies[st.isolating], -1)
	default:
		*dec = notIsolated
	}
}

// set sets d's fields one by one (see side) to verdict v of policy p
// (nil: none) and rule.
func (d *Decision) set(v flow.Verdict, p *compiled, rule int32) {
	var ns, name string
	if p != nil {
		ns, name = p.Namespace, p.Name
	}
	d.Verdict, d.Namespace, d.Name, d.Rule = v, ns, name, rule
}

// try considers policy pi, a candidate for selecting subject.
func (s *Set) try(st *search, pi int32, d Direction, subject, remote *Peer, f *Flow) {
	if st.allowPol >= 0 && pi > st.allowPol {
		return // an earlier policy already allows the flow
	}
	p := s.policies[pi]
	if !p.selector.matches(subject.Labels) {
		return
	}
	if st.isolating < 0 || pi < st.isolating {
		st.isolating = pi
	}
	rules := p.rules[d]
	if len(rules) == 0 && (st.pureDeny < 0 || pi < st.pureDeny) {
		st.pureDeny = pi
	}
	for i := range rules {
		if rules[i].matches(p.Namespace, remote, f) {
			st.allowPol, st.allowRule = pi, int32(i)
			return
		}
	}
}

func (r *rule) matches(policyNS string, remote *Peer, f *Flow) bool {
	if len(r.ports) > 0 {
		ok := false
		for i := range r.ports {
			if r.ports[i].matches(f) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	if len(r.peers) == 0 {
		return true
	}
	for i := range r.peers {
		if r.peers[i].matches(policyNS, remote) {
			return true
		}
	}
	return false
}

func (pt *port) matches(f *Flow) bool {
	switch {
	case f.Proto != pt.proto:
		return false
	case pt.name != "":
		return f.Dst.PortName == pt.name
	case pt.any:
		return true
	}
	return f.DstPort >= pt.lo && f.DstPort <= pt.hi
}

func (pe *peer) matches(policyNS string, remote *Peer) bool {
	if pe.block.CIDR.IsValid() {
		return pe.block.Contains(remote.Addr)
	}
	if !remote.IsPod {
		return false
	}
	if pe.nsSel != nil {
		if !pe.nsSel.matches(remote.NamespaceLabels) {
			return false
		}
	} else if remote.Namespace != policyNS {
		return false
	}
	return pe.podSel == nil || pe.podSel.matches(remote.Labels)
}
