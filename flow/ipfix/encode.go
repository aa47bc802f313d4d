package ipfix

import (
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// Wire constants of RFC 7011.
const (
	Version          = 10 // IPFIX message version number
	MessageHeaderLen = 16 // version, length, export time, sequence, domain
	SetHeaderLen     = 4  // set ID, length
	TemplateSetID    = 2  // set ID of template sets
	// MinDataSetID is the lowest template ID, and so the lowest data set ID.
	MinDataSetID = 256
	// MaxMessageLen is the largest IPFIX message (the length field is 16 bits).
	MaxMessageLen = math.MaxUint16
	// maxString is the longest string an element carries (3-byte length
	// prefix, RFC 7011 section 7). Longer strings are cut.
	maxString = math.MaxUint16 - 3
)

// SourceConntrack is the dualflowSource of records built from kernel
// conntrack.
const SourceConntrack = "conntrack"

type putFunc func(b []byte, r *flow.Record) []byte

// putters encode each template element from a record.
var putters = map[key]putFunc{
	ieStartMs.key():         func(b []byte, r *flow.Record) []byte { return putMillis(b, r.FlowStart) },
	ieEndMs.key():           func(b []byte, r *flow.Record) []byte { return putMillis(b, r.FlowEnd) },
	ieEndReason.key():       func(b []byte, r *flow.Record) []byte { return append(b, byte(r.EndReason)) },
	ieSrc4.key():            func(b []byte, r *flow.Record) []byte { return put4(b, r.SrcAddr) },
	ieDst4.key():            func(b []byte, r *flow.Record) []byte { return put4(b, r.DstAddr) },
	ieSrc6.key():            func(b []byte, r *flow.Record) []byte { return put16(b, r.SrcAddr) },
	ieDst6.key():            func(b []byte, r *flow.Record) []byte { return put16(b, r.DstAddr) },
	ieSrcPort.key():         func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint16(b, srcPort(r)) },
	ieDstPort.key():         func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint16(b, r.DstPort) },
	ieProto.key():           func(b []byte, r *flow.Record) []byte { return append(b, r.Proto) },
	ieICMPTypeCode4.key():   func(b []byte, r *flow.Record) []byte { return putICMPTypeCode(b, r, flow.ProtoICMP) },
	ieICMPTypeCode6.key():   func(b []byte, r *flow.Record) []byte { return putICMPTypeCode(b, r, flow.ProtoICMPv6) },
	iePacketTotal.key():     func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint64(b, r.Packets) },
	ieOctetTotal.key():      func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint64(b, r.Bytes) },
	iePacketDelta.key():     func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint64(b, r.PacketsDelta) },
	ieOctetDelta.key():      func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint64(b, r.BytesDelta) },
	ieRevPacketTotal.key():  func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint64(b, r.ReversePackets) },
	ieRevOctetTotal.key():   func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint64(b, r.ReverseBytes) },
	ieRevPacketDelta.key():  func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint64(b, r.ReversePacketsDelta) },
	ieRevOctetDelta.key():   func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint64(b, r.ReverseBytesDelta) },
	iePostNATSrc4.key():     func(b []byte, r *flow.Record) []byte { return put4(b, r.SNATAddr) },
	iePostNATSrc6.key():     func(b []byte, r *flow.Record) []byte { return put16(b, r.SNATAddr) },
	iePostNAPTSrcPort.key(): func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint16(b, r.SNATPort) },
	ieClusterIP4.key():      func(b []byte, r *flow.Record) []byte { return put4(b, r.ServiceAddr) },
	ieClusterIP6.key():      func(b []byte, r *flow.Record) []byte { return put16(b, r.ServiceAddr) },
	ieServicePort.key():     func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint16(b, r.ServicePort) },
	ieFlowType.key():        func(b []byte, r *flow.Record) []byte { return append(b, byte(r.Type)) },
	ieConntrackZone.key():   func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint16(b, r.Zone) },
	ieConntrackMark.key():   func(b []byte, r *flow.Record) []byte { return binary.BigEndian.AppendUint32(b, r.Mark) },
	ieTCPState.key():        func(b []byte, r *flow.Record) []byte { return putString(b, r.TCPState) },
	ieSrcNodeName.key():     func(b []byte, r *flow.Record) []byte { return putString(b, r.Src.NodeName) },
	ieDstNodeName.key():     func(b []byte, r *flow.Record) []byte { return putString(b, r.Dst.NodeName) },
	ieObsDomainName.key():   func(b []byte, r *flow.Record) []byte { return putString(b, r.ExporterNode) },
	ieDualflowSource.key():  func(b []byte, r *flow.Record) []byte { return putString(b, r.Source) },
	ieIngressAction.key():   func(b []byte, r *flow.Record) []byte { return append(b, antreaAction(r.Ingress.ReportedVerdict)) },
	ieEgressAction.key():    func(b []byte, r *flow.Record) []byte { return append(b, antreaAction(r.Egress.ReportedVerdict)) },
	ieIngressPolicy.key():   func(b []byte, r *flow.Record) []byte { return putString(b, r.Ingress.ReportedName) },
	ieEgressPolicy.key():    func(b []byte, r *flow.Record) []byte { return putString(b, r.Egress.ReportedName) },
}

// Encoder writes the template and the data records of one IP family. It
// holds no buffers: every method appends to the caller's slice and does not
// allocate when that slice has room. An Encoder is immutable after
// NewEncoder and safe for concurrent use.
type Encoder struct {
	version    uint8
	templateID uint16
	elems      []Element
	puts       []putFunc
}

// NewEncoder returns the encoder of IP version 4 or 6 whose records use
// templateID (at least MinDataSetID).
func NewEncoder(version uint8, templateID uint16) (*Encoder, error) {
	elems := Elements(version)
	if elems == nil {
		return nil, fmt.Errorf("ipfix encoder: IP version %d: want 4 or 6", version)
	}
	if templateID < MinDataSetID {
		return nil, fmt.Errorf("ipfix encoder: template ID %d below %d", templateID, MinDataSetID)
	}
	e := &Encoder{version: version, templateID: templateID, elems: elems, puts: make([]putFunc, len(elems))}
	for i, el := range elems {
		e.puts[i] = putters[el.key()]
	}
	return e, nil
}

// TemplateID returns the template ID, which is also the set ID of the
// encoder's data sets.
func (e *Encoder) TemplateID() uint16 { return e.templateID }

// IPVersion returns 4 or 6.
func (e *Encoder) IPVersion() uint8 { return e.version }

// AppendTemplateSet appends a complete template set (set header, one
// template record) to b.
func (e *Encoder) AppendTemplateSet(b []byte) []byte {
	start := len(b)
	b = binary.BigEndian.AppendUint16(b, TemplateSetID)
	b = binary.BigEndian.AppendUint16(b, 0) // length, set below
	b = binary.BigEndian.AppendUint16(b, e.templateID)
	b = binary.BigEndian.AppendUint16(b, uint16(len(e.elems)))
	for _, el := range e.elems {
		if el.Enterprise != EnterpriseIANA {
			b = binary.BigEndian.AppendUint16(b, el.ID|0x8000)
			b = binary.BigEndian.AppendUint16(b, el.Length)
			b = binary.BigEndian.AppendUint32(b, el.Enterprise)
			continue
		}
		b = binary.BigEndian.AppendUint16(b, el.ID)
		b = binary.BigEndian.AppendUint16(b, el.Length)
	}
	binary.BigEndian.PutUint16(b[start+2:], uint16(len(b)-start))
	return b
}

// AppendRecord appends the data record of r (no set header) to b. r must be
// of the encoder's IP family: addresses of the other family are written as
// the unspecified address.
func (e *Encoder) AppendRecord(b []byte, r *flow.Record) []byte {
	for _, put := range e.puts {
		b = put(b, r)
	}
	return b
}

// AppendMessageHeader appends a message header for a message of length
// bytes in total (header included).
func AppendMessageHeader(b []byte, length int, exportTime time.Time, seq, domain uint32) []byte {
	b = binary.BigEndian.AppendUint16(b, Version)
	b = binary.BigEndian.AppendUint16(b, uint16(length))
	b = binary.BigEndian.AppendUint32(b, uint32(exportTime.Unix()))
	b = binary.BigEndian.AppendUint32(b, seq)
	return binary.BigEndian.AppendUint32(b, domain)
}

// PutMessageHeader writes the message header into the first
// MessageHeaderLen bytes of msg, whose length is len(msg). It panics if msg
// is shorter than the header.
func PutMessageHeader(msg []byte, exportTime time.Time, seq, domain uint32) {
	AppendMessageHeader(msg[:0], len(msg), exportTime, seq, domain)
}

// PutSetHeader writes a set header into the first SetHeaderLen bytes of
// set, whose length is len(set). It panics if set is shorter than the header.
func PutSetHeader(set []byte, setID uint16) {
	binary.BigEndian.PutUint16(set, setID)
	binary.BigEndian.PutUint16(set[2:], uint16(len(set)))
}

func putMillis(b []byte, t time.Time) []byte {
	var ms uint64
	if !t.IsZero() && t.UnixMilli() > 0 {
		ms = uint64(t.UnixMilli())
	}
	return binary.BigEndian.AppendUint64(b, ms)
}

func put4(b []byte, a netip.Addr) []byte {
	a = a.Unmap()
	if !a.Is4() {
		return append(b, 0, 0, 0, 0)
	}
	v := a.As4()
	return append(b, v[:]...)
}

var zero16 [16]byte

func put16(b []byte, a netip.Addr) []byte {
	if !a.Is6() || a.Is4In6() {
		return append(b, zero16[:]...)
	}
	v := a.As16()
	return append(b, v[:]...)
}

// srcPort is the sourceTransportPort of r: SrcPort, which for ICMP and
// ICMPv6 is the echo identifier, except that an ICMP record whose type and
// code are both 0 (an IPv4 echo reply) sends 0. nfdump 1.7 shows a nonzero
// sourceTransportPort as the ICMP type.code when icmpTypeCode is 0, so the
// identifier would show as a bogus type (a reply with identifier 0x2b31
// showed as 49.43); with 0 it shows 0.0.
func srcPort(r *flow.Record) uint16 {
	if (r.Proto == flow.ProtoICMP || r.Proto == flow.ProtoICMPv6) && r.DstPort == 0 {
		return 0
	}
	return r.SrcPort
}

// putICMPTypeCode writes icmpTypeCodeIPv4/IPv6: type<<8|code, which a
// record of protocol proto carries in DstPort, and 0 for other protocols.
func putICMPTypeCode(b []byte, r *flow.Record, proto uint8) []byte {
	var tc uint16
	if r.Proto == proto {
		tc = r.DstPort
	}
	return binary.BigEndian.AppendUint16(b, tc)
}

// putString writes s with the RFC 7011 variable-length prefix.
func putString(b []byte, s string) []byte {
	if len(s) > maxString {
		s = s[:maxString]
	}
	if len(s) < 255 {
		b = append(b, byte(len(s)))
	} else {
		b = append(b, 255)
		b = binary.BigEndian.AppendUint16(b, uint16(len(s)))
	}
	return append(b, s...)
}

// antreaAction is the inverse of AntreaVerdict: Antrea's
// NetworkPolicyRuleAction for a datapath-reported verdict (0 when none).
func antreaAction(v flow.Verdict) uint8 {
	switch v {
	case flow.VerdictAllowed:
		return 1
	case flow.VerdictDenied:
		return 2
	case flow.VerdictRejected:
		return 3
	}
	return 0
}
