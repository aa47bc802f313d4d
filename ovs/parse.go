package ovs

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/dualflow/dualflow/flow"
)

// ErrSyntax is wrapped by every parse error of OVS CLI output.
var ErrSyntax = errors.New("ovs output syntax")

func syntaxErr(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrSyntax, fmt.Sprintf(format, args...))
}

// nextField splits s at its first comma outside parentheses and returns the
// field before it and the rest after it. The field is split at its first
// '=' into key and value; a field without '=' is returned as key with an
// empty value. It fails on unbalanced parentheses.
func nextField(s string) (key, val, rest string, err error) {
	depth := 0
	end := len(s)
loop:
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
			if depth < 0 {
				return "", "", "", syntaxErr("unbalanced ')' in %q", clip(s))
			}
		case ',':
			if depth == 0 {
				end = i
				break loop
			}
		}
	}
	if depth != 0 {
		return "", "", "", syntaxErr("unbalanced '(' in %q", clip(s))
	}
	f := s[:end]
	if end < len(s) {
		rest = s[end+1:]
	}
	key, val, _ = strings.Cut(f, "=")
	return key, val, rest, nil
}

// inParens returns the text inside "(...)".
func inParens(v string) (string, error) {
	if len(v) < 2 || v[0] != '(' || v[len(v)-1] != ')' {
		return "", syntaxErr("want (...), got %q", clip(v))
	}
	return v[1 : len(v)-1], nil
}

// clip shortens s for error messages.
func clip(s string) string {
	if len(s) > 80 {
		return s[:77] + "..."
	}
	return s
}

func parseAddr(v string) (netip.Addr, error) {
	if strings.IndexByte(v, '%') >= 0 { // a zone would make ParseAddr keep a string
		return netip.Addr{}, syntaxErr("address with zone %q", clip(v))
	}
	a, err := netip.ParseAddr(v)
	if err != nil {
		return netip.Addr{}, syntaxErr("address %q", clip(v))
	}
	return a.Unmap(), nil
}

func parseUint(v string, bits int) (uint64, error) {
	n, err := strconv.ParseUint(v, 0, bits)
	if err != nil {
		return 0, syntaxErr("number %q (%d bits)", clip(v), bits)
	}
	return n, nil
}

// tupleField sets the field of t that match field k (without its "ct_"
// prefix: nw_src, ipv6_dst, tp_src, ...) names to v. known is false for
// another field.
func tupleField(t *flow.Tuple, k, v string) (known bool, err error) {
	switch k {
	case "nw_src", "ipv6_src":
		t.Src, err = parseAddr(v)
	case "nw_dst", "ipv6_dst":
		t.Dst, err = parseAddr(v)
	case "tp_src", "tp_dst":
		var n uint64
		if n, err = parseUint(v, 16); err == nil {
			if k == "tp_src" {
				t.SrcPort = uint16(n)
			} else {
				t.DstPort = uint16(n)
			}
		}
	default:
		return false, nil
	}
	return true, err
}

// parseHex128 parses a hexadecimal number of up to 128 bits ("0x…") into
// its high and low 64 bits.
func parseHex128(v string) (hi, lo uint64, err error) {
	h, ok := strings.CutPrefix(v, "0x")
	if !ok || h == "" || len(h) > 32 {
		return 0, 0, syntaxErr("128-bit hex %q", clip(v))
	}
	split := max(0, len(h)-16)
	if split > 0 {
		if hi, err = strconv.ParseUint(h[:split], 16, 64); err != nil {
			return 0, 0, syntaxErr("128-bit hex %q", clip(v))
		}
	}
	if lo, err = strconv.ParseUint(h[split:], 16, 64); err != nil {
		return 0, 0, syntaxErr("128-bit hex %q", clip(v))
	}
	return hi, lo, nil
}

// protoNumbers are the protocol names OVS prints (ct-dpif, ofp-flow).
var protoNumbers = map[string]uint8{
	"icmp": 1, "igmp": 2, "tcp": 6, "udp": 17, "gre": 47, "icmpv6": 58, "sctp": 132, "udplite": 136, "dccp": 33,
}

// lines calls fn for each line of s without its line terminator. It stops
// when fn returns false.
func lines(s string, fn func(line string) bool) {
	for len(s) > 0 {
		line, rest, _ := strings.Cut(s, "\n")
		s = rest
		if !fn(strings.TrimSuffix(line, "\r")) {
			return
		}
	}
}
