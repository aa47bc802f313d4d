//go:build linux

package podns

import (
	"fmt"
	"net/netip"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// listAddrs lists the global-scope addresses of the namespace at path,
// through a netlink socket opened in it: the calling thread never changes
// namespace.
func listAddrs(path string) ([]ifaceAddr, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("podns: open %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("podns: netlink in %s: %w", path, err)
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("podns: addresses in %s: %w", path, err)
	}
	names := map[int]string{}
	var out []ifaceAddr
	for _, a := range addrs {
		if a.Scope != unix.RT_SCOPE_UNIVERSE || a.IPNet == nil {
			continue // loopback, link-local
		}
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok {
			continue
		}
		name, ok := names[a.LinkIndex]
		if !ok {
			if l, err := h.LinkByIndex(a.LinkIndex); err == nil {
				name = l.Attrs().Name
			}
			names[a.LinkIndex] = name
		}
		out = append(out, ifaceAddr{addr: ip.Unmap(), iface: name})
	}
	return out, nil
}
