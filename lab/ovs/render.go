// Package ovs is the lab's Open vSwitch datapath: each node forwards
// through its own OVS bridge on the userspace datapath (datapath_type
// netdev), with its own ovsdb-server and ovs-vswitchd running inside the
// node's network namespace, from private run, db and log directories.
//
// Render translates the same manifest as lab/nft (Service load balancing
// and NetworkPolicy, through nft.Policies and nft.ServicePorts) into
// OpenFlow flows. The pipeline, per node:
//
//	table 0  classify: ARP and neighbour-solicitation responders for the pod
//	         gateway, anti-spoofing (pod port + pod address), packets from
//	         the uplink to a local pod CIDR; everything else is dropped
//	table 1  neighbour advertisement completion (target link-layer address)
//	table 10 ct(zone=1,nat): conntrack, and NAT of known connections
//	table 20 established/related with ct_mark 0x1 (allowed here) → table 60;
//	         invalid → drop; the rest → table 30
//	table 30 Service VIP:port of a new connection → select group whose
//	         buckets ct(commit,nat(dst=endpoint)) → table 40
//	table 40 egress policy of local source pods (by in_port): allow flows
//	         load the rule ID into reg6 → table 45; drop flows → meter +
//	         controller (the packet is dropped)
//	table 45 ingress policy of local destination pods (by nw_dst): allow
//	         flows load the rule ID into reg5 → table 50; drop flows as above
//	table 50 learn two per-connection counter flows into table 65, then
//	         ct(commit, ct_mark|=0x1, ct_label = reg6<<32|reg5) → table 60
//	table 60 resubmit(,65) (count) then resubmit(,70)
//	table 65 learned per-connection counter flows (one per direction)
//	table 70 L3 forwarding: local pod (gateway MAC → pod MAC, dec_ttl) or
//	         remote node's pod CIDR (→ that node's uplink MAC over eth0)
//
// Cookies follow the contract of the top-level package ovs: Cookie(kind,
// id) with id = RuleID(name) for allow and drop flows, so rule statistics
// and packet-ins can be read back per NetworkPolicy rule with the rules
// file (ovs.Rules).
package ovs

import (
	"cmp"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/lab/topology"
	"github.com/dualflow/dualflow/ovs"
)

// Tables of the pipeline (see the package comment).
const (
	TableClassify   = 0
	TableNeighbor   = 1
	TableConntrack  = 10
	TableCTState    = 20
	TableService    = 30
	TableEgress     = 40
	TableIngress    = 45
	TableCommit     = 50
	TableCount      = 60
	TableConnCounts = 65
	TableForward    = 70
)

// Datapath constants.
const (
	// Bridge is the bridge name on every node.
	Bridge = "br-int"
	// Zone is the conntrack zone of every connection.
	Zone = 1
	// UplinkPort is the ofport of the node's eth0 (towards the fabric).
	UplinkPort = 1
	// firstPodPort is the ofport of the first pod on a node.
	firstPodPort = 10
	// DropMeter rate-limits the packet-ins of drop flows; drops beyond the
	// rate are still dropped and counted by the flow, just not reported.
	DropMeter     = 1
	DropMeterRate = 1000 // packets per second
	// ConnIdleTimeout is the idle timeout of learned counter flows. A
	// connection idle for longer loses its counter flows (the exporter
	// keeps the last values).
	ConnIdleTimeout = 300
	// rulePriorityBase is the priority of a pod's first policy rule; later
	// rules get lower priorities, so the first matching rule in nft's
	// evaluation order wins and takes the hit.
	rulePriorityBase = 20000
	dropPriority     = 100
)

// Port is one interface attached to the bridge.
type Port struct {
	Name   string
	OFPort int
}

// Env is what Render needs beyond the manifest: MAC addresses of the
// running lab.
type Env struct {
	// PodMACs are the pods' eth0 MACs by pod netns name; NodeMACs the
	// nodes' eth0 MACs by node name.
	PodMACs, NodeMACs map[string]net.HardwareAddr
}

// Ruleset is the OpenFlow configuration of one node.
type Ruleset struct {
	Ports []Port
	// Groups and Flows are ovs-ofctl add-groups / add-flows input
	// (OpenFlow 1.3+: flows use the meter instruction).
	Groups, Flows string
	// NFlows counts the flows.
	NFlows int
}

// Rules returns the rules file entries of every NetworkPolicy rule and
// every drop rule of the manifest, on any node.
func Rules(m *manifest.Manifest) ([]ovs.Rule, error) {
	var out []ovs.Rule
	seen := map[string]bool{}
	for i := range m.Nodes {
		pps, err := nft.Policies(m, m.Nodes[i].Name)
		if err != nil {
			return nil, err
		}
		for _, pp := range pps {
			for _, r := range pp.Rules {
				if !seen[r.Name] {
					seen[r.Name] = true
					out = append(out, ovs.Rule{ID: ovs.RuleID(r.Name), Kind: ovs.KindAllow, Name: r.Name,
						Namespace: r.Namespace, Policy: r.Policy, Direction: string(pp.Dir), Index: r.Index})
				}
			}
			if !seen[pp.Drop] {
				seen[pp.Drop] = true
				out = append(out, ovs.Rule{ID: ovs.RuleID(pp.Drop), Kind: ovs.KindDrop, Name: pp.Drop,
					Namespace: pp.Pod.Namespace, Pod: pp.Pod.Name, Direction: string(pp.Dir), Index: -1})
			}
		}
	}
	slices.SortFunc(out, func(a, b ovs.Rule) int { return cmp.Compare(a.Name, b.Name) })
	if _, err := ovs.NewRules(out); err != nil { // a hash collision
		return nil, err
	}
	return out, nil
}

// fam is one IP family as OpenFlow spells it.
type fam struct {
	k8s              corev1.IPFamily
	eth, src, dst    string // ip / ipv6, nw_src / ipv6_src, …
	icmp             string
	ctDst            string // NXM field of the conntrack original destination
	ipSrcNXM, ipDstN string
	ethType          string
}

var (
	fam4 = fam{corev1.IPv4Protocol, "ip", "nw_src", "nw_dst", "icmp", "NXM_NX_CT_NW_DST[]", "NXM_OF_IP_SRC[]", "NXM_OF_IP_DST[]", "0x800"}
	fam6 = fam{corev1.IPv6Protocol, "ipv6", "ipv6_src", "ipv6_dst", "icmp6", "NXM_NX_CT_IPV6_DST[]", "NXM_NX_IPV6_SRC[]", "NXM_NX_IPV6_DST[]", "0x86dd"}
)

func famOf(f corev1.IPFamily) fam {
	if f == corev1.IPv6Protocol {
		return fam6
	}
	return fam4
}

func famOfAddr(a netip.Addr) fam { return famOf(manifest.FamilyOf(a)) }

// proto returns the match keyword of an L4 protocol in the family.
func (f fam) proto(p string) string {
	if f.k8s == corev1.IPv6Protocol {
		return p + "6"
	}
	return p
}

// builder accumulates flows.
type builder struct {
	b strings.Builder
	n int
}

func (b *builder) add(table int, prio int, cookie uint64, match, actions string) {
	fmt.Fprintf(&b.b, "table=%d,priority=%d,cookie=%#x", table, prio, cookie)
	if match != "" {
		b.b.WriteString("," + match)
	}
	b.b.WriteString(",actions=" + actions + "\n")
	b.n++
}

func pipe(table int) uint64 { return ovs.Cookie(ovs.KindPipeline, uint32(table)) }

// gatewayMAC is the MAC the pods' gateway has (the node-side veths').
var gatewayMAC = topology.GatewayMAC.String()

// Render returns the ruleset of node.
func Render(m *manifest.Manifest, node string, env Env) (*Ruleset, error) {
	n, ok := m.Node(node)
	if !ok {
		return nil, fmt.Errorf("ovs render: node %q not in manifest", node)
	}
	fams := m.Mode().Families()
	rs := &Ruleset{Ports: []Port{{Name: "eth0", OFPort: UplinkPort}}}
	b := &builder{}
	pods := m.PodsOnNode(node)
	podPort := map[*corev1.Pod]int{}
	for k, p := range pods {
		port := firstPodPort + k
		podPort[p] = port
		rs.Ports = append(rs.Ports, Port{Name: p.Annotations[manifest.AnnotationHostIface], OFPort: port})
	}
	myMAC, ok := env.NodeMACs[node]
	if !ok {
		return nil, fmt.Errorf("ovs render: no MAC for node %s", node)
	}

	// Table 0: classification and neighbour responders.
	for _, p := range pods {
		port := podPort[p]
		mac, ok := env.PodMACs[p.Annotations[manifest.AnnotationNetNS]]
		if !ok {
			return nil, fmt.Errorf("ovs render: no MAC for pod %s/%s", p.Namespace, p.Name)
		}
		_ = mac
		for _, a := range manifest.PodAddrs(p) {
			f := famOfAddr(a)
			b.add(TableClassify, 100, pipe(TableClassify), fmt.Sprintf("in_port=%d,%s,%s=%s", port, f.eth, f.src, a), fmt.Sprintf("goto_table:%d", TableConntrack))
			if f.k8s == corev1.IPv4Protocol {
				cidr, _ := manifest.NodePodCIDR(n, corev1.IPv4Protocol)
				gw := cidr.Addr().Next()
				gwHex := fmt.Sprintf("%#x", uint32(gw.As4()[0])<<24|uint32(gw.As4()[1])<<16|uint32(gw.As4()[2])<<8|uint32(gw.As4()[3]))
				b.add(TableClassify, 200, ovs.Cookie(ovs.KindNeighbor, 1), fmt.Sprintf("in_port=%d,arp,arp_op=1,arp_tpa=%s", port, gw),
					"move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],mod_dl_src:"+gatewayMAC+",load:2->NXM_OF_ARP_OP[],move:NXM_NX_ARP_SHA[]->NXM_NX_ARP_THA[],"+
						"move:NXM_OF_ARP_SPA[]->NXM_OF_ARP_TPA[],load:0x"+strings.ReplaceAll(gatewayMAC, ":", "")+"->NXM_NX_ARP_SHA[],load:"+gwHex+"->NXM_OF_ARP_SPA[],IN_PORT")
			} else {
				gw := topology.GatewayIPv6
				// A neighbour solicitation for the gateway becomes an
				// advertisement (router, solicited, override) sent back;
				// table 1 writes the target link-layer address, which OVS
				// only accepts on a flow that matches an advertisement.
				b.add(TableClassify, 200, ovs.Cookie(ovs.KindNeighbor, 2), fmt.Sprintf("in_port=%d,icmp6,icmp_type=135,nd_target=%s", port, gw),
					"move:NXM_OF_ETH_SRC[]->NXM_OF_ETH_DST[],mod_dl_src:"+gatewayMAC+",move:NXM_NX_IPV6_SRC[]->NXM_NX_IPV6_DST[],"+
						"set_field:"+gw.String()+"->ipv6_src,set_field:136->icmpv6_type,set_field:2->nd_options_type,set_field:0xe0000000->nd_reserved,"+
						fmt.Sprintf("resubmit(,%d)", TableNeighbor))
				b.add(TableNeighbor, 100, ovs.Cookie(ovs.KindNeighbor, 2), fmt.Sprintf("in_port=%d,icmp6,icmp_type=136,nd_target=%s", port, gw),
					"set_field:"+gatewayMAC+"->nd_tll,IN_PORT")
			}
		}
	}
	for _, f := range fams {
		cidr, ok := manifest.NodePodCIDR(n, f)
		if !ok {
			continue
		}
		fm := famOf(f)
		b.add(TableClassify, 100, pipe(TableClassify), fmt.Sprintf("in_port=%d,%s,%s=%s", UplinkPort, fm.eth, fm.dst, cidr), fmt.Sprintf("goto_table:%d", TableConntrack))
	}
	b.add(TableClassify, 0, pipe(TableClassify), "", "drop")

	// Tables 10 and 20: conntrack.
	for _, f := range []fam{fam4, fam6} {
		b.add(TableConntrack, 100, pipe(TableConntrack), f.eth, fmt.Sprintf("ct(zone=%d,nat,table=%d)", Zone, TableCTState))
	}
	b.add(TableConntrack, 0, pipe(TableConntrack), "", "drop")
	b.add(TableCTState, 200, pipe(TableCTState), "ct_state=+inv+trk", "drop")
	b.add(TableCTState, 190, pipe(TableCTState), fmt.Sprintf("ct_state=-new+est+trk,ct_mark=%#x/%#x", ovs.MarkAllowed, ovs.MarkAllowed), fmt.Sprintf("goto_table:%d", TableCount))
	b.add(TableCTState, 190, pipe(TableCTState), "ct_state=-new+rel+trk", fmt.Sprintf("goto_table:%d", TableCount))
	b.add(TableCTState, 0, pipe(TableCTState), "", fmt.Sprintf("goto_table:%d", TableService))

	// Table 30: Services.
	sps, err := nft.ServicePorts(m)
	if err != nil {
		return nil, err
	}
	var groups strings.Builder
	gid := 0
	for _, sp := range sps {
		f := famOfAddr(sp.VIP)
		if !m.Mode().Has(f.k8s) {
			continue
		}
		cookie := ovs.Cookie(ovs.KindService, ovs.RuleID(sp.ID))
		match := fmt.Sprintf("ct_state=+new+trk,%s,%s=%s,tp_dst=%d", f.proto(sp.Proto), f.dst, sp.VIP, sp.Port)
		if len(sp.Endpoints) == 0 {
			// nft rejects; OpenFlow has no reject, so the lab drops.
			b.add(TableService, 100, cookie, match, "drop")
			continue
		}
		gid++
		fmt.Fprintf(&groups, "group_id=%d,type=select", gid)
		for _, ep := range sp.Endpoints {
			dst := ep.String() // [v6]:port or v4:port
			fmt.Fprintf(&groups, ",bucket=actions=ct(commit,zone=%d,nat(dst=%s),table=%d)", Zone, dst, TableEgress)
		}
		groups.WriteString("\n")
		b.add(TableService, 100, cookie, match, fmt.Sprintf("group:%d", gid))
	}
	b.add(TableService, 0, pipe(TableService), "", fmt.Sprintf("goto_table:%d", TableEgress))

	// Tables 40 and 45: NetworkPolicy.
	pps, err := nft.Policies(m, node)
	if err != nil {
		return nil, err
	}
	for _, pp := range pps {
		if err := policyFlows(b, pp, podPort[pp.Pod]); err != nil {
			return nil, err
		}
	}
	b.add(TableEgress, 0, pipe(TableEgress), "", fmt.Sprintf("goto_table:%d", TableIngress))
	b.add(TableIngress, 0, pipe(TableIngress), "", fmt.Sprintf("goto_table:%d", TableCommit))

	// Table 50: commit, with per-connection counter flows.
	commit := fmt.Sprintf("ct(commit,zone=%d,exec(set_field:%#x/%#x->ct_mark,move:NXM_NX_REG5[]->NXM_NX_CT_LABEL[0..31],move:NXM_NX_REG6[]->NXM_NX_CT_LABEL[32..63]),table=%d)",
		Zone, ovs.MarkAllowed, ovs.MarkAllowed, TableCount)
	for _, f := range []fam{fam4, fam6} {
		for _, p := range []struct {
			name, nxm string
			num       int
		}{{"tcp", "TCP", 6}, {"udp", "UDP", 17}} {
			learn := func(reply bool) string {
				spec := fmt.Sprintf("learn(table=%d,idle_timeout=%d,priority=100,cookie=%#x,eth_type=%s,nw_proto=%d,",
					TableConnCounts, ConnIdleTimeout, ovs.Cookie(ovs.KindConn, 0), f.ethType, p.num)
				if !reply {
					return spec + fmt.Sprintf("%s,%s,NXM_OF_%s_SRC[],NXM_OF_%s_DST[])", f.ipSrcNXM, f.ipDstN, p.nxm, p.nxm)
				}
				// The reply leaves conntrack un-DNAT-ed: from the original
				// destination (the VIP for a Service) to the client.
				return spec + fmt.Sprintf("%s=%s,%s=%s,NXM_OF_%s_SRC[]=NXM_NX_CT_TP_DST[],NXM_OF_%s_DST[]=NXM_OF_%s_SRC[])",
					f.ipSrcNXM, f.ctDst, f.ipDstN, f.ipSrcNXM, p.nxm, p.nxm, p.nxm)
			}
			b.add(TableCommit, 100, pipe(TableCommit), fmt.Sprintf("ct_state=+trk-inv,ct_nw_proto=%d,%s", p.num, f.proto(p.name)),
				learn(false)+","+learn(true)+","+commit)
		}
		icmpLearn := func(reply bool) string {
			spec := fmt.Sprintf("learn(table=%d,idle_timeout=%d,priority=100,cookie=%#x,eth_type=%s,nw_proto=%d,",
				TableConnCounts, ConnIdleTimeout, ovs.Cookie(ovs.KindConn, 0), f.ethType, map[bool]int{false: 1, true: 58}[f == fam6])
			if !reply {
				return spec + f.ipSrcNXM + "," + f.ipDstN + ")"
			}
			return spec + f.ipSrcNXM + "=" + f.ctDst + "," + f.ipDstN + "=" + f.ipSrcNXM + ")"
		}
		b.add(TableCommit, 100, pipe(TableCommit), "ct_state=+trk-inv,"+f.icmp, icmpLearn(false)+","+icmpLearn(true)+","+commit)
		b.add(TableCommit, 1, pipe(TableCommit), f.eth, commit)
	}
	b.add(TableCommit, 0, pipe(TableCommit), "", "drop")
	b.add(TableCount, 0, pipe(TableCount), "", fmt.Sprintf("resubmit(,%d),resubmit(,%d)", TableConnCounts, TableForward))
	b.add(TableConnCounts, 0, pipe(TableConnCounts), "", "drop")

	// Table 70: forwarding.
	for _, p := range pods {
		mac := env.PodMACs[p.Annotations[manifest.AnnotationNetNS]]
		for _, a := range manifest.PodAddrs(p) {
			f := famOfAddr(a)
			b.add(TableForward, 100, pipe(TableForward), fmt.Sprintf("%s,%s=%s", f.eth, f.dst, a),
				fmt.Sprintf("mod_dl_src:%s,mod_dl_dst:%s,dec_ttl,output:%d", gatewayMAC, mac, podPort[p]))
		}
	}
	for i := range m.Nodes {
		o := &m.Nodes[i]
		if o.Name == node {
			continue
		}
		omac, ok := env.NodeMACs[o.Name]
		if !ok {
			return nil, fmt.Errorf("ovs render: no MAC for node %s", o.Name)
		}
		for _, f := range fams {
			if cidr, ok := manifest.NodePodCIDR(o, f); ok {
				fm := famOf(f)
				b.add(TableForward, 50, pipe(TableForward), fmt.Sprintf("%s,%s=%s", fm.eth, fm.dst, cidr),
					fmt.Sprintf("mod_dl_src:%s,mod_dl_dst:%s,dec_ttl,output:%d", myMAC, omac, UplinkPort))
			}
		}
	}
	b.add(TableForward, 0, pipe(TableForward), "", "drop")
	rs.Flows, rs.Groups, rs.NFlows = b.b.String(), groups.String(), b.n
	return rs, nil
}

// policyFlows adds the allow flows of every rule of pp and its drop flows.
// Ingress selects the pod by destination address (after DNAT), egress by
// the port it sent from.
func policyFlows(b *builder, pp nft.PodPolicy, port int) error {
	table, next, reg := TableIngress, TableCommit, "NXM_NX_REG5[]"
	if pp.Dir == nft.Egress {
		table, next, reg = TableEgress, TableIngress, "NXM_NX_REG6[]"
	}
	podAddr := map[corev1.IPFamily]netip.Addr{}
	for _, a := range manifest.PodAddrs(pp.Pod) {
		podAddr[manifest.FamilyOf(a)] = a
	}
	selector := func(f fam) (string, bool) {
		if pp.Dir == nft.Egress {
			return fmt.Sprintf("in_port=%d", port), true
		}
		a, ok := podAddr[f.k8s]
		if !ok {
			return "", false
		}
		return fmt.Sprintf("%s=%s", f.dst, a), true
	}
	for k, rule := range pp.Rules {
		id := ovs.RuleID(rule.Name)
		cookie := ovs.Cookie(ovs.KindAllow, id)
		prio := rulePriorityBase - k
		actions := fmt.Sprintf("load:%#x->%s,goto_table:%d", id, reg, next)
		for _, mt := range rule.Matches {
			f := famOf(mt.Family)
			sel, ok := selector(f)
			if !ok {
				continue
			}
			peers := peerMatches(mt, f, pp.Dir)
			for _, l4 := range l4Matches(mt.L4, f) {
				for _, pm := range peers {
					b.add(table, prio, cookie, joinMatch(l4, sel, pm), actions)
				}
			}
		}
	}
	drop := ovs.Cookie(ovs.KindDrop, ovs.RuleID(pp.Drop))
	for _, f := range []fam{fam4, fam6} {
		sel, ok := selector(f)
		if !ok {
			continue
		}
		b.add(table, dropPriority, drop, f.eth+","+sel, fmt.Sprintf("meter:%d,controller(max_len=128)", DropMeter))
	}
	return nil
}

func joinMatch(parts ...string) string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return strings.Join(out, ",")
}

// peerMatches returns the address matches of a match's peer: one per
// address or prefix ("" for any address). For egress, the peer and an
// egress named port's destination pods are both destinations: their
// intersection is matched.
func peerMatches(mt nft.Match, f fam, dir nft.Direction) []string {
	field := f.src
	if dir == nft.Egress {
		field = f.dst
	}
	var prefixes []netip.Prefix
	switch {
	case mt.Peer.Any:
		prefixes = nil
	case mt.Peer.Addrs != nil:
		for _, a := range mt.Peer.Addrs {
			prefixes = append(prefixes, netip.PrefixFrom(a, a.BitLen()))
		}
	default:
		prefixes = Subtract(mt.Peer.Block, mt.Peer.Except)
		if len(prefixes) == 0 {
			return nil
		}
	}
	if mt.L4.DstAddrs != nil && dir == nft.Egress {
		// Only the named port's pods that the peer also covers.
		var dsts []netip.Prefix
		for _, a := range mt.L4.DstAddrs {
			if mt.Peer.Any || slices.ContainsFunc(prefixes, func(p netip.Prefix) bool { return p.Contains(a) }) {
				dsts = append(dsts, netip.PrefixFrom(a, a.BitLen()))
			}
		}
		if len(dsts) == 0 {
			return nil
		}
		prefixes = dsts
	}
	if prefixes == nil {
		return []string{""}
	}
	out := make([]string, 0, len(prefixes))
	for _, p := range prefixes {
		if p.IsSingleIP() {
			out = append(out, field+"="+p.Addr().String())
		} else {
			out = append(out, field+"="+p.String())
		}
	}
	return out
}

// l4Matches returns the protocol/port matches of l4: the family alone
// when any protocol is allowed, one per masked port range otherwise.
func l4Matches(l4 nft.L4, f fam) []string {
	if l4.Proto == "" {
		return []string{f.eth}
	}
	kw := f.proto(l4.Proto)
	switch {
	case l4.Port == 0:
		return []string{kw}
	case l4.EndPort > l4.Port:
		var out []string
		for _, pm := range PortMasks(uint16(l4.Port), uint16(l4.EndPort)) {
			out = append(out, kw+",tp_dst="+pm)
		}
		return out
	}
	return []string{kw + ",tp_dst=" + strconv.Itoa(int(l4.Port))}
}

// PortMasks covers the port range lo..hi with value/mask matches
// ("0x1b58/0xfff8"), the fewest aligned blocks.
func PortMasks(lo, hi uint16) []string {
	var out []string
	for v := uint32(lo); v <= uint32(hi); {
		size := uint32(1)
		for v%(size*2) == 0 && v+size*2-1 <= uint32(hi) && size < 1<<16 {
			size *= 2
		}
		if size == 1 {
			out = append(out, strconv.Itoa(int(v)))
		} else {
			out = append(out, fmt.Sprintf("%#x/%#x", v, 0xffff&^(size-1)))
		}
		v += size
	}
	return out
}

// Subtract returns block minus every prefix of except (of the same family)
// as a list of disjoint prefixes: OpenFlow matches one prefix per flow, so
// an ipBlock with except becomes several flows.
func Subtract(block netip.Prefix, except []netip.Prefix) []netip.Prefix {
	block = block.Masked()
	for _, e := range except {
		if e.Addr().BitLen() != block.Addr().BitLen() || !e.Overlaps(block) {
			continue
		}
		if e.Bits() <= block.Bits() {
			return nil // block lies inside an except
		}
		// Split block in two halves and subtract from each.
		lo := netip.PrefixFrom(block.Addr(), block.Bits()+1)
		hiAddr := block.Addr()
		bs := hiAddr.AsSlice()
		bit := block.Bits()
		bs[bit/8] |= 0x80 >> (bit % 8)
		hiAddr, _ = netip.AddrFromSlice(bs)
		hi := netip.PrefixFrom(hiAddr, block.Bits()+1)
		return append(Subtract(lo, except), Subtract(hi, except)...)
	}
	return []netip.Prefix{block}
}
