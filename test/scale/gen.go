package main

import (
	"math/rand/v2"
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// Generator produces the rows of a data set in flow_end order, as a
// collector would write them: row i of n ends at End - Span + i*Span/n
// (plus up to a second of jitter). The same (cluster, seed, n, end, span)
// gives the same rows.
type Generator struct {
	c     *Cluster
	rng   *rand.Rand
	n     int64
	start time.Time
	span  time.Duration
}

// NewGenerator returns the generator of n rows over span ending at end.
func NewGenerator(c *Cluster, seed uint64, n int64, end time.Time, span time.Duration) *Generator {
	return &Generator{c: c, rng: rand.New(rand.NewPCG(seed, 0xf10)), n: n, start: end.Add(-span), span: span}
}

var tcpStates = []string{"ESTABLISHED", "ESTABLISHED", "ESTABLISHED", "TIME_WAIT", "CLOSE_WAIT", "SYN_SENT"}

// Fill writes row i into r.
func (g *Generator) Fill(r *flow.Record, i int64) {
	rng, c := g.rng, g.c
	e := c.pickEdge(rng)
	fam := e.Fams[0]
	if len(e.Fams) == 2 && rng.IntN(5) >= 3 { // 60% IPv4 on dual-stack edges
		fam = e.Fams[1]
	}
	src := e.Src.Pods[rng.IntN(len(e.Src.Pods))]
	off := time.Duration(float64(g.span) * float64(i) / float64(g.n))
	end := g.start.Add(off + time.Duration(rng.IntN(1000))*time.Millisecond).Truncate(time.Millisecond)
	if end.After(g.start.Add(g.span)) {
		end = g.start.Add(g.span)
	}
	dur := time.Duration(rng.IntN(300_000)) * time.Millisecond
	*r = flow.Record{
		FlowStart: end.Add(-dur), FlowEnd: end, TimeReceived: end.Add(time.Duration(500+rng.IntN(2500)) * time.Millisecond),
		SrcPort: uint16(32768 + rng.IntN(28231)), Proto: flow.ProtoTCP,
		ExporterNode: src.Node.Name, Source: "conntrack", ObservationDomainID: 1,
		Src: flow.Endpoint{PodNamespace: src.Namespace, PodName: src.Name, WorkloadKind: e.Src.Kind, WorkloadName: e.Src.Name,
			NodeName: src.Node.Name, Zone: src.Node.Zone, Labels: src.Labels},
		Mark: uint32(rng.IntN(4)),
	}
	if fam == 4 {
		r.SrcAddr, r.ExporterAddr = src.Addr4, src.Node.Addr4
	} else {
		r.SrcAddr, r.ExporterAddr = src.Addr6, src.Node.Addr6
	}
	// Counters: deltas since the previous record, totals a few records'
	// worth; heavy-tailed sizes.
	pk := uint64(1 + rng.ExpFloat64()*40)
	rpk := uint64(float64(pk) * (0.5 + rng.Float64()))
	r.PacketsDelta, r.BytesDelta = pk, pk*uint64(60+rng.IntN(1400))
	r.ReversePacketsDelta, r.ReverseBytesDelta = rpk, rpk*uint64(60+rng.IntN(1400))
	k := uint64(1 + rng.IntN(5))
	r.Packets, r.Bytes, r.ReversePackets, r.ReverseBytes = pk*k, r.BytesDelta*k, rpk*k, r.ReverseBytesDelta*k
	switch x := rng.IntN(100); {
	case x < 60:
		r.EndReason = flow.EndReasonActiveTimeout
	case x < 95:
		r.EndReason = flow.EndReasonEndOfFlow
	default:
		r.EndReason = flow.EndReasonIdleTimeout
	}
	if e.Egress {
		r.Egress = flow.Policy{Namespace: src.Namespace, Name: "allow-egress", Rule: 0, Verdict: flow.VerdictAllowed, ReportedVerdict: flow.VerdictAllowed}
	} else {
		r.Egress = flow.Policy{Rule: -1, Verdict: flow.VerdictNotIsolated, ReportedVerdict: flow.VerdictNotIsolated}
	}
	if e.External {
		ext := c.External4
		if fam == 6 {
			ext = c.External6
		}
		r.DstAddr, r.DstPort = ext[rng.IntN(len(ext))], 443
		r.Type, r.Correlation = flow.FlowTypeToExternal, flow.CorrelationNone
		r.Ingress = flow.Policy{Rule: -1}
		r.TCPState = tcpStates[rng.IntN(len(tcpStates))]
		r.Normalize()
		return
	}
	dst := e.Dst.Pods[rng.IntN(len(e.Dst.Pods))]
	if fam == 4 {
		r.DstAddr = dst.Addr4
	} else {
		r.DstAddr = dst.Addr6
	}
	r.DstPort, r.Proto = e.Dst.Port, e.Dst.Proto
	if rng.IntN(200) == 0 { // a ping now and then
		r.Proto, r.SrcPort, r.DstPort = flow.ProtoICMP, uint16(rng.IntN(65536)), 8<<8
		if fam == 6 {
			r.Proto, r.DstPort = flow.ProtoICMPv6, 128<<8
		}
	}
	if r.Proto == flow.ProtoTCP {
		r.TCPState = tcpStates[rng.IntN(len(tcpStates))]
	}
	r.Dst = flow.Endpoint{PodNamespace: dst.Namespace, PodName: dst.Name, WorkloadKind: e.Dst.Kind, WorkloadName: e.Dst.Name,
		NodeName: dst.Node.Name, Zone: dst.Node.Zone, Labels: dst.Labels}
	if e.Svc != nil && r.Proto != flow.ProtoICMP && r.Proto != flow.ProtoICMPv6 {
		if fam == 4 {
			r.ServiceAddr = e.Svc.VIP4
		} else {
			r.ServiceAddr = e.Svc.VIP6
		}
		r.ServicePort = e.Svc.Port
		r.Service = flow.Service{Namespace: e.Svc.Namespace, Name: e.Svc.Name, PortName: e.Dst.PortName}
	}
	if src.Node == dst.Node {
		r.Type, r.Correlation = flow.FlowTypeIntraNode, flow.CorrelationNone
	} else {
		r.Type, r.Correlation = flow.FlowTypeInterNode, flow.CorrelationMerged
		if x := rng.IntN(100); x == 0 {
			r.Correlation = flow.CorrelationSourceOnly
		} else if x == 1 {
			r.Correlation = flow.CorrelationDestOnly
		}
	}
	pol := flow.Policy{Rule: -1}
	switch e.Verdict[fam] {
	case edgeNotIsolated:
		pol.Verdict = flow.VerdictNotIsolated
	case edgeAllowed:
		pol = flow.Policy{Namespace: dst.Namespace, Name: "allow-" + e.Dst.Name, Rule: e.Rule, Verdict: flow.VerdictAllowed}
	case edgeDenied:
		pol = flow.Policy{Namespace: dst.Namespace, Name: "allow-" + e.Dst.Name, Rule: -1, Verdict: flow.VerdictDenied}
	case edgeRejected:
		pol = flow.Policy{Namespace: dst.Namespace, Name: "allow-" + e.Dst.Name, Rule: -1, Verdict: flow.VerdictRejected}
	}
	pol.ReportedVerdict = pol.Verdict
	if rng.IntN(1000) == 0 { // the datapath disagrees now and then
		pol.ReportedVerdict = flow.VerdictAllowed
		if pol.Verdict == flow.VerdictAllowed || pol.Verdict == flow.VerdictNotIsolated {
			pol.ReportedVerdict = flow.VerdictDenied
		}
	}
	if pol.Verdict == flow.VerdictDenied || pol.Verdict == flow.VerdictRejected {
		r.TCPState, r.ReversePacketsDelta, r.ReverseBytesDelta, r.ReversePackets, r.ReverseBytes = "SYN_SENT", 0, 0, 0, 0
		if r.Proto != flow.ProtoTCP {
			r.TCPState = ""
		}
	}
	r.Ingress = pol
	r.K8sViewStale = rng.IntN(10000) == 0
	r.Normalize()
}

// inLab reports whether a is inside the lab ranges (or absent).
func inLab(a netip.Addr) bool {
	if !a.IsValid() {
		return true
	}
	a = a.Unmap()
	if a.Is4() {
		return labV4.Contains(a)
	}
	return labV6.Contains(a)
}
