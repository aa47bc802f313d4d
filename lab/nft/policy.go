package nft

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/lab/manifest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// PodPolicy is what one pod enforces in one direction: the rules of
// every policy that selects it, in evaluation order (policies sorted by
// namespace/name, rules in spec order), then a drop of everything else.
// It is the datapath-independent policy model that Render (nftables) and
// the lab's Open vSwitch datapath both translate.
type PodPolicy struct {
	Pod   *corev1.Pod
	Iface string // the pod's host-side interface
	Dir   Direction
	Rules []PolicyRule
	// Drop is the name of the drop rule (DropName).
	Drop string
}

// PolicyRule is one rule of one NetworkPolicy as it applies to one pod.
type PolicyRule struct {
	Name      string // RuleName
	Namespace string
	Policy    string
	Index     int
	// Matches are alternatives: the rule allows a packet that one of them
	// matches. A rule whose peers resolve to nothing has none.
	Matches []Match
}

// Match is one family, one peer and one port of a policy rule.
type Match struct {
	Family corev1.IPFamily
	Peer   Peer
	L4     L4
}

// Peer is the address side of a match: the source for ingress, the
// destination for egress. Exactly one of Any, Addrs and Block is set.
type Peer struct {
	Any    bool           // every address of the family
	Addrs  []netip.Addr   // selected pods' addresses
	Block  netip.Prefix   // an ipBlock, minus Except
	Except []netip.Prefix // of the same family
}

// L4 is the protocol and port side of a match.
type L4 struct {
	// Proto is "tcp", "udp" or "sctp"; empty matches every protocol
	// (ICMP included) and has no port.
	Proto string
	// Port is the destination port (0: every port of Proto); EndPort,
	// when above Port, makes it the range Port..EndPort.
	Port, EndPort int32
	// DstAddrs, when set, limits the match to these destinations (an
	// egress named port resolved on destination pods).
	DstAddrs []netip.Addr
}

// Policies returns the PodPolicy of every pod on node that a policy
// isolates, per direction, in manifest pod order (ingress before egress).
func Policies(m *manifest.Manifest, node string) ([]PodPolicy, error) {
	r, err := newRenderer(m, node, Options{})
	if err != nil {
		return nil, fmt.Errorf("policies: %w", err)
	}
	return r.podPolicies()
}

// sortedPolicies returns the manifest's policies sorted by namespace/name,
// the order rules are evaluated in.
func (r *renderer) sortedPolicies() []networkingv1.NetworkPolicy {
	pols := slices.Clone(r.m.NetworkPolicies)
	slices.SortFunc(pols, func(a, b networkingv1.NetworkPolicy) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return pols
}

// podPolicies resolves, for every pod on the node that some policy
// isolates, the rules of every policy that selects it per direction.
func (r *renderer) podPolicies() ([]PodPolicy, error) {
	pols := r.sortedPolicies()
	sel := make([]labels.Selector, len(pols))
	for i := range pols {
		s, err := metav1.LabelSelectorAsSelector(&pols[i].Spec.PodSelector)
		if err != nil {
			return nil, fmt.Errorf("policy %s/%s: pod selector: %w", pols[i].Namespace, pols[i].Name, err)
		}
		sel[i] = s
	}
	var out []PodPolicy
	for _, pod := range r.m.PodsOnNode(r.node) {
		iface := pod.Annotations[manifest.AnnotationHostIface]
		var in, eg []*networkingv1.NetworkPolicy
		for i := range pols {
			p := &pols[i]
			if p.Namespace != pod.Namespace || !sel[i].Matches(labels.Set(pod.Labels)) {
				continue
			}
			ing, egr := policy.Types(p)
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
				return nil, fmt.Errorf("pod %s/%s: no %s annotation", pod.Namespace, pod.Name, manifest.AnnotationHostIface)
			}
			pp, err := r.podPolicy(pod, d.dir, d.pols)
			if err != nil {
				return nil, err
			}
			pp.Iface = iface
			out = append(out, pp)
		}
	}
	return out, nil
}

// policies renders, for every pod on the node that some policy isolates,
// a chain per isolated direction holding the rules of every policy that
// selects the pod, followed by the drop rule.
func (r *renderer) policies() error {
	// Declare a counter for every rule of every policy, so that counter
	// names do not depend on which pods a node hosts.
	for _, p := range r.sortedPolicies() {
		for i := range p.Spec.Ingress {
			r.counters = append(r.counters, RuleName(p.Namespace, p.Name, Ingress, i))
		}
		for i := range p.Spec.Egress {
			r.counters = append(r.counters, RuleName(p.Namespace, p.Name, Egress, i))
		}
	}
	pps, err := r.podPolicies()
	if err != nil {
		return err
	}
	for _, pp := range pps {
		c := r.podChain(pp)
		r.chains = append(r.chains, c)
		entry := fmt.Sprintf("%s : jump %s", quote(pp.Iface), c.name)
		if pp.Dir == Ingress {
			r.dispatchI = append(r.dispatchI, entry)
		} else {
			r.dispatchE = append(r.dispatchE, entry)
		}
	}
	return nil
}

func (r *renderer) podPolicy(pod *corev1.Pod, dir Direction, pols []*networkingv1.NetworkPolicy) (PodPolicy, error) {
	pp := PodPolicy{Pod: pod, Dir: dir, Drop: DropName(dir, pod.Namespace, pod.Name)}
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
			matches, err := r.ruleMatches(p, pod, dir, peers, ports)
			if err != nil {
				return PodPolicy{}, fmt.Errorf("policy %s/%s %s rule %d: %w", p.Namespace, p.Name, dir, i, err)
			}
			pp.Rules = append(pp.Rules, PolicyRule{Name: RuleName(p.Namespace, p.Name, dir, i),
				Namespace: p.Namespace, Policy: p.Name, Index: i, Matches: matches})
		}
	}
	return pp, nil
}

func (r *renderer) podChain(pp PodPolicy) chain {
	c := chain{name: ident(string(pp.Dir) + "/" + pp.Pod.Namespace + "/" + pp.Pod.Name)}
	// Ingress ends the forward chain on a match; egress returns to it, so
	// that a pod-to-pod flow on one node also passes the ingress check.
	verdict := "accept"
	if pp.Dir == Egress {
		verdict = "return"
	}
	peerKW := "saddr" // ingress: the peer is the source
	if pp.Dir == Egress {
		peerKW = "daddr"
	}
	for _, rule := range pp.Rules {
		for _, mt := range rule.Matches {
			c.rules = append(c.rules, fmt.Sprintf("%s counter name %s %s comment %s", mt.nft(peerKW), rule.Name, verdict, quote(rule.Name)))
		}
	}
	prefix := pp.Drop
	if len(prefix) > 127 { // NF_LOG_PREFIXLEN is 128 with the NUL
		prefix = prefix[:127]
	}
	c.rules = append(c.rules, fmt.Sprintf("counter name %s log prefix %s group %d drop comment %s", pp.Drop, quote(prefix), r.opts.LogGroup, quote(pp.Drop)))
	r.counters = append(r.counters, pp.Drop)
	return c
}

// nft returns the nft match text of m; kw is saddr or daddr.
func (m Match) nft(kw string) string {
	f := fam4
	if m.Family == corev1.IPv6Protocol {
		f = fam6
	}
	var l3 string
	switch {
	case m.Peer.Any:
		l3 = "meta nfproto " + f.nfp
	case m.Peer.Addrs != nil:
		l3 = fmt.Sprintf("%s %s %s", f.l3, kw, set(addrStrings(m.Peer.Addrs)))
	default:
		l3 = fmt.Sprintf("%s %s %s", f.l3, kw, m.Peer.Block)
		if len(m.Peer.Except) > 0 {
			ex := make([]string, len(m.Peer.Except))
			for i, e := range m.Peer.Except {
				ex[i] = e.String()
			}
			l3 += fmt.Sprintf(" %s %s != %s", f.l3, kw, set(ex))
		}
	}
	var l4 string
	switch {
	case m.L4.Proto == "":
	case m.L4.Port == 0:
		l4 = "meta l4proto " + m.L4.Proto
	case m.L4.EndPort > m.L4.Port:
		l4 = fmt.Sprintf("%s dport %d-%d", m.L4.Proto, m.L4.Port, m.L4.EndPort)
	default:
		l4 = fmt.Sprintf("%s dport %d", m.L4.Proto, m.L4.Port)
	}
	if m.L4.DstAddrs != nil {
		l4 = fmt.Sprintf("%s daddr %s %s", f.l3, set(addrStrings(m.L4.DstAddrs)), l4)
	}
	return strings.TrimSpace(l3 + " " + l4)
}

// addrStrings returns the addresses as strings, sorted as strings (the
// order nft rules have always used) and without duplicates.
func addrStrings(as []netip.Addr) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.String()
	}
	slices.Sort(out)
	return slices.Compact(out)
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

// ruleMatches returns every match one policy rule needs: one per peer,
// family and port (named ports may add more, one per distinct port
// number). A peer that resolves to nothing in a family adds no match: such
// a rule matches nothing (and nft has no empty anonymous sets).
func (r *renderer) ruleMatches(p *networkingv1.NetworkPolicy, pod *corev1.Pod, dir Direction, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) ([]Match, error) {
	ps, err := r.resolvePeers(p, peers)
	if err != nil {
		return nil, err
	}
	var out []Match
	for _, peer := range ps {
		for _, f := range families {
			pm, ok := peerOf(peer, f)
			if !ok {
				continue
			}
			l4s, err := r.portMatches(ports, dir, pod, peer, f)
			if err != nil {
				return nil, err
			}
			for _, l4 := range l4s {
				out = append(out, Match{Family: f.k8s, Peer: pm, L4: l4})
			}
		}
	}
	return out, nil
}

// peerOf returns the address side of peer in family f.
func peerOf(peer peerSet, f family) (Peer, bool) {
	switch {
	case peer.any:
		return Peer{Any: true}, true
	case peer.isPods:
		addrs := podAddrs(peer.pods, f)
		if len(addrs) == 0 {
			return Peer{}, false
		}
		return Peer{Addrs: addrs}, true
	default:
		if familyOf(peer.block.Addr()) != f {
			return Peer{}, false
		}
		out := Peer{Block: peer.block}
		for _, e := range peer.except {
			if familyOf(e.Addr()) == f {
				out.Except = append(out.Except, e)
			}
		}
		return out, true
	}
}

func podAddrs(pods []*corev1.Pod, f family) []netip.Addr {
	var out []netip.Addr
	for _, p := range pods {
		if a, ok := manifest.PodAddr(p, f.k8s); ok {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

func set(elems []string) string { return "{ " + strings.Join(elems, ", ") + " }" }

// portMatches returns the L4 matches of a rule's ports in family f. With no
// ports it returns one empty match (every protocol, ICMP included).
//
// A named port resolves against the pod that owns it: for ingress the
// selected (local) pod; for egress every destination pod the peer selects,
// or every pod of the manifest when the peer is an ipBlock or absent. In
// the egress case the match also limits the destination address, one match
// per distinct port number.
func (r *renderer) portMatches(ports []networkingv1.NetworkPolicyPort, dir Direction, pod *corev1.Pod, peer peerSet, f family) ([]L4, error) {
	if len(ports) == 0 {
		return []L4{{}}, nil
	}
	var out []L4
	for _, pp := range ports {
		proto := lowerProto(pp.Protocol)
		switch {
		case pp.Port == nil:
			out = append(out, L4{Proto: proto})
		case pp.Port.Type == intstr.Int:
			if pp.Port.IntVal < 1 || pp.Port.IntVal > 65535 {
				return nil, fmt.Errorf("port %d out of range", pp.Port.IntVal)
			}
			l4 := L4{Proto: proto, Port: pp.Port.IntVal}
			if pp.EndPort != nil && *pp.EndPort > pp.Port.IntVal {
				if *pp.EndPort > 65535 {
					return nil, fmt.Errorf("endPort %d out of range", *pp.EndPort)
				}
				l4.EndPort = *pp.EndPort
			}
			out = append(out, l4)
		case dir == Ingress:
			// endPort is ignored with a named port (the API rejects the pair).
			if n, ok := manifest.ContainerPort(pod, pp.Port.StrVal, corev1.Protocol(strings.ToUpper(proto))); ok {
				out = append(out, L4{Proto: proto, Port: n})
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
				out = append(out, L4{Proto: proto, Port: n, DstAddrs: addrs})
			}
		}
	}
	return out, nil
}
