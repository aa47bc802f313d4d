package ipfix

import (
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vmware/go-ipfix/pkg/collector"
	"github.com/vmware/go-ipfix/pkg/entities"

	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
	"github.com/dualflow/dualflow/test/support/ipfixreg"
)

// Realistic mix of the benchmarks: our two templates, 60% IPv4 and 40%
// IPv6 records with node names, TCP states and Service/SNAT fields, packed
// as our exporter packs them (one data set per family per message, about
// 8 KiB per message over TCP).
const (
	benchV4PerMsg = 30
	benchV6PerMsg = 20
)

// benchRecords returns n varied records of IP version v.
func benchRecords(v uint8, n int) []flow.Record {
	recs := make([]flow.Record, n)
	start := time.UnixMilli(1_780_000_000_000)
	states := []string{"ESTABLISHED", "TIME_WAIT", "CLOSE", "SYN_SENT"}
	for i := range recs {
		r := &recs[i]
		if v == 4 {
			r.SrcAddr = netip.AddrFrom4([4]byte{198, 18, byte(1 + i%2), byte(i)})
			r.DstAddr = netip.AddrFrom4([4]byte{198, 18, byte(2 - i%2), byte(i * 7)})
		} else {
			r.SrcAddr = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, byte(1 + i%2), 14: byte(i >> 8), 15: byte(i)})
			r.DstAddr = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, byte(2 - i%2), 14: 1, 15: byte(i)})
		}
		r.SrcPort, r.DstPort, r.Proto = uint16(30000+i), 8080, flow.ProtoTCP
		if i%5 == 0 {
			r.Proto, r.TCPState = flow.ProtoUDP, ""
		} else {
			r.TCPState = states[i%len(states)]
		}
		r.FlowStart, r.FlowEnd = start.Add(time.Duration(i)*time.Millisecond), start.Add(time.Second)
		r.Packets, r.Bytes, r.ReversePackets, r.ReverseBytes = uint64(i), uint64(i*100), uint64(i), uint64(i*90)
		r.PacketsDelta, r.BytesDelta = uint64(i), uint64(i*100)
		r.EndReason, r.Type = flow.EndReasonActiveTimeout, flow.FlowTypeInterNode
		r.ExporterNode, r.Source = "node-1", fipfix.SourceConntrack
		r.Src.NodeName, r.Dst.NodeName = "node-1", "node-2"
		if i%4 == 0 {
			if v == 4 {
				r.ServiceAddr = netip.AddrFrom4([4]byte{198, 19, 0, 10})
			} else {
				r.ServiceAddr = netip.MustParseAddr("fd00:10:ff::10")
			}
			r.ServicePort = 80
		}
	}
	return recs
}

// benchMessages returns n messages (the first with the templates) and the
// number of records they hold.
func benchMessages(n int) ([][]byte, int) { return benchStream(n, false) }

// benchStream returns n messages of the mix and the number of records they
// hold. The first message carries the templates. With split, every message
// holds a single set (one template, or one family's data), because
// go-ipfix's collecting process reads only the first set of a message; the
// records are the same.
func benchStream(n int, split bool) ([][]byte, int) {
	e4, e6 := mustEncoder(4, 256), mustEncoder(6, 257)
	r4, r6 := benchRecords(4, benchV4PerMsg), benchRecords(6, benchV6PerMsg)
	var msgs [][]byte
	total := 0
	for i := range n {
		var sets [][]byte
		if i == 0 {
			sets = append(sets, e4.AppendTemplateSet(nil), e6.AppendTemplateSet(nil))
		}
		for _, fam := range []struct {
			e    *fipfix.Encoder
			recs []flow.Record
		}{{e4, r4}, {e6, r6}} {
			data := []byte{0, 0, 0, 0}
			for j := range fam.recs {
				data = fam.e.AppendRecord(data, &fam.recs[j])
			}
			fipfix.PutSetHeader(data, fam.e.TemplateID())
			sets = append(sets, data)
		}
		if split {
			for _, st := range sets {
				msgs = append(msgs, message(1, uint32(total), st))
			}
		} else {
			msgs = append(msgs, message(1, uint32(total), sets...))
		}
		total += benchV4PerMsg + benchV6PerMsg
	}
	return msgs, total
}

// BenchmarkDecode decodes the mix fully typed into flow records on one
// core, in steady state (templates known, records reused).
func BenchmarkDecode(b *testing.B) {
	msgs, _ := benchMessages(64)
	d := NewDecoder()
	s := NewSession(exporterAP, TCP, Limits{})
	dst := make([]flow.Record, 0, benchV4PerMsg+benchV6PerMsg)
	d.Decode(s, msgs[0], now, dst)
	msgs = msgs[1:]
	b.ReportAllocs()
	b.ResetTimer()
	records := 0
	var bytes int64
	for i := 0; b.Loop(); i++ {
		m := msgs[i%len(msgs)]
		var err error
		dst, err = d.Decode(s, m, now, dst[:0])
		if err != nil {
			b.Fatal(err)
		}
		records += len(dst)
		bytes += int64(len(m))
	}
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(records), "ns/record")
	b.SetBytes(bytes / int64(b.N))
}

// BenchmarkGoIPFIXCollector is the reference: go-ipfix v0.17.0's own
// collecting process receiving the same bytes over TCP loopback and
// decoding them into its typed records (entities), not into flow.Records:
// go-ipfix's own speed, the most a collector built on it could reach.
// Compare with BenchmarkDecode and BenchmarkDecodeTCP.
func BenchmarkGoIPFIXCollector(b *testing.B) {
	if err := ipfixreg.Register(); err != nil {
		b.Fatal(err)
	}
	cp, err := collector.InitCollectingProcess(collector.CollectorInput{
		Address: "127.0.0.1:0", Protocol: "tcp", MaxBufferSize: 65535,
		DecodingMode: collector.DecodingModeStrict,
	})
	if err != nil {
		b.Fatal(err)
	}
	go cp.Start()
	defer cp.Stop()
	var addr net.Addr
	for addr = cp.GetAddress(); addr == nil; addr = cp.GetAddress() {
		time.Sleep(time.Millisecond)
	}
	// The first 4 messages are the two templates and the first data of
	// each family; the other 126 are timed.
	msgs, perRun := benchStream(64, true)
	perMsg := benchV4PerMsg + benchV6PerMsg
	conn, err := net.Dial("tcp", addr.String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	send := func(m []byte) {
		if _, err := conn.Write(m); err != nil {
			panic(err)
		}
	}
	for _, m := range msgs[:4] {
		send(m)
	}
	recv := func(n int) int {
		got := 0
		for got < n {
			msg := <-cp.GetMsgChan()
			if msg.GetSet().GetSetType() != entities.Data {
				continue
			}
			got += len(msg.GetSet().GetRecords())
		}
		return got
	}
	recv(perMsg) // the first data of each family
	b.ReportAllocs()
	b.ResetTimer()
	records := 0
	for b.Loop() {
		done := make(chan int)
		go func() { done <- recv(perRun - perMsg) }()
		for _, m := range msgs[4:] {
			send(m)
		}
		records += <-done
	}
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(records), "ns/record")
}

// BenchmarkDecodeTCP is ours over the same TCP loopback path as
// BenchmarkGoIPFIXCollector: framing from a connection, decoding into
// reused batches.
func BenchmarkDecodeTCP(b *testing.B) {
	msgs, perRun := benchMessages(64)
	perMsg := benchV4PerMsg + benchV6PerMsg
	var stream []byte
	for _, m := range msgs[1:] {
		stream = append(stream, m...)
	}
	srv, cli := tcpPair(b)
	defer srv.Close()
	defer cli.Close()
	got := make(chan int, 1)
	go func() {
		r := newFramer(srv)
		d := NewDecoder()
		s := NewSession(exporterAP, TCP, Limits{})
		var dst []flow.Record
		n := -perMsg // the first message, sent before the timer starts
		for {
			m, err := r.next()
			if err != nil {
				return
			}
			dst, _ = d.Decode(s, m, now, dst[:0])
			n += len(dst)
			if n >= perRun-perMsg {
				got <- n
				n = 0
			}
		}
	}()
	if _, err := cli.Write(msgs[0]); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	records := 0
	for b.Loop() {
		if _, err := cli.Write(stream); err != nil {
			b.Fatal(err)
		}
		records += <-got
	}
	b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(records), "ns/record")
}

func tcpPair(tb testing.TB) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	cli, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := ln.Accept()
	if err != nil {
		tb.Fatal(err)
	}
	return srv, cli
}

// BenchmarkDecodeManyNames decodes records that carry names as an Antrea
// exporter sends them (source and destination pod names and namespaces,
// node names, ingress and egress policy names: 8 strings per record) from a
// cluster of pods pods, in steady state. names is the number of distinct
// strings of the stream; allocs/record shows whether the decoder's string
// cache holds them all: it should be 0 for every realistic cluster size.
// The direct-mapped cache this replaced made 0.125 allocations per record
// of a 526-name stream.
func BenchmarkDecodeManyNames(b *testing.B) {
	for _, pods := range []int{526, 2000, 10_000} {
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) {
			msgs, names := manyNamesStream(pods)
			d := NewDecoder()
			s := NewSession(exporterAP, TCP, Limits{})
			dst := make([]flow.Record, 0, manyNamesPerMsg)
			var err error
			for _, m := range msgs { // warm-up: templates, and every name seen once
				if dst, err = d.Decode(s, m[:len(m):len(m)], now, dst[:0]); err != nil {
					b.Fatal(err)
				}
			}
			msgs = msgs[1:]
			b.ReportAllocs()
			b.ResetTimer()
			records := 0
			for i := 0; b.Loop(); i++ {
				dst, err = d.Decode(s, msgs[i%len(msgs)], now, dst[:0])
				if err != nil {
					b.Fatal(err)
				}
				records += len(dst)
			}
			b.StopTimer()
			if records == 0 || dst[0].Src.PodName == "" || dst[0].Ingress.ReportedName == "" {
				b.Fatalf("records without names: %+v", dst[:min(1, len(dst))])
			}
			b.ReportMetric(float64(records)/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(records), "ns/record")
			b.ReportMetric(float64(testing.AllocsPerRun(1, func() {
				for _, m := range msgs {
					dst, _ = d.Decode(s, m, now, dst[:0])
				}
			}))/float64(len(msgs)*manyNamesPerMsg), "allocs/record")
			b.ReportMetric(float64(names), "names")
		})
	}
}

const manyNamesPerMsg = 40

// manyNamesStream returns messages (the first holding the template) whose
// records go from each of pods pods to three others, and the number of
// distinct names they carry (manyNames: pods, namespaces, nodes, policies).
func manyNamesStream(pods int) ([][]byte, int) {
	const tid = 300
	ant := func(id uint16) fs { return fs{fipfix.EnterpriseAntrea, id, 0xffff} }
	tmpl := set(fipfix.TemplateSetID, templateRec(tid,
		fs{0, 8, 4}, fs{0, 12, 4}, fs{0, 7, 2}, fs{0, 11, 2}, fs{0, 4, 1}, // addresses, ports, protocol
		fs{0, 152, 8}, fs{0, 153, 8}, fs{0, 2, 8}, fs{0, 1, 8}, // flow start and end ms, packet and octet deltas
		ant(100), ant(101), ant(102), ant(103), // source and destination pod namespace and name
		ant(104), ant(105), ant(110), ant(112), // node names, ingress and egress policy
	))
	names := manyNames(pods)
	namespaces, nodes, policies := names[pods:pods+20], names[pods+20:pods+120], names[pods+120:]
	str := func(s string) []byte { return varString(s, false) }
	var msgs [][]byte
	var recs [][]byte
	seq := uint32(0)
	flush := func(withTemplate bool) {
		sets := [][]byte{}
		if withTemplate {
			sets = append(sets, tmpl)
		}
		if len(recs) > 0 {
			sets = append(sets, set(tid, recs...))
		}
		msgs = append(msgs, message(1, seq, sets...))
		seq += uint32(len(recs))
		recs = recs[:0]
	}
	flush(true)
	t0 := uint64(1_780_000_000_000)
	for i := range 3 * pods {
		src, dst := i%pods, (i%pods*7+1+i/pods)%pods
		recs = append(recs, cat(
			[]byte{198, 18, byte(src >> 8), byte(src)}, []byte{198, 18, byte(dst >> 8), byte(dst)},
			be16(uint16(30000+i)), be16(8080), []byte{6},
			be64(t0+uint64(i)), be64(t0+uint64(i)+1000), be64(10), be64(1500),
			str(namespaces[src%20]), str(names[src]), str(namespaces[dst%20]), str(names[dst]),
			str(nodes[src%100]), str(nodes[dst%100]), str(policies[dst%len(policies)]), str(policies[src%len(policies)]),
		))
		if len(recs) == manyNamesPerMsg {
			flush(false)
		}
	}
	if len(recs) > 0 {
		flush(false)
	}
	return msgs, len(names)
}

// manyNames returns the names of a cluster of pods pods: pod names,
// namespaces, nodes and policies, as an exporter reports them.
func manyNames(pods int) []string {
	var names []string
	for i := range pods {
		names = append(names, podName(i))
	}
	for i := range 20 {
		names = append(names, fmt.Sprintf("team-%02d", i))
	}
	for i := range 100 {
		names = append(names, fmt.Sprintf("ip-10-0-%d-%d.eu-west-1.compute.internal", i/8, i))
	}
	for i := range pods / 10 {
		names = append(names, fmt.Sprintf("allow-ingress-%04d", i))
	}
	return names
}

// podName is pod i's name: a Deployment's, with its ReplicaSet's hash and a
// random suffix.
func podName(i int) string {
	const letters = "bcdfghjklmnpqrstvwxz2456789"
	suffix := make([]byte, 5)
	for k, x := 0, uint32(i)*2654435761; k < 5; k, x = k+1, x/27 {
		suffix[k] = letters[x%27]
	}
	return fmt.Sprintf("workload-%03d-%08x-%s", i/7, uint32(i/7)*40503, suffix)
}
