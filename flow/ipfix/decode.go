package ipfix

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/vmware/go-ipfix/pkg/entities"

	"github.com/dualflow/dualflow/flow"
)

// SourceForeign is the Record.Source of records from exporters that do not
// send dualflowSource (Antrea, other IPFIX exporters).
const SourceForeign = "ipfix"

// ErrNoAddresses is returned by Decode for a record that carries neither an
// IPv4 nor an IPv6 source and destination address.
var ErrNoAddresses = errors.New("ipfix record has no source/destination address")

// ErrMixedFamilies is returned (wrapped, with the addresses) by Decode for
// a record whose source and destination are of different IP families, e.g.
// an IPv4 source with an IPv6 destination: no connection has such a tuple.
var ErrMixedFamilies = errors.New("ipfix record mixes IP families")

// SkippedError is returned by AppendMessage when records of a message
// failed to decode; the others were decoded. errors.Is sees through it to
// the records' errors (ErrNoAddresses, ErrMixedFamilies).
type SkippedError struct {
	Skipped, Total int   // records skipped, records in the message
	Err            error // the first maxSkippedErrs of their errors, joined
}

// maxSkippedErrs bounds the errors a SkippedError keeps: a message of
// thousands of bad records yields a short error.
const maxSkippedErrs = 4

func (e *SkippedError) Error() string {
	return fmt.Sprintf("skipped %d of %d records: %v", e.Skipped, e.Total, e.Err)
}

func (e *SkippedError) Unwrap() error { return e.Err }

// decodeState collects elements that fill a field only in combination or
// as a fallback.
type decodeState struct {
	startSec, endSec            uint64
	ingressName, ingressNS      string
	egressName, egressNS        string
	ingressAction, egressAction uint8
	icmpTypeCode                uint16 // icmpTypeCodeIPv4/IPv6: DstPort when no destinationTransportPort
}

type getFunc func(v entities.InfoElementWithValue, r *flow.Record, st *decodeState)

// getters decode every element we understand: the template elements plus
// the Antrea elements a foreign exporter may send.
var getters = map[key]getFunc{
	ieStartMs.key(): func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) {
		r.FlowStart = fromMillis(u64(v))
	},
	ieEndMs.key():    func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.FlowEnd = fromMillis(u64(v)) },
	ieStartSec.key(): func(v entities.InfoElementWithValue, _ *flow.Record, st *decodeState) { st.startSec = u64(v) },
	ieEndSec.key():   func(v entities.InfoElementWithValue, _ *flow.Record, st *decodeState) { st.endSec = u64(v) },
	ieEndReason.key(): func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) {
		r.EndReason = flow.EndReason(u64(v))
	},
	ieSrc4.key():            func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.SrcAddr, v) },
	ieDst4.key():            func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.DstAddr, v) },
	ieSrc6.key():            func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.SrcAddr, v) },
	ieDst6.key():            func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.DstAddr, v) },
	ieSrcPort.key():         func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.SrcPort = uint16(u64(v)) },
	ieDstPort.key():         func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.DstPort = uint16(u64(v)) },
	ieProto.key():           func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Proto = uint8(u64(v)) },
	ieICMPTypeCode4.key():   getICMPTypeCode,
	ieICMPTypeCode6.key():   getICMPTypeCode,
	iePacketTotal.key():     func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Packets = u64(v) },
	ieOctetTotal.key():      func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Bytes = u64(v) },
	iePacketDelta.key():     func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.PacketsDelta = u64(v) },
	ieOctetDelta.key():      func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.BytesDelta = u64(v) },
	ieRevPacketTotal.key():  func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.ReversePackets = u64(v) },
	ieRevOctetTotal.key():   func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.ReverseBytes = u64(v) },
	ieRevPacketDelta.key():  func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.ReversePacketsDelta = u64(v) },
	ieRevOctetDelta.key():   func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.ReverseBytesDelta = u64(v) },
	iePostNATSrc4.key():     func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.SNATAddr, v) },
	iePostNATSrc6.key():     func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.SNATAddr, v) },
	iePostNAPTSrcPort.key(): func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setPort(&r.SNATPort, v) },
	ieProxySNAT4.key():      func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.SNATAddr, v) },
	ieProxySNAT6.key():      func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.SNATAddr, v) },
	ieProxySNATPort.key():   func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setPort(&r.SNATPort, v) },
	ieClusterIP4.key():      func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.ServiceAddr, v) },
	ieClusterIP6.key():      func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.ServiceAddr, v) },
	ieServiceIP4.key():      func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.ServiceAddr, v) },
	ieServiceIP6.key():      func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setAddr(&r.ServiceAddr, v) },
	ieServicePort.key():     func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { setPort(&r.ServicePort, v) },
	ieServicePortName.key(): func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) {
		r.Service = parseServicePortName(str(v))
	},
	ieFlowType.key():        func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Type = flow.FlowType(u64(v)) },
	ieConntrackZone.key():   func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Zone = uint16(u64(v)) },
	ieConntrackMark.key():   func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Mark = uint32(u64(v)) },
	ieTCPState.key():        func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.TCPState = str(v) },
	ieSrcNodeName.key():     func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Src.NodeName = str(v) },
	ieDstNodeName.key():     func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Dst.NodeName = str(v) },
	ieSrcPodNamespace.key(): func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Src.PodNamespace = str(v) },
	ieSrcPodName.key():      func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Src.PodName = str(v) },
	ieDstPodNamespace.key(): func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Dst.PodNamespace = str(v) },
	ieDstPodName.key():      func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Dst.PodName = str(v) },
	ieObsDomainName.key():   func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.ExporterNode = str(v) },
	ieDualflowSource.key():  func(v entities.InfoElementWithValue, r *flow.Record, _ *decodeState) { r.Source = str(v) },
	ieIngressPolicy.key():   func(v entities.InfoElementWithValue, _ *flow.Record, st *decodeState) { st.ingressName = str(v) },
	ieIngressPolicyNS.key(): func(v entities.InfoElementWithValue, _ *flow.Record, st *decodeState) { st.ingressNS = str(v) },
	ieEgressPolicy.key():    func(v entities.InfoElementWithValue, _ *flow.Record, st *decodeState) { st.egressName = str(v) },
	ieEgressPolicyNS.key():  func(v entities.InfoElementWithValue, _ *flow.Record, st *decodeState) { st.egressNS = str(v) },
	ieIngressAction.key(): func(v entities.InfoElementWithValue, _ *flow.Record, st *decodeState) {
		st.ingressAction = uint8(u64(v))
	},
	ieEgressAction.key(): func(v entities.InfoElementWithValue, _ *flow.Record, st *decodeState) {
		st.egressAction = uint8(u64(v))
	},
}

// getICMPTypeCode reads icmpTypeCodeIPv4/IPv6, which fill DstPort only when
// destinationTransportPort is absent or 0 (see Decode), as in the collector.
func getICMPTypeCode(v entities.InfoElementWithValue, _ *flow.Record, st *decodeState) {
	st.icmpTypeCode = uint16(u64(v))
}

// Decode fills r from one decoded data record (go-ipfix's collector output)
// and normalizes it. It reads the elements of our templates and the Antrea
// elements listed in the package doc, by enterprise and element ID, so it
// works whether the element arrived typed (registered) or as an octet array
// (go-ipfix lenient decoding of an unregistered element). Unknown elements
// are ignored. r should be zero on entry; fields without an element are
// left alone, except that Source defaults to SourceForeign and policy rules
// to -1. Decode does not set the exporter address, the observation domain or
// TimeReceived, which belong to the message: see AppendMessage.
func Decode(rec entities.Record, r *flow.Record) error {
	var st decodeState
	for _, v := range rec.GetOrderedElementList() {
		ie := v.GetInfoElement()
		if ie == nil {
			continue
		}
		if get := getters[key{ie.EnterpriseId, ie.ElementId}]; get != nil {
			get(v, r, &st)
		}
	}
	if r.FlowStart.IsZero() && st.startSec != 0 {
		r.FlowStart = time.Unix(int64(st.startSec), 0)
	}
	if r.FlowEnd.IsZero() && st.endSec != 0 {
		r.FlowEnd = time.Unix(int64(st.endSec), 0)
	}
	if r.DstPort == 0 {
		r.DstPort = st.icmpTypeCode // ICMP type<<8|code, the NetFlow convention
	}
	r.Ingress.Rule, r.Egress.Rule = -1, -1
	r.Ingress.ReportedName = joinName(st.ingressNS, st.ingressName)
	r.Ingress.ReportedVerdict = antreaVerdict(st.ingressAction)
	r.Egress.ReportedName = joinName(st.egressNS, st.egressName)
	r.Egress.ReportedVerdict = antreaVerdict(st.egressAction)
	if r.Source == "" {
		r.Source = SourceForeign
	}
	r.Normalize()
	if !r.SrcAddr.IsValid() || !r.DstAddr.IsValid() {
		return ErrNoAddresses
	}
	if sv, dv := flow.Version(r.SrcAddr), flow.Version(r.DstAddr); sv != dv {
		return fmt.Errorf("%w: IPv%d source %v, IPv%d destination %v", ErrMixedFamilies, sv, r.SrcAddr, dv, r.DstAddr)
	}
	return nil
}

// AppendMessage decodes every data record of msg, appends them to dst and
// returns the extended slice. Each record gets the message's exporter
// address and observation domain, and received as TimeReceived. Template
// sets yield no records. A record that fails to decode is skipped and the
// rest of the message still decoded; the error is then a *SkippedError
// counting them, returned with every record that did decode.
func AppendMessage(dst []flow.Record, msg *entities.Message, received time.Time) ([]flow.Record, error) {
	set := msg.GetSet()
	if set == nil || set.GetSetType() != entities.Data {
		return dst, nil
	}
	exporter, _ := netip.ParseAddr(msg.GetExportAddress())
	recs := set.GetRecords()
	var skipped int
	var errs []error
	for _, rec := range recs {
		dst = append(dst, flow.Record{})
		r := &dst[len(dst)-1]
		if err := Decode(rec, r); err != nil {
			dst = dst[:len(dst)-1]
			if skipped++; len(errs) < maxSkippedErrs {
				errs = append(errs, fmt.Errorf("decode template %d: %w", rec.GetTemplateID(), err))
			}
			continue
		}
		r.ExporterAddr = exporter.Unmap()
		r.ObservationDomainID = msg.GetObsDomainID()
		r.TimeReceived = received
	}
	if skipped > 0 {
		return dst, &SkippedError{Skipped: skipped, Total: len(recs), Err: errors.Join(errs...)}
	}
	return dst, nil
}

// u64 returns any unsigned or date-time value, or a big-endian octet array
// of at most 8 bytes, as a uint64.
func u64(v entities.InfoElementWithValue) uint64 {
	switch v.GetDataType() {
	case entities.Unsigned8:
		return uint64(v.GetUnsigned8Value())
	case entities.Unsigned16:
		return uint64(v.GetUnsigned16Value())
	case entities.Unsigned32, entities.DateTimeSeconds:
		return uint64(v.GetUnsigned32Value())
	case entities.Unsigned64, entities.DateTimeMilliseconds:
		return v.GetUnsigned64Value()
	case entities.OctetArray:
		b := v.GetOctetArrayValue()
		if len(b) > 8 {
			return 0
		}
		var buf [8]byte
		copy(buf[8-len(b):], b)
		return binary.BigEndian.Uint64(buf[:])
	}
	return 0
}

func str(v entities.InfoElementWithValue) string {
	switch v.GetDataType() {
	case entities.String:
		return v.GetStringValue()
	case entities.OctetArray:
		return string(v.GetOctetArrayValue())
	}
	return ""
}

// setAddr sets *dst from an address element, leaving it alone when the
// element holds the unspecified address (our "none").
func setAddr(dst *netip.Addr, v entities.InfoElementWithValue) {
	var b []byte
	switch v.GetDataType() {
	case entities.Ipv4Address, entities.Ipv6Address:
		b = v.GetIPAddressValue()
	case entities.OctetArray:
		b = v.GetOctetArrayValue()
	}
	if len(b) == 16 && v.GetInfoElement().Len == 4 {
		b = b[12:] // net.IP may hold an IPv4 address in 16 bytes
	}
	a, ok := netip.AddrFromSlice(b)
	if !ok || a.Unmap().IsUnspecified() {
		return
	}
	*dst = a.Unmap()
}

func setPort(dst *uint16, v entities.InfoElementWithValue) {
	if p := uint16(u64(v)); p != 0 {
		*dst = p
	}
}

func fromMillis(ms uint64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(int64(ms))
}

// parseServicePortName splits Antrea's "namespace/name:port".
func parseServicePortName(s string) flow.Service {
	var svc flow.Service
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		s, svc.PortName = s[:i], s[i+1:]
	}
	if i := strings.IndexByte(s, '/'); i >= 0 {
		svc.Namespace, svc.Name = s[:i], s[i+1:]
	} else {
		svc.Name = s
	}
	return svc
}

func joinName(ns, name string) string {
	if ns == "" || name == "" {
		return name
	}
	return ns + "/" + name
}

// antreaVerdict maps Antrea's NetworkPolicyRuleAction (0 none, 1 allow,
// 2 drop, 3 reject).
func antreaVerdict(action uint8) flow.Verdict {
	switch action {
	case 1:
		return flow.VerdictAllowed
	case 2:
		return flow.VerdictDenied
	case 3:
		return flow.VerdictRejected
	}
	return flow.VerdictUnknown
}
