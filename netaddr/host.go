package netaddr

import (
	"net"
	"net/netip"
	"slices"
	"strings"
)

// HostAllowed reports whether an HTTP Host header (host or host:port)
// names this server in a way DNS rebinding cannot forge: an IP address
// literal of either family (a page served from a rebound name is never
// same-origin with an address literal), "localhost" or a name under
// ".localhost" (RFC 6761: never resolved by DNS), or one of names
// (compared case-insensitively, without a trailing dot). An empty Host is
// refused: browsers always send one.
func HostAllowed(hostHeader string, names []string) bool {
	host := hostHeader
	if h, _, err := net.SplitHostPort(hostHeader); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if host == "" {
		return false
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Zone() == "" {
		return true
	}
	if host == "localhost" || strings.HasSuffix(host, ".localhost") {
		return true
	}
	return slices.ContainsFunc(names, func(n string) bool {
		return strings.TrimSuffix(strings.ToLower(n), ".") == host
	})
}

// Loopback reports whether host (without port or brackets) is "localhost"
// or a loopback address of either family.
func Loopback(host string) bool {
	a, err := netip.ParseAddr(host)
	return strings.EqualFold(host, "localhost") || (err == nil && a.Unmap().IsLoopback())
}

// HostList is a flag.Value holding a comma-separated list of host names.
type HostList []string

// String implements flag.Value.
func (h *HostList) String() string {
	if h == nil {
		return ""
	}
	return strings.Join(*h, ",")
}

// Set implements flag.Value: it replaces the list.
func (h *HostList) Set(s string) error {
	*h = nil
	for n := range strings.SplitSeq(s, ",") {
		if n = strings.TrimSpace(n); n != "" {
			*h = append(*h, n)
		}
	}
	return nil
}
