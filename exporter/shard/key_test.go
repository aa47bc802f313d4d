package shard

import (
	"net/netip"
	"testing"

	"github.com/dualflow/dualflow/flow"
)

var a = netip.MustParseAddr

// halves returns one cross-node connection as its two nodes export it:
// the client's node sees the pod address and its SNAT translation (when
// snat is valid), the server's node sees the translated source. snatPort
// 0 means the port was kept.
func halves(client netip.Addr, cport uint16, snat netip.Addr, snatPort uint16, server netip.Addr, sport uint16, proto uint8) (src, dst flow.Record) {
	src = flow.Record{SrcAddr: client, SrcPort: cport, SNATAddr: snat, SNATPort: snatPort, DstAddr: server, DstPort: sport,
		Proto: proto, ExporterNode: "node-a"}
	dst = flow.Record{SrcAddr: client, SrcPort: cport, DstAddr: server, DstPort: sport, Proto: proto, ExporterNode: "node-b"}
	if snat.IsValid() {
		dst.SrcAddr = snat
		if snatPort != 0 {
			dst.SrcPort = snatPort
		}
	}
	return src, dst
}

func TestKeySymmetric(t *testing.T) {
	for _, tc := range []struct {
		name     string
		src, dst netip.Addr
	}{
		{"ipv4", a("198.18.1.10"), a("198.18.2.20")},
		{"ipv6", a("fd00:10:1::10"), a("fd00:10:2::20")},
		{"ipv4 same address", a("198.18.1.10"), a("198.18.1.10")},
		{"ipv6 same address", a("fd00:10:1::10"), a("fd00:10:1::10")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fwd := flow.Record{SrcAddr: tc.src, SrcPort: 40000, DstAddr: tc.dst, DstPort: 8080, Proto: flow.ProtoTCP}
			rev := flow.Record{SrcAddr: tc.dst, SrcPort: 8080, DstAddr: tc.src, DstPort: 40000, Proto: flow.ProtoTCP}
			if Key(&fwd) != Key(&rev) {
				t.Fatalf("A→B %x != B→A %x", Key(&fwd), Key(&rev))
			}
			other := fwd
			other.SrcPort++
			if Key(&other) == Key(&fwd) {
				t.Fatal("another source port, same key")
			}
			other = fwd
			other.Proto = flow.ProtoUDP
			if Key(&other) == Key(&fwd) {
				t.Fatal("another protocol, same key")
			}
		})
	}
}

// TestKeyHalves: the source node's half (pod address plus SNAT
// translation) and the destination node's half (translated source) of one
// connection have one key, as the correlator pairs them.
func TestKeyHalves(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		client, snat, server netip.Addr
		snatPort             uint16
	}{
		{"ipv4 snat", a("198.18.1.10"), a("198.18.0.1"), a("198.18.2.20"), 61000},
		{"ipv4 snat keeps port", a("198.18.1.10"), a("198.18.0.1"), a("198.18.2.20"), 0},
		{"ipv4 no snat", a("198.18.1.10"), netip.Addr{}, a("198.18.2.20"), 0},
		{"ipv6 snat", a("fd00:10:1::10"), a("fd00:10::1"), a("fd00:10:2::20"), 61000},
		{"ipv6 snat keeps port", a("fd00:10:1::10"), a("fd00:10::1"), a("fd00:10:2::20"), 0},
		{"ipv6 no snat", a("fd00:10:1::10"), netip.Addr{}, a("fd00:10:2::20"), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := halves(tc.client, 40000, tc.snat, tc.snatPort, tc.server, 8080, flow.ProtoTCP)
			if Key(&src) != Key(&dst) {
				t.Fatalf("source half %x != destination half %x", Key(&src), Key(&dst))
			}
			if tc.snat.IsValid() {
				// Without the SNAT translation the source half would be
				// another connection.
				bare := src
				bare.SNATAddr, bare.SNATPort = netip.Addr{}, 0
				if Key(&bare) == Key(&dst) {
					t.Fatal("the SNAT address is not in the key")
				}
			}
		})
	}
}

// TestKeyFamilies: an IPv4 tuple and an IPv6 tuple never hash the same
// bytes, even when their 16-byte forms share the low 32 bits; an
// IPv4-mapped IPv6 address is its IPv4 address (the encoder sends it as
// IPv4 and the collector pairs it as such).
func TestKeyFamilies(t *testing.T) {
	rec := func(src, dst string) flow.Record {
		return flow.Record{SrcAddr: a(src), SrcPort: 40000, DstAddr: a(dst), DstPort: 8080, Proto: flow.ProtoTCP}
	}
	v4 := rec("198.18.1.10", "198.18.2.20")
	mapped := rec("::ffff:198.18.1.10", "::ffff:198.18.2.20")
	compat := rec("::198.18.1.10", "::198.18.2.20")     // IPv4-compatible: same low 32 bits
	v6 := rec("fd00:10::c612:10a", "fd00:10::c612:214") // the IPv4 addresses' bits in a lab prefix
	if Key(&v4) != Key(&mapped) {
		t.Error("IPv4-mapped address routed apart from its IPv4 address")
	}
	keys := map[uint64]string{}
	for name, r := range map[string]flow.Record{"ipv4": v4, "ipv4-compatible ipv6": compat, "ipv6": v6} {
		if o, dup := keys[Key(&r)]; dup {
			t.Errorf("%s and %s collide", name, o)
		}
		keys[Key(&r)] = name
	}
	// By construction: the hashed bytes of an IPv4 endpoint and of any
	// IPv6 endpoint differ from the first (family) byte.
	e4 := appendEndpoint(nil, a("198.18.1.10"), 1)
	if e4[0] != 4 || len(e4) != 1+4+2 {
		t.Errorf("IPv4 endpoint %x", e4)
	}
	for _, s := range []string{"::198.18.1.10", "::ffff:0:198.18.1.10", "fd00:10::c612:10a", "fd00:10::1"} {
		if e := appendEndpoint(nil, a(s), 1); e[0] != 6 || len(e) != 1+16+2 {
			t.Errorf("%s: endpoint %x", s, e)
		}
	}
}

func TestKeyAllocs(t *testing.T) {
	src, _ := halves(a("fd00:10:1::10"), 40000, a("fd00:10::1"), 61000, a("fd00:10:2::20"), 8080, flow.ProtoTCP)
	if n := testing.AllocsPerRun(100, func() { Key(&src) }); n != 0 {
		t.Fatalf("%v allocations", n)
	}
}

func BenchmarkShardKey(b *testing.B) {
	for _, tc := range []struct {
		name                 string
		client, snat, server netip.Addr
	}{
		{"ipv4", a("198.18.1.10"), a("198.18.0.1"), a("198.18.2.20")},
		{"ipv6", a("fd00:10:1::10"), a("fd00:10::1"), a("fd00:10:2::20")},
	} {
		b.Run(tc.name, func(b *testing.B) {
			src, _ := halves(tc.client, 40000, tc.snat, 61000, tc.server, 8080, flow.ProtoTCP)
			b.ReportAllocs()
			var sink uint64
			for i := 0; b.Loop(); i++ {
				src.SrcPort = uint16(i)
				sink += Key(&src)
			}
			_ = sink
		})
	}
}
