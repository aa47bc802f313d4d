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

func TestPreferAddr(t *testing.T) {
	for _, tc := range []struct {
		name  string
		addrs []netip.Addr
		ipv6  bool
		want  string // "" for none
	}{
		{"ipv4 only", addrs("198.19.0.10"), true, "198.19.0.10"},
		{"ipv6 only", addrs("fd00:10:96::10"), true, "fd00:10:96::10"},
		{"dual, ipv4 first: ipv6 preferred", addrs("198.19.0.10", "fd00:10:96::10"), true, "fd00:10:96::10"},
		{"dual, ipv6 first", addrs("fd00:10:96::10", "198.19.0.10"), true, "fd00:10:96::10"},
		{"dual, ipv6 disabled", addrs("198.19.0.10", "fd00:10:96::10"), false, "198.19.0.10"},
		{"ipv6 only, ipv6 disabled: none", addrs("fd00:10:96::10"), false, ""},
		{"two ipv6: the first", addrs("198.18.0.1", "fd00:10:ff::2", "fd00:10:ff::1"), true, "fd00:10:ff::2"},
		{"two ipv4: the first", addrs("198.18.0.2", "198.18.0.1"), false, "198.18.0.2"},
		{"mapped ipv4 counts as ipv4, unmapped", addrs("::ffff:198.18.0.1"), true, "198.18.0.1"},
		{"mapped ipv4 with ipv6 disabled", addrs("::ffff:198.18.0.1", "fd00:10::1"), false, "198.18.0.1"},
		{"ipv6 link-local loses to ipv4", addrs("fe80::1", "198.19.200.1"), true, "198.19.200.1"},
		{"ipv6 link-local loses to global ipv6", addrs("fe80::1", "fd00:10:ff::1"), true, "fd00:10:ff::1"},
		{"ipv6 link-local beats ipv4 link-local", addrs("169.254.0.1", "fe80::1"), true, "fe80::1"},
		{"ipv4 link-local when nothing else", addrs("169.254.0.1"), true, "169.254.0.1"},
		{"invalid skipped", addrs("", "fd00:10::1"), true, "fd00:10::1"},
		{"empty", nil, true, ""},
		{"all invalid", addrs("", ""), true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := PreferAddr(tc.addrs, tc.ipv6)
			want := netip.Addr{}
			if tc.want != "" {
				want = netip.MustParseAddr(tc.want)
			}
			if got != want || ok != (tc.want != "") {
				t.Errorf("PreferAddr(%v, %v) = %v, %v; want %v", tc.addrs, tc.ipv6, got, ok, tc.want)
			}
		})
	}
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
