package flowmetrics

import (
	"fmt"
	"net/netip"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// stream is n records of a 2,000-workload cluster (100 namespaces of 20
// workloads), each workload calling 5 others over both families, TCP and
// UDP, one in 20 denied, one in 4 a connection's first record, one in
// 100 a dual-stack gap.
func stream(n int) []flow.Record {
	recs := make([]flow.Record, n)
	for i := range recs {
		src, dst := i%2000, (i*7+i/2000)%2000
		a, b := netip.AddrFrom4([4]byte{198, 18, byte(src / 256), byte(src)}), netip.AddrFrom4([4]byte{198, 19, byte(dst / 256), byte(dst)})
		if i%2 == 1 {
			a = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 1, 14: byte(src / 256), 15: byte(src)})
			b = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 2, 14: byte(dst / 256), 15: byte(dst)})
		}
		r := flow.Record{SrcAddr: a, DstAddr: b, Proto: flow.ProtoTCP, DstPort: 8080, Packets: 40, PacketsDelta: 10, Bytes: 4000, BytesDelta: 1000,
			ReversePacketsDelta: 8, ReverseBytesDelta: 900,
			Src:     flow.Endpoint{PodNamespace: fmt.Sprintf("ns-%d", src/20), WorkloadKind: "Deployment", WorkloadName: fmt.Sprintf("w-%d", src), NodeName: fmt.Sprintf("node-%d", src%50)},
			Dst:     flow.Endpoint{PodNamespace: fmt.Sprintf("ns-%d", dst/20), WorkloadKind: "Deployment", WorkloadName: fmt.Sprintf("w-%d", dst), NodeName: fmt.Sprintf("node-%d", dst%50)},
			Ingress: flow.Policy{Verdict: flow.VerdictAllowed, Namespace: fmt.Sprintf("ns-%d", dst/20), Name: "allow", Rule: 0},
		}
		if i%3 == 0 {
			r.Proto = flow.ProtoUDP
		}
		if i%4 == 0 {
			r.PacketsDelta = r.Packets
		}
		if i%20 == 0 {
			r.Ingress = flow.Policy{Verdict: flow.VerdictDenied, Namespace: r.Dst.PodNamespace, Name: "default-deny", Rule: -1}
		}
		if i%100 == 0 {
			r.DualStackGap = true // a connection's first record the auditor flagged
		}
		r.Normalize()
		recs[i] = r
	}
	return recs
}

// BenchmarkObserve: the cost per record of the default flow metrics on
// the 2,000-workload stream, in batches of 512 as the enrich stage hands
// them over, once the series exist; series and heap held are reported.
func BenchmarkObserve(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  func() Config
	}{
		{"default", DefaultConfig},
		{"workloads", func() Config { // an operator's opt-in: workload pairs
			c := DefaultConfig()
			c.Metrics = []MetricConfig{{Name: Bytes, Labels: []Label{SrcWorkload, DstWorkload, IPFamily}}}
			return c
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			recs := stream(1 << 16)
			m, err := New(tc.cfg())
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < len(recs); i += 512 {
				m.Observe(recs[i : i+512])
			}
			b.ReportAllocs()
			b.ResetTimer()
			n := 0
			cpu0 := cpuTime()
			for b.Loop() {
				i := n % len(recs)
				m.Observe(recs[i : i+512])
				n += 512
			}
			// CPU time, not wall: the machine is shared, so wall time per
			// record depends on the load.
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(n), "cpu-ns/record")
			series := 0
			for _, t := range m.tables {
				series += len(t.series) * len(t.metrics)
			}
			b.ReportMetric(float64(series), "series")
		})
	}
}

// BenchmarkSeriesMemory: the heap one series holds, from 100,000 distinct
// series of the workload-pair bytes metric.
func BenchmarkSeriesMemory(b *testing.B) {
	const n = 100_000
	recs := stream(n)
	for i := range recs {
		recs[i].Src.WorkloadName = fmt.Sprintf("w-%d", i) // every record its own series
	}
	for b.Loop() {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		m, err := New(Config{Metrics: []MetricConfig{{Name: Bytes, Labels: []Label{SrcWorkload, DstWorkload, IPFamily}}}, MaxSeries: n})
		if err != nil {
			b.Fatal(err)
		}
		m.Observe(recs)
		runtime.GC()
		runtime.ReadMemStats(&after)
		if got := len(m.tables[0].series); got != n {
			b.Fatalf("%d series", got)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "B/series")
		runtime.KeepAlive(m)
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
