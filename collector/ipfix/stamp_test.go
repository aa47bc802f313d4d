package ipfix

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/test/support/logtest"
)

// IPFIX elements of the time tests.
var (
	ieSrc4      = fs{0, 8, 4}
	ieDst4      = fs{0, 12, 4}
	ieSrc6      = fs{0, 27, 16}
	ieDst6      = fs{0, 28, 16}
	ieProto     = fs{0, 4, 1}
	ieStartMs   = fs{0, 152, 8}
	ieEndMs     = fs{0, 153, 8}
	ieStartUp   = fs{0, 22, 4}
	ieEndUp     = fs{0, 21, 4}
	ieSysInit   = fs{0, 160, 8}
	exportTime  = time.Unix(1_780_000_000, 0) // message() and v9Message()
	fortyDaysMs = uint64(40 * 24 * time.Hour / time.Millisecond)
)

// family is what a test record needs of one address family: the address
// elements (IPFIX and NetFlow v9 share them) and two addresses.
type family struct {
	name     string
	src, dst fs
	a, b     []byte
}

var families = []family{
	{"ipv4", ieSrc4, ieDst4, lab4a, lab4b},
	{"ipv6", ieSrc6, ieDst6, lab6a, lab6b},
}

// v5Packet is a NetFlow v5 packet of one record from 198.18.0.1 to
// 198.18.0.2 with FIRST and LAST, exported at 1_780_000_000.5 when the
// exporter's uptime was uptime.
func v5Packet(uptime, first, last uint32) []byte {
	return cat(be16(5), be16(1), be32(uptime), be32(1_780_000_000), be32(500_000_000), be32(0), []byte{0, 0}, be16(0),
		lab4a, lab4b, zero4, be16(1), be16(2), be32(3), be32(180), be32(first), be32(last),
		be16(40000), be16(443), []byte{0, 0x1b, 6, 0}, be16(0), be16(0), []byte{24, 24}, be16(0))
}

// TestRecordTimes: a record is never written with a time its own TTL
// deletes. A record without a usable end (no time element; sysUpTime
// times without systemInitTimeMilliseconds; NetFlow FIRST=LAST=0) is
// stamped with its message's export time, or the receive time when the
// export time is unusable; an end too far from both is moved to the export
// time; a missing start is the end. Each row in both families (v5: IPv4
// only).
func TestRecordTimes(t *testing.T) {
	v5Export := exportTime.Add(500 * time.Millisecond)
	for _, fam := range families {
		addrs := cat(fam.a, fam.b)
		for _, tc := range []struct {
			name       string
			msgs       [][]byte
			start, end time.Time
			reason     StampReason // StampNone: not stamped
			v4Only     bool
		}{
			{
				name:  "no time element",
				msgs:  [][]byte{message(1, 0, set(2, templateRec(300, fam.src, fam.dst, ieProto)), set(300, cat(addrs, []byte{6})))},
				start: exportTime, end: exportTime, reason: StampNoTime,
			},
			{
				name: "sysUpTime without systemInitTimeMilliseconds",
				msgs: [][]byte{message(1, 0, set(2, templateRec(300, fam.src, fam.dst, ieStartUp, ieEndUp)),
					set(300, cat(addrs, be32(1000), be32(2000))))},
				start: exportTime, end: exportTime, reason: StampRelativeWithoutInit,
			},
			{
				name: "sysUpTime with systemInitTimeMilliseconds",
				msgs: [][]byte{message(1, 0, set(3, optionsRec(400, 1, fs{0, 149, 4}, ieSysInit)), set(400, cat(be32(1), be64(1_779_999_000_000))),
					set(2, templateRec(300, fam.src, fam.dst, ieStartUp, ieEndUp)), set(300, cat(addrs, be32(1000), be32(2000))))},
				start: time.UnixMilli(1_779_999_001_000), end: time.UnixMilli(1_779_999_002_000), reason: StampNone,
			},
			{
				name: "NetFlow v9 FIRST and LAST 0",
				msgs: [][]byte{v9Message(1, 0, 100_000, v9Set(0, v9Template(300, fam.src, fam.dst, v9First, v9Last)),
					v9Set(300, cat(addrs, be32(0), be32(0))))},
				start: exportTime, end: exportTime, reason: StampZeroUptime,
			},
			{
				name:  "NetFlow v5 FIRST and LAST 0",
				msgs:  [][]byte{v5Packet(100_000, 0, 0)},
				start: v5Export, end: v5Export, v4Only: true, reason: StampZeroUptime,
			},
			{
				// Up 12 days: FIRST=0 read as a value would start the flow at
				// the exporter's boot, 12 days before its end.
				name:  "NetFlow v5 FIRST 0 from an exporter up for days",
				msgs:  [][]byte{v5Packet(1_036_800_000, 0, 1_036_790_000)},
				start: v5Export.Add(-10 * time.Second), end: v5Export.Add(-10 * time.Second), v4Only: true, reason: StampNoStart,
			},
			{
				// softflowd counts its uptime from its own start: a flow
				// seen from its first millisecond has FIRST 0.
				name:  "NetFlow v5 FIRST 0 from an exporter up for 400 ms",
				msgs:  [][]byte{v5Packet(400, 0, 300)},
				start: v5Export.Add(-400 * time.Millisecond), end: v5Export.Add(-100 * time.Millisecond), v4Only: true, reason: StampNone,
			},
			{
				// softflowd reading a capture has flows from before its
				// start: a flow that ended in its first millisecond.
				name:  "NetFlow v5 LAST 0 after a FIRST 500 ms before it",
				msgs:  [][]byte{v5Packet(400, 1<<32-500, 0)},
				start: v5Export.Add(-900 * time.Millisecond), end: v5Export.Add(-400 * time.Millisecond), v4Only: true, reason: StampNone,
			},
			{
				name:  "NetFlow v5 LAST 0 from an exporter up for days",
				msgs:  [][]byte{v5Packet(1_036_800_000, 1_036_790_000, 0)},
				start: v5Export.Add(-10 * time.Second), end: v5Export, v4Only: true, reason: StampNoEnd,
			},
			{
				name: "NetFlow v9 FIRST 0 from an exporter up for days",
				msgs: [][]byte{v9Message(1, 0, 1_036_800_000, v9Set(0, v9Template(300, fam.src, fam.dst, v9First, v9Last)),
					v9Set(300, cat(addrs, be32(0), be32(1_036_790_000))))},
				start: exportTime.Add(-10 * time.Second), end: exportTime.Add(-10 * time.Second), reason: StampNoStart,
			},
			{
				name: "end 40 days before the export time",
				msgs: [][]byte{message(1, 0, set(2, templateRec(300, fam.src, fam.dst, ieStartMs, ieEndMs)),
					set(300, cat(addrs, be64(1_780_000_000_000-fortyDaysMs-5000), be64(1_780_000_000_000-fortyDaysMs))))},
				start: exportTime.Add(-5 * time.Second), end: exportTime, reason: StampTooOld,
			},
			{
				name: "end 40 days after the export time",
				msgs: [][]byte{message(1, 0, set(2, templateRec(300, fam.src, fam.dst, ieStartMs, ieEndMs)),
					set(300, cat(addrs, be64(1_780_000_000_000+fortyDaysMs-5000), be64(1_780_000_000_000+fortyDaysMs))))},
				start: exportTime.Add(-5 * time.Second), end: exportTime, reason: StampFuture,
			},
			{
				name: "end in 1970",
				msgs: [][]byte{message(1, 0, set(2, templateRec(300, fam.src, fam.dst, ieStartMs, ieEndMs)),
					set(300, cat(addrs, be64(1000), be64(2000))))},
				start: exportTime.Add(-time.Second), end: exportTime, reason: StampTooOld,
			},
			{
				name: "no export time, no time element",
				msgs: [][]byte{zeroExportTime(message(1, 0, set(2, templateRec(300, fam.src, fam.dst, ieProto)),
					set(300, cat(addrs, []byte{6}))))},
				start: now, end: now, reason: StampNoTime,
			},
			{
				name: "start missing",
				msgs: [][]byte{message(1, 0, set(2, templateRec(300, fam.src, fam.dst, ieEndMs)),
					set(300, cat(addrs, be64(1_779_999_999_000))))},
				start: exportTime.Add(-time.Second), end: exportTime.Add(-time.Second), reason: StampNoStart,
			},
			{
				name: "end missing",
				msgs: [][]byte{message(1, 0, set(2, templateRec(300, fam.src, fam.dst, ieStartMs)),
					set(300, cat(addrs, be64(1_779_999_999_000))))},
				start: exportTime.Add(-time.Second), end: exportTime, reason: StampNoEnd,
			},
			{
				name: "times in range",
				msgs: [][]byte{message(1, 0, set(2, templateRec(300, fam.src, fam.dst, ieStartMs, ieEndMs)),
					set(300, cat(addrs, be64(1_779_999_000_000), be64(1_779_999_999_000))))},
				start: exportTime.Add(-1000 * time.Second), end: exportTime.Add(-time.Second), reason: StampNone,
			},
		} {
			if tc.v4Only && fam.name == "ipv6" {
				continue
			}
			t.Run(fam.name+"/"+tc.name, func(t *testing.T) {
				d := NewDecoder()
				s := NewSession(exporterAP, UDP, Limits{})
				recs := decodeAll(t, d, s, tc.msgs...)
				if len(recs) != 1 {
					t.Fatalf("%d records, want 1", len(recs))
				}
				r := recs[0]
				if want := fam.name == "ipv4" || tc.v4Only; r.SrcAddr.Is4() != want {
					t.Errorf("source %v", r.SrcAddr)
				}
				if !r.FlowStart.Equal(tc.start) || !r.FlowEnd.Equal(tc.end) {
					t.Errorf("times %v .. %v, want %v .. %v", r.FlowStart.UTC(), r.FlowEnd.UTC(), tc.start.UTC(), tc.end.UTC())
				}
				var want [numStampReasons]uint64
				if tc.reason != StampNone {
					want[tc.reason] = 1
				}
				if d.Stats.Stamped != want {
					t.Errorf("stamped %v, want 1 %s", d.Stats.Stamped, tc.reason)
				}
			})
		}
	}
}

// zeroExportTime clears the export time of an IPFIX message.
func zeroExportTime(m []byte) []byte {
	copy(m[4:8], zero4)
	return m
}

// TestTimeWindow: the window is half the flows' retention (12 h when it is
// unknown or unlimited), checked against both the export time and the
// receive time: an exporter whose clock is days behind, export time
// included, still has its rows stamped with the receive time rather than
// written for the TTL to delete.
func TestTimeWindow(t *testing.T) {
	day := 24 * time.Hour
	for _, tc := range []struct {
		retention, window time.Duration
	}{{0, 12 * time.Hour}, {2 * day, day}, {30 * day, 15 * day}} {
		if got := TimeWindow(tc.retention); got != tc.window {
			t.Errorf("TimeWindow(%v) = %v, want %v", tc.retention, got, tc.window)
		}
	}
	for _, fam := range families {
		tmpl := set(2, templateRec(300, fam.src, fam.dst, ieStartMs, ieEndMs))
		rec := func(end time.Time) []byte {
			return set(300, cat(fam.a, fam.b, be64(uint64(end.Add(-time.Second).UnixMilli())), be64(uint64(end.UnixMilli()))))
		}
		for _, tc := range []struct {
			name      string
			retention time.Duration
			msg       []byte
			end       time.Time
			reason    StampReason
		}{
			{"10 days old, 30 days kept", 30 * day, message(1, 0, tmpl, rec(exportTime.Add(-10*day))), exportTime.Add(-10 * day), StampNone},
			{"10 days old, 2 days kept", 2 * day, message(1, 0, tmpl, rec(exportTime.Add(-10*day))), exportTime, StampTooOld},
			{"10 days old, retention unknown", 0, message(1, 0, tmpl, rec(exportTime.Add(-10*day))), exportTime, StampTooOld},
			{"exporter clock 20 days behind, 30 days kept", 30 * day,
				withExportTime(message(1, 0, tmpl, rec(exportTime.Add(-20*day))), exportTime.Add(-20*day)), now, StampTooOld},
			{"exporter clock 5 days behind, 30 days kept", 30 * day,
				withExportTime(message(1, 0, tmpl, rec(exportTime.Add(-5*day))), exportTime.Add(-5*day)), exportTime.Add(-5 * day), StampNone},
		} {
			t.Run(fam.name+"/"+tc.name, func(t *testing.T) {
				d := NewDecoder()
				d.TimeWindow = TimeWindow(tc.retention)
				recs := decodeAll(t, d, NewSession(exporterAP, UDP, Limits{}), tc.msg)
				if len(recs) != 1 || !recs[0].FlowEnd.Equal(tc.end) || !recs[0].FlowStart.Equal(tc.end.Add(-time.Second)) {
					t.Fatalf("records %+v, want end %v", recs, tc.end.UTC())
				}
				var want [numStampReasons]uint64
				if tc.reason != StampNone {
					want[tc.reason] = 1
				}
				if d.Stats.Stamped != want {
					t.Errorf("stamped %v, want %s", d.Stats.Stamped, tc.reason)
				}
			})
		}
	}
}

// withExportTime sets the export time of an IPFIX message.
func withExportTime(m []byte, at time.Time) []byte {
	copy(m[4:8], be32(uint32(at.Unix())))
	return m
}

// TestStampedCounted: the listener counts stamped records by reason
// (dualflow_ipfix_records_stamped_total) and logs them once a minute per
// source, and applies Config.Retention.
func TestStampedCounted(t *testing.T) {
	var logs logtest.Buffer
	l, q, _ := startListenerLog(t, Config{UDPAddrs: []string{"127.0.0.1:0", "[::1]:0"}, Retention: 48 * time.Hour}, logs.Logger())
	const n = 5
	for i, a := range l.UDPAddrs() {
		fam := families[i]
		c, err := net.Dial("udp", a.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		sent := time.Now()
		for j := range n {
			// A record without time elements, and one that ended 30 h
			// before its export: older than half the 48 h retention.
			msg := message(1, uint32(2*j), set(2, templateRec(300, fam.src, fam.dst), templateRec(301, fam.src, fam.dst, ieEndMs)),
				set(300, cat(fam.a, fam.b)), set(301, cat(fam.a, fam.b, be64(uint64(sent.Add(-30*time.Hour).UnixMilli())))))
			withExportTime(msg, sent)
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
		}
	}
	recs := collect(t, q, 4*n)
	for _, r := range recs {
		if r.FlowEnd.Before(time.Now().Add(-time.Minute)) || r.FlowStart.After(r.FlowEnd) {
			t.Errorf("record %v>%v: times %v .. %v", r.SrcAddr, r.DstAddr, r.FlowStart, r.FlowEnd)
		}
	}
	eventually(t, "stamped records counted", func() bool {
		return testutil.ToFloat64(l.m.stamped[StampNoTime]) == 2*n && testutil.ToFloat64(l.m.stamped[StampTooOld]) == 2*n
	})
	lines := logs.Lines("stamped")
	if len(lines) != 2 || !strings.Contains(strings.Join(lines, "\n"), "127.0.0.1") || !strings.Contains(strings.Join(lines, "\n"), "::1") {
		t.Errorf("log lines %q, want one per source", lines)
	}
}
