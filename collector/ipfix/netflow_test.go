package ipfix

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/flow"
)

// NetFlow v9 builders.

func v9Message(srcID, seq, uptime uint32, flowsets ...[]byte) []byte {
	body := cat(flowsets...)
	return cat(be16(9), be16(uint16(len(flowsets))), be32(uptime), be32(1_780_000_000), be32(seq), be32(srcID), body)
}

// v9Set is a flowset padded to 4 bytes, as RFC 3954 asks.
func v9Set(id uint16, records ...[]byte) []byte {
	body := cat(records...)
	for len(body)%4 != 0 {
		body = append(body, 0)
	}
	return cat(be16(id), be16(uint16(4+len(body))), body)
}

func v9Template(id uint16, fields ...fs) []byte {
	return cat(be16(id), be16(uint16(len(fields))), specBytes(fields))
}

func v9Options(id uint16, scope, options []fs) []byte {
	return cat(be16(id), be16(uint16(4*len(scope))), be16(uint16(4*len(options))), specBytes(scope), specBytes(options))
}

// v9 field types used below (RFC 3954 8).
var (
	v9InBytes  = fs{0, 1, 4}
	v9InPkts   = fs{0, 2, 4}
	v9Proto    = fs{0, 4, 1}
	v9SrcPort  = fs{0, 7, 2}
	v9Src4     = fs{0, 8, 4}
	v9DstPort  = fs{0, 11, 2}
	v9Dst4     = fs{0, 12, 4}
	v9Last     = fs{0, 21, 4}
	v9First    = fs{0, 22, 4}
	v9Src6     = fs{0, 27, 16}
	v9Dst6     = fs{0, 28, 16}
	v9ICMPType = fs{0, 32, 2}
	v9Dir      = fs{0, 61, 1}
)

var (
	lab4a = []byte{198, 18, 0, 1}
	lab4b = []byte{198, 18, 0, 2}
	lab6a = netip.MustParseAddr("fd00:10::1").AsSlice()
	lab6b = netip.MustParseAddr("fd00:10::2").AsSlice()
	zero4 = make([]byte, 4)
	zero6 = make([]byte, 16)
)

func decodeAll(t *testing.T, d *Decoder, s *Session, msgs ...[]byte) []flow.Record {
	t.Helper()
	var out []flow.Record
	for i, m := range msgs {
		var err error
		if out, err = d.Decode(s, m, now, out); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	return out
}

func TestNetFlowV9(t *testing.T) {
	d := NewDecoder()
	s := NewSession(exporterAP, UDP, Limits{})
	tmpl := v9Template(260, v9Src4, v9Dst4, v9SrcPort, v9DstPort, v9Proto, v9InPkts, v9InBytes, v9First, v9Last)
	// uptime 100 s at export time 1_780_000_000: a flow from uptime 40 s
	// to 90 s ran from export-60 s to export-10 s.
	rec := cat(lab4a, lab4b, be16(40000), be16(8080), []byte{6}, be32(7), be32(700), be32(40_000), be32(90_000))
	opts := v9Options(300, []fs{{0, 1, 4}}, []fs{{0, 34, 4}, {0, 35, 1}})
	recs := decodeAll(t, d, s,
		v9Message(5, 0, 100_000, v9Set(0, tmpl), v9Set(1, opts), v9Set(260, rec, rec)),
		v9Message(5, 1, 100_000, v9Set(260, rec), v9Set(300, cat(be32(1), be32(100), []byte{2}))))
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	export := time.Unix(1_780_000_000, 0)
	r := recs[0]
	if r.SrcAddr != netip.AddrFrom4([4]byte(lab4a)) || r.DstAddr != netip.AddrFrom4([4]byte(lab4b)) || r.SrcPort != 40000 || r.DstPort != 8080 ||
		r.Proto != 6 || r.PacketsDelta != 7 || r.BytesDelta != 700 || r.Source != SourceNetFlow9 || r.ObservationDomainID != 5 ||
		!r.FlowStart.Equal(export.Add(-60*time.Second)) || !r.FlowEnd.Equal(export.Add(-10*time.Second)) {
		t.Errorf("record %+v", r)
	}
	if d.Stats.OptionsRecords != 1 || d.Stats.Templates != 2 || d.Stats.ByVersion != [3]uint64{0, 2, 0} {
		t.Errorf("stats %+v", d.Stats)
	}
	// v9 sequence numbers count packets: 0, 1, then 3 means one lost.
	decodeAll(t, d, s, v9Message(5, 3, 100_000, v9Set(260, rec)))
	if d.Stats.SequenceLostMessages != 1 || d.Stats.SequenceLost != 0 || s.LostMessages(5) != 1 {
		t.Errorf("lost %d messages, %d records; want 1 message", d.Stats.SequenceLostMessages, d.Stats.SequenceLost)
	}
}

// TestNetFlowV9UptimeWrap: FIRST_SWITCHED from before a sysUptime wrap (49.7
// days) is still in the past.
func TestNetFlowV9UptimeWrap(t *testing.T) {
	d := NewDecoder()
	s := NewSession(exporterAP, UDP, Limits{})
	tmpl := v9Template(260, v9Src4, v9Dst4, v9First, v9Last)
	recs := decodeAll(t, d, s, v9Message(0, 0, 1000, v9Set(0, tmpl), v9Set(260, cat(lab4a, lab4b, be32(0xffff_ffff-999), be32(500)))))
	export := time.Unix(1_780_000_000, 0)
	if len(recs) != 1 || !recs[0].FlowStart.Equal(export.Add(-2000*time.Millisecond)) || !recs[0].FlowEnd.Equal(export.Add(-500*time.Millisecond)) {
		t.Fatalf("records %+v", recs)
	}
}

// TestDualFamilyTemplate: one template with both families' address fields,
// the other family zero-filled, in either order, reads the filled pair; a
// record with both filled is counted and keeps IPv6.
func TestDualFamilyTemplate(t *testing.T) {
	for _, order := range []string{"v4 first", "v6 first"} {
		t.Run(order, func(t *testing.T) {
			fields := []fs{v9Src4, v9Dst4, v9Src6, v9Dst6, v9Proto}
			rec := func(s4, d4, s6, d6 []byte) []byte { return cat(s4, d4, s6, d6, []byte{17}) }
			if order == "v6 first" {
				fields = []fs{v9Src6, v9Dst6, v9Src4, v9Dst4, v9Proto}
				rec = func(s4, d4, s6, d6 []byte) []byte { return cat(s6, d6, s4, d4, []byte{17}) }
			}
			for _, ipfix := range []bool{false, true} {
				d := NewDecoder()
				s := NewSession(exporterAP, UDP, Limits{})
				recs := []byte(nil)
				recs = cat(rec(lab4a, lab4b, zero6, zero6), rec(zero4, zero4, lab6a, lab6b), rec(lab4a, lab4b, lab6a, lab6b))
				var msg []byte
				if ipfix {
					msg = message(1, 0, set(2, templateRec(400, fields...)), set(400, recs))
				} else {
					msg = v9Message(1, 0, 0, v9Set(0, v9Template(400, fields...)), v9Set(400, recs))
				}
				out := decodeAll(t, d, s, msg)
				if len(out) != 3 {
					t.Fatalf("ipfix %v: %d records, want 3 (stats %+v)", ipfix, len(out), d.Stats)
				}
				if !out[0].SrcAddr.Is4() || !out[1].SrcAddr.Is6() || !out[2].SrcAddr.Is6() || out[1].DstAddr.String() != "fd00:10::2" {
					t.Errorf("ipfix %v: addresses %v>%v, %v>%v, %v>%v", ipfix, out[0].SrcAddr, out[0].DstAddr, out[1].SrcAddr, out[1].DstAddr, out[2].SrcAddr, out[2].DstAddr)
				}
				if d.Stats.BothFamilies != 1 || d.Stats.NoAddress != 0 {
					t.Errorf("ipfix %v: stats %+v", ipfix, d.Stats)
				}
			}
		})
	}
}

func TestNetFlowV5(t *testing.T) {
	v5 := func(seq uint32, n int, proto byte, sport, dport uint16) []byte {
		h := cat(be16(5), be16(uint16(n)), be32(100_000), be32(1_780_000_000), be32(500_000_000), be32(seq), []byte{1, 2}, be16(0))
		for range n {
			h = cat(h, lab4a, lab4b, zero4, be16(1), be16(2), be32(3), be32(180), be32(40_000), be32(90_000),
				be16(sport), be16(dport), []byte{0, 0x1b, proto, 0}, be16(0), be16(0), []byte{24, 24}, be16(0))
		}
		return h
	}
	d := NewDecoder()
	s := NewSession(exporterAP, UDP, Limits{})
	recs := decodeAll(t, d, s, v5(10, 2, 6, 40000, 443), v5(12, 1, 1, 0, 0x0800))
	if len(recs) != 3 {
		t.Fatalf("%d records", len(recs))
	}
	export := time.Unix(1_780_000_000, 500_000_000)
	r := recs[0]
	if r.SrcPort != 40000 || r.DstPort != 443 || r.Proto != 6 || r.PacketsDelta != 3 || r.BytesDelta != 180 ||
		!r.FlowStart.Equal(export.Add(-60*time.Second)) || !r.FlowEnd.Equal(export.Add(-10*time.Second)) ||
		r.ObservationDomainID != 1<<8|2 || r.Source != SourceNetFlow5 {
		t.Errorf("record %+v", r)
	}
	if recs[2].DstPort != 0x0800 || recs[2].SrcPort != 0 {
		t.Errorf("ICMP record ports %d/%d", recs[2].SrcPort, recs[2].DstPort)
	}
	// v5 sequence numbers count flows: 10 (+2) and 12 (+1), then 20 is 7
	// flows lost.
	decodeAll(t, d, s, v5(20, 1, 17, 53, 53))
	if d.Stats.SequenceLost != 7 {
		t.Errorf("lost %d flows, want 7", d.Stats.SequenceLost)
	}
	for name, msg := range map[string][]byte{
		"no records":         v5(1, 0, 6, 1, 2),
		"count past the end": v5(1, 2, 6, 1, 2)[:24+48],
		"31 records":         v5(1, 31, 6, 1, 2),
	} {
		_, err := d.Decode(s, msg, now, nil)
		var de *Error
		if !errors.As(err, &de) || de.Reason != ReasonLength {
			t.Errorf("%s: err %v, want reason length", name, err)
		}
	}
}

// TestNetFlowOverTCPRefused: NetFlow has no length field; over a stream it
// cannot be framed, so the decoder refuses it there.
func TestNetFlowOverTCPRefused(t *testing.T) {
	d := NewDecoder()
	s := NewSession(exporterAP, TCP, Limits{})
	_, err := d.Decode(s, v9Message(0, 0, 0, v9Set(0, v9Template(260, v9Src4, v9Dst4))), now, nil)
	var de *Error
	if !errors.As(err, &de) || de.Reason != ReasonVersion {
		t.Fatalf("err %v", err)
	}
}

func TestMalformedNetFlowV9(t *testing.T) {
	good := v9Set(0, v9Template(260, v9Src4, v9Dst4))
	for _, tc := range []struct {
		name string
		msg  []byte
		want Reason
	}{
		{"short header", v9Message(0, 0, 0)[:12], ReasonShort},
		{"flowset past the end", cat(v9Message(0, 0, 0), be16(260), be16(400), zero4), ReasonSetLength},
		{"flowset length 2", cat(v9Message(0, 0, 0), be16(260), be16(2)), ReasonSetLength},
		{"template ID 100", v9Message(0, 0, 0, v9Set(0, v9Template(100, v9Src4))), ReasonTemplate},
		{"template truncated", v9Message(0, 0, 0, cat(be16(0), be16(12), be16(260), be16(3), be16(8), be16(4))), ReasonTemplate},
		{"variable length", v9Message(0, 0, 0, v9Set(0, v9Template(260, v9Src4, fs{0, 82, 0xffff}))), ReasonTemplate},
		{"zero-length records", v9Message(0, 0, 0, v9Set(0, v9Template(260, fs{0, 8, 0}))), ReasonTemplate},
		{"options lengths not multiple of 4", v9Message(0, 0, 0, v9Set(1, cat(be16(300), be16(3), be16(4), be16(1), be16(4), be16(34), be16(4)))), ReasonTemplate},
		{"options past the end", v9Message(0, 0, 0, v9Set(1, cat(be16(300), be16(4), be16(40), be16(1), be16(4)))), ReasonTemplate},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := NewDecoder()
			s := NewSession(exporterAP, UDP, Limits{})
			_, err := d.Decode(s, tc.msg, now, nil)
			var de *Error
			if !errors.As(err, &de) || de.Reason != tc.want {
				t.Fatalf("err %v, want reason %s", err, tc.want)
			}
			if _, err := d.Decode(s, v9Message(0, 1, 0, good), now, nil); err != nil {
				t.Errorf("the session did not survive: %v", err)
			}
		})
	}
}

// TestDirectionAuto: an exporter reporting the same packets at ingress and
// egress (Open vSwitch) is counted once whichever record comes first, while
// reply flows marked egress (softflowd) are kept.
func TestDirectionAuto(t *testing.T) {
	for _, fam := range []struct {
		name         string
		src, dst     fs
		addrA, addrB []byte
	}{
		{"IPv4", v9Src4, v9Dst4, lab4a, lab4b},
		{"IPv6", v9Src6, v9Dst6, lab6a, lab6b},
	} {
		tmpl := v9Template(260, fam.src, fam.dst, v9SrcPort, v9DstPort, v9Proto, v9InPkts, v9Dir)
		a, b := fam.addrA, fam.addrB
		rec := func(src, dst []byte, sport, dport uint16, dir byte) []byte {
			return cat(src, dst, be16(sport), be16(dport), []byte{6}, be32(5), []byte{dir})
		}
		for _, tc := range []struct {
			name string
			recs [][]byte
			keep int
		}{
			{"ovs ingress first", [][]byte{rec(a, b, 1, 2, 0), rec(a, b, 1, 2, 1), rec(b, a, 2, 1, 0), rec(b, a, 2, 1, 1)}, 2},
			{"ovs egress first", [][]byte{rec(a, b, 1, 2, 1), rec(a, b, 1, 2, 0), rec(b, a, 2, 1, 1), rec(b, a, 2, 1, 0)}, 2},
			{"softflowd reply flows", [][]byte{rec(a, b, 1, 2, 0), rec(b, a, 2, 1, 1)}, 2},
		} {
			t.Run(fam.name+"/"+tc.name, func(t *testing.T) {
				d := NewDecoder()
				s := NewSession(exporterAP, UDP, Limits{})
				msgs := [][]byte{v9Message(0, 0, 0, v9Set(0, tmpl))}
				for i, r := range tc.recs {
					msgs = append(msgs, v9Message(0, uint32(i+1), 0, v9Set(260, r)))
				}
				out := decodeAll(t, d, s, msgs...)
				if len(out) != tc.keep || int(d.Stats.WrongDirection) != len(tc.recs)-tc.keep {
					t.Fatalf("kept %d, skipped %d; want %d kept", len(out), d.Stats.WrongDirection, tc.keep)
				}
				// Later records of a tuple follow its first direction.
				out = decodeAll(t, d, s, v9Message(0, 9, 0, v9Set(260, tc.recs...)))
				if len(out) != tc.keep {
					t.Errorf("second round kept %d, want %d", len(out), tc.keep)
				}
			})
		}
	}
}

// TestSoftflowdReplyFlows: softflowd marks reply flows flowDirection 1.
// The default keeps them; keeping ingress only (the former default) loses
// every reply flow of the capture.
func TestSoftflowdReplyFlows(t *testing.T) {
	msgs := readPcap(t, "testdata/netflow/softflowd-ipfix.pcap")
	decoded := func(dir Direction) ([]flow.Record, Stats) {
		d := NewDecoder()
		d.Direction = dir
		return decodeAll(t, d, NewSession(exporterAP, UDP, Limits{}), msgs...), d.Stats
	}
	all, _ := decoded(DirectionBoth)
	auto, st := decoded(DirectionAuto)
	if len(auto) != len(all) || st.WrongDirection != 0 {
		t.Errorf("auto: %d of %d records kept, %d skipped", len(auto), len(all), st.WrongDirection)
	}
	ingress, st := decoded(DirectionIngress)
	if st.WrongDirection == 0 || len(ingress)+int(st.WrongDirection) != len(all) {
		t.Errorf("ingress: %d kept, %d skipped of %d: softflowd's reply flows should be the skipped ones", len(ingress), st.WrongDirection, len(all))
	}
}

// TestSequenceConventions: sequence numbers that count what the protocol
// does not say (softflowd's v9 counts flows, some IPFIX exporters count
// messages) are learned per domain, and a real gap is still reported.
func TestSequenceConventions(t *testing.T) {
	tmpl := v9Template(260, v9Src4, v9Dst4)
	rec := cat(lab4a, lab4b)
	t.Run("v9 counting flows", func(t *testing.T) {
		d := NewDecoder()
		s := NewSession(exporterAP, UDP, Limits{})
		decodeAll(t, d, s,
			v9Message(0, 0, 0, v9Set(0, tmpl), v9Set(260, rec, rec, rec)),
			v9Message(0, 3, 0, v9Set(260, rec, rec)),
			v9Message(0, 5, 0, v9Set(260, rec)))
		if d.Stats.SequenceLost != 0 || d.Stats.SequenceLostMessages != 0 {
			t.Fatalf("lost %d/%d, want none", d.Stats.SequenceLost, d.Stats.SequenceLostMessages)
		}
		decodeAll(t, d, s, v9Message(0, 10, 0, v9Set(260, rec)))
		if d.Stats.SequenceLost != 4 || d.Stats.SequenceLostMessages != 0 {
			t.Errorf("lost %d records, %d messages; want 4 records", d.Stats.SequenceLost, d.Stats.SequenceLostMessages)
		}
	})
	t.Run("v9 loss that another convention explains", func(t *testing.T) {
		// An RFC 3954 exporter (packets), 3 records a packet. Packet 1
		// loses nothing, then packets 1 and 2 are lost: packet 3's number,
		// 3, is what counting records from packet 0 would expect (0+3),
		// an ambiguous step that must not drop the protocol's own
		// convention. Both losses are counted, in packets.
		d := NewDecoder()
		s := NewSession(exporterAP, UDP, Limits{})
		three := v9Set(260, rec, rec, rec)
		decodeAll(t, d, s, v9Message(0, 0, 0, v9Set(0, tmpl), three),
			v9Message(0, 3, 0, three), v9Message(0, 4, 0, three), v9Message(0, 5, 0, three), v9Message(0, 7, 0, three))
		if d.Stats.SequenceLostMessages != 1 || d.Stats.SequenceLost != 0 {
			t.Errorf("lost %d messages, %d records; want 1 message (the first loss is hidden by the ambiguous step)", d.Stats.SequenceLostMessages, d.Stats.SequenceLost)
		}
	})
	// softflowd (IPFIX and v9) numbers a message with the flow records
	// sent including its own, options records left out: seq_n = seq_{n-1}
	// + flows_n. Messages of both families and different sizes; then one
	// of 3 records is lost.
	for _, ipfix := range []bool{true, false} {
		name := "v9"
		if ipfix {
			name = "ipfix"
		}
		t.Run(name+" counting this message's flows", func(t *testing.T) {
			r4, r6 := cat(lab4a, lab4b), cat(lab6a, lab6b)
			var msgs [][]byte
			seq := uint32(0)
			for i, n := range []int{5, 1, 7, 2, 2, 6, 3, 1} {
				four, six := [][]byte{}, [][]byte{}
				for j := range n {
					if j%2 == 0 {
						four = append(four, r4)
					} else {
						six = append(six, r6)
					}
				}
				seq += uint32(n)
				if ipfix {
					sets := [][]byte{set(300, four...)}
					if i == 0 {
						sets = append([][]byte{set(2, templateRec(300, ieSrc4, ieDst4), templateRec(301, ieSrc6, ieDst6)),
							set(3, optionsRec(400, 1, fs{0, 149, 4}, ieSysInit)), set(400, cat(be32(1), be64(1_779_999_000_000)))}, sets...)
					}
					if len(six) > 0 {
						sets = append(sets, set(301, six...))
					}
					msgs = append(msgs, message(0, seq, sets...))
					continue
				}
				sets := [][]byte{v9Set(300, four...)}
				if i == 0 {
					sets = append([][]byte{v9Set(0, v9Template(300, v9Src4, v9Dst4), v9Template(301, v9Src6, v9Dst6)),
						v9Set(1, v9Options(400, []fs{{0, 1, 4}}, []fs{{0, 34, 4}})), v9Set(400, cat(be32(1), be32(1)))}, sets...)
				}
				if len(six) > 0 {
					sets = append(sets, v9Set(301, six...))
				}
				msgs = append(msgs, v9Message(0, seq, 0, sets...))
			}
			d := NewDecoder()
			s := NewSession(exporterAP, UDP, Limits{})
			out := decodeAll(t, d, s, msgs...)
			if len(out) != 27 || d.Stats.SequenceLost != 0 || d.Stats.SequenceLostMessages != 0 {
				t.Fatalf("%d records; lost %d records, %d messages; want 27, none lost", len(out), d.Stats.SequenceLost, d.Stats.SequenceLostMessages)
			}
			// The next message (4 flows) is lost; the one after holds 2.
			seq += 4 + 2
			lost := message(0, seq, set(300, r4), set(301, r6))
			if !ipfix {
				lost = v9Message(0, seq, 0, v9Set(300, r4), v9Set(301, r6))
			}
			decodeAll(t, d, s, lost)
			if d.Stats.SequenceLost != 4 || d.Stats.SequenceLostMessages != 0 {
				t.Errorf("lost %d records, %d messages; want 4 records", d.Stats.SequenceLost, d.Stats.SequenceLostMessages)
			}
		})
	}
	t.Run("ipfix counting messages", func(t *testing.T) {
		d := NewDecoder()
		s := NewSession(exporterAP, UDP, Limits{})
		t2 := set(2, templateRec(300, fs{0, 8, 4}, fs{0, 12, 4}))
		data := set(300, rec, rec)
		decodeAll(t, d, s, message(1, 0, t2, data), message(1, 1, data), message(1, 2, data))
		if d.Stats.SequenceLost != 0 || d.Stats.SequenceLostMessages != 0 {
			t.Fatalf("lost %d/%d, want none", d.Stats.SequenceLost, d.Stats.SequenceLostMessages)
		}
		decodeAll(t, d, s, message(1, 5, data))
		if d.Stats.SequenceLostMessages != 2 {
			t.Errorf("lost %d messages, want 2", d.Stats.SequenceLostMessages)
		}
	})
}

// TestUnspecifiedSource: duplicate address detection and MLD reports are
// sent from :: (DHCP discovery from 0.0.0.0); such records are flows. A
// pair that is all zero is no address.
func TestUnspecifiedSource(t *testing.T) {
	mcast := netip.MustParseAddr("ff02::16").AsSlice()
	d := NewDecoder()
	s := NewSession(exporterAP, UDP, Limits{})
	out := decodeAll(t, d, s, message(1, 0,
		set(2, templateRec(300, fs{0, 27, 16}, fs{0, 28, 16}), templateRec(301, fs{0, 8, 4}, fs{0, 12, 4})),
		set(300, cat(zero6, mcast), cat(zero6, zero6)),
		set(301, cat(zero4, []byte{255, 255, 255, 255}))))
	if len(out) != 2 || out[0].SrcAddr != netip.IPv6Unspecified() || out[0].DstAddr.String() != "ff02::16" ||
		out[1].SrcAddr != netip.IPv4Unspecified() || out[1].IPVersion != 4 {
		t.Fatalf("records %+v", out)
	}
	if d.Stats.NoAddress != 1 {
		t.Errorf("%d records without address, want 1", d.Stats.NoAddress)
	}
}

// TestSysUpTimeBeforeInit: flowStartSysUpTime is 32 bits. softflowd
// reading a capture sends flows from before its own start as negative
// values; a device up more than 49.7 days wraps. Either way the flow is
// the reading near the export time.
func TestSysUpTimeBeforeInit(t *testing.T) {
	sys := uint64(1_780_000_000_000)
	for _, tc := range []struct {
		up   uint64
		want int64
	}{
		{1000, 1_780_000_001_000},
		{1<<32 - 1091, 1_780_000_000_000 - 1091},
	} {
		if got := sysUpTime(sys, tc.up, 1_780_000_002_000); got != tc.want {
			t.Errorf("sysUpTime(%d) = %d, want %d", tc.up, got, tc.want)
		}
	}
	// 60 days after init, the 32-bit uptime has wrapped once.
	up60 := uint64(60*24*3600*1000) % (1 << 32)
	export := int64(sys) + 60*24*3600*1000 + 5000
	if got := sysUpTime(sys, up60, export); got != export-5000 {
		t.Errorf("after a wrap: %d, want %d", got, export-5000)
	}
}

// netflowBenchMessages builds n NetFlow v9 packets laid out like
// softflowd's (one template per family with flowDirection, 24 records per
// packet, half IPv4, half IPv6) or n v5 packets of 30 records.
func netflowBenchMessages(v9 bool, n int) (msgs [][]byte, perMsg int) {
	tmpl4 := v9Template(1024, v9Src4, v9Dst4, v9First, v9Last, v9InBytes, v9InPkts, fs{0, 10, 4}, fs{0, 14, 4}, v9SrcPort, v9DstPort, fs{0, 6, 1}, v9Proto, fs{0, 5, 1}, v9Dir)
	tmpl6 := v9Template(2048, v9Src6, v9Dst6, v9First, v9Last, v9InBytes, v9InPkts, fs{0, 10, 4}, fs{0, 14, 4}, v9SrcPort, v9DstPort, fs{0, 6, 1}, v9Proto, fs{0, 5, 1}, v9Dir)
	seq := uint32(0)
	for i := range n {
		if !v9 {
			h := cat(be16(5), be16(30), be32(100_000), be32(1_780_000_000), be32(0), be32(seq), []byte{0, 0}, be16(0))
			for j := range 30 {
				h = cat(h, []byte{198, 18, byte(i), byte(j)}, lab4b, zero4, be16(1), be16(2), be32(3), be32(180), be32(40_000), be32(90_000),
					be16(uint16(40000+j)), be16(443), []byte{0, 0x1b, 6, 0}, be16(0), be16(0), []byte{24, 24}, be16(0))
			}
			msgs = append(msgs, h)
			seq += 30
			continue
		}
		var r4, r6 []byte
		for j := range 12 {
			common := cat(be32(40_000), be32(90_000), be32(700), be32(7), be32(1), be32(2), be16(uint16(40000+j)), be16(8080), []byte{0x1b, 6, 0, byte(j % 2)})
			r4 = cat(r4, []byte{198, 18, byte(i), byte(j)}, lab4b, common)
			a6 := netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 15: byte(j)}).AsSlice()
			a6[14] = byte(i)
			r6 = cat(r6, a6, lab6b, common)
		}
		var sets [][]byte
		if i == 0 {
			sets = append(sets, v9Set(0, tmpl4, tmpl6))
		}
		sets = append(sets, v9Set(1024, r4), v9Set(2048, r6))
		msgs = append(msgs, v9Message(1, seq, 100_000, sets...))
		seq++
	}
	if v9 {
		return msgs, 24
	}
	return msgs, 30
}

// BenchmarkDecodeNetFlow decodes NetFlow v9 and v5 fully typed into flow
// records on one core, in steady state, next to BenchmarkDecode (IPFIX).
func BenchmarkDecodeNetFlow(b *testing.B) {
	for _, v9 := range []bool{true, false} {
		name := "v5"
		if v9 {
			name = "v9"
		}
		b.Run(name, func(b *testing.B) {
			msgs, perMsg := netflowBenchMessages(v9, 64)
			d := NewDecoder()
			s := NewSession(exporterAP, UDP, Limits{})
			dst := make([]flow.Record, 0, perMsg)
			for _, m := range msgs { // templates, and the direction of each tuple
				d.Decode(s, m, now, dst[:0])
			}
			msgs = msgs[1:]
			b.ReportAllocs()
			b.ResetTimer()
			records := 0
			var bytes int64
			for i := 0; b.Loop(); i++ {
				m := msgs[i%len(msgs)]
				var err error
				if dst, err = d.Decode(s, m, now, dst[:0]); err != nil {
					b.Fatal(err)
				}
				records += len(dst)
				bytes += int64(len(m))
			}
			if records == 0 {
				b.Fatal("no records")
			}
			b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(records), "ns/record")
			b.SetBytes(bytes / int64(b.N))
		})
	}
}

// TestDirectionAutoBounded: the tuples DirectionAuto remembers are charged
// to the listener's tuple budget; past it records are kept untracked and
// counted, templates are still accepted (their budget is another), and a
// closed session gives its tuples' memory back.
func TestDirectionAutoBounded(t *testing.T) {
	tmpl := v9Template(260, v9Src4, v9Dst4, v9SrcPort, v9DstPort, v9Proto, v9Dir)
	budget := NewTemplateBudget(10 * dirTupleBytes)
	templates := NewTemplateBudget(1 << 20)
	d := NewDecoder()
	s := NewSession(exporterAP, UDP, Limits{TupleBudget: budget, Budget: templates})
	msgs := [][]byte{v9Message(0, 0, 0, v9Set(0, tmpl))}
	for i := range 64 {
		msgs = append(msgs, v9Message(0, uint32(i+1), 0, v9Set(260,
			cat(lab4a, lab4b, be16(uint16(1000+i)), be16(80), []byte{6, 0}),
			cat(lab4a, lab4b, be16(uint16(1000+i)), be16(80), []byte{6, 1}))))
	}
	out := decodeAll(t, d, s, msgs...)
	if d.Stats.DirectionUntracked == 0 || s.tuples != 10 {
		t.Fatalf("%d tuples tracked, %d records untracked: the budget should bound the tracking", s.tuples, d.Stats.DirectionUntracked)
	}
	// Tracked tuples count once; untracked ones keep both records.
	if want := s.tuples + 2*(64-s.tuples); len(out) != want {
		t.Errorf("%d records, want %d", len(out), want)
	}
	if budget.Used() > 10*dirTupleBytes {
		t.Errorf("budget over its bound: %d", budget.Used())
	}
	// A new template is accepted with the tuple budget spent.
	decodeAll(t, d, s, v9Message(0, 100, 0, v9Set(0, v9Template(261, v9Src4, v9Dst4))))
	if d.Stats.TemplatesOverBudget != 0 || s.Templates() != 2 {
		t.Errorf("templates %d, over budget %d", s.Templates(), d.Stats.TemplatesOverBudget)
	}
	s.Close()
	if budget.Used() != 0 || templates.Used() != 0 {
		t.Errorf("a closed session still holds %d tuple and %d template bytes", budget.Used(), templates.Used())
	}
}

// TestNetFlowReviewCases: times stamped just after the header's uptime,
// a dual-family template with a postNAT destination, options templates
// packed back to back, and an IPv4-mapped zero pair.
func TestNetFlowReviewCases(t *testing.T) {
	export := time.Unix(1_780_000_000, 0)
	t.Run("last switched after the header uptime", func(t *testing.T) {
		d := NewDecoder()
		s := NewSession(exporterAP, UDP, Limits{})
		recs := decodeAll(t, d, s, v9Message(0, 0, 100_000, v9Set(0, v9Template(260, v9Src4, v9Dst4, v9First, v9Last)),
			v9Set(260, cat(lab4a, lab4b, be32(99_000), be32(100_001)))))
		if len(recs) != 1 || !recs[0].FlowEnd.Equal(export.Add(time.Millisecond)) || !recs[0].FlowStart.Equal(export.Add(-time.Second)) {
			t.Fatalf("records %+v", recs)
		}
	})
	t.Run("dual family with postNAT destination", func(t *testing.T) {
		d := NewDecoder()
		s := NewSession(exporterAP, UDP, Limits{})
		nat := []byte{198, 18, 0, 9}
		recs := decodeAll(t, d, s, message(1, 0,
			set(2, templateRec(300, fs{0, 8, 4}, fs{0, 12, 4}, fs{0, 27, 16}, fs{0, 28, 16}, fs{0, 226, 4})),
			set(300, cat(lab4a, lab4b, zero6, zero6, nat))))
		if len(recs) != 1 || recs[0].DstAddr.String() != "198.18.0.9" || recs[0].ServiceAddr.String() != "198.18.0.2" {
			t.Fatalf("records %+v", recs)
		}
	})
	t.Run("options templates back to back", func(t *testing.T) {
		d := NewDecoder()
		s := NewSession(exporterAP, UDP, Limits{})
		// Each record is 6+4+2... = 14 bytes: not a multiple of 4.
		o1 := cat(be16(300), be16(4), be16(4), be16(1), be16(4), be16(34), be16(2))
		o2 := cat(be16(301), be16(4), be16(4), be16(1), be16(4), be16(35), be16(1))
		decodeAll(t, d, s, v9Message(0, 0, 0, v9Set(1, o1, o2)))
		if s.Templates() != 2 {
			t.Errorf("%d templates, want 2", s.Templates())
		}
		// And padded to 4 bytes each, as some exporters do.
		d2 := NewDecoder()
		s2 := NewSession(exporterAP, UDP, Limits{})
		decodeAll(t, d2, s2, v9Message(0, 0, 0, v9Set(1, cat(o1, []byte{0, 0}), o2)))
		if s2.Templates() != 2 {
			t.Errorf("padded: %d templates, want 2", s2.Templates())
		}
	})
	t.Run("mapped zero pair", func(t *testing.T) {
		d := NewDecoder()
		s := NewSession(exporterAP, UDP, Limits{})
		mapped0 := netip.MustParseAddr("::ffff:0.0.0.0").AsSlice()
		recs := decodeAll(t, d, s, message(1, 0,
			set(2, templateRec(300, fs{0, 8, 4}, fs{0, 12, 4}, fs{0, 27, 16}, fs{0, 28, 16})),
			set(300, cat(lab4a, lab4b, mapped0, mapped0))))
		if len(recs) != 1 || !recs[0].SrcAddr.Is4() || d.Stats.BothFamilies != 0 {
			t.Fatalf("records %+v, stats %+v", recs, d.Stats)
		}
	})
}

// TestTemplatesPerProtocol: IPFIX and NetFlow v9 templates are kept apart.
// One exporter socket sends both with the same template ID and domain
// (source ID) and different layouts, interleaved: every record of each
// decodes with its own protocol's template. Over TCP NetFlow is refused
// (it cannot be framed) and leaves the IPFIX templates as they were.
func TestTemplatesPerProtocol(t *testing.T) {
	for _, fam := range families {
		ipfixTmpl := set(2, templateRec(256, fam.src, fam.dst, fs{0, 7, 2}, fs{0, 11, 2}, ieProto, fs{0, 2, 8}))
		ipfixData := set(256, cat(fam.a, fam.b, be16(1111), be16(2222), []byte{6}, be64(11)))
		v9Tmpl := v9Set(0, v9Template(256, v9Proto, v9DstPort, v9SrcPort, v9InPkts, fam.dst, fam.src))
		v9Data := v9Set(256, cat([]byte{17}, be16(4444), be16(3333), be32(22), fam.b, fam.a))
		check := func(t *testing.T, recs []flow.Record, want []string) {
			t.Helper()
			var got []string
			for _, r := range recs {
				got = append(got, fmt.Sprintf("%s %v:%d>%v:%d/%d %d", r.Source, r.SrcAddr, r.SrcPort, r.DstAddr, r.DstPort, r.Proto, r.PacketsDelta))
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("records\n %q\nwant\n %q", got, want)
			}
		}
		src, _ := netip.AddrFromSlice(fam.a)
		dst, _ := netip.AddrFromSlice(fam.b)
		ipfixRec := fmt.Sprintf("ipfix %v:1111>%v:2222/6 11", src, dst)
		v9Rec := fmt.Sprintf("netflow9 %v:3333>%v:4444/17 22", src, dst)

		t.Run(fam.name+"/udp", func(t *testing.T) {
			listen := "127.0.0.1:0"
			if fam.name == "ipv6" {
				listen = "[::1]:0"
			}
			l, q, _ := startListener(t, Config{UDPAddrs: []string{listen}})
			c, err := net.Dial("udp", l.UDPAddrs()[0].String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for _, m := range [][]byte{
				message(1, 0, ipfixTmpl, ipfixData),
				v9Message(1, 0, 100_000, v9Tmpl, v9Data),
				message(1, 1, ipfixData),
				v9Message(1, 1, 100_000, v9Data),
			} {
				if _, err := c.Write(m); err != nil {
					t.Fatal(err)
				}
			}
			recs := collect(t, q, 4)
			check(t, recs, []string{ipfixRec, v9Rec, ipfixRec, v9Rec})
			if n := testutil.ToFloat64(l.m.unknownSet); n != 0 {
				t.Errorf("%v sets of unknown templates", n)
			}
		})
		t.Run(fam.name+"/tcp", func(t *testing.T) {
			d := NewDecoder()
			s := NewSession(exporterAP, TCP, Limits{})
			recs := decodeAll(t, d, s, message(1, 0, ipfixTmpl, ipfixData))
			_, err := d.Decode(s, v9Message(1, 0, 100_000, v9Tmpl, v9Data), now, nil)
			var de *Error
			if !errors.As(err, &de) || de.Reason != ReasonVersion {
				t.Fatalf("NetFlow v9 over TCP: err %v, want reason version", err)
			}
			recs = append(recs, decodeAll(t, d, s, message(1, 1, ipfixData))...)
			check(t, recs, []string{ipfixRec, ipfixRec})
		})
	}
}
