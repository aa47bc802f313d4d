//go:build linux

package node

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// peer is the node side of a pod's veth.
type peer struct {
	Name string
	MAC  net.HardwareAddr
}

// peerOf returns the node-side peer of the pod's veth iface: the interface
// a pod's packets leave for, whether the node routes them (proxy-ARP
// gateway, Calico-style) or bridges them (the bridge takes frames for its
// ports' own addresses up to the node's stack). It returns errNotOnNode
// when the peer is in another namespace than nodeNS: the pod belongs to
// another node (several nodes share a host in a lab; a node only ever
// answers for its own pods).
func peerOf(podNS, iface, nodeNS string) (peer, error) {
	pod, err := netns.GetFromPath(podNS)
	if err != nil {
		return peer{}, err
	}
	defer pod.Close()
	node, err := netns.GetFromPath(nodeNS)
	if err != nil {
		return peer{}, err
	}
	defer node.Close()
	ph, err := netlink.NewHandleAt(pod, unix.NETLINK_ROUTE)
	if err != nil {
		return peer{}, err
	}
	defer ph.Close()
	link, err := ph.LinkByName(iface)
	if err != nil {
		return peer{}, fmt.Errorf("pod interface %s: %w", iface, err)
	}
	if link.Type() != "veth" || link.Attrs().ParentIndex == 0 {
		// The host's own namespace, a kube-ipvs0 or cilium_host address:
		// not a pod's.
		return peer{}, fmt.Errorf("%w: %s is a %s, not a veth with a peer on the node", errNotAPod, iface, link.Type())
	}
	// Interface indexes are per namespace: the peer's namespace is the
	// node's only if the pod's view of the node namespace has the id its
	// veth names as the peer's (IFLA_LINK_NETNSID).
	id, err := ph.GetNetNsIdByFd(int(node))
	if err != nil || id < 0 || id != link.Attrs().NetNsID {
		return peer{}, errNotOnNode
	}
	nh, err := netlink.NewHandleAt(node, unix.NETLINK_ROUTE)
	if err != nil {
		return peer{}, err
	}
	defer nh.Close()
	pl, err := nh.LinkByIndex(link.Attrs().ParentIndex)
	if err != nil {
		return peer{}, fmt.Errorf("node side of %s (index %d): %w", iface, link.Attrs().ParentIndex, err)
	}
	return peer{Name: pl.Attrs().Name, MAC: pl.Attrs().HardwareAddr}, nil
}
