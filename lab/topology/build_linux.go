//go:build linux

package topology

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dualflow/dualflow/nsrun"
)

// Build creates every namespace, link, address and route of spec. On error
// it leaves what it created: call Destroy with the lab prefix to clean up.
func Build(ctx context.Context, spec *Spec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	fabric, err := newNS(spec.Fabric, bridgeSysctls)
	if err != nil {
		return err
	}
	defer fabric.close()
	no := false
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: FabricBridge}, MulticastSnooping: &no}
	if err := fabric.h.LinkAdd(br); err != nil {
		return fmt.Errorf("fabric: add bridge: %w", err)
	}
	if err := fabric.h.LinkSetUp(br); err != nil {
		return fmt.Errorf("fabric: bridge up: %w", err)
	}
	if err := Parallel(ctx, len(spec.Nodes), func(i int) error { return buildNode(&spec.Nodes[i], fabric, br) }); err != nil {
		return err
	}
	return Parallel(ctx, len(spec.Pods), func(i int) error { return buildPod(&spec.Pods[i]) })
}

// sysctls of each kind of namespace, set before any link exists so that
// new links inherit the defaults. DAD is off so that addresses (and the
// link-local gateway) are usable at once instead of after about a second.
var (
	bridgeSysctls = map[string]string{
		"net/ipv6/conf/all/accept_dad":     "0",
		"net/ipv6/conf/default/accept_dad": "0",
	}
	nodeSysctls = map[string]string{
		"net/ipv4/ip_forward":              "1",
		"net/ipv6/conf/all/forwarding":     "1",
		"net/ipv6/conf/default/forwarding": "1",
		"net/ipv6/conf/all/accept_dad":     "0",
		"net/ipv6/conf/default/accept_dad": "0",
		// Per-namespace conntrack accounting (packets/bytes) and start
		// timestamps, on before the first packet.
		"net/netfilter/nf_conntrack_acct":      "1",
		"net/netfilter/nf_conntrack_timestamp": "1",
	}
	podSysctls = map[string]string{
		"net/ipv6/conf/all/accept_dad":     "0",
		"net/ipv6/conf/default/accept_dad": "0",
	}
)

// ns is a namespace being built: an fd to it and a netlink handle inside it.
type ns struct {
	name string
	fd   int
	h    *netlink.Handle
}

func (n *ns) close() {
	if n.h != nil {
		n.h.Close()
	}
	unix.Close(n.fd)
}

// newNS creates the named namespace the way `ip netns add` does (a bind
// mount of the namespace onto /run/netns/<name>) and, while still inside it,
// sets sysctls, brings lo up and opens a netlink handle.
func newNS(name string, sysctls map[string]string) (*ns, error) {
	if err := os.MkdirAll(nsrun.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", nsrun.Dir, err)
	}
	path := nsrun.Path(name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	f.Close()
	var n *ns
	err = nsrun.OnThrowawayThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("unshare: %w", err)
		}
		self := "/proc/self/task/" + strconv.Itoa(unix.Gettid()) + "/ns/net"
		if err := unix.Mount(self, path, "none", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("bind mount: %w", err)
		}
		for k, v := range sysctls {
			if err := os.WriteFile("/proc/sys/"+k, []byte(v), 0o644); err != nil {
				return fmt.Errorf("sysctl %s: %w", k, err)
			}
		}
		fd, err := unix.Open(self, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open: %w", err)
		}
		h, err := netlink.NewHandle()
		if err != nil {
			unix.Close(fd)
			return fmt.Errorf("netlink handle: %w", err)
		}
		lo, err := h.LinkByName("lo")
		if err == nil {
			err = h.LinkSetUp(lo)
		}
		if err != nil {
			h.Close()
			unix.Close(fd)
			return fmt.Errorf("lo up: %w", err)
		}
		n = &ns{name: name, fd: fd, h: h}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("create netns %s: %w", name, err)
	}
	return n, nil
}

func buildNode(n *Node, fabric *ns, br *netlink.Bridge) error {
	node, err := newNS(n.NetNS, nodeSysctls)
	if err != nil {
		return err
	}
	defer node.close()
	wrap := func(op string, err error) error { return fmt.Errorf("node %s: %s: %w", n.NetNS, op, err) }
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: n.FabricPort, PeerNamespace: netlink.NsFd(fabric.fd)}
	if err := node.h.LinkAdd(veth); err != nil {
		return wrap("add eth0", err)
	}
	port, err := fabric.h.LinkByName(n.FabricPort)
	if err != nil {
		return wrap("find fabric port", err)
	}
	if err := fabric.h.LinkSetMaster(port, br); err != nil {
		return wrap("attach fabric port", err)
	}
	if err := fabric.h.LinkSetUp(port); err != nil {
		return wrap("fabric port up", err)
	}
	eth0, err := node.h.LinkByName("eth0")
	if err != nil {
		return wrap("find eth0", err)
	}
	for _, a := range n.Addrs {
		if err := node.h.AddrAdd(eth0, addr(a)); err != nil {
			return wrap("address "+a.String(), err)
		}
	}
	if err := node.h.LinkSetUp(eth0); err != nil {
		return wrap("eth0 up", err)
	}
	lo, err := node.h.LinkByName("lo")
	if err != nil {
		return wrap("find lo", err)
	}
	for _, g := range n.Gateways {
		if err := node.h.AddrAdd(lo, addr(netip.PrefixFrom(g, g.BitLen()))); err != nil {
			return wrap("gateway "+g.String(), err)
		}
	}
	for _, r := range n.Routes {
		rt := &netlink.Route{LinkIndex: eth0.Attrs().Index, Dst: ipNet(r.Dst), Gw: net.IP(r.Via.AsSlice())}
		if err := node.h.RouteAdd(rt); err != nil {
			return wrap("route "+r.Dst.String(), err)
		}
	}
	return nil
}

func buildPod(p *Pod) error {
	pod, err := newNS(p.NetNS, podSysctls)
	if err != nil {
		return err
	}
	defer pod.close()
	wrap := func(op string, err error) error { return fmt.Errorf("pod %s: %s: %w", p.NetNS, op, err) }
	nodeFd, err := unix.Open(nsrun.Path(p.Node), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return wrap("open node netns", err)
	}
	defer unix.Close(nodeFd)
	node, err := netlink.NewHandleAt(nsHandle(nodeFd))
	if err != nil {
		return wrap("node netlink handle", err)
	}
	defer node.Close()
	veth := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{Name: p.HostIface, HardwareAddr: GatewayMAC},
		PeerName:  "eth0", PeerNamespace: netlink.NsFd(pod.fd),
	}
	if err := node.LinkAdd(veth); err != nil {
		return wrap("add veth "+p.HostIface, err)
	}
	host, err := node.LinkByName(p.HostIface)
	if err != nil {
		return wrap("find host veth", err)
	}
	if err := node.LinkSetUp(host); err != nil {
		return wrap("host veth up", err)
	}
	eth0, err := pod.h.LinkByName("eth0")
	if err != nil {
		return wrap("find eth0", err)
	}
	for _, a := range p.Addrs {
		if err := pod.h.AddrAdd(eth0, addr(netip.PrefixFrom(a, a.BitLen()))); err != nil {
			return wrap("address "+a.String(), err)
		}
	}
	if err := pod.h.LinkSetUp(eth0); err != nil {
		return wrap("eth0 up", err)
	}
	idx := eth0.Attrs().Index
	for _, a := range p.Addrs {
		// Host route on the node towards the pod.
		rt := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: ipNet(netip.PrefixFrom(a, a.BitLen())), Scope: netlink.SCOPE_LINK}
		if err := node.RouteAdd(rt); err != nil {
			return wrap("node route "+a.String(), err)
		}
		gw := GatewayIPv6
		if a.Is4() {
			gw = p.GatewayV4
			link := &netlink.Route{LinkIndex: idx, Dst: ipNet(netip.PrefixFrom(gw, 32)), Scope: netlink.SCOPE_LINK}
			if err := pod.h.RouteAdd(link); err != nil {
				return wrap("gateway route", err)
			}
		}
		// A permanent neighbour for the gateway: no ARP/ND before the first
		// packet, and no proxy-ARP needed on the node.
		neigh := &netlink.Neigh{LinkIndex: idx, IP: net.IP(gw.AsSlice()), HardwareAddr: GatewayMAC, State: netlink.NUD_PERMANENT}
		if a.Is6() {
			neigh.Family = unix.AF_INET6
		} else {
			neigh.Family = unix.AF_INET
		}
		if err := pod.h.NeighAdd(neigh); err != nil {
			return wrap("gateway neighbour", err)
		}
		def := &netlink.Route{LinkIndex: idx, Gw: net.IP(gw.AsSlice())}
		if a.Is4() {
			def.Dst = ipNet(netip.MustParsePrefix("0.0.0.0/0"))
		} else {
			def.Dst = ipNet(netip.MustParsePrefix("::/0"))
		}
		if err := pod.h.RouteAdd(def); err != nil {
			return wrap("default route", err)
		}
	}
	return nil
}

func addr(p netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: ipNet(p)}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Destroy removes every namespace whose name starts with prefix, after
// killing the processes that live in them (SIGTERM, then SIGKILL after
// grace). It works without any other state, so it also cleans up after a
// crash. An empty prefix is refused.
func Destroy(prefix string, grace time.Duration) error {
	if prefix == "" {
		return errors.New("destroy: empty prefix")
	}
	names, err := List(prefix)
	if err != nil {
		return err
	}
	if len(names) == 0 {
		return nil
	}
	inodes := map[uint64]string{}
	for _, n := range names {
		var st unix.Stat_t
		if err := unix.Stat(nsrun.Path(n), &st); err == nil {
			inodes[st.Ino] = n
		}
	}
	var errs []error
	if pids := pidsIn(inodes); len(pids) > 0 {
		for _, p := range pids {
			unix.Kill(p, unix.SIGTERM)
		}
		errs = append(errs, Reap(pids, grace))
	}
	for _, n := range names {
		errs = append(errs, DeleteNS(n))
	}
	return errors.Join(errs...)
}

// DeleteNS removes the namespace /run/netns/name (a missing one is not an
// error).
func DeleteNS(name string) error {
	p := nsrun.Path(name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", name, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", name, err)
	}
	return nil
}

// pidsIn returns the processes whose network namespace is one of inodes
// (nsfs inode numbers of the /run/netns bind mounts).
func pidsIn(inodes map[uint64]string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		var st unix.Stat_t
		if unix.Stat("/proc/"+e.Name()+"/ns/net", &st) != nil {
			continue
		}
		if _, ok := inodes[st.Ino]; ok {
			out = append(out, pid)
		}
	}
	return out
}

func nsHandle(fd int) netns.NsHandle { return netns.NsHandle(fd) }
