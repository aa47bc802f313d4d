// Package netaddr holds small helpers for netip values shared by the
// exporter and the collector.
package netaddr

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
)

// PrefixList is a flag.Value holding a comma-separated list of CIDRs of
// either family. Prefixes are stored masked and without duplicates; Set
// replaces the list.
type PrefixList []netip.Prefix

// String implements flag.Value.
func (p *PrefixList) String() string {
	if p == nil {
		return ""
	}
	s := make([]string, 0, len(*p))
	for _, v := range *p {
		s = append(s, v.String())
	}
	return strings.Join(s, ",")
}

// Set implements flag.Value.
func (p *PrefixList) Set(s string) error {
	*p = (*p)[:0]
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := netip.ParsePrefix(f)
		if err != nil {
			return fmt.Errorf("CIDR %q: %w", f, err)
		}
		if v = v.Masked(); !slices.Contains(*p, v) {
			*p = append(*p, v)
		}
	}
	return nil
}
