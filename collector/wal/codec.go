package wal

import (
	"encoding/binary"
	"errors"
	"math"
	"net/netip"
	"time"
	"unsafe"

	"github.com/dualflow/dualflow/flow"
)

// The record encoding: every field of flow.Record but Journal,
// K8sViewStale and ProbeTraceID (enrichment sets them, after the journal;
// a replayed record is enriched again), in declaration order. Integers are
// varints, strings and maps are length-prefixed, addresses are a length
// byte (0, 4 or 16) and the bytes, times are varints of Unix nanoseconds
// with math.MinInt64 for the zero time. TestCodecRoundTripEveryField fails
// when a field is added to the record and not here.
//
// Since segment format 04 a record is encoded against prev, the record
// before it in its frame (the zero record for the first), because a batch's
// records share most of their strings, their exporter and their receive
// time: TimeReceived is the difference of its nanoseconds from prev's,
// FlowEnd from TimeReceived, FlowStart from FlowEnd (differences wrap, so
// the zero time round-trips); a string that is prev's same field (see
// appendStringAfter) is the length 0 and other strings carry their length
// plus one; an address equal
// to prev's same field (valid) is the length byte 1. The journal of the
// listeners' records shrank from 162 to 103 bytes a record
// (BenchmarkAppendDecoded), and with it the encoding, the checksum and the
// write. Segments of formats 01 to 03 (absolute times, plain strings) are
// still read: decoder.delta tells the two apart.

var errShort = errors.New("wal: record truncated")

// sameAddr is the length byte of an address equal to prev's (format 04).
const sameAddr = 1

// appendRecord appends r encoded against prev (see above).
func appendRecord(b []byte, r, prev *flow.Record) []byte {
	recv, end := nanos(r.TimeReceived), nanos(r.FlowEnd)
	b = binary.AppendVarint(b, nanos(r.FlowStart)-end)
	b = binary.AppendVarint(b, end-recv)
	b = binary.AppendVarint(b, recv-nanos(prev.TimeReceived))
	b = appendAddr(b, r.SrcAddr, prev.SrcAddr)
	b = appendAddr(b, r.DstAddr, prev.DstAddr)
	b = binary.AppendUvarint(b, uint64(r.SrcPort))
	b = binary.AppendUvarint(b, uint64(r.DstPort))
	b = append(b, r.Proto, r.IPVersion)
	b = appendAddr(b, r.ServiceAddr, prev.ServiceAddr)
	b = binary.AppendUvarint(b, uint64(r.ServicePort))
	b = appendAddr(b, r.SNATAddr, prev.SNATAddr)
	b = binary.AppendUvarint(b, uint64(r.SNATPort))
	b = binary.AppendUvarint(b, r.Packets)
	b = binary.AppendUvarint(b, r.Bytes)
	b = binary.AppendUvarint(b, r.ReversePackets)
	b = binary.AppendUvarint(b, r.ReverseBytes)
	b = binary.AppendUvarint(b, r.PacketsDelta)
	b = binary.AppendUvarint(b, r.BytesDelta)
	b = binary.AppendUvarint(b, r.ReversePacketsDelta)
	b = binary.AppendUvarint(b, r.ReverseBytesDelta)
	b = append(b, byte(r.EndReason))
	b = appendStringAfter(b, r.TCPState, prev.TCPState)
	b = binary.AppendUvarint(b, uint64(r.Zone))
	b = binary.AppendUvarint(b, uint64(r.Mark))
	b = appendAddr(b, r.ExporterAddr, prev.ExporterAddr)
	b = binary.AppendUvarint(b, uint64(r.ObservationDomainID))
	b = appendStringAfter(b, r.ExporterNode, prev.ExporterNode)
	b = appendStringAfter(b, r.Source, prev.Source)
	b = appendEndpoint(b, &r.Src, &prev.Src)
	b = appendEndpoint(b, &r.Dst, &prev.Dst)
	b = appendStringAfter(b, r.Service.Namespace, prev.Service.Namespace)
	b = appendStringAfter(b, r.Service.Name, prev.Service.Name)
	b = appendStringAfter(b, r.Service.PortName, prev.Service.PortName)
	b = append(b, byte(r.Type), byte(r.Correlation))
	b = appendPolicy(b, &r.Ingress, &prev.Ingress)
	b = appendPolicy(b, &r.Egress, &prev.Egress)
	return b
}

// nanos is t in Unix nanoseconds, math.MinInt64 for the zero time.
func nanos(t time.Time) int64 {
	if t.IsZero() {
		return math.MinInt64
	}
	return t.UnixNano()
}

func appendAddr(b []byte, a, prev netip.Addr) []byte {
	switch {
	case !a.IsValid():
		return append(b, 0)
	case a == prev:
		return append(b, sameAddr)
	case a.Is4():
		b, _ = a.AppendBinary(append(b, 4)) // appended as two words: As4's array is copied through memory
		return b
	case a.Zone() == "":
		b, _ = a.AppendBinary(append(b, 16))
		return b
	default: // AppendBinary would append the zone, which the journal drops
		v := a.As16()
		return append(append(b, 16), v[:]...)
	}
}

// appendString appends s with its length (intent frames).
func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendStringAfter appends s, a field whose value in the record before
// was prev: 0 when s is prev, else its length plus one and its bytes. "Is"
// means the same string, not equal bytes: a batch's repeated values are one
// string (the decoder's interner, the listener's source), and comparing the
// bytes of every other pair of strings of one length cost more than it
// saved (BenchmarkAppendAck's random strings: +16% CPU). Equal strings
// that are not the same are written out: more bytes, the same record.
func appendStringAfter(b []byte, s, prev string) []byte {
	if len(s) == len(prev) && (len(s) == 0 || unsafe.StringData(s) == unsafe.StringData(prev)) {
		return append(b, 0)
	}
	b = binary.AppendUvarint(b, uint64(len(s))+1)
	return append(b, s...)
}

func appendEndpoint(b []byte, e, prev *flow.Endpoint) []byte {
	b = appendStringAfter(b, e.PodNamespace, prev.PodNamespace)
	b = appendStringAfter(b, e.PodName, prev.PodName)
	b = appendStringAfter(b, e.WorkloadKind, prev.WorkloadKind)
	b = appendStringAfter(b, e.WorkloadName, prev.WorkloadName)
	b = appendStringAfter(b, e.NodeName, prev.NodeName)
	b = appendStringAfter(b, e.Zone, prev.Zone)
	b = binary.AppendUvarint(b, uint64(len(e.Labels)))
	for k, v := range e.Labels {
		b = appendString(appendString(b, k), v)
	}
	return b
}

func appendPolicy(b []byte, p, prev *flow.Policy) []byte {
	b = appendStringAfter(b, p.Namespace, prev.Namespace)
	b = appendStringAfter(b, p.Name, prev.Name)
	b = binary.AppendVarint(b, int64(p.Rule))
	b = append(b, byte(p.Verdict), byte(p.ReportedVerdict))
	return appendStringAfter(b, p.ReportedName, prev.ReportedName)
}

// decoder reads records; the first error sticks. delta is set for the
// records of segment format 04 and later (encoded against the record
// before), clear for older ones.
type decoder struct {
	b     []byte
	err   error
	delta bool
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

// fromNanos is the time of nanos' encoding.
func fromNanos(v int64) time.Time {
	if v == math.MinInt64 {
		return time.Time{}
	}
	return time.Unix(0, v).UTC()
}

// addr reads an address whose value in the record before was prev.
func (d *decoder) addr(prev netip.Addr) netip.Addr {
	switch n := d.byte(); n {
	case 0:
		return netip.Addr{}
	case sameAddr:
		if !d.delta || !prev.IsValid() {
			d.fail()
			return netip.Addr{}
		}
		return prev
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

// stringAfter reads a string whose value in the record before was prev.
func (d *decoder) stringAfter(prev string) string {
	if !d.delta {
		return d.string()
	}
	n := d.uvarint()
	if n == 0 {
		return prev
	}
	return d.bytes(n - 1)
}

func (d *decoder) string() string {
	return d.bytes(d.uvarint())
}

// bytes reads a string of n bytes.
func (d *decoder) bytes(n uint64) string {
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

// record reads r, encoded against prev (ignored before format 04).
func (d *decoder) record(r, prev *flow.Record) {
	start, end, recv := d.varint(), d.varint(), d.varint()
	if d.delta {
		recv += nanos(prev.TimeReceived)
		end += recv
		start += end
	}
	r.FlowStart, r.FlowEnd, r.TimeReceived = fromNanos(start), fromNanos(end), fromNanos(recv)
	r.SrcAddr, r.DstAddr = d.addr(prev.SrcAddr), d.addr(prev.DstAddr)
	r.SrcPort, r.DstPort = d.u16(), d.u16()
	r.Proto, r.IPVersion = d.byte(), d.byte()
	r.ServiceAddr, r.ServicePort = d.addr(prev.ServiceAddr), d.u16()
	r.SNATAddr, r.SNATPort = d.addr(prev.SNATAddr), d.u16()
	for _, p := range [...]*uint64{&r.Packets, &r.Bytes, &r.ReversePackets, &r.ReverseBytes,
		&r.PacketsDelta, &r.BytesDelta, &r.ReversePacketsDelta, &r.ReverseBytesDelta} {
		*p = d.uvarint()
	}
	r.EndReason = flow.EndReason(d.byte())
	r.TCPState = d.stringAfter(prev.TCPState)
	r.Zone, r.Mark = d.u16(), d.u32()
	r.ExporterAddr = d.addr(prev.ExporterAddr)
	r.ObservationDomainID = d.u32()
	r.ExporterNode, r.Source = d.stringAfter(prev.ExporterNode), d.stringAfter(prev.Source)
	d.endpoint(&r.Src, &prev.Src)
	d.endpoint(&r.Dst, &prev.Dst)
	r.Service.Namespace = d.stringAfter(prev.Service.Namespace)
	r.Service.Name = d.stringAfter(prev.Service.Name)
	r.Service.PortName = d.stringAfter(prev.Service.PortName)
	r.Type, r.Correlation = flow.FlowType(d.byte()), flow.Correlation(d.byte())
	d.policy(&r.Ingress, &prev.Ingress)
	d.policy(&r.Egress, &prev.Egress)
}

func (d *decoder) endpoint(e, prev *flow.Endpoint) {
	e.PodNamespace = d.stringAfter(prev.PodNamespace)
	e.PodName = d.stringAfter(prev.PodName)
	e.WorkloadKind = d.stringAfter(prev.WorkloadKind)
	e.WorkloadName = d.stringAfter(prev.WorkloadName)
	e.NodeName = d.stringAfter(prev.NodeName)
	e.Zone = d.stringAfter(prev.Zone)
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

func (d *decoder) policy(p, prev *flow.Policy) {
	p.Namespace, p.Name = d.stringAfter(prev.Namespace), d.stringAfter(prev.Name)
	v := d.varint()
	if v < math.MinInt32 || v > math.MaxInt32 {
		d.fail()
	}
	p.Rule = int32(v)
	p.Verdict, p.ReportedVerdict = flow.Verdict(d.byte()), flow.Verdict(d.byte())
	p.ReportedName = d.stringAfter(prev.ReportedName)
}
