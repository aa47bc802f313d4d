package ipfix

import (
	"encoding/hex"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmware/go-ipfix/pkg/collector"
	"github.com/vmware/go-ipfix/pkg/entities"
	"github.com/vmware/go-ipfix/pkg/registry"

	"github.com/dualflow/dualflow/flow"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

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
				if putters[e.key()] == nil {
					t.Errorf("%s: missing putter", e.Name)
				}
			})
		}
	}
	for k := range fieldOf {
		if _, err := registry.GetInfoElementFromID(k.id, k.ent); err != nil {
			t.Errorf("Field for unregistered element %d/%d: %v", k.ent, k.id, err)
		}
	}
}

func dataSet(e *Encoder, recs ...*flow.Record) []byte {
	set := make([]byte, SetHeaderLen)
	for _, r := range recs {
		set = e.AppendRecord(set, r)
	}
	PutSetHeader(set, e.TemplateID())
	return set
}

// TestGoIPFIXReadsOurMessages sends both templates and a record of each
// family to a go-ipfix collecting process in strict mode (every element
// registered, read with its type), as Antrea's flow aggregator runs one,
// over IPv4 and IPv6 loopback: it reads every element of the template, in
// order, and the addresses and counters as sent. The collector's own
// decoding of the same messages is tested in roundtrip_test.go.
func TestGoIPFIXReadsOurMessages(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run("transport="+listen, func(t *testing.T) {
			cp, err := collector.InitCollectingProcess(collector.CollectorInput{
				Address: listen, Protocol: "tcp", MaxBufferSize: 65535, DecodingMode: collector.DecodingModeStrict,
			})
			if err != nil {
				t.Fatal(err)
			}
			go cp.Start()
			t.Cleanup(cp.Stop)
			deadline := time.Now().Add(5 * time.Second)
			for cp.GetAddress() == nil {
				if time.Now().After(deadline) {
					t.Fatal("collector did not start")
				}
				time.Sleep(5 * time.Millisecond)
			}
			conn, err := net.Dial("tcp", cp.GetAddress().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			for i, v := range []uint8{4, 6} {
				e, err := NewEncoder(v, MinDataSetID+uint16(i))
				if err != nil {
					t.Fatal(err)
				}
				var r flow.Record
				for _, tc := range testRecords() {
					if flow.Version(tc.rec.SrcAddr) == v && tc.rec.ServiceAddr.IsValid() {
						r = tc.rec
					}
				}
				for _, set := range [][]byte{e.AppendTemplateSet(nil), dataSet(e, &r)} {
					msg := append(make([]byte, MessageHeaderLen), set...)
					PutMessageHeader(msg, time.Now(), uint32(i), 1)
					if _, err := conn.Write(msg); err != nil {
						t.Fatal(err)
					}
				}
				var msg *entities.Message
				for msg == nil || msg.GetSet().GetSetType() != entities.Data {
					select {
					case msg = <-cp.GetMsgChan():
					case <-time.After(5 * time.Second):
						t.Fatalf("IPv%d: no data message", v)
					}
				}
				recs := msg.GetSet().GetRecords()
				if len(recs) != 1 {
					t.Fatalf("IPv%d: %d records, sent 1", v, len(recs))
				}
				got := recs[0].GetOrderedElementList()
				if len(got) != len(e.elems) {
					t.Fatalf("IPv%d: %d elements, the template has %d", v, len(got), len(e.elems))
				}
				for j, el := range got {
					ie, w := el.GetInfoElement(), e.elems[j]
					if ie.EnterpriseId != w.Enterprise || ie.ElementId != w.ID || ie.DataType != w.Type {
						t.Errorf("IPv%d element %d: %d/%d type %d, want %s", v, j, ie.EnterpriseId, ie.ElementId, ie.DataType, w.Name)
						continue
					}
					var ok bool
					switch w.key() {
					case ieSrc4.key(), ieSrc6.key():
						ok = net.IP.Equal(el.GetIPAddressValue(), r.SrcAddr.AsSlice())
					case ieDst4.key(), ieDst6.key():
						ok = net.IP.Equal(el.GetIPAddressValue(), r.DstAddr.AsSlice())
					case ieOctetDelta.key():
						ok = el.GetUnsigned64Value() == r.BytesDelta
					case ieRevOctetTotal.key():
						ok = el.GetUnsigned64Value() == r.ReverseBytes
					case ieObsDomainName.key():
						ok = el.GetStringValue() == r.ExporterNode
					default:
						ok = true
					}
					if !ok {
						t.Errorf("IPv%d %s: go-ipfix read %v", v, w.Name, el)
					}
				}
			}
		})
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
