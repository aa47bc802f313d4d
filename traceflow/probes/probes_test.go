package probes

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/flow"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newAt(cfg Config, c *clock) *Registry {
	r := New(cfg)
	r.now = c.now
	return r
}

var (
	a = netip.MustParseAddr
	// The probes of the tests: a TCP probe to a Service (ClusterIP and
	// port, delivered to one of two endpoints on 8080) and an ICMP echo to
	// a pod, per family.
	svc4 = Sent{TraceID: "tf-0000000000000004", Src: a("198.18.1.10"), SrcPort: 40001, Proto: flow.ProtoTCP,
		Dst: a("198.19.0.10"), DstPort: 80, Targets: []netip.Addr{a("198.18.2.20"), a("198.18.1.21")}, Start: t0, End: t0.Add(3 * time.Second)}
	svc6 = Sent{TraceID: "tf-0000000000000006", Src: a("fd00:10:1::a"), SrcPort: 40001, Proto: flow.ProtoTCP,
		Dst: a("fd00:10:ff::a"), DstPort: 80, Targets: []netip.Addr{a("fd00:10:2::14"), a("fd00:10:1::15")}, Start: t0, End: t0.Add(3 * time.Second)}
	echo4 = Sent{TraceID: "tf-00000000000000e4", Src: a("198.18.1.10"), SrcPort: 777, Proto: flow.ProtoICMP,
		Dst: a("198.18.2.30"), Targets: []netip.Addr{a("198.18.2.30")}, Start: t0, End: t0.Add(3 * time.Second)}
	echo6 = Sent{TraceID: "tf-00000000000000e6", Src: a("fd00:10:1::a"), SrcPort: 777, Proto: flow.ProtoICMPv6,
		Dst: a("fd00:10:2::1e"), Targets: []netip.Addr{a("fd00:10:2::1e")}, Start: t0, End: t0.Add(3 * time.Second)}
)

// rec is a record of the probe s's direction as a conntrack exporter
// reports it: its source, the endpoint reached and the Service translated.
func rec(src netip.Addr, sport uint16, dst netip.Addr, dport uint16, proto uint8) flow.Record {
	r := flow.Record{SrcAddr: src, SrcPort: sport, DstAddr: dst, DstPort: dport, Proto: proto,
		FlowStart: t0.Add(200 * time.Millisecond), FlowEnd: t0.Add(15 * time.Second)}
	r.Normalize()
	return r
}

func withService(r flow.Record, vip netip.Addr, port uint16) flow.Record {
	r.ServiceAddr, r.ServicePort = vip, port
	return r
}

func TestMark(t *testing.T) {
	tests := []struct {
		name string
		rec  flow.Record
		want string
	}{
		{"ipv4 service after DNAT", withService(rec(svc4.Src, 40001, a("198.18.2.20"), 8080, flow.ProtoTCP), svc4.Dst, 80), svc4.TraceID},
		{"ipv6 service after DNAT", withService(rec(svc6.Src, 40001, a("fd00:10:2::14"), 8080, flow.ProtoTCP), svc6.Dst, 80), svc6.TraceID},
		{"ipv4 service not translated yet", rec(svc4.Src, 40001, svc4.Dst, 80, flow.ProtoTCP), svc4.TraceID},
		{"ipv6 service not translated yet", rec(svc6.Src, 40001, svc6.Dst, 80, flow.ProtoTCP), svc6.TraceID},
		{"ipv4 destination node's half: the endpoint only", rec(svc4.Src, 40001, a("198.18.1.21"), 8080, flow.ProtoTCP), svc4.TraceID},
		{"ipv6 destination node's half: the endpoint only", rec(svc6.Src, 40001, a("fd00:10:1::15"), 8080, flow.ProtoTCP), svc6.TraceID},
		{"ipv4 mapped source", rec(a("::ffff:198.18.1.10"), 40001, svc4.Dst, 80, flow.ProtoTCP), svc4.TraceID},
		{"ipv4 echo request", rec(echo4.Src, 777, echo4.Dst, 8<<8, flow.ProtoICMP), echo4.TraceID},
		{"ipv6 echo request", rec(echo6.Src, 777, echo6.Dst, 128<<8, flow.ProtoICMPv6), echo6.TraceID},
		{"ipv4 reply as its own record", rec(a("198.18.2.20"), 8080, svc4.Src, 40001, flow.ProtoTCP), svc4.TraceID},
		{"ipv6 reply as its own record", rec(a("fd00:10:2::14"), 8080, svc6.Src, 40001, flow.ProtoTCP), svc6.TraceID},
		{"ipv4 echo reply as its own record", rec(echo4.Dst, 777, echo4.Src, 0, flow.ProtoICMP), echo4.TraceID},
		{"ipv6 echo reply as its own record", rec(echo6.Dst, 777, echo6.Src, 129<<8, flow.ProtoICMPv6), echo6.TraceID},
		{"ipv4 no start time", func() flow.Record {
			r := rec(svc4.Src, 40001, svc4.Dst, 80, flow.ProtoTCP)
			r.FlowStart = time.Time{}
			return r
		}(), svc4.TraceID},
		{"ipv6 started within the skew", func() flow.Record {
			r := rec(svc6.Src, 40001, svc6.Dst, 80, flow.ProtoTCP)
			r.FlowStart = t0.Add(-DefaultSkew + time.Second)
			return r
		}(), svc6.TraceID},

		{"ipv4 other source port", rec(svc4.Src, 40002, svc4.Dst, 80, flow.ProtoTCP), ""},
		{"ipv6 other source port", rec(svc6.Src, 40002, svc6.Dst, 80, flow.ProtoTCP), ""},
		{"ipv4 other protocol", rec(svc4.Src, 40001, svc4.Dst, 80, flow.ProtoUDP), ""},
		{"ipv6 other destination", rec(svc6.Src, 40001, a("fd00:10:2::99"), 8080, flow.ProtoTCP), ""},
		{"ipv4 the ClusterIP on another port", rec(svc4.Src, 40001, svc4.Dst, 443, flow.ProtoTCP), ""},
		{"ipv6 the same source, the other family's destination", rec(svc6.Src, 40001, svc4.Dst, 80, flow.ProtoTCP), ""},
		{"ipv4 a later connection reusing the port", func() flow.Record {
			r := withService(rec(svc4.Src, 40001, a("198.18.2.20"), 8080, flow.ProtoTCP), svc4.Dst, 80)
			r.FlowStart = t0.Add(time.Minute)
			return r
		}(), ""},
		{"ipv6 a connection before the trace", func() flow.Record {
			r := rec(svc6.Src, 40001, svc6.Dst, 80, flow.ProtoTCP)
			r.FlowStart = t0.Add(-time.Minute)
			return r
		}(), ""},
		{"ipv4 echo of another id", rec(echo4.Src, 778, echo4.Dst, 8<<8, flow.ProtoICMP), ""},
		{"ipv6 a reply from elsewhere", rec(a("fd00:10:2::99"), 8080, svc6.Src, 40001, flow.ProtoTCP), ""},
	}
	c := &clock{t0}
	r := newAt(Config{}, c)
	for _, s := range []Sent{svc4, svc6, echo4, echo6} {
		r.Add(s)
	}
	c.t = t0.Add(20 * time.Second) // the records arrive after the exporters' timeouts
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			recs := []flow.Record{tt.rec}
			n := r.Mark(recs)
			if recs[0].ProbeTraceID != tt.want {
				t.Errorf("ProbeTraceID = %q, want %q", recs[0].ProbeTraceID, tt.want)
			}
			if want := map[bool]int{true: 1, false: 0}[tt.want != ""]; n != want {
				t.Errorf("Mark = %d, want %d", n, want)
			}
		})
	}
}

func TestMarkKeepsMarkedRecords(t *testing.T) {
	r := newAt(Config{}, &clock{t0})
	r.Add(svc4)
	recs := []flow.Record{rec(svc4.Src, 40001, svc4.Dst, 80, flow.ProtoTCP), rec(svc4.Src, 40001, svc4.Dst, 80, flow.ProtoTCP)}
	recs[1].ProbeTraceID = "tf-1111111111111111"
	if n := r.Mark(recs); n != 1 || recs[0].ProbeTraceID != svc4.TraceID || recs[1].ProbeTraceID != "tf-1111111111111111" {
		t.Errorf("Mark = %d, ids %q %q", n, recs[0].ProbeTraceID, recs[1].ProbeTraceID)
	}
	if got := r.marked.Load(); got != 1 {
		t.Errorf("dualflow_traceflow_probe_records_total = %v, want 1", got)
	}
}

// TestSameTupleNewestFirst: two traces with the same source port (a
// request that fixes it) to the same destination, one after the other:
// each record goes to the trace it started in.
func TestSameTupleNewestFirst(t *testing.T) {
	c := &clock{t0}
	r := newAt(Config{Skew: time.Second}, c)
	first, second := svc6, svc6
	second.TraceID, second.Start, second.End = "tf-2222222222222222", t0.Add(time.Minute), t0.Add(time.Minute+3*time.Second)
	r.Add(first)
	c.t = second.Start
	r.Add(second)
	recs := []flow.Record{rec(svc6.Src, 40001, svc6.Dst, 80, flow.ProtoTCP), rec(svc6.Src, 40001, svc6.Dst, 80, flow.ProtoTCP)}
	recs[1].FlowStart = second.Start.Add(100 * time.Millisecond)
	r.Mark(recs)
	if recs[0].ProbeTraceID != first.TraceID || recs[1].ProbeTraceID != second.TraceID {
		t.Errorf("ids %q %q, want %q %q", recs[0].ProbeTraceID, recs[1].ProbeTraceID, first.TraceID, second.TraceID)
	}
}

// TestLinger: a probe's records are marked until Linger past its End,
// then it is forgotten (by Mark as well as by Add).
func TestLinger(t *testing.T) {
	c := &clock{t0}
	r := newAt(Config{Linger: time.Minute}, c)
	r.Add(svc4)
	r.Add(svc6)
	mark := func() string {
		recs := []flow.Record{rec(svc4.Src, 40001, svc4.Dst, 80, flow.ProtoTCP)}
		r.Mark(recs)
		return recs[0].ProbeTraceID
	}
	c.t = svc4.End.Add(time.Minute - time.Millisecond)
	if got := mark(); got != svc4.TraceID || r.Len() != 2 {
		t.Errorf("just before the linger ends: %q, %d remembered", got, r.Len())
	}
	c.t = svc4.End.Add(time.Minute)
	if got := mark(); got != "" || r.Len() != 0 {
		t.Errorf("after the linger: %q, %d remembered, want none", got, r.Len())
	}
	if len(r.byKey) != 0 {
		t.Errorf("%d keys left", len(r.byKey))
	}
}

// TestMax: past Max the oldest probe is forgotten and counted; the
// registry's memory stays bounded over many probes.
func TestMax(t *testing.T) {
	c := &clock{t0}
	r := newAt(Config{Max: 100}, c)
	for i := range 1000 {
		s := svc4
		s.TraceID = fmt.Sprintf("tf-%016x", i)
		s.SrcPort = uint16(30000 + i)
		r.Add(s)
	}
	if r.Len() != 100 || len(r.byKey) != 100 {
		t.Fatalf("%d remembered under %d keys, want 100", r.Len(), len(r.byKey))
	}
	if cap(r.queue) > 400 {
		t.Errorf("queue of capacity %d for 100 probes", cap(r.queue))
	}
	recs := []flow.Record{rec(svc4.Src, 30000, svc4.Dst, 80, flow.ProtoTCP), rec(svc4.Src, 30999, svc4.Dst, 80, flow.ProtoTCP)}
	r.Mark(recs)
	if recs[0].ProbeTraceID != "" || recs[1].ProbeTraceID != fmt.Sprintf("tf-%016x", 999) {
		t.Errorf("oldest %q (want forgotten), newest %q", recs[0].ProbeTraceID, recs[1].ProbeTraceID)
	}
	if got := r.evicted.Load(); got != 900 {
		t.Errorf("dualflow_traceflow_probes_evicted_total = %v, want 900", got)
	}
}

func TestMetrics(t *testing.T) {
	r := New(Config{})
	r.Add(svc4)
	want := `# HELP dualflow_traceflow_probes_tracked Traceflow probes remembered so that their flow records are marked (probe_trace_id).
# TYPE dualflow_traceflow_probes_tracked gauge
dualflow_traceflow_probes_tracked 1
`
	if err := testutil.CollectAndCompare(r, strings.NewReader(want), "dualflow_traceflow_probes_tracked"); err != nil {
		t.Error(err)
	}
}

// BenchmarkMark is the enrichment stage's cost per record: with no probe
// remembered (the common case), with probes remembered that the records
// are not (a trace running: two map lookups per record), and with every
// record a probe's.
func BenchmarkMark(b *testing.B) {
	batch := func(src netip.Addr, dst netip.Addr) []flow.Record {
		recs := make([]flow.Record, 1024)
		for i := range recs {
			recs[i] = rec(src, uint16(20000+i), dst, 8080, flow.ProtoTCP)
		}
		return recs
	}
	probes := func(n int) *Registry {
		r := newAt(Config{}, &clock{t0})
		for i := range n {
			s := svc6
			s.TraceID, s.SrcPort = fmt.Sprintf("tf-%016x", i), uint16(40000+i)
			r.Add(s)
		}
		return r
	}
	for _, bc := range []struct {
		name string
		r    *Registry
		recs []flow.Record
	}{
		{"empty", probes(0), batch(a("198.18.1.10"), a("198.18.2.20"))},
		{"miss-ipv4", probes(100), batch(a("198.18.1.10"), a("198.18.2.20"))},
		{"miss-ipv6", probes(100), batch(a("fd00:10:1::b"), a("fd00:10:2::14"))},
		{"hit-ipv6", probes(1), func() []flow.Record {
			recs := batch(svc6.Src, svc6.Dst)
			for i := range recs {
				recs[i].SrcPort, recs[i].DstPort = 40000, 80
			}
			return recs
		}()},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if bc.r.Mark(bc.recs) > 0 {
					for i := range bc.recs {
						bc.recs[i].ProbeTraceID = ""
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(bc.recs)), "ns/record")
		})
	}
}
