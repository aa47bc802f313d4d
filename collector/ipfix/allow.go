package ipfix

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
)

// AllowList is the set of exporter addresses the listeners accept
// (--collector.ipfix.allowed-sources): CIDRs or single addresses of either
// family, and "any" (0.0.0.0/0 and ::/0). An empty list allows every
// source. It is a flag.Value; Set replaces the list.
//
// The list's prefixes other than /0 also name the preferred sources, for
// which MaxSessions/8 of the TCP/TLS places are kept (see preferred): with
// "198.18.0.0/16,any", sources outside 198.18.0.0/16 are accepted but
// cannot take those places.
//
// IPv4-mapped IPv6 addresses are unmapped on both sides, so 198.18.0.0/16
// matches an IPv4 exporter seen as ::ffff:198.18.0.1 on a dual-stack
// socket, and ::ffff:198.18.0.0/112 is stored as 198.18.0.0/16.
type AllowList []netip.Prefix

// String implements flag.Value.
func (a *AllowList) String() string {
	if a == nil {
		return ""
	}
	s := make([]string, 0, len(*a))
	for _, p := range *a {
		s = append(s, p.String())
	}
	return strings.Join(s, ",")
}

// Set implements flag.Value.
func (a *AllowList) Set(s string) error {
	*a = (*a)[:0]
	for f := range strings.SplitSeq(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		ps := anySource
		if f != "any" {
			p, err := parseSource(f)
			if err != nil {
				return err
			}
			ps = []netip.Prefix{p}
		}
		for _, p := range ps {
			if !slices.Contains(*a, p) {
				*a = append(*a, p)
			}
		}
	}
	return nil
}

// anySource is what "any" stands for in an AllowList.
var anySource = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

// localSources are the preferred sources without an allowlist: loopback,
// and the private (RFC 1918) and unique-local (RFC 4193) networks that the
// NetworkPolicy of deploy/ admits IPFIX from, where a cluster's nodes are.
var localSources = AllowList{
	netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"),
	netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("fc00::/7"),
}

// preferred returns the sources that may take the places kept in reserve:
// the list's prefixes but its /0s, which accept any source without
// preferring it; without a list, localSources. An empty result (the list
// is "any") allows, and so prefers, every source: no reserve.
func (a AllowList) preferred() AllowList {
	if len(a) == 0 {
		return localSources
	}
	out := make(AllowList, 0, len(a))
	for _, p := range a {
		if p.Bits() > 0 {
			out = append(out, p)
		}
	}
	return out
}

// parseSource parses a CIDR or a single address into a masked prefix,
// IPv4-mapped prefixes unmapped.
func parseSource(s string) (netip.Prefix, error) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return p, fmt.Errorf("allowed source %q: %w", s, err)
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return p, fmt.Errorf("allowed source %q: want a CIDR or an address: %w", s, err)
		}
		if a.Zone() != "" {
			return p, fmt.Errorf("allowed source %q: zones are not supported", s)
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	return unmapPrefix(p), nil
}

// unmapPrefix turns a prefix inside ::ffff:0:0/96 into the IPv4 prefix it
// stands for, masked.
func unmapPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// Allows reports whether a message from addr may be read: the list is
// empty, or a prefix contains addr (unmapped, zone dropped).
func (a AllowList) Allows(addr netip.Addr) bool {
	addr = addr.Unmap().WithZone("")
	return len(a) == 0 || slices.ContainsFunc(a, func(p netip.Prefix) bool { return p.Contains(addr) })
}

// normalize masks and unmaps prefixes set in code rather than through Set.
func (a AllowList) normalize() AllowList {
	out := make(AllowList, 0, len(a))
	for _, p := range a {
		if p = unmapPrefix(p); !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out
}

// addrOfNet returns the IP address of a *net.TCPAddr or *net.UDPAddr (or
// of any address whose String is host:port), unmapped.
func addrOfNet(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort().Addr().Unmap()
	case *net.UDPAddr:
		return a.AddrPort().Addr().Unmap()
	}
	if a == nil {
		return netip.Addr{}
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// warnOpen logs, once at start, the listeners any host may feed: bound to
// a non-loopback address, with no allowlist, and for TLS without client
// certificates.
func (l *Listener) warnOpen() {
	if len(l.cfg.AllowedSources) > 0 {
		return
	}
	var open []string
	check := func(tr Transport, addrs []net.Addr) {
		for _, a := range addrs {
			if !addrOfNet(a).IsLoopback() {
				open = append(open, tr.String()+" "+a.String())
			}
		}
	}
	check(TCP, l.TCPAddrs())
	check(UDP, l.UDPAddrs())
	if l.cfg.TLSClientCAFile == "" {
		check(TLS, l.TLSAddrs())
	}
	if len(open) > 0 {
		lim := newConnLimits(l.cfg)
		l.log.Warn("ipfix listeners accept flows from any host that reaches them: set --collector.ipfix.allowed-sources to the nodes' addresses (\"any\" to accept every host), or use TLS with --collector.ipfix.tls-client-ca; until then, the last TCP/TLS places are kept for loopback and private networks",
			"listeners", open, "reserved", lim.reserved, "preferred", localSources.String())
	}
}
