package recommend

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
)

// closeGaps recommends, for every current policy of the scope (of its
// namespace, or selecting a pod of its workload), the policy with the
// missing family added to each rule whose ipBlocks are of one family.
func closeGaps(c *cluster, scoped []*workload, rec *Recommendation) {
	set, err := policy.Compile(c.view.NetworkPolicies)
	if err != nil {
		rec.Notes = append(rec.Notes, fmt.Sprintf("Invalid policies are left as they are: %v.", err))
	}
	for _, p := range set.Policies() {
		if !policyInScope(p, scoped, rec.Scope) {
			continue
		}
		cp := cleanCopy(p)
		in, eg := policy.Types(p)
		changed := false
		var inC, egC []string
		var unknown []string
		if in {
			for i := range cp.Spec.Ingress {
				add, comment, unk := c.counterparts(cp.Spec.Ingress[i].From)
				cp.Spec.Ingress[i].From = append(cp.Spec.Ingress[i].From, add...)
				changed = changed || len(add) > 0
				inC = append(inC, comment)
				unknown = append(unknown, unk...)
			}
		}
		if eg {
			for i := range cp.Spec.Egress {
				add, comment, unk := c.counterparts(cp.Spec.Egress[i].To)
				cp.Spec.Egress[i].To = append(cp.Spec.Egress[i].To, add...)
				changed = changed || len(add) > 0
				egC = append(egC, comment)
				unknown = append(unknown, unk...)
			}
		}
		for _, u := range unknown {
			rec.Notes = append(rec.Notes, fmt.Sprintf("NetworkPolicy %s/%s: %s", p.Namespace, p.Name, u))
		}
		if !changed {
			continue
		}
		rec.Policies = append(rec.Policies, Policy{Policy: cp, Ingress: inC, Egress: egC,
			Note: fmt.Sprintf("NetworkPolicy %s/%s as it is, with the missing family added to its one-family ipBlock rules (close-gaps).", p.Namespace, p.Name)})
	}
}

// policyInScope reports whether p belongs to the scope: any policy for
// the cluster, the namespace's, or one selecting a pod of the workload.
func policyInScope(p *networkingv1.NetworkPolicy, scoped []*workload, s Scope) bool {
	if s.Namespace != "" && p.Namespace != s.Namespace {
		return false
	}
	if s.Workload == "" {
		return true
	}
	sel, err := metav1.LabelSelectorAsSelector(&p.Spec.PodSelector)
	if err != nil {
		return false
	}
	for _, wl := range scoped {
		for _, pod := range wl.pods {
			if pod.Namespace == p.Namespace && sel.Matches(labels.Set(pod.Labels)) {
				return true
			}
		}
	}
	return false
}

// cleanCopy is p as kubectl apply takes it back: its spec, name,
// namespace, labels and annotations (the last applied configuration
// left out), without the server's fields.
func cleanCopy(p *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	cp := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: p.Name, Labels: maps.Clone(p.Labels)},
		Spec:       *p.Spec.DeepCopy(),
	}
	if len(p.Annotations) > 0 {
		cp.Annotations = maps.Clone(p.Annotations)
		delete(cp.Annotations, "kubectl.kubernetes.io/last-applied-configuration")
		if len(cp.Annotations) == 0 {
			cp.Annotations = nil
		}
	}
	return cp
}

// counterparts returns, for a rule's peers, the ipBlocks of one family
// that cover what its ipBlocks of the other family cover and its blocks
// of that family do not: each node pod CIDR a block holds whole (and
// does not except) maps to the node's pod CIDR of the other family, each
// node address to the node's addresses of the other family, and a pod
// address outside those CIDRs to the pod's address of the other family.
// A rule with blocks of one family gets the other's whole; a rule with
// blocks of both gets what one family's blocks miss (a node's pods
// allowed over IPv4 but not IPv6). It says what it added (comment) and,
// for a one-family rule, which blocks have no known counterpart
// (unknown).
func (c *cluster) counterparts(peers []networkingv1.NetworkPolicyPeer) (add []networkingv1.NetworkPolicyPeer, comment string, unknown []string) {
	var blocks [2][]policy.Block
	for _, pe := range peers {
		if pe.IPBlock == nil {
			continue
		}
		b, err := policy.ParseBlock(pe.IPBlock)
		if err != nil {
			return nil, "", nil
		}
		i := fi(flow.Version(b.CIDR.Addr()))
		blocks[i] = append(blocks[i], b)
	}
	mixed := len(blocks[0]) > 0 && len(blocks[1]) > 0
	var comments []string
	for _, f := range []uint8{4, 6} {
		o := uint8(10 - f)
		if len(blocks[fi(f)]) == 0 || !c.families[fi(o)] {
			continue // no block of f, or no pod has the other family: no gap
		}
		a, why, unk := c.familyCounterparts(blocks[fi(f)], blocks[fi(o)], f, o)
		add = append(add, a...)
		if !mixed {
			unknown = append(unknown, unk...)
		}
		switch {
		case len(a) == 0:
		case mixed:
			comments = append(comments, fmt.Sprintf("The IPv%d ipBlocks of this rule cover pods or nodes its IPv%d ipBlocks do not; added their IPv%d counterpart, %s.", f, o, o, why))
		default:
			comments = append(comments, fmt.Sprintf("The ipBlocks of this rule were IPv%d only; added their IPv%d counterpart, %s.", f, o, why))
		}
	}
	return add, strings.Join(comments, " "), unknown
}

// familyCounterparts returns the blocks of family o that cover what the
// blocks fb of family f cover, less what the blocks ob of family o
// already cover; why says what each was added for.
func (c *cluster) familyCounterparts(fb, ob []policy.Block, f, o uint8) (add []networkingv1.NetworkPolicyPeer, why string, unknown []string) {
	covered := func(p netip.Prefix) bool {
		return slices.ContainsFunc(ob, func(b policy.Block) bool {
			return b.CIDR.Bits() <= p.Bits() && b.CIDR.Contains(p.Addr()) &&
				!slices.ContainsFunc(b.Except, func(e netip.Prefix) bool { return e.Overlaps(p) })
		})
	}
	prefixes := map[netip.Prefix]bool{}
	var whys []string
	for _, b := range fb {
		var found []string
		held := false             // the block holds something of the cluster
		var mapped []netip.Prefix // node pod CIDRs of family f handled whole
		for _, n := range c.view.Nodes {
			nf, ok1 := cidrOf(n.PodCIDRs, f)
			no, ok2 := cidrOf(n.PodCIDRs, o)
			if !ok1 || b.CIDR.Bits() > nf.Bits() || !b.CIDR.Contains(nf.Addr()) {
				continue
			}
			excluded, partial := false, false
			for _, e := range b.Except {
				switch {
				case e.Bits() <= nf.Bits() && e.Contains(nf.Addr()):
					excluded = true
				case e.Overlaps(nf):
					partial = true
				}
			}
			switch {
			case excluded:
				mapped = append(mapped, nf)
				found = append(found, fmt.Sprintf("%s's pods stay excepted", n.Name))
			case partial || !ok2:
			default:
				mapped, held = append(mapped, nf), true
				if !covered(no) {
					prefixes[no] = true
					found = append(found, fmt.Sprintf("pod CIDR %s of %s for %s", no, n.Name, nf))
				}
			}
		}
		for _, n := range c.view.Nodes {
			var in bool
			for _, a := range n.InternalIPs {
				in = in || (flow.Version(a) == f && b.Contains(a))
			}
			if !in {
				continue
			}
			held = true
			var others []string
			for _, a := range addrsOf(n) {
				if p := netip.PrefixFrom(a, a.BitLen()); flow.Version(a) == o && !covered(p) {
					prefixes[p] = true
					others = append(others, a.String())
				}
			}
			if len(others) > 0 {
				found = append(found, fmt.Sprintf("the address %s of %s", strings.Join(others, ", "), n.Name))
			}
		}
		var pods []string
		for _, p := range c.view.Pods {
			af, ok := enrich.AddrOfFamily(p.Addrs, f)
			if p.HostNetwork || !ok || !b.Contains(af) || slices.ContainsFunc(mapped, func(m netip.Prefix) bool { return m.Contains(af) }) {
				continue
			}
			if ao, ok := enrich.AddrOfFamily(p.Addrs, o); ok {
				held = true
				if q := netip.PrefixFrom(ao, ao.BitLen()); !covered(q) {
					prefixes[q] = true
					pods = append(pods, p.Namespace+"/"+p.Name)
				}
			}
		}
		if len(pods) > 0 {
			found = append(found, fmt.Sprintf("the IPv%d addresses of pods %s, whose IPv%d addresses are in no node pod CIDR", o, strings.Join(pods, ", "), f))
		}
		if !held && len(found) == 0 {
			unknown = append(unknown, fmt.Sprintf("the IPv%d block %s holds no pod or node of the cluster: its IPv%d counterpart is not known, add it by hand if it has one.", f, blockText(b), o))
			continue
		}
		if len(found) > 0 {
			whys = append(whys, fmt.Sprintf("for %s: %s", blockText(b), strings.Join(found, "; ")))
		}
	}
	// A prefix inside another added one is left out.
	keep := slices.SortedFunc(maps.Keys(prefixes), func(a, b netip.Prefix) int { return cmpAddr(a.Addr(), b.Addr()) })
	for _, p := range keep {
		if slices.ContainsFunc(keep, func(q netip.Prefix) bool { return q != p && q.Bits() < p.Bits() && q.Contains(p.Addr()) }) {
			continue
		}
		add = append(add, blockPeer(p))
	}
	if len(add) == 0 {
		return nil, "", unknown
	}
	return add, strings.Join(whys, "; "), unknown
}

// cidrOf returns the prefix of family v in ps.
func cidrOf(ps []netip.Prefix, v uint8) (netip.Prefix, bool) {
	for _, p := range ps {
		if flow.Version(p.Addr()) == v {
			return p.Masked(), true
		}
	}
	return netip.Prefix{}, false
}

func blockText(b policy.Block) string {
	s := b.CIDR.String()
	if len(b.Except) > 0 {
		ex := make([]string, len(b.Except))
		for i, e := range b.Except {
			ex[i] = e.String()
		}
		s += " except " + strings.Join(ex, ", ")
	}
	return s
}
