package packet

import (
	"errors"
	"net"
	"net/netip"
	"testing"
)

var (
	srcMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
	gwMAC  = net.HardwareAddr{0xee, 0xee, 0xee, 0xee, 0xee, 0xee}
)

func TestBuildMatch(t *testing.T) {
	tests := []struct {
		name     string
		src, dst string
		proto    uint8
		sport    uint16
		dport    uint16
		wantLen  int
	}{
		{"ipv4 tcp syn", "198.18.1.10", "198.19.0.11", ProtoTCP, 40001, 80, 60}, // padded to the Ethernet minimum,
		{"ipv6 tcp syn", "fd00:10:0:1::10", "fd00:10:ff::11", ProtoTCP, 40002, 80, 74},
		{"ipv4 udp", "198.18.1.10", "198.18.2.11", ProtoUDP, 40003, 5353, 42 + len(payload)},
		{"ipv6 udp", "fd00:10:0:1::10", "fd00:10:0:2::11", ProtoUDP, 40004, 5353, 62 + len(payload)},
		{"icmp echo", "198.18.1.10", "198.18.2.11", ProtoICMP, 777, 0, 42 + len(payload)},
		{"icmpv6 echo", "fd00:10:0:1::10", "fd00:10:0:2::11", ProtoICMPv6, 778, 0, 62 + len(payload)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := Spec{SrcMAC: srcMAC, DstMAC: gwMAC, Src: netip.MustParseAddr(tt.src), Dst: netip.MustParseAddr(tt.dst),
				Proto: tt.proto, SrcPort: tt.sport, DstPort: tt.dport, Tag: 7, TTL: 9}
			b, err := Build(s)
			if err != nil {
				t.Fatal(err)
			}
			if len(b) != tt.wantLen {
				t.Errorf("len = %d, want %d", len(b), tt.wantLen)
			}
			seen, ok := Match(b, 7, s.Src, tt.proto, tt.sport)
			if !ok {
				t.Fatalf("Match = false for the probe itself")
			}
			if seen.Dst != s.Dst || seen.DstPort != tt.dport || seen.TTL != 9 {
				t.Errorf("seen %+v", seen)
			}
			if _, ok := Match(b, 8, s.Src, tt.proto, tt.sport); ok {
				t.Error("matched another tag")
			}
			if _, ok := Match(b, 7, s.Src, tt.proto, tt.sport+1); ok {
				t.Error("matched another source port")
			}
		})
	}
}

func TestValidate(t *testing.T) {
	base := Spec{SrcMAC: srcMAC, DstMAC: gwMAC, Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.18.2.11"), Proto: ProtoTCP, SrcPort: 1, DstPort: 80, Tag: 1}
	tests := []struct {
		name string
		edit func(*Spec)
	}{
		{"mixed families", func(s *Spec) { s.Dst = netip.MustParseAddr("fd00:10::1") }},
		{"tag 0", func(s *Spec) { s.Tag = 0 }},
		{"tag 64", func(s *Spec) { s.Tag = 64 }},
		{"icmp over ipv6", func(s *Spec) {
			s.Src, s.Dst, s.Proto = netip.MustParseAddr("fd00:10::1"), netip.MustParseAddr("fd00:10::2"), ProtoICMP
		}},
		{"icmpv6 over ipv4", func(s *Spec) { s.Proto = ProtoICMPv6 }},
		{"no port", func(s *Spec) { s.DstPort = 0 }},
		{"sctp", func(s *Spec) { s.Proto = 132 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := base
			tt.edit(&s)
			if _, err := Build(s); !errors.Is(err, ErrSpec) {
				t.Errorf("Build err = %v, want ErrSpec", err)
			}
		})
	}
}

func BenchmarkBuild(b *testing.B) {
	s := Spec{SrcMAC: srcMAC, DstMAC: gwMAC, Src: netip.MustParseAddr("fd00:10:0:1::10"), Dst: netip.MustParseAddr("fd00:10:ff::11"), Proto: ProtoTCP, SrcPort: 4, DstPort: 80, Tag: 7}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Build(s); err != nil {
			b.Fatal(err)
		}
	}
}
