package conntrack

import (
	"net/netip"
	"testing"
	"time"

	ct "github.com/ti-mo/conntrack"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/flow"
)

func a(s string) netip.Addr { return netip.MustParseAddr(s) }

// tuple builds a ti-mo tuple.
func tuple(proto uint8, src, dst string, sport, dport uint16) ct.Tuple {
	return ct.Tuple{IP: ct.IPTuple{SourceAddress: a(src), DestinationAddress: a(dst)},
		Proto: ct.ProtoTuple{Protocol: proto, SourcePort: sport, DestinationPort: dport}}
}

func icmp(proto uint8, src, dst string, id uint16, typ uint8) ct.Tuple {
	t := tuple(proto, src, dst, 0, 0)
	t.Proto.ICMPID, t.Proto.ICMPType = id, typ
	t.Proto.ICMPv4, t.Proto.ICMPv6 = proto == 1, proto == 58
	return t
}

func TestFromFlow(t *testing.T) {
	start := time.Unix(1_780_000_000, 0)
	for _, tc := range []struct {
		name        string
		orig, reply ct.Tuple
		want        connstore.Conn // Key, DstAddr/Port, SNATAddr/Port checked
	}{
		{"ipv4/plain",
			tuple(6, "198.18.1.1", "198.18.2.2", 40000, 8080), tuple(6, "198.18.2.2", "198.18.1.1", 8080, 40000),
			connstore.Conn{Key: key(6, "198.18.1.1", "198.18.2.2", 40000, 8080, 7), DstAddr: a("198.18.2.2"), DstPort: 8080}},
		{"ipv6/plain",
			tuple(6, "fd00:10:1::1", "fd00:10:2::2", 40000, 8080), tuple(6, "fd00:10:2::2", "fd00:10:1::1", 8080, 40000),
			connstore.Conn{Key: key(6, "fd00:10:1::1", "fd00:10:2::2", 40000, 8080, 7), DstAddr: a("fd00:10:2::2"), DstPort: 8080}},
		{"ipv4/dnat",
			tuple(6, "198.18.1.1", "198.19.0.10", 40000, 80), tuple(6, "198.18.2.2", "198.18.1.1", 8080, 40000),
			connstore.Conn{Key: key(6, "198.18.1.1", "198.19.0.10", 40000, 80, 7), DstAddr: a("198.18.2.2"), DstPort: 8080}},
		{"ipv6/dnat+snat",
			tuple(17, "fd00:10:1::1", "fd00:10:ff::10", 40000, 80), tuple(17, "fd00:10:2::2", "fd00:10::fe", 8080, 61000),
			connstore.Conn{Key: key(17, "fd00:10:1::1", "fd00:10:ff::10", 40000, 80, 7), DstAddr: a("fd00:10:2::2"), DstPort: 8080,
				SNATAddr: a("fd00:10::fe"), SNATPort: 61000}},
		{"ipv4/snat port only",
			tuple(17, "198.18.1.1", "198.18.2.2", 40000, 53), tuple(17, "198.18.2.2", "198.18.1.1", 53, 1024),
			connstore.Conn{Key: key(17, "198.18.1.1", "198.18.2.2", 40000, 53, 7), DstAddr: a("198.18.2.2"), DstPort: 53,
				SNATAddr: a("198.18.1.1"), SNATPort: 1024}},
		{"ipv4/mapped addresses are unmapped",
			tuple(6, "::ffff:198.18.1.1", "::ffff:198.18.2.2", 1, 2), tuple(6, "::ffff:198.18.2.2", "::ffff:198.18.1.1", 2, 1),
			connstore.Conn{Key: key(6, "198.18.1.1", "198.18.2.2", 1, 2, 7), DstAddr: a("198.18.2.2"), DstPort: 2}},
		{"ipv4/icmp echo",
			icmp(1, "198.18.1.1", "198.18.2.2", 77, 8), icmp(1, "198.18.2.2", "198.18.1.1", 77, 0),
			connstore.Conn{Key: key(1, "198.18.1.1", "198.18.2.2", 77, 8<<8, 7), DstAddr: a("198.18.2.2"), DstPort: 8 << 8}},
		{"ipv6/icmpv6 echo masqueraded",
			icmp(58, "fd00:10:1::1", "fd00:10:2::2", 77, 128), icmp(58, "fd00:10:2::2", "fd00:10::fe", 99, 129),
			connstore.Conn{Key: key(58, "fd00:10:1::1", "fd00:10:2::2", 77, 128<<8, 7), DstAddr: a("fd00:10:2::2"), DstPort: 128 << 8,
				SNATAddr: a("fd00:10::fe"), SNATPort: 99}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := ct.Flow{ID: 9, TupleOrig: tc.orig, TupleReply: tc.reply, Zone: 7, Mark: 0x42,
				Timestamp:     ct.Timestamp{Start: start},
				CountersOrig:  ct.Counter{Packets: 3, Bytes: 180},
				CountersReply: ct.Counter{Packets: 2, Bytes: 120, Direction: true},
				Labels:        []byte{15: 0x08}}
			if tc.orig.Proto.Protocol == 6 {
				f.ProtoInfo.TCP = &ct.ProtoInfoTCP{State: 3}
			}
			c := FromFlow(&f, true)
			if c.Key != tc.want.Key || c.DstAddr != tc.want.DstAddr || c.DstPort != tc.want.DstPort ||
				c.SNATAddr != tc.want.SNATAddr || c.SNATPort != tc.want.SNATPort {
				t.Fatalf("got key %+v dst %v:%d snat %v:%d\nwant key %+v dst %v:%d snat %v:%d",
					c.Key, c.DstAddr, c.DstPort, c.SNATAddr, c.SNATPort,
					tc.want.Key, tc.want.DstAddr, tc.want.DstPort, tc.want.SNATAddr, tc.want.SNATPort)
			}
			if c.ID != 9 || c.Mark != 0x42 || c.Labels[15] != 0x08 || !c.Start.Equal(start) || !c.HasCounters ||
				c.Packets != 3 || c.Bytes != 180 || c.ReversePackets != 2 || c.ReverseBytes != 120 {
				t.Errorf("fields: %+v", c)
			}
			if wantState := map[bool]string{true: "ESTABLISHED", false: ""}[tc.orig.Proto.Protocol == 6]; c.TCPState != wantState {
				t.Errorf("tcp state %q", c.TCPState)
			}
		})
	}
}

func TestFromFlowCounters(t *testing.T) {
	f := ct.Flow{TupleOrig: tuple(6, "198.18.1.1", "198.18.2.2", 1, 2), TupleReply: tuple(6, "198.18.2.2", "198.18.1.1", 2, 1)}
	if FromFlow(&f, false).HasCounters {
		t.Error("zero counters without acct: HasCounters set")
	}
	if !FromFlow(&f, true).HasCounters {
		t.Error("acct on: HasCounters not set")
	}
	f.CountersOrig.Packets = 1
	if !FromFlow(&f, false).HasCounters {
		t.Error("non-zero counters: HasCounters not set")
	}
}

func key(proto uint8, src, dst string, sport, dport, zone uint16) connstore.Key {
	return connstore.Key{Tuple: flow.Tuple{Src: a(src), Dst: a(dst), Proto: proto, SrcPort: sport, DstPort: dport}, Zone: zone}
}

func TestTCPStateName(t *testing.T) {
	for s, want := range map[uint8]string{0: "NONE", 3: "ESTABLISHED", 7: "TIME_WAIT", 8: "CLOSE", 9: "SYN_SENT2", 42: "UNKNOWN"} {
		if got := TCPStateName(s); got != want {
			t.Errorf("TCPStateName(%d) = %q, want %q", s, got, want)
		}
	}
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg      Config
		v        uint8
		zone     uint16
		wants    bool
		versions int
	}{
		{Config{IPv4: true, IPv6: true}, 4, 3, true, 2},
		{Config{IPv4: true, IPv6: true}, 6, 0, true, 2},
		{Config{IPv6: true}, 4, 0, false, 1},
		{Config{IPv4: true}, 6, 0, false, 1},
		{Config{IPv4: true, Zones: []uint16{7}}, 4, 7, true, 1},
		{Config{IPv6: true, Zones: []uint16{7}}, 6, 0, false, 1},
	} {
		if got := tc.cfg.wants(tc.v, tc.zone); got != tc.wants {
			t.Errorf("%+v wants(%d, %d) = %v", tc.cfg, tc.v, tc.zone, got)
		}
		if got := len(tc.cfg.Versions()); got != tc.versions {
			t.Errorf("%+v: %d versions", tc.cfg, got)
		}
	}
	if (Config{}).Validate() == nil {
		t.Error("no family: no error")
	}
}

func TestAccountingErr(t *testing.T) {
	if err := (Accounting{true, true, true}).Err(); err != nil {
		t.Error(err)
	}
	if err := (Accounting{Acct: true, Events: true}).Err(); err == nil {
		t.Error("timestamp off: no error")
	}
}
