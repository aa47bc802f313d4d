// Package ipfix is the collector's flow ingest: IPFIX (RFC 7011), NetFlow
// v9 (RFC 3954) and NetFlow v5 message decoding straight into flow.Records
// through per-template compiled decode plans, and the TCP, UDP and TLS
// listeners that feed it. The version in each message's header picks the
// decoder, so one listener serves all three.
//
// The decoder reads any standard exporter, not only ours: several templates
// and data records per set, options templates, variable-length elements in
// both length forms, enterprise elements (unknown ones are skipped), template
// withdrawal and withdraw-all, templates scoped per session, protocol and
// observation domain, UDP template lifetime and refresh, RFC 5103 reverse
// elements and set padding. Elements are mapped by (enterprise, id) through the shared
// mapping of flow/ipfix (FieldOf), plus the IANA alternatives other
// exporters use (seconds, micro- and nanosecond and sysUpTime timestamps,
// postNAT destinations, ICMP type/code).
//
// Decoding allocates nothing per record in steady state: records are
// written into the caller's slice, strings are interned, and a template is
// compiled once and reused until it changes.
package ipfix

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

// Reason says why a message was dropped (label of
// dualflow_ipfix_messages_dropped_total).
type Reason uint8

const (
	ReasonNone             Reason = iota
	ReasonShort                   // shorter than a message header
	ReasonVersion                 // version is not 10, 9 or 5 (9 and 5 only over UDP)
	ReasonLength                  // header length disagrees with the bytes received
	ReasonSetLength               // a set header is truncated, below 4 or past the end
	ReasonTemplate                // a malformed template or options template record
	ReasonRecordLength            // a data record runs past its set (variable-length overflow)
	ReasonTooManyDomains          // the session has Limits.MaxDomains domains already
	ReasonTooManySessions         // the listener has its maximum number of sessions
	ReasonQueueFull               // decoded, then dropped: the pipeline queue was full (UDP)
	ReasonSourceNotAllowed        // from an address outside Config.AllowedSources (TCP/TLS: per connection refused)
	numReasons
)

var reasonNames = [numReasons]string{"none", "short", "version", "length", "set_length", "template",
	"record_length", "too_many_domains", "too_many_sessions", "queue_full", "source_not_allowed"}

func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return "unknown"
}

// Error is a message the decoder dropped.
type Error struct {
	Reason Reason
	Detail string
}

func (e *Error) Error() string {
	return "ipfix message dropped: " + e.Reason.String() + ": " + e.Detail
}

func dropf(r Reason, format string, args ...any) error {
	return &Error{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// Stats counts what a Decoder saw. The listener turns them into metrics.
type Stats struct {
	Messages uint64
	Dropped  [numReasons]uint64 // messages, by reason
	Records  uint64             // flow records decoded
	// NoAddress counts data records without a source or destination
	// address (L2-only flows of OVS, for example): skipped.
	NoAddress uint64
	// WrongDirection counts records skipped for their flowDirection (see
	// Direction).
	WrongDirection uint64
	// DirectionUntracked counts records with flowDirection kept without
	// tracking their tuple (DirectionAuto past its memory bound): an
	// exporter reporting packets twice may be counted twice for them.
	DirectionUntracked uint64
	// BothFamilies counts records whose template carries addresses of
	// both families and that filled both (a contradictory record): the
	// IPv6 pair is kept.
	BothFamilies uint64
	// ByVersion counts messages decoded per protocol: IPFIX, NetFlow v9,
	// NetFlow v5.
	ByVersion [3]uint64
	// OptionsRecords counts options data records (read, not forwarded).
	OptionsRecords uint64
	// UnknownSets counts data sets whose template is unknown or expired:
	// skipped, the rest of the message is decoded (RFC 7011 8).
	UnknownSets uint64
	Templates   uint64 // template and options template definitions, refreshes excluded
	Refreshes   uint64 // re-sent unchanged templates
	Withdrawn   uint64 // templates removed by withdrawal
	Expired     uint64 // UDP templates past their lifetime
	// TemplatesRejected counts definitions ignored by Limits
	// (too_many_templates, too many fields).
	TemplatesRejected uint64
	// TemplatesOverBudget counts definitions ignored because the
	// collector's template budget (Limits.Budget) was spent.
	TemplatesOverBudget uint64
	// SequenceLost counts data records (IPFIX; NetFlow v9 exporters that
	// count flows; v5 flows) that sequence numbers show missing.
	SequenceLost uint64
	// SequenceLostMessages counts messages that sequence numbers show
	// missing (NetFlow v9 counts export packets).
	SequenceLostMessages uint64
	// Stamped counts records whose times the decoder set, by reason (see
	// StampReason): without a usable time, or with an end out of the time
	// window.
	Stamped [numStampReasons]uint64
}

// Decoder decodes IPFIX messages into flow records. It holds the string
// intern cache and the counters of one reading goroutine; it is not safe
// for concurrent use. Sessions may be decoded by any one Decoder at a time.
type Decoder struct {
	Stats Stats
	// Direction selects records by their flowDirection element.
	Direction Direction
	// TimeWindow is how far a record's end may be from its message's
	// export time and from its receive time before it is stamped (see
	// StampReason); 0 is DefaultTimeWindow. TimeWindow(retention) keeps
	// every row for at least half the store's retention.
	TimeWindow time.Duration
	intern     interner
	specs      []spec // scratch for template parsing
	dir        int8   // flowDirection of the record just decoded, -1 for none
	// unusable is set when the record just decoded needs its times
	// stamped, missing then being the reason if it has none at all.
	unusable bool
	missing  StampReason
	// stamped is the reason of the last record stamped by the last
	// Decode, StampNone when none was (for the listener's log).
	stamped StampReason
	// Lost is what sequence numbers showed missing since the listener
	// last took it, by exporter address (the listener's per-exporter
	// metrics); nil until a loss. Stats.SequenceLost has the sums.
	Lost map[netip.Addr]Loss
}

// Loss is what an exporter's sequence numbers showed missing.
type Loss struct {
	Records, Messages uint64
}

func (d *Decoder) window() time.Duration {
	if d.TimeWindow > 0 {
		return d.TimeWindow
	}
	return DefaultTimeWindow
}

// Direction selects records by their flowDirection element (IANA 61;
// NetFlow v9 field 61). Exporters mean two different things by it:
//
//   - Open vSwitch samples a packet at the input and at the output port of
//     a bridge and reports it twice, once per direction, with the same
//     tuple: counting both would double every counter.
//   - softflowd (and routers reporting per interface) mark the reply flow
//     of a connection egress: a different tuple, different packets.
//
// DirectionAuto, the default, tells them apart per observation domain and
// tuple: for each directional tuple (source and destination address and
// port, protocol) the records of the direction seen first are kept and
// those of the other direction, the same packets seen again, are skipped.
// Reply flows have the reversed tuple and are kept. Records without the
// element are always kept.
type Direction uint8

const (
	// DirectionAuto keeps one direction per tuple (see Direction). The
	// default.
	DirectionAuto Direction = iota
	// DirectionIngress keeps records observed on the way in (and records
	// without flowDirection).
	DirectionIngress
	// DirectionEgress keeps records observed on the way out, for an
	// exporter that samples output only.
	DirectionEgress
	// DirectionBoth keeps every record.
	DirectionBoth
)

var directionNames = [...]string{"auto", "ingress", "egress", "both"}

// Set implements flag.Value: "auto", "ingress", "egress" or "both".
func (d *Direction) Set(s string) error {
	for i, n := range directionNames {
		if s == n {
			*d = Direction(i)
			return nil
		}
	}
	return fmt.Errorf("flow direction %q: want auto, ingress, egress or both", s)
}

func (d Direction) String() string {
	if int(d) < len(directionNames) {
		return directionNames[d]
	}
	return fmt.Sprintf("Direction(%d)", uint8(d))
}

// keep reports whether a record of flowDirection dir (0 ingress, 1
// egress) is kept.
func (d *Decoder) keep(r *flow.Record, dir int8, mc *msgCtx) bool {
	switch d.Direction {
	case DirectionIngress:
		return dir == 0
	case DirectionEgress:
		return dir == 1
	case DirectionBoth:
		return true
	}
	keep, untracked := mc.domain.dirs.keep(r, dir, mc.now, mc.session)
	if untracked {
		d.Stats.DirectionUntracked++
	}
	return keep
}

// NewDecoder returns a Decoder.
func NewDecoder() *Decoder { return &Decoder{specs: make([]spec, 0, 64)} }

// msgCtx is what the records of one message share.
type msgCtx struct {
	now        time.Time
	exportTime uint32
	domain     *domain
	exporter   netip.Addr
	// uptime is the exporter's sysUptime (ms) at export, which NetFlow
	// v9's FIRST_SWITCHED and LAST_SWITCHED are relative to (hasUptime).
	uptime    uint32
	hasUptime bool
	source    string // Source of records that do not carry one
	session   *Session
	clock     clock // what the records' times are checked against
}

// Decode decodes one IPFIX, NetFlow v9 or NetFlow v5 message of session s,
// received at now, and appends its flow records to dst. NetFlow has no
// length field, so it is accepted over UDP only (a datagram is a message). On a malformed message it returns dst
// unchanged and an *Error; template changes made by the sets before the
// malformed one are kept. Records are Normalize()d and carry the exporter
// address, observation domain and now as TimeReceived; records without
// usable times are stamped and counted (see StampReason).
func (d *Decoder) Decode(s *Session, msg []byte, now time.Time, dst []flow.Record) ([]flow.Record, error) {
	d.Stats.Messages++
	d.stamped = StampNone
	start := len(dst)
	var out []flow.Record
	var err error
	switch v := version(msg); {
	case v == fipfix.Version:
		d.Stats.ByVersion[protoIPFIX]++
		out, err = d.decode(s, msg, now, dst)
	case v == 9 && s.Transport == UDP:
		d.Stats.ByVersion[protoV9]++
		out, err = d.decodeV9(s, msg, now, dst)
	case v == 5 && s.Transport == UDP:
		d.Stats.ByVersion[protoV5]++
		out, err = d.decodeV5(s, msg, now, dst)
	case len(msg) < 2:
		err = dropf(ReasonShort, "%d bytes", len(msg))
	case v == 9 || v == 5:
		err = dropf(ReasonVersion, "NetFlow v%d over %s: NetFlow is accepted over UDP only", v, s.Transport)
	default:
		err = dropf(ReasonVersion, "version %d (want 10, 9 or 5)", v)
	}
	if err != nil {
		if e, ok := err.(*Error); ok {
			d.Stats.Dropped[e.Reason]++
		}
		return dst[:start], err
	}
	d.Stats.Records += uint64(len(out) - start)
	return out, nil
}

// version is the version field of a message, or 0 when it is too short.
func version(msg []byte) uint16 {
	if len(msg) < 2 {
		return 0
	}
	return binary.BigEndian.Uint16(msg)
}

func (d *Decoder) decode(s *Session, msg []byte, now time.Time, dst []flow.Record) ([]flow.Record, error) {
	if len(msg) < fipfix.MessageHeaderLen {
		return dst, dropf(ReasonShort, "%d bytes", len(msg))
	}
	if l := int(binary.BigEndian.Uint16(msg[2:])); l != len(msg) {
		return dst, dropf(ReasonLength, "header says %d bytes, got %d", l, len(msg))
	}
	seq := binary.BigEndian.Uint32(msg[8:])
	dom := s.domain(protoIPFIX, binary.BigEndian.Uint32(msg[12:]))
	if dom == nil {
		return dst, dropf(ReasonTooManyDomains, "domain %d", binary.BigEndian.Uint32(msg[12:]))
	}
	export := binary.BigEndian.Uint32(msg[4:])
	mc := msgCtx{now: now, exportTime: export, domain: dom, exporter: s.exporter,
		source: fipfix.SourceForeign, session: s, clock: newClock(time.Unix(int64(export), 0), now, d.window())}
	dst, err := d.sets(s, msg[fipfix.MessageHeaderLen:], protoIPFIX, seq, &mc, dst)
	return dst, err
}

// sets decodes the sets (NetFlow v9: flowsets) of a message body of
// protocol p, IPFIX or NetFlow v9, which differ only in their template set
// IDs and in v9's tolerance of zero padding at the end of a packet, then
// checks the message's sequence number seq.
func (d *Decoder) sets(s *Session, body []byte, p protocol, seq uint32, mc *msgCtx, dst []flow.Record) ([]flow.Record, error) {
	what := "set"
	if p == protoV9 {
		what = "netflow v9 flowset"
	}
	dom, now := mc.domain, mc.now
	var cnt seqCounts
	for len(body) > 0 {
		if len(body) < fipfix.SetHeaderLen {
			if p == protoV9 && allZero(body) {
				break // packet padding
			}
			return dst, dropf(ReasonSetLength, "%d bytes left for a %s header", len(body), what)
		}
		id := binary.BigEndian.Uint16(body)
		l := int(binary.BigEndian.Uint16(body[2:]))
		if l < fipfix.SetHeaderLen || l > len(body) {
			return dst, dropf(ReasonSetLength, "%s %d: length %d with %d bytes left", what, id, l, len(body))
		}
		set := body[fipfix.SetHeaderLen:l]
		body = body[l:]
		var err error
		var n int
		switch {
		case p == protoIPFIX && (id == setTemplate || id == setOptionsTemplate):
			n, err = d.templateSet(s, dom, set, id == setOptionsTemplate, now)
			cnt.templates += uint32(n)
		case p == protoV9 && (id == v9SetTemplate || id == v9SetOptions):
			n, err = d.templateSetV9(s, dom, set, id == v9SetOptions, now)
			cnt.templates += uint32(n)
		case id >= fipfix.MinDataSetID:
			t := d.liveTemplate(s, dom, id, now)
			if t == nil {
				d.Stats.UnknownSets++
				cnt.unknown = true
				continue
			}
			dst, n, err = d.dataSet(t, set, mc, dst)
			cnt.data += uint32(n)
			if t.options {
				cnt.options += uint32(n)
			}
		default:
			// Reserved set IDs (IPFIX: 0, 1 (NetFlow v9's) and 4-255;
			// v9: 2-255): skipped.
		}
		if err != nil {
			return dst, err
		}
	}
	s.note(cnt, now)
	d.sequence(s, dom, p, seq, cnt)
	return dst, nil
}

// Set IDs of template and options template sets.
const (
	setTemplate        = 2
	setOptionsTemplate = 3
)

// templateSet reads the template (or options template) records of a set
// and returns how many definitions it held.
func (d *Decoder) templateSet(s *Session, dom *domain, set []byte, options bool, now time.Time) (int, error) {
	n := 0
	wantID := uint16(setTemplate)
	hdr := 4 // template ID, field count
	if options {
		wantID, hdr = setOptionsTemplate, 6 // + scope field count
	}
	for len(set) >= 4 {
		id := binary.BigEndian.Uint16(set)
		count := int(binary.BigEndian.Uint16(set[2:]))
		if count == 0 {
			// Withdrawal (RFC 7011 8.1): of one template, or of all of
			// this set's kind when the ID is the set ID.
			switch {
			case id == wantID:
				d.Stats.Withdrawn += uint64(s.withdrawAll(dom, options))
			case id >= fipfix.MinDataSetID:
				if s.removeTemplate(dom, id) {
					d.Stats.Withdrawn++
				}
			case allZero(set):
				return n, nil // padding
			default:
				return n, dropf(ReasonTemplate, "withdrawal of template %d", id)
			}
			set = set[4:]
			continue
		}
		if id < fipfix.MinDataSetID {
			if allZero(set) {
				return n, nil
			}
			return n, dropf(ReasonTemplate, "template ID %d below 256", id)
		}
		if len(set) < hdr {
			return n, dropf(ReasonTemplate, "template %d: truncated header", id)
		}
		if options {
			scope := int(binary.BigEndian.Uint16(set[4:]))
			if scope == 0 || scope > count {
				return n, dropf(ReasonTemplate, "options template %d: %d scope fields of %d", id, scope, count)
			}
		}
		specs, l, err := d.parseSpecs(set, hdr, count)
		if err != nil {
			return n, dropf(ReasonTemplate, "template %d: %v", id, err)
		}
		d.install(s, dom, id, options, set[:l], specs, now)
		set = set[l:]
		n++
	}
	return n, nil // fewer than 4 bytes left: padding
}

// parseSpecs reads count field specifiers after the record header of hdr
// bytes and returns them with the record's length.
func (d *Decoder) parseSpecs(rec []byte, hdr, count int) ([]spec, int, error) {
	specs := d.specs[:0]
	p := hdr
	minLen := 0
	for range count {
		if p+4 > len(rec) {
			return nil, 0, fmt.Errorf("truncated after %d of %d fields", len(specs), count)
		}
		sp := spec{id: binary.BigEndian.Uint16(rec[p:]), length: binary.BigEndian.Uint16(rec[p+2:])}
		p += 4
		if sp.id&0x8000 != 0 {
			if p+4 > len(rec) {
				return nil, 0, fmt.Errorf("truncated enterprise number of field %d", len(specs))
			}
			sp.id &^= 0x8000
			sp.enterprise = binary.BigEndian.Uint32(rec[p:])
			p += 4
		}
		if sp.length == varLen {
			minLen++
		} else {
			minLen += int(sp.length)
		}
		specs = append(specs, sp)
	}
	d.specs = specs
	if minLen == 0 {
		return nil, 0, fmt.Errorf("data records of length 0")
	}
	if minLen > fipfix.MaxMessageLen {
		return nil, 0, fmt.Errorf("data records of at least %d bytes", minLen)
	}
	return specs, p, nil
}

// install adds or refreshes a template. An unchanged re-definition only
// refreshes its lifetime; a changed one is recompiled. Definitions past the
// session's limits are ignored and counted.
func (d *Decoder) install(s *Session, dom *domain, id uint16, options bool, raw []byte, specs []spec, now time.Time) {
	if old := dom.templates[id]; old != nil {
		if old.options == options && string(old.raw) == string(raw) {
			old.seen = now
			d.Stats.Refreshes++
			return
		}
		s.removeTemplate(dom, id)
	}
	if len(specs) > s.lim.MaxFields || s.templates >= s.lim.MaxTemplates {
		d.Stats.TemplatesRejected++
		return
	}
	size := templateSize(len(raw), len(specs))
	if s.bytes+size > s.lim.MaxTemplateBytes {
		d.Stats.TemplatesRejected++
		return
	}
	if !s.lim.Budget.take(size) {
		d.Stats.TemplatesOverBudget++
		return
	}
	t := compile(id, options, raw, specs)
	t.seen = now
	dom.templates[id] = t
	s.templates++
	s.bytes += t.size()
	d.Stats.Templates++
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// dataSet decodes the records of a data set of template t and returns how
// many data records it held (for the sequence number).
func (d *Decoder) dataSet(t *template, set []byte, mc *msgCtx, dst []flow.Record) ([]flow.Record, int, error) {
	n := 0
	if t.options {
		for len(set) >= t.minLen {
			l, err := d.options(t, set, mc.domain)
			if err != nil {
				return dst, n, err
			}
			set = set[l:]
			n++
			d.Stats.OptionsRecords++
		}
		return dst, n, nil // the rest is padding
	}
	for len(set) >= t.minLen {
		dst = append(dst, flow.Record{})
		r := &dst[len(dst)-1]
		l, err := d.record(t, set, r, mc)
		if err != nil {
			return dst[:len(dst)-1], n, err
		}
		set = set[l:]
		n++
		switch {
		case !r.SrcAddr.IsValid() || !r.DstAddr.IsValid():
			dst = dst[:len(dst)-1]
			d.Stats.NoAddress++
		case d.dir >= 0 && !d.keep(r, d.dir, mc):
			dst = dst[:len(dst)-1]
			d.Stats.WrongDirection++
		case d.unusable: // kept: stamped and counted
			d.stamp(r, &mc.clock, d.missing)
		}
	}
	return dst, n, nil
}

// options reads one options data record: only systemInitTimeMilliseconds
// is kept, for sysUpTime-relative flow times.
func (d *Decoder) options(t *template, b []byte, dom *domain) (int, error) {
	p := 0
	for _, f := range t.fields {
		l := int(f.len)
		if f.len == varLen {
			var err error
			if l, p, err = varLength(b, p); err != nil {
				return 0, err
			}
		}
		if p+l > len(b) {
			return 0, dropf(ReasonRecordLength, "options template %d: field past the set end", t.id)
		}
		if f.op == opSysInit {
			dom.sysInitMs = uintN(b[p : p+l])
		}
		p += l
	}
	return p, nil
}

// varLength reads a variable-length prefix at b[p:] (1 byte, or 255 and 2
// bytes) and returns the length and the position after the prefix.
func varLength(b []byte, p int) (int, int, error) {
	if p >= len(b) {
		return 0, 0, dropf(ReasonRecordLength, "variable-length prefix past the set end")
	}
	l := int(b[p])
	p++
	if l == 255 {
		if p+2 > len(b) {
			return 0, 0, dropf(ReasonRecordLength, "3-byte variable-length prefix past the set end")
		}
		l = int(binary.BigEndian.Uint16(b[p:]))
		p += 2
	}
	return l, p, nil
}

// uintN reads a big-endian unsigned integer of 1 to 8 bytes (reduced-size
// encoding, RFC 7011 6.2).
func uintN(b []byte) uint64 {
	switch len(b) {
	case 1:
		return uint64(b[0])
	case 2:
		return uint64(binary.BigEndian.Uint16(b))
	case 4:
		return uint64(binary.BigEndian.Uint32(b))
	case 8:
		return binary.BigEndian.Uint64(b)
	}
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

// scratch holds the elements of one record that fill a field only in
// combination or as a fallback.
type scratch struct {
	startSec, endSec             uint64
	startNTP, endNTP             uint64
	startUp, endUp, sysInit      uint64
	startDelta, endDelta         uint64
	duration                     uint64
	natDst                       netip.Addr
	src4, dst4, src6, dst6       netip.Addr // templates with both families' addresses
	natDstPort                   uint16
	hasStartDelta, hasEndDelta   bool
	ingressName, ingressNS       string
	egressName, egressNS         string
	ingressAction, egressAction  uint8
	hasStartUp, hasEndUp, hasSys bool
}

// record decodes one data record of t at the start of b into r (zero on
// entry) and returns its length. It leaves for dataSet the record's
// flowDirection (d.dir) and whether its times need stamping (d.unusable,
// d.missing): only records that are kept are stamped and counted.
func (d *Decoder) record(t *template, b []byte, r *flow.Record, mc *msgCtx) (int, error) {
	var sc scratch
	p := 0
	d.dir = -1
	for i := range t.fields {
		f := &t.fields[i]
		l := int(f.len)
		if f.len == varLen {
			var err error
			if l, p, err = varLength(b, p); err != nil {
				return 0, err
			}
		}
		if p+l > len(b) {
			return 0, dropf(ReasonRecordLength, "template %d: field %d past the set end", t.id, i)
		}
		v := b[p : p+l]
		p += l
		switch f.op {
		case opSkip:
		case opField + op(fipfix.FieldFlowStartMillis):
			r.FlowStart = fromMillis(uintN(v))
		case opField + op(fipfix.FieldFlowEndMillis):
			r.FlowEnd = fromMillis(uintN(v))
		case opField + op(fipfix.FieldEndReason):
			r.EndReason = flow.EndReason(uintN(v))
		case opField + op(fipfix.FieldSrcAddr4):
			r.SrcAddr = netip.AddrFrom4([4]byte(v))
		case opField + op(fipfix.FieldDstAddr4):
			r.DstAddr = netip.AddrFrom4([4]byte(v))
		case opField + op(fipfix.FieldSrcAddr6):
			r.SrcAddr = netip.AddrFrom16([16]byte(v))
		case opField + op(fipfix.FieldDstAddr6):
			r.DstAddr = netip.AddrFrom16([16]byte(v))
		case opDualSrc4:
			sc.src4 = netip.AddrFrom4([4]byte(v))
		case opDualDst4:
			sc.dst4 = netip.AddrFrom4([4]byte(v))
		case opDualSrc6:
			sc.src6 = netip.AddrFrom16([16]byte(v))
		case opDualDst6:
			sc.dst6 = netip.AddrFrom16([16]byte(v))
		case opField + op(fipfix.FieldSrcPort):
			r.SrcPort = uint16(uintN(v))
		case opField + op(fipfix.FieldDstPort):
			// A zero port leaves what an ICMP type and code element
			// read before it set (opICMPTypeCode, opICMPType/Code).
			if p := uint16(uintN(v)); p != 0 {
				r.DstPort = p
			}
		case opField + op(fipfix.FieldProto):
			r.Proto = uint8(uintN(v))
		case opField + op(fipfix.FieldPackets):
			r.Packets = uintN(v)
		case opField + op(fipfix.FieldBytes):
			r.Bytes = uintN(v)
		case opField + op(fipfix.FieldPacketsDelta):
			r.PacketsDelta = uintN(v)
		case opField + op(fipfix.FieldBytesDelta):
			r.BytesDelta = uintN(v)
		case opField + op(fipfix.FieldReversePackets):
			r.ReversePackets = uintN(v)
		case opField + op(fipfix.FieldReverseBytes):
			r.ReverseBytes = uintN(v)
		case opField + op(fipfix.FieldReversePacketsDelta):
			r.ReversePacketsDelta = uintN(v)
		case opField + op(fipfix.FieldReverseBytesDelta):
			r.ReverseBytesDelta = uintN(v)
		case opField + op(fipfix.FieldSNATAddr4):
			setAddr(&r.SNATAddr, addr4(v))
		case opField + op(fipfix.FieldSNATAddr6):
			setAddr(&r.SNATAddr, addr16(v))
		case opField + op(fipfix.FieldSNATPort):
			if p := uint16(uintN(v)); p != 0 {
				r.SNATPort = p
			}
		case opField + op(fipfix.FieldServiceAddr4):
			setAddr(&r.ServiceAddr, addr4(v))
		case opField + op(fipfix.FieldServiceAddr6):
			setAddr(&r.ServiceAddr, addr16(v))
		case opField + op(fipfix.FieldServicePort):
			if p := uint16(uintN(v)); p != 0 {
				r.ServicePort = p
			}
		case opField + op(fipfix.FieldServicePortName):
			r.Service = fipfix.ParseServicePortName(d.str(f.op, v))
		case opField + op(fipfix.FieldFlowType):
			r.Type = flow.FlowType(uintN(v))
		case opField + op(fipfix.FieldZone):
			r.Zone = uint16(uintN(v))
		case opField + op(fipfix.FieldMark):
			r.Mark = uint32(uintN(v))
		case opField + op(fipfix.FieldTCPState):
			r.TCPState = d.str(f.op, v)
		case opField + op(fipfix.FieldSrcNodeName):
			r.Src.NodeName = d.str(f.op, v)
		case opField + op(fipfix.FieldDstNodeName):
			r.Dst.NodeName = d.str(f.op, v)
		case opField + op(fipfix.FieldSrcPodNamespace):
			r.Src.PodNamespace = d.str(f.op, v)
		case opField + op(fipfix.FieldSrcPodName):
			r.Src.PodName = d.str(f.op, v)
		case opField + op(fipfix.FieldDstPodNamespace):
			r.Dst.PodNamespace = d.str(f.op, v)
		case opField + op(fipfix.FieldDstPodName):
			r.Dst.PodName = d.str(f.op, v)
		case opField + op(fipfix.FieldExporterNode):
			r.ExporterNode = d.str(f.op, v)
		case opField + op(fipfix.FieldSource):
			r.Source = d.str(f.op, v)
		case opField + op(fipfix.FieldFlowStartSeconds):
			sc.startSec = uintN(v)
		case opField + op(fipfix.FieldFlowEndSeconds):
			sc.endSec = uintN(v)
		case opField + op(fipfix.FieldIngressPolicyName):
			sc.ingressName = d.str(f.op, v)
		case opField + op(fipfix.FieldIngressPolicyNamespace):
			sc.ingressNS = d.str(f.op, v)
		case opField + op(fipfix.FieldEgressPolicyName):
			sc.egressName = d.str(f.op, v)
		case opField + op(fipfix.FieldEgressPolicyNamespace):
			sc.egressNS = d.str(f.op, v)
		case opField + op(fipfix.FieldIngressAction):
			sc.ingressAction = uint8(uintN(v))
		case opField + op(fipfix.FieldEgressAction):
			sc.egressAction = uint8(uintN(v))
		case opStartMicros, opStartNanos:
			sc.startNTP = uintN(v)
		case opEndMicros, opEndNanos:
			sc.endNTP = uintN(v)
		case opStartUptime:
			sc.startUp, sc.hasStartUp = uintN(v), true
		case opEndUptime:
			sc.endUp, sc.hasEndUp = uintN(v), true
		case opSysInit:
			sc.sysInit, sc.hasSys = uintN(v), true
		case opStartDeltaMicro:
			sc.startDelta, sc.hasStartDelta = uintN(v), true
		case opEndDeltaMicro:
			sc.endDelta, sc.hasEndDelta = uintN(v), true
		case opDurationMillis:
			sc.duration = uintN(v)
		case opPostNATDst4:
			setAddr(&sc.natDst, addr4(v))
		case opPostNATDst6:
			setAddr(&sc.natDst, addr16(v))
		case opPostNAPTDstPort:
			sc.natDstPort = uint16(uintN(v))
		case opICMPTypeCode:
			if r.DstPort == 0 {
				r.DstPort = uint16(uintN(v))
			}
		case opICMPType:
			r.DstPort = r.DstPort&0xff | uint16(uintN(v))<<8
		case opICMPCode:
			r.DstPort = r.DstPort&0xff00 | uint16(uintN(v))&0xff
		case opFlowDirection:
			d.dir = int8(min(uintN(v), 1)) // 0 ingress, 1 egress (other values are undefined: egress)
		}
	}
	if t.post != 0 {
		d.fixup(t.post, &sc, r, mc)
	}
	if d.unusable = !mc.clock.usable(r); d.unusable {
		d.missing = missingTime(t, &sc, mc)
	}
	pairAddrs(r)
	r.Ingress.Rule, r.Egress.Rule = -1, -1
	if r.Source == "" {
		r.Source = mc.source
	}
	r.ExporterAddr = mc.exporter
	r.ObservationDomainID = mc.domain.id
	r.TimeReceived = mc.now
	r.Normalize()
	return p, nil
}

// str returns the string of field op's value v, interned (interner.field).
func (d *Decoder) str(o op, v []byte) string { return d.intern.field(fipfix.Field(o-opField), v) }

// ntpEpochOffset is the number of seconds from 1900-01-01 (NTP era 0) to
// the Unix epoch.
const ntpEpochOffset = 2_208_988_800

// fixup applies the combined and fallback elements of one record.
func (d *Decoder) fixup(pf post, sc *scratch, r *flow.Record, mc *msgCtx) {
	if pf&postSeconds != 0 {
		if r.FlowStart.IsZero() && sc.startSec != 0 {
			r.FlowStart = time.Unix(int64(sc.startSec), 0)
		}
		if r.FlowEnd.IsZero() && sc.endSec != 0 {
			r.FlowEnd = time.Unix(int64(sc.endSec), 0)
		}
	}
	if pf&postNTP != 0 {
		if r.FlowStart.IsZero() && sc.startNTP != 0 {
			r.FlowStart = fromNTP(sc.startNTP)
		}
		if r.FlowEnd.IsZero() && sc.endNTP != 0 {
			r.FlowEnd = fromNTP(sc.endNTP)
		}
	}
	if pf&postUptime != 0 && mc.hasUptime {
		// NetFlow v9: relative to the header's sysUptime.
		export := time.Unix(int64(mc.exportTime), 0)
		first, last := uint32(sc.startUp), uint32(sc.endUp)
		start, end := uptimeTime(export, mc.uptime, first), uptimeTime(export, mc.uptime, last)
		if first == 0 || last == 0 {
			start, end = zeroSwitched(export, mc.uptime, first, last)
		}
		if r.FlowStart.IsZero() && sc.hasStartUp {
			r.FlowStart = start
		}
		if r.FlowEnd.IsZero() && sc.hasEndUp {
			r.FlowEnd = end
		}
	}
	if pf&postUptime != 0 && !mc.hasUptime {
		sys := mc.domain.sysInitMs
		if sc.hasSys {
			sys = sc.sysInit
		}
		if sys != 0 {
			export := int64(mc.exportTime) * 1000
			if r.FlowStart.IsZero() && sc.hasStartUp {
				r.FlowStart = time.UnixMilli(sysUpTime(sys, sc.startUp, export))
			}
			if r.FlowEnd.IsZero() && sc.hasEndUp {
				r.FlowEnd = time.UnixMilli(sysUpTime(sys, sc.endUp, export))
			}
		}
	}
	if pf&postDelta != 0 {
		export := time.Unix(int64(mc.exportTime), 0)
		if r.FlowStart.IsZero() && sc.hasStartDelta {
			r.FlowStart = export.Add(-time.Duration(sc.startDelta) * time.Microsecond)
		}
		if r.FlowEnd.IsZero() && sc.hasEndDelta {
			r.FlowEnd = export.Add(-time.Duration(sc.endDelta) * time.Microsecond)
		}
	}
	if pf&postDuration != 0 && r.FlowEnd.IsZero() && !r.FlowStart.IsZero() && sc.duration != 0 {
		r.FlowEnd = r.FlowStart.Add(time.Duration(sc.duration) * time.Millisecond)
	}
	if pf&postDual != 0 {
		v4 := filled(sc.src4, sc.dst4)
		v6 := filled(sc.src6, sc.dst6)
		switch {
		case v6:
			// Both pairs filled is a contradiction the record cannot
			// resolve: counted, and IPv6 kept (preferred when both exist).
			if v4 {
				d.Stats.BothFamilies++
			}
			r.SrcAddr, r.DstAddr = sc.src6, sc.dst6
		case v4:
			r.SrcAddr, r.DstAddr = sc.src4, sc.dst4
		default:
			// One address of each family (an IPv4 source element, an
			// IPv6 destination one): a pair only when both are of one
			// family, the IPv6 one 4-in-6 mapped; else no address.
			src, dst := cmp.Or(sc.src4, sc.src6), cmp.Or(sc.dst4, sc.dst6)
			if filled(src, dst) && src.Unmap().Is4() == dst.Unmap().Is4() {
				r.SrcAddr, r.DstAddr = src, dst
			}
		}
	}
	if pf&postNATDst != 0 && sc.natDst.IsValid() && sc.natDst != r.DstAddr {
		// IANA reading: destination* is pre-NAT (the Service), postNAT*
		// the endpoint reached. Ours: DstAddr is the endpoint.
		r.ServiceAddr, r.ServicePort = r.DstAddr, r.DstPort
		r.DstAddr = sc.natDst
		if sc.natDstPort != 0 {
			r.DstPort = sc.natDstPort
		}
	}
	if pf&postPolicy != 0 {
		r.Ingress.ReportedName = joinName(sc.ingressNS, sc.ingressName)
		r.Ingress.ReportedVerdict = fipfix.AntreaVerdict(sc.ingressAction)
		r.Egress.ReportedName = joinName(sc.egressNS, sc.egressName)
		r.Egress.ReportedVerdict = fipfix.AntreaVerdict(sc.egressAction)
	}
}

// sysUpTime is the time (Unix ms) of flowStart/EndSysUpTime up, ms after
// the exporter's initialisation at sys (Unix ms), in a message exported at
// export (Unix ms). The element is 32 bits: past 49.7 days it wraps, and
// softflowd reading a capture file sends flows from before its own start
// as negative values. The reading taken is the one within 2^31 ms of the
// export time, the only one a flow exported now can have.
func sysUpTime(sys, up uint64, export int64) int64 {
	t := int64(sys + up)
	if up > 0xffff_ffff || export == 0 {
		return t
	}
	const wrap = 1 << 32
	d := (t - export) & (wrap - 1) // t - export modulo 2^32, in [0, 2^32)
	if d > wrap/2 {
		d -= wrap
	}
	return export + d
}

func joinName(ns, name string) string {
	if ns == "" || name == "" {
		return name
	}
	return ns + "/" + name
}

func fromMillis(ms uint64) time.Time {
	if ms == 0 || ms > 1<<62 {
		return time.Time{}
	}
	return time.UnixMilli(int64(ms))
}

// fromNTP converts an RFC 7011 dateTimeMicroseconds/Nanoseconds value (NTP
// seconds since 1900 and a 32-bit fraction).
func fromNTP(v uint64) time.Time {
	sec := int64(v>>32) - ntpEpochOffset
	frac := int64(v & 0xffffffff)
	return time.Unix(sec, frac*1e9>>32)
}

// addr4 and addr16 read an address; the unspecified address (our "none")
// reads as the zero Addr.
func addr4(v []byte) netip.Addr {
	a := netip.AddrFrom4([4]byte(v))
	if a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}

func addr16(v []byte) netip.Addr {
	a := netip.AddrFrom16([16]byte(v)).Unmap()
	if a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}

// filled reports whether an address pair read from a record holds an
// address: both elements present and not both unspecified (a zero-filled
// pair means "no address of this family").
func filled(src, dst netip.Addr) bool {
	return src.IsValid() && dst.IsValid() && !(src.Unmap().IsUnspecified() && dst.Unmap().IsUnspecified())
}

// pairAddrs leaves a record's source and destination as read when the pair
// holds an address, an unspecified source included (IPv6 duplicate address
// detection and MLD are sent from ::, DHCP discovery from 0.0.0.0), and
// clears both when it does not: such a record has no address.
func pairAddrs(r *flow.Record) {
	if !filled(r.SrcAddr, r.DstAddr) {
		r.SrcAddr, r.DstAddr = netip.Addr{}, netip.Addr{}
	}
}

func setAddr(dst *netip.Addr, a netip.Addr) {
	if a.IsValid() {
		*dst = a
	}
}
