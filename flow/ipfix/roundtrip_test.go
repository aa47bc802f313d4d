package ipfix_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"reflect"
	"testing"
	"time"

	cipfix "github.com/dualflow/dualflow/collector/ipfix"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/flow/ipfix"
	"github.com/dualflow/dualflow/test/support/ipfixreg"
	"github.com/dualflow/dualflow/test/support/ipfixtest"
)

// TestMain fills go-ipfix's registry for the tests that check our elements
// against it and those that run its collecting process.
func TestMain(m *testing.M) {
	if err := ipfixreg.Register(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// The exporter's encoding, decoded back by the collector's decoder
// (collector/ipfix): directly, or through its listener (ipfixtest) where a
// transport is part of the test.

// exporterAP is the exporter of the messages decoded directly.
var exporterAP = netip.MustParseAddrPort("198.18.0.1:40000")

// want is what a record looks like after the trip: normalized, policy
// rules -1, the message's exporter fields, and a missing start stamped
// with the end (collector/ipfix StampNoStart).
func want(r flow.Record, exporter netip.Addr, domain uint32) flow.Record {
	r.Normalize()
	r.Ingress.Rule, r.Egress.Rule = -1, -1
	r.ExporterAddr, r.ObservationDomainID = exporter, domain
	if r.FlowStart.IsZero() && !r.FlowEnd.IsZero() {
		r.FlowStart = r.FlowEnd
	}
	return r
}

// message builds one IPFIX message of sets, exported at export (the zero
// Time: an export time of 0, which the collector reads as none).
func message(export time.Time, seq, domain uint32, sets ...[]byte) []byte {
	body := bytes.Join(sets, nil)
	if export.IsZero() {
		export = time.Unix(0, 0)
	}
	return append(ipfix.AppendMessageHeader(nil, ipfix.MessageHeaderLen+len(body), export, seq, domain), body...)
}

func dataSet(e *ipfix.Encoder, recs ...*flow.Record) []byte {
	set := make([]byte, ipfix.SetHeaderLen)
	for _, r := range recs {
		set = e.AppendRecord(set, r)
	}
	ipfix.PutSetHeader(set, e.TemplateID())
	return set
}

func mustEncoder(t testing.TB, v uint8, id uint16) *ipfix.Encoder {
	t.Helper()
	e, err := ipfix.NewEncoder(v, id)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// decode decodes recs encoded by e, template included, as received at
// received with no export time: the collector checks the records' times
// against received only, and keeps any time within the widest window.
func decode(t testing.TB, e *ipfix.Encoder, received time.Time, recs ...*flow.Record) []flow.Record {
	t.Helper()
	d := cipfix.NewDecoder()
	d.TimeWindow = math.MaxInt64
	s := cipfix.NewSession(exporterAP, cipfix.TCP, cipfix.Limits{})
	got, err := d.Decode(s, message(time.Time{}, 0, 1, e.AppendTemplateSet(nil), dataSet(e, recs...)), received, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(recs) {
		t.Fatalf("decoded %d records, encoded %d", len(got), len(recs))
	}
	return got
}

// TestRoundTrip sends each row to the collector's listener over TCP, on
// IPv4 and IPv6 loopback, and decodes it back.
func TestRoundTrip(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run("transport="+listen, func(t *testing.T) {
			col := ipfixtest.Start(t, ipfixtest.Options{Address: listen})
			conn, err := net.Dial("tcp", col.Addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			exporter := netip.MustParseAddrPort(conn.LocalAddr().String()).Addr().Unmap()
			const domain = 42
			enc := map[uint8]*ipfix.Encoder{}
			for i, v := range []uint8{4, 6} {
				e := mustEncoder(t, v, ipfix.MinDataSetID+uint16(i))
				enc[v] = e
				if _, err := conn.Write(message(time.Now(), 0, domain, e.AppendTemplateSet(nil))); err != nil {
					t.Fatal(err)
				}
			}
			for i, tc := range ipfix.RoundTripRecords() {
				t.Run(tc.Name, func(t *testing.T) {
					r := tc.Rec
					if _, err := conn.Write(message(time.Now(), uint32(i), domain, dataSet(enc[flow.Version(r.SrcAddr)], &r))); err != nil {
						t.Fatal(err)
					}
					got := col.WaitN(t, 5*time.Second, i+1)
					if len(got) != i+1 {
						t.Fatalf("got %d records, sent %d", len(got), i+1)
					}
					g := got[i]
					g.TimeReceived = time.Time{}
					if w := want(tc.Rec, exporter, domain); !reflect.DeepEqual(g, w) {
						t.Errorf("round trip:\n got %+v\nwant %+v", g, w)
					}
				})
			}
			if errs := col.Errors(); len(errs) != 0 {
				t.Errorf("collector errors: %v", errs)
			}
		})
	}
}

// TestManyRecordsPerMessage checks a full message of records of both
// families arrives whole.
func TestManyRecordsPerMessage(t *testing.T) {
	col := ipfixtest.Start(t, ipfixtest.Options{Address: "127.0.0.1:0"})
	conn, err := net.Dial("tcp", col.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, v := range []uint8{4, 6} {
		t.Run(fmt.Sprintf("ipv%d", v), func(t *testing.T) {
			e := mustEncoder(t, v, ipfix.MinDataSetID+uint16(v))
			if _, err := conn.Write(message(time.Now(), 0, 1, e.AppendTemplateSet(nil))); err != nil {
				t.Fatal(err)
			}
			var recs []*flow.Record
			for _, tc := range ipfix.RoundTripRecords() {
				if flow.Version(tc.Rec.SrcAddr) == v {
					r := tc.Rec
					recs = append(recs, &r)
				}
			}
			var all []*flow.Record
			for len(all) < 300 {
				all = append(all, recs...)
			}
			before := col.Len()
			if _, err := conn.Write(message(time.Now(), 0, 1, dataSet(e, all...))); err != nil {
				t.Fatal(err)
			}
			got := col.WaitN(t, 5*time.Second, before+len(all))[before:]
			if len(got) != len(all) {
				t.Fatalf("got %d records, sent %d", len(got), len(all))
			}
			for i := range got {
				if got[i].SrcAddr != all[i].SrcAddr || got[i].BytesDelta != all[i].BytesDelta {
					t.Fatalf("record %d: got %v %d", i, got[i].SrcAddr, got[i].BytesDelta)
				}
			}
		})
	}
}

// TestLongString checks the 3-byte length prefix of long strings.
func TestLongString(t *testing.T) {
	e := mustEncoder(t, 4, ipfix.MinDataSetID)
	r := ipfix.RoundTripRecords()[0].Rec
	r.ExporterNode = string(bytes.Repeat([]byte("n"), 300))
	got := decode(t, e, r.FlowEnd, &r)[0]
	if got.ExporterNode != r.ExporterNode {
		t.Errorf("long string: got %d bytes", len(got.ExporterNode))
	}
}

// elementValue returns the 2-byte value of the element named name in the
// data record b of e's template (fixed-size elements only, which precede
// the strings).
func elementValue(t *testing.T, e *ipfix.Encoder, b []byte, name string) uint16 {
	t.Helper()
	off := 0
	for _, x := range ipfix.Elements(e.IPVersion()) {
		if x.Name == name {
			return binary.BigEndian.Uint16(b[off:])
		}
		if x.Length == ipfix.VariableLength {
			break
		}
		off += int(x.Length)
	}
	t.Fatalf("%s not in the IPv%d template before the strings", name, e.IPVersion())
	return 0
}

// TestICMPTypeCode checks what the ports and icmpTypeCodeIPv4/IPv6 carry
// for ICMP: type<<8|code in destinationTransportPort and icmpTypeCode, the
// echo identifier in sourceTransportPort unless type and code are both 0
// (nfdump 1.7 would show the identifier as the type.code); and that the
// collector decodes the ports back.
func TestICMPTypeCode(t *testing.T) {
	for _, tc := range []struct {
		name              string
		src, dst          string
		proto             uint8
		sport, dport      uint16
		wantSport, wantTC uint16
		tcElem            string
	}{
		{"ipv4/echo-request", "198.18.1.1", "198.18.1.2", flow.ProtoICMP, 0x2b31, 8 << 8, 0x2b31, 8 << 8, "icmpTypeCodeIPv4"},
		{"ipv4/echo-reply", "198.18.1.2", "198.18.1.1", flow.ProtoICMP, 0x2b31, 0, 0, 0, "icmpTypeCodeIPv4"},
		{"ipv4/unreachable", "198.18.1.1", "198.18.1.3", flow.ProtoICMP, 0, 3<<8 | 3, 0, 3<<8 | 3, "icmpTypeCodeIPv4"},
		{"ipv4/tcp", "198.18.1.1", "198.18.1.2", flow.ProtoTCP, 40000, 80, 40000, 0, "icmpTypeCodeIPv4"},
		{"ipv4/icmpv6-number", "198.18.1.1", "198.18.1.2", flow.ProtoICMPv6, 7, 128 << 8, 7, 0, "icmpTypeCodeIPv4"},
		{"ipv6/echo-request", "fd00::1", "fd00::2", flow.ProtoICMPv6, 0x2b31, 128 << 8, 0x2b31, 128 << 8, "icmpTypeCodeIPv6"},
		{"ipv6/echo-reply", "fd00::2", "fd00::1", flow.ProtoICMPv6, 0x2b31, 129 << 8, 0x2b31, 129 << 8, "icmpTypeCodeIPv6"},
		{"ipv6/udp", "fd00::1", "fd00::2", flow.ProtoUDP, 40000, 53, 40000, 0, "icmpTypeCodeIPv6"},
		{"ipv6/icmp-number", "fd00::1", "fd00::2", flow.ProtoICMP, 7, 8 << 8, 7, 0, "icmpTypeCodeIPv6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := flow.Record{SrcAddr: netip.MustParseAddr(tc.src), DstAddr: netip.MustParseAddr(tc.dst),
				Proto: tc.proto, SrcPort: tc.sport, DstPort: tc.dport}
			e := mustEncoder(t, flow.Version(r.SrcAddr), ipfix.MinDataSetID)
			b := e.AppendRecord(nil, &r)
			if got := elementValue(t, e, b, "sourceTransportPort"); got != tc.wantSport {
				t.Errorf("sourceTransportPort %#x, want %#x", got, tc.wantSport)
			}
			if got := elementValue(t, e, b, "destinationTransportPort"); got != tc.dport {
				t.Errorf("destinationTransportPort %#x, want %#x", got, tc.dport)
			}
			if got := elementValue(t, e, b, tc.tcElem); got != tc.wantTC {
				t.Errorf("%s %#x, want %#x", tc.tcElem, got, tc.wantTC)
			}
			got := decode(t, e, time.Unix(1_780_000_000, 0), &r)[0]
			if got.SrcPort != tc.wantSport || got.DstPort != tc.dport {
				t.Errorf("decoded ports %#x %#x, want %#x %#x", got.SrcPort, got.DstPort, tc.wantSport, tc.dport)
			}
		})
	}
}

func FuzzRoundTrip(f *testing.F) {
	f.Add(uint8(4), []byte{198, 18, 0, 1}, []byte{198, 18, 0, 2}, uint16(1), uint16(2), uint64(3), int64(1_780_000_000_000), "ESTABLISHED")
	f.Add(uint8(1), netip.MustParseAddr("fd00:10::1").AsSlice(), netip.MustParseAddr("fd00:10::2").AsSlice(), uint16(0), uint16(0), uint64(0), int64(0), "")
	f.Fuzz(func(t *testing.T, v uint8, src, dst []byte, sport, dport uint16, n uint64, ms int64, state string) {
		version := 4 + 2*(v%2)
		a, ok1 := netip.AddrFromSlice(src)
		b, ok2 := netip.AddrFromSlice(dst)
		if !ok1 || !ok2 || flow.Version(a) != version || flow.Version(b) != version || a.Unmap().IsUnspecified() || b.Unmap().IsUnspecified() {
			t.Skip()
		}
		r := flow.Record{SrcAddr: a, DstAddr: b, SrcPort: sport, DstPort: dport, Packets: n, BytesDelta: n, TCPState: state}
		// Received at the flow's end: the collector stamps only times far
		// from the receive time (collector/ipfix stamp_test.go), and a
		// record without times with it.
		received := time.UnixMilli(1_780_000_000_000)
		if ms > 0 && ms < 1<<50 {
			r.FlowStart = time.UnixMilli(ms)
			r.FlowEnd = r.FlowStart
			received = r.FlowEnd
		}
		e := mustEncoder(t, version, ipfix.MinDataSetID)
		got := decode(t, e, received, &r)[0]
		w := want(r, exporterAP.Addr(), 1)
		w.Source = ipfix.SourceForeign
		w.TimeReceived = received
		if w.FlowEnd.IsZero() {
			w.FlowStart, w.FlowEnd = received, received
		}
		if len(state) > ipfix.MaxString {
			w.TCPState = state[:ipfix.MaxString]
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("got %+v\nwant %+v", got, w)
		}
	})
}
