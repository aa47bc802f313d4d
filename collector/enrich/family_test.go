package enrich

import (
	"net/netip"
	"testing"
)

func addrs(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		if s == "" {
			out = append(out, netip.Addr{})
			continue
		}
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func TestAddrOfFamily(t *testing.T) {
	for _, tc := range []struct {
		name    string
		addrs   []netip.Addr
		version uint8
		want    string
	}{
		{"ipv4 of dual", addrs("fd00:10::1", "198.18.0.1"), 4, "198.18.0.1"},
		{"ipv6 of dual", addrs("198.18.0.1", "fd00:10::1"), 6, "fd00:10::1"},
		{"ipv6 of ipv4-only", addrs("198.18.0.1"), 6, ""},
		{"ipv4 of ipv6-only", addrs("fd00:10::1"), 4, ""},
		{"first of the family", addrs("fd00:10::2", "fd00:10::1"), 6, "fd00:10::2"},
		{"mapped is ipv4", addrs("::ffff:198.18.0.9"), 4, "198.18.0.9"},
		{"mapped is not ipv6", addrs("::ffff:198.18.0.9"), 6, ""},
		{"link-local last", addrs("fe80::1", "fd00:10:ff::1"), 6, "fd00:10:ff::1"},
		{"only link-local", addrs("fe80::1"), 6, "fe80::1"},
		{"bad version", addrs("198.18.0.1", "fd00:10::1"), 5, ""},
		{"empty", nil, 4, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := AddrOfFamily(tc.addrs, tc.version)
			want := netip.Addr{}
			if tc.want != "" {
				want = netip.MustParseAddr(tc.want)
			}
			if got != want || ok != (tc.want != "") {
				t.Errorf("AddrOfFamily(%v, %d) = %v, %v; want %v", tc.addrs, tc.version, got, ok, tc.want)
			}
		})
	}
}
