package lab

import (
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/nflog"
	"github.com/dualflow/dualflow/lab/nft"
)

// Conn is one kernel conntrack entry of a node, as ground truth.
type Conn struct {
	// Orig is the tuple as the client sent it (before DNAT); Reply the
	// tuple of the answer (after DNAT its source is the endpoint).
	Orig, Reply flow.Tuple
	// ICMPID is the echo id of ICMP and ICMPv6 entries.
	ICMPID                     uint16
	OrigPackets, OrigBytes     uint64
	ReplyPackets, ReplyBytes   uint64
	Start                      time.Time
	DstNAT, Assured, SeenReply bool
	Zone                       uint16
	Mark                       uint32
}

// Counter is an nftables named counter.
type Counter struct {
	Packets, Bytes uint64
}

// FindConn returns the entry whose original direction starts at local over
// proto (flow.ProtoTCP, flow.ProtoUDP, ...). For ICMP and ICMPv6, local's
// port is the echo id (agent.Reply.Local).
func FindConn(conns []Conn, proto uint8, local netip.AddrPort) (Conn, bool) {
	for _, c := range conns {
		if c.Orig.Proto != proto || c.Orig.Src != local.Addr().Unmap() {
			continue
		}
		if proto == flow.ProtoICMP || proto == flow.ProtoICMPv6 {
			if c.ICMPID == local.Port() {
				return c, true
			}
			continue
		}
		if c.Orig.SrcPort == local.Port() {
			return c, true
		}
	}
	return Conn{}, false
}

// NFLOG binds the NFLOG group of the lab's drop rules on node. Each dropped
// packet arrives with the drop counter name (nft.DropName) as prefix. Close
// the reader when done: only one reader per node can exist.
func (l *Lab) NFLOG(node string) (*nflog.Reader, error) {
	return nflog.Open(l.NodeNetNSPath(node), nft.DefaultLogGroup)
}
