package enrich

import "net/netip"

// Address family selection, for features that must pick one address of a
// dual-stack object: which ClusterIP a trace targets, which endpoint
// address a "preferred" view shows. Pure functions, shared by traceflow
// and the web UI so that every view makes the same choice.

// PreferAddr picks the address to use when one of addrs must be chosen:
// an IPv6 address when there is one and ipv6Enabled, else an IPv4 one.
// With ipv6Enabled false IPv6 addresses are dropped entirely, so a list
// with only IPv6 addresses yields none.
//
// Within a family the first address in list order wins (Kubernetes lists
// the primary first), except that link-local addresses (169.254.0.0/16,
// fe80::/10) are used only when no other address qualifies: then IPv6
// link-local still comes before IPv4 link-local. Invalid addresses are
// skipped; IPv4-mapped IPv6 addresses count as IPv4 and are returned
// unmapped. ok is false when nothing qualifies.
func PreferAddr(addrs []netip.Addr, ipv6Enabled bool) (addr netip.Addr, ok bool) {
	// rank: 0 IPv6 global, 1 IPv4 global, 2 IPv6 link-local, 3 IPv4 link-local.
	best, bestRank := netip.Addr{}, 4
	for _, a := range addrs {
		if !a.IsValid() {
			continue
		}
		a = a.Unmap()
		if a.Is6() && !ipv6Enabled {
			continue
		}
		r := 0
		if a.Is4() {
			r = 1
		}
		if a.IsLinkLocalUnicast() {
			r += 2
		}
		if r < bestRank {
			best, bestRank = a, r
		}
	}
	return best, bestRank < 4
}

// AddrOfFamily returns the first address of addrs in IP version version
// (4 or 6, as flow.Record.IPVersion), preferring non-link-local ones like
// PreferAddr. IPv4-mapped IPv6 addresses count as IPv4 and are returned
// unmapped. ok is false when addrs has none of that family.
func AddrOfFamily(addrs []netip.Addr, version uint8) (addr netip.Addr, ok bool) {
	var linkLocal netip.Addr
	for _, a := range addrs {
		if !a.IsValid() {
			continue
		}
		a = a.Unmap()
		if (version == 4) != a.Is4() || (version != 4 && version != 6) {
			continue
		}
		if !a.IsLinkLocalUnicast() {
			return a, true
		}
		if !linkLocal.IsValid() {
			linkLocal = a
		}
	}
	return linkLocal, linkLocal.IsValid()
}
