package policy

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/dualflow/dualflow/flow"
)

// Explanation says why one side of a flow is denied: the one answer that
// the Flows page, the flow drawer, traces (UI and CLI), reachability pairs
// and the audit give for a drop.
type Explanation struct {
	Direction Direction
	// By is the deciding policy of the denial (Decision.Namespace/Name):
	// the isolating policy without rules for the direction (a default
	// deny) when there is one, the first isolating policy otherwise.
	By string
	// ByHasRules says By has rules for the direction; when it has none it
	// is a plain default deny and takes no part in "no rule allows".
	ByHasRules bool
	// Isolating lists every policy (namespace/name order) that selects
	// the subject for the direction: together their rules are what may
	// allow the flow.
	Isolating []string
	// Wanted is what no rule allowed: family, protocol and port, as
	// "IPv6 TCP/9090".
	Wanted string
	// Nearest is the rule that comes closest to allowing the flow and
	// what it lacks ("backend/allow-metrics rule 0 matches 9090/TCP but
	// has no IPv6 ipBlock"); empty when no rule matches either the port or
	// the peer.
	Nearest string
}

// Explain returns why side d of f is denied, and false when it is not
// (allowed, not isolated, or not a pod). Unlike Evaluate it allocates; it
// is meant for the few denials a person reads, not for every record.
func (s *Set) Explain(d Direction, f *Flow) (Explanation, bool) {
	subject, remote := &f.Dst, &f.Src
	if d == Egress {
		subject, remote = &f.Src, &f.Dst
	}
	var dec Decision
	s.side(&dec, d, subject, remote, f)
	if dec.Verdict != flow.VerdictDenied {
		return Explanation{}, false
	}
	e := Explanation{Direction: d, By: dec.Namespace + "/" + dec.Name, Wanted: wanted(f)}
	best := 0
	for _, pi := range s.byNS[subject.Namespace].dir[d].all {
		p := s.policies[pi]
		if !p.selector.matches(subject.Labels) {
			continue
		}
		name := p.Namespace + "/" + p.Name
		e.Isolating = append(e.Isolating, name)
		if name == e.By {
			e.ByHasRules = len(p.rules[d]) > 0
		}
		for i := range p.rules[d] {
			if score, text := p.rules[d][i].near(p.Namespace, remote, f); score > best {
				best, e.Nearest = score, fmt.Sprintf("%s rule %d %s", name, i, text)
			}
		}
	}
	return e, true
}

// String renders e in one sentence for the end named remote (the source of
// an ingress denial, the destination of an egress one) and the isolated
// pod named subject.
func (e Explanation) String(subject, remote string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s denied by %s", e.Direction, e.By)
	var ruled []string
	for _, p := range e.Isolating {
		if p != e.By || e.ByHasRules {
			ruled = append(ruled, p)
		}
	}
	from := "from"
	if e.Direction == Egress {
		from = "to"
	}
	if len(ruled) == 0 {
		fmt.Fprintf(&b, ", which isolates %s (%s) and allows nothing", subject, e.Direction)
		return b.String()
	}
	fmt.Fprintf(&b, ", which isolates %s: no %s rule of %s allows %s %s %s", subject, e.Direction, strings.Join(ruled, ", "), e.Wanted, from, remote)
	if e.Nearest != "" {
		b.WriteString("; nearest: " + e.Nearest)
	}
	return b.String()
}

// wanted is the family, protocol and port of f: "IPv6 TCP/9090".
func wanted(f *Flow) string {
	s := "IPv" + strconv.Itoa(int(flow.Version(f.Src.Addr))) + " " + flow.ProtoName(f.Proto)
	if flow.HasPorts(f.Proto) {
		s += "/" + strconv.Itoa(int(f.DstPort))
		if f.Dst.PortName != "" {
			s += " (" + f.Dst.PortName + ")"
		}
	}
	return s
}

// near scores how close r comes to allowing f from (or to) remote: 2 when
// its ports match and its peers do not, 1 when its peers match and its
// ports do not, 0 otherwise (both fail, or both hold: then it allows).
// text says what matches and what it lacks.
func (r *rule) near(policyNS string, remote *Peer, f *Flow) (int, string) {
	portOK, portText := r.portMatch(f)
	peerOK := len(r.peers) == 0
	for i := range r.peers {
		peerOK = peerOK || r.peers[i].matches(policyNS, remote)
	}
	switch {
	case portOK && !peerOK:
		return 2, "matches " + portText + " but " + r.peerLack(policyNS, remote)
	case peerOK && !portOK:
		return 1, "admits the peer but only on " + r.portList()
	}
	return 0, ""
}

// portMatch reports whether a port of r matches f, and names it.
func (r *rule) portMatch(f *Flow) (bool, string) {
	if len(r.ports) == 0 {
		return true, "every port"
	}
	for i := range r.ports {
		if r.ports[i].matches(f) {
			return true, r.ports[i].String()
		}
	}
	return false, ""
}

func (r *rule) portList() string {
	var out []string
	for i := range r.ports {
		out = append(out, r.ports[i].String())
	}
	return strings.Join(out, ", ")
}

func (pt *port) String() string {
	proto := flow.ProtoName(pt.proto)
	switch {
	case pt.name != "":
		return "port " + pt.name + "/" + proto
	case pt.any:
		return "every " + proto + " port"
	case pt.lo == pt.hi:
		return strconv.Itoa(int(pt.lo)) + "/" + proto
	}
	return strconv.Itoa(int(pt.lo)) + "-" + strconv.Itoa(int(pt.hi)) + "/" + proto
}

// peerLack says why no peer of r matches remote, for the most specific
// reason: an ipBlock list of the other family only, an address outside
// (or excepted from) the blocks, a non-pod end for selector peers, or
// selectors that do not select the pod or its namespace.
func (r *rule) peerLack(policyNS string, remote *Peer) string {
	fam := flow.Version(remote.Addr)
	var blocks, sameFam, selectors int
	var excepted bool
	for i := range r.peers {
		pe := &r.peers[i]
		if !pe.block.CIDR.IsValid() {
			selectors++
			continue
		}
		blocks++
		if flow.Version(pe.block.CIDR.Addr()) == fam {
			sameFam++
			if pe.block.CIDR.Contains(remote.Addr) {
				excepted = true // contained, yet Contains refused it: an except
			}
		}
	}
	addr := remote.Addr.String()
	switch {
	case blocks > 0 && sameFam == 0 && (selectors == 0 || !remote.IsPod):
		return fmt.Sprintf("has no IPv%d ipBlock", fam)
	case excepted:
		return addr + " is in an ipBlock's except"
	case sameFam > 0 && (selectors == 0 || !remote.IsPod):
		return "no ipBlock contains " + addr
	case !remote.IsPod:
		return addr + " is not a pod, and it selects pods only"
	}
	for i := range r.peers {
		pe := &r.peers[i]
		if pe.block.CIDR.IsValid() {
			continue
		}
		if pe.nsSel == nil && remote.Namespace != policyNS {
			return "selects pods of namespace " + policyNS + " only, not of " + remote.Namespace
		}
	}
	for i := range r.peers {
		if pe := &r.peers[i]; pe.nsSel != nil && !pe.block.CIDR.IsValid() && pe.nsSel.matches(remote.NamespaceLabels) {
			return "its podSelector does not select the pod"
		}
	}
	if remote.Namespace != policyNS {
		return "its namespaceSelector does not select namespace " + remote.Namespace
	}
	return "its podSelector does not select the pod"
}
