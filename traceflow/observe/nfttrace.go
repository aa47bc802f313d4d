// Package observe watches traceflow probes in a node's datapath.
//
// Kernel datapath (nftables): during a watch, the node gets a small table
// of its own (Table, named by NewTableName) whose prerouting chain sets
// `meta nftrace` on the probe (matched by DSCP tag, source address,
// protocol and source port or echo id) and whose postrouting chain sees
// it leave. The table is programmed over netlink (LoadTable, DeleteTable,
// ListTables: no nft process per load). `nft monitor` in the node's
// namespace (Monitor) then reports every chain and rule the probe goes
// through, with the packet headers at each hook (so the DNAT result is
// visible) and each verdict; ParseTrace reads those lines.
package observe

import (
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// EventKind is the kind of a trace line.
type EventKind string

// Kinds of trace lines.
const (
	KindPacket EventKind = "packet" // headers at the start of a base chain
	KindRule   EventKind = "rule"   // a rule matched
	KindPolicy EventKind = "policy" // a base chain's policy applied
)

// Event is one `nft monitor trace` line.
type Event struct {
	ID    string // the kernel's trace id; one per packet and hook traversal
	Table string // e.g. "dualflow"
	Chain string
	Kind  EventKind
	// Rule is the rule text (KindRule).
	Rule string
	// Verdict is "accept", "drop", "continue", "jump <chain>", "return"...
	Verdict string
	// Packet headers (KindPacket).
	IIf, OIf         string
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
}

// ParseTrace parses one line of `nft monitor` output; ok is false for lines
// that are not trace events (ruleset changes, blank lines).
//
//	trace id 672352a6 inet dualflow forward packet: iif "veth9dd0" oif "eth0" ... ip saddr 198.18.1.10 ip daddr 198.18.2.11 ...
//	trace id 672352a6 inet dualflow ep/backend/api/http/v4/0 rule meta l4proto tcp ... dnat ip to 198.18.1.11:8080 ... (verdict accept)
//	trace id 672352a6 inet dualflow forward policy accept
func ParseTrace(line string) (Event, bool) {
	rest, ok := strings.CutPrefix(strings.TrimSpace(line), "trace id ")
	if !ok {
		return Event{}, false
	}
	f := strings.SplitN(rest, " ", 5) // id family table chain rest
	if len(f) < 5 {
		return Event{}, false
	}
	e := Event{ID: f[0], Table: f[2], Chain: f[3]}
	body := f[4]
	switch {
	case strings.HasPrefix(body, "packet: "):
		e.Kind = KindPacket
		parsePacket(&e, strings.Fields(strings.TrimPrefix(body, "packet: ")))
	case strings.HasPrefix(body, "policy "):
		e.Kind, e.Verdict = KindPolicy, strings.TrimSpace(strings.TrimPrefix(body, "policy "))
	default:
		// "rule …", and "unknown rule handle N" for a rule nft monitor
		// has not cached (one replaced since it started, such as
		// kube-router's on every sync): its verdict counts all the same.
		e.Kind = KindRule
		body = strings.TrimPrefix(body, "rule ")
		if i := strings.LastIndex(body, " (verdict "); i >= 0 && strings.HasSuffix(body, ")") {
			e.Rule, e.Verdict = body[:i], body[i+len(" (verdict "):len(body)-1]
		} else {
			e.Rule = body
		}
	}
	return e, true
}

func parsePacket(e *Event, tok []string) {
	for i := 0; i+1 < len(tok); i++ {
		k, v := tok[i], tok[i+1]
		if i+2 < len(tok) && (k == "ip" || k == "ip6" || k == "tcp" || k == "udp") {
			v = tok[i+2]
			k += " " + tok[i+1]
		}
		switch k {
		case "iif":
			e.IIf = strings.Trim(v, `"`)
		case "oif":
			e.OIf = strings.Trim(v, `"`)
		case "ip saddr", "ip6 saddr":
			e.Src, _ = netip.ParseAddr(v)
		case "ip daddr", "ip6 daddr":
			e.Dst, _ = netip.ParseAddr(v)
		case "tcp sport", "udp sport":
			e.SrcPort = parsePort(v)
		case "tcp dport", "udp dport":
			e.DstPort = parsePort(v)
		}
	}
}

func parsePort(s string) uint16 {
	n, err := strconv.ParseUint(s, 10, 16)
	if err != nil {
		return 0
	}
	return uint16(n)
}

// Quoted returns the first quoted string after key in rule text, e.g.
// Quoted(rule, "comment") or Quoted(rule, "counter name").
func Quoted(rule, key string) (string, bool) {
	_, rest, ok := strings.Cut(rule, key+` "`)
	s, _, closed := strings.Cut(rest, `"`)
	if !ok || !closed {
		return "", false
	}
	return s, true
}

// DNATTarget reports whether rule is a DNAT, and the address it DNATs to:
// "dnat ip to A:P", "dnat ip6 to [A]:P", with or without port. A DNAT to
// one of several endpoints through a map (kube-proxy's nftables mode:
// "dnat ip to numgen random mod 2 map { 0 : A . P, 1 : … }") has no one
// target in the rule: the address is zero, and the packet's next headers
// or conntrack tell which endpoint it got.
func DNATTarget(rule string) (netip.AddrPort, bool) {
	for _, kw := range []string{"dnat ip to ", "dnat ip6 to ", "dnat to "} {
		_, after, ok := strings.Cut(rule, kw)
		if !ok {
			continue
		}
		tok := strings.Fields(after)
		if len(tok) == 0 {
			return netip.AddrPort{}, false
		}
		if ap, err := netip.ParseAddrPort(tok[0]); err == nil {
			return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
		}
		if a, err := netip.ParseAddr(strings.Trim(tok[0], "[]")); err == nil {
			return netip.AddrPortFrom(a.Unmap(), 0), true
		}
		if slices.Contains(tok, "map") {
			return netip.AddrPort{}, true
		}
	}
	return netip.AddrPort{}, false
}
