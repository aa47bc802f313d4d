package api

import (
	"net/netip"
	"strconv"

	"github.com/dualflow/dualflow/internal/chsql"
)

// The store's Conn has no server-side parameters, so every value that
// reaches SQL text goes through chsql.String (or these literals built on
// it). Identifiers (columns) never come from input: they are picked from
// fixed tables.

// ipv6Literal returns the IPv6-typed literal of a (IPv4 mapped), to compare
// with the *_ip_bin columns.
func ipv6Literal(a netip.Addr) string {
	// toIPv6 maps IPv4 text to ::ffff:a.b.c.d itself.
	return "toIPv6(" + chsql.String(a.Unmap().String()) + ")"
}

// prefixRange returns the first and last address of p as IPv6 literals
// (IPv4 prefixes as ::ffff:a.b.c.d), for BETWEEN on *_ip_bin.
func prefixRange(p netip.Prefix) (lo, hi string) {
	p = p.Masked()
	first := p.Addr()
	last := lastAddr(p)
	return ipv6Literal(first), ipv6Literal(last)
}

// lastAddr is the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	a := p.Masked().Addr()
	b := a.AsSlice()
	bits := p.Bits()
	for i := range b {
		lo := i * 8
		switch {
		case lo >= bits:
			b[i] = 0xff
		case lo+8 > bits:
			b[i] |= byte(0xff >> (bits - lo))
		}
	}
	out, _ := netip.AddrFromSlice(b)
	return out
}

func itoa(v int64) string { return strconv.FormatInt(v, 10) }
