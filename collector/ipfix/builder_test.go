package ipfix

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

// Helpers that build IPFIX wire bytes by hand, for the cases our encoder
// never produces (several templates per set, options, withdrawals,
// reduced-size and enterprise elements, padding).

var exporterAP = netip.MustParseAddrPort("[fd00:10::7]:40000")

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }
func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }
func be64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// message wraps sets into a message of domain with sequence seq.
func message(domain, seq uint32, sets ...[]byte) []byte {
	body := cat(sets...)
	b := fipfix.AppendMessageHeader(nil, fipfix.MessageHeaderLen+len(body), time.Unix(1_780_000_000, 0), seq, domain)
	return append(b, body...)
}

// set wraps records into a set with a correct length.
func set(id uint16, records ...[]byte) []byte {
	body := cat(records...)
	return cat(be16(id), be16(uint16(4+len(body))), body)
}

// fs is a field specifier.
type fs struct {
	ent uint32
	id  uint16
	len uint16
}

func specBytes(fields []fs) []byte {
	var b []byte
	for _, f := range fields {
		if f.ent != 0 {
			b = cat(b, be16(f.id|0x8000), be16(f.len), be32(f.ent))
			continue
		}
		b = cat(b, be16(f.id), be16(f.len))
	}
	return b
}

func templateRec(id uint16, fields ...fs) []byte {
	return cat(be16(id), be16(uint16(len(fields))), specBytes(fields))
}

func optionsRec(id uint16, scope int, fields ...fs) []byte {
	return cat(be16(id), be16(uint16(len(fields))), be16(uint16(scope)), specBytes(fields))
}

// varString encodes s with a variable-length prefix; long forces the
// 3-byte form.
func varString(s string, long bool) []byte {
	if long || len(s) >= 255 {
		return cat([]byte{255}, be16(uint16(len(s))), []byte(s))
	}
	return cat([]byte{byte(len(s))}, []byte(s))
}

// encoderMessage returns a message with the template set of e and one data
// set holding recs.
func encoderMessage(e *fipfix.Encoder, domain, seq uint32, withTemplate bool, recs ...*flow.Record) []byte {
	var sets [][]byte
	if withTemplate {
		sets = append(sets, e.AppendTemplateSet(nil))
	}
	if len(recs) > 0 {
		data := []byte{0, 0, 0, 0}
		for _, r := range recs {
			data = e.AppendRecord(data, r)
		}
		fipfix.PutSetHeader(data, e.TemplateID())
		sets = append(sets, data)
	}
	return message(domain, seq, sets...)
}

func mustEncoder(v uint8, id uint16) *fipfix.Encoder {
	e, err := fipfix.NewEncoder(v, id)
	if err != nil {
		panic(err)
	}
	return e
}
