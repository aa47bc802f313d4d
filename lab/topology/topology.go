// Package topology builds and removes the lab network: network namespaces
// acting as nodes (routers) and pods, joined by veth pairs, without touching
// the root namespace. It works from a plain Spec (no Kubernetes types), talks
// netlink directly (no `ip` commands) and builds nodes and pods in parallel.
//
// Layout:
//
//	pod netns  eth0 ──veth── vethXXXX  node netns  eth0 ──veth── nN  fabric netns (bridge br0)
//
// Pods are routed like Calico: a /32 and /128 on eth0, a default route to a
// gateway whose MAC (ee:ee:ee:ee:ee:ee, the node-side veth) is a permanent
// neighbour entry, and host routes to each pod on its node. Nodes route each
// other's pod CIDRs over the fabric, so pod-to-pod traffic between nodes
// crosses both nodes.
//
// Build and Destroy need Linux; elsewhere they return nsrun.ErrUnsupported.
// For every package of the lab: Alive, PidFile and Reap find and end the
// processes it starts (pod agents, OVS daemons), Tool finds the commands it
// runs, and Parallel runs per-node and per-pod work concurrently.
package topology

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/dualflow/dualflow/nsrun"
)

// GatewayMAC is the MAC of every node-side pod veth (Calico uses the same).
var GatewayMAC = net.HardwareAddr{0xee, 0xee, 0xee, 0xee, 0xee, 0xee}

// GatewayIPv6 is the link-local address the node-side veths get from
// GatewayMAC (EUI-64); pods use it as their IPv6 default gateway.
var GatewayIPv6 = netip.MustParseAddr("fe80::ecee:eeff:feee:eeee")

// FabricBridge is the name of the bridge in the fabric namespace.
const FabricBridge = "br0"

// Spec is the network to build.
type Spec struct {
	// Fabric is the name of the namespace holding the bridge that joins the
	// nodes.
	Fabric string
	Nodes  []Node
	Pods   []Pod
}

// Node is one node namespace.
type Node struct {
	// NetNS is the namespace name; FabricPort the name of its veth peer on
	// the bridge (at most 15 bytes).
	NetNS, FabricPort string
	// Addrs are the underlay addresses of eth0, with the fabric prefix length.
	Addrs []netip.Prefix
	// Gateways are the pod gateway addresses, put on lo (IPv4 only; IPv6
	// pods use GatewayIPv6).
	Gateways []netip.Addr
	// Routes send other nodes' pod CIDRs to those nodes.
	Routes []Route
}

// Route is a route via a next hop on the fabric.
type Route struct {
	Dst netip.Prefix
	Via netip.Addr
}

// Pod is one pod namespace.
type Pod struct {
	// NetNS is the pod's namespace, Node the namespace of its node and
	// HostIface the node-side veth name (at most 15 bytes).
	NetNS, Node, HostIface string
	Addrs                  []netip.Addr
	// GatewayV4 is the IPv4 gateway (one of the node's Gateways); unused
	// when the pod has no IPv4 address.
	GatewayV4 netip.Addr
}

// Validate reports a spec that Build cannot build.
func (s *Spec) Validate() error {
	if s.Fabric == "" {
		return errors.New("topology: empty fabric name")
	}
	nodes := map[string]bool{}
	for _, n := range s.Nodes {
		if n.NetNS == "" || len(n.FabricPort) == 0 || len(n.FabricPort) > 15 {
			return fmt.Errorf("topology: node %q: need a netns name and a fabric port of 1..15 bytes", n.NetNS)
		}
		nodes[n.NetNS] = true
	}
	for _, p := range s.Pods {
		if !nodes[p.Node] {
			return fmt.Errorf("topology: pod %s: unknown node %q", p.NetNS, p.Node)
		}
		if len(p.HostIface) == 0 || len(p.HostIface) > 15 {
			return fmt.Errorf("topology: pod %s: host iface %q: want 1..15 bytes", p.NetNS, p.HostIface)
		}
	}
	return nil
}

// List returns the names of the namespaces under /run/netns that start
// with prefix.
func List(prefix string) ([]string, error) {
	ents, err := os.ReadDir(nsrun.Dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list netns: %w", err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Tool finds a command the lab runs (nft, ip, conntrack) on PATH or in
// the sbin directories, which a non-login root shell may lack on PATH.
func Tool(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, dir := range []string{"/usr/sbin", "/sbin", "/usr/local/sbin"} {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not found on PATH or in /usr/sbin, /sbin, /usr/local/sbin", name)
}

// Parallel runs fn(0..n-1) concurrently, each unless ctx is done, and
// joins their errors.
func Parallel(ctx context.Context, n int, fn func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := ctx.Err(); err != nil {
				errs[i] = err
				return
			}
			errs[i] = fn(i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
