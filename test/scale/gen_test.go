package main

import (
	"reflect"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// These tests need no engine: they check the generator, not the load
// (which runs only through the command, never under go test).

func TestClusterShape(t *testing.T) {
	c := NewCluster(DefaultShape, 1)
	if len(c.Pods) != 2000 || len(c.Namespaces) != 40 || len(c.Services) != 300 || len(c.Nodes) != 50 {
		t.Fatalf("shape: %d pods, %d namespaces, %d Services, %d nodes", len(c.Pods), len(c.Namespaces), len(c.Services), len(c.Nodes))
	}
	fams := map[int]int{}
	for _, ns := range c.Namespaces {
		fams[c.Family[ns]]++
	}
	if fams[46] == 0 || fams[4] == 0 || fams[6] == 0 {
		t.Errorf("families per namespace %v: want dual-stack and both single stacks", fams)
	}
	if len(c.Policies()) == 0 {
		t.Error("no NetworkPolicies")
	}
}

func TestGeneratorDeterministicLabOnly(t *testing.T) {
	end := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	const n = 200_000
	gen := func() *Generator { return NewGenerator(NewCluster(DefaultShape, 7), 7, n, end, 7*24*time.Hour) }
	a, b := gen(), gen()
	var ra, rb flow.Record
	verdicts := map[flow.Verdict]int{}
	fams := map[uint8]int{}
	protos := map[uint8]int{}
	var prev time.Time
	for i := int64(0); i < n; i++ {
		a.Fill(&ra, i)
		b.Fill(&rb, i)
		if !reflect.DeepEqual(ra, rb) {
			t.Fatalf("row %d differs between two generators of one seed:\n%+v\n%+v", i, ra, rb)
		}
		for _, x := range []struct {
			name string
			ok   bool
		}{{"src", inLab(ra.SrcAddr)}, {"dst", inLab(ra.DstAddr)}, {"service", inLab(ra.ServiceAddr)}, {"snat", inLab(ra.SNATAddr)}, {"exporter", inLab(ra.ExporterAddr)}} {
			if !x.ok {
				t.Fatalf("row %d: %s address outside the lab ranges: %+v", i, x.name, ra)
			}
		}
		if !ra.SrcAddr.IsValid() || !ra.DstAddr.IsValid() || ra.IPVersion != flow.Version(ra.DstAddr) {
			t.Fatalf("row %d: addresses %v → %v, version %d", i, ra.SrcAddr, ra.DstAddr, ra.IPVersion)
		}
		if ra.FlowEnd.Before(end.Add(-7*24*time.Hour)) || ra.FlowEnd.After(end) {
			t.Fatalf("row %d: flow_end %v outside the 7 days", i, ra.FlowEnd)
		}
		if !prev.IsZero() && ra.FlowEnd.Before(prev.Add(-2*time.Second)) {
			t.Fatalf("row %d: flow_end %v goes back from %v", i, ra.FlowEnd, prev)
		}
		prev = ra.FlowEnd
		v := ra.Ingress.Verdict
		if ra.Egress.Verdict == flow.VerdictDenied {
			v = flow.VerdictDenied
		}
		verdicts[v]++
		fams[ra.IPVersion]++
		protos[ra.Proto]++
	}
	dropped := float64(verdicts[flow.VerdictDenied]+verdicts[flow.VerdictRejected]) / n
	if dropped < 0.005 || dropped > 0.15 {
		t.Errorf("dropped share %.3f (verdicts %v): want a few percent", dropped, verdicts)
	}
	if fams[4] < n/4 || fams[6] < n/4 {
		t.Errorf("families %v: want both well represented", fams)
	}
	if protos[flow.ProtoUDP] == 0 || protos[flow.ProtoTCP] == 0 {
		t.Errorf("protocols %v", protos)
	}
	t.Logf("verdicts %v, families %v, protocols %v", verdicts, fams, protos)
}

func BenchmarkFill(b *testing.B) {
	g := NewGenerator(NewCluster(DefaultShape, 1), 1, 1<<30, time.Now(), 7*24*time.Hour)
	var r flow.Record
	i := int64(0)
	for b.Loop() {
		g.Fill(&r, i)
		i++
	}
}
