package nflog

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/dualflow/dualflow/flow"
)

func ipv4Packet(src, dst netip.Addr, proto uint8, sport, dport uint16) []byte {
	b := make([]byte, 20+8)
	b[0] = 0x45
	b[9] = proto
	copy(b[12:], src.AsSlice())
	copy(b[16:], dst.AsSlice())
	binary.BigEndian.PutUint16(b[20:], sport)
	binary.BigEndian.PutUint16(b[22:], dport)
	return b
}

func ipv6Packet(src, dst netip.Addr, proto uint8, sport, dport uint16) []byte {
	b := make([]byte, 40+8)
	b[0] = 0x60
	b[6] = proto
	copy(b[8:], src.AsSlice())
	copy(b[24:], dst.AsSlice())
	binary.BigEndian.PutUint16(b[40:], sport)
	binary.BigEndian.PutUint16(b[42:], dport)
	return b
}

func TestParseIP(t *testing.T) {
	a4, b4 := netip.MustParseAddr("198.18.1.12"), netip.MustParseAddr("198.18.2.11")
	a6, b6 := netip.MustParseAddr("fd00:10:0:1::12"), netip.MustParseAddr("fd00:10:0:2::11")
	tests := []struct {
		name    string
		pkt     []byte
		want    flow.Tuple
		wantErr bool
	}{
		{"ipv4 tcp", ipv4Packet(a4, b4, flow.ProtoTCP, 40000, 8080), flow.Tuple{Src: a4, Dst: b4, Proto: flow.ProtoTCP, SrcPort: 40000, DstPort: 8080}, false},
		{"ipv6 tcp", ipv6Packet(a6, b6, flow.ProtoTCP, 40000, 9090), flow.Tuple{Src: a6, Dst: b6, Proto: flow.ProtoTCP, SrcPort: 40000, DstPort: 9090}, false},
		{"ipv6 udp", ipv6Packet(a6, b6, flow.ProtoUDP, 5000, 5353), flow.Tuple{Src: a6, Dst: b6, Proto: flow.ProtoUDP, SrcPort: 5000, DstPort: 5353}, false},
		{"ipv4 icmp has no ports", ipv4Packet(a4, b4, flow.ProtoICMP, 0x0800, 1), flow.Tuple{Src: a4, Dst: b4, Proto: flow.ProtoICMP}, false},
		{"ipv6 icmpv6 has no ports", ipv6Packet(a6, b6, flow.ProtoICMPv6, 0x8000, 1), flow.Tuple{Src: a6, Dst: b6, Proto: flow.ProtoICMPv6}, false},
		{"short", []byte{0x45, 0}, flow.Tuple{}, true},
		{"not ip", make([]byte, 60), flow.Tuple{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseIP(tc.pkt)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if !tc.wantErr && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func FuzzParseIP(f *testing.F) {
	f.Add(ipv4Packet(netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.2.1"), 6, 1, 2))
	f.Add(ipv6Packet(netip.MustParseAddr("fd00:10::1"), netip.MustParseAddr("fd00:10::2"), 17, 1, 2))
	f.Fuzz(func(t *testing.T, b []byte) { ParseIP(b) })
}

func BenchmarkParseIP(b *testing.B) {
	pkt := ipv6Packet(netip.MustParseAddr("fd00:10::1"), netip.MustParseAddr("fd00:10::2"), 6, 1, 2)
	b.ReportAllocs()
	for b.Loop() {
		ParseIP(pkt)
	}
}
