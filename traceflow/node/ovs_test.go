package node

import (
	"maps"
	"net/netip"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/ovs"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
)

// ofctlShow is `ovs-ofctl show br-int` of a lab node (OpenFlow 1.0).
const ofctlShow = `OFPT_FEATURES_REPLY (xid=0x2): dpid:0000ce7dc940e540
n_tables:254, n_buffers:0
capabilities: FLOW_STATS TABLE_STATS PORT_STATS QUEUE_STATS ARP_MATCH_IP
actions: output enqueue set_vlan_vid set_vlan_pcp strip_vlan mod_dl_src mod_dl_dst mod_nw_src mod_nw_dst mod_nw_tos mod_tp_src mod_tp_dst
 1(eth0): addr:86:fa:3b:d9:64:ba
     config:     0
     state:      0
     current:    10GB-FD COPPER
     speed: 10000 Mbps now, 0 Mbps max
 10(veth9dd079d5ee): addr:ee:ee:ee:ee:ee:ee
     config:     0
     state:      0
     current:    10GB-FD COPPER
     speed: 10000 Mbps now, 0 Mbps max
 11(veth5fa96b7d2e): addr:ee:ee:ee:ee:ee:ee
     config:     0
     state:      0
     speed: 10000 Mbps now, 0 Mbps max
 LOCAL(br-int): addr:ce:7d:c9:40:e5:40
     config:     PORT_DOWN
     state:      LINK_DOWN
     speed: 10000 Mbps now, 0 Mbps max
OFPT_GET_CONFIG_REPLY (xid=0x4): frags=normal miss_send_len=0
`

// ofctlPortsDesc is `ovs-ofctl -O OpenFlow13 dump-ports-desc br-int`.
const ofctlPortsDesc = `OFPST_PORT_DESC reply (OF1.3) (xid=0x2):
 1(antrea-tun0): addr:5a:0e:3c:1f:22:01
     config:     0
     state:      LIVE
     speed: 0 Mbps now, 0 Mbps max
 2(antrea-gw0): addr:62:1b:8e:34:55:02
     config:     0
     state:      LIVE
     speed: 0 Mbps now, 0 Mbps max
 65534(coredns--3e3abf): addr:0a:58:0a:0a:00:03
     config:     0
     state:      LIVE
 LOCAL(br-int): addr:7e:a5:4f:1a:9b:40
     config:     PORT_DOWN
     state:      LINK_DOWN
`

func TestParsePorts(t *testing.T) {
	for _, tc := range []struct {
		name string
		out  string
		want map[string]int
	}{
		{"show", ofctlShow, map[string]int{"eth0": 1, "veth9dd079d5ee": 10, "veth5fa96b7d2e": 11}},
		{"dump-ports-desc", ofctlPortsDesc, map[string]int{"antrea-tun0": 1, "antrea-gw0": 2, "coredns--3e3abf": 65534}},
		{"no ports", "OFPT_FEATURES_REPLY (xid=0x2): dpid:0000ce7dc940e540\n", map[string]int{}},
		{"empty", "", map[string]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := parsePorts(tc.out); !maps.Equal(got, tc.want) {
				t.Errorf("parsePorts = %v, want %v", got, tc.want)
			}
		})
	}
}

// Packet-ins of drop flows as `ovs-ofctl monitor` prints them (header,
// then the packet's flow line).
const (
	pinV4Header   = `NXT_PACKET_IN2 (xid=0x0): table_id=45 cookie=0xdf030000e182b285 total_len=74 ct_state=new|trk,ct_zone=1,ct_nw_src=198.18.1.12,ct_nw_dst=198.18.2.11,ct_nw_proto=6,ct_tp_src=48144,ct_tp_dst=8080,ip,in_port=1 (via action) data_len=74 (unbuffered)`
	pinV4Packet   = `tcp,vlan_tci=0x0000,dl_src=ce:8e:63:14:c2:ed,dl_dst=ee:96:ba:43:86:10,nw_src=198.18.1.12,nw_dst=198.18.2.11,nw_tos=4,nw_ecn=0,nw_ttl=63,nw_frag=no,tp_src=48144,tp_dst=8080,tcp_flags=syn tcp_csum:299e`
	pinV6Header   = `NXT_PACKET_IN2 (xid=0x0): table_id=45 cookie=0xdf030000b9950762 total_len=94 ct_state=new|trk|dnat,ct_zone=1,ct_ipv6_src=fd00:10:0:1::12,ct_ipv6_dst=fd00:10:ff::11,ct_nw_proto=6,ct_tp_src=55488,ct_tp_dst=80,ipv6,reg6=0xaf3c3bbc,in_port=12 (via action) data_len=94 (unbuffered)`
	pinV6Packet   = `tcp6,vlan_tci=0x0000,dl_src=9e:22:f8:bf:45:91,dl_dst=ee:ee:ee:ee:ee:ee,ipv6_src=fd00:10:0:1::12,ipv6_dst=fd00:10:0:1::11,ipv6_label=0x36711,nw_tos=28,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=55488,tp_dst=8080,tcp_flags=syn tcp_csum:ef27`
	pinICMPHeader = `NXT_PACKET_IN2 (xid=0x0): table_id=45 cookie=0xdf030000e182b285 total_len=98 ct_state=new|trk,ct_zone=1,ct_nw_src=198.18.1.10,ct_nw_dst=198.18.2.11,ct_nw_proto=1,ct_tp_src=8,ct_tp_dst=0,ip,in_port=1 (via action) data_len=98 (unbuffered)`
	pinICMPPacket = `icmp,vlan_tci=0x0000,dl_src=b6:f0:06:a1:b9:56,dl_dst=02:a9:c9:cc:6b:28,nw_src=198.18.1.10,nw_dst=198.18.2.11,nw_tos=8,nw_ecn=0,nw_ttl=63,nw_frag=no,icmp_type=8,icmp_code=0 icmp_csum:e140`
)

func packetIn(t *testing.T, header, pkt string) ovs.PacketIn {
	t.Helper()
	var mp ovs.MonitorParser
	if _, _, err := mp.Feed(header); err != nil {
		t.Fatal(err)
	}
	pi, ok, err := mp.Feed(pkt)
	if err != nil || !ok {
		t.Fatalf("packet-in: %v %v", ok, err)
	}
	return pi
}

func TestPacketTOS(t *testing.T) {
	for _, tc := range []struct {
		name string
		line string
		want uint8
		ok   bool
	}{
		{"ipv4", pinV4Packet, 4, true},
		{"ipv6", pinV6Packet, 28, true},
		{"header", pinV4Header, 0, false},
		{"out of range", "tcp,nw_tos=300,nw_ecn=0", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := packetTOS(tc.line)
			if got != tc.want || ok != tc.ok {
				t.Errorf("packetTOS = %d %v, want %d %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestMine(t *testing.T) {
	v4 := traceflow.Probe{Src: netip.MustParseAddr("198.18.1.12"), Dst: netip.MustParseAddr("198.18.2.11"), Protocol: traceflow.TCP, SrcPort: 48144, DstPort: 8080, Tag: 1}
	v6 := traceflow.Probe{Src: netip.MustParseAddr("fd00:10:0:1::12"), Dst: netip.MustParseAddr("fd00:10:ff::11"), Protocol: traceflow.TCP, SrcPort: 55488, DstPort: 80, Tag: 7}
	icmp := traceflow.Probe{Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.18.2.11"), Protocol: traceflow.ICMP, SrcPort: 4321, Tag: 2}
	with := func(p traceflow.Probe, f func(*traceflow.Probe)) traceflow.Probe { f(&p); return p }
	for _, tc := range []struct {
		name           string
		p              traceflow.Probe
		header, packet string
		want           bool
	}{
		{"ipv4", v4, pinV4Header, pinV4Packet, true},
		{"ipv6 after DNAT", v6, pinV6Header, pinV6Packet, true},
		{"icmp without echo id", icmp, pinICMPHeader, pinICMPPacket, true},
		{"other tag", with(v4, func(p *traceflow.Probe) { p.Tag = 2 }), pinV4Header, pinV4Packet, false},
		{"other source port", with(v6, func(p *traceflow.Probe) { p.SrcPort = 1 }), pinV6Header, pinV6Packet, false},
		{"other source", with(v4, func(p *traceflow.Probe) { p.Src = netip.MustParseAddr("198.18.1.13") }), pinV4Header, pinV4Packet, false},
		{"other protocol", with(v4, func(p *traceflow.Probe) { p.Protocol = traceflow.UDP }), pinV4Header, pinV4Packet, false},
		{"not a drop flow", v4, strings.Replace(pinV4Header, "cookie=0xdf03", "cookie=0xdf02", 1), pinV4Packet, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := &ovsWatch{p: tc.p}
			if got := w.mine(packetIn(t, tc.header, tc.packet), tc.packet); got != tc.want {
				t.Errorf("mine = %v, want %v", got, tc.want)
			}
		})
	}
}

// conntrackDump is `ovs-appctl dpctl/dump-conntrack -m` of a lab node.
const conntrackDump = `tcp,orig=(src=198.18.1.10,dst=198.19.0.11,sport=34932,dport=80),reply=(src=198.18.2.11,dst=198.18.1.10,sport=8080,dport=34932),id=0,zone=1,status=0,mark=1,protoinfo=(state_orig=SYN_SENT,state_reply=CLOSED)
tcp,orig=(src=fd00:10:0:1::12,dst=fd00:10:ff::11,sport=55488,dport=80),reply=(src=fd00:10:0:1::11,dst=fd00:10:0:1::12,sport=8080,dport=55488),id=0,zone=1,status=0,protoinfo=(state_orig=SYN_SENT,state_reply=CLOSED)
udp,orig=(src=198.18.1.10,dst=198.19.0.11,sport=40000,dport=53),reply=(src=198.18.1.11,dst=198.18.9.1,sport=5353,dport=1024),id=0,zone=1,status=0,mark=1
icmpv6,orig=(src=fd00:10:0:1::10,dst=fd00:10:0:2::10,id=31978,type=128,code=0),reply=(src=fd00:10:0:2::10,dst=fd00:10:0:1::10,id=31978,type=129,code=0),id=0,zone=1,status=0,mark=1
icmp,orig=(src=198.18.1.10,dst=198.18.2.10,id=31976,type=8,code=0),reply=(src=198.18.2.10,dst=198.18.1.10,id=31976,type=0,code=0),zone=1,mark=1
not a conntrack line
`

func TestFindConn(t *testing.T) {
	ap := netip.MustParseAddrPort
	for _, tc := range []struct {
		name           string
		p              traceflow.Probe
		ok             bool
		dstNAT, srcNAT netip.AddrPort
	}{
		{"ipv4 service", traceflow.Probe{Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.19.0.11"), Protocol: traceflow.TCP, SrcPort: 34932, DstPort: 80},
			true, ap("198.18.2.11:8080"), netip.AddrPort{}},
		{"ipv6 service", traceflow.Probe{Src: netip.MustParseAddr("fd00:10:0:1::12"), Dst: netip.MustParseAddr("fd00:10:ff::11"), Protocol: traceflow.TCP, SrcPort: 55488, DstPort: 80},
			true, ap("[fd00:10:0:1::11]:8080"), netip.AddrPort{}},
		{"ipv4 dnat and snat", traceflow.Probe{Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.19.0.11"), Protocol: traceflow.UDP, SrcPort: 40000, DstPort: 53},
			true, ap("198.18.1.11:5353"), ap("198.18.9.1:1024")},
		{"ipv6 echo", traceflow.Probe{Src: netip.MustParseAddr("fd00:10:0:1::10"), Dst: netip.MustParseAddr("fd00:10:0:2::10"), Protocol: traceflow.ICMPv6, SrcPort: 31978},
			true, netip.AddrPort{}, netip.AddrPort{}},
		{"ipv4 echo of another id", traceflow.Probe{Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.18.2.10"), Protocol: traceflow.ICMP, SrcPort: 1},
			false, netip.AddrPort{}, netip.AddrPort{}},
		{"ipv4 other port", traceflow.Probe{Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.19.0.11"), Protocol: traceflow.TCP, SrcPort: 34933, DstPort: 80},
			false, netip.AddrPort{}, netip.AddrPort{}},
		{"ipv6 other destination", traceflow.Probe{Src: netip.MustParseAddr("fd00:10:0:1::12"), Dst: netip.MustParseAddr("fd00:10:ff::12"), Protocol: traceflow.TCP, SrcPort: 55488, DstPort: 80},
			false, netip.AddrPort{}, netip.AddrPort{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, ok := findConn(conntrackDump, tc.p)
			if ok != tc.ok || v.DstNAT != tc.dstNAT || v.SrcNAT != tc.srcNAT {
				t.Errorf("findConn = %+v %v, want DNAT %v SNAT %v %v", v, ok, tc.dstNAT, tc.srcNAT, tc.ok)
			}
			if ok && v.Text == "" {
				t.Error("no conntrack text")
			}
		})
	}
}

func testRules(t *testing.T) *ovs.Rules {
	t.Helper()
	rs := []ovs.Rule{
		{Kind: ovs.KindDrop, Name: "drop/ingress/backend/api-2", Namespace: "backend", Pod: "api-2", Direction: "ingress", Index: -1},
		{Kind: ovs.KindDrop, Name: "isolate-api-1", Namespace: "backend", Pod: "api-1", Direction: "egress", Index: -1},
		{Kind: ovs.KindAllow, Name: "backend/allow-web-to-api/ingress/0", Namespace: "backend", Policy: "allow-web-to-api", Direction: "ingress"},
	}
	for i := range rs {
		rs[i].ID = ovs.RuleID(rs[i].Name)
	}
	r, err := ovs.NewRules(rs)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestDropObs(t *testing.T) {
	rules := testRules(t)
	v4 := traceflow.Probe{Src: netip.MustParseAddr("198.18.1.12"), Dst: netip.MustParseAddr("198.18.2.11"), Protocol: traceflow.TCP, SrcPort: 48144, DstPort: 8080}
	v6 := traceflow.Probe{Src: netip.MustParseAddr("fd00:10:0:1::12"), Dst: netip.MustParseAddr("fd00:10:ff::11"), Protocol: traceflow.TCP, SrcPort: 55488, DstPort: 80}
	pin := func(p traceflow.Probe, dst string, dport uint16, k ovs.Kind, rule string) ovs.PacketIn {
		pi := ovs.PacketIn{Table: 45, Cookie: ovs.Cookie(k, ovs.RuleID(rule))}
		pi.Tuple.Src, pi.Tuple.Dst, pi.Tuple.Proto = p.Src, netip.MustParseAddr(dst), p.ProtoNumber()
		pi.Tuple.SrcPort, pi.Tuple.DstPort = p.SrcPort, dport
		return pi
	}
	for _, tc := range []struct {
		name         string
		p            traceflow.Probe
		pi           ovs.PacketIn
		rule, policy string
		dst          netip.AddrPort
		reason       string
	}{
		{"ipv4 isolation", v4, pin(v4, "198.18.2.11", 8080, ovs.KindDrop, "drop/ingress/backend/api-2"),
			"drop/ingress/backend/api-2", "", netip.AddrPort{}, "dropped by NetworkPolicy rule drop/ingress/backend/api-2 on node-2"},
		{"ipv6 isolation after DNAT", v6, pin(v6, "fd00:10:0:1::11", 8080, ovs.KindDrop, "drop/ingress/backend/api-2"),
			"drop/ingress/backend/api-2", "", netip.MustParseAddrPort("[fd00:10:0:1::11]:8080"), "dropped by NetworkPolicy rule drop/ingress/backend/api-2 on node-2"},
		{"ipv4 isolation named otherwise", v4, pin(v4, "198.18.2.11", 8080, ovs.KindDrop, "isolate-api-1"),
			"drop/egress/backend/api-1", "", netip.AddrPort{}, "dropped by NetworkPolicy rule drop/egress/backend/api-1 on node-2"},
		{"ipv6 policy rule", v6, pin(v6, "fd00:10:ff::11", 80, ovs.KindDrop, "backend/allow-web-to-api/ingress/0"),
			"backend/allow-web-to-api/ingress/0", "backend/allow-web-to-api", netip.AddrPort{},
			"dropped by NetworkPolicy backend/allow-web-to-api (rule backend/allow-web-to-api/ingress/0) on node-2"},
		{"ipv4 unknown cookie", v4, pin(v4, "198.18.2.11", 8080, ovs.KindDrop, "not/in/the/file"),
			"", "", netip.AddrPort{}, "dropped on node-2 by a drop flow of cookie"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, reason := dropObs(tc.p, "node-2", tc.pi, rules)
			if o.Node != "node-2" || o.Component != traceflow.NetworkPolicy || o.Action != traceflow.ActionDropped {
				t.Errorf("observation %+v, want a network-policy drop on node-2", o)
			}
			if o.Rule != tc.rule || o.Policy != tc.policy || o.TranslatedDst != tc.dst {
				t.Errorf("rule %q policy %q translated %v, want %q %q %v", o.Rule, o.Policy, o.TranslatedDst, tc.rule, tc.policy, tc.dst)
			}
			if !strings.HasPrefix(reason, tc.reason) {
				t.Errorf("reason %q, want %q", reason, tc.reason)
			}
			if tc.policy == "" && tc.rule != "" {
				if _, _, _, ok := IsolationOfRule(o.Rule); !ok {
					t.Errorf("rule %q is not an isolation rule name", o.Rule)
				}
			}
		})
	}
}

// Excerpts of `ovs-appctl ofproto/trace br-int FLOW` on lab nodes.
const (
	// A probe from a pod to a Service's VIP: the trace stops at the
	// select group.
	ofTraceServiceV4 = `Flow: tcp,in_port=10,vlan_tci=0x0000,dl_src=00:00:00:00:00:00,dl_dst=ee:ee:ee:ee:ee:ee,nw_src=198.18.1.10,nw_dst=198.19.0.11,nw_tos=4,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=48449,tp_dst=80,tcp_flags=syn

bridge("br-int")
----------------
 0. ip,in_port=10,nw_src=198.18.1.10, priority 100, cookie 0xdf01000000000000
    goto_table:10
10. ip, priority 100, cookie 0xdf0100000000000a
    ct(table=20,zone=1,nat)
    nat
     -> A clone of the packet is forked to recirculate. The forked pipeline will be resumed at table 20.
     -> Sets the packet to an untracked state, and clears all the conntrack fields.

Final flow: unchanged
Megaflow: recirc_id=0,eth,ip,in_port=10,nw_src=198.18.1.10,nw_frag=no
Datapath actions: ct(zone=1,nat),recirc(0x3)

===============================================================================
recirc(0x3) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)
===============================================================================

Flow: recirc_id=0x3,ct_state=new|trk,ct_zone=1,eth,tcp,in_port=10,vlan_tci=0x0000,dl_src=00:00:00:00:00:00,dl_dst=ee:ee:ee:ee:ee:ee,nw_src=198.18.1.10,nw_dst=198.19.0.11,nw_tos=4,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=48449,tp_dst=80,tcp_flags=syn

bridge("br-int")
----------------
    thaw
        Resuming from table 20
20. priority 0, cookie 0xdf01000000000014
    goto_table:30
30. ct_state=+new+trk,tcp,nw_dst=198.19.0.11,tp_dst=80, priority 100, cookie 0xdf040000b76046bc
    group:1
     -> no live bucket

Final flow: unchanged
Megaflow: recirc_id=0x3,ct_state=+new-est-rel-inv+trk,ct_mark=0/0x1,eth,tcp,in_port=10,nw_dst=198.19.0.11,nw_frag=no,tp_dst=80
Datapath actions: hash(sym_l4(0)),recirc(0x8)
`
	// A probe from another node to a local pod, allowed by an ingress
	// rule.
	ofTracePodV6 = `Flow: tcp6,in_port=1,vlan_tci=0x0000,dl_src=00:00:00:00:00:00,dl_dst=ee:ee:ee:ee:ee:ee,ipv6_src=fd00:10:0:1::10,ipv6_dst=fd00:10:0:2::11,ipv6_label=0x00000,nw_tos=8,nw_ecn=0,nw_ttl=64,nw_frag=no,tp_src=33303,tp_dst=8080,tcp_flags=syn

bridge("br-int")
----------------
 0. ipv6,in_port=1,ipv6_dst=fd00:10:0:2::/64, priority 100, cookie 0xdf01000000000000
    goto_table:10
10. ipv6, priority 100, cookie 0xdf0100000000000a
    ct(table=20,zone=1,nat)
    nat

Datapath actions: ct(zone=1,nat),recirc(0x2)

===============================================================================
recirc(0x2) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)
===============================================================================

bridge("br-int")
----------------
    thaw
        Resuming from table 20
20. priority 0, cookie 0xdf01000000000014
    goto_table:30
30. priority 0, cookie 0xdf0100000000001e
    goto_table:40
40. priority 0, cookie 0xdf01000000000028
    goto_table:45
45. tcp6,ipv6_src=fd00:10:0:1::10,ipv6_dst=fd00:10:0:2::11,tp_dst=8080, priority 19999, cookie 0xdf0200005ecd65d6
    set_field:0x5ecd65d6->reg5
    goto_table:50
50. ipv6, priority 1, cookie 0xdf01000000000032
    ct(commit,table=60,zone=1,exec(set_field:0x1/0x1->ct_mark))

Datapath actions: ct(commit,zone=1,mark=0x1/0x1),recirc(0x3)

===============================================================================
recirc(0x3) - resume conntrack with default ct_state=trk|new (use --ct-next to customize)
===============================================================================

bridge("br-int")
----------------
    thaw
        Resuming from table 60
60. priority 0, cookie 0xdf0100000000003c
    resubmit(,65)
    65. tcp6,ipv6_src=fd00:10:0:1::10,ipv6_dst=fd00:10:0:2::11,tp_src=33303,tp_dst=8080, priority 100, cookie 0xdf05000000000000
            drop
    resubmit(,70)
70. ipv6,ipv6_dst=fd00:10:0:2::11, priority 100, cookie 0xdf01000000000046
    set_field:ee:ee:ee:ee:ee:ee->eth_src
    set_field:22:ce:a9:9d:3f:6f->eth_dst
    dec_ttl
    output:11

Datapath actions: set(eth(src=ee:ee:ee:ee:ee:ee,dst=22:ce:a9:9d:3f:6f)),set(ipv6(hlimit=63)),2
`
	// A probe to an address no flow routes.
	ofTraceNoRouteV4 = `bridge("br-int")
----------------
    thaw
        Resuming from table 60
60. priority 0, cookie 0xdf0100000000003c
    resubmit(,65)
    resubmit(,70)
70. priority 0, cookie 0xdf01000000000046
    drop

Datapath actions: drop
`
)

func TestTraceObs(t *testing.T) {
	rules := testRules(t)
	ports := parsePorts(ofctlShow)
	type want struct {
		c    traceflow.Component
		a    traceflow.Action
		more string // "service=…", "rule=…", "iface=…"
	}
	for _, tc := range []struct {
		name  string
		p     traceflow.Probe
		trace string
		dst   string
		dport uint16
		want  []want
	}{
		{"ipv4 service", traceflow.Probe{Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.19.0.11"), Service: "backend/api", Protocol: traceflow.TCP, DstPort: 80},
			ofTraceServiceV4, "198.19.0.11", 80, []want{{traceflow.LoadBalancing, traceflow.ActionForwarded, "service=backend/api"}}},
		{"ipv6 pod from the uplink", traceflow.Probe{Src: netip.MustParseAddr("fd00:10:0:1::10"), Dst: netip.MustParseAddr("fd00:10:0:2::11"), Protocol: traceflow.TCP, DstPort: 8080},
			ofTracePodV6, "fd00:10:0:2::11", 8080, []want{
				{traceflow.NetworkPolicy, traceflow.ActionForwarded, "rule=backend/allow-web-to-api/ingress/0"},
				{traceflow.Routing, traceflow.ActionForwarded, "iface=veth5fa96b7d2e"},
			}},
		{"ipv4 no route", traceflow.Probe{Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.18.9.99"), Protocol: traceflow.TCP, DstPort: 8080},
			ofTraceNoRouteV4, "198.18.9.99", 8080, []want{{traceflow.Routing, traceflow.ActionDropped, ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obs := traceObs(tc.p, observe.ParseOFTrace(tc.trace), netip.MustParseAddr(tc.dst), tc.dport, ports, rules)
			if len(obs) != len(tc.want) {
				t.Fatalf("got %d observations, want %d: %+v", len(obs), len(tc.want), obs)
			}
			for i, w := range tc.want {
				o := obs[i]
				if o.Component != w.c || o.Action != w.a {
					t.Errorf("observation %d: %s %s, want %s %s", i, o.Component, o.Action, w.c, w.a)
				}
				k, v, _ := strings.Cut(w.more, "=")
				got := map[string]string{"service": o.Service, "rule": o.Rule, "iface": o.Interface}[k]
				if k != "" && got != v {
					t.Errorf("observation %d: %s %q, want %q (%+v)", i, k, got, v, o)
				}
				if o.TranslatedDst.IsValid() {
					t.Errorf("observation %d: translated to %v, the trace was of the original destination", i, o.TranslatedDst)
				}
			}
		})
	}
}

func FuzzParsePorts(f *testing.F) {
	f.Add(ofctlShow)
	f.Add(ofctlPortsDesc)
	f.Fuzz(func(t *testing.T, out string) {
		for name, n := range parsePorts(out) {
			if name == "" || n < 0 {
				t.Fatalf("port %q %d", name, n)
			}
		}
	})
}

func FuzzPacketTOS(f *testing.F) {
	f.Add(pinV4Packet)
	f.Add(pinV6Packet)
	f.Fuzz(func(t *testing.T, line string) {
		packetTOS(line)
	})
}
