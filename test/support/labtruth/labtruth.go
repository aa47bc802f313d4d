// Package labtruth reads the ground truth of a running lab (package lab)
// that the e2e tests compare dualflow against: a node's conntrack table,
// its policy counters, and the packets its drop rules log.
package labtruth

import (
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/test/support/nflog"
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
func NFLOG(l *lab.Lab, node string) (*nflog.Reader, error) {
	return nflog.Open(l.NodeNetNSPath(node), nft.DefaultLogGroup)
}
