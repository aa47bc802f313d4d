//go:build linux

package node

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// peerMAC returns the MAC of the node-side peer of the pod's veth iface:
// the address a pod's packets leave for, whether the node routes them
// (proxy-ARP gateway, Calico-style) or bridges them (the bridge takes
// frames for its ports' own addresses up to the node's stack).
func peerMAC(podNS, iface, nodeNS string) (net.HardwareAddr, error) {
	link, err := linkIn(podNS, func(h *netlink.Handle) (netlink.Link, error) { return h.LinkByName(iface) })
	if err != nil {
		return nil, fmt.Errorf("pod interface %s: %w", iface, err)
	}
	if link.Type() != "veth" || link.Attrs().ParentIndex == 0 {
		return nil, fmt.Errorf("pod interface %s is a %s, not a veth with a peer on the node", iface, link.Type())
	}
	peer, err := linkIn(nodeNS, func(h *netlink.Handle) (netlink.Link, error) { return h.LinkByIndex(link.Attrs().ParentIndex) })
	if err != nil {
		return nil, fmt.Errorf("node side of %s (index %d): %w", iface, link.Attrs().ParentIndex, err)
	}
	return peer.Attrs().HardwareAddr, nil
}

func linkIn(path string, get func(*netlink.Handle) (netlink.Link, error)) (netlink.Link, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return get(h)
}
