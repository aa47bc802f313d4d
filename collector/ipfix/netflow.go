package ipfix

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

// NetFlow v9 (RFC 3954) and v5 arrive on the same listeners as IPFIX: the
// version is the first two bytes of every message. v9 is template based
// like IPFIX and its field types 1-127 are IPFIX's element IDs, so its
// templates compile into the same decode plans; v5 has one fixed record
// layout and is decoded directly.
//
// Neither has a length field: a message is one UDP datagram. Over TCP or
// TLS, where messages are framed by the IPFIX length field, they are
// refused: the message counts as reason version and the session is closed
// (bad_framing), as the rest of the stream cannot be framed.
//
// An IPFIX domain and the v9 source ID of the same number are distinct
// domains (Session): each protocol has its own templates.

// Source values of records decoded from NetFlow (the flows table's source
// column); IPFIX from a foreign exporter is fipfix.SourceForeign.
const (
	SourceNetFlow9 = "netflow9"
	SourceNetFlow5 = "netflow5"
)

// Wire constants of NetFlow v9 and v5.
const (
	v9HeaderLen         = 20 // version, count, sysUptime, unix secs, sequence, source ID
	v9SetTemplate       = 0
	v9SetOptions        = 1
	v5HeaderLen         = 24
	v5RecordLen         = 48
	v5MaxRecords        = 30
	enterpriseV9Vendor  = 0xffffffff // v9 field types ≥ 32768 and scope fields: skipped
	maxV9FixedFieldSize = 0xfffe     // 0xffff is IPFIX's variable length; v9 has none
)

// decodeV9 decodes a NetFlow v9 export packet.
func (d *Decoder) decodeV9(s *Session, msg []byte, now time.Time, dst []flow.Record) ([]flow.Record, error) {
	if len(msg) < v9HeaderLen {
		return dst, dropf(ReasonShort, "netflow v9: %d bytes", len(msg))
	}
	uptime := binary.BigEndian.Uint32(msg[4:])
	secs := binary.BigEndian.Uint32(msg[8:])
	seq := binary.BigEndian.Uint32(msg[12:])
	srcID := binary.BigEndian.Uint32(msg[16:])
	dom := s.domain(protoV9, srcID)
	if dom == nil {
		return dst, dropf(ReasonTooManyDomains, "source ID %d", srcID)
	}
	mc := msgCtx{now: now, exportTime: secs, domain: dom, exporter: s.exporter,
		uptime: uptime, hasUptime: true, source: SourceNetFlow9, session: s,
		clock: newClock(time.Unix(int64(secs), 0), now, d.window())}
	return d.sets(s, msg[v9HeaderLen:], protoV9, seq, &mc, dst)
}

// templateSetV9 reads the template records of a v9 template flowset, or
// with options those of an options flowset, and returns how many it held.
// Options scope fields (system, interface, line card, cache, template) are
// not IPFIX elements and are skipped; option fields are read like IPFIX's.
func (d *Decoder) templateSetV9(s *Session, dom *domain, set []byte, options bool, now time.Time) (int, error) {
	kind, hdr := "template", 4 // template ID, field count
	if options {
		kind, hdr = "options template", 6 // template ID, scope and option lengths
	}
	n := 0
	for len(set) >= hdr {
		id := binary.BigEndian.Uint16(set)
		scope, fields := 0, 4*int(binary.BigEndian.Uint16(set[2:])) // bytes of scope fields, of all fields
		if options {
			scope = int(binary.BigEndian.Uint16(set[2:]))
			fields = scope + int(binary.BigEndian.Uint16(set[4:]))
		}
		if id < fipfix.MinDataSetID || fields == 0 {
			if allZero(set) {
				return n, nil // padding
			}
			return n, dropf(ReasonTemplate, "netflow v9 %s %d with %d bytes of fields", kind, id, fields)
		}
		rl := hdr + fields
		if scope%4 != 0 || fields%4 != 0 || rl > len(set) {
			return n, dropf(ReasonTemplate, "netflow v9 %s %d: %d bytes of fields (%d of scope), %d left", kind, id, fields, scope, len(set)-hdr)
		}
		specs := d.specs[:0]
		for p := hdr; p < rl; p += 4 {
			sp := spec{id: binary.BigEndian.Uint16(set[p:]), length: binary.BigEndian.Uint16(set[p+2:])}
			if p < hdr+scope || sp.id&0x8000 != 0 {
				sp.enterprise = enterpriseV9Vendor
			}
			specs = append(specs, sp)
		}
		d.specs = specs
		if err := checkV9Specs(specs); err != nil {
			return n, dropf(ReasonTemplate, "netflow v9 %s %d: %v", kind, id, err)
		}
		d.install(s, dom, id, options, set[:rl], specs, now)
		set = set[rl:]
		n++
		// Records follow each other back to back (RFC 3954 6.1 pads the
		// flowset's end); some exporters pad each options record to 4
		// bytes. A template ID is at least 256, so its first byte is never
		// 0: zero bytes up to the alignment are padding.
		if pad := (4 - rl%4) % 4; pad > 0 && len(set) >= pad && allZero(set[:pad]) {
			set = set[pad:]
		}
	}
	return n, nil
}

// checkV9Specs refuses what v9 cannot express: variable-length fields
// (IPFIX's 0xffff) and records of length 0.
func checkV9Specs(specs []spec) error {
	total := 0
	for i, sp := range specs {
		if sp.length > maxV9FixedFieldSize {
			return fmt.Errorf("field %d (type %d) of length %d", i, sp.id, sp.length)
		}
		total += int(sp.length)
	}
	if total == 0 {
		return fmt.Errorf("data records of length 0")
	}
	return nil
}

// liveTemplate returns template id of dom, or nil when it is unknown or,
// over UDP, past its lifetime (then it is removed).
func (d *Decoder) liveTemplate(s *Session, dom *domain, id uint16, now time.Time) *template {
	t := dom.templates[id]
	if t != nil && s.Transport == UDP && now.Sub(t.seen) > s.lim.TemplateLifetime {
		s.removeTemplate(dom, id)
		d.Stats.Expired++
		t = nil
	}
	return t
}

// decodeV5 decodes a NetFlow v5 export packet: a 24-byte header and up to
// 30 fixed 48-byte IPv4 records. The engine type and ID form the
// observation domain (engine_type<<8 | engine_id).
func (d *Decoder) decodeV5(s *Session, msg []byte, now time.Time, dst []flow.Record) ([]flow.Record, error) {
	if len(msg) < v5HeaderLen {
		return dst, dropf(ReasonShort, "netflow v5: %d bytes", len(msg))
	}
	count := int(binary.BigEndian.Uint16(msg[2:]))
	if count == 0 || count > v5MaxRecords || len(msg) < v5HeaderLen+count*v5RecordLen {
		return dst, dropf(ReasonLength, "netflow v5: %d records in %d bytes", count, len(msg))
	}
	uptime := binary.BigEndian.Uint32(msg[4:])
	export := time.Unix(int64(binary.BigEndian.Uint32(msg[8:])), int64(binary.BigEndian.Uint32(msg[12:])%1e9))
	seq := binary.BigEndian.Uint32(msg[16:])
	domID := uint32(msg[20])<<8 | uint32(msg[21])
	dom := s.domain(protoV5, domID)
	if dom == nil {
		return dst, dropf(ReasonTooManyDomains, "engine %d/%d", msg[20], msg[21])
	}
	clk := newClock(export, now, d.window())
	for i := range count {
		b := msg[v5HeaderLen+i*v5RecordLen:][:v5RecordLen]
		first, last := binary.BigEndian.Uint32(b[24:]), binary.BigEndian.Uint32(b[28:])
		start, end := uptimeTime(export, uptime, first), uptimeTime(export, uptime, last)
		if first == 0 || last == 0 {
			start, end = zeroSwitched(export, uptime, first, last)
		}
		dst = append(dst, flow.Record{
			SrcAddr:      netip.AddrFrom4([4]byte(b[0:4])),
			DstAddr:      netip.AddrFrom4([4]byte(b[4:8])),
			PacketsDelta: uint64(binary.BigEndian.Uint32(b[16:])),
			BytesDelta:   uint64(binary.BigEndian.Uint32(b[20:])),
			FlowStart:    start,
			FlowEnd:      end,
			SrcPort:      binary.BigEndian.Uint16(b[32:]),
			DstPort:      binary.BigEndian.Uint16(b[34:]),
			Proto:        b[38],
		})
		r := &dst[len(dst)-1]
		if !filled(r.SrcAddr, r.DstAddr) {
			dst = dst[:len(dst)-1]
			d.Stats.NoAddress++
			continue
		}
		if !clk.usable(r) {
			missing := StampNoTime
			if first == 0 && last == 0 {
				missing = StampZeroUptime
			}
			d.stamp(r, &clk, missing)
		}
		if r.Proto == flow.ProtoICMP && r.SrcPort != 0 && r.SrcPort < 256 {
			// Cisco puts type<<8|code in the destination port; fprobe
			// puts the type in the source port and the code in the
			// destination port. nfdump reads both as (src<<8)+dst.
			r.DstPort, r.SrcPort = r.SrcPort<<8|r.DstPort&0xff, 0
		}
		r.Ingress.Rule, r.Egress.Rule = -1, -1
		r.Source = SourceNetFlow5
		r.ExporterAddr = s.exporter
		r.ObservationDomainID = domID
		r.TimeReceived = now
		r.Normalize()
	}
	cnt := seqCounts{data: uint32(count)}
	s.note(cnt, now)
	d.sequence(s, dom, protoV5, seq, cnt)
	return dst, nil
}

// uptimeTime is the wall-clock time of a sysUptime value t (ms) in a
// message exported at export when the exporter's uptime was uptime. The
// difference is taken modulo 2^32 as a signed value: it survives the
// 49.7-day wrap, and a time stamped just after the header's uptime (an
// exporter reading its clock twice) is a few ms after the export time,
// not 49.7 days before it.
func uptimeTime(export time.Time, uptime, t uint32) time.Time {
	if t == 0 {
		return time.Time{} // not measured (see zeroSwitched)
	}
	return uptimeAt(export, uptime, t)
}

// uptimeAt is uptimeTime with 0 read as a value: the exporter's boot.
func uptimeAt(export time.Time, uptime, t uint32) time.Time {
	return export.Add(-time.Duration(int32(uptime-t)) * time.Millisecond)
}

// protocol is the flow protocol of a message, for sequence accounting.
type protocol uint8

const (
	protoIPFIX protocol = iota
	protoV9
	protoV5
)

// Sequence-number conventions. Each protocol defines what its sequence
// number counts: IPFIX data records sent before the message (RFC 7011
// 3.1), NetFlow v9 export packets (RFC 3954 5.1), NetFlow v5 flows.
// Exporters differ: softflowd (IPFIX and v9) counts the flow records sent
// including the message's own (seq_n = seq_{n-1} + flows_n, options
// records left out), some v9 exporters count flows before the message,
// and some IPFIX exporters count template records or messages. A domain's
// convention is learned: every convention that explains each loss-free
// step stays a candidate, the protocol's own first; a step none of them
// explains is a loss (or reordering), measured with the best candidate.
// The protocol's own convention is dropped only after another one
// explained two steps in a row that it did not (one such step may be a
// loss that another convention explains by chance), and three unexplained
// steps in a row start the learning again.
const (
	convData      = iota // data records before the message (options data records included)
	convAll              // data and template records before the message
	convMessages         // messages
	convFlowsIncl        // flow records including the message's own, options records left out (softflowd)
	numConventions
)

// seqCounts is what one message held, for its sequence number.
type seqCounts struct {
	data, templates uint32
	// options counts the options data records among data.
	options uint32
	// unknown is set when a data set's template was unknown: its records
	// could not be counted.
	unknown bool
}

// seqState is a domain's sequence accounting.
type seqState struct {
	next  [numConventions]uint32
	known [numConventions]bool
	alive uint8 // bit per convention still consistent with every step
	// otherStreak counts the steps in a row that another convention
	// explained and the protocol's own did not; misses the steps in a row
	// that none explained.
	otherStreak, misses uint8
	// lostRecords and lostMessages are the losses seen, in the unit of
	// the convention that measured them.
	lostRecords, lostMessages uint64
}

var specConvention = [...]int{protoIPFIX: convData, protoV9: convMessages, protoV5: convData}

// sequence checks seq against what the domain's previous messages
// announced and counts a loss.
func (d *Decoder) sequence(s *Session, dom *domain, p protocol, seq uint32, c seqCounts) {
	st := &dom.seq
	if st.alive == 0 {
		*st = seqState{alive: 1<<numConventions - 1}
	}
	if !st.known[convMessages] && c.data == 0 {
		// The baseline is the first message with data records: Open
		// vSwitch numbers its first data message as if one record had gone
		// before its template messages.
		return
	}
	// What each convention expects of this message; convFlowsIncl adds
	// the message's own flows, which an unknown template leaves uncounted.
	expect := st.next
	expect[convFlowsIncl] += c.data - c.options
	var matched, checked uint8
	for i := range numConventions {
		if st.known[i] && st.alive&(1<<i) != 0 && !(i == convFlowsIncl && c.unknown) {
			checked |= 1 << i
			if expect[i] == seq {
				matched |= 1 << i
			}
		}
	}
	spec := uint8(1) << specConvention[p]
	switch {
	case matched != 0:
		st.misses = 0
		drop := checked &^ matched
		if drop&spec != 0 {
			if st.otherStreak++; st.otherStreak < 2 {
				drop &^= spec
			}
		} else {
			st.otherStreak = 0
		}
		st.alive &^= drop
	case checked != 0:
		if st.misses++; st.misses >= 3 {
			st.alive, st.misses, st.otherStreak = 1<<numConventions-1, 0, 0
		}
		conv := specConvention[p]
		if checked&(1<<conv) == 0 {
			for i := range numConventions {
				if checked&(1<<i) != 0 {
					conv = i
					break
				}
			}
		}
		if gap := seq - expect[conv]; gap < 1<<31 { // else reordered or a restart
			if d.Lost == nil {
				d.Lost = map[netip.Addr]Loss{}
			}
			l := d.Lost[s.exporter]
			if conv == convMessages {
				st.lostMessages += uint64(gap)
				d.Stats.SequenceLostMessages += uint64(gap)
				l.Messages += uint64(gap)
			} else {
				st.lostRecords += uint64(gap)
				d.Stats.SequenceLost += uint64(gap)
				l.Records += uint64(gap)
			}
			d.Lost[s.exporter] = l
		}
	}
	st.next[convData], st.known[convData] = seq+c.data, !c.unknown
	st.next[convAll], st.known[convAll] = seq+c.data+c.templates, !c.unknown
	st.next[convMessages], st.known[convMessages] = seq+1, true
	st.next[convFlowsIncl], st.known[convFlowsIncl] = seq, true
}
