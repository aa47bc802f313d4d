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
func benchFlows(n int) []flow.Record {
	namespaces := []string{"shop", "payments", "monitoring", "kube-system"}
	workloads := []string{"frontend", "cart", "checkout", "prometheus-server", "coredns"}
	start := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	recs := make([]flow.Record, n)
	for i := range recs {
		v6 := i%2 == 1
		ns, wl := namespaces[i%len(namespaces)], workloads[i%len(workloads)]
		src := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		dst := netip.AddrFrom4([4]byte{198, 18, byte(i >> 4), byte(i * 7)})
		svc := netip.AddrFrom4([4]byte{198, 19, 0, byte(i)})
		exp := netip.AddrFrom4([4]byte{198, 18, 255, byte(i % 5)})
		if v6 {
			src = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0x01, byte(i >> 8), 0, 0, 0, 0, 0, 0, 0, 0, byte(i >> 8), byte(i)})
			dst = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0x02, byte(i >> 4), 0, 0, 0, 0, 0, 0, 0, 0, 0x1, byte(i * 7)})
			svc = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0xff, 15: byte(i)})
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
			ExporterAddr: exp, ObservationDomainID: 1, ExporterNode: fmt.Sprintf("worker-%02d", i%5), Source: "conntrack",
			Src: flow.Endpoint{PodNamespace: ns, PodName: fmt.Sprintf("%s-7d9f8c6b5-%05x", wl, i),
				WorkloadKind: "Deployment", WorkloadName: wl, NodeName: fmt.Sprintf("worker-%02d", i%5), Zone: fmt.Sprintf("eu-west-1%c", 'a'+i%3),
				Labels: map[string]string{"app.kubernetes.io/name": wl, "app.kubernetes.io/part-of": ns, "pod-template-hash": "7d9f8c6b5"}},
			Dst: flow.Endpoint{PodNamespace: ns, PodName: fmt.Sprintf("%s-%d", workloads[(i+1)%len(workloads)], i%3),
				WorkloadKind: "StatefulSet", WorkloadName: workloads[(i+1)%len(workloads)], NodeName: fmt.Sprintf("worker-%02d", (i+1)%5),
				Zone:   fmt.Sprintf("eu-west-1%c", 'a'+(i+1)%3),
				Labels: map[string]string{"app.kubernetes.io/name": workloads[(i+1)%len(workloads)], "app.kubernetes.io/part-of": ns, "statefulset.kubernetes.io/pod-name": "x-0"}},
			Service:     flow.Service{Namespace: ns, Name: workloads[(i+1)%len(workloads)], PortName: "http"},
			Type:        flow.FlowTypeInterNode,
			Correlation: flow.CorrelationMerged,
			Ingress:     flow.Policy{Namespace: ns, Name: "allow-" + wl, Rule: 0, Verdict: flow.VerdictAllowed},
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
			w, err := NewWriter(WriterConfig{FlushInterval: time.Hour}, &fakeConn{}, nil, nil)
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
