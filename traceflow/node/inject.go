// Package node is the part of traceflow that runs on a node of a real
// cluster (in the exporter, the node agent): it knows the node, not the
// cluster. It finds a probe's source pod by its address (package podns) and
// sends the probe from the pod's interface, addressed to the node side of
// the pod's veth, as the pod's own packets would be.
package node

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/inject"
	"github.com/dualflow/dualflow/traceflow/packet"
	"github.com/dualflow/dualflow/traceflow/podns"
)

// ErrPodNotOnNode means the probe's source address is in no namespace of
// this node (the pod is elsewhere, or gone).
var ErrPodNotOnNode = errors.New("pod not found on this node")

// errNotOnNode is a namespace found whose veth peer is on another node;
// errNotAPod one whose interface is no pod's veth.
var (
	errNotOnNode = ErrPodNotOnNode
	errNotAPod   = errors.New("not a pod interface")
)

// Injector sends probes from the pods of its node.
type Injector struct {
	// Pods finds a pod's namespace by address.
	Pods *podns.Finder
	// NodeNS is the node's network namespace, where the pods' veth peers
	// are ("" means the caller's: /proc/self/ns/net).
	NodeNS string
}

// Source is where a probe leaves from.
type Source struct {
	NS     podns.Namespace
	SrcMAC net.HardwareAddr // the pod interface's
	DstMAC net.HardwareAddr // the node side of the pod's veth
	// HostIface is the node side of the pod's veth.
	HostIface string
}

// Locate finds the pod holding src on this node and the MACs a packet
// from it carries.
func (in *Injector) Locate(src netip.Addr) (Source, error) {
	ns, pr, err := in.find(src)
	if err != nil {
		return Source{}, err
	}
	srcMAC, err := inject.InterfaceMAC(ns.Path, ns.Iface)
	if err != nil {
		return Source{}, err
	}
	return Source{NS: ns, SrcMAC: srcMAC, DstMAC: pr.MAC, HostIface: pr.Name}, nil
}

// find returns the namespace of this node holding addr, and the node side
// of its veth.
func (in *Injector) find(addr netip.Addr) (podns.Namespace, peer, error) {
	all, err := in.Pods.FindAll(addr)
	if errors.Is(err, podns.ErrNotFound) {
		return podns.Namespace{}, peer{}, fmt.Errorf("%s: %w", addr, ErrPodNotOnNode)
	}
	if err != nil {
		return podns.Namespace{}, peer{}, err
	}
	nodeNS := cmp.Or(in.NodeNS, "/proc/self/ns/net")
	var errs []error
	for _, ns := range all {
		pr, err := peerOf(ns.Path, ns.Iface, nodeNS)
		if err == nil {
			return ns, pr, nil
		}
		if !errors.Is(err, errNotOnNode) && !errors.Is(err, errNotAPod) {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return podns.Namespace{}, peer{}, errors.Join(errs...)
	}
	return podns.Namespace{}, peer{}, fmt.Errorf("%s: %w", addr, ErrPodNotOnNode)
}

// Frame builds p's packet as sent from s.
func (s Source) Frame(p traceflow.Probe) ([]byte, error) {
	return packet.Build(packet.Spec{SrcMAC: s.SrcMAC, DstMAC: s.DstMAC, Src: p.Src, Dst: p.Dst,
		Proto: p.ProtoNumber(), SrcPort: p.SrcPort, DstPort: p.DstPort, TCPFlags: p.TCPFlags, TTL: p.TTL, Tag: p.Tag})
}

// Send sends frame out of the source pod's interface.
func (s Source) Send(frame []byte) error { return inject.Send(s.NS.Path, s.NS.Iface, frame) }
