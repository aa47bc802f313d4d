package ipfix

import (
	"bytes"
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/vmware/go-ipfix/pkg/collector"
	"github.com/vmware/go-ipfix/pkg/entities"
	"github.com/vmware/go-ipfix/pkg/registry"

	"github.com/dualflow/dualflow/flow"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestMain(m *testing.M) {
	if err := Register(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}

// testRecords are the rows of the round-trip tables: each IP family, with
// and without NAT, with zero and set optional fields.
func testRecords() []struct {
	name string
	rec  flow.Record
} {
	start := time.UnixMilli(1_780_000_000_123)
	end := start.Add(2500 * time.Millisecond)
	base := func(src, dst string) flow.Record {
		return flow.Record{
			FlowStart: start, FlowEnd: end,
			SrcAddr: netip.MustParseAddr(src), DstAddr: netip.MustParseAddr(dst),
			SrcPort: 40000, DstPort: 8080, Proto: flow.ProtoTCP,
			Packets: 10, Bytes: 1500, ReversePackets: 8, ReverseBytes: 4096,
			PacketsDelta: 4, BytesDelta: 600, ReversePacketsDelta: 3, ReverseBytesDelta: 1024,
			EndReason: flow.EndReasonActiveTimeout, TCPState: "ESTABLISHED",
			Zone: 7, Mark: 0xdeadbeef, ExporterNode: "node-a", Source: SourceConntrack,
		}
	}
	v4nat := base("198.18.1.1", "198.18.2.2")
	v4nat.ServiceAddr, v4nat.ServicePort = netip.MustParseAddr("198.19.0.10"), 80
	v4nat.SNATAddr, v4nat.SNATPort = netip.MustParseAddr("198.18.0.1"), 61000
	v4nat.Type = flow.FlowTypeInterNode
	v4nat.Src.NodeName = "node-a"
	v6nat := base("fd00:10:1::1", "fd00:10:2::2")
	v6nat.ServiceAddr, v6nat.ServicePort = netip.MustParseAddr("fd00:10:ff::10"), 80
	v6nat.SNATAddr, v6nat.SNATPort = netip.MustParseAddr("fd00:10::1"), 61000
	v6nat.Type = flow.FlowTypeIntraNode
	v6nat.Src.NodeName, v6nat.Dst.NodeName = "node-a", "node-a"
	v4udp := base("198.18.1.1", "198.18.1.2")
	v4udp.Proto, v4udp.TCPState, v4udp.FlowStart, v4udp.EndReason = flow.ProtoUDP, "", time.Time{}, flow.EndReasonEndOfFlow
	v6icmp := base("fd00:10:1::1", "fd00:10:1::2")
	v6icmp.Proto, v6icmp.TCPState, v6icmp.SrcPort, v6icmp.DstPort = flow.ProtoICMPv6, "", 17, 128<<8
	v6icmp.EndReason = flow.EndReasonLackOfResources
	v4icmp := base("198.18.1.1", "198.18.1.2")
	v4icmp.Proto, v4icmp.TCPState, v4icmp.SrcPort, v4icmp.DstPort = flow.ProtoICMP, "", 17, 8<<8
	// A record the OVS source makes for a packet its drop rule dropped.
	denied := func(src, dst string) flow.Record {
		r := base(src, dst)
		r.Source, r.TCPState = "ovs", ""
		r.Ingress.ReportedVerdict, r.Ingress.ReportedName = flow.VerdictDenied, "drop/ingress/backend/api-1"
		r.Egress.ReportedVerdict, r.Egress.ReportedName = flow.VerdictAllowed, "tools/restrict-egress/egress/0"
		return r
	}
	return []struct {
		name string
		rec  flow.Record
	}{
		{"ipv4/tcp", base("198.18.1.1", "198.18.1.2")},
		{"ipv4/dnat+snat", v4nat},
		{"ipv4/udp-no-start", v4udp},
		{"ipv6/tcp", base("fd00:10:1::1", "fd00:10:1::2")},
		{"ipv6/dnat+snat", v6nat},
		{"ipv4/icmp", v4icmp},
		{"ipv6/icmpv6", v6icmp},
		{"ipv4/denied-by-datapath", denied("198.18.1.1", "198.18.2.2")},
		{"ipv6/denied-by-datapath", denied("fd00:10:1::1", "fd00:10:2::2")},
	}
}

// want is what a record looks like after the trip: normalized, policy
// rules -1, and the message's exporter fields.
func want(r flow.Record, exporter netip.Addr, domain uint32) flow.Record {
	r.Normalize()
	r.Ingress.Rule, r.Egress.Rule = -1, -1
	r.ExporterAddr, r.ObservationDomainID = exporter, domain
	return r
}

func TestElementsMatchRegistry(t *testing.T) {
	seen := map[key]bool{}
	for _, v := range []uint8{4, 6} {
		for _, e := range Elements(v) {
			if seen[e.key()] {
				continue
			}
			seen[e.key()] = true
			t.Run(e.Name, func(t *testing.T) {
				got, err := registry.GetInfoElementFromID(e.ID, e.Enterprise)
				if err != nil {
					t.Fatal(err)
				}
				if got.Name != e.Name || got.DataType != e.Type || got.Len != e.Length {
					t.Errorf("registry has %s type %d len %d, we use %s type %d len %d", got.Name, got.DataType, got.Len, e.Name, e.Type, e.Length)
				}
				if putters[e.key()] == nil || getters[e.key()] == nil {
					t.Errorf("%s: missing putter or getter", e.Name)
				}
			})
		}
	}
	for k := range getters {
		if _, err := registry.GetInfoElementFromID(k.id, k.ent); err != nil {
			t.Errorf("getter for unregistered element %d/%d: %v", k.ent, k.id, err)
		}
	}
}

// startCollector runs a go-ipfix TCP collecting process on addr (strict
// decoding: every element must be registered) and returns it with its
// listening address.
func startCollector(t *testing.T, addr string) (*collector.CollectingProcess, string) {
	t.Helper()
	cp, err := collector.InitCollectingProcess(collector.CollectorInput{
		Address: addr, Protocol: "tcp", MaxBufferSize: 65535, DecodingMode: collector.DecodingModeStrict,
	})
	if err != nil {
		t.Fatal(err)
	}
	go cp.Start()
	t.Cleanup(cp.Stop)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if a := cp.GetAddress(); a != nil {
			return cp, a.String()
		}
		if time.Now().After(deadline) {
			t.Fatal("collector did not start")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// message builds one IPFIX message holding one set.
func message(set []byte, seq, domain uint32) []byte {
	msg := make([]byte, MessageHeaderLen, MessageHeaderLen+len(set))
	msg = append(msg, set...)
	PutMessageHeader(msg, time.Now(), seq, domain)
	return msg
}

func dataSet(e *Encoder, recs ...*flow.Record) []byte {
	set := make([]byte, SetHeaderLen)
	for _, r := range recs {
		set = e.AppendRecord(set, r)
	}
	PutSetHeader(set, e.TemplateID())
	return set
}

// TestRoundTripCollector sends each row through a go-ipfix collecting
// process over TCP, on IPv4 and IPv6 loopback, and decodes it back.
func TestRoundTripCollector(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run("transport="+listen, func(t *testing.T) {
			cp, addr := startCollector(t, listen)
			conn, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			exporter := netip.MustParseAddrPort(conn.LocalAddr().String()).Addr().Unmap()
			const domain = 42
			enc := map[uint8]*Encoder{}
			for i, v := range []uint8{4, 6} {
				e, err := NewEncoder(v, MinDataSetID+uint16(i))
				if err != nil {
					t.Fatal(err)
				}
				enc[v] = e
				if _, err := conn.Write(message(e.AppendTemplateSet(nil), 0, domain)); err != nil {
					t.Fatal(err)
				}
			}
			for i, tc := range testRecords() {
				t.Run(tc.name, func(t *testing.T) {
					r := tc.rec
					if _, err := conn.Write(message(dataSet(enc[flow.Version(r.SrcAddr)], &r), uint32(i), domain)); err != nil {
						t.Fatal(err)
					}
					got := receive(t, cp, 1)
					if len(got) != 1 {
						t.Fatalf("got %d records", len(got))
					}
					got[0].TimeReceived = time.Time{}
					if w := want(tc.rec, exporter, domain); !reflect.DeepEqual(got[0], w) {
						t.Errorf("round trip:\n got %+v\nwant %+v", got[0], w)
					}
				})
			}
		})
	}
}

// TestManyRecordsPerMessage checks a full message of records of both
// families arrives whole.
func TestManyRecordsPerMessage(t *testing.T) {
	cp, addr := startCollector(t, "127.0.0.1:0")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, v := range []uint8{4, 6} {
		t.Run(fmt.Sprintf("ipv%d", v), func(t *testing.T) {
			e, _ := NewEncoder(v, MinDataSetID+uint16(v))
			if _, err := conn.Write(message(e.AppendTemplateSet(nil), 0, 1)); err != nil {
				t.Fatal(err)
			}
			var recs []*flow.Record
			for _, tc := range testRecords() {
				if flow.Version(tc.rec.SrcAddr) == v {
					r := tc.rec
					recs = append(recs, &r)
				}
			}
			var all []*flow.Record
			for len(all) < 300 {
				all = append(all, recs...)
			}
			if _, err := conn.Write(message(dataSet(e, all...), 0, 1)); err != nil {
				t.Fatal(err)
			}
			got := receive(t, cp, len(all))
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

func receive(t *testing.T, cp *collector.CollectingProcess, n int) []flow.Record {
	t.Helper()
	var out []flow.Record
	timeout := time.After(5 * time.Second)
	for len(out) < n {
		select {
		case msg := <-cp.GetMsgChan():
			var err error
			if out, err = AppendMessage(out, msg, time.Now()); err != nil {
				t.Fatal(err)
			}
		case <-timeout:
			t.Fatalf("received %d of %d records", len(out), n)
		}
	}
	return out
}

// TestDecodeLenient decodes dualflow elements that arrive as octet arrays,
// as go-ipfix's lenient modes deliver unregistered elements.
func TestDecodeLenient(t *testing.T) {
	unknown := func(e Element, b []byte) entities.InfoElementWithValue {
		return entities.NewOctetArrayInfoElement(entities.NewInfoElement("", e.ID, entities.OctetArray, e.Enterprise, e.Length), b)
	}
	for _, tc := range []struct {
		name     string
		src, dst netip.Addr
		addrs    []entities.InfoElementWithValue
	}{
		{"ipv4", netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.1.2"), []entities.InfoElementWithValue{
			entities.NewIPAddressInfoElement(ieSrc4.InfoElement(), net.ParseIP("198.18.1.1")),
			entities.NewIPAddressInfoElement(ieDst4.InfoElement(), net.ParseIP("198.18.1.2").To4()),
		}},
		{"ipv6", netip.MustParseAddr("fd00:10::1"), netip.MustParseAddr("fd00:10::2"), []entities.InfoElementWithValue{
			unknown(ieSrc6, netip.MustParseAddr("fd00:10::1").AsSlice()),
			unknown(ieDst6, netip.MustParseAddr("fd00:10::2").AsSlice()),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			elems := append(tc.addrs,
				unknown(ieConntrackZone, []byte{0, 9}),
				unknown(ieConntrackMark, []byte{0, 0, 1, 2}),
				unknown(ieDualflowSource, []byte("conntrack")),
			)
			var r flow.Record
			if err := Decode(entities.NewDataRecordFromElements(MinDataSetID, elems), &r); err != nil {
				t.Fatal(err)
			}
			if r.SrcAddr != tc.src || r.DstAddr != tc.dst || r.Zone != 9 || r.Mark != 0x102 || r.Source != "conntrack" {
				t.Errorf("got src %v dst %v zone %d mark %#x source %q", r.SrcAddr, r.DstAddr, r.Zone, r.Mark, r.Source)
			}
		})
	}
}

// TestDecodeAntrea decodes a record shaped like Antrea's flow exporter's.
func TestDecodeAntrea(t *testing.T) {
	for _, tc := range []struct {
		name             string
		src, dst         string
		srcE, dstE, vipE Element
		vipAddr          string
	}{
		{"ipv4", "198.18.1.1", "198.18.2.2", ieSrc4, ieDst4, ieClusterIP4, "198.19.0.10"},
		{"ipv6", "fd00:10:1::1", "fd00:10:2::2", ieSrc6, ieDst6, ieClusterIP6, "fd00:10:ff::10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ip := func(e Element, s string) entities.InfoElementWithValue {
				return entities.NewIPAddressInfoElement(e.InfoElement(), net.ParseIP(s))
			}
			s := func(e Element, v string) entities.InfoElementWithValue {
				return entities.NewStringInfoElement(e.InfoElement(), v)
			}
			elems := []entities.InfoElementWithValue{
				entities.NewDateTimeSecondsInfoElement(ieStartSec.InfoElement(), 1_780_000_000),
				entities.NewDateTimeSecondsInfoElement(ieEndSec.InfoElement(), 1_780_000_005),
				ip(tc.srcE, tc.src), ip(tc.dstE, tc.dst),
				entities.NewUnsigned16InfoElement(ieSrcPort.InfoElement(), 40000),
				entities.NewUnsigned16InfoElement(ieDstPort.InfoElement(), 8080),
				entities.NewUnsigned8InfoElement(ieProto.InfoElement(), 6),
				ip(tc.vipE, tc.vipAddr),
				entities.NewUnsigned16InfoElement(ieServicePort.InfoElement(), 80),
				s(ieServicePortName, "shop/web:http"),
				s(ieSrcPodNamespace, "shop"), s(ieSrcPodName, "client-1"),
				s(ieDstPodNamespace, "shop"), s(ieDstPodName, "web-1"),
				s(ieIngressPolicy, "allow-web"), s(ieIngressPolicyNS, "shop"),
				entities.NewUnsigned8InfoElement(ieIngressAction.InfoElement(), 2),
			}
			var r flow.Record
			if err := Decode(entities.NewDataRecordFromElements(MinDataSetID, elems), &r); err != nil {
				t.Fatal(err)
			}
			if r.FlowStart != time.Unix(1_780_000_000, 0) || r.FlowEnd != time.Unix(1_780_000_005, 0) {
				t.Errorf("times %v %v", r.FlowStart, r.FlowEnd)
			}
			if r.ServiceAddr != netip.MustParseAddr(tc.vipAddr) || r.ServicePort != 80 {
				t.Errorf("service %v:%d", r.ServiceAddr, r.ServicePort)
			}
			if r.Service != (flow.Service{Namespace: "shop", Name: "web", PortName: "http"}) {
				t.Errorf("service %+v", r.Service)
			}
			if r.Src.PodName != "client-1" || r.Dst.PodNamespace != "shop" || r.Dst.PodName != "web-1" {
				t.Errorf("pods %+v %+v", r.Src, r.Dst)
			}
			if r.Ingress.ReportedName != "shop/allow-web" || r.Ingress.ReportedVerdict != flow.VerdictDenied {
				t.Errorf("ingress %+v", r.Ingress)
			}
			if r.Source != SourceForeign || r.IPVersion != flow.Version(r.SrcAddr) {
				t.Errorf("source %q version %d", r.Source, r.IPVersion)
			}
		})
	}
}

func TestDecodeNoAddresses(t *testing.T) {
	elems := []entities.InfoElementWithValue{entities.NewUnsigned8InfoElement(ieProto.InfoElement(), 6)}
	var r flow.Record
	if err := Decode(entities.NewDataRecordFromElements(MinDataSetID, elems), &r); err != ErrNoAddresses {
		t.Fatalf("got %v, want ErrNoAddresses", err)
	}
}

func TestNewEncoderErrors(t *testing.T) {
	for _, tc := range []struct {
		version uint8
		id      uint16
	}{{5, 256}, {4, 255}, {6, 2}} {
		if _, err := NewEncoder(tc.version, tc.id); err == nil {
			t.Errorf("NewEncoder(%d, %d): no error", tc.version, tc.id)
		}
	}
}

// TestLongString checks the 3-byte length prefix of long strings.
func TestLongString(t *testing.T) {
	e, _ := NewEncoder(4, MinDataSetID)
	r := testRecords()[0].rec
	r.ExporterNode = string(bytes.Repeat([]byte("n"), 300))
	got := decodeData(t, e, e.AppendRecord(nil, &r))
	if got.ExporterNode != r.ExporterNode {
		t.Errorf("long string: got %d bytes", len(got.ExporterNode))
	}
}

// decodeData decodes one data record of e's template the way go-ipfix's
// collecting process does.
func decodeData(t testing.TB, e *Encoder, b []byte) flow.Record {
	t.Helper()
	buf := bytes.NewBuffer(b)
	var elems []entities.InfoElementWithValue
	for _, el := range e.elems {
		n := int(el.Length)
		if el.Length == VariableLength {
			l, _ := buf.ReadByte()
			n = int(l)
			if l == 255 {
				hi, _ := buf.ReadByte()
				lo, _ := buf.ReadByte()
				n = int(hi)<<8 | int(lo)
			}
		}
		v, err := entities.DecodeAndCreateInfoElementWithValue(el.InfoElement(), buf.Next(n))
		if err != nil {
			t.Fatal(err)
		}
		elems = append(elems, v)
	}
	if buf.Len() != 0 {
		t.Fatalf("%d bytes left over", buf.Len())
	}
	var r flow.Record
	if err := Decode(entities.NewDataRecordFromElements(e.templateID, elems), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// TestGolden pins the wire bytes of both templates and one record each.
// Run with -update after an intended change of the mapping.
func TestGolden(t *testing.T) {
	for _, v := range []uint8{4, 6} {
		t.Run(fmt.Sprintf("ipv%d", v), func(t *testing.T) {
			e, _ := NewEncoder(v, MinDataSetID)
			var r flow.Record
			for _, tc := range testRecords() {
				if flow.Version(tc.rec.SrcAddr) == v && tc.rec.ServiceAddr.IsValid() {
					r = tc.rec
				}
			}
			got := hex.Dump(e.AppendTemplateSet(nil)) + "\n" + hex.Dump(dataSet(e, &r))
			path := filepath.Join("testdata", fmt.Sprintf("ipv%d.golden", v))
			if *update {
				if err := os.MkdirAll("testdata", 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			w, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create)", err)
			}
			if got != string(w) {
				t.Errorf("wire bytes changed; run with -update if intended:\n%s", got)
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
		if ms > 0 && ms < 1<<50 {
			r.FlowStart = time.UnixMilli(ms)
		}
		e, _ := NewEncoder(version, MinDataSetID)
		got := decodeData(t, e, e.AppendRecord(nil, &r))
		w := want(r, netip.Addr{}, 0)
		w.Source = SourceForeign
		if len(state) > maxString {
			w.TCPState = state[:maxString]
		}
		if !reflect.DeepEqual(got, w) {
			t.Errorf("got %+v\nwant %+v", got, w)
		}
	})
}

// BenchmarkEncode measures encoding records into data sets (one per
// message-sized batch), the exporter's per-record cost.
func BenchmarkEncode(b *testing.B) {
	for _, tc := range testRecords()[:5] {
		if tc.name != "ipv4/dnat+snat" && tc.name != "ipv6/dnat+snat" {
			continue
		}
		b.Run(tc.name, func(b *testing.B) {
			e, _ := NewEncoder(flow.Version(tc.rec.SrcAddr), MinDataSetID)
			buf := make([]byte, 0, MaxMessageLen)
			r := tc.rec
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if len(buf) > MaxMessageLen-256 {
					buf = buf[:0]
				}
				buf = e.AppendRecord(buf, &r)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64(len(e.AppendRecord(nil, &r))), "B/record")
		})
	}
}

// BenchmarkDecode measures Decode on go-ipfix's decoded form of a record.
func BenchmarkDecode(b *testing.B) {
	r := testRecords()[1].rec
	e, _ := NewEncoder(4, MinDataSetID)
	data := e.AppendRecord(nil, &r)
	buf := bytes.NewBuffer(data)
	var elems []entities.InfoElementWithValue
	for _, el := range e.elems {
		n := int(el.Length)
		if el.Length == VariableLength {
			l, _ := buf.ReadByte()
			n = int(l)
		}
		v, _ := entities.DecodeAndCreateInfoElementWithValue(el.InfoElement(), buf.Next(n))
		elems = append(elems, v)
	}
	rec := entities.NewDataRecordFromElements(MinDataSetID, elems)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		var out flow.Record
		if err := Decode(rec, &out); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}
