package ipfix

import (
	"encoding/binary"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// readStream splits concatenated IPFIX messages (a golden capture).
func readStream(t testing.TB, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var msgs [][]byte
	for len(b) >= 4 {
		l := int(binary.BigEndian.Uint16(b[2:]))
		if l < 16 || l > len(b) {
			t.Fatalf("%s: bad message length %d", path, l)
		}
		msgs = append(msgs, b[:l])
		b = b[l:]
	}
	return msgs
}

// TestGoldenOVS decodes a real Open vSwitch 3.1 IPFIX stream (userspace
// datapath, two pods pinging each other 5 times per family), captured by
// the e2e TestOVSIPFIX (-update-ovs-golden rewrites it). OVS packs many
// templates per set and uses VMware (PEN 6876) elements; it samples each
// packet at the input and at the output port (flowDirection ingress and
// egress), so each echo packet is reported twice. The default (auto) keeps
// one direction per tuple, like ingress and egress do: 5 packets per
// direction, as sent.
func TestGoldenOVS(t *testing.T) {
	for _, tc := range []struct {
		dir     Direction
		packets uint64 // echo packets per src>dst pair
	}{
		{DirectionAuto, 5},
		{DirectionIngress, 5},
		{DirectionEgress, 5},
		{DirectionBoth, 10},
	} {
		t.Run(tc.dir.String(), func(t *testing.T) {
			msgs := readStream(t, "testdata/ovs.ipfix")
			d := NewDecoder()
			d.Direction = tc.dir
			s := NewSession(exporterAP, UDP, Limits{})
			echo := map[string]uint64{}
			var recs []flow.Record
			for i, m := range msgs {
				// Received when exported: the capture has no times.
				at := time.Unix(int64(binary.BigEndian.Uint32(m[4:])), 0)
				var err error
				if recs, err = d.Decode(s, m, at, recs[:0]); err != nil {
					t.Fatalf("message %d: %v", i, err)
				}
				for _, r := range recs {
					if r.ObservationDomainID != 123 || r.Source != "ipfix" {
						t.Errorf("record %+v", r)
					}
					if typ := r.DstPort >> 8; (r.Proto == flow.ProtoICMP || r.Proto == flow.ProtoICMPv6) && (typ == 0 || typ == 8 || typ == 128 || typ == 129) {
						echo[fmt.Sprintf("%v>%v/%d", r.SrcAddr, r.DstAddr, r.Proto)] += r.PacketsDelta
					}
				}
			}
			for _, k := range []string{"198.18.3.5>198.18.3.6/1", "198.18.3.6>198.18.3.5/1", "fd00:10:3::5>fd00:10:3::6/58", "fd00:10:3::6>fd00:10:3::5/58"} {
				if echo[k] != tc.packets {
					t.Errorf("%s: %d echo packets, want %d", k, echo[k], tc.packets)
				}
			}
			if d.Stats.Templates < 80 || d.Stats.UnknownSets != 0 || d.Stats.Dropped != [numReasons]uint64{} || d.Stats.Stamped != [numStampReasons]uint64{} {
				t.Errorf("stats %+v", d.Stats)
			}
			if d.Stats.SequenceLost != 0 || d.Stats.SequenceLostMessages != 0 {
				t.Errorf("sequence numbers show %d records and %d messages lost; none were", d.Stats.SequenceLost, d.Stats.SequenceLostMessages)
			}
			if (d.Stats.WrongDirection == 0) != (tc.dir == DirectionBoth) {
				t.Errorf("%d records skipped for their direction", d.Stats.WrongDirection)
			}
		})
	}
}

func TestDirectionSet(t *testing.T) {
	for _, d := range []Direction{DirectionAuto, DirectionIngress, DirectionEgress, DirectionBoth} {
		var got Direction = DirectionBoth - d // another value
		if err := got.Set(d.String()); err != nil || got != d {
			t.Errorf("Set(%q) = %v, %v", d, got, err)
		}
	}
	var got Direction
	if err := got.Set("inbound"); err == nil {
		t.Error("Set(inbound): no error")
	}
}

// FuzzDecode feeds arbitrary messages to a session that already knows our
// two templates and OVS's. It must never panic, hang or grow without
// bound, a dropped message must leave dst unchanged, and every record must
// have a start and an end within the time window of the receive time.
//
// The session with the templates is built once and cloned for each input
// (about 9 µs), and the Decoder is reused (only its string cache carries
// over, which does not change what is decoded): decoding the templates
// again and allocating a Decoder (its 64 KiB string cache) cost about
// 330 µs per input, far more than decoding it; 30 s of fuzzing on 2 cores
// ran 85,000 inputs with them, 119,000 without.
func FuzzDecode(f *testing.F) {
	ours, _ := benchMessages(2)
	ovs := readStream(f, "testdata/ovs.ipfix")
	for _, m := range append(ours, ovs[:min(len(ovs), 20)]...) {
		f.Add(m)
	}
	f.Add(message(1, 0, set(2, templateRec(300, fs{0, 8, 4}, fs{0, 300, varLen})), set(300, []byte{1, 2, 3, 4, 255, 0, 1, 'x'})))
	f.Add(message(1, 0, set(3, optionsRec(400, 1, fs{0, 149, 4}, fs{0, 160, 8}))))
	// NetFlow v9 and v5 of real exporters; their templates are known to
	// the fuzzed session too.
	var netflow [][]byte
	for _, name := range []string{"softflowd-v9", "pmacct-v9", "softflowd-v5", "softflowd-ipfix", "pmacct-ipfix"} {
		netflow = append(netflow, readPcap(f, "testdata/netflow/"+name+".pcap")...)
	}
	for _, m := range netflow {
		f.Add(m)
	}
	for _, m := range readPcap(f, "testdata/thirdparty/softflowd-ipfix-long-dual.pcap")[:4] {
		f.Add(m)
	}
	f.Add(v9Message(7, 1, 0, v9Set(1, v9Options(300, []fs{{0, 1, 4}}, []fs{{0, 34, 4}}))))
	// Times to stamp: none, sysUpTime without init, v5 FIRST=LAST=0.
	f.Add(message(1, 0, set(2, templateRec(300, ieSrc6, ieDst6)), set(300, cat(lab6a, lab6b))))
	f.Add(message(1, 0, set(2, templateRec(301, ieSrc4, ieDst4, ieStartUp, ieEndUp)), set(301, cat(lab4a, lab4b, be32(1), be32(2)))))
	f.Add(v5Packet(100_000, 0, 0))
	f.Add(v5Packet(400, 0, 300))
	d := NewDecoder()
	// Domains of every protocol count: IPFIX (ours, softflowd, pmacct,
	// OVS), NetFlow v9 (softflowd, pmacct) and v5.
	base := NewSession(exporterAP, UDP, Limits{MaxTemplates: 200, MaxDomains: 8})
	for _, m := range append(ours[:1], netflow...) {
		d.Decode(base, m, now, nil)
	}
	for _, m := range ovs[:min(len(ovs), 4)] { // OVS sends its templates first
		d.Decode(base, m, now, nil)
	}
	if base.Templates() < 20 {
		f.Fatalf("the fuzzed session knows %d templates, want ours and OVS's", base.Templates())
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		s := cloneSession(base)
		d.Stats = Stats{}
		dst := make([]flow.Record, 1, 4)
		out, err := d.Decode(s, msg, now, dst)
		if err != nil && len(out) != 1 {
			t.Fatalf("dropped message changed dst: %d records", len(out))
		}
		lo, hi := now.Add(-DefaultTimeWindow-time.Second), now.Add(DefaultTimeWindow+time.Second) // the check is to the second
		for _, r := range out[1:] {
			if !r.SrcAddr.IsValid() || !r.DstAddr.IsValid() || r.SrcAddr.Is4In6() {
				t.Fatalf("record without normalized addresses: %+v", r)
			}
			if r.FlowStart.IsZero() || r.FlowEnd.Before(lo) || r.FlowEnd.After(hi) {
				t.Fatalf("record times %v .. %v received at %v", r.FlowStart, r.FlowEnd, now)
			}
		}
		if s.Templates() > 200 || len(s.domains) > 8 {
			t.Fatalf("limits exceeded: %d templates, %d domains", s.Templates(), len(s.domains))
		}
	})
}

// cloneSession copies s so that decoding into the copy leaves s as it was:
// its domains and templates are copied; compiled plans and raw template
// records are shared (never written after compile).
func cloneSession(s *Session) *Session {
	c := *s
	c.last = nil
	c.domains = make(map[domainKey]*domain, len(s.domains))
	for id, d := range s.domains {
		dc := *d
		dc.dirs = dirTracker{}
		dc.templates = make(map[uint16]*template, len(d.templates))
		for tid, t := range d.templates {
			tc := *t
			dc.templates[tid] = &tc
		}
		c.domains[id] = &dc
	}
	return &c
}
