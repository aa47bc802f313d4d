package correlate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Inventory maps addresses to node names from Node objects: each node's
// spec.podCIDRs (both families) and its InternalIP/ExternalIP addresses
// (SNAT-ed flows leave a node with its address). It stands in for the
// Kubernetes enrichment until that exists. It is immutable and safe for
// concurrent use.
type Inventory struct {
	addrs map[netip.Addr]string
	// byBits holds the pod CIDRs per prefix length, masked, so a lookup is
	// one map probe per distinct length (usually one per family).
	byBits map[int]map[netip.Prefix]string
	bits   []int // keys of byBits, longest first
	nodes  int
}

var _ nodeOf = (*Inventory)(nil)

// NodeForIP returns the node owning a (a pod address in its pod CIDRs, or
// one of its own addresses).
func (inv *Inventory) NodeForIP(a netip.Addr) (string, bool) {
	if inv == nil || !a.IsValid() {
		return "", false
	}
	a = a.Unmap()
	if n, ok := inv.addrs[a]; ok {
		return n, true
	}
	for _, b := range inv.bits {
		if b > a.BitLen() {
			continue
		}
		p, err := a.Prefix(b)
		if err != nil {
			continue
		}
		if n, ok := inv.byBits[b][p]; ok {
			return n, true
		}
	}
	return "", false
}

// Nodes returns the number of nodes in the inventory.
func (inv *Inventory) Nodes() int { return inv.nodes }

// NewInventory builds an inventory from nodes.
func NewInventory(nodes []corev1.Node) (*Inventory, error) {
	inv := &Inventory{addrs: map[netip.Addr]string{}, byBits: map[int]map[netip.Prefix]string{}}
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
			p = p.Masked()
			m := inv.byBits[p.Bits()]
			if m == nil {
				m = map[netip.Prefix]string{}
				inv.byBits[p.Bits()] = m
				inv.bits = append(inv.bits, p.Bits())
			}
			if other, dup := m[p]; dup && other != n.Name {
				return nil, fmt.Errorf("pod CIDR %s on nodes %s and %s", p, other, n.Name)
			}
			m[p] = n.Name
		}
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
				continue
			}
			if ip, err := netip.ParseAddr(a.Address); err == nil {
				inv.addrs[ip.Unmap()] = n.Name
			}
		}
		inv.nodes++
	}
	slices.Sort(inv.bits)
	slices.Reverse(inv.bits)
	return inv, nil
}

// LoadInventory reads Node objects from a Kubernetes YAML or JSON manifest
// file: documents separated by "---", each a Node, a List of objects, or any
// other kind (ignored). The lab's manifest is such a file.
func LoadInventory(path string) (*Inventory, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("inventory: %w", err)
	}
	defer f.Close()
	inv, err := ParseInventory(f)
	if err != nil {
		return nil, fmt.Errorf("inventory %s: %w", path, err)
	}
	return inv, nil
}

// ParseInventory reads Node objects from a manifest (see LoadInventory).
func ParseInventory(r io.Reader) (*Inventory, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	var nodes []corev1.Node
	for i, doc := range splitDocs(b) {
		var head struct {
			Kind  string            `json:"kind"`
			Items []json.RawMessage `json:"items"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		switch head.Kind {
		case "Node":
			var n corev1.Node
			if err := yaml.Unmarshal(doc, &n); err != nil {
				return nil, fmt.Errorf("document %d: %w", i+1, err)
			}
			nodes = append(nodes, n)
		case "List", "NodeList":
			for _, it := range head.Items {
				var n corev1.Node
				if err := yaml.Unmarshal(it, &n); err != nil {
					return nil, fmt.Errorf("document %d: %w", i+1, err)
				}
				if n.Kind == "Node" || head.Kind == "NodeList" {
					nodes = append(nodes, n)
				}
			}
		}
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("no Node objects")
	}
	return NewInventory(nodes)
}

// splitDocs splits a YAML stream at "---" lines.
func splitDocs(b []byte) [][]byte {
	var docs [][]byte
	for i, d := range bytes.Split(append([]byte("\n"), b...), []byte("\n---")) {
		if i > 0 { // drop the rest of the separator line
			j := bytes.IndexByte(d, '\n')
			if j < 0 {
				continue
			}
			d = d[j:]
		}
		if len(bytes.TrimSpace(d)) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}
