package recommend

import (
	"maps"
	"net/netip"
	"slices"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/collector/enrich"
)

// Aggregation of external peers: addresses that used the same ports are
// grouped by their /24 (IPv4) or /64 (IPv6), the usual size of one
// subnet, and each group becomes the smallest prefix that holds its
// addresses: one address stays a /32 or /128, several become the
// smallest common prefix inside their /24 or /64, never wider.
const (
	aggregateBits4 = 24
	aggregateBits6 = 64
)

// aggregate merges external peers (class 2, one address each, the same
// ports) into one peer per prefix.
func aggregate(ps []*peerObs) []*peerObs {
	groups := map[netip.Prefix][]*peerObs{}
	for _, p := range ps {
		bits := aggregateBits6
		if p.addr.Is4() {
			bits = aggregateBits4
		}
		k, _ := p.addr.Prefix(bits)
		groups[k] = append(groups[k], p)
	}
	var out []*peerObs
	for _, k := range slices.SortedFunc(maps.Keys(groups), func(a, b netip.Prefix) int { return cmpAddr(a.Addr(), b.Addr()) }) {
		g := groups[k]
		lo, hi := g[0].addr, g[0].addr
		for _, p := range g[1:] {
			lo, hi = minAddr(lo, p.addr), maxAddr(hi, p.addr)
		}
		pfx := commonPrefix(lo, hi)
		m := &peerObs{class: 2, key: pfx.String(), addr: pfx.Addr(), peers: []networkingv1.NetworkPolicyPeer{blockPeer(pfx)},
			ports: map[portKey]map[*enrich.Pod]bool{}, dsts: map[*workload]bool{}, lines: map[string]*line{}, notes: map[string]bool{}}
		for _, p := range g {
			for k, pods := range p.ports {
				for pod := range pods {
					m.addPort(k, pod, nil)
				}
			}
			maps.Copy(m.dsts, p.dsts)
			for t, l := range p.lines {
				if have := m.lines[t]; have != nil {
					have.fams[0], have.fams[1] = have.fams[0] || l.fams[0], have.fams[1] || l.fams[1]
					have.records += l.records
				} else {
					cp := *l
					m.lines[t] = &cp
				}
			}
			for n := range p.notes {
				m.notes[n] = true
			}
		}
		out = append(out, m)
	}
	return out
}

func minAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return a
	}
	return b
}

func maxAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return b
	}
	return a
}

// commonPrefix is the longest prefix holding both lo and hi (of one
// family).
func commonPrefix(lo, hi netip.Addr) netip.Prefix {
	for bits := lo.BitLen(); bits >= 0; bits-- {
		p, _ := lo.Prefix(bits)
		if p.Contains(hi) {
			return p
		}
	}
	return netip.Prefix{}
}
