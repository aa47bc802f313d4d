package ipfix

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/vmware/go-ipfix/pkg/entities"

	"github.com/dualflow/dualflow/flow"
)

// elementValue returns the 2-byte value of element el in the data record b
// of e's template (fixed-size elements only, which precede the strings).
func elementValue(t *testing.T, e *Encoder, b []byte, el Element) uint16 {
	t.Helper()
	off := 0
	for _, x := range e.elems {
		if x.key() == el.key() {
			return binary.BigEndian.Uint16(b[off:])
		}
		if x.Length == VariableLength {
			break
		}
		off += int(x.Length)
	}
	t.Fatalf("%s not in the IPv%d template before the strings", el.Name, e.IPVersion())
	return 0
}

// TestICMPTypeCode checks what the ports and icmpTypeCodeIPv4/IPv6 carry
// for ICMP: type<<8|code in destinationTransportPort and icmpTypeCode, the
// echo identifier in sourceTransportPort unless type and code are both 0
// (nfdump 1.7 would show the identifier as the type.code).
func TestICMPTypeCode(t *testing.T) {
	for _, tc := range []struct {
		name              string
		src, dst          string
		proto             uint8
		sport, dport      uint16
		wantSport, wantTC uint16
		tcElem            Element
	}{
		{"ipv4/echo-request", "198.18.1.1", "198.18.1.2", flow.ProtoICMP, 0x2b31, 8 << 8, 0x2b31, 8 << 8, ieICMPTypeCode4},
		{"ipv4/echo-reply", "198.18.1.2", "198.18.1.1", flow.ProtoICMP, 0x2b31, 0, 0, 0, ieICMPTypeCode4},
		{"ipv4/unreachable", "198.18.1.1", "198.18.1.3", flow.ProtoICMP, 0, 3<<8 | 3, 0, 3<<8 | 3, ieICMPTypeCode4},
		{"ipv4/tcp", "198.18.1.1", "198.18.1.2", flow.ProtoTCP, 40000, 80, 40000, 0, ieICMPTypeCode4},
		{"ipv4/icmpv6-number", "198.18.1.1", "198.18.1.2", flow.ProtoICMPv6, 7, 128 << 8, 7, 0, ieICMPTypeCode4},
		{"ipv6/echo-request", "fd00::1", "fd00::2", flow.ProtoICMPv6, 0x2b31, 128 << 8, 0x2b31, 128 << 8, ieICMPTypeCode6},
		{"ipv6/echo-reply", "fd00::2", "fd00::1", flow.ProtoICMPv6, 0x2b31, 129 << 8, 0x2b31, 129 << 8, ieICMPTypeCode6},
		{"ipv6/udp", "fd00::1", "fd00::2", flow.ProtoUDP, 40000, 53, 40000, 0, ieICMPTypeCode6},
		{"ipv6/icmp-number", "fd00::1", "fd00::2", flow.ProtoICMP, 7, 8 << 8, 7, 0, ieICMPTypeCode6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := flow.Record{SrcAddr: netip.MustParseAddr(tc.src), DstAddr: netip.MustParseAddr(tc.dst),
				Proto: tc.proto, SrcPort: tc.sport, DstPort: tc.dport}
			e, err := NewEncoder(flow.Version(r.SrcAddr), MinDataSetID)
			if err != nil {
				t.Fatal(err)
			}
			b := e.AppendRecord(nil, &r)
			if got := elementValue(t, e, b, ieSrcPort); got != tc.wantSport {
				t.Errorf("sourceTransportPort %#x, want %#x", got, tc.wantSport)
			}
			if got := elementValue(t, e, b, ieDstPort); got != tc.dport {
				t.Errorf("destinationTransportPort %#x, want %#x", got, tc.dport)
			}
			if got := elementValue(t, e, b, tc.tcElem); got != tc.wantTC {
				t.Errorf("%s %#x, want %#x", tc.tcElem.Name, got, tc.wantTC)
			}
			got := decodeData(t, e, b)
			if got.SrcPort != tc.wantSport || got.DstPort != tc.dport {
				t.Errorf("decoded ports %#x %#x, want %#x %#x", got.SrcPort, got.DstPort, tc.wantSport, tc.dport)
			}
		})
	}
}

// TestDecodeICMPTypeCode checks that icmpTypeCodeIPv4/IPv6 fill DstPort when
// destinationTransportPort is absent or 0, in either element order, and do
// not override a nonzero destinationTransportPort.
func TestDecodeICMPTypeCode(t *testing.T) {
	u16 := func(e Element, v uint16) entities.InfoElementWithValue {
		return entities.NewUnsigned16InfoElement(e.InfoElement(), v)
	}
	for _, tc := range []struct {
		name  string
		ports []entities.InfoElementWithValue
		want  uint16
	}{
		{"v4 only", []entities.InfoElementWithValue{u16(ieICMPTypeCode4, 8<<8)}, 8 << 8},
		{"v6 only", []entities.InfoElementWithValue{u16(ieICMPTypeCode6, 128<<8)}, 128 << 8},
		{"after zero port", []entities.InfoElementWithValue{u16(ieDstPort, 0), u16(ieICMPTypeCode4, 3<<8|1)}, 3<<8 | 1},
		{"before zero port", []entities.InfoElementWithValue{u16(ieICMPTypeCode6, 1<<8|4), u16(ieDstPort, 0)}, 1<<8 | 4},
		{"port wins", []entities.InfoElementWithValue{u16(ieDstPort, 8<<8), u16(ieICMPTypeCode4, 0)}, 8 << 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			elems := append([]entities.InfoElementWithValue{
				entities.NewIPAddressInfoElement(ieSrc4.InfoElement(), netip.MustParseAddr("198.18.1.1").AsSlice()),
				entities.NewIPAddressInfoElement(ieDst4.InfoElement(), netip.MustParseAddr("198.18.1.2").AsSlice()),
				entities.NewUnsigned8InfoElement(ieProto.InfoElement(), flow.ProtoICMP),
			}, tc.ports...)
			var r flow.Record
			if err := Decode(entities.NewDataRecordFromElements(MinDataSetID, elems), &r); err != nil {
				t.Fatal(err)
			}
			if r.DstPort != tc.want {
				t.Errorf("DstPort %#x, want %#x", r.DstPort, tc.want)
			}
		})
	}
}
