package enrich

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/traceflow/probes"
)

// TestEnrichMarksProbes: with a probe registry set, the enrichment marks
// the records of the probes it remembers (IPv4 and IPv6, a Service's
// probe after DNAT), batch or one by one, and only those.
func TestEnrichMarksProbes(t *testing.T) {
	e, err := NewForClient(testConfig(), nil, nil, discard())
	if err != nil {
		t.Fatal(err)
	}
	reg := probes.New(probes.Config{})
	start := time.Now()
	for _, s := range []probes.Sent{
		{TraceID: "tf-0000000000000004", Src: ip("198.18.1.10"), SrcPort: 41000, Proto: flow.ProtoTCP, Dst: ip("198.19.0.10"), DstPort: 80,
			Targets: []netip.Addr{ip("198.18.2.20")}, Start: start, End: start.Add(3 * time.Second)},
		{TraceID: "tf-0000000000000006", Src: ip("fd00:10:1::a"), SrcPort: 41000, Proto: flow.ProtoTCP, Dst: ip("fd00:10:ff::a"), DstPort: 80,
			Targets: []netip.Addr{ip("fd00:10:2::14")}, Start: start, End: start.Add(3 * time.Second)},
	} {
		reg.Add(s)
	}
	recs := func() []flow.Record {
		return []flow.Record{
			{SrcAddr: ip("198.18.1.10"), SrcPort: 41000, DstAddr: ip("198.18.2.20"), DstPort: 8080, ServiceAddr: ip("198.19.0.10"), ServicePort: 80, Proto: flow.ProtoTCP, FlowStart: start},
			{SrcAddr: ip("fd00:10:1::a"), SrcPort: 41000, DstAddr: ip("fd00:10:2::14"), DstPort: 8080, ServiceAddr: ip("fd00:10:ff::a"), ServicePort: 80, Proto: flow.ProtoTCP, FlowStart: start},
			{SrcAddr: ip("198.18.1.10"), SrcPort: 41001, DstAddr: ip("198.18.2.20"), DstPort: 8080, ServiceAddr: ip("198.19.0.10"), ServicePort: 80, Proto: flow.ProtoTCP, FlowStart: start},
			{SrcAddr: ip("fd00:10:1::a"), SrcPort: 41001, DstAddr: ip("fd00:10:2::14"), DstPort: 8080, Proto: flow.ProtoTCP, FlowStart: start},
		}
	}
	want := []string{"tf-0000000000000004", "tf-0000000000000006", "", ""}
	check := func(how string, got []flow.Record) {
		t.Helper()
		for i := range got {
			if got[i].ProbeTraceID != want[i] {
				t.Errorf("%s: record %d (%s:%d -> %s) marked %q, want %q", how, i, got[i].SrcAddr, got[i].SrcPort, got[i].DstAddr, got[i].ProbeTraceID, want[i])
			}
		}
	}
	batch := recs()
	e.Enrich(batch)
	for i := range batch {
		if batch[i].ProbeTraceID != "" {
			t.Fatalf("record %d marked without a registry", i)
		}
	}
	e.SetProbes(reg)
	batch = recs()
	e.Enrich(batch)
	check("EnrichBatch", batch)
	one := recs()
	for i := range one {
		e.enrichOne(&one[i])
	}
	check("Enrich", one)
	// Marking allocates nothing, one by one or by batch.
	r, batch := recs()[1], recs()
	if n := testing.AllocsPerRun(100, func() {
		rec := r
		e.enrichOne(&rec)
		e.Enrich(batch)
	}); n != 0 {
		t.Errorf("%v allocations", n)
	}
}

// BenchmarkEnrichProbes is the marking's share of the enrichment of a
// batch: no registry, an empty one (no trace ran for minutes), and one
// remembering 100 probes (traces running) that the records are not.
func BenchmarkEnrichProbes(b *testing.B) {
	e := benchIndex()
	defer e.SetProbes(nil)
	recs := benchRecords("service", true, 1024)
	busy := probes.New(probes.Config{})
	now := time.Now()
	for i := range 100 {
		busy.Add(probes.Sent{TraceID: fmt.Sprintf("tf-%016x", i), Src: benchPodAddr(i, true), SrcPort: uint16(50000 + i), Proto: flow.ProtoTCP,
			Dst: benchSvcAddr(i, true), DstPort: 80, Start: now, End: now.Add(3 * time.Second)})
	}
	for _, bc := range []struct {
		name string
		reg  *probes.Registry
	}{{"none", nil}, {"empty", probes.New(probes.Config{})}, {"100-probes", busy}} {
		b.Run(bc.name, func(b *testing.B) {
			if bc.reg != nil {
				e.SetProbes(bc.reg)
			} else {
				e.SetProbes(nil)
			}
			b.ReportAllocs()
			for b.Loop() {
				e.Enrich(recs)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
		})
	}
}
