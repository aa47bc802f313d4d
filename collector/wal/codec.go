package wal

import (
	"encoding/binary"
	"errors"
	"math"
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// The record encoding: every field of flow.Record but Journal,
// K8sViewStale and ProbeTraceID (enrichment sets them, after the journal;
// a replayed record is enriched again), in declaration order. Integers are varints, strings and maps are
// length-prefixed, addresses are a length byte (0, 4 or 16) and the bytes,
// times are a varint of Unix nanoseconds with math.MinInt64 for the zero
// time. TestCodecRoundTripEveryField fails when a field is added to the
// record and not here.

var errShort = errors.New("wal: record truncated")

func appendRecord(b []byte, r *flow.Record) []byte {
	b = appendTime(b, r.FlowStart)
	b = appendTime(b, r.FlowEnd)
	b = appendTime(b, r.TimeReceived)
	b = appendAddr(b, r.SrcAddr)
	b = appendAddr(b, r.DstAddr)
	b = binary.AppendUvarint(b, uint64(r.SrcPort))
	b = binary.AppendUvarint(b, uint64(r.DstPort))
	b = append(b, r.Proto, r.IPVersion)
	b = appendAddr(b, r.ServiceAddr)
	b = binary.AppendUvarint(b, uint64(r.ServicePort))
	b = appendAddr(b, r.SNATAddr)
	b = binary.AppendUvarint(b, uint64(r.SNATPort))
	for _, v := range [...]uint64{r.Packets, r.Bytes, r.ReversePackets, r.ReverseBytes,
		r.PacketsDelta, r.BytesDelta, r.ReversePacketsDelta, r.ReverseBytesDelta} {
		b = binary.AppendUvarint(b, v)
	}
	b = append(b, byte(r.EndReason))
	b = appendString(b, r.TCPState)
	b = binary.AppendUvarint(b, uint64(r.Zone))
	b = binary.AppendUvarint(b, uint64(r.Mark))
	b = appendAddr(b, r.ExporterAddr)
	b = binary.AppendUvarint(b, uint64(r.ObservationDomainID))
	b = appendString(b, r.ExporterNode)
	b = appendString(b, r.Source)
	b = appendEndpoint(b, &r.Src)
	b = appendEndpoint(b, &r.Dst)
	b = appendString(b, r.Service.Namespace)
	b = appendString(b, r.Service.Name)
	b = appendString(b, r.Service.PortName)
	b = append(b, byte(r.Type), byte(r.Correlation))
	b = appendPolicy(b, &r.Ingress)
	b = appendPolicy(b, &r.Egress)
	return b
}

func appendTime(b []byte, t time.Time) []byte {
	if t.IsZero() {
		return binary.AppendVarint(b, math.MinInt64)
	}
	return binary.AppendVarint(b, t.UnixNano())
}

func appendAddr(b []byte, a netip.Addr) []byte {
	switch {
	case !a.IsValid():
		return append(b, 0)
	case a.Is4():
		v := a.As4()
		return append(append(b, 4), v[:]...)
	default:
		v := a.As16()
		return append(append(b, 16), v[:]...)
	}
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendEndpoint(b []byte, e *flow.Endpoint) []byte {
	for _, s := range [...]string{e.PodNamespace, e.PodName, e.WorkloadKind, e.WorkloadName, e.NodeName, e.Zone} {
		b = appendString(b, s)
	}
	b = binary.AppendUvarint(b, uint64(len(e.Labels)))
	for k, v := range e.Labels {
		b = appendString(appendString(b, k), v)
	}
	return b
}

func appendPolicy(b []byte, p *flow.Policy) []byte {
	b = appendString(b, p.Namespace)
	b = appendString(b, p.Name)
	b = binary.AppendVarint(b, int64(p.Rule))
	b = append(b, byte(p.Verdict), byte(p.ReportedVerdict))
	return appendString(b, p.ReportedName)
}

// decoder reads records; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = errShort
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) time() time.Time {
	v := d.varint()
	if v == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, v).UTC()
}

func (d *decoder) addr() netip.Addr {
	switch n := d.byte(); n {
	case 0:
		return netip.Addr{}
	case 4, 16:
		if len(d.b) < int(n) {
			d.fail()
			return netip.Addr{}
		}
		a, _ := netip.AddrFromSlice(d.b[:n])
		d.b = d.b[n:]
		return a
	default:
		d.fail()
		return netip.Addr{}
	}
}

func (d *decoder) string() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) u16() uint16 {
	v := d.uvarint()
	if v > math.MaxUint16 {
		d.fail()
	}
	return uint16(v)
}

func (d *decoder) u32() uint32 {
	v := d.uvarint()
	if v > math.MaxUint32 {
		d.fail()
	}
	return uint32(v)
}

func (d *decoder) record(r *flow.Record) {
	r.FlowStart, r.FlowEnd, r.TimeReceived = d.time(), d.time(), d.time()
	r.SrcAddr, r.DstAddr = d.addr(), d.addr()
	r.SrcPort, r.DstPort = d.u16(), d.u16()
	r.Proto, r.IPVersion = d.byte(), d.byte()
	r.ServiceAddr, r.ServicePort = d.addr(), d.u16()
	r.SNATAddr, r.SNATPort = d.addr(), d.u16()
	for _, p := range [...]*uint64{&r.Packets, &r.Bytes, &r.ReversePackets, &r.ReverseBytes,
		&r.PacketsDelta, &r.BytesDelta, &r.ReversePacketsDelta, &r.ReverseBytesDelta} {
		*p = d.uvarint()
	}
	r.EndReason = flow.EndReason(d.byte())
	r.TCPState = d.string()
	r.Zone, r.Mark = d.u16(), d.u32()
	r.ExporterAddr = d.addr()
	r.ObservationDomainID = d.u32()
	r.ExporterNode, r.Source = d.string(), d.string()
	d.endpoint(&r.Src)
	d.endpoint(&r.Dst)
	r.Service.Namespace, r.Service.Name, r.Service.PortName = d.string(), d.string(), d.string()
	r.Type, r.Correlation = flow.FlowType(d.byte()), flow.Correlation(d.byte())
	d.policy(&r.Ingress)
	d.policy(&r.Egress)
}

func (d *decoder) endpoint(e *flow.Endpoint) {
	for _, p := range [...]*string{&e.PodNamespace, &e.PodName, &e.WorkloadKind, &e.WorkloadName, &e.NodeName, &e.Zone} {
		*p = d.string()
	}
	n := d.uvarint()
	if n > uint64(len(d.b)) { // each entry takes at least two bytes
		d.fail()
		return
	}
	if n > 0 {
		e.Labels = make(map[string]string, n)
		for range n {
			k := d.string()
			e.Labels[k] = d.string()
		}
	}
}

func (d *decoder) policy(p *flow.Policy) {
	p.Namespace, p.Name = d.string(), d.string()
	v := d.varint()
	if v < math.MinInt32 || v > math.MaxInt32 {
		d.fail()
	}
	p.Rule = int32(v)
	p.Verdict, p.ReportedVerdict = flow.Verdict(d.byte()), flow.Verdict(d.byte())
	p.ReportedName = d.string()
}
