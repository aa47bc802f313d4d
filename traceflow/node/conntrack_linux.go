//go:build linux

package node

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"golang.org/x/sys/unix"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/packet"
)

// ctView is the node's conntrack entry of a probe.
type ctView struct {
	DstNAT, SrcNAT netip.AddrPort // zero when not translated
	Text           string
}

// conntrackOf looks up the probe's conntrack entry in the node's
// namespace (by its original tuple), waiting up to conntrackWait for it to
// be confirmed.
func (t *Tracer) conntrackOf(p traceflow.Probe) (ctView, bool) {
	fd, err := unix.Open(t.nodeNS(), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return ctView{}, false
	}
	defer unix.Close(fd)
	c, err := ct.Dial(&netlink.Config{NetNS: fd})
	if err != nil {
		return ctView{}, false
	}
	defer c.Close()
	q := ct.NewFlow(p.ProtoNumber(), 0, p.Src, p.Dst, p.SrcPort, p.DstPort, 0, 0)
	switch p.ProtoNumber() {
	case packet.ProtoICMP:
		q.TupleOrig.Proto = ct.ProtoTuple{Protocol: packet.ProtoICMP, ICMPv4: true, ICMPID: p.SrcPort, ICMPType: 8}
	case packet.ProtoICMPv6:
		q.TupleOrig.Proto = ct.ProtoTuple{Protocol: packet.ProtoICMPv6, ICMPv6: true, ICMPID: p.SrcPort, ICMPType: 128}
	}
	deadline := time.Now().Add(conntrackWait)
	for {
		f, err := c.Get(q)
		if err == nil {
			o, r := f.TupleOrig, f.TupleReply
			v := ctView{Text: fmt.Sprintf("%s:%d -> %s:%d, reply %s:%d -> %s:%d",
				o.IP.SourceAddress, o.Proto.SourcePort, o.IP.DestinationAddress, o.Proto.DestinationPort,
				r.IP.SourceAddress, r.Proto.SourcePort, r.IP.DestinationAddress, r.Proto.DestinationPort)}
			if f.Status.DstNAT() {
				v.DstNAT = netip.AddrPortFrom(r.IP.SourceAddress.Unmap(), r.Proto.SourcePort)
			}
			if f.Status.SrcNAT() {
				v.SrcNAT = netip.AddrPortFrom(r.IP.DestinationAddress.Unmap(), r.Proto.DestinationPort)
			}
			return v, true
		}
		if time.Now().After(deadline) {
			return ctView{}, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}
