package policy

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/flow"
)

// Set is a compiled, immutable list of NetworkPolicies. The zero Set and a
// nil *Set isolate nothing.
type Set struct {
	policies []*compiled // sorted by namespace, name
	byNS     map[string]*nsIndex
	// namedPorts is true when a rule names a port: only then does
	// Evaluate read Peer.PortName.
	namedPorts bool
	// blocks is true when a rule has an ipBlock peer: only then does a
	// verdict depend on the addresses, not only the labels.
	blocks bool
}

// compiled is one NetworkPolicy.
type compiled struct {
	Namespace, Name string
	src             *networkingv1.NetworkPolicy
	selector        selector
	types           [2]bool   // [Ingress], [Egress] in effective policyTypes
	rules           [2][]rule // rules of the directions in types; nil otherwise
}

type rule struct {
	peers []peer // none: every peer
	ports []port // none: every port and protocol
}

// peer is a pod/namespace selector peer (block invalid) or an ipBlock.
type peer struct {
	podSel, nsSel *selector // nil: not given
	block         Block     // an ipBlock when its CIDR is valid
}

type port struct {
	proto  uint8
	any    bool   // no port: every port of proto
	lo, hi uint16 // inclusive range
	name   string // named port
}

// nsIndex holds the policies of one namespace per direction.
type nsIndex struct {
	dir [2]dirIndex
}

// indexMin is the number of policies of a namespace and direction from
// which they are indexed by label: below it a linear scan is as fast.
const indexMin = 8

// dirIndex lists the policies (indexes into Set.policies, ascending) of a
// namespace that isolate for one direction. With many of them, byLabel
// indexes each policy whose selector requires a label to have one of a few
// values under every such key/value, and rest holds the others; a pod is
// then only checked against rest and the lists of its own labels. A policy
// is in exactly one list per label value, and a pod has one value per
// key, so no policy is visited twice.
type dirIndex struct {
	all     []int32
	byLabel map[string]map[string][]int32
	rest    []int32
}

// Compile compiles pols into a Set. Policies that the Kubernetes API would
// reject (bad selectors, CIDRs, ports or protocols) are left out, and the
// returned error lists each of them (errors.Join of *Error); the Set holds
// the others and is never nil. Compile does not modify or keep pols, but
// keeps the policies they point to (Policy returns them): do not modify
// them afterwards.
func Compile(pols []*networkingv1.NetworkPolicy) (*Set, error) {
	s := &Set{byNS: map[string]*nsIndex{}}
	var errs []error
	seen := map[[2]string]bool{}
	for _, p := range pols {
		if p == nil {
			continue
		}
		key := [2]string{p.Namespace, p.Name}
		if seen[key] {
			errs = append(errs, &Error{Namespace: p.Namespace, Name: p.Name, Err: errors.New("given twice")})
			continue
		}
		seen[key] = true
		c, err := compile(p)
		if err != nil {
			errs = append(errs, &Error{Namespace: p.Namespace, Name: p.Name, Err: err})
			continue
		}
		s.policies = append(s.policies, c)
		s.namedPorts = s.namedPorts || c.namesPorts()
		s.blocks = s.blocks || c.hasBlocks()
	}
	slices.SortFunc(s.policies, func(a, b *compiled) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	for i, p := range s.policies {
		ns := s.byNS[p.Namespace]
		if ns == nil {
			ns = &nsIndex{}
			s.byNS[p.Namespace] = ns
		}
		for d := range 2 {
			if p.types[d] {
				ns.dir[d].all = append(ns.dir[d].all, int32(i))
			}
		}
	}
	for _, ns := range s.byNS {
		for d := range ns.dir {
			s.index(&ns.dir[d])
		}
	}
	return s, errors.Join(errs...)
}

// NamesPorts reports whether a rule of s names a port: when none does,
// Evaluate does not read Flow.Dst.PortName, and a caller need not look it
// up. A nil Set names none.
func (s *Set) NamesPorts() bool { return s != nil && s.namedPorts }

// NamesBlocks reports whether a rule of s has an ipBlock peer: when none
// has, the verdicts depend on labels, namespaces and ports only, so the
// two families of the same two pods are always decided alike. A nil Set
// has none.
func (s *Set) NamesBlocks() bool { return s != nil && s.blocks }

// hasBlocks reports whether a rule of c has an ipBlock peer.
func (c *compiled) hasBlocks() bool {
	for d := range c.rules {
		for i := range c.rules[d] {
			for j := range c.rules[d][i].peers {
				if c.rules[d][i].peers[j].block.CIDR.IsValid() {
					return true
				}
			}
		}
	}
	return false
}

// namesPorts reports whether a rule of c names a port.
func (c *compiled) namesPorts() bool {
	for d := range c.rules {
		for i := range c.rules[d] {
			for j := range c.rules[d][i].ports {
				if c.rules[d][i].ports[j].name != "" {
					return true
				}
			}
		}
	}
	return false
}

func (s *Set) index(ix *dirIndex) {
	if len(ix.all) < indexMin {
		return
	}
	ix.byLabel = map[string]map[string][]int32{}
	for _, pi := range ix.all {
		r, ok := s.policies[pi].selector.indexKey()
		if !ok {
			ix.rest = append(ix.rest, pi)
			continue
		}
		vals := ix.byLabel[r.key]
		if vals == nil {
			vals = map[string][]int32{}
			ix.byLabel[r.key] = vals
		}
		for _, v := range r.values {
			vals[v] = append(vals[v], pi)
		}
	}
}

// Error is a NetworkPolicy that Compile left out.
type Error struct {
	Namespace, Name string
	Err             error
}

func (e *Error) Error() string {
	return fmt.Sprintf("networkpolicy %s/%s: %v", e.Namespace, e.Name, e.Err)
}

func (e *Error) Unwrap() error { return e.Err }

// Len returns the number of policies in the set.
func (s *Set) Len() int {
	if s == nil {
		return 0
	}
	return len(s.policies)
}

// Policies returns the compiled policies in evaluation order (namespace,
// name). The objects are the ones given to Compile: read-only.
func (s *Set) Policies() []*networkingv1.NetworkPolicy {
	if s == nil {
		return nil
	}
	out := make([]*networkingv1.NetworkPolicy, len(s.policies))
	for i, p := range s.policies {
		out[i] = p.src
	}
	return out
}

// Types returns the effective policy types of p: spec.policyTypes, or when
// unset Ingress plus Egress if the policy has egress rules.
func Types(p *networkingv1.NetworkPolicy) (ingress, egress bool) {
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

// Isolating returns the policies (namespace/name order) that select
// subject for direction d: subject is isolated for d when there is one.
func (s *Set) Isolating(d Direction, subject *Peer) []*networkingv1.NetworkPolicy {
	if s == nil || !subject.IsPod {
		return nil
	}
	ns := s.byNS[subject.Namespace]
	if ns == nil {
		return nil
	}
	var out []*networkingv1.NetworkPolicy
	for _, pi := range ns.dir[d].all {
		if p := s.policies[pi]; p.selector.matches(subject.Labels) {
			out = append(out, p.src)
		}
	}
	return out
}

// Isolated reports whether a policy selects subject for direction d.
// It allocates nothing.
func (s *Set) Isolated(d Direction, subject *Peer) bool {
	if s == nil || !subject.IsPod {
		return false
	}
	ns := s.byNS[subject.Namespace]
	if ns == nil {
		return false
	}
	for _, pi := range ns.dir[d].all {
		if s.policies[pi].selector.matches(subject.Labels) {
			return true
		}
	}
	return false
}

func compile(p *networkingv1.NetworkPolicy) (*compiled, error) {
	if p.Name == "" {
		return nil, errors.New("no name")
	}
	sel, err := compileSelector(&p.Spec.PodSelector)
	if err != nil {
		return nil, fmt.Errorf("podSelector: %w", err)
	}
	c := &compiled{Namespace: p.Namespace, Name: p.Name, src: p, selector: *sel}
	c.types[Ingress], c.types[Egress] = Types(p)
	for _, t := range p.Spec.PolicyTypes {
		if t != networkingv1.PolicyTypeIngress && t != networkingv1.PolicyTypeEgress {
			return nil, fmt.Errorf("policyTypes: unknown type %q", t)
		}
	}
	if c.types[Ingress] {
		c.rules[Ingress] = make([]rule, len(p.Spec.Ingress))
		for i, r := range p.Spec.Ingress {
			if c.rules[Ingress][i], err = compileRule(r.From, r.Ports); err != nil {
				return nil, fmt.Errorf("ingress rule %d: %w", i, err)
			}
		}
	}
	if c.types[Egress] {
		c.rules[Egress] = make([]rule, len(p.Spec.Egress))
		for i, r := range p.Spec.Egress {
			if c.rules[Egress][i], err = compileRule(r.To, r.Ports); err != nil {
				return nil, fmt.Errorf("egress rule %d: %w", i, err)
			}
		}
	}
	return c, nil
}

func compileRule(peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) (rule, error) {
	var r rule
	for j, pe := range peers {
		cp, err := compilePeer(pe)
		if err != nil {
			return rule{}, fmt.Errorf("peer %d: %w", j, err)
		}
		r.peers = append(r.peers, cp)
	}
	for j, pt := range ports {
		cp, err := compilePort(pt)
		if err != nil {
			return rule{}, fmt.Errorf("port %d: %w", j, err)
		}
		r.ports = append(r.ports, cp)
	}
	return r, nil
}

func compilePeer(pe networkingv1.NetworkPolicyPeer) (peer, error) {
	if pe.IPBlock != nil {
		if pe.PodSelector != nil || pe.NamespaceSelector != nil {
			return peer{}, errors.New("ipBlock cannot be combined with a selector")
		}
		b, err := ParseBlock(pe.IPBlock)
		if err != nil {
			return peer{}, err
		}
		return peer{block: b}, nil
	}
	if pe.PodSelector == nil && pe.NamespaceSelector == nil {
		return peer{}, errors.New("empty peer: set podSelector, namespaceSelector or ipBlock")
	}
	var out peer
	var err error
	if pe.PodSelector != nil {
		if out.podSel, err = compileSelector(pe.PodSelector); err != nil {
			return peer{}, fmt.Errorf("podSelector: %w", err)
		}
	}
	if pe.NamespaceSelector != nil {
		if out.nsSel, err = compileSelector(pe.NamespaceSelector); err != nil {
			return peer{}, fmt.Errorf("namespaceSelector: %w", err)
		}
	}
	return out, nil
}

// Block is a parsed ipBlock: CIDR and the excepted prefixes, all masked
// and of CIDR's family.
type Block struct {
	CIDR   netip.Prefix
	Except []netip.Prefix
}

// ParseBlock parses and checks an ipBlock like the API server does: the
// CIDR and every except must parse, and each except must be of the CIDR's
// family and inside it.
func ParseBlock(b *networkingv1.IPBlock) (Block, error) {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return Block{}, fmt.Errorf("ipBlock cidr: %w", err)
	}
	cidr = unmapPrefix(cidr).Masked()
	out := Block{CIDR: cidr}
	for _, e := range b.Except {
		ep, err := netip.ParsePrefix(e)
		if err != nil {
			return Block{}, fmt.Errorf("ipBlock except: %w", err)
		}
		ep = unmapPrefix(ep).Masked()
		if ep.Addr().Is4() != cidr.Addr().Is4() || ep.Bits() < cidr.Bits() || !cidr.Contains(ep.Addr()) {
			return Block{}, fmt.Errorf("ipBlock except %s is not inside cidr %s", ep, cidr)
		}
		out.Except = append(out.Except, ep)
	}
	return out, nil
}

// unmapPrefix turns ::ffff:a.b.c.d/n (n >= 96) into a.b.c.d/(n-96).
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
		return netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p
}

// Contains reports whether b matches a: inside CIDR, outside every except.
func (b Block) Contains(a netip.Addr) bool {
	a = a.Unmap()
	if !b.CIDR.Contains(a) {
		return false
	}
	for _, e := range b.Except {
		if e.Contains(a) {
			return false
		}
	}
	return true
}

// ProtoNumber returns the IANA number of a NetworkPolicy protocol (nil is
// TCP), or 0 for an unknown one.
func ProtoNumber(p *corev1.Protocol) uint8 {
	if p == nil {
		return flow.ProtoTCP
	}
	switch *p {
	case corev1.ProtocolTCP:
		return flow.ProtoTCP
	case corev1.ProtocolUDP:
		return flow.ProtoUDP
	case corev1.ProtocolSCTP:
		return flow.ProtoSCTP
	}
	return 0
}

func compilePort(pt networkingv1.NetworkPolicyPort) (port, error) {
	out := port{proto: ProtoNumber(pt.Protocol)}
	if out.proto == 0 {
		return port{}, fmt.Errorf("unsupported protocol %q", *pt.Protocol)
	}
	switch {
	case pt.Port == nil:
		if pt.EndPort != nil {
			return port{}, errors.New("endPort without port")
		}
		out.any = true
	case pt.Port.Type == intstr.String:
		if pt.Port.StrVal == "" {
			return port{}, errors.New("empty port name")
		}
		if pt.EndPort != nil {
			return port{}, errors.New("endPort with a named port")
		}
		out.name = pt.Port.StrVal
	default:
		n := pt.Port.IntVal
		if n < 1 || n > 65535 {
			return port{}, fmt.Errorf("port %d out of range 1-65535", n)
		}
		out.lo, out.hi = uint16(n), uint16(n)
		if pt.EndPort != nil {
			e := *pt.EndPort
			if e < n || e > 65535 {
				return port{}, fmt.Errorf("endPort %d: want %d-65535", e, n)
			}
			out.hi = uint16(e)
		}
	}
	return out, nil
}

// selector is a compiled metav1.LabelSelector: every requirement must hold
// (no requirement: every label set).
type selector struct {
	reqs []requirement // sorted by key
}

type op uint8

const (
	opIn op = iota
	opNotIn
	opExists
	opDoesNotExist
)

type requirement struct {
	key    string
	op     op
	values []string // opIn, opNotIn
}

func compileSelector(ls *metav1.LabelSelector) (*selector, error) {
	// Validate keys, values and operators exactly like the API machinery.
	if _, err := metav1.LabelSelectorAsSelector(ls); err != nil {
		return nil, err
	}
	s := &selector{}
	for k, v := range ls.MatchLabels {
		s.reqs = append(s.reqs, requirement{key: k, op: opIn, values: []string{v}})
	}
	for _, e := range ls.MatchExpressions {
		r := requirement{key: e.Key, values: slices.Clone(e.Values)}
		switch e.Operator {
		case metav1.LabelSelectorOpIn:
			r.op = opIn
		case metav1.LabelSelectorOpNotIn:
			r.op = opNotIn
		case metav1.LabelSelectorOpExists:
			r.op = opExists
		case metav1.LabelSelectorOpDoesNotExist:
			r.op = opDoesNotExist
		default:
			return nil, fmt.Errorf("unknown operator %q", e.Operator)
		}
		slices.Sort(r.values)
		r.values = slices.Compact(r.values)
		s.reqs = append(s.reqs, r)
	}
	slices.SortStableFunc(s.reqs, func(a, b requirement) int {
		return cmp.Or(cmp.Compare(a.key, b.key), cmp.Compare(a.op, b.op))
	})
	return s, nil
}

func (s *selector) matches(l map[string]string) bool {
	for i := range s.reqs {
		r := &s.reqs[i]
		v, ok := l[r.key]
		switch r.op {
		case opIn:
			if !ok || !slices.Contains(r.values, v) {
				return false
			}
		case opNotIn:
			if ok && slices.Contains(r.values, v) {
				return false
			}
		case opExists:
			if !ok {
				return false
			}
		case opDoesNotExist:
			if ok {
				return false
			}
		}
	}
	return true
}

// indexKey returns the requirement a policy is indexed under: the first
// "key in (values)" one, if any.
func (s *selector) indexKey() (requirement, bool) {
	for _, r := range s.reqs {
		if r.op == opIn {
			return r, true
		}
	}
	return requirement{}, false
}
