// Package recommend recommends NetworkPolicies from observed flows, right
// for both IP families: least-privilege policies that allow exactly the
// traffic observed (one per workload and direction), or the current
// policies with the missing family of each one-family ipBlock rule added
// (close-gaps). It is pure logic over the cluster view (enrich.Snapshot)
// and an aggregate of observed flows (audit.ObservedFlow); Replay proves a
// recommendation over the same flows with the audit's policy engine.
//
// Recommend and Replay are deterministic: the same view and flows, in any
// order, give the same policies, comments and YAML bytes. They are safe
// for concurrent use (they only read their inputs).
package recommend

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
)

// Mode is what a recommendation starts from.
type Mode string

// The modes.
const (
	// LeastPrivilege allows exactly what was observed: one policy per
	// workload of the scope and direction, isolating it, with a rule per
	// group of peers that used the same ports.
	LeastPrivilege Mode = "least-privilege"
	// CloseGaps keeps the current policies and adds to every rule whose
	// ipBlocks are of one family the blocks of the other family that
	// cover the same pods and nodes.
	CloseGaps Mode = "close-gaps"
)

// ParseMode accepts least-privilege and close-gaps ("" is
// least-privilege).
func ParseMode(s string) (Mode, error) {
	switch Mode(s) {
	case "", LeastPrivilege:
		return LeastPrivilege, nil
	case CloseGaps:
		return CloseGaps, nil
	}
	return "", fmt.Errorf("mode %q: want %s or %s", s, LeastPrivilege, CloseGaps)
}

// Scope is what a recommendation covers: a workload (Namespace and
// Workload), a namespace (Namespace only) or the cluster (neither).
type Scope struct {
	Namespace string
	// Workload is the name of a workload (its top-level controller, or a
	// bare pod) of Namespace.
	Workload string
}

func (s Scope) String() string {
	switch {
	case s.Workload != "":
		return "workload " + s.Namespace + "/" + s.Workload
	case s.Namespace != "":
		return "namespace " + s.Namespace
	}
	return "the cluster"
}

// Options are what to recommend.
type Options struct {
	Mode  Mode
	Scope Scope
}

// Recommendation is the recommended policies and what to know about
// them.
type Recommendation struct {
	Mode  Mode
	Scope Scope
	// Policies are sorted by namespace and name.
	Policies []Policy
	// Notes are about the recommendation as a whole: flows no rule was
	// made for, and why.
	Notes []string
}

// Policy is one recommended NetworkPolicy and the comments that justify
// it.
type Policy struct {
	Policy *networkingv1.NetworkPolicy
	// Note is about the policy as a whole.
	Note string
	// Ingress and Egress say, per rule of the policy's ingress and egress
	// lists, which observed flows justify it (least-privilege) or what
	// was added (close-gaps); "" for a rule kept as it was.
	Ingress, Egress []string
}

// NetworkPolicies returns the recommended policies.
func (r *Recommendation) NetworkPolicies() []*networkingv1.NetworkPolicy {
	out := make([]*networkingv1.NetworkPolicy, len(r.Policies))
	for i := range r.Policies {
		out[i] = r.Policies[i].Policy
	}
	return out
}

// maxLines bounds the flows a rule's comment lists; the rest are
// counted.
const maxLines = 12

// Recommend recommends policies for opt.Scope from the observed flows
// (any order). A scope naming no workload of view is an error.
func Recommend(view *enrich.Snapshot, flows []audit.ObservedFlow, opt Options) (*Recommendation, error) {
	mode, err := ParseMode(string(opt.Mode))
	if err != nil {
		return nil, err
	}
	if opt.Scope.Workload != "" && opt.Scope.Namespace == "" {
		return nil, fmt.Errorf("scope: workload %q needs its namespace", opt.Scope.Workload)
	}
	c := newCluster(view)
	inScope := func(wl *workload) bool {
		return wl != nil && !wl.host && (opt.Scope.Namespace == "" || wl.ns == opt.Scope.Namespace) &&
			(opt.Scope.Workload == "" || wl.w.Name == opt.Scope.Workload)
	}
	var scoped []*workload
	for _, wl := range c.workloads {
		if inScope(wl) {
			scoped = append(scoped, wl)
		}
	}
	slices.SortFunc(scoped, func(a, b *workload) int {
		return cmp.Or(cmp.Compare(a.ns, b.ns), cmp.Compare(a.w.Name, b.w.Name), cmp.Compare(a.w.Kind, b.w.Kind))
	})
	if len(scoped) == 0 && (opt.Scope.Namespace != "" || opt.Scope.Workload != "") {
		return nil, fmt.Errorf("scope: %s has no pod off the host network", opt.Scope)
	}
	rec := &Recommendation{Mode: mode, Scope: opt.Scope}
	if mode == CloseGaps {
		closeGaps(c, scoped, rec)
	} else {
		leastPrivilege(c, scoped, inScope, flows, rec)
	}
	slices.SortFunc(rec.Policies, func(a, b Policy) int {
		return cmp.Or(cmp.Compare(a.Policy.Namespace, b.Policy.Namespace), cmp.Compare(a.Policy.Name, b.Policy.Name))
	})
	return rec, nil
}

// portKey is a destination port a peer used: proto 0 stands for a
// protocol without ports (ICMP), which only a rule without ports allows.
type portKey struct {
	proto uint8
	port  uint16
}

// peerObs is what one peer of a draft policy was observed doing.
type peerObs struct {
	// class orders the rules: selectors, then nodes, then external
	// blocks.
	class int
	key   string
	peers []networkingv1.NetworkPolicyPeer
	addr  netip.Addr // an external address (class 2), before aggregation
	// ports are the ports observed, each with the destination pods
	// observed on it (nil for an end that is no pod); dsts are the
	// destination workloads, whose pods may name the ports.
	ports map[portKey]map[*enrich.Pod]bool
	dsts  map[*workload]bool
	lines map[string]*line
	notes map[string]bool
}

// line is one justification of a rule: flows between the subject and a
// peer on one port.
type line struct {
	text    string
	fams    [2]bool
	records uint64
	// missing is the family both ends have that was not seen ("" if
	// none), for selector peers.
	missing [2]bool
	// denied is the families of missing seen only denied between the
	// same workloads on the same port.
	denied [2]bool
}

// pairKey is a subject workload's flows with a peer workload in one
// direction on one port: what a selector rule's line stands for.
type pairKey struct {
	subject, peer *workload
	dir           policy.Direction
	proto         uint8
	port          uint16
}

// draft is a least-privilege policy being built.
type draft struct {
	wl    *workload
	dir   policy.Direction
	peers map[string]*peerObs
	notes map[string]bool
	// denied is the families seen only denied per pair (shared by the
	// drafts).
	denied map[pairKey][2]bool
}

func (d *draft) peer(class int, key string, np []networkingv1.NetworkPolicyPeer) *peerObs {
	k := strconv.Itoa(class) + key
	p := d.peers[k]
	if p == nil {
		p = &peerObs{class: class, key: key, peers: np, ports: map[portKey]map[*enrich.Pod]bool{}, dsts: map[*workload]bool{}, lines: map[string]*line{}, notes: map[string]bool{}}
		d.peers[k] = p
	}
	return p
}

func leastPrivilege(c *cluster, scoped []*workload, inScope func(*workload) bool, flows []audit.ObservedFlow, rec *Recommendation) {
	// The families seen only denied between two workloads, first: a
	// rule's comment says so rather than "never observed" (whatever the
	// order of the flows).
	denied := map[pairKey][2]bool{}
	for i := range flows {
		f := &flows[i]
		if f.Allowed > 0 || f.Denied == 0 {
			continue
		}
		src, dst := c.resolve(f.Src), c.resolve(f.Dst)
		if src.kind != endPod || dst.kind != endPod {
			continue
		}
		for _, k := range []pairKey{{src.wl, dst.wl, policy.Egress, f.Protocol, f.DstPort}, {dst.wl, src.wl, policy.Ingress, f.Protocol, f.DstPort}} {
			fams := denied[k]
			fams[fi(f.IPVersion)] = true
			denied[k] = fams
		}
	}
	drafts := map[*workload]*[2]*draft{}
	for _, wl := range scoped {
		drafts[wl] = &[2]*draft{
			{wl: wl, dir: policy.Ingress, peers: map[string]*peerObs{}, notes: map[string]bool{}, denied: denied},
			{wl: wl, dir: policy.Egress, peers: map[string]*peerObs{}, notes: map[string]bool{}, denied: denied},
		}
	}
	var probesOnly, deniedOnly, ownNode int
	notes := map[string]bool{}
	for i := range flows {
		f := &flows[i]
		if f.Allowed == 0 {
			if f.Denied > 0 {
				deniedOnly++
			} else if f.Probes > 0 {
				probesOnly++
			}
			continue
		}
		src, dst := c.resolve(f.Src), c.resolve(f.Dst)
		var svc *enrich.Service
		if f.ServiceName != "" {
			svc, _ = c.view.Service(f.ServiceNamespace, f.ServiceName)
		}
		if svc == nil && dst.svc != nil {
			svc = dst.svc // addressed to a ClusterIP, recorded before DNAT
		}
		if src.kind == endPod && inScope(src.wl) {
			d := drafts[src.wl][policy.Egress]
			c.observe(d, f, dst, dst, svc, notes)
		}
		if dst.kind == endPod && inScope(dst.wl) {
			if src.kind == endNode && src.node != nil && dst.pod != nil && src.node.Name == dst.pod.NodeName {
				ownNode++ // NetworkPolicy cannot restrict it: no rule
				continue
			}
			d := drafts[dst.wl][policy.Ingress]
			c.observe(d, f, src, dst, svc, notes)
		}
	}
	if ownNode > 0 {
		notes[fmt.Sprintf("%d flow groups came to pods from their own node (kubelet probes, host-network pods, the pods' gateway): NetworkPolicy cannot restrict them, so no rule is needed.", ownNode)] = true
	}
	if probesOnly > 0 {
		notes[fmt.Sprintf("%d flow groups were only traceflow probes: no rule allows them.", probesOnly)] = true
	}
	if deniedOnly > 0 {
		notes[fmt.Sprintf("%d flow groups were only denied: no rule allows them.", deniedOnly)] = true
	}
	rec.Notes = slices.Sorted(maps.Keys(notes))
	names := policyNames(scoped)
	for _, wl := range scoped {
		if len(wl.labels) == 0 {
			rec.Notes = append(rec.Notes, fmt.Sprintf("%s has no label that all its pods share: no policy can select it alone, none is recommended; label its pods.", wl))
			continue
		}
		for _, d := range drafts[wl] {
			rec.Policies = append(rec.Policies, d.build(c, names[wl]))
		}
	}
}

// policyNames names each workload's policies: its name, or with its kind
// when another workload of the namespace has the same name.
func policyNames(scoped []*workload) map[*workload]string {
	count := map[[2]string]int{}
	for _, wl := range scoped {
		count[[2]string{wl.ns, wl.w.Name}]++
	}
	out := map[*workload]string{}
	for _, wl := range scoped {
		n := wl.w.Name
		if count[[2]string{wl.ns, wl.w.Name}] > 1 {
			n += "-" + strings.ToLower(wl.w.Kind)
		}
		out[wl] = n
	}
	return out
}

// observe adds flow f to draft d: peer is the other end (the source for
// ingress, the destination for egress), dst the destination, svc the
// Service the flow was addressed to.
func (c *cluster) observe(d *draft, f *audit.ObservedFlow, peer, dst end, svc *enrich.Service, notes map[string]bool) {
	var po *peerObs
	via := ""
	if svc != nil {
		via = " through Service " + svc.Namespace + "/" + svc.Name
	}
	port, proto := f.DstPort, f.Protocol
	switch peer.kind {
	case endUnknown:
		notes[fmt.Sprintf("Flows of %s: no rule names it.", peer.name)] = true
		return
	case endPod:
		lbls, ns, what := peer.wl.labels, peer.wl.ns, peer.name
		if d.dir == policy.Egress {
			if sel, ok := backendSelector(svc, peer); ok {
				lbls, what = sel, "the backends of Service "+svc.Namespace+"/"+svc.Name+" ("+peer.name+")"
				via = ""
			}
		}
		if len(lbls) == 0 {
			notes[fmt.Sprintf("%s has no label that all its pods share: no rule can name it as a peer, its flows with %s are not allowed.", peer.wl, d.wl)] = true
			return
		}
		np := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: lbls}}
		if ns != d.wl.ns {
			np.NamespaceSelector = &metav1.LabelSelector{MatchLabels: nsSelector(ns)}
		}
		po = d.peer(0, ns+"\x00"+labels.Set(lbls).String(), []networkingv1.NetworkPolicyPeer{np})
		if len(peer.wl.others) > 0 && len(lbls) > 0 && what == peer.name {
			po.notes[fmt.Sprintf("the selector of %s also selects %s", peer.name, strings.Join(peer.wl.others, ", "))] = true
		}
		var both [2]bool
		for v := range both {
			both[v] = hasFamily(d.wl, v) && hasFamily(peer.wl, v)
		}
		l := po.addLine(what+via, f, both)
		dn := d.denied[pairKey{d.wl, peer.wl, d.dir, f.Protocol, f.DstPort}]
		l.denied[0], l.denied[1] = l.denied[0] || dn[0], l.denied[1] || dn[1]
	case endNode:
		var np []networkingv1.NetworkPolicyPeer
		for _, a := range addrsOf(peer.node) {
			np = append(np, blockPeer(netip.PrefixFrom(a, a.BitLen())))
		}
		po = d.peer(1, peer.node.Name, np)
		po.addLine(peer.name+" ("+peer.node.Name+": "+addrList(addrsOf(peer.node))+")"+via, f, [2]bool{})
	case endExternal:
		if peer.svc != nil && d.dir == policy.Egress && svc != nil && svc.Selector != nil {
			// A ClusterIP recorded before DNAT: the Service's
			// backends, on its target port.
			np := networkingv1.NetworkPolicyPeer{PodSelector: &metav1.LabelSelector{MatchLabels: svc.Selector}}
			if svc.Namespace != d.wl.ns {
				np.NamespaceSelector = &metav1.LabelSelector{MatchLabels: nsSelector(svc.Namespace)}
			}
			po = d.peer(0, svc.Namespace+"\x00"+labels.Set(svc.Selector).String(), []networkingv1.NetworkPolicyPeer{np})
			po.addLine("the backends of Service "+svc.Namespace+"/"+svc.Name, f, [2]bool{})
			// A named target port is resolved on the backends.
			tp, name := targetPort(svc, port, proto)
			if name == "" {
				po.addPort(portKey{proto, tp}, nil, nil)
				return
			}
			sel := labels.SelectorFromSet(svc.Selector)
			for _, b := range c.view.Pods {
				if b.Namespace != svc.Namespace || b.HostNetwork || !sel.Matches(labels.Set(b.Labels)) {
					continue
				}
				for _, cp := range b.Ports {
					if cp.Name == name && policy.ProtoNumber(&cp.Protocol) == proto {
						po.addPort(portKey{proto, uint16(cp.Port)}, b, c.byPod[b])
					}
				}
			}
			return
		}
		po = d.peer(2, peer.addr.String(), nil)
		po.addr = peer.addr
		po.addLine(peer.name+via, f, [2]bool{})
	}
	if !flow.HasPorts(proto) {
		po.addPort(portKey{}, nil, nil)
		return
	}
	po.addPort(portKey{proto, port}, dst.pod, dst.wl)
	if port == 53 && (proto == flow.ProtoUDP || proto == flow.ProtoTCP) {
		// DNS: resolvers fall back to TCP for long answers.
		other := flow.ProtoTCP
		if proto == flow.ProtoTCP {
			other = flow.ProtoUDP
		}
		po.addPort(portKey{other, 53}, dst.pod, dst.wl)
		po.notes["DNS: both UDP and TCP port 53, as resolvers fall back to TCP"] = true
	}
}

// targetPort is the target port of svc's port port/proto: a number, or
// a name (port 0) resolved on the backends.
func targetPort(svc *enrich.Service, port uint16, proto uint8) (uint16, string) {
	for _, sp := range svc.Ports {
		if sp.Port != int32(port) || policy.ProtoNumber(&sp.Protocol) != proto {
			continue
		}
		switch {
		case sp.TargetPort.Type == intstr.String:
			return 0, sp.TargetPort.StrVal
		case sp.TargetPort.IntVal > 0:
			return uint16(sp.TargetPort.IntVal), ""
		}
	}
	return port, ""
}

func hasFamily(wl *workload, v int) bool {
	for _, p := range wl.pods {
		for _, a := range p.Addrs {
			if fi(flow.Version(a)) == v {
				return true
			}
		}
	}
	return false
}

// addPort records that the peer used port k of pod dst (nil: no pod)
// of workload wl (nil: none).
func (p *peerObs) addPort(k portKey, dst *enrich.Pod, wl *workload) {
	m := p.ports[k]
	if m == nil {
		m = map[*enrich.Pod]bool{}
		p.ports[k] = m
	}
	if wl != nil {
		if dst == nil && len(wl.pods) > 0 {
			dst = wl.pods[0] // gone: its workload's pods name the same ports
		}
		p.dsts[wl] = true
	}
	m[dst] = true
}

func (p *peerObs) addLine(what string, f *audit.ObservedFlow, both [2]bool) *line {
	text := what + " on " + portText(f.Protocol, f.DstPort)
	if f.ServicePort != 0 && f.ServicePort != f.DstPort {
		text += fmt.Sprintf(" (Service port %d)", f.ServicePort)
	}
	l := p.lines[text]
	if l == nil {
		l = &line{text: text, missing: both}
		p.lines[text] = l
	}
	v := fi(f.IPVersion)
	l.fams[v] = true
	l.missing[v] = false
	l.records += f.Allowed
	return l
}

// portText names a destination port; ICMP and ICMPv6 are one protocol
// (a ping over each family is the same ping).
func portText(proto uint8, port uint16) string {
	switch {
	case proto == flow.ProtoICMP || proto == flow.ProtoICMPv6:
		return "ICMP/ICMPv6"
	case !flow.HasPorts(proto):
		return flow.ProtoName(proto)
	}
	return fmt.Sprintf("%d/%s", port, flow.ProtoName(proto))
}

func addrList(as []netip.Addr) string {
	s := make([]string, len(as))
	for i, a := range as {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

func blockPeer(p netip.Prefix) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: p.String()}}
}

// ruleDraft is one rule being built: peers that used the same ports.
type ruleDraft struct {
	class int
	key   string
	peers []*peerObs
	ports []networkingv1.NetworkPolicyPort
	any   bool // a protocol without ports: no port list
}

// portList returns the NetworkPolicy ports of p and their signature. An
// observed port is written by its name when the name covers what was
// observed and nothing more: every destination pod observed on the port
// gives it that name, and no pod of the destination workloads gives the
// name to a port that was not observed. Otherwise (pods of one workload
// that name a port differently, or not at all) it is written by number.
// Two numbers under one name are one named port.
func (p *peerObs) portList() ([]networkingv1.NetworkPolicyPort, bool, string) {
	if _, ok := p.ports[portKey{}]; ok {
		return nil, true, "*"
	}
	type entry struct {
		proto uint8
		port  uint16
		name  string
	}
	named := func(k portKey) string {
		name := ""
		for pod := range p.ports[k] {
			n := ""
			if pod != nil {
				n = pod.PortName(k.port, k.proto)
			}
			if n == "" || name != "" && n != name {
				return ""
			}
			name = n
		}
		for wl := range p.dsts {
			for _, pod := range wl.pods {
				for _, cp := range pod.Ports {
					if cp.Name != name || cp.Port <= 0 || cp.Port > 65535 {
						continue
					}
					if _, ok := p.ports[portKey{policy.ProtoNumber(&cp.Protocol), uint16(cp.Port)}]; !ok {
						return ""
					}
				}
			}
		}
		return name
	}
	seen := map[entry]bool{}
	for k := range p.ports {
		e := entry{proto: k.proto, port: k.port}
		if e.name = named(k); e.name != "" {
			e.port = 0
		}
		seen[e] = true
	}
	es := slices.SortedFunc(maps.Keys(seen), func(a, b entry) int {
		return cmp.Or(cmp.Compare(a.proto, b.proto), cmp.Compare(a.name, b.name), cmp.Compare(a.port, b.port))
	})
	out := make([]networkingv1.NetworkPolicyPort, len(es))
	sig := make([]string, len(es))
	for i, e := range es {
		proto := corev1.Protocol(flow.ProtoName(e.proto))
		out[i].Protocol = &proto
		pt := intstr.FromInt32(int32(e.port))
		if e.name != "" {
			pt = intstr.FromString(e.name)
		}
		out[i].Port = &pt
		sig[i] = string(proto) + "/" + pt.String()
	}
	return out, false, strings.Join(sig, ",")
}

// build turns the draft into its policy.
func (d *draft) build(c *cluster, name string) Policy {
	pol := &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Namespace: d.wl.ns, Name: name + "-" + d.dir.String()},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: d.wl.labels}},
	}
	// External addresses: aggregated per port signature.
	rules := map[string]*ruleDraft{}
	add := func(p *peerObs) {
		ports, any, sig := p.portList()
		k := strconv.Itoa(p.class) + "\x00" + sig
		r := rules[k]
		if r == nil {
			r = &ruleDraft{class: p.class, key: p.key, ports: ports, any: any}
			rules[k] = r
		}
		r.key = min(r.key, p.key)
		r.peers = append(r.peers, p)
	}
	external := map[string][]*peerObs{}
	for _, p := range d.peers {
		if p.class == 2 {
			_, _, sig := p.portList()
			external[sig] = append(external[sig], p)
			continue
		}
		add(p)
	}
	for _, ps := range external {
		for _, p := range aggregate(ps) {
			add(p)
		}
	}
	rs := slices.SortedFunc(maps.Values(rules), func(a, b *ruleDraft) int {
		return cmp.Or(cmp.Compare(a.class, b.class), cmp.Compare(a.key, b.key))
	})
	out := Policy{Policy: pol}
	what := "ingress of " + d.wl.String() + " (its pods: " + labels.Set(d.wl.labels).String() + ")"
	if d.dir == policy.Egress {
		what = "egress of " + d.wl.String() + " (its pods: " + labels.Set(d.wl.labels).String() + ")"
	}
	switch len(rs) {
	case 0:
		out.Note = fmt.Sprintf("Least-privilege %s: none was observed, so this policy denies all of it.", what)
	default:
		out.Note = fmt.Sprintf("Least-privilege %s: %d %s, one per set of peers that used the same ports.", what, len(rs), plural(len(rs), "rule"))
	}
	if len(d.wl.others) > 0 {
		out.Note += " Its selector also selects " + strings.Join(d.wl.others, ", ") + ": label the pods apart to narrow it."
	}
	var comments []string
	for _, r := range rs {
		slices.SortFunc(r.peers, func(a, b *peerObs) int { return cmp.Compare(a.key, b.key) })
		var peers []networkingv1.NetworkPolicyPeer
		for _, p := range r.peers {
			peers = append(peers, p.peers...)
		}
		comments = append(comments, r.comment(c))
		if d.dir == policy.Ingress {
			pol.Spec.Ingress = append(pol.Spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: peers, Ports: r.ports})
		} else {
			pol.Spec.Egress = append(pol.Spec.Egress, networkingv1.NetworkPolicyEgressRule{To: peers, Ports: r.ports})
		}
	}
	if d.dir == policy.Ingress {
		pol.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
		out.Ingress = comments
	} else {
		pol.Spec.PolicyTypes = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
		out.Egress = comments
	}
	return out
}

// comment says which observed flows justify rule r.
func (r *ruleDraft) comment(c *cluster) string {
	var lines []string
	notes := map[string]bool{}
	var fams [2]bool
	for _, p := range r.peers {
		for _, l := range p.lines {
			s := fmt.Sprintf("%s over %s (%d %s)", l.text, familiesText(l.fams), l.records, plural(int(l.records), "record"))
			never := [2]bool{l.missing[0] && !l.denied[0], l.missing[1] && !l.denied[1]}
			only := [2]bool{l.missing[0] && l.denied[0], l.missing[1] && l.denied[1]}
			if only[0] || only[1] {
				s += fmt.Sprintf("; %s observed only denied: the selector allows it too (the replay lists it as newly allowed)", familiesText(only))
			}
			if never[0] || never[1] {
				s += fmt.Sprintf("; %s never observed, the selector covers it", familiesText(never))
			}
			lines = append(lines, s)
			fams[0], fams[1] = fams[0] || l.fams[0], fams[1] || l.fams[1]
		}
		for n := range p.notes {
			notes[n] = true
		}
	}
	slices.Sort(lines)
	if n := len(lines); n > maxLines {
		lines = append(lines[:maxLines], fmt.Sprintf("and %d more", n-maxLines))
	}
	s := "Observed: " + strings.Join(lines, "; ") + "."
	if r.any {
		s += " ICMP cannot be named in a NetworkPolicy port: the rule has no port list, so it allows every protocol and port with these peers."
	}
	if r.class == 2 && fams[0] != fams[1] && c.families[0] && c.families[1] {
		seen, other := "IPv4", "IPv6"
		if fams[1] {
			seen, other = "IPv6", "IPv4"
		}
		s += fmt.Sprintf(" Only %s was seen for these peers: add their %s addresses if they have any.", seen, other)
	}
	for _, n := range slices.Sorted(maps.Keys(notes)) {
		s += " " + strings.ToUpper(n[:1]) + n[1:] + "."
	}
	return s
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}
