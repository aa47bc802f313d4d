package ipfix

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/dualflow/dualflow/flow"
)

// The captures in testdata/netflow were made in two lab network namespaces
// joined by a veth (198.18.9.1-2, fd00:10:9::1-2): traffic.pcap is the
// traffic as tcpdump saw it on the veth (ICMP and ICMPv6 echo, TCP and UDP
// in both families, and the neighbour discovery around them); each other
// file holds the export datagrams of one third-party exporter that observed
// that traffic, as tcpdump captured them on the loopback:
//
//   - softflowd 1.1.0 (Debian 12) reading traffic.pcap (-r): IPFIX with its
//     default sysUpTime times and with -A milli, NetFlow v9 and v5;
//   - pmacct 1.7.7 pmacctd reading traffic.pcap, nfprobe plugin: IPFIX
//     and NetFlow v9;
//   - fprobe 1.1 capturing the veth live while the traffic ran: NetFlow v5.
//
// The truth every decoded record is checked against is traffic.pcap
// itself, decoded here with gopacket: one flow per direction and tuple.
type truthFlow struct {
	packets, bytes uint64
	first, last    time.Time
	seen           uint64 // packets the exporter's records account for
}

type tuple struct {
	src, dst     netip.Addr
	sport, dport uint16
	proto        uint8
}

func (k tuple) String() string {
	return fmt.Sprintf("%v:%d>%v:%d/%d", k.src, k.sport, k.dst, k.dport, k.proto)
}

// trafficTruth aggregates a packet capture into unidirectional flows, keyed
// the way NetFlow exporters key them: ports for TCP and UDP, type<<8|code
// in the destination port for ICMP. Bytes are IP bytes (header included).
func trafficTruth(t *testing.T, path string) map[tuple]*truthFlow {
	t.Helper()
	flows := map[tuple]*truthFlow{}
	for _, p := range readPcapPackets(t, path) {
		var k tuple
		var n uint64
		switch ip := p.NetworkLayer().(type) {
		case *layers.IPv4:
			k.src, _ = netip.AddrFromSlice(ip.SrcIP.To4())
			k.dst, _ = netip.AddrFromSlice(ip.DstIP.To4())
			k.proto, n = uint8(ip.Protocol), uint64(ip.Length)
		case *layers.IPv6:
			k.src, _ = netip.AddrFromSlice(ip.SrcIP)
			k.dst, _ = netip.AddrFromSlice(ip.DstIP)
			k.proto, n = uint8(ip.NextHeader), uint64(ip.Length)+40
		default:
			continue
		}
		switch l := p.TransportLayer().(type) {
		case *layers.TCP:
			k.sport, k.dport = uint16(l.SrcPort), uint16(l.DstPort)
		case *layers.UDP:
			k.sport, k.dport = uint16(l.SrcPort), uint16(l.DstPort)
		}
		if ic, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4); ok {
			k.dport = uint16(ic.TypeCode)
		}
		if ic, ok := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6); ok {
			k.dport = uint16(ic.TypeCode)
		}
		f := flows[k]
		if f == nil {
			f = &truthFlow{first: p.Metadata().Timestamp}
			flows[k] = f
		}
		f.packets++
		f.bytes += n
		f.last = p.Metadata().Timestamp
	}
	return flows
}

func TestGoldenThirdParty(t *testing.T) {
	for _, tc := range []struct {
		file   string
		source string
		v4Only bool
		// timeSlack is how far the exporter's times may be from the
		// packets': NetFlow v9's header has whole seconds.
		timeSlack time.Duration
		// icmpHostOrder: fprobe 1.1 writes an ICMP type and code in host
		// byte order (an echo request is port 8, not 8<<8).
		icmpHostOrder bool
	}{
		{file: "softflowd-ipfix", source: "ipfix", timeSlack: 2 * time.Millisecond}, // uptimes truncated to ms on both ends
		{file: "softflowd-ipfix-milli", source: "ipfix", timeSlack: time.Millisecond},
		{file: "softflowd-v9", source: SourceNetFlow9, timeSlack: time.Second},
		{file: "softflowd-v5", source: SourceNetFlow5, v4Only: true, timeSlack: time.Millisecond},
		{file: "pmacct-ipfix", source: "ipfix", timeSlack: time.Millisecond},
		{file: "pmacct-v9", source: SourceNetFlow9, timeSlack: time.Second},
	} {
		t.Run(tc.file, func(t *testing.T) {
			truth := trafficTruth(t, "testdata/netflow/traffic.pcap")
			d := NewDecoder()
			s := NewSession(exporterAP, UDP, Limits{})
			var recs []flow.Record
			msgs, at := readPcapTimes(t, "testdata/netflow/"+tc.file+".pcap")
			for i, m := range msgs {
				var err error
				if recs, err = d.Decode(s, m, at[i], recs); err != nil {
					t.Fatalf("datagram %d: %v", i, err)
				}
			}
			if len(recs) == 0 {
				t.Fatal("no records")
			}
			for _, r := range recs {
				k := tuple{r.SrcAddr, r.DstAddr, r.SrcPort, r.DstPort, r.Proto}
				if tc.icmpHostOrder && r.Proto == flow.ProtoICMP {
					k.dport = k.dport>>8 | k.dport<<8
				}
				f := truth[k]
				if f == nil {
					t.Errorf("record %v (%d packets) matches no flow of the traffic", k, r.PacketsDelta)
					continue
				}
				f.seen += r.PacketsDelta
				if r.PacketsDelta != f.packets || r.BytesDelta != f.bytes {
					t.Errorf("%v: %d packets %d bytes, the traffic has %d and %d", k, r.PacketsDelta, r.BytesDelta, f.packets, f.bytes)
				}
				if r.Packets != 0 || r.Bytes != 0 {
					t.Errorf("%v: totals %d/%d from a delta-only exporter", k, r.Packets, r.Bytes)
				}
				if r.Source != tc.source || r.ExporterAddr != exporterAP.Addr() {
					t.Errorf("%v: source %q exporter %v", k, r.Source, r.ExporterAddr)
				}
				{
					// softflowd and pmacct track a conversation as one
					// bidirectional flow and give both directions its times.
					first, last := f.first, f.last
					if rev := truth[tuple{k.dst, k.src, k.dport, k.sport, k.proto}]; rev != nil && k.proto != flow.ProtoICMP && k.proto != flow.ProtoICMPv6 {
						first, last = minTime(first, rev.first), maxTime(last, rev.last)
					}
					if dt := r.FlowStart.Sub(first); dt < -tc.timeSlack || dt > tc.timeSlack {
						t.Errorf("%v: start %v, first packet %v", k, r.FlowStart.Format(time.StampMicro), first.Format(time.StampMicro))
					}
					if dt := r.FlowEnd.Sub(last); dt < -tc.timeSlack || dt > tc.timeSlack {
						t.Errorf("%v: end %v, last packet %v", k, r.FlowEnd.Format(time.StampMicro), last.Format(time.StampMicro))
					}
				}
			}
			var missing []string
			for k, f := range truth {
				if tc.v4Only && !k.src.Is4() {
					continue
				}
				if f.seen != f.packets {
					missing = append(missing, fmt.Sprintf("%v: %d of %d packets", k, f.seen, f.packets))
				}
			}
			sort.Strings(missing)
			if len(missing) > 0 {
				t.Errorf("traffic not accounted for:\n%s", strings.Join(missing, "\n"))
			}
			st := d.Stats
			if st.Dropped != [numReasons]uint64{} || st.UnknownSets != 0 || st.NoAddress != 0 || st.WrongDirection != 0 || st.BothFamilies != 0 ||
				st.Stamped != [numStampReasons]uint64{} {
				t.Errorf("stats %+v", st)
			}
			if st.SequenceLost != 0 || st.SequenceLostMessages != 0 {
				t.Errorf("sequence numbers show %d records and %d messages lost; none were", st.SequenceLost, st.SequenceLostMessages)
			}
		})
	}
}

// readPcapPackets returns the packets of a capture, decoded.
func readPcapPackets(t testing.TB, path string) []gopacket.Packet {
	t.Helper()
	var out []gopacket.Packet
	forEachPacket(t, path, func(p gopacket.Packet) { out = append(out, p) })
	return out
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// TestThirdPartyCapturesPerMode decodes the captures the e2e TestThirdParty
// recorded in each IP mode (testdata/thirdparty/<exporter>-<version>-<mode>,
// rewritten by its -update-thirdparty flag): every datagram decodes, no
// record is skipped or lost by sequence number, and the families are the
// mode's. The e2e test checks their values against nfdump and the traffic.
func TestThirdPartyCapturesPerMode(t *testing.T) {
	files, err := filepath.Glob("testdata/thirdparty/*.pcap")
	if err != nil || len(files) < 10 {
		t.Fatalf("%d captures (%v)", len(files), err)
	}
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".pcap")
		t.Run(name, func(t *testing.T) {
			mode := name[strings.LastIndex(name, "-")+1:]
			d := NewDecoder()
			s := NewSession(exporterAP, UDP, Limits{})
			var recs []flow.Record
			msgs, at := readPcapTimes(t, path)
			for i, m := range msgs {
				if recs, err = d.Decode(s, m, at[i], recs); err != nil {
					t.Fatalf("datagram %d: %v", i, err)
				}
			}
			families := map[uint8]int{}
			for _, r := range recs {
				families[r.IPVersion]++
			}
			want := map[string][]uint8{"ipv4": {4}, "ipv6": {6}, "dual": {4, 6}}[mode]
			if strings.Contains(name, "-v5-") {
				want = []uint8{4}
			}
			for _, v := range want {
				if families[v] == 0 {
					t.Errorf("no IPv%d records: %v", v, families)
				}
			}
			if len(families) != len(want) {
				t.Errorf("families %v, want %v", families, want)
			}
			st := d.Stats
			if st.Dropped != [numReasons]uint64{} || st.UnknownSets != 0 || st.WrongDirection != 0 || st.BothFamilies != 0 ||
				st.SequenceLost != 0 || st.SequenceLostMessages != 0 || st.Stamped != [numStampReasons]uint64{} {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestSoftflowdSequence decodes the long softflowd IPFIX captures (e2e
// TestSoftflowdLongIPFIX, -update-thirdparty): softflowd numbers each
// message with the flow records sent including its own (seq_n = seq_{n-1}
// + records_n), not those before it (RFC 7011). No loss may be reported
// for the whole capture, and a message taken out (as the network would
// lose it) must still be counted, record for record.
func TestSoftflowdSequence(t *testing.T) {
	for _, mode := range []string{"ipv4", "ipv6", "dual"} {
		t.Run(mode, func(t *testing.T) {
			msgs, at := readPcapTimes(t, "testdata/thirdparty/softflowd-ipfix-long-"+mode+".pcap")
			if len(msgs) < 11 {
				t.Fatalf("%d messages: too few to show a sequence convention", len(msgs))
			}
			d := NewDecoder()
			s := NewSession(exporterAP, UDP, Limits{})
			perMsg := make([]int, len(msgs))
			families := map[uint8]int{}
			var recs []flow.Record
			for i, m := range msgs {
				var err error
				if recs, err = d.Decode(s, m, at[i], recs[:0]); err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				perMsg[i] = len(recs)
				for _, r := range recs {
					families[r.IPVersion]++
				}
			}
			if d.Stats.SequenceLost != 0 || d.Stats.SequenceLostMessages != 0 {
				t.Errorf("%d messages: sequence numbers show %d records and %d messages lost; none were",
					len(msgs), d.Stats.SequenceLost, d.Stats.SequenceLostMessages)
			}
			if mode == "dual" && (families[4] == 0 || families[6] == 0) {
				t.Errorf("families %v, want both", families)
			}
			// Take out one message, then two in a row, each holding flow
			// records: the loss is what they held.
			for _, drop := range [][]int{{len(msgs) / 2}, {len(msgs)/2 - 2, len(msgs)/2 - 1}} {
				d := NewDecoder()
				s := NewSession(exporterAP, UDP, Limits{})
				want := 0
				for i, m := range msgs {
					if slices.Contains(drop, i) {
						want += perMsg[i]
						continue
					}
					if _, err := d.Decode(s, m, at[i], nil); err != nil {
						t.Fatalf("message %d: %v", i, err)
					}
				}
				if want == 0 {
					t.Fatalf("messages %v hold no records", drop)
				}
				if d.Stats.SequenceLost != uint64(want) {
					t.Errorf("messages %v taken out (%d records): sequence numbers show %d records lost", drop, want, d.Stats.SequenceLost)
				}
			}
		})
	}
}
