package ipfix

import (
	"errors"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

var now = time.Unix(1_780_000_100, 0)

// sampleRecords are one record per family and shape, as our exporter sends.
func sampleRecords() []flow.Record {
	start := time.UnixMilli(1_780_000_000_123)
	base := func(src, dst string) flow.Record {
		return flow.Record{
			FlowStart: start, FlowEnd: start.Add(2500 * time.Millisecond),
			SrcAddr: netip.MustParseAddr(src), DstAddr: netip.MustParseAddr(dst),
			SrcPort: 40000, DstPort: 8080, Proto: flow.ProtoTCP,
			Packets: 10, Bytes: 1500, ReversePackets: 8, ReverseBytes: 4096,
			PacketsDelta: 4, BytesDelta: 600, ReversePacketsDelta: 3, ReverseBytesDelta: 1024,
			EndReason: flow.EndReasonEndOfFlow, TCPState: "TIME_WAIT",
			Zone: 7, Mark: 0xdeadbeef, ExporterNode: "node-1", Source: fipfix.SourceConntrack,
		}
	}
	v4nat := base("198.18.1.1", "198.18.2.2")
	v4nat.ServiceAddr, v4nat.ServicePort = netip.MustParseAddr("198.19.0.10"), 80
	v4nat.SNATAddr, v4nat.SNATPort = netip.MustParseAddr("198.18.0.1"), 61000
	v4nat.Type, v4nat.Src.NodeName, v4nat.Dst.NodeName = flow.FlowTypeInterNode, "node-1", "node-2"
	v6nat := base("fd00:10:1::1", "fd00:10:2::2")
	v6nat.ServiceAddr, v6nat.ServicePort = netip.MustParseAddr("fd00:10:ff::10"), 80
	v6nat.Type = flow.FlowTypeInterNode
	v6udp := base("fd00:10:1::1", "fd00:10:1::2")
	v6udp.Proto, v6udp.TCPState = flow.ProtoUDP, ""
	v6denied := base("fd00:10:1::1", "fd00:10:2::2")
	v6denied.Source = "ovs"
	v6denied.Ingress.ReportedVerdict, v6denied.Ingress.ReportedName = flow.VerdictDenied, "drop/ingress/backend/api-1"
	v4denied := base("198.18.1.1", "198.18.2.2")
	v4denied.Source = "ovs"
	v4denied.Egress.ReportedVerdict, v4denied.Egress.ReportedName = flow.VerdictDenied, "drop/egress/tools/probe-1"
	return []flow.Record{base("198.18.1.1", "198.18.1.2"), v4nat, base("fd00:10:1::1", "fd00:10:1::2"), v6nat, v6udp, v4denied, v6denied}
}

// expect is what the decoder makes of r sent by exporterAP in domain.
func expect(r flow.Record, domain uint32) flow.Record {
	r.Normalize()
	r.Ingress.Rule, r.Egress.Rule = -1, -1
	r.ExporterAddr = exporterAP.Addr()
	r.ObservationDomainID = domain
	r.TimeReceived = now
	return r
}

func TestDecodeOurExporter(t *testing.T) {
	e4, e6 := mustEncoder(4, 256), mustEncoder(6, 257)
	for _, r := range sampleRecords() {
		name := "ipv4"
		e := e4
		if r.SrcAddr.Is6() {
			name, e = "ipv6", e6
		}
		t.Run(name+"/"+r.SrcAddr.String()+"->"+r.DstAddr.String(), func(t *testing.T) {
			s := NewSession(exporterAP, TCP, Limits{})
			d := NewDecoder()
			got, err := d.Decode(s, encoderMessage(e, 9, 0, true, &r, &r), now, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 {
				t.Fatalf("got %d records, want 2", len(got))
			}
			if want := expect(r, 9); !reflect.DeepEqual(got[1], want) {
				t.Errorf("decoded\n %+v\nwant\n %+v", got[1], want)
			}
			if got[0].IPVersion != flow.Version(r.SrcAddr) {
				t.Errorf("ip version %d", got[0].IPVersion)
			}
		})
	}
}

// TestDecodeForeign covers what other exporters send: several templates per
// set, options templates, reduced-size and enterprise elements, alternative
// time elements, 3-byte variable lengths, padding.
func TestDecodeForeign(t *testing.T) {
	const sysInit = 1_780_000_000_000
	tmplUptime := templateRec(300,
		fs{0, 8, 4}, fs{0, 12, 4}, fs{0, 7, 2}, fs{0, 11, 2}, fs{0, 4, 1},
		fs{0, 22, 4}, fs{0, 21, 4}, // flowStart/EndSysUpTime
		fs{0, 2, 4}, fs{0, 1, 4}, // reduced-size delta counters
		fs{6876, 893, 4},     // VMware (OVS) element: skipped
		fs{12345, 1, varLen}, // unknown enterprise, variable length
		fs{0, 136, 1},
	)
	tmplNTP := templateRec(301,
		fs{0, 27, 16}, fs{0, 28, 16}, fs{0, 7, 2}, fs{0, 11, 2}, fs{0, 4, 1},
		fs{0, 156, 8}, fs{0, 157, 8}, // nanoseconds (NTP)
		fs{0, 282, 16}, fs{0, 228, 2}, // postNAT destination
		fs{0, 86, 8}, fs{29305, 86, 8}, // packetTotalCount, reverse
		fs{0, 300, varLen}, // observationDomainName, 3-byte form below
	)
	tmplSec := templateRec(302,
		fs{0, 8, 4}, fs{0, 12, 4}, fs{0, 4, 1}, fs{0, 32, 2}, // icmpTypeCodeIPv4
		fs{0, 150, 4}, fs{0, 161, 4}, // flowStartSeconds + duration
		fs{fipfix.EnterpriseAntrea, 110, varLen}, fs{fipfix.EnterpriseAntrea, 111, varLen}, fs{fipfix.EnterpriseAntrea, 139, 1},
	)
	opts := optionsRec(400, 1, fs{0, 149, 4}, fs{0, 160, 8}) // observationDomainId scope, systemInitTimeMilliseconds
	templates := cat(set(2, tmplUptime, tmplNTP, tmplSec), set(3, opts, []byte{0, 0}))

	rec300 := cat([]byte{198, 18, 1, 1}, []byte{198, 18, 2, 2}, be16(1234), be16(80), []byte{6},
		be32(1000), be32(3500), be32(5), be32(700), be32(42), varString("opaque", false), []byte{3})
	ntp := func(sec int64, nsec int64) uint64 { return uint64(sec+2_208_988_800)<<32 | uint64(nsec<<32/1e9) }
	src6 := netip.MustParseAddr("fd00:10:1::5").As16()
	svc6 := netip.MustParseAddr("fd00:10:ff::1").As16()
	ep6 := netip.MustParseAddr("fd00:10:2::9").As16()
	rec301 := cat(src6[:], svc6[:], be16(5555), be16(80), []byte{17},
		be64(ntp(1_780_000_000, 500_000_000)), be64(ntp(1_780_000_002, 0)),
		ep6[:], be16(8080), be64(12), be64(11), varString("node-2", true))
	rec302 := cat([]byte{198, 18, 1, 1}, []byte{198, 18, 1, 2}, []byte{1}, be16(8<<8), be32(1_780_000_000), be32(1500),
		varString("deny-all", false), varString("backend", false), []byte{2})
	optData := cat(be32(5), be64(sysInit))
	data := cat(set(400, optData), set(300, rec300, rec300, []byte{0, 0, 0}), set(301, rec301), set(302, rec302))

	s := NewSession(exporterAP, UDP, Limits{})
	d := NewDecoder()
	if _, err := d.Decode(s, message(5, 0, templates), now, nil); err != nil {
		t.Fatal(err)
	}
	if s.Templates() != 4 {
		t.Fatalf("templates %d, want 4", s.Templates())
	}
	got, err := d.Decode(s, message(5, 0, data), now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("got %d records, want 4", len(got))
	}
	want300 := flow.Record{
		SrcAddr: netip.MustParseAddr("198.18.1.1"), DstAddr: netip.MustParseAddr("198.18.2.2"),
		SrcPort: 1234, DstPort: 80, Proto: 6,
		FlowStart: time.UnixMilli(sysInit + 1000), FlowEnd: time.UnixMilli(sysInit + 3500),
		PacketsDelta: 5, BytesDelta: 700, EndReason: flow.EndReasonEndOfFlow, Source: fipfix.SourceForeign,
	}
	want301 := flow.Record{
		SrcAddr: netip.MustParseAddr("fd00:10:1::5"), DstAddr: netip.MustParseAddr("fd00:10:2::9"),
		ServiceAddr: netip.MustParseAddr("fd00:10:ff::1"), ServicePort: 80,
		SrcPort: 5555, DstPort: 8080, Proto: 17,
		FlowStart: time.Unix(1_780_000_000, 500_000_000), FlowEnd: time.Unix(1_780_000_002, 0),
		Packets: 12, ReversePackets: 11, ExporterNode: "node-2", Source: fipfix.SourceForeign,
	}
	want302 := flow.Record{
		SrcAddr: netip.MustParseAddr("198.18.1.1"), DstAddr: netip.MustParseAddr("198.18.1.2"),
		Proto: 1, DstPort: 8 << 8,
		FlowStart: time.Unix(1_780_000_000, 0), FlowEnd: time.Unix(1_780_000_001, 500_000_000),
		Source: fipfix.SourceForeign,
	}
	want302.Ingress.ReportedName, want302.Ingress.ReportedVerdict = "backend/deny-all", flow.VerdictDenied
	for i, w := range []flow.Record{want300, want300, want301, want302} {
		w = expect(w, 5)
		g := got[i]
		if !g.FlowStart.Equal(w.FlowStart) || !g.FlowEnd.Equal(w.FlowEnd) {
			t.Errorf("record %d: times %v..%v, want %v..%v", i, g.FlowStart, g.FlowEnd, w.FlowStart, w.FlowEnd)
		}
		g.FlowStart, g.FlowEnd, w.FlowStart, w.FlowEnd = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("record %d:\n got %+v\nwant %+v", i, g, w)
		}
	}
	if d.Stats.OptionsRecords != 1 || d.Stats.Templates != 4 {
		t.Errorf("stats %+v", d.Stats)
	}
}

func TestTemplateScopeAndWithdrawal(t *testing.T) {
	e := mustEncoder(4, 256)
	r := sampleRecords()[0]
	d := NewDecoder()
	s := NewSession(exporterAP, TCP, Limits{})
	mustDecode := func(msg []byte, want int) {
		t.Helper()
		got, err := d.Decode(s, msg, now, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != want {
			t.Fatalf("got %d records, want %d", len(got), want)
		}
	}
	mustDecode(encoderMessage(e, 1, 0, true, &r), 1)
	// Templates are per observation domain...
	mustDecode(encoderMessage(e, 2, 0, false, &r), 0)
	// ...and per session.
	other := NewSession(netip.MustParseAddrPort("198.18.0.9:1"), TCP, Limits{})
	if got, _ := d.Decode(other, encoderMessage(e, 1, 0, false, &r), now, nil); len(got) != 0 {
		t.Fatal("template leaked across sessions")
	}
	mustDecode(encoderMessage(e, 1, 1, false, &r), 1)
	// Withdraw template 256 of domain 1.
	mustDecode(message(1, 2, set(2, cat(be16(256), be16(0)))), 0)
	mustDecode(encoderMessage(e, 1, 2, false, &r), 0)
	// Withdraw all: template ID 2, field count 0.
	mustDecode(encoderMessage(e, 1, 2, true, &r), 1)
	mustDecode(encoderMessage(mustEncoder(6, 257), 1, 3, true), 0)
	if s.Templates() != 2 {
		t.Fatalf("templates %d, want 2", s.Templates())
	}
	mustDecode(message(1, 3, set(2, cat(be16(2), be16(0)))), 0)
	if s.Templates() != 0 {
		t.Fatalf("templates %d after withdraw-all, want 0", s.Templates())
	}
	if d.Stats.Withdrawn != 3 || d.Stats.UnknownSets != 3 {
		t.Errorf("stats %+v", d.Stats)
	}
}

func TestUDPTemplateLifetime(t *testing.T) {
	e := mustEncoder(6, 256)
	r := sampleRecords()[2]
	d := NewDecoder()
	s := NewSession(exporterAP, UDP, Limits{TemplateLifetime: time.Minute})
	if _, err := d.Decode(s, encoderMessage(e, 1, 0, true), now, nil); err != nil {
		t.Fatal(err)
	}
	// Refreshed in time: still valid.
	if _, err := d.Decode(s, encoderMessage(e, 1, 0, true), now.Add(50*time.Second), nil); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Decode(s, encoderMessage(e, 1, 0, false, &r), now.Add(100*time.Second), nil); len(got) != 1 {
		t.Fatalf("refreshed template: %d records", len(got))
	}
	if got, _ := d.Decode(s, encoderMessage(e, 1, 1, false, &r), now.Add(111*time.Second), nil); len(got) != 0 {
		t.Fatalf("expired template still decodes")
	}
	if d.Stats.Refreshes != 1 || d.Stats.Expired != 1 {
		t.Errorf("stats %+v", d.Stats)
	}
	// TCP templates do not expire.
	s = NewSession(exporterAP, TCP, Limits{TemplateLifetime: time.Minute})
	d.Decode(s, encoderMessage(e, 1, 0, true), now, nil)
	if got, _ := d.Decode(s, encoderMessage(e, 1, 0, false, &r), now.Add(time.Hour), nil); len(got) != 1 {
		t.Fatalf("TCP template expired")
	}
}

func TestSequenceGaps(t *testing.T) {
	e := mustEncoder(4, 256)
	r := sampleRecords()[0]
	d := NewDecoder()
	s := NewSession(exporterAP, UDP, Limits{})
	seqs := []struct {
		seq  uint32
		recs int
	}{{0, 2}, {2, 3}, {5, 1}, {10, 1}, {11, 1}, {4, 1}}
	for i, m := range seqs {
		recs := make([]*flow.Record, m.recs)
		for j := range recs {
			recs[j] = &r
		}
		if _, err := d.Decode(s, encoderMessage(e, 3, m.seq, i == 0, recs...), now, nil); err != nil {
			t.Fatal(err)
		}
	}
	// 6..9 missing (4 records); the late message 4 is not a gap.
	if s.Lost(3) != 4 || d.Stats.SequenceLost != 4 {
		t.Errorf("lost %d (stats %d), want 4", s.Lost(3), d.Stats.SequenceLost)
	}
}

func TestMalformed(t *testing.T) {
	e := mustEncoder(4, 256)
	r := sampleRecords()[0]
	good := encoderMessage(e, 1, 0, true, &r)
	withLen := func(b []byte, l int) []byte {
		b = append([]byte(nil), b...)
		b[2], b[3] = byte(l>>8), byte(l)
		return b
	}
	tests := []struct {
		name string
		msg  []byte
		want Reason
	}{
		{"empty", nil, ReasonShort},
		{"truncated header", good[:10], ReasonShort},
		{"version 7", cat(be16(7), good[2:]), ReasonVersion},
		{"truncated message", good[:len(good)-5], ReasonLength},
		{"length past the end", withLen(good, len(good)+10), ReasonLength},
		{"length below header", withLen(good, 8), ReasonLength},
		{"trailing garbage", cat(good, []byte{1, 2, 3}), ReasonLength},
		{"zero-length set", message(1, 0, cat(be16(256), be16(0))), ReasonSetLength},
		{"set length past the end", message(1, 0, cat(be16(256), be16(400), make([]byte, 20))), ReasonSetLength},
		{"truncated set header", message(1, 0, []byte{0, 2}), ReasonSetLength},
		{"template with 0 data length", message(1, 0, set(2, templateRec(300, fs{0, 8, 0}))), ReasonTemplate},
		{"template truncated", message(1, 0, set(2, cat(be16(300), be16(5), be16(8), be16(4)))), ReasonTemplate},
		{"template enterprise truncated", message(1, 0, set(2, cat(be16(300), be16(1), be16(0x8001), be16(4), be16(0)))), ReasonTemplate},
		{"template ID below 256", message(1, 0, set(2, templateRec(100, fs{0, 8, 4}))), ReasonTemplate},
		{"options without scope", message(1, 0, set(3, optionsRec(300, 0, fs{0, 8, 4}))), ReasonTemplate},
		{"options scope past count", message(1, 0, set(3, optionsRec(300, 3, fs{0, 8, 4}))), ReasonTemplate},
		{"huge template", message(1, 0, set(2, templateRec(300, fs{0, 8, 0xfffe}, fs{0, 12, 0xfffe}))), ReasonTemplate},
		{"variable length overflow", message(1, 0,
			set(2, templateRec(300, fs{0, 8, 4}, fs{0, 12, 4}, fs{0, 300, varLen})),
			set(300, cat([]byte{198, 18, 1, 1, 198, 18, 1, 2}, []byte{200}, []byte("short")))), ReasonRecordLength},
		{"3-byte variable length overflow", message(1, 0,
			set(2, templateRec(300, fs{0, 8, 4}, fs{0, 12, 4}, fs{0, 300, varLen})),
			set(300, cat([]byte{198, 18, 1, 1, 198, 18, 1, 2}, []byte{255, 0xff}))), ReasonRecordLength},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder()
			s := NewSession(exporterAP, UDP, Limits{})
			dst := make([]flow.Record, 1, 8)
			got, err := d.Decode(s, tc.msg, now, dst)
			var de *Error
			if !errors.As(err, &de) || de.Reason != tc.want {
				t.Fatalf("err %v, want reason %s", err, tc.want)
			}
			if len(got) != 1 {
				t.Errorf("dst has %d records, want it unchanged", len(got))
			}
			if d.Stats.Dropped[tc.want] != 1 {
				t.Errorf("dropped stats %v", d.Stats.Dropped)
			}
			// The session survives: a good message decodes afterwards.
			if got, err := d.Decode(s, good, now, nil); err != nil || len(got) != 1 {
				t.Errorf("good message after a bad one: %d records, %v", len(got), err)
			}
		})
	}
}

func TestLimits(t *testing.T) {
	d := NewDecoder()
	s := NewSession(exporterAP, TCP, Limits{MaxDomains: 2, MaxTemplates: 3, MaxFields: 4})
	for dom := uint32(1); dom <= 3; dom++ {
		_, err := d.Decode(s, message(dom, 0), now, nil)
		if dom <= 2 && err != nil || dom == 3 && err == nil {
			t.Fatalf("domain %d: %v", dom, err)
		}
	}
	var recs [][]byte
	for id := uint16(256); id < 266; id++ {
		recs = append(recs, templateRec(id, fs{0, 8, 4}, fs{0, 12, 4}))
	}
	recs = append(recs, templateRec(300, fs{0, 1, 4}, fs{0, 2, 4}, fs{0, 3, 4}, fs{0, 4, 4}, fs{0, 5, 4}))
	if _, err := d.Decode(s, message(1, 0, set(2, recs...)), now, nil); err != nil {
		t.Fatal(err)
	}
	if s.Templates() != 3 || d.Stats.TemplatesRejected != 8 {
		t.Errorf("templates %d, rejected %d", s.Templates(), d.Stats.TemplatesRejected)
	}
}

func TestNoAllocs(t *testing.T) {
	msgs, n := benchMessages(20)
	d := NewDecoder()
	s := NewSession(exporterAP, TCP, Limits{})
	dst := make([]flow.Record, 0, n)
	var err error
	for _, m := range msgs {
		if dst, err = d.Decode(s, m, now, dst[:0]); err != nil {
			t.Fatal(err)
		}
	}
	allocs := testing.AllocsPerRun(100, func() {
		dst = dst[:0]
		for _, m := range msgs[1:] {
			dst, _ = d.Decode(s, m, now, dst)
		}
	})
	if allocs != 0 {
		t.Errorf("%.1f allocations per run of %d records, want 0", allocs, len(dst))
	}
}

// decodeOne decodes msgs in a new session and returns the records of the
// last one.
func decodeOne(t *testing.T, msgs ...[]byte) ([]flow.Record, *Decoder) {
	t.Helper()
	s := NewSession(exporterAP, TCP, Limits{})
	d := NewDecoder()
	var got []flow.Record
	for _, m := range msgs {
		var err error
		if got, err = d.Decode(s, m, now, nil); err != nil {
			t.Fatal(err)
		}
	}
	return got, d
}

// addrBytes returns the 4 or 16 bytes of address a, nil for "".
func addrBytes(a string) []byte {
	if a == "" {
		return nil
	}
	ip := netip.MustParseAddr(a)
	if ip.Is4() {
		b := ip.As4()
		return b[:]
	}
	b := ip.As16()
	return b[:]
}

// TestDecodeAntrea decodes a record shaped like Antrea's flow exporter's:
// seconds timestamps, the Service as ClusterIP, port and port name, pod
// names, and an ingress policy with namespace and rule action.
func TestDecodeAntrea(t *testing.T) {
	const antrea = fipfix.EnterpriseAntrea
	for _, tc := range []struct {
		name         string
		src, dst     string
		srcID, dstID uint16 // IANA address elements
		vipID, alen  uint16 // Antrea destinationClusterIPv4/IPv6, address length
		vip          string
	}{
		{"ipv4", "198.18.1.1", "198.18.2.2", 8, 12, 106, 4, "198.19.0.10"},
		{"ipv6", "fd00:10:1::1", "fd00:10:2::2", 27, 28, 107, 16, "fd00:10:ff::10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := templateRec(300,
				fs{0, 150, 4}, fs{0, 151, 4}, // flowStart/EndSeconds
				fs{0, tc.srcID, tc.alen}, fs{0, tc.dstID, tc.alen}, fs{0, 7, 2}, fs{0, 11, 2}, fs{0, 4, 1},
				fs{antrea, tc.vipID, tc.alen}, fs{antrea, 108, 2}, fs{antrea, 109, varLen},
				fs{antrea, 100, varLen}, fs{antrea, 101, varLen}, fs{antrea, 102, varLen}, fs{antrea, 103, varLen},
				fs{antrea, 110, varLen}, fs{antrea, 111, varLen}, fs{antrea, 139, 1},
			)
			rec := cat(be32(1_780_000_000), be32(1_780_000_005),
				addrBytes(tc.src), addrBytes(tc.dst), be16(40000), be16(8080), []byte{6},
				addrBytes(tc.vip), be16(80), varString("shop/web:http", false),
				varString("shop", false), varString("client-1", false), varString("shop", false), varString("web-1", false),
				varString("allow-web", false), varString("shop", false), []byte{2})
			got, _ := decodeOne(t, message(1, 0, set(2, tmpl), set(300, rec)))
			if len(got) != 1 {
				t.Fatalf("got %d records", len(got))
			}
			r := got[0]
			if r.FlowStart != time.Unix(1_780_000_000, 0) || r.FlowEnd != time.Unix(1_780_000_005, 0) {
				t.Errorf("times %v %v", r.FlowStart, r.FlowEnd)
			}
			if r.ServiceAddr != netip.MustParseAddr(tc.vip) || r.ServicePort != 80 {
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
			if r.Source != fipfix.SourceForeign || r.IPVersion != flow.Version(r.SrcAddr) {
				t.Errorf("source %q version %d", r.Source, r.IPVersion)
			}
		})
	}
}

// TestDecodeDualflowElements decodes the dualflow elements (conntrack
// zone, mark, record source) from a template of another shape than ours:
// addresses only, in either family, then the three elements.
func TestDecodeDualflowElements(t *testing.T) {
	const df = fipfix.EnterpriseDualflow
	for _, tc := range []struct {
		name         string
		src, dst     string
		srcID, dstID uint16
		alen         uint16
	}{
		{"ipv4", "198.18.1.1", "198.18.1.2", 8, 12, 4},
		{"ipv6", "fd00:10::1", "fd00:10::2", 27, 28, 16},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := templateRec(300, fs{0, tc.srcID, tc.alen}, fs{0, tc.dstID, tc.alen},
				fs{df, 1, 2}, fs{df, 2, 4}, fs{df, 3, varLen})
			rec := cat(addrBytes(tc.src), addrBytes(tc.dst), be16(9), be32(0x102), varString("conntrack", false))
			got, _ := decodeOne(t, message(1, 0, set(2, tmpl), set(300, rec)))
			if len(got) != 1 {
				t.Fatalf("got %d records", len(got))
			}
			r := got[0]
			if r.SrcAddr != netip.MustParseAddr(tc.src) || r.DstAddr != netip.MustParseAddr(tc.dst) || r.Zone != 9 || r.Mark != 0x102 || r.Source != "conntrack" {
				t.Errorf("got src %v dst %v zone %d mark %#x source %q", r.SrcAddr, r.DstAddr, r.Zone, r.Mark, r.Source)
			}
		})
	}
}

// TestDecodeSkipsBadRecords decodes a message whose middle records are
// bad (no addresses; a source and a destination of different families):
// they are skipped and counted, and the good records around them are all
// decoded and appended to what dst held.
func TestDecodeSkipsBadRecords(t *testing.T) {
	for _, tc := range []struct {
		name                        string
		srcID, dstID, otherID, alen uint16
		src, dst, other             string
	}{
		{"ipv4", 8, 12, 28, 4, "198.18.1.1", "198.18.2.2", "fd00:10:2::2"},
		{"ipv6", 27, 28, 12, 16, "fd00:10:1::1", "fd00:10:2::2", "198.18.2.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			olen := uint16(len(addrBytes(tc.other)))
			good := templateRec(300, fs{0, tc.srcID, tc.alen}, fs{0, tc.dstID, tc.alen}, fs{0, 7, 2}, fs{0, 4, 1})
			none := templateRec(301, fs{0, 7, 2}, fs{0, 4, 1})
			mixed := templateRec(302, fs{0, tc.srcID, tc.alen}, fs{0, tc.otherID, olen}, fs{0, 7, 2}, fs{0, 4, 1})
			rec := func(id uint16, sport uint16) []byte {
				switch id {
				case 300:
					return set(id, cat(addrBytes(tc.src), addrBytes(tc.dst), be16(sport), []byte{flow.ProtoTCP}))
				case 301:
					return set(id, cat(be16(sport), []byte{flow.ProtoTCP}))
				}
				return set(id, cat(addrBytes(tc.src), addrBytes(tc.other), be16(sport), []byte{flow.ProtoTCP}))
			}
			s := NewSession(exporterAP, TCP, Limits{})
			d := NewDecoder()
			if _, err := d.Decode(s, message(7, 0, set(2, good, none, mixed)), now, nil); err != nil {
				t.Fatal(err)
			}
			prev := flow.Record{SrcPort: 999}
			out, err := d.Decode(s, message(7, 0, rec(300, 1), rec(301, 2), rec(302, 3), rec(300, 4), rec(302, 5), rec(300, 6)), now, []flow.Record{prev})
			if err != nil {
				t.Fatal(err)
			}
			if d.Stats.NoAddress != 3 || d.Stats.Records != 3 {
				t.Errorf("%d records skipped without addresses, %d decoded; want 3 and 3", d.Stats.NoAddress, d.Stats.Records)
			}
			var ports []uint16
			for _, r := range out {
				ports = append(ports, r.SrcPort)
			}
			if len(ports) != 4 || ports[0] != 999 || ports[1] != 1 || ports[2] != 4 || ports[3] != 6 {
				t.Fatalf("decoded source ports %v, want [999 1 4 6]", ports)
			}
			for _, r := range out[1:] {
				if r.ExporterAddr != exporterAP.Addr() || r.ObservationDomainID != 7 || !r.TimeReceived.Equal(now) ||
					r.SrcAddr != netip.MustParseAddr(tc.src) || r.DstAddr != netip.MustParseAddr(tc.dst) {
					t.Errorf("record %+v", r)
				}
			}
		})
	}
}

// TestDecodeMixedFamilies skips a record with a source and a destination
// of different IP families, either way round; a 4-in-6 mapped destination
// is IPv4.
func TestDecodeMixedFamilies(t *testing.T) {
	for _, tc := range []struct {
		name         string
		srcID, dstID uint16
		src, dst     string
		ok           bool
	}{
		{"ipv4 source, ipv6 destination", 8, 28, "198.18.1.1", "fd00:10:2::2", false},
		{"ipv6 source, ipv4 destination", 27, 12, "fd00:10:1::1", "198.18.2.2", false},
		{"ipv4 source, mapped destination", 8, 28, "198.18.1.1", "::ffff:198.18.2.2", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, dst := addrBytes(tc.src), addrBytes(tc.dst)
			tmpl := templateRec(300, fs{0, tc.srcID, uint16(len(src))}, fs{0, tc.dstID, uint16(len(dst))}, fs{0, 4, 1})
			got, d := decodeOne(t, message(1, 0, set(2, tmpl), set(300, cat(src, dst, []byte{flow.ProtoTCP}))))
			if !tc.ok {
				if len(got) != 0 || d.Stats.NoAddress != 1 {
					t.Fatalf("got %v, %d skipped without addresses; want the record skipped", got, d.Stats.NoAddress)
				}
				return
			}
			if len(got) != 1 || got[0].SrcAddr != netip.MustParseAddr(tc.src) || got[0].DstAddr != netip.MustParseAddr(tc.dst).Unmap() || got[0].IPVersion != 4 {
				t.Fatalf("got %+v, want one IPv4 record", got)
			}
		})
	}
}

// TestDecodeICMPTypeCode checks that icmpTypeCodeIPv4/IPv6 fill DstPort when
// destinationTransportPort is absent or 0, in either element order, and do
// not override a nonzero destinationTransportPort.
func TestDecodeICMPTypeCode(t *testing.T) {
	type port struct{ id, v uint16 }
	for _, tc := range []struct {
		name  string
		ports []port
		want  uint16
	}{
		{"v4 only", []port{{32, 8 << 8}}, 8 << 8},
		{"v6 only", []port{{139, 128 << 8}}, 128 << 8},
		{"after zero port", []port{{11, 0}, {32, 3<<8 | 1}}, 3<<8 | 1},
		{"before zero port", []port{{139, 1<<8 | 4}, {11, 0}}, 1<<8 | 4},
		{"port wins", []port{{11, 8 << 8}, {32, 0}}, 8 << 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fields := []fs{{0, 8, 4}, {0, 12, 4}, {0, 4, 1}}
			rec := cat(addrBytes("198.18.1.1"), addrBytes("198.18.1.2"), []byte{flow.ProtoICMP})
			for _, p := range tc.ports {
				fields = append(fields, fs{0, p.id, 2})
				rec = cat(rec, be16(p.v))
			}
			got, _ := decodeOne(t, message(1, 0, set(2, templateRec(300, fields...)), set(300, rec)))
			if len(got) != 1 {
				t.Fatalf("got %d records", len(got))
			}
			if got[0].DstPort != tc.want {
				t.Errorf("DstPort %#x, want %#x", got[0].DstPort, tc.want)
			}
		})
	}
}

// TestOurTemplatesDecoded checks that the decoder reads every element of
// the exporter's templates (fipfix.Elements): none is skipped.
func TestOurTemplatesDecoded(t *testing.T) {
	for _, v := range []uint8{4, 6} {
		for _, e := range fipfix.Elements(v) {
			s := spec{enterprise: e.Enterprise, id: e.ID, length: e.Length}
			if o := opFor(s, false); o == opSkip || !sizeOK(o, s.length) {
				t.Errorf("IPv%d template element %s (%d/%d) is not decoded", v, e.Name, e.Enterprise, e.ID)
			}
		}
	}
}
