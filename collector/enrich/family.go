package enrich

import "net/netip"

// AddrOfFamily returns the first address of addrs in IP version version
// (4 or 6, as flow.Record.IPVersion), preferring non-link-local ones, so
// that every feature picks the same address of a dual-stack object.
// IPv4-mapped IPv6 addresses count as IPv4 and are returned unmapped. ok
// is false when addrs has none of that family.
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
