// Package observe watches traceflow probes in a node's datapath.
//
// Kernel datapath (nftables): during a trace, each node gets a small table
// of its own (TableName) whose prerouting chain sets `meta nftrace` on the
// probe (matched by DSCP tag, source address, protocol and source port or
// echo id) and whose postrouting chain sees it leave. `nft monitor` in the
// node's namespace (Monitor) then reports every chain and rule the probe
// goes through, with the packet headers at each hook (so the DNAT result
// is visible) and each verdict; ParseTrace reads those lines.
package observe

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// TablePrefix starts the name of every traceflow table; TableName(tag)
// is the table of one probe.
const TablePrefix = "dualflow_trace_"

// TableName returns the nft table of the probe with tag.
func TableName(tag uint8) string { return TablePrefix + strconv.Itoa(int(tag)) }

// ProbeMatch identifies one probe in nft rules.
type ProbeMatch struct {
	Tag     uint8
	Src     netip.Addr
	Proto   uint8  // 1, 6, 17 or 58
	SrcPort uint16 // or echo id
}

func (m ProbeMatch) nft() string {
	l3 := "ip"
	if m.Src.Unmap().Is6() {
		l3 = "ip6"
	}
	s := fmt.Sprintf("%s dscp %d %s saddr %s", l3, m.Tag, l3, m.Src.Unmap())
	switch m.Proto {
	case 6:
		s += fmt.Sprintf(" tcp sport %d", m.SrcPort)
	case 17:
		s += fmt.Sprintf(" udp sport %d", m.SrcPort)
	case 1:
		s += fmt.Sprintf(" icmp type echo-request icmp id %d", m.SrcPort)
	case 58:
		s += fmt.Sprintf(" icmpv6 type echo-request icmpv6 id %d", m.SrcPort)
	}
	return s
}

// Chains of a trace table: Pre sees the probe arrive before conntrack and
// DNAT (priority -350, ahead of raw), Post sees it leave after SNAT.
const (
	ChainPre  = "pre"
	ChainPost = "post"
)

// TableRules returns the `nft -f` text that (re)creates the trace table of
// m. Apply DeleteTable's text when the trace ends.
func TableRules(m ProbeMatch) string { return tableText(m.Tag, m.nft()) }

// LiveRules returns the trace table (named by tag) that traces the first
// packet of every new connection of protocol proto from src: a TCP SYN
// without ACK, an echo request, or any UDP datagram.
func LiveRules(tag uint8, src netip.Addr, proto uint8) string {
	l3 := "ip"
	if src.Unmap().Is6() {
		l3 = "ip6"
	}
	match := fmt.Sprintf("%s saddr %s", l3, src.Unmap())
	switch proto {
	case 6:
		match += " tcp flags & (syn | ack) == syn"
	case 17:
		match += " meta l4proto udp"
	case 1:
		match += " icmp type echo-request"
	case 58:
		match += " icmpv6 type echo-request"
	}
	return tableText(tag, match)
}

func tableText(tag uint8, match string) string {
	t := "inet " + TableName(tag)
	return fmt.Sprintf(`table %[1]s
delete table %[1]s
table %[1]s {
	chain %[2]s {
		type filter hook prerouting priority -350; policy accept;
		%[4]s meta nftrace set 1 comment "traceflow probe"
	}
	chain %[3]s {
		type filter hook postrouting priority 350; policy accept;
		%[4]s counter comment "traceflow probe out"
	}
}
`, t, ChainPre, ChainPost, match)
}

// DeleteTable returns the `nft -f` text that removes the trace table of tag.
func DeleteTable(tag uint8) string {
	t := "inet " + TableName(tag)
	return fmt.Sprintf("table %s\ndelete table %s\n", t, t)
}

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
	case strings.HasPrefix(body, "rule "):
		e.Kind = KindRule
		body = strings.TrimPrefix(body, "rule ")
		if i := strings.LastIndex(body, " (verdict "); i >= 0 && strings.HasSuffix(body, ")") {
			e.Rule, e.Verdict = body[:i], body[i+len(" (verdict "):len(body)-1]
		} else {
			e.Rule = body
		}
	case strings.HasPrefix(body, "policy "):
		e.Kind, e.Verdict = KindPolicy, strings.TrimSpace(strings.TrimPrefix(body, "policy "))
	default:
		// "unknown rule handle N" (rule deleted since) and other forms.
		e.Kind, e.Rule = KindRule, body
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
	i := strings.Index(rule, key+` "`)
	if i < 0 {
		return "", false
	}
	rest := rule[i+len(key)+2:]
	j := strings.IndexByte(rest, '"')
	if j < 0 {
		return "", false
	}
	return rest[:j], true
}

// DNATTarget returns the address the rule DNATs to ("dnat ip to A:P",
// "dnat ip6 to [A]:P", with or without port).
func DNATTarget(rule string) (netip.AddrPort, bool) {
	for _, kw := range []string{"dnat ip to ", "dnat ip6 to ", "dnat to "} {
		i := strings.Index(rule, kw)
		if i < 0 {
			continue
		}
		tok := strings.Fields(rule[i+len(kw):])
		if len(tok) == 0 {
			return netip.AddrPort{}, false
		}
		if ap, err := netip.ParseAddrPort(tok[0]); err == nil {
			return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), true
		}
		if a, err := netip.ParseAddr(strings.Trim(tok[0], "[]")); err == nil {
			return netip.AddrPortFrom(a.Unmap(), 0), true
		}
	}
	return netip.AddrPort{}, false
}
