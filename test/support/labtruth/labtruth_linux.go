//go:build linux

package labtruth

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
	"github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/nft"
)

// Conntrack dumps the conntrack table of node (both families).
//
// With the OVS datapath it reads OVS's conntrack instead (see ovsConntrack).
func Conntrack(l *lab.Lab, node string) ([]Conn, error) {
	if l.State().Datapath == lab.DatapathOVS {
		return ovsConntrack(l, node)
	}
	fd, err := unix.Open(l.NodeNetNSPath(node), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("conntrack of %s: %w", node, err)
	}
	defer unix.Close(fd)
	c, err := conntrack.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		return nil, fmt.Errorf("conntrack of %s: dial: %w", node, err)
	}
	defer c.Close()
	flows, err := c.Dump(nil)
	if err != nil {
		return nil, fmt.Errorf("conntrack of %s: dump: %w", node, err)
	}
	out := make([]Conn, 0, len(flows))
	for _, f := range flows {
		out = append(out, Conn{
			Orig:        tuple(f.TupleOrig),
			Reply:       tuple(f.TupleReply),
			ICMPID:      f.TupleOrig.Proto.ICMPID,
			OrigPackets: f.CountersOrig.Packets, OrigBytes: f.CountersOrig.Bytes,
			ReplyPackets: f.CountersReply.Packets, ReplyBytes: f.CountersReply.Bytes,
			Start:  f.Timestamp.Start,
			DstNAT: f.Status.DstNAT(), Assured: f.Status.Assured(), SeenReply: f.Status.SeenReply(),
			Zone: f.Zone, Mark: f.Mark,
		})
	}
	return out, nil
}

func tuple(t conntrack.Tuple) flow.Tuple {
	return flow.Tuple{
		Src: t.IP.SourceAddress.Unmap(), Dst: t.IP.DestinationAddress.Unmap(),
		Proto: t.Proto.Protocol, SrcPort: t.Proto.SourcePort, DstPort: t.Proto.DestinationPort,
	}
}

// Counters returns the named counters of node's lab table: one per
// NetworkPolicy rule ("ns/policy/ingress/0", see nft.RuleName) and one per
// isolated pod and direction ("drop/ingress/ns/pod", see nft.DropName).
//
// With the OVS datapath the same names count the packets of each rule's
// OpenFlow flows (see ovsCounters).
func Counters(l *lab.Lab, node string) (map[string]Counter, error) {
	if l.State().Datapath == lab.DatapathOVS {
		return ovsCounters(l, node)
	}
	fd, err := unix.Open(l.NodeNetNSPath(node), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("counters of %s: %w", node, err)
	}
	defer unix.Close(fd)
	c, err := nftables.New(nftables.WithNetNSFd(fd))
	if err != nil {
		return nil, fmt.Errorf("counters of %s: %w", node, err)
	}
	defer c.CloseLasting()
	objs, err := c.GetObjects(&nftables.Table{Name: nft.DefaultTable, Family: nftables.TableFamilyINet})
	if err != nil {
		return nil, fmt.Errorf("counters of %s: %w", node, err)
	}
	out := map[string]Counter{}
	for _, o := range objs {
		if co, ok := o.(*nftables.CounterObj); ok {
			out[co.Name] = Counter{Packets: co.Packets, Bytes: co.Bytes}
		}
	}
	return out, nil
}
