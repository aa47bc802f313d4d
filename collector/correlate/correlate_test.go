package correlate

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/pipeline"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// labInventory is the inventory of the lab's dual-stack 2-node manifest,
// read back from its YAML as `--collector.inventory` is.
func labInventory(t testing.TB) *enrich.Nodes {
	t.Helper()
	m, err := manifest.Generate(manifest.Spec{Mode: manifest.ModeDual, Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := m.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	inv, err := enrich.LoadNodes(file)
	if err != nil {
		t.Fatal(err)
	}
	return inv
}

func TestInventory(t *testing.T) {
	inv := labInventory(t)
	if inv.Len() != 2 {
		t.Fatalf("nodes %d", inv.Len())
	}
	for _, tc := range []struct {
		addr, node string
	}{
		{"198.18.1.10", "node-1"},
		{"198.18.2.11", "node-2"},
		{"198.18.0.2", "node-2"}, // node InternalIP
		{"fd00:10:0:1::10", "node-1"},
		{"fd00:10:0:2::ff", "node-2"},
		{"fd00:10::1", "node-1"},
		{"::ffff:198.18.1.10", "node-1"},
		{"198.19.0.10", ""}, // a ClusterIP: no node
		{"fd00:10:ff::10", ""},
		{"198.19.255.1", ""}, // outside the cluster
	} {
		var got [1]string
		inv.NodesForIPs([]netip.Addr{netip.MustParseAddr(tc.addr)}, got[:])
		if got[0] != tc.node {
			t.Errorf("NodesForIPs(%s) = %q; want %q", tc.addr, got[0], tc.node)
		}
	}
}

var t0 = time.Unix(1_780_000_000, 0)

// half is the record node exports for a connection src→dst.
func half(node, src, dst string, sport, dport uint16, packets uint64) flow.Record {
	return flow.Record{
		FlowStart: t0, FlowEnd: t0.Add(time.Second), TimeReceived: t0.Add(2 * time.Second),
		SrcAddr: netip.MustParseAddr(src), DstAddr: netip.MustParseAddr(dst),
		SrcPort: sport, DstPort: dport, Proto: flow.ProtoTCP,
		Packets: packets, Bytes: packets * 100, PacketsDelta: packets, BytesDelta: packets * 100,
		ReversePackets: packets - 1, ReverseBytes: (packets - 1) * 100,
		EndReason: flow.EndReasonEndOfFlow, ExporterNode: node, Source: "conntrack",
	}
}

type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func newTest(t *testing.T, cfg Config) (*Correlator, *fakeClock) {
	c := New(cfg, labInventory(t), nil)
	clk := &fakeClock{now: t0}
	c.now = clk.Now
	return c, clk
}

func TestCorrelate(t *testing.T) {
	type fam struct{ name, p1, p2, ep2, svc, n1, ext string }
	fams := []fam{
		{"ipv4", "198.18.1.10", "198.18.1.11", "198.18.2.11", "198.19.0.11", "198.18.0.1", "198.19.255.9"},
		{"ipv6", "fd00:10:0:1::10", "fd00:10:0:1::11", "fd00:10:0:2::11", "fd00:10:ff::11", "fd00:10::1", "fd00:10:ffff::9"},
	}
	for _, f := range fams {
		t.Run(f.name+"/merged", func(t *testing.T) {
			c, _ := newTest(t, Config{})
			src := half("node-1", f.p1, f.ep2, 40000, 8080, 10)
			src.Egress.ReportedVerdict = flow.VerdictAllowed
			dst := half("node-2", f.p1, f.ep2, 40000, 8080, 9) // the destination counts fewer
			dst.Ingress.ReportedVerdict, dst.Ingress.ReportedName = flow.VerdictAllowed, "backend/allow-web"
			dst.FlowEnd = t0.Add(3 * time.Second)
			out := c.Add(&src, nil)
			if len(out) != 0 || c.Held() != 1 {
				t.Fatalf("source half not held: out %d held %d", len(out), c.Held())
			}
			out = c.Add(&dst, out)
			if len(out) != 1 || c.Held() != 0 {
				t.Fatalf("not merged: out %d held %d", len(out), c.Held())
			}
			m := out[0]
			if m.Correlation != flow.CorrelationMerged || m.Type != flow.FlowTypeInterNode {
				t.Errorf("correlation %v type %v", m.Correlation, m.Type)
			}
			if m.Packets != 10 || m.PacketsDelta != 10 || m.Bytes != 1000 || m.ReversePackets != 9 {
				t.Errorf("counters not the source's: %d/%d/%d/%d", m.Packets, m.PacketsDelta, m.Bytes, m.ReversePackets)
			}
			if m.ExporterNode != "node-1" || m.Src.NodeName != "node-1" || m.Dst.NodeName != "node-2" {
				t.Errorf("nodes: exporter %q src %q dst %q", m.ExporterNode, m.Src.NodeName, m.Dst.NodeName)
			}
			if m.Ingress.ReportedName != "backend/allow-web" || m.Egress.ReportedVerdict != flow.VerdictAllowed {
				t.Errorf("policy sides: ingress %+v egress %+v", m.Ingress, m.Egress)
			}
			if !m.FlowEnd.Equal(t0.Add(3 * time.Second)) {
				t.Errorf("flow end %v", m.FlowEnd)
			}
		})
		t.Run(f.name+"/service-dnat", func(t *testing.T) {
			c, _ := newTest(t, Config{})
			// Destination half first this time; only the source saw the VIP.
			dst := half("node-2", f.p1, f.ep2, 40001, 8080, 4)
			src := half("node-1", f.p1, f.ep2, 40001, 8080, 4)
			src.ServiceAddr, src.ServicePort = netip.MustParseAddr(f.svc), 80
			out := c.Add(&src, c.Add(&dst, nil))
			if len(out) != 1 || out[0].Correlation != flow.CorrelationMerged {
				t.Fatalf("service halves not merged: %d", len(out))
			}
			if out[0].ServiceAddr != src.ServiceAddr || out[0].ServicePort != 80 {
				t.Errorf("service %v:%d", out[0].ServiceAddr, out[0].ServicePort)
			}
		})
		t.Run(f.name+"/snat", func(t *testing.T) {
			c, _ := newTest(t, Config{})
			src := half("node-1", f.p1, f.ep2, 40002, 8080, 3)
			src.SNATAddr, src.SNATPort = netip.MustParseAddr(f.n1), 61000
			dst := half("node-2", f.n1, f.ep2, 61000, 8080, 3)
			out := c.Add(&dst, c.Add(&src, nil))
			if len(out) != 1 || out[0].Correlation != flow.CorrelationMerged || out[0].SrcAddr != src.SrcAddr {
				t.Fatalf("SNAT halves: %d records %+v", len(out), out)
			}
		})
		t.Run(f.name+"/source-only-after-timeout", func(t *testing.T) {
			c, clk := newTest(t, Config{Timeout: 5 * time.Second})
			src := half("node-1", f.p1, f.ep2, 40003, 8080, 1)
			out := c.Add(&src, nil)
			if out = c.Expire(clk.now.Add(4*time.Second), out); len(out) != 0 {
				t.Fatal("expired early")
			}
			out = c.Expire(clk.now.Add(6*time.Second), out)
			if len(out) != 1 || out[0].Correlation != flow.CorrelationSourceOnly {
				t.Fatalf("want one source-only record, got %+v", out)
			}
		})
		t.Run(f.name+"/dest-only-on-flush", func(t *testing.T) {
			c, _ := newTest(t, Config{})
			dst := half("node-2", f.p1, f.ep2, 40004, 8080, 1)
			out := c.Flush(c.Add(&dst, nil))
			if len(out) != 1 || out[0].Correlation != flow.CorrelationDestOnly {
				t.Fatalf("want one destination-only record, got %+v", out)
			}
		})
		t.Run(f.name+"/not-held", func(t *testing.T) {
			c, _ := newTest(t, Config{})
			intra := half("node-1", f.p1, f.p2, 40005, 8080, 1)
			ext := half("node-1", f.p1, f.ext, 40006, 443, 1)
			in := half("node-2", f.ext, f.ep2, 40007, 8080, 1)
			out := c.Add(&in, c.Add(&ext, c.Add(&intra, nil)))
			if len(out) != 3 || c.Held() != 0 {
				t.Fatalf("out %d held %d", len(out), c.Held())
			}
			for i, want := range []flow.FlowType{flow.FlowTypeIntraNode, flow.FlowTypeToExternal, flow.FlowTypeFromExternal} {
				if out[i].Correlation != flow.CorrelationNone || out[i].Type != want {
					t.Errorf("record %d: correlation %v type %v, want none %v", i, out[i].Correlation, out[i].Type, want)
				}
			}
		})
		t.Run(f.name+"/coalesce-slices", func(t *testing.T) {
			c, _ := newTest(t, Config{})
			s1 := half("node-1", f.p1, f.ep2, 40008, 8080, 5)
			s2 := half("node-1", f.p1, f.ep2, 40008, 8080, 8)
			s2.PacketsDelta, s2.EndReason = 3, flow.EndReasonEndOfFlow
			s1.EndReason = flow.EndReasonActiveTimeout
			d := half("node-2", f.p1, f.ep2, 40008, 8080, 8)
			out := c.Add(&d, c.Add(&s2, c.Add(&s1, nil)))
			if len(out) != 1 || out[0].PacketsDelta != 8 || out[0].Packets != 8 || out[0].EndReason != flow.EndReasonEndOfFlow {
				t.Fatalf("coalesced: %+v", out)
			}
		})
	}
	t.Run("families-never-pair", func(t *testing.T) {
		c, _ := newTest(t, Config{})
		a := half("node-1", "198.18.1.10", "198.18.2.11", 40000, 8080, 1)
		b := half("node-2", "::ffff:198.18.1.10", "fd00:10:0:2::11", 40000, 8080, 1)
		b.Normalize()
		out := c.Add(&b, c.Add(&a, nil))
		if len(out) != 0 || c.Held() != 2 {
			t.Fatalf("v4 and v6 halves paired: out %d held %d", len(out), c.Held())
		}
	})
	t.Run("overflow-flushes-oldest", func(t *testing.T) {
		c, _ := newTest(t, Config{MaxHeld: 2})
		var out []flow.Record
		for i := range 3 {
			r := half("node-1", "198.18.1.10", "198.18.2.11", uint16(40000+i), 8080, 1)
			out = c.Add(&r, out)
		}
		if len(out) != 1 || out[0].SrcPort != 40000 || out[0].Correlation != flow.CorrelationSourceOnly || c.Held() != 2 {
			t.Fatalf("overflow: out %+v held %d", out, c.Held())
		}
	})
}

// runStage starts a Correlator's Run over the lab inventory and returns
// its queues, its pool and the channel Run's error arrives on.
func runStage(t *testing.T, timeout time.Duration) (in, out *pipeline.Queue, pool *pipeline.Pool, done chan error) {
	t.Helper()
	c := New(Config{Timeout: timeout}, labInventory(t), nil)
	pm := pipeline.NewMetrics(nil)
	pool = pipeline.NewPool(16, 64)
	in, out = pipeline.NewQueue("in", 4, pm), pipeline.NewQueue("out", 4, pm)
	done = make(chan error)
	go func() { done <- c.Run(context.Background(), in, out, pool, pm) }()
	return in, out, pool, done
}

// drain reads n records from out (within 5 s), then closes in and waits
// for Run to return.
func drain(t *testing.T, in, out *pipeline.Queue, done chan error, n int) []flow.Record {
	t.Helper()
	var recs []flow.Record
	deadline := time.After(5 * time.Second)
	for len(recs) < n {
		select {
		case ob := <-out.C():
			recs = append(recs, ob.Recs...)
			ob.Release()
		case <-deadline:
			t.Fatalf("timeout after %d records of %d", len(recs), n)
		}
	}
	in.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	return recs
}

func TestRun(t *testing.T) {
	in, out, pool, done := runStage(t, 100*time.Millisecond)
	b := pool.Get()
	b.Recs = append(b.Recs,
		half("node-1", "198.18.1.10", "198.18.2.11", 1, 80, 2),         // merged below
		half("node-2", "198.18.1.10", "198.18.2.11", 1, 80, 2),         //
		half("node-1", "fd00:10:0:1::10", "fd00:10:0:2::11", 2, 80, 2), // source only (timeout)
		half("node-1", "198.18.1.10", "198.18.1.11", 3, 80, 2),         // intra-node
	)
	in.Put(context.Background(), b)
	got := map[flow.Correlation]int{}
	for _, r := range drain(t, in, out, done, 3) {
		got[r.Correlation]++
	}
	if got[flow.CorrelationMerged] != 1 || got[flow.CorrelationSourceOnly] != 1 || got[flow.CorrelationNone] != 1 {
		t.Errorf("got %v", got)
	}
	if _, ok := <-out.C(); ok {
		t.Error("out not closed")
	}
}

func BenchmarkCorrelate(b *testing.B) {
	c := New(Config{}, labInventory(b), nil)
	src := half("node-1", "198.18.1.10", "198.18.2.11", 1, 80, 2)
	dst := half("node-2", "198.18.1.10", "198.18.2.11", 1, 80, 2)
	out := make([]flow.Record, 0, 2)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		src.SrcPort, dst.SrcPort = uint16(i), uint16(i)
		out = c.Add(&dst, c.Add(&src, out[:0]))
	}
	b.ReportMetric(float64(2*b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkRun: the stage's path for records with nothing to pair
// (intra-node: most of them), in batches of 1024: one pod pair (the
// end-to-end benchmark's shape) and varied addresses of both families
// (pods and pod-CIDR addresses of each node); and halves: 512 connections
// between the nodes, each seen by both, merged in the batch.
func BenchmarkRun(b *testing.B) {
	for _, shape := range []string{"one-pair", "varied", "halves"} {
		b.Run(shape, func(b *testing.B) {
			recs := make([]flow.Record, 1024)
			for i := range recs {
				j, k := 2+i%250, 2+(i*7+3)%250
				switch {
				case shape == "one-pair":
					recs[i] = half("node-1", "198.18.1.10", "198.18.1.11", uint16(i), 80, 2)
				case shape == "halves":
					recs[i] = half([]string{"node-1", "node-2"}[i%2], fmt.Sprintf("198.18.1.%d", 2+i/2%250), "198.18.2.10", uint16(i/2), 80, 2)
				case i%2 == 0:
					recs[i] = half("node-1", fmt.Sprintf("198.18.1.%d", j), fmt.Sprintf("198.18.1.%d", k), uint16(i), 80, 2)
				default:
					recs[i] = half("node-2", fmt.Sprintf("fd00:10:0:2::%x", j), fmt.Sprintf("fd00:10:0:2::%x", k), uint16(i), 80, 2)
				}
			}
			ctx := context.Background()
			pm := pipeline.NewMetrics(nil)
			pool := pipeline.NewPool(len(recs), 4)
			in, out := pipeline.NewQueue("in", 2, pm), pipeline.NewQueue("out", 2, pm)
			c := New(Config{}, labInventory(b), nil)
			done := make(chan error, 1)
			go func() { done <- c.Run(ctx, in, out, pool, pm) }()
			b.ReportAllocs()
			for b.Loop() {
				bt := pool.Get()
				bt.Recs = append(bt.Recs[:0], recs...)
				if err := in.Put(ctx, bt); err != nil {
					b.Fatal(err)
				}
				ob := <-out.C()
				if want := len(recs) / map[bool]int{true: 2, false: 1}[shape == "halves"]; len(ob.Recs) != want {
					b.Fatalf("%d records out, want %d", len(ob.Recs), want)
				}
				ob.Release()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
			in.Close()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}

// TestRunPassesThroughInPlace: records with nothing to pair are compacted
// in their own batch while halves around them are held, merged or left
// alone; every record comes out once, with its own fields.
func TestRunPassesThroughInPlace(t *testing.T) {
	in, out, pool, done := runStage(t, 50*time.Millisecond)
	b := pool.Get()
	b.Recs = append(b.Recs,
		half("node-1", "198.18.1.10", "198.18.2.11", 1, 80, 2),          // half: merged with the 4th
		half("node-1", "198.18.1.10", "198.18.1.11", 2, 80, 2),          // intra-node
		half("node-1", "fd00:10:0:1::10", "fd00:10:ffff::1", 3, 443, 2), // to outside
		half("node-2", "198.18.1.10", "198.18.2.11", 1, 80, 2),          // the other half
		half("node-2", "fd00:10:0:2::11", "fd00:10:0:2::12", 5, 53, 2),  // intra-node
		half("node-1", "fd00:10:0:1::10", "fd00:10:0:2::11", 6, 80, 2),  // half: alone (timeout)
		half("node-2", "198.19.255.1", "198.18.2.11", 7, 80, 2),         // from outside
	)
	in.Put(context.Background(), b)
	got := map[uint16]flow.Correlation{}
	for _, r := range drain(t, in, out, done, 6) {
		if _, dup := got[r.SrcPort]; dup {
			t.Errorf("record %d out twice", r.SrcPort)
		}
		got[r.SrcPort] = r.Correlation
	}
	want := map[uint16]flow.Correlation{1: flow.CorrelationMerged, 2: flow.CorrelationNone, 3: flow.CorrelationNone,
		5: flow.CorrelationNone, 6: flow.CorrelationSourceOnly, 7: flow.CorrelationNone}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

// TestRunExporterByAddress: a record that does not name its exporter's
// node (a third-party exporter's) takes it from its exporter's address,
// looked up for the records of a batch that cross between nodes, among
// records that name theirs and records that need no exporter: each half
// pairs with its own other half, in both families.
func TestRunExporterByAddress(t *testing.T) {
	in, out, pool, done := runStage(t, 50*time.Millisecond)
	byAddr := func(r flow.Record, exporter string) flow.Record {
		r.ExporterNode, r.ExporterAddr = "", netip.MustParseAddr(exporter)
		return r
	}
	b := pool.Get()
	b.Recs = append(b.Recs,
		byAddr(half("node-1", "198.18.1.10", "198.18.2.11", 1, 80, 2), "198.18.0.1"),          // source half
		byAddr(half("node-1", "198.18.1.10", "198.18.1.11", 2, 80, 2), "198.18.0.1"),          // intra-node
		half("node-2", "fd00:10:0:1::10", "fd00:10:0:2::11", 3, 80, 2),                        // dest half, named
		byAddr(half("node-2", "198.18.1.10", "198.18.2.11", 1, 80, 2), "198.18.0.2"),          // dest half
		byAddr(half("node-1", "fd00:10:0:1::10", "fd00:10:0:2::11", 3, 80, 2), "fd00:10::1"),  // source half
		byAddr(half("node-2", "fd00:10:0:1::10", "fd00:10:ffff::1", 4, 443, 2), "fd00:10::2"), // to outside
		byAddr(half("node-1", "198.18.1.10", "198.18.2.11", 5, 80, 2), "198.19.255.1"),        // exporter of no node
	)
	in.Put(context.Background(), b)
	got := map[uint16]flow.Correlation{}
	for _, r := range drain(t, in, out, done, 5) {
		got[r.SrcPort] = r.Correlation
		if r.SrcPort == 1 && (r.Src.NodeName != "node-1" || r.Dst.NodeName != "node-2") {
			t.Errorf("merged record's nodes: %q → %q", r.Src.NodeName, r.Dst.NodeName)
		}
	}
	want := map[uint16]flow.Correlation{1: flow.CorrelationMerged, 2: flow.CorrelationNone, 3: flow.CorrelationMerged,
		4: flow.CorrelationNone, 5: flow.CorrelationNone}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("got %v, want %v", got, want)
	}
}
