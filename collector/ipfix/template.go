package ipfix

import (
	"bytes"
	"time"

	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

// op is what the decode plan does with one field of a data record.
type op uint8

// Ops beyond the shared mapping's Fields: the common IANA alternatives that
// other exporters send.
const (
	opSkip op = iota
	// opField+f decodes fipfix.Field f (see field ops below).
	opStartMicros     // flowStartMicroseconds (NTP timestamp)
	opEndMicros       // flowEndMicroseconds (NTP timestamp)
	opStartNanos      // flowStartNanoseconds (NTP timestamp)
	opEndNanos        // flowEndNanoseconds (NTP timestamp)
	opStartUptime     // flowStartSysUpTime: ms since systemInitTimeMilliseconds
	opEndUptime       // flowEndSysUpTime
	opSysInit         // systemInitTimeMilliseconds
	opStartDeltaMicro // flowStartDeltaMicroseconds: µs before the export time
	opEndDeltaMicro   // flowEndDeltaMicroseconds
	opDurationMillis  // flowDurationMilliseconds
	opPostNATDst4     // postNATDestinationIPv4Address: the DNAT-ed endpoint
	opPostNATDst6     // postNATDestinationIPv6Address
	opPostNAPTDstPort // postNAPTDestinationTransportPort
	opICMPTypeCode    // icmpTypeCodeIPv4 / IPv6: type<<8|code into DstPort
	opICMPType        // icmpTypeIPv4 / IPv6 (OVS): the high byte of DstPort
	opICMPCode        // icmpCodeIPv4 / IPv6 (OVS): the low byte of DstPort
	opFlowDirection   // flowDirection: 0 ingress, 1 egress (see Direction)
	// opDual*: the address elements of a template that has both families'
	// (see postDual).
	opDualSrc4
	opDualDst4
	opDualSrc6
	opDualDst6
	opField // first of the shared-mapping ops: opField + fipfix.Field
)

// IANA element IDs of the alternatives above.
const (
	ieFlowEndSysUpTime             = 21
	ieFlowDirection                = 61
	ieFlowStartSysUpTime           = 22
	ieICMPTypeCodeIPv4             = 32
	ieICMPTypeCodeIPv6             = 139
	ieFlowStartMicroseconds        = 154
	ieFlowEndMicroseconds          = 155
	ieFlowStartNanoseconds         = 156
	ieFlowEndNanoseconds           = 157
	ieFlowStartDeltaMicro          = 158
	ieFlowEndDeltaMicro            = 159
	ieSystemInitTimeMillis         = 160
	ieFlowDurationMillis           = 161
	iePostNATDstIPv4               = 226
	iePostNAPTDstPort              = 228
	iePostNATDstIPv6               = 282
	enterpriseVMware        uint32 = 6876 // Open vSwitch's own elements: skipped
)

var ianaAlternatives = map[uint16]op{
	ieFlowEndSysUpTime:      opEndUptime,
	ieFlowDirection:         opFlowDirection,
	ieFlowStartSysUpTime:    opStartUptime,
	ieICMPTypeCodeIPv4:      opICMPTypeCode,
	ieICMPTypeCodeIPv6:      opICMPTypeCode,
	ieICMPTypeIPv4:          opICMPType,
	ieICMPCodeIPv4:          opICMPCode,
	ieICMPTypeIPv6:          opICMPType,
	ieICMPCodeIPv6:          opICMPCode,
	ieFlowStartMicroseconds: opStartMicros,
	ieFlowEndMicroseconds:   opEndMicros,
	ieFlowStartNanoseconds:  opStartNanos,
	ieFlowEndNanoseconds:    opEndNanos,
	ieFlowStartDeltaMicro:   opStartDeltaMicro,
	ieFlowEndDeltaMicro:     opEndDeltaMicro,
	ieSystemInitTimeMillis:  opSysInit,
	ieFlowDurationMillis:    opDurationMillis,
	iePostNATDstIPv4:        opPostNATDst4,
	iePostNAPTDstPort:       opPostNAPTDstPort,
	iePostNATDstIPv6:        opPostNATDst6,
}

// varLen is the template length of a variable-length field (RFC 7011 7).
const varLen = 0xffff

// field is one compiled field of a template.
type field struct {
	op  op
	len uint16 // varLen for variable length
}

// post are the fix-ups a template's records need after their fields are
// read; a template that needs none (ours) skips the whole step.
type post uint16

const (
	postSeconds  post = 1 << iota // seconds fallbacks for start/end
	postNTP                       // micro/nanosecond timestamps
	postUptime                    // sysUpTime relative times
	postDelta                     // delta-microsecond times
	postDuration                  // end = start + duration
	postNATDst                    // IANA postNAT destination → ServiceAddr/DstAddr
	postPolicy                    // Antrea policy names and actions
	postDual                      // addresses of both families: the filled pair wins
)

// template is a compiled template: the decode plan of its data records.
type template struct {
	id      uint16
	options bool
	raw     []byte // the template record as received, to detect refreshes
	fields  []field
	// minLen is the shortest data record (variable-length fields count
	// one byte); fixed is the record length when no field is variable,
	// else 0.
	minLen, fixed int
	post          post
	seen          time.Time // last (re)definition, for the UDP lifetime
}

// compile builds the plan of a template record. specs holds (enterprise,
// id, length) per field. It never fails: unknown, unusable or wrongly
// sized elements are skipped.
func compile(id uint16, options bool, raw []byte, specs []spec) *template {
	t := &template{id: id, options: options, raw: bytes.Clone(raw), fields: make([]field, len(specs))}
	fixed := true
	for i, s := range specs {
		o := opFor(s, options)
		if !sizeOK(o, s.length) {
			o = opSkip
		}
		t.fields[i] = field{op: o, len: s.length}
		t.post |= postOf(o)
		if s.length == varLen {
			fixed = false
			t.minLen++
		} else {
			t.minLen += int(s.length)
		}
	}
	if fixed {
		t.fixed = t.minLen
	}
	t.dualFamily()
	return t
}

// dualFamily makes a template that carries address elements of both
// families (some exporters send one template for all flows, zero-filling
// the other family) read its addresses into scratch, so that the filled
// pair wins whatever the element order.
func (t *template) dualFamily() {
	var v4, v6 bool
	for _, f := range t.fields {
		switch f.op {
		case opField + op(fipfix.FieldSrcAddr4), opField + op(fipfix.FieldDstAddr4):
			v4 = true
		case opField + op(fipfix.FieldSrcAddr6), opField + op(fipfix.FieldDstAddr6):
			v6 = true
		}
	}
	if !v4 || !v6 {
		return
	}
	for i := range t.fields {
		f := &t.fields[i]
		switch f.op {
		case opField + op(fipfix.FieldSrcAddr4):
			f.op = opDualSrc4
		case opField + op(fipfix.FieldDstAddr4):
			f.op = opDualDst4
		case opField + op(fipfix.FieldSrcAddr6):
			f.op = opDualSrc6
		case opField + op(fipfix.FieldDstAddr6):
			f.op = opDualDst6
		}
	}
	t.post |= postDual
}

// spec is one field specifier of a template record.
type spec struct {
	enterprise uint32
	id         uint16
	length     uint16
}

func opFor(s spec, options bool) op {
	if options {
		// Options records only feed the decoder's own state.
		if s.enterprise == fipfix.EnterpriseIANA && s.id == ieSystemInitTimeMillis {
			return opSysInit
		}
		return opSkip
	}
	if f := fipfix.FieldOf(s.enterprise, s.id); f != fipfix.FieldNone {
		return opField + op(f)
	}
	if s.enterprise == fipfix.EnterpriseIANA {
		return ianaAlternatives[s.id]
	}
	return opSkip // other enterprises, VMware's OVS elements included
}

// sizeOK reports whether an element of length l can be decoded by o;
// reduced-size encoding (RFC 7011 6.2) is accepted for integers.
func sizeOK(o op, l uint16) bool {
	switch o {
	case opSkip:
		return true
	case opPostNATDst4, opField + op(fipfix.FieldSrcAddr4), opField + op(fipfix.FieldDstAddr4),
		opField + op(fipfix.FieldSNATAddr4), opField + op(fipfix.FieldServiceAddr4):
		return l == 4
	case opPostNATDst6, opField + op(fipfix.FieldSrcAddr6), opField + op(fipfix.FieldDstAddr6),
		opField + op(fipfix.FieldSNATAddr6), opField + op(fipfix.FieldServiceAddr6):
		return l == 16
	case opField + op(fipfix.FieldTCPState), opField + op(fipfix.FieldSrcNodeName), opField + op(fipfix.FieldDstNodeName),
		opField + op(fipfix.FieldSrcPodNamespace), opField + op(fipfix.FieldSrcPodName),
		opField + op(fipfix.FieldDstPodNamespace), opField + op(fipfix.FieldDstPodName),
		opField + op(fipfix.FieldExporterNode), opField + op(fipfix.FieldSource),
		opField + op(fipfix.FieldServicePortName),
		opField + op(fipfix.FieldIngressPolicyName), opField + op(fipfix.FieldIngressPolicyNamespace),
		opField + op(fipfix.FieldEgressPolicyName), opField + op(fipfix.FieldEgressPolicyNamespace):
		return true // strings: any length
	}
	return l >= 1 && l <= 8 // integers and timestamps
}

func postOf(o op) post {
	switch o {
	case opField + op(fipfix.FieldFlowStartSeconds), opField + op(fipfix.FieldFlowEndSeconds):
		return postSeconds
	case opStartMicros, opEndMicros, opStartNanos, opEndNanos:
		return postNTP
	case opStartUptime, opEndUptime:
		return postUptime
	case opStartDeltaMicro, opEndDeltaMicro:
		return postDelta
	case opDurationMillis:
		return postDuration
	case opPostNATDst4, opPostNATDst6, opPostNAPTDstPort:
		return postNATDst
	case opField + op(fipfix.FieldIngressPolicyName), opField + op(fipfix.FieldIngressPolicyNamespace),
		opField + op(fipfix.FieldEgressPolicyName), opField + op(fipfix.FieldEgressPolicyNamespace),
		opField + op(fipfix.FieldIngressAction), opField + op(fipfix.FieldEgressAction):
		return postPolicy
	}
	return 0
}

// size is the memory a template holds, charged to its session's budget.
func (t *template) size() int { return templateSize(len(t.raw), len(t.fields)) }

// templateSize is what a template of rawLen bytes and fields fields counts
// against the limits, known before it is compiled: a refused definition
// costs no allocation.
func templateSize(rawLen, fields int) int { return rawLen + 4*fields + 128 }

// IANA ICMP type and code elements, sent separately by Open vSwitch.
const (
	ieICMPTypeIPv4 = 176
	ieICMPCodeIPv4 = 177
	ieICMPTypeIPv6 = 178
	ieICMPCodeIPv6 = 179
)
