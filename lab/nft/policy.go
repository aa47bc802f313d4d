package nft

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/dualflow/dualflow/lab/manifest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// PolicyTypes returns the effective policy types of p: spec.policyTypes, or
// when unset Ingress plus Egress if the policy has egress rules (the
// Kubernetes defaulting rule).
func PolicyTypes(p *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0
	}
	for _, t := range p.Spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

// policies renders, for every pod on the node that some policy isolates, a
// chain per isolated direction holding the rules of every policy that
// selects the pod, followed by the drop rule.
func (r *renderer) policies() error {
	pols := slices.Clone(r.m.NetworkPolicies)
	slices.SortFunc(pols, func(a, b networkingv1.NetworkPolicy) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	// Declare a counter for every rule of every policy, so that counter
	// names do not depend on which pods a node hosts.
	for _, p := range pols {
		for i := range p.Spec.Ingress {
			r.counters = append(r.counters, RuleName(p.Namespace, p.Name, Ingress, i))
		}
		for i := range p.Spec.Egress {
			r.counters = append(r.counters, RuleName(p.Namespace, p.Name, Egress, i))
		}
	}
	sel := make([]labels.Selector, len(pols))
	for i := range pols {
		s, err := metav1.LabelSelectorAsSelector(&pols[i].Spec.PodSelector)
		if err != nil {
			return fmt.Errorf("policy %s/%s: pod selector: %w", pols[i].Namespace, pols[i].Name, err)
		}
		sel[i] = s
	}
	for _, pod := range r.m.PodsOnNode(r.node) {
		iface := pod.Annotations[manifest.AnnotationHostIface]
		var in, eg []*networkingv1.NetworkPolicy
		for i := range pols {
			p := &pols[i]
			if p.Namespace != pod.Namespace || !sel[i].Matches(labels.Set(pod.Labels)) {
				continue
			}
			ing, egr := PolicyTypes(p)
			if ing {
				in = append(in, p)
			}
			if egr {
				eg = append(eg, p)
			}
		}
		for _, d := range []struct {
			dir  Direction
			pols []*networkingv1.NetworkPolicy
		}{{Ingress, in}, {Egress, eg}} {
			if len(d.pols) == 0 {
				continue
			}
			if iface == "" {
				return fmt.Errorf("pod %s/%s: no %s annotation", pod.Namespace, pod.Name, manifest.AnnotationHostIface)
			}
			c, err := r.podChain(pod, d.dir, d.pols)
			if err != nil {
				return err
			}
			r.chains = append(r.chains, c)
			entry := fmt.Sprintf("%s : jump %s", quote(iface), c.name)
			if d.dir == Ingress {
				r.dispatchI = append(r.dispatchI, entry)
			} else {
				r.dispatchE = append(r.dispatchE, entry)
			}
		}
	}
	return nil
}

func (r *renderer) podChain(pod *corev1.Pod, dir Direction, pols []*networkingv1.NetworkPolicy) (chain, error) {
	c := chain{name: ident(string(dir) + "/" + pod.Namespace + "/" + pod.Name)}
	// Ingress ends the forward chain on a match; egress returns to it, so
	// that a pod-to-pod flow on one node also passes the ingress check.
	verdict := "accept"
	if dir == Egress {
		verdict = "return"
	}
	for _, p := range pols {
		n := len(p.Spec.Ingress)
		if dir == Egress {
			n = len(p.Spec.Egress)
		}
		for i := range n {
			var peers []networkingv1.NetworkPolicyPeer
			var ports []networkingv1.NetworkPolicyPort
			if dir == Ingress {
				peers, ports = p.Spec.Ingress[i].From, p.Spec.Ingress[i].Ports
			} else {
				peers, ports = p.Spec.Egress[i].To, p.Spec.Egress[i].Ports
			}
			name := RuleName(p.Namespace, p.Name, dir, i)
			matches, err := r.ruleMatches(p, pod, dir, peers, ports)
			if err != nil {
				return chain{}, fmt.Errorf("policy %s/%s %s rule %d: %w", p.Namespace, p.Name, dir, i, err)
			}
			for _, mt := range matches {
				c.rules = append(c.rules, fmt.Sprintf("%s counter name %s %s comment %s", mt, name, verdict, quote(name)))
			}
		}
	}
	drop := DropName(dir, pod.Namespace, pod.Name)
	prefix := drop
	if len(prefix) > 127 { // NF_LOG_PREFIXLEN is 128 with the NUL
		prefix = prefix[:127]
	}
	c.rules = append(c.rules, fmt.Sprintf("counter name %s log prefix %s group %d drop comment %s", drop, quote(prefix), r.opts.LogGroup, quote(drop)))
	r.counters = append(r.counters, drop)
	return c, nil
}

// peerSet is one NetworkPolicy peer, resolved.
type peerSet struct {
	any    bool          // no peers: every address
	pods   []*corev1.Pod // pod/namespace selector peers
	block  netip.Prefix  // ipBlock peer
	except []netip.Prefix
	isPods bool
}

func (r *renderer) resolvePeers(p *networkingv1.NetworkPolicy, peers []networkingv1.NetworkPolicyPeer) ([]peerSet, error) {
	if len(peers) == 0 {
		return []peerSet{{any: true}}, nil
	}
	var out []peerSet
	for j, peer := range peers {
		if peer.IPBlock != nil {
			ps := peerSet{}
			b, err := netip.ParsePrefix(peer.IPBlock.CIDR)
			if err != nil {
				return nil, fmt.Errorf("peer %d: ipBlock cidr: %w", j, err)
			}
			ps.block = b.Masked()
			for _, e := range peer.IPBlock.Except {
				ep, err := netip.ParsePrefix(e)
				if err != nil {
					return nil, fmt.Errorf("peer %d: ipBlock except: %w", j, err)
				}
				ps.except = append(ps.except, ep.Masked())
			}
			out = append(out, ps)
			continue
		}
		var podSel, nsSel labels.Selector = labels.Everything(), nil
		var err error
		if peer.PodSelector != nil {
			if podSel, err = metav1.LabelSelectorAsSelector(peer.PodSelector); err != nil {
				return nil, fmt.Errorf("peer %d: pod selector: %w", j, err)
			}
		}
		if peer.NamespaceSelector != nil {
			if nsSel, err = metav1.LabelSelectorAsSelector(peer.NamespaceSelector); err != nil {
				return nil, fmt.Errorf("peer %d: namespace selector: %w", j, err)
			}
		}
		ps := peerSet{isPods: true}
		for i := range r.m.Pods {
			pod := &r.m.Pods[i]
			inNS := pod.Namespace == p.Namespace
			if nsSel != nil {
				inNS = nsSel.Matches(r.nsLabels[pod.Namespace])
			}
			if inNS && podSel.Matches(labels.Set(pod.Labels)) {
				ps.pods = append(ps.pods, pod)
			}
		}
		out = append(out, ps)
	}
	return out, nil
}

// ruleMatches returns the match part of every nft rule that one policy rule
// needs: one per peer, family and port (named ports may add more, one per
// distinct port number). A peer that resolves to nothing in a family adds no
// rule: nft has no empty anonymous sets, and such a rule matches nothing.
func (r *renderer) ruleMatches(p *networkingv1.NetworkPolicy, pod *corev1.Pod, dir Direction, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) ([]string, error) {
	ps, err := r.resolvePeers(p, peers)
	if err != nil {
		return nil, err
	}
	peerKW := "saddr" // ingress: the peer is the source
	if dir == Egress {
		peerKW = "daddr"
	}
	var out []string
	for _, peer := range ps {
		for _, f := range families {
			l3, ok := peerMatch(peer, f, peerKW)
			if !ok {
				continue
			}
			pm, err := r.portMatches(ports, dir, pod, peer, f)
			if err != nil {
				return nil, err
			}
			for _, m := range pm {
				out = append(out, strings.TrimSpace(l3+" "+m))
			}
		}
	}
	return out, nil
}

// peerMatch returns the address match of peer in family f.
func peerMatch(peer peerSet, f family, kw string) (string, bool) {
	switch {
	case peer.any:
		return "meta nfproto " + f.nfp, true
	case peer.isPods:
		addrs := podAddrs(peer.pods, f)
		if len(addrs) == 0 {
			return "", false
		}
		return fmt.Sprintf("%s %s %s", f.l3, kw, set(addrs)), true
	default:
		if familyOf(peer.block.Addr()) != f {
			return "", false
		}
		s := fmt.Sprintf("%s %s %s", f.l3, kw, peer.block)
		var ex []string
		for _, e := range peer.except {
			if familyOf(e.Addr()) == f {
				ex = append(ex, e.String())
			}
		}
		if len(ex) > 0 {
			s += fmt.Sprintf(" %s %s != %s", f.l3, kw, set(ex))
		}
		return s, true
	}
}

func podAddrs(pods []*corev1.Pod, f family) []string {
	var out []string
	for _, p := range pods {
		if a, ok := manifest.PodAddr(p, f.k8s); ok {
			out = append(out, a.String())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func set(elems []string) string { return "{ " + strings.Join(elems, ", ") + " }" }

// portMatches returns the L4 matches of a rule's ports in family f. With no
// ports it returns one empty match (every protocol, ICMP included).
//
// A named port resolves against the pod that owns it: for ingress the
// selected (local) pod; for egress every destination pod the peer selects,
// or every pod of the manifest when the peer is an ipBlock or absent. In
// the egress case the rule also matches the destination address, one rule
// per distinct port number.
func (r *renderer) portMatches(ports []networkingv1.NetworkPolicyPort, dir Direction, pod *corev1.Pod, peer peerSet, f family) ([]string, error) {
	if len(ports) == 0 {
		return []string{""}, nil
	}
	var out []string
	for _, pp := range ports {
		proto := lowerProto(pp.Protocol)
		switch {
		case pp.Port == nil:
			out = append(out, "meta l4proto "+proto)
		case pp.Port.Type == intstr.Int:
			if pp.Port.IntVal < 1 || pp.Port.IntVal > 65535 {
				return nil, fmt.Errorf("port %d out of range", pp.Port.IntVal)
			}
			if pp.EndPort != nil && *pp.EndPort > pp.Port.IntVal {
				if *pp.EndPort > 65535 {
					return nil, fmt.Errorf("endPort %d out of range", *pp.EndPort)
				}
				out = append(out, fmt.Sprintf("%s dport %d-%d", proto, pp.Port.IntVal, *pp.EndPort))
			} else {
				out = append(out, fmt.Sprintf("%s dport %d", proto, pp.Port.IntVal))
			}
		case dir == Ingress:
			// endPort is ignored with a named port (the API rejects the pair).
			if n, ok := manifest.ContainerPort(pod, pp.Port.StrVal, corev1.Protocol(strings.ToUpper(proto))); ok {
				out = append(out, fmt.Sprintf("%s dport %d", proto, n))
			}
		default:
			cands := peer.pods
			if !peer.isPods {
				cands = nil
				for i := range r.m.Pods {
					cands = append(cands, &r.m.Pods[i])
				}
			}
			byNum := map[int32][]*corev1.Pod{}
			var nums []int32
			for _, c := range cands {
				n, ok := manifest.ContainerPort(c, pp.Port.StrVal, corev1.Protocol(strings.ToUpper(proto)))
				if !ok {
					continue
				}
				if _, seen := byNum[n]; !seen {
					nums = append(nums, n)
				}
				byNum[n] = append(byNum[n], c)
			}
			slices.Sort(nums)
			for _, n := range nums {
				addrs := podAddrs(byNum[n], f)
				if len(addrs) == 0 {
					continue
				}
				out = append(out, fmt.Sprintf("%s daddr %s %s dport %d", f.l3, set(addrs), proto, n))
			}
		}
	}
	return out, nil
}
