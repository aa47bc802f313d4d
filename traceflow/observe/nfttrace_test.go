package observe

import (
	"net/netip"
	"testing"
)

// Lines as nft 1.0.6 prints them on kernel 6.18 (captured in the lab).
func TestParseTrace(t *testing.T) {
	tests := []struct {
		name string
		line string
		want Event
	}{
		{"ipv4 packet", `trace id e0d976ea inet dualflow forward packet: iif "veth9dd079d5ee" oif "veth5fa96b7d2e" ether saddr ee:67:82:5d:a1:0e ether daddr ee:ee:ee:ee:ee:ee ip saddr 198.18.1.10 ip daddr 198.18.1.11 ip dscp 0x07 ip ecn not-ect ip ttl 63 ip id 8454 ip protocol tcp ip length 60 tcp sport 52110 tcp dport 8080 tcp flags == syn tcp window 64240 `,
			Event{ID: "e0d976ea", Table: "dualflow", Chain: "forward", Kind: KindPacket, IIf: "veth9dd079d5ee", OIf: "veth5fa96b7d2e",
				Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.18.1.11"), SrcPort: 52110, DstPort: 8080}},
		{"ipv6 packet", `trace id 2c9d0f0e inet dualflow_trace_2 pre packet: iif "eth0" ether saddr 6a:e0:96:ed:ba:9c ether daddr 4e:50:4a:37:9e:05 ip6 saddr fd00:10:0:1::10 ip6 daddr fd00:10:0:2::11 ip6 dscp 0x02 ip6 ecn not-ect ip6 hoplimit 63 ip6 flowlabel 0 ip6 nexthdr tcp ip6 length 20 tcp sport 40001 tcp dport 8080 tcp flags == syn tcp window 64240`,
			Event{ID: "2c9d0f0e", Table: "dualflow_trace_2", Chain: "pre", Kind: KindPacket, IIf: "eth0",
				Src: netip.MustParseAddr("fd00:10:0:1::10"), Dst: netip.MustParseAddr("fd00:10:0:2::11"), SrcPort: 40001, DstPort: 8080}},
		{"dnat rule", `trace id 22a0d235 inet dualflow ep/backend/api/http/v6/1 rule meta l4proto tcp counter packets 1 bytes 60 dnat ip6 to [fd00:10:0:2::11]:8080 comment "endpoint [fd00:10:0:2::11]:8080 of backend/api/http/v6" (verdict accept)`,
			Event{ID: "22a0d235", Table: "dualflow", Chain: "ep/backend/api/http/v6/1", Kind: KindRule, Verdict: "accept",
				Rule: `meta l4proto tcp counter packets 1 bytes 60 dnat ip6 to [fd00:10:0:2::11]:8080 comment "endpoint [fd00:10:0:2::11]:8080 of backend/api/http/v6"`}},
		{"drop rule", `trace id 56d95353 inet dualflow ingress/backend/api-58d4c7f9b6-qbjkw rule counter name "drop/ingress/backend/api-58d4c7f9b6-qbjkw" log prefix "drop/ingress/backend/api-58d4c7f9b6-qbjkw" group 100 drop comment "drop/ingress/backend/api-58d4c7f9b6-qbjkw" (verdict drop)`,
			Event{ID: "56d95353", Table: "dualflow", Chain: "ingress/backend/api-58d4c7f9b6-qbjkw", Kind: KindRule, Verdict: "drop",
				Rule: `counter name "drop/ingress/backend/api-58d4c7f9b6-qbjkw" log prefix "drop/ingress/backend/api-58d4c7f9b6-qbjkw" group 100 drop comment "drop/ingress/backend/api-58d4c7f9b6-qbjkw"`}},
		{"jump", `trace id e0d976ea inet dualflow prerouting rule ip daddr 198.19.0.11 tcp dport 80 jump svc/backend/api/http/v4 (verdict jump svc/backend/api/http/v4)`,
			Event{ID: "e0d976ea", Table: "dualflow", Chain: "prerouting", Kind: KindRule, Verdict: "jump svc/backend/api/http/v4", Rule: "ip daddr 198.19.0.11 tcp dport 80 jump svc/backend/api/http/v4"}},
		{"policy", `trace id 672352a6 inet dualflow forward policy accept `,
			Event{ID: "672352a6", Table: "dualflow", Chain: "forward", Kind: KindPolicy, Verdict: "accept"}},
		{"deleted rule", `trace id 9f3414dd inet dualflow_trace_1 pre unknown rule handle 3 (verdict continue)`,
			Event{ID: "9f3414dd", Table: "dualflow_trace_1", Chain: "pre", Kind: KindRule, Rule: "unknown rule handle 3", Verdict: "continue"}},
		// A rule replaced after nft monitor started (kube-router's, after
		// each of its syncs): its verdict is the drop.
		{"uncached rule's drop", `trace id fab679f3 ip filter KUBE-POD-FW-MHANDYD4N5VKPUAF unknown rule handle 1234 (verdict drop)`,
			Event{ID: "fab679f3", Table: "filter", Chain: "KUBE-POD-FW-MHANDYD4N5VKPUAF", Kind: KindRule, Rule: "unknown rule handle 1234", Verdict: "drop"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := ParseTrace(tt.line)
			if !ok || got != tt.want {
				t.Errorf("ParseTrace =\n%+v, %v\nwant\n%+v", got, ok, tt.want)
			}
		})
	}
	for _, l := range []string{"add table inet dualflow_trace_1", "# new generation 10 by process 5388 (nft)", "", "trace id x"} {
		if _, ok := ParseTrace(l); ok {
			t.Errorf("ParseTrace(%q) ok", l)
		}
	}
}

func TestRuleHelpers(t *testing.T) {
	rule := `meta l4proto tcp counter packets 1 bytes 60 dnat ip6 to [fd00:10:0:2::11]:8080 comment "endpoint [fd00:10:0:2::11]:8080 of backend/api/http/v6"`
	if got, ok := DNATTarget(rule); !ok || got != netip.MustParseAddrPort("[fd00:10:0:2::11]:8080") {
		t.Errorf("DNATTarget v6 = %v %v", got, ok)
	}
	if got, ok := DNATTarget("meta l4proto tcp dnat ip to 198.18.1.11:8080 comment \"x\""); !ok || got != netip.MustParseAddrPort("198.18.1.11:8080") {
		t.Errorf("DNATTarget v4 = %v %v", got, ok)
	}
	// kube-proxy's nftables mode picks one of several endpoints in a map.
	if got, ok := DNATTarget("meta l4proto tcp dnat ip6 to numgen random mod 2 map { 0 : fd00:10:c0:101::4 . 8080, 1 : fd00:10:c0:102::4 . 8080 }"); !ok || got.IsValid() {
		t.Errorf("DNATTarget of a map = %v %v, want a DNAT of no one target", got, ok)
	}
	if _, ok := DNATTarget("counter accept"); ok {
		t.Error("DNATTarget without dnat")
	}
	if c, ok := Quoted(rule, "comment"); !ok || c != "endpoint [fd00:10:0:2::11]:8080 of backend/api/http/v6" {
		t.Errorf("Quoted comment = %q", c)
	}
	if n, ok := Quoted(`ip saddr 1.2.3.4 counter name "backend/allow-web-to-api/ingress/0" accept`, "counter name"); !ok || n != "backend/allow-web-to-api/ingress/0" {
		t.Errorf("Quoted counter name = %q", n)
	}
}

func TestOFFlow(t *testing.T) {
	tests := []struct {
		proto uint8
		src   string
		want  string
	}{
		{6, "198.18.1.10", "in_port=10,tcp,dl_dst=ee:ee:ee:ee:ee:ee,nw_src=198.18.1.10,nw_dst=198.18.2.11,nw_tos=28,nw_ttl=64,tp_src=40000,tp_dst=8080,tcp_flags=0x002"},
		{17, "fd00:10:0:1::10", "in_port=10,udp6,dl_dst=ee:ee:ee:ee:ee:ee,ipv6_src=fd00:10:0:1::10,ipv6_dst=fd00:10:0:2::11,nw_tos=28,nw_ttl=64,udp_src=40000,udp_dst=8080"},
		{1, "198.18.1.10", "in_port=10,icmp,dl_dst=ee:ee:ee:ee:ee:ee,nw_src=198.18.1.10,nw_dst=198.18.2.11,nw_tos=28,nw_ttl=64,icmp_type=8,icmp_code=0"},
		{58, "fd00:10:0:1::10", "in_port=10,icmp6,dl_dst=ee:ee:ee:ee:ee:ee,ipv6_src=fd00:10:0:1::10,ipv6_dst=fd00:10:0:2::11,nw_tos=28,nw_ttl=64,icmpv6_type=128,icmpv6_code=0"},
	}
	for _, tt := range tests {
		src := netip.MustParseAddr(tt.src)
		dst := netip.MustParseAddr("198.18.2.11")
		if src.Is6() {
			dst = netip.MustParseAddr("fd00:10:0:2::11")
		}
		if got := OFFlow(10, src, dst, tt.proto, 40000, 8080, 2, 7, 64); got != tt.want {
			t.Errorf("OFFlow proto %d =\n%s\nwant\n%s", tt.proto, got, tt.want)
		}
	}
}

func TestParseOFTrace(t *testing.T) {
	out := `bridge("br-int")
----------------
 0. ip,in_port=10,nw_src=198.18.1.10, priority 100, cookie 0xdf01000000000000
    goto_table:10
10. ip, priority 100, cookie 0xdf0100000000000a
    ct(table=20,zone=1,nat)
Datapath actions: ct(zone=1,nat),recirc(0x3)
    thaw
        Resuming from table 20
20. priority 0, cookie 0xdf01000000000014
    goto_table:30
30. ct_state=+new+trk,tcp,nw_dst=198.19.0.11,tp_dst=80, priority 100, cookie 0xdf040000b76046bc
    group:1
     -> no live bucket
Datapath actions: hash(sym_l4(0)),recirc(0x4)
`
	tr := ParseOFTrace(out)
	if len(tr.Steps) != 4 || !tr.NoLiveBucket || tr.DatapathActions != "hash(sym_l4(0)),recirc(0x4)" {
		t.Fatalf("parsed %+v", tr)
	}
	last := tr.Steps[3]
	if last.Table != 30 || last.Cookie != 0xdf040000b76046bc || last.Match != "ct_state=+new+trk,tcp,nw_dst=198.19.0.11,tp_dst=80" || last.Actions[0] != "group:1" {
		t.Errorf("step %+v", last)
	}
	if tr.Steps[2].Table != 20 || tr.Steps[2].Match != "" {
		t.Errorf("step %+v", tr.Steps[2])
	}
}
