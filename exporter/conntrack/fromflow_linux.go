package conntrack

import (
	ct "github.com/ti-mo/conntrack"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/flow"
)

// FromFlow converts one ti-mo conntrack entry. hasCounters says whether
// the entry carries counters (nf_conntrack_acct on and not a NEW event);
// entries with non-zero counters always count as having them.
//
// The key is the original tuple. The endpoint (DstAddr/DstPort) is the
// reply tuple's source: it differs from the original destination after
// DNAT. SNATAddr/SNATPort are the reply tuple's destination when it differs
// from the original source. For ICMP and ICMPv6, SrcPort is the echo
// identifier and DstPort type<<8|code (the NetFlow convention); only the
// addresses and the identifier are compared for NAT.
func FromFlow(f *ct.Flow, hasCounters bool) connstore.Conn {
	o, r := &f.TupleOrig, &f.TupleReply
	c := connstore.Conn{
		Key: connstore.Key{Tuple: flow.Tuple{
			Src: o.IP.SourceAddress.Unmap(), Dst: o.IP.DestinationAddress.Unmap(), Proto: o.Proto.Protocol,
		}, Zone: f.Zone},
		ID:             f.ID,
		Start:          f.Timestamp.Start,
		Stop:           f.Timestamp.Stop,
		Packets:        f.CountersOrig.Packets,
		Bytes:          f.CountersOrig.Bytes,
		ReversePackets: f.CountersReply.Packets,
		ReverseBytes:   f.CountersReply.Bytes,
		Mark:           f.Mark,
	}
	c.HasCounters = hasCounters || c.Packets|c.Bytes|c.ReversePackets|c.ReverseBytes != 0
	copy(c.Labels[:], f.Labels)
	if f.ProtoInfo.TCP != nil {
		c.TCPState = TCPStateName(f.ProtoInfo.TCP.State)
	}
	replySrc, replyDst := r.IP.SourceAddress.Unmap(), r.IP.DestinationAddress.Unmap()
	if isICMP(o.Proto) {
		c.Key.SrcPort = o.Proto.ICMPID
		c.Key.DstPort = uint16(o.Proto.ICMPType)<<8 | uint16(o.Proto.ICMPCode)
		c.DstAddr, c.DstPort = replySrc, c.Key.DstPort
		if replyDst.IsValid() && (replyDst != c.Key.Src || r.Proto.ICMPID != o.Proto.ICMPID) {
			c.SNATAddr, c.SNATPort = replyDst, r.Proto.ICMPID
		}
		return c
	}
	c.Key.SrcPort, c.Key.DstPort = o.Proto.SourcePort, o.Proto.DestinationPort
	c.DstAddr, c.DstPort = replySrc, r.Proto.SourcePort
	if replyDst.IsValid() && (replyDst != c.Key.Src || r.Proto.DestinationPort != c.Key.SrcPort) {
		c.SNATAddr, c.SNATPort = replyDst, r.Proto.DestinationPort
	}
	return c
}

func isICMP(p ct.ProtoTuple) bool {
	return p.ICMPv4 || p.ICMPv6 || p.Protocol == flow.ProtoICMP || p.Protocol == flow.ProtoICMPv6
}
