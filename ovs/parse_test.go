package ovs

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
)

var update = flag.Bool("update", false, "rewrite the testdata/*.golden files from the parsers' output")

// golden compares got (as indented JSON) with testdata/name, or writes it
// with -update.
func golden(t *testing.T, name string, got any) {
	t.Helper()
	b, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if string(want) != string(b) {
		t.Errorf("%s differs from the parser's output (go test -update rewrites it):\n%s", path, b)
	}
}

func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// The captures in testdata come from `dualflow lab up --datapath ovs`:
// dpctl/dump-conntrack -m of both nodes (split by family), dump-conntrack
// without -m, dump-flows of node-1 (IPv4 flows) and node-2 (IPv6 flows),
// and ovs-ofctl monitor of both nodes while denied connections were tried.
func TestParseConntrackGolden(t *testing.T) {
	for _, tc := range []struct {
		in      string
		version uint8
	}{{"conntrack-ipv4.txt", 4}, {"conntrack-ipv6.txt", 6}, {"conntrack-brief.txt", 0}} {
		t.Run(tc.in, func(t *testing.T) {
			var got []Entry
			bad, err := ParseConntrack(readTestdata(t, tc.in), func(e *Entry) { got = append(got, *e) })
			if bad != 0 {
				t.Fatalf("%d bad lines: %v", bad, err)
			}
			if len(got) == 0 {
				t.Fatal("no entries")
			}
			for _, e := range got {
				if tc.version != 0 && (e.Orig.IPVersion() != tc.version || e.Reply.IPVersion() != tc.version) {
					t.Errorf("entry %+v: want IPv%d", e, tc.version)
				}
				// Without the allowed mark: a Service connection that the
				// node's policy then denied (only DNAT-ed, never answered).
				if e.Zone != 1 || (e.Mark&MarkAllowed == 0 && (e.TCPState != "SYN_SENT" || !e.DstNAT())) {
					t.Errorf("entry %+v: want zone 1 and the allowed mark unless only DNAT-ed", e)
				}
				if e.Orig.Proto == flow.ProtoTCP && e.TCPState == "" {
					t.Errorf("tcp entry without state: %+v", e)
				}
			}
			golden(t, strings.TrimSuffix(tc.in, ".txt")+".golden", got)
		})
	}
}

func TestParseFlowsGolden(t *testing.T) {
	for _, tc := range []struct {
		in      string
		version uint8
	}{{"flows-ipv4.txt", 4}, {"flows-ipv6.txt", 6}} {
		t.Run(tc.in, func(t *testing.T) {
			var got []Flow
			bad, err := ParseFlows(readTestdata(t, tc.in), func(f *Flow) { got = append(got, *f) })
			if bad != 0 {
				t.Fatalf("%d bad lines: %v", bad, err)
			}
			counters := 0
			for _, f := range got {
				k, _, ok := SplitCookie(f.Cookie)
				if !ok {
					t.Errorf("flow %+v: not a dualflow cookie", f)
				}
				if k == KindConn && f.Table == 65 && f.Priority == 100 {
					tu, ok := MatchTuple(f.Match)
					if !ok || tu.IPVersion() != tc.version {
						t.Errorf("counter flow %q: tuple %+v ok=%v, want IPv%d", f.Match, tu, ok, tc.version)
					}
					counters++
				}
			}
			if counters == 0 {
				t.Error("no per-connection counter flows")
			}
			golden(t, strings.TrimSuffix(tc.in, ".txt")+".golden", got)
		})
	}
}

func TestMonitorGolden(t *testing.T) {
	for _, tc := range []struct {
		in      string
		version uint8
	}{{"monitor-ipv4.txt", 4}, {"monitor-ipv6.txt", 6}} {
		t.Run(tc.in, func(t *testing.T) {
			var got []PacketIn
			var p MonitorParser
			lines(readTestdata(t, tc.in), func(l string) bool {
				pi, done, err := p.Feed(l)
				if err != nil {
					t.Errorf("line %q: %v", l, err)
				}
				if done {
					got = append(got, pi)
				}
				return true
			})
			if len(got) == 0 {
				t.Fatal("no packet-ins")
			}
			for _, pi := range got {
				if k, _, _ := SplitCookie(pi.Cookie); k != KindDrop || pi.Tuple.IPVersion() != tc.version || pi.TotalLen == 0 {
					t.Errorf("packet-in %+v: want a drop flow's IPv%d packet", pi, tc.version)
				}
			}
			golden(t, strings.TrimSuffix(tc.in, ".txt")+".golden", got)
		})
	}
}

func TestParseConntrackLine(t *testing.T) {
	v4 := "tcp,orig=(src=198.18.1.10,dst=198.19.0.11,sport=34932,dport=80),reply=(src=198.18.2.11,dst=198.18.1.10,sport=8080,dport=34932),id=0,zone=1,status=0,mark=1,labels=0xaf3c3bbc5ecd65d6,protoinfo=(state_orig=ESTABLISHED,state_reply=SYN_RECV)"
	v6 := "udp,orig=(src=fd00:10:0:1::10,dst=fd00:10:0:2::11,sport=39344,dport=5353,packets=3,bytes=180),reply=(src=fd00:10:0:2::11,dst=fd00:10:0:1::10,sport=5353,dport=39344,packets=2,bytes=120),zone=7,start=2026-11-29T21:11:45.123456789"
	icmp6 := "icmpv6,orig=(src=fd00:10:0:1::10,dst=fd00:10:0:2::10,id=31978,type=128,code=0),reply=(src=fd00:10:0:2::10,dst=fd00:10:0:1::10,id=31978,type=129,code=0),id=0,zone=1,status=0,mark=1"
	tests := []struct {
		name, line string
		check      func(t *testing.T, e *Entry)
		wantErr    bool
	}{
		{"ipv4 service tcp", v4, func(t *testing.T, e *Entry) {
			if e.Orig.Dst != netip.MustParseAddr("198.19.0.11") || e.Reply.Src != netip.MustParseAddr("198.18.2.11") || !e.DstNAT() {
				t.Errorf("tuples %+v %+v", e.Orig, e.Reply)
			}
			if e.IngressRule() != 0x5ecd65d6 || e.EgressRule() != 0xaf3c3bbc || e.TCPState != "ESTABLISHED" || e.Zone != 1 {
				t.Errorf("labels/state %+v", e)
			}
		}, false},
		{"ipv6 udp with kernel counters", v6, func(t *testing.T, e *Entry) {
			if !e.HasCounters || e.OrigPackets != 3 || e.ReplyBytes != 120 || e.Zone != 7 || e.Start.IsZero() || e.Orig.IPVersion() != 6 {
				t.Errorf("entry %+v", e)
			}
		}, false},
		{"ipv6 icmp echo", icmp6, func(t *testing.T, e *Entry) {
			if e.ICMPID != 31978 || e.ICMPType != 128 || e.Orig.Proto != flow.ProtoICMPv6 || e.DstNAT() {
				t.Errorf("entry %+v", e)
			}
		}, false},
		{"ipv4 numeric protocol", "proto=47,orig=(src=198.18.1.1,dst=198.18.1.2),reply=(src=198.18.1.2,dst=198.18.1.1)", func(t *testing.T, e *Entry) {
			if e.Orig.Proto != 47 {
				t.Errorf("proto %d", e.Orig.Proto)
			}
		}, false},
		{"missing reply", "tcp,orig=(src=198.18.1.1,dst=198.18.1.2,sport=1,dport=2)", nil, true},
		{"bad address", "tcp,orig=(src=198.18.1.300,dst=198.18.1.2),reply=(src=198.18.1.2,dst=198.18.1.1)", nil, true},
		{"mixed families", "tcp,orig=(src=198.18.1.1,dst=fd00:10::1),reply=(src=fd00:10::1,dst=198.18.1.1)", nil, true},
		{"unbalanced", "tcp,orig=(src=198.18.1.1,dst=198.18.1.2,reply=(src=198.18.1.2,dst=198.18.1.1)", nil, true},
		{"port out of range", "tcp,orig=(src=198.18.1.1,dst=198.18.1.2,sport=70000,dport=2),reply=(src=198.18.1.2,dst=198.18.1.1)", nil, true},
		{"zone in ipv6 address", "tcp,orig=(src=fe80::1%eth0,dst=fe80::2),reply=(src=fe80::2,dst=fe80::1)", nil, true},
		{"label too long", v4[:strings.Index(v4, "labels=")] + "labels=0x" + strings.Repeat("f", 33), nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var e Entry
			err := ParseConntrackLine(tc.line, &e)
			if tc.wantErr {
				if !errors.Is(err, ErrSyntax) {
					t.Fatalf("err = %v, want ErrSyntax", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, &e)
		})
	}
}

func TestParseFlowLine(t *testing.T) {
	tests := []struct {
		name, line string
		want       Flow
		wantErr    bool
	}{
		{"ipv4 learned counter", " cookie=0xdf05000000000000, duration=4.846s, table=65, n_packets=5, n_bytes=339, idle_timeout=300, idle_age=4, priority=100,tcp,nw_src=198.18.1.11,nw_dst=198.18.1.12,tp_src=55734,tp_dst=8080 actions=drop",
			Flow{Cookie: Cookie(KindConn, 0), Duration: 4846 * time.Millisecond, Table: 65, Packets: 5, Bytes: 339, Priority: 100,
				Match: "tcp,nw_src=198.18.1.11,nw_dst=198.18.1.12,tp_src=55734,tp_dst=8080", Actions: "drop"}, false},
		{"ipv6 drop rule, OpenFlow 1.3 format", " cookie=0xdf030000e182b285, duration=22.358s, table=45, n_packets=3, n_bytes=306, priority=100,ipv6,ipv6_dst=fd00:10:0:2::11 actions=meter:1,CONTROLLER:128",
			Flow{Cookie: 0xdf030000e182b285, Duration: 22358 * time.Millisecond, Table: 45, Packets: 3, Bytes: 306, Priority: 100,
				Match: "ipv6,ipv6_dst=fd00:10:0:2::11", Actions: "meter:1,CONTROLLER:128"}, false},
		{"default priority, match all", " cookie=0x0, duration=1s, table=0, n_packets=0, n_bytes=0, idle_age=1 actions=NORMAL",
			Flow{Duration: time.Second, Priority: defaultPriority, Actions: "NORMAL"}, false},
		{"flags", " cookie=0x1, duration=1.5s, table=3, n_packets=1, n_bytes=2, send_flow_rem reset_counts, priority=0 actions=drop", Flow{}, false},
		{"no actions", " cookie=0x1, duration=1.5s, table=3, n_packets=1, n_bytes=2", Flow{}, true},
		{"bad counter", " cookie=0x1, duration=1.5s, table=3, n_packets=-1, n_bytes=2, priority=0 actions=drop", Flow{}, true},
		{"bad duration", " cookie=0x1, duration=xs, table=3, n_packets=1, n_bytes=2, priority=0 actions=drop", Flow{}, true},
		{"duration past time.Duration", " cookie=0x1, duration=3e87s, table=3, n_packets=1, n_bytes=2, priority=0 actions=drop", Flow{}, true},
		{"duration NaN", " cookie=0x1, duration=NaNs, table=3, n_packets=1, n_bytes=2, priority=0 actions=drop", Flow{}, true},
		{"duration infinite", " cookie=0x1, duration=+Infs, table=3, n_packets=1, n_bytes=2, priority=0 actions=drop", Flow{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var f Flow
			err := ParseFlowLine(tc.line, &f)
			if tc.wantErr != (err != nil) {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if tc.want.Actions != "" && f != tc.want {
				t.Errorf("got %+v\nwant %+v", f, tc.want)
			}
		})
	}
}

func TestMatchTuple(t *testing.T) {
	for _, tc := range []struct {
		m  string
		ok bool
		v  uint8
	}{
		{"tcp,nw_src=198.18.1.11,nw_dst=198.18.1.12,tp_src=55734,tp_dst=8080", true, 4},
		{"udp6,ipv6_src=fd00:10:0:1::11,ipv6_dst=fd00:10:0:1::12,tp_src=1,tp_dst=2", true, 6},
		{"icmp6,ipv6_src=fd00:10:0:1::11,ipv6_dst=fd00:10:0:1::12", true, 6},
		{"tcp,nw_src=198.18.0.0/16,tp_dst=9090", false, 0},
		{"tcp6,nw_src=198.18.1.1,nw_dst=198.18.1.2", false, 0},
		{"ip,nw_dst=198.18.1.1", false, 0},
	} {
		tu, ok := MatchTuple(tc.m)
		if ok != tc.ok || (ok && tu.IPVersion() != tc.v) {
			t.Errorf("MatchTuple(%q) = %+v, %v", tc.m, tu, ok)
		}
	}
}

func TestMonitorParserErrors(t *testing.T) {
	var p MonitorParser
	in := []string{
		"OFPT_PORT_STATUS (xid=0x0): MOD: 1(eth0): addr:aa:bb:cc:dd:ee:ff",
		"     config:     0",
		"NXT_PACKET_IN2 (xid=0x0): table_id=45 total_len=74 in_port=12 (via action) data_len=74 (unbuffered)", // no cookie
		"NXT_PACKET_IN2 (xid=0x0): table_id=45 cookie=0xdf03000000000001 total_len=74 ct_state=new|trk,ct_zone=1,ip,in_port=12 (via action) data_len=74 (unbuffered)",
		"arp,vlan_tci=0x0000,dl_src=aa:bb:cc:dd:ee:ff", // not an IP packet
		"NXT_PACKET_IN2 (xid=0x0): table_id=45 cookie=0xdf03000000000001 total_len=94 ct_state=new|trk|dnat,ct_zone=1,ct_ipv6_src=fd00:10:0:1::12,ct_ipv6_dst=fd00:10:ff::11,ct_nw_proto=6,ct_tp_src=55488,ct_tp_dst=80,ipv6,in_port=12 (via action) data_len=94 (unbuffered)",
		" userdata=01",
		"tcp6,vlan_tci=0x0000,ipv6_src=fd00:10:0:1::12,ipv6_dst=fd00:10:0:1::11,tp_src=55488,tp_dst=8080,tcp_flags=syn tcp_csum:ef27",
	}
	var errs, done int
	var last PacketIn
	for _, l := range in {
		pi, ok, err := p.Feed(l)
		if err != nil {
			errs++
		}
		if ok {
			done++
			last = pi
		}
	}
	if errs != 2 || done != 1 {
		t.Fatalf("%d errors, %d packet-ins; want 2 and 1", errs, done)
	}
	if last.CTOrig.Dst != netip.MustParseAddr("fd00:10:ff::11") || last.CTOrig.DstPort != 80 || last.Tuple.DstPort != 8080 {
		t.Errorf("packet-in %+v: want the service tuple in CTOrig", last)
	}
}

func TestSplitCookie(t *testing.T) {
	c := Cookie(KindDrop, 0xdeadbeef)
	if k, id, ok := SplitCookie(c); !ok || k != KindDrop || id != 0xdeadbeef {
		t.Errorf("SplitCookie(%#x) = %v %#x %v", c, k, id, ok)
	}
	if _, _, ok := SplitCookie(0x1234); ok {
		t.Error("foreign cookie accepted")
	}
	if RuleID("") == 0 {
		t.Error("rule id 0")
	}
}

func TestRules(t *testing.T) {
	rules := []Rule{
		{ID: RuleID("backend/allow-web-to-api/ingress/0"), Kind: KindAllow, Name: "backend/allow-web-to-api/ingress/0", Namespace: "backend", Policy: "allow-web-to-api", Direction: "ingress"},
		{ID: RuleID("drop/egress/tools/probe-1"), Kind: KindDrop, Name: "drop/egress/tools/probe-1", Namespace: "tools", Pod: "probe-1", Direction: "egress", Index: -1},
	}
	path := filepath.Join(t.TempDir(), "rules.json")
	if err := WriteRules(path, rules); err != nil {
		t.Fatal(err)
	}
	r, err := LoadRules(path)
	if err != nil {
		t.Fatal(err)
	}
	if x, ok := r.Lookup(RuleID("drop/egress/tools/probe-1")); !ok || x.Kind != KindDrop || x.Pod != "probe-1" {
		t.Errorf("lookup: %+v %v", x, ok)
	}
	if n := r.ReportedName(42); n != "rule-id:0x2a" {
		t.Errorf("unknown rule named %q", n)
	}
	if _, err := NewRules([]Rule{{ID: 5, Name: "a"}, {ID: 5, Name: "b"}}); err == nil {
		t.Error("id collision accepted")
	}
	if _, err := ParseRules([]byte("{")); err == nil {
		t.Error("bad json accepted")
	}
}

func ExampleCookie() {
	fmt.Printf("%#x\n", Cookie(KindAllow, RuleID("backend/allow-web-to-api/ingress/0")))
	// Output: 0xdf0200005ecd65d6
}
