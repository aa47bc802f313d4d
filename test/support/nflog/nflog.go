// Package nflog reads packets that nftables rules log to an NFLOG group
// (`log group N`), inside a given network namespace. The lab's drop rules
// log there with their counter name as prefix, so a reader sees which rule
// dropped which flow: the ground truth for drop reporting.
//
// Reading needs Linux; elsewhere Open returns an error. A Reader is not
// safe for concurrent use. Only one socket per namespace can
// bind a group; a second Open of the same group fails with EBUSY.
package nflog

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// Packet is one logged packet.
type Packet struct {
	// Prefix is the log prefix of the rule (the lab uses the drop counter name).
	Prefix string
	// Tuple is the packet's addresses, protocol and ports (ports are zero
	// for protocols without them).
	Tuple flow.Tuple
	// Hook is the netfilter hook number (2 = forward).
	Hook          uint8
	InDev, OutDev uint32
	Time          time.Time
}

// ErrShort means the packet is too short or not IPv4/IPv6.
var ErrShort = errors.New("not an IPv4 or IPv6 packet")

// ParseIP returns the tuple of a raw IPv4 or IPv6 packet. IPv6 extension
// headers are not walked: such packets get the extension header as protocol
// and no ports.
func ParseIP(b []byte) (flow.Tuple, error) {
	var t flow.Tuple
	var l4 []byte
	switch {
	case len(b) >= 20 && b[0]>>4 == 4:
		ihl := int(b[0]&0x0f) * 4
		if ihl < 20 || len(b) < ihl {
			return t, ErrShort
		}
		t.Src = netip.AddrFrom4([4]byte(b[12:16]))
		t.Dst = netip.AddrFrom4([4]byte(b[16:20]))
		t.Proto = b[9]
		l4 = b[ihl:]
	case len(b) >= 40 && b[0]>>4 == 6:
		t.Src = netip.AddrFrom16([16]byte(b[8:24])).Unmap()
		t.Dst = netip.AddrFrom16([16]byte(b[24:40])).Unmap()
		t.Proto = b[6]
		l4 = b[40:]
	default:
		return t, ErrShort
	}
	switch t.Proto {
	case flow.ProtoTCP, flow.ProtoUDP, flow.ProtoSCTP:
		if len(l4) >= 4 {
			t.SrcPort = binary.BigEndian.Uint16(l4)
			t.DstPort = binary.BigEndian.Uint16(l4[2:])
		}
	}
	return t, nil
}
