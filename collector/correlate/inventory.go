package correlate

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/enrich/inventory"
)

// Inventory maps addresses to node names from Node objects: each node's
// spec.podCIDRs (both families) and its InternalIP/ExternalIP addresses
// (SNAT-ed flows leave a node with its address). The correlator uses it to
// tell which node reported which half of a connection. It is immutable and
// safe for concurrent use.
//
// Lookups run two or three times per flow record, so the tables are keyed
// per family by plain integers (an IPv4 address as a uint32, an IPv6 one as
// two uint64 words) rather than by netip.Addr and netip.Prefix, whose keys
// hash a zone handle and cost several times more per probe.
type Inventory struct {
	addr4 map[uint32]string
	addr6 map[v6key]string
	// The pod CIDRs per prefix length, masked, longest first: a lookup is
	// one map probe per distinct length of the family (usually one).
	cidr4 []cidrs4
	cidr6 []cidrs6
	nodes int
}

type v6key struct{ hi, lo uint64 }

type cidrs4 struct {
	bits int
	mask uint32
	m    map[uint32]string
}

type cidrs6 struct {
	bits int
	mask v6key
	m    map[v6key]string
}

var _ nodeOf = (*Inventory)(nil)

func key4(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func key6(a netip.Addr) v6key {
	b := a.As16()
	return v6key{binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])}
}

// mask4 and mask6 return the netmask of a prefix length (Go shifts of the
// full width give 0).
func mask4(bits int) uint32 { return ^uint32(0) << (32 - bits) }

func mask6(bits int) v6key {
	if bits > 64 {
		return v6key{^uint64(0), ^uint64(0) << (128 - bits)}
	}
	return v6key{^uint64(0) << (64 - bits), 0}
}

func (k v6key) and(m v6key) v6key { return v6key{k.hi & m.hi, k.lo & m.lo} }

// NodeForIP returns the node owning a (a pod address in its pod CIDRs, or
// one of its own addresses). An IPv4-mapped IPv6 address is looked up as
// IPv4; a zone is ignored.
func (inv *Inventory) NodeForIP(a netip.Addr) (string, bool) {
	if inv == nil || !a.IsValid() {
		return "", false
	}
	a = a.Unmap()
	if a.Is4() {
		k := key4(a)
		if n, ok := inv.addr4[k]; ok {
			return n, true
		}
		for i := range inv.cidr4 {
			c := &inv.cidr4[i]
			if n, ok := c.m[k&c.mask]; ok {
				return n, true
			}
		}
		return "", false
	}
	k := key6(a)
	if n, ok := inv.addr6[k]; ok {
		return n, true
	}
	for i := range inv.cidr6 {
		c := &inv.cidr6[i]
		if n, ok := c.m[k.and(c.mask)]; ok {
			return n, true
		}
	}
	return "", false
}

// Nodes returns the number of nodes in the inventory.
func (inv *Inventory) Nodes() int { return inv.nodes }

// NewInventory builds an inventory from nodes. A pod CIDR claimed by two
// nodes is an error.
func NewInventory(nodes []corev1.Node) (*Inventory, error) {
	inv := &Inventory{addr4: map[uint32]string{}, addr6: map[v6key]string{}}
	for i := range nodes {
		n := &nodes[i]
		cidrs := n.Spec.PodCIDRs
		if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
			cidrs = []string{n.Spec.PodCIDR}
		}
		for _, c := range cidrs {
			p, err := netip.ParsePrefix(c)
			if err != nil {
				return nil, fmt.Errorf("node %s: pod CIDR %q: %w", n.Name, c, err)
			}
			if err := inv.addCIDR(p.Masked(), n.Name); err != nil {
				return nil, err
			}
		}
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				if ip = ip.Unmap().WithZone(""); ip.Is4() {
					inv.addr4[key4(ip)] = n.Name
				} else {
					inv.addr6[key6(ip)] = n.Name
				}
			}
		}
		inv.nodes++
	}
	slices.SortFunc(inv.cidr4, func(a, b cidrs4) int { return b.bits - a.bits })
	slices.SortFunc(inv.cidr6, func(a, b cidrs6) int { return b.bits - a.bits })
	return inv, nil
}

// addCIDR adds the masked prefix p of node.
func (inv *Inventory) addCIDR(p netip.Prefix, node string) error {
	dup := func(other string) error {
		if other != node {
			return fmt.Errorf("pod CIDR %s on nodes %s and %s", p, other, node)
		}
		return nil
	}
	bits := p.Bits()
	if a := p.Addr(); a.Is4() {
		i := slices.IndexFunc(inv.cidr4, func(c cidrs4) bool { return c.bits == bits })
		if i < 0 {
			inv.cidr4 = append(inv.cidr4, cidrs4{bits: bits, mask: mask4(bits), m: map[uint32]string{}})
			i = len(inv.cidr4) - 1
		}
		k := key4(a)
		if other, ok := inv.cidr4[i].m[k]; ok {
			return dup(other)
		}
		inv.cidr4[i].m[k] = node
		return nil
	}
	i := slices.IndexFunc(inv.cidr6, func(c cidrs6) bool { return c.bits == bits })
	if i < 0 {
		inv.cidr6 = append(inv.cidr6, cidrs6{bits: bits, mask: mask6(bits), m: map[v6key]string{}})
		i = len(inv.cidr6) - 1
	}
	k := key6(p.Addr())
	if other, ok := inv.cidr6[i].m[k]; ok {
		return dup(other)
	}
	inv.cidr6[i].m[k] = node
	return nil
}

// LoadInventory reads the Node objects of Kubernetes manifest files
// (YAML or JSON, "---" separated, Lists accepted, other kinds ignored), as
// the enrichment reads its inventory (package enrich/inventory). The
// lab's manifest is such a file.
func LoadInventory(files ...string) (*Inventory, error) {
	res, err := inventory.Load(files...)
	if err != nil {
		return nil, err
	}
	return inventoryOf(res)
}

func inventoryOf(res *inventory.Result) (*Inventory, error) {
	var nodes []corev1.Node
	for _, o := range res.Objects {
		if n, ok := o.Object.(*corev1.Node); ok {
			nodes = append(nodes, *n)
		}
	}
	if len(nodes) == 0 {
		return nil, errors.New("inventory: no Node objects")
	}
	return NewInventory(nodes)
}
