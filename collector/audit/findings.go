package audit

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/defaults"
)

// Finding kinds. Every dual-stack kind starts with "dual-stack-".
const (
	// KindUnprotectedIngress: pods of a workload that no policy isolates
	// for ingress.
	KindUnprotectedIngress = "unprotected-ingress"
	// KindUnprotectedEgress: pods of a workload that no policy isolates
	// for egress.
	KindUnprotectedEgress = "unprotected-egress"
	// KindInvalidPolicy: a policy the API would reject, left out.
	KindInvalidPolicy = "invalid-policy"
	// KindVerdictGap: two workloads whose traffic the policies allow over
	// one family and deny over the other (evaluated over the pods'
	// addresses of each family).
	KindVerdictGap = "dual-stack-verdict-gap"
	// KindIPBlockOneFamily: a rule whose ipBlocks cover the addresses of
	// one family of dual-stack pods and not the other family's.
	KindIPBlockOneFamily = "dual-stack-ipblock-one-family"
	// KindServiceSingleStack: a single-stack Service whose pods are
	// dual-stack.
	KindServiceSingleStack = "dual-stack-service-single-stack"
	// KindObservedVerdictGap: recorded flows between two workloads allowed
	// over one family and denied over the other.
	KindObservedVerdictGap = "dual-stack-observed-verdict-gap"
	// KindObservedOneFamily: recorded traffic between two dual-stack
	// workloads over one family only.
	KindObservedOneFamily = "dual-stack-observed-one-family"
	// KindTruncated: an analysis stopped at its size limit.
	KindTruncated = "analysis-truncated"
)

// Finding is one audit result: a one-sentence explanation and the objects
// it is about.
type Finding struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
	Objects []Ref  `json:"objects"`
	// Port and Protocol, when the finding is about one destination port.
	Port     uint16 `json:"port,omitempty"`
	Protocol string `json:"protocol,omitempty"`
	// Count is what the finding counts, Unit says what: pods, pod pairs,
	// flow records or pod-class pairs (plural; per kind).
	Count uint64 `json:"count,omitempty"`
	Unit  string `json:"unit,omitempty"`
	// Severity is SeverityHigh, SeverityMedium or SeverityLow, per kind.
	Severity string `json:"severity"`
	// Fix suggests what to change, per kind.
	Fix string `json:"fix,omitempty"`
}

// Severities of a finding.
const (
	// SeverityHigh: traffic is (or would be) treated differently than the
	// policies intend: a verdict differs by family, a policy is ignored.
	SeverityHigh = "high"
	// SeverityMedium: a gap that decides traffic once it flows: an ipBlock
	// or a Service of one family, pods open to any source.
	SeverityMedium = "medium"
	// SeverityLow: worth a look, not a wrong verdict.
	SeverityLow = "low"
)

// kinds is what the audit says of each kind of finding: how grave it is,
// what its Count counts, and what to change.
var kinds = map[string]struct{ severity, unit, fix string }{
	KindInvalidPolicy: {SeverityHigh, "",
		"Correct the policy as the error says: the API server would reject it, and it is left out of every verdict here."},
	KindVerdictGap: {SeverityHigh, "pod pairs",
		"Make the allowing rule cover both families: add an ipBlock of the other family, or match the peers with pod or namespace selectors, which cover both."},
	KindObservedVerdictGap: {SeverityHigh, "flow records",
		"Trace the pair over both families and compare the deciding rules; make the allowing rule cover both families, or deny both."},
	KindIPBlockOneFamily: {SeverityMedium, "pods",
		"Add an ipBlock of the missing family (the pods' CIDR of that family) to the rule, or match these peers with pod or namespace selectors."},
	KindServiceSingleStack: {SeverityMedium, "pods",
		"Set spec.ipFamilyPolicy: PreferDualStack (or RequireDualStack) on the Service, so it gets a ClusterIP of each family."},
	KindUnprotectedIngress: {SeverityMedium, "pods",
		"Select these pods with a NetworkPolicy of policyTypes [Ingress]: a default deny, then rules for the sources they serve."},
	KindUnprotectedEgress: {SeverityLow, "pods",
		"Select these pods with a NetworkPolicy of policyTypes [Egress] listing what they may reach (DNS included), if their egress should be limited."},
	KindObservedOneFamily: {SeverityLow, "flow records",
		"Check that the clients use both families (AAAA records, the Service's families, the application's resolver), unless one family is intended."},
	KindTruncated: {SeverityLow, "pod-class pairs",
		"Raise the bound of the analysis (dualflow audit findings --max-pairs) to see every gap."},
}

// Describe fills in each finding's Severity, Unit and Fix from its kind
// (Findings and ObservedGaps do; a caller building findings itself may).
func Describe(fs []Finding) {
	for i := range fs {
		k, ok := kinds[fs[i].Kind]
		if !ok {
			k.severity = SeverityLow
		}
		fs[i].Severity, fs[i].Unit, fs[i].Fix = k.severity, k.unit, k.fix
	}
}

// settle describes fs and sorts them by kind and message.
func settle(fs []Finding) {
	Describe(fs)
	sortFindings(fs)
}

// DualStack reports whether f is one of the dual-stack kinds.
func (f Finding) DualStack() bool { return strings.HasPrefix(f.Kind, "dual-stack-") }

// Ref points at a Kubernetes object, or at one rule of a NetworkPolicy.
type Ref struct {
	Kind      string `json:"kind"` // NetworkPolicy, Service, Deployment, StatefulSet, Pod, ...
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	// Direction and Rule name a NetworkPolicy rule (ingress or egress, its
	// index in that list); Rule is absent for the policy as a whole.
	Direction string `json:"direction,omitempty"`
	Rule      *int32 `json:"rule,omitempty"`
	// Role is the object's end of the traffic the finding is about,
	// RoleSource or RoleDestination (the UI's flows, reachability and
	// trace links ask about them); empty for a policy, or an object that
	// is neither (the backends of a Service).
	Role string `json:"role,omitempty"`
}

// Roles of a Ref.
const (
	RoleSource      = "source"
	RoleDestination = "destination"
)

// as returns r in role.
func (r Ref) as(role string) Ref {
	r.Role = role
	return r
}

// roles returns refs in role.
func roles(refs []Ref, role string) []Ref {
	out := make([]Ref, len(refs))
	for i, r := range refs {
		out[i] = r.as(role)
	}
	return out
}

func (r Ref) String() string {
	s := r.Kind + " " + r.Name
	if r.Namespace != "" {
		s = r.Kind + " " + r.Namespace + "/" + r.Name
	}
	switch {
	case r.Rule != nil:
		s += fmt.Sprintf(" %s rule %d", r.Direction, *r.Rule)
	case r.Direction != "":
		s += " (" + r.Direction + ")"
	}
	return s
}

func policyRef(ns, name string, d policy.Direction, rule int32) Ref {
	r := Ref{Kind: "NetworkPolicy", Namespace: ns, Name: name, Direction: d.String()}
	if rule >= 0 {
		r.Rule = &rule
	}
	return r
}

func workloadRef(ns string, w enrich.Workload) Ref {
	return Ref{Kind: w.Kind, Namespace: ns, Name: w.Name}
}

func decisionRef(d policy.Decision, dir policy.Direction) Ref {
	return policyRef(d.Namespace, d.Name, dir, d.Rule)
}

// Options bound the static analysis.
type Options struct {
	// MaxPairs bounds the (source, destination) pod-class pairs the
	// verdict-gap analysis evaluates (default 250000; pods with the same
	// namespace, labels, ports, workload and ipBlock coverage form one
	// class). Beyond it the analysis stops with a KindTruncated finding.
	MaxPairs int
}

const defaultMaxPairs = 250_000

// Findings runs every static analysis on view: invalid policies,
// unprotected workloads and dual-stack gaps. Findings are sorted by kind
// and message.
func Findings(view *enrich.Snapshot, opt Options) []Finding {
	set, err := policy.Compile(view.NetworkPolicies)
	out := invalidFindings(err)
	for _, u := range Unprotected(view, set) {
		out = append(out, u.Findings()...)
	}
	out = append(out, DualStackGaps(view, set, opt)...)
	settle(out)
	return out
}

func sortFindings(fs []Finding) {
	slices.SortStableFunc(fs, func(a, b Finding) int {
		return cmp.Or(cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.Message, b.Message))
	})
}

func invalidFindings(err error) []Finding {
	var out []Finding
	var joined interface{ Unwrap() []error }
	errs := []error{err}
	if errors.As(err, &joined) {
		errs = joined.Unwrap()
	}
	for _, e := range errs {
		var pe *policy.Error
		if !errors.As(e, &pe) {
			continue
		}
		out = append(out, Finding{Kind: KindInvalidPolicy,
			Message: fmt.Sprintf("NetworkPolicy %s/%s is ignored because the API would reject it: %v.", pe.Namespace, pe.Name, pe.Err),
			Objects: []Ref{{Kind: "NetworkPolicy", Namespace: pe.Namespace, Name: pe.Name}}})
	}
	return out
}

// UnprotectedWorkload is a workload some of whose pods no policy isolates
// in a direction.
type UnprotectedWorkload struct {
	Namespace string          `json:"namespace"`
	Workload  enrich.Workload `json:"workload"`
	// Pods is the number of the workload's pods; IngressPods and
	// EgressPods how many of them are not isolated in each direction.
	Pods        int `json:"pods"`
	IngressPods int `json:"ingress_pods"`
	EgressPods  int `json:"egress_pods"`
}

// Unprotected returns the workloads with pods that no policy of set
// isolates for ingress or for egress (host-network pods excepted:
// policies do not apply to them), sorted by namespace and workload.
func Unprotected(view *enrich.Snapshot, set *policy.Set) []UnprotectedWorkload {
	type key struct {
		ns string
		w  enrich.Workload
	}
	idx := map[key]*UnprotectedWorkload{}
	for _, p := range view.Pods {
		if p.HostNetwork {
			continue
		}
		k := key{p.Namespace, view.Workload(p)}
		u := idx[k]
		if u == nil {
			u = &UnprotectedWorkload{Namespace: p.Namespace, Workload: k.w}
			idx[k] = u
		}
		u.Pods++
		peer := peerOf(view, p, netip.Addr{})
		if !set.Isolated(policy.Ingress, &peer) {
			u.IngressPods++
		}
		if !set.Isolated(policy.Egress, &peer) {
			u.EgressPods++
		}
	}
	var out []UnprotectedWorkload
	for _, u := range idx { // sorted below: (namespace, workload) is the key
		if u.IngressPods > 0 || u.EgressPods > 0 {
			out = append(out, *u)
		}
	}
	slices.SortFunc(out, func(a, b UnprotectedWorkload) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Workload.Kind, b.Workload.Kind), cmp.Compare(a.Workload.Name, b.Workload.Name))
	})
	return out
}

// Findings returns u as findings, one per unprotected direction.
func (u UnprotectedWorkload) Findings() []Finding {
	var out []Finding
	ref := workloadRef(u.Namespace, u.Workload)
	// of says which pods, and the pronoun for them.
	of := func(n int) (string, string) {
		switch {
		case u.Pods == 1:
			return "its only pod", "it"
		case n == u.Pods:
			return fmt.Sprintf("all %d pods", n), "them"
		case n == 1:
			return fmt.Sprintf("1 of its %d pods", u.Pods), "it"
		}
		return fmt.Sprintf("%d of its %d pods", n, u.Pods), "them"
	}
	if u.IngressPods > 0 {
		which, them := of(u.IngressPods)
		out = append(out, Finding{Kind: KindUnprotectedIngress, Objects: []Ref{ref.as(RoleDestination)}, Count: uint64(u.IngressPods),
			Message: fmt.Sprintf("%s is not isolated for ingress (%s): no NetworkPolicy selects %s, so any source may connect.", ref, which, them)})
	}
	if u.EgressPods > 0 {
		which, them := of(u.EgressPods)
		out = append(out, Finding{Kind: KindUnprotectedEgress, Objects: []Ref{ref.as(RoleSource)}, Count: uint64(u.EgressPods),
			Message: fmt.Sprintf("%s is not isolated for egress (%s): no NetworkPolicy selects %s, so %s may connect anywhere.", ref, which, them, strings.Replace(them, "them", "they", 1))})
	}
	return out
}

// DualStackGaps finds where dual-stack policy treats the two families
// differently, from the cluster view alone: workload pairs allowed over one
// family and denied over the other (KindVerdictGap, evaluated on every
// container port of the destination), rules whose ipBlocks cover one
// family of dual-stack pods only (KindIPBlockOneFamily), and single-stack
// Services in front of dual-stack pods (KindServiceSingleStack). A
// cluster without dual-stack pods has none.
func DualStackGaps(view *enrich.Snapshot, set *policy.Set, opt Options) []Finding {
	opt.MaxPairs = defaults.Positive(opt.MaxPairs, defaultMaxPairs)
	blocks := policyBlocks(set)
	classes := dualClasses(view, blocks)
	if len(classes) == 0 {
		return nil
	}
	out := verdictGaps(view, set, classes, opt)
	out = append(out, ipBlockGaps(view, set, classes)...)
	out = append(out, serviceGaps(view)...)
	settle(out)
	return out
}

// podClass is a set of dual-stack pods that every policy treats alike:
// same namespace, labels, container ports, workload, and membership in
// every ipBlock of every policy for both addresses.
type podClass struct {
	rep      *enrich.Pod
	v4, v6   netip.Addr
	workload enrich.Workload
	pods     int
}

// policyBlocks returns every distinct ipBlock of set's policies.
func policyBlocks(set *policy.Set) []policy.Block {
	seen := map[string]bool{}
	var out []policy.Block
	for _, p := range set.Policies() {
		for _, r := range ruleBlocks(p) {
			for _, b := range r.blocks {
				k := fmt.Sprint(b.CIDR, b.Except)
				if !seen[k] {
					seen[k] = true
					out = append(out, b)
				}
			}
		}
	}
	return out
}

// blockRule is one rule of a policy with its ipBlocks.
type blockRule struct {
	dir    policy.Direction
	index  int32
	blocks []policy.Block
}

// ruleBlocks returns the rules of p (in its effective directions) that
// have ipBlock peers.
func ruleBlocks(p *networkingv1.NetworkPolicy) []blockRule {
	in, eg := policy.Types(p)
	var out []blockRule
	add := func(d policy.Direction, i int, peers []networkingv1.NetworkPolicyPeer) {
		var bs []policy.Block
		for _, pe := range peers {
			if pe.IPBlock == nil {
				continue
			}
			if b, err := policy.ParseBlock(pe.IPBlock); err == nil {
				bs = append(bs, b)
			}
		}
		if len(bs) > 0 {
			out = append(out, blockRule{dir: d, index: int32(i), blocks: bs})
		}
	}
	if in {
		for i, r := range p.Spec.Ingress {
			add(policy.Ingress, i, r.From)
		}
	}
	if eg {
		for i, r := range p.Spec.Egress {
			add(policy.Egress, i, r.To)
		}
	}
	return out
}

func dualClasses(view *enrich.Snapshot, blocks []policy.Block) []*podClass {
	idx := map[string]*podClass{}
	var out []*podClass
	var b strings.Builder
	for _, p := range view.Pods {
		if p.HostNetwork || !dualStack(p) {
			continue
		}
		v4, _ := enrich.AddrOfFamily(p.Addrs, 4)
		v6, _ := enrich.AddrOfFamily(p.Addrs, 6)
		w := view.Workload(p)
		b.Reset()
		fmt.Fprintf(&b, "%s\x00%s\x00%s\x00", p.Namespace, w.Kind, w.Name)
		b.WriteString(labels.Set(p.Labels).String())
		fmt.Fprintf(&b, "\x00%v\x00", p.Ports)
		for _, bl := range blocks {
			fmt.Fprintf(&b, "%t%t", bl.Contains(v4), bl.Contains(v6))
		}
		k := b.String()
		if c := idx[k]; c != nil {
			c.pods++
			continue
		}
		c := &podClass{rep: p, v4: v4, v6: v6, workload: w, pods: 1}
		idx[k] = c
		out = append(out, c)
	}
	return out
}

type gapKey struct {
	srcNS, dstNS string
	src, dst     enrich.Workload
	port         uint16
	proto        uint8
	allowedV     uint8 // the family that is allowed
}

type gap struct {
	key             gapKey
	pairs           uint64
	allow, deny     policy.Decision
	dir             policy.Direction
	firstSrc, first *enrich.Pod
	// why is the denied family's explanation for the first pod pair
	// (Auditor.Explain's sentence).
	why string
}

func verdictGaps(view *enrich.Snapshot, set *policy.Set, classes []*podClass, opt Options) []Finding {
	gaps := map[gapKey]*gap{} // the findings are sorted by message, which names the key
	pairsOf := func(sc, dc *podClass) uint64 {
		pairs := uint64(sc.pods) * uint64(dc.pods)
		if sc == dc {
			pairs -= uint64(sc.pods) // not a pod to itself
		}
		return pairs
	}
	evaluated, truncated := 0, false
	for _, sc := range classes {
		for _, dc := range classes {
			pairs := pairsOf(sc, dc)
			if pairs == 0 {
				continue
			}
			if evaluated >= opt.MaxPairs {
				truncated = true
				continue
			}
			evaluated++
			for _, pt := range dc.rep.Ports {
				port := uint16(pt.Port)
				f4 := podFlow(view, sc.rep, sc.v4, dc.rep, dc.v4, policy.ProtoNumber(&pt.Protocol), port)
				f6 := podFlow(view, sc.rep, sc.v6, dc.rep, dc.v6, policy.ProtoNumber(&pt.Protocol), port)
				r4, r6 := set.Evaluate(&f4), set.Evaluate(&f6)
				if r4.Allowed() == r6.Allowed() {
					continue
				}
				allowedV, ok, bad, badFlow := uint8(4), r4, r6, &f6
				if r6.Allowed() {
					allowedV, ok, bad, badFlow = 6, r6, r4, &f4
				}
				dir := policy.Egress
				if bad.Egress.Allowed() {
					dir = policy.Ingress
				}
				k := gapKey{sc.rep.Namespace, dc.rep.Namespace, sc.workload, dc.workload, port, policy.ProtoNumber(&pt.Protocol), allowedV}
				g := gaps[k]
				if g == nil {
					g = &gap{key: k, allow: ok.Side(dir), deny: bad.Side(dir), dir: dir, firstSrc: sc.rep, first: dc.rep}
					d, _ := explainDenial(set, badFlow, sc.rep.Namespace+"/"+sc.rep.Name, dc.rep.Namespace+"/"+dc.rep.Name)
					g.why = d.Text
					gaps[k] = g
				}
				g.pairs += pairs
			}
		}
	}
	// The dual-stack pod pairs of each workload pair with a gap (counted
	// for those only: a map of every class pair's workload pair took
	// most of the time and memory of a 2,000-workload audit).
	type wref struct {
		ns string
		w  enrich.Workload
	}
	byWorkload := map[wref][]*podClass{}
	if len(gaps) > 0 {
		for _, c := range classes {
			k := wref{c.rep.Namespace, c.workload}
			byWorkload[k] = append(byWorkload[k], c)
		}
	}
	var out []Finding
	for k, g := range gaps {
		src, dst := workloadRef(k.srcNS, k.src), workloadRef(k.dstNS, k.dst)
		other := uint8(10 - k.allowedV)
		var total uint64
		for _, sc := range byWorkload[wref{k.srcNS, k.src}] {
			for _, dc := range byWorkload[wref{k.dstNS, k.dst}] {
				total += pairsOf(sc, dc)
			}
		}
		why := fmt.Sprintf("IPv%d %s", other, explain(g.deny, g.dir))
		if g.why != "" {
			why = fmt.Sprintf("IPv%d: %s", other, g.why) // the one explanation of a drop
		}
		msg := fmt.Sprintf("%s → %s on %d/%s is allowed over IPv%d but denied over IPv%d (%d of %d dual-stack pod pairs): IPv%d %s; %s.",
			src, dst, k.port, flow.ProtoName(k.proto), k.allowedV, other, g.pairs, total,
			k.allowedV, explain(g.allow, g.dir), why)
		out = append(out, Finding{Kind: KindVerdictGap, Message: msg, Port: k.port, Protocol: flow.ProtoName(k.proto), Count: g.pairs,
			Objects: append([]Ref{src.as(RoleSource), dst.as(RoleDestination)}, decisionRefs(g.dir, g.allow, g.deny)...)})
	}
	if truncated {
		out = append(out, Finding{Kind: KindTruncated, Count: uint64(opt.MaxPairs),
			Message: fmt.Sprintf("The dual-stack verdict-gap analysis stopped after %d pod-class pairs; raise the limit to see every gap.", opt.MaxPairs)})
	}
	return out
}

// explain says in a few words why a side decided as it did.
func explain(d policy.Decision, dir policy.Direction) string {
	switch d.Verdict {
	case flow.VerdictAllowed:
		return fmt.Sprintf("is allowed by %s", decisionRef(d, dir))
	case flow.VerdictDenied:
		end := "destination"
		if dir == policy.Egress {
			end = "source"
		}
		return fmt.Sprintf("is denied because no rule allows it and NetworkPolicy %s/%s isolates the %s for %s", d.Namespace, d.Name, end, dir)
	case flow.VerdictNotIsolated:
		return fmt.Sprintf("is not isolated for %s", dir)
	}
	return "is not subject to policy"
}

// decisionRefs returns the policies (or rules) the decisions name.
func decisionRefs(dir policy.Direction, ds ...policy.Decision) []Ref {
	var out []Ref
	for _, d := range ds {
		if d.Name != "" {
			out = append(out, decisionRef(d, dir))
		}
	}
	return out
}

// ipBlockGaps reports rules whose ipBlocks cover one family of dual-stack
// pods only. A rule with blocks of one family is reported once, with the
// workloads it covers; a rule with blocks of both families is reported
// per workload whose two addresses it covers differently.
func ipBlockGaps(view *enrich.Snapshot, set *policy.Set, classes []*podClass) []Finding {
	var out []Finding
	for _, p := range set.Policies() {
		selected := selectedWorkloads(view, p)
		for _, r := range ruleBlocks(p) {
			// The covered peers are the rule's sources (ingress) or
			// destinations (egress); the policy's pods the other end.
			peer, own := RoleSource, RoleDestination
			if r.dir == policy.Egress {
				peer, own = RoleDestination, RoleSource
			}
			port, proto := rulePort(p, r)
			gap := func(msg string, count int, covered []Ref) Finding {
				objs := append([]Ref{policyRef(p.Namespace, p.Name, r.dir, r.index)}, roles(covered, peer)...)
				return Finding{Kind: KindIPBlockOneFamily, Message: msg, Count: uint64(count), Port: port, Protocol: proto,
					Objects: append(objs, roles(selected, own)...)}
			}
			has4, has6 := false, false
			var cidrs []string
			for _, b := range r.blocks {
				has4 = has4 || b.CIDR.Addr().Is4()
				has6 = has6 || b.CIDR.Addr().Is6()
				c := b.CIDR.String()
				if len(b.Except) > 0 {
					c += " except " + join(b.Except)
				}
				cidrs = append(cidrs, c)
			}
			covers := func(a netip.Addr) bool {
				return slices.ContainsFunc(r.blocks, func(b policy.Block) bool { return b.Contains(a) })
			}
			what := fmt.Sprintf("%s rule %d of NetworkPolicy %s/%s", r.dir, r.index, p.Namespace, p.Name)
			if has4 != has6 {
				fam, missing := 4, 6
				if has6 {
					fam, missing = 6, 4
				}
				var ws []Ref
				pods := 0
				seen := map[Ref]bool{}
				for _, c := range classes {
					a := c.v4
					if fam == 6 {
						a = c.v6
					}
					if !covers(a) {
						continue
					}
					pods += c.pods
					if w := workloadRef(c.rep.Namespace, c.workload); !seen[w] {
						seen[w] = true
						ws = append(ws, w)
					}
				}
				msg := fmt.Sprintf("The ipBlocks of %s are IPv%d only (%s) in a dual-stack cluster, so the rule never matches IPv%d", what, fam, strings.Join(cidrs, ", "), missing)
				if pods > 0 {
					msg += fmt.Sprintf(": it covers the IPv%d addresses of %d dual-stack pods (%s) but not their IPv%d addresses.", fam, pods, join(ws), missing)
				} else {
					msg += " traffic to or from the same peers."
				}
				out = append(out, gap(msg, pods, ws))
				continue
			}
			type wk struct {
				ref     Ref
				covered uint8
			}
			per := map[wk]int{} // the findings are sorted by message, which names the key
			for _, c := range classes {
				in4, in6 := covers(c.v4), covers(c.v6)
				if in4 == in6 {
					continue
				}
				k := wk{workloadRef(c.rep.Namespace, c.workload), 4}
				if in6 {
					k.covered = 6
				}
				per[k] += c.pods
			}
			for k, n := range per {
				out = append(out, gap(fmt.Sprintf("The ipBlocks of %s (%s) cover the IPv%d addresses of %d dual-stack pods of %s but not their IPv%d addresses.",
					what, strings.Join(cidrs, ", "), k.covered, n, k.ref, 10-k.covered), n, []Ref{k.ref}))
			}
		}
	}
	return out
}

// selectedWorkloads are the workloads of the pods p selects (off the host
// network), in the order of the view's pods.
func selectedWorkloads(view *enrich.Snapshot, p *networkingv1.NetworkPolicy) []Ref {
	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
	if err != nil {
		return nil
	}
	var out []Ref
	for _, pod := range view.Pods {
		if pod.Namespace != p.Namespace || pod.HostNetwork || !sel.Matches(labels.Set(pod.Labels)) {
			continue
		}
		if w := workloadRef(pod.Namespace, view.Workload(pod)); !slices.Contains(out, w) {
			out = append(out, w)
		}
	}
	return out
}

// rulePort is the first port number of rule r of p and its protocol
// (0 and "" when the rule has none: every port, or named ports only).
func rulePort(p *networkingv1.NetworkPolicy, r blockRule) (uint16, string) {
	var ports []networkingv1.NetworkPolicyPort
	switch {
	case r.dir == policy.Ingress && int(r.index) < len(p.Spec.Ingress):
		ports = p.Spec.Ingress[r.index].Ports
	case r.dir == policy.Egress && int(r.index) < len(p.Spec.Egress):
		ports = p.Spec.Egress[r.index].Ports
	}
	for _, pt := range ports {
		if pt.Port != nil && pt.Port.Type == intstr.Int && pt.Port.IntVal > 0 {
			return uint16(pt.Port.IntVal), flow.ProtoName(policy.ProtoNumber(pt.Protocol))
		}
	}
	return 0, ""
}

// join lists xs, comma-separated.
func join[T fmt.Stringer](xs []T) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = x.String()
	}
	return strings.Join(s, ", ")
}

// serviceGaps reports single-stack Services that select dual-stack pods.
func serviceGaps(view *enrich.Snapshot) []Finding {
	var out []Finding
	for _, s := range view.Services {
		families := s.IPFamilies
		if len(families) == 0 && len(s.ClusterIPs) == 1 { // a manifest without spec.ipFamilies
			families = []corev1.IPFamily{corev1.IPv4Protocol}
			if s.ClusterIPs[0].Is6() {
				families[0] = corev1.IPv6Protocol
			}
		}
		if len(s.Selector) == 0 || len(families) != 1 {
			continue
		}
		sel := labels.SelectorFromSet(s.Selector)
		dual, total := 0, 0
		var ws []Ref
		seen := map[Ref]bool{}
		for _, p := range view.Pods {
			if p.Namespace != s.Namespace || p.HostNetwork || !sel.Matches(labels.Set(p.Labels)) {
				continue
			}
			total++
			if !dualStack(p) {
				continue
			}
			dual++
			if w := workloadRef(p.Namespace, view.Workload(p)); !seen[w] {
				seen[w] = true
				ws = append(ws, w)
			}
		}
		if dual == 0 {
			continue
		}
		fam := "IPv4"
		if families[0] == corev1.IPv6Protocol {
			fam = "IPv6"
		}
		ref := Ref{Kind: "Service", Namespace: s.Namespace, Name: s.Name}
		// Its clients are not known here: the Service is the destination.
		var port uint16
		var proto string
		if len(s.Ports) > 0 {
			port, proto = uint16(s.Ports[0].Port), flow.ProtoName(policy.ProtoNumber(&s.Ports[0].Protocol))
		}
		out = append(out, Finding{Kind: KindServiceSingleStack, Count: uint64(dual), Objects: append([]Ref{ref.as(RoleDestination)}, ws...), Port: port, Protocol: proto,
			Message: fmt.Sprintf("%s is single-stack (%s) while %d of its %d pods (%s) are dual-stack, so clients can reach them through it over %s only.",
				ref, fam, dual, total, join(ws), fam)})
	}
	return out
}
