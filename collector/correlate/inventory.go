package correlate

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
)

// Inventory maps addresses to node names from the nodes of a cluster view
// (--collector.inventory's manifest, read as the enrichment reads one):
// each node's pod CIDRs (both families) and its InternalIP/ExternalIP addresses
// (SNAT-ed flows leave a node with its address). The correlator uses it to
// tell which node reported which half of a connection. Once filled
// (AddNode) it is read-only and safe for concurrent use.
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

// NewInventory returns an empty inventory; AddNode fills it, before it is
// shared.
func NewInventory() *Inventory {
	return &Inventory{addr4: map[uint32]string{}, addr6: map[v6key]string{}}
}

// AddNode indexes node's pod CIDRs and its own addresses (the
// enrichment's view of a Node: masked, unmapped). A pod CIDR of another
// node is an error.
func (inv *Inventory) AddNode(node string, podCIDRs []netip.Prefix, addrs ...netip.Addr) error {
	for _, p := range podCIDRs {
		if err := inv.addCIDR(p, node); err != nil {
			return err
		}
	}
	for _, ip := range addrs {
		if ip = ip.WithZone(""); ip.Is4() {
			inv.addr4[key4(ip)] = node
		} else {
			inv.addr6[key6(ip)] = node
		}
	}
	inv.nodes++
	return nil
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
			i, _ = slices.BinarySearchFunc(inv.cidr4, bits, func(c cidrs4, bits int) int { return bits - c.bits })
			inv.cidr4 = slices.Insert(inv.cidr4, i, cidrs4{bits: bits, mask: mask4(bits), m: map[uint32]string{}})
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
		i, _ = slices.BinarySearchFunc(inv.cidr6, bits, func(c cidrs6, bits int) int { return bits - c.bits })
		inv.cidr6 = slices.Insert(inv.cidr6, i, cidrs6{bits: bits, mask: mask6(bits), m: map[v6key]string{}})
	}
	k := key6(p.Addr())
	if other, ok := inv.cidr6[i].m[k]; ok {
		return dup(other)
	}
	inv.cidr6[i].m[k] = node
	return nil
}
