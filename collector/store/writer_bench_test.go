package store

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// benchFlows returns n realistic records: half IPv4, half IPv6, pods with
// namespaces, generated names, three labels, workloads, nodes, zones and
// policy names; one in eight goes to an external address.
func benchFlows(n int) []flow.Record { return benchFlowsShape(n, benchSrcPods) }

// benchSrcPods is the cluster shape of the benchmark flows: 2,000 source
// pods (5 workloads in 4 namespaces), each talking to 3 destination pods,
// so 6,000 pod pairs, dual-stack, with Services and policies. Every record
// is a distinct connection (its own source port). Real flow streams repeat
// pods and pod pairs like this, and the rollups' cost depends on it.
const benchSrcPods = 2000

// benchFlowsShape returns n flows from srcPods source pods; srcPods 0 makes
// every record come from a pod of its own (the rollups' worst case).
func benchFlowsShape(n, srcPods int) []flow.Record {
	namespaces := []string{"shop", "payments", "monitoring", "kube-system"}
	workloads := []string{"frontend", "cart", "checkout", "prometheus-server", "coredns"}
	start := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	// Records share one map per label set, as enrichment's are (it interns
	// them).
	sets := map[string]map[string]string{}
	labels := func(m map[string]string) map[string]string {
		k := fmt.Sprint(m)
		if s, ok := sets[k]; ok {
			return s
		}
		sets[k] = m
		return m
	}
	// And one string per value, as the enricher's pods and nodes and the
	// decoder's interned names give every record of the same pod or node.
	strs := map[string]string{}
	str := func(v string) string {
		if s, ok := strs[v]; ok {
			return s
		}
		strs[v] = v
		return v
	}
	recs := make([]flow.Record, n)
	for i := range recs {
		v6 := i%2 == 1
		ns, wl := namespaces[i%len(namespaces)], workloads[i%len(workloads)]
		p := i // source pod
		if srcPods > 0 {
			p = i % srcPods
		}
		q := i % 15 // destination pod: workload (i+1)%5, replica i%3
		src := netip.AddrFrom4([4]byte{198, 18, byte(p >> 8), byte(p)})
		dst := netip.AddrFrom4([4]byte{198, 18, 200, byte(q)})
		svc := netip.AddrFrom4([4]byte{198, 19, 0, byte(i % 5)})
		exp := netip.AddrFrom4([4]byte{198, 18, 255, byte(i % 5)})
		if v6 {
			src = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0x01, byte(p >> 16), 0, 0, 0, 0, 0, 0, 0, 0, byte(p >> 8), byte(p)})
			dst = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x1, byte(q)})
			svc = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0xff, 15: byte(i % 5)})
			exp = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 15: byte(i % 5)})
		}
		t0 := start.Add(time.Duration(i) * time.Millisecond)
		r := flow.Record{
			FlowStart: t0, FlowEnd: t0.Add(10 * time.Second), TimeReceived: t0.Add(11 * time.Second),
			SrcAddr: src, DstAddr: dst, SrcPort: uint16(32768 + i), DstPort: 8080, Proto: flow.ProtoTCP,
			ServiceAddr: svc, ServicePort: 80,
			Packets: 120, Bytes: 15000, ReversePackets: 100, ReverseBytes: 90000,
			PacketsDelta: 12, BytesDelta: 1500, ReversePacketsDelta: 10, ReverseBytesDelta: 9000,
			EndReason: flow.EndReasonActiveTimeout, TCPState: "ESTABLISHED", Mark: 0x42,
			ExporterAddr: exp, ObservationDomainID: 1, ExporterNode: str(fmt.Sprintf("worker-%02d", i%5)), Source: "conntrack",
			Src: flow.Endpoint{PodNamespace: ns, PodName: str(fmt.Sprintf("%s-7d9f8c6b5-%05x", wl, p)),
				WorkloadKind: "Deployment", WorkloadName: wl, NodeName: str(fmt.Sprintf("worker-%02d", i%5)), Zone: str(fmt.Sprintf("eu-west-1%c", 'a'+i%3)),
				Labels: labels(map[string]string{"app.kubernetes.io/name": wl, "app.kubernetes.io/part-of": ns, "pod-template-hash": "7d9f8c6b5"})},
			Dst: flow.Endpoint{PodNamespace: ns, PodName: str(fmt.Sprintf("%s-%d", workloads[(i+1)%len(workloads)], i%3)),
				WorkloadKind: "StatefulSet", WorkloadName: workloads[(i+1)%len(workloads)], NodeName: str(fmt.Sprintf("worker-%02d", (i+1)%5)),
				Zone:   str(fmt.Sprintf("eu-west-1%c", 'a'+(i+1)%3)),
				Labels: labels(map[string]string{"app.kubernetes.io/name": workloads[(i+1)%len(workloads)], "app.kubernetes.io/part-of": ns, "statefulset.kubernetes.io/pod-name": "x-0"})},
			Service:     flow.Service{Namespace: ns, Name: workloads[(i+1)%len(workloads)], PortName: "http"},
			Type:        flow.FlowTypeInterNode,
			Correlation: flow.CorrelationMerged,
			Ingress:     flow.Policy{Namespace: ns, Name: str("allow-" + wl), Rule: 0, Verdict: flow.VerdictAllowed},
			Egress:      flow.Policy{Namespace: ns, Name: "default-egress", Rule: 1, Verdict: flow.VerdictAllowed},
		}
		if i%8 == 7 { // to an external address: no destination metadata
			r.DstAddr = netip.MustParseAddr("198.19.255.10")
			if v6 {
				r.DstAddr = netip.MustParseAddr("fd00:10:ffff::10")
			}
			r.Dst, r.Service, r.ServiceAddr, r.ServicePort = flow.Endpoint{}, flow.Service{}, netip.Addr{}, 0
			r.Type = flow.FlowTypeToExternal
		}
		r.Normalize()
		recs[i] = r
	}
	return recs
}

// discardColumns is a Conn that takes the writer's columnar batches and
// drops them, as every backend of the product takes them.
type discardColumns struct{ *fakeConn }

func (discardColumns) insertColumns(context.Context, string, string, *nativeBuilder) error {
	return nil
}

// BenchmarkWriterWrite measures the Write path (encode into the current
// batch, seal, hand to the sender) with a Conn that discards the batches.
// An op is one Write call of chunk records.
func BenchmarkWriterWrite(b *testing.B) {
	recs := benchFlows(4096)
	var encoded []byte
	for i := range recs {
		encoded = AppendFlowRow(encoded, &recs[i])
	}
	bytesPerRow := float64(len(encoded)) / float64(len(recs))

	for _, chunk := range []int{1, 256} {
		b.Run(fmt.Sprintf("chunk=%d", chunk), func(b *testing.B) {
			w, err := NewWriter(WriterConfig{FlushInterval: time.Hour}, discardColumns{&fakeConn{}}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx) }()
			// Warm up: fill the batch buffers once so the loop measures the
			// steady state, where they are reused.
			for i := 0; i < 6*DefaultBatchRows; i += len(recs) {
				if err := w.Write(ctx, recs); err != nil {
					b.Fatal(err)
				}
			}

			b.ReportAllocs()
			b.ResetTimer()
			rows, off := 0, 0
			for b.Loop() {
				if off+chunk > len(recs) {
					off = 0
				}
				if err := w.Write(ctx, recs[off:off+chunk]); err != nil {
					b.Fatal(err)
				}
				off += chunk
				rows += chunk
			}
			b.StopTimer()
			b.ReportMetric(float64(rows)/b.Elapsed().Seconds(), "rows/s")
			b.ReportMetric(bytesPerRow, "B/row")
			cancel()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}
