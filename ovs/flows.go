package ovs

import (
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// maxDurationSeconds is the longest flow duration time.Duration holds
// (about 292 years).
const maxDurationSeconds = float64(math.MaxInt64) / float64(time.Second)

// Flow is one OpenFlow flow of `ovs-ofctl dump-flows`, with its
// statistics. Match and Actions are kept as text.
type Flow struct {
	Cookie   uint64
	Table    uint8
	Priority uint16 // 32768 when the dump omits it (the OpenFlow default)
	Packets  uint64
	Bytes    uint64 // Ethernet frame bytes
	Duration time.Duration
	// Match is the match text after the priority ("tcp,nw_src=…"); empty
	// for a match-all flow.
	Match   string
	Actions string
}

// defaultPriority is OpenFlow's default flow priority, which dump-flows
// leaves out.
const defaultPriority = 32768

// statKeys are the ", "-separated fields dump-flows prints before the
// match; other fields of that part are flags (send_flow_rem, …).
var statKeys = map[string]bool{
	"cookie": true, "duration": true, "table": true, "n_packets": true, "n_bytes": true,
	"idle_timeout": true, "hard_timeout": true, "idle_age": true, "hard_age": true, "importance": true,
	"reset_counts": true, "no_packet_counts": true, "no_byte_counts": true, "send_flow_rem": true,
	"check_overlap": true, "out_port": true, "out_group": true,
}

// IsFlowLine reports whether a dump-flows output line holds a flow (and is
// not a reply header such as "NXST_FLOW reply (xid=0x4):").
func IsFlowLine(line string) bool {
	return strings.HasPrefix(strings.TrimLeft(line, " "), "cookie=")
}

// ParseFlowLine parses one flow line of dump-flows into f.
func ParseFlowLine(line string, f *Flow) error {
	*f = Flow{Priority: defaultPriority}
	line = strings.TrimSpace(line)
	head, actions, ok := strings.Cut(line, " actions=")
	if !ok {
		return syntaxErr("flow without actions: %q", clip(line))
	}
	f.Actions = actions
	haveCookie := false
	for head != "" {
		part, rest, more := strings.Cut(head, ", ")
		key, val, _ := strings.Cut(part, "=")
		if !statKeys[key] || (more && strings.Contains(part, ",")) {
			// The match: from here to the end (its fields are separated
			// by "," without a space).
			return f.parseMatch(head, haveCookie)
		}
		var err error
		switch key {
		case "cookie":
			f.Cookie, err = parseUint(val, 64)
			haveCookie = true
		case "table":
			var n uint64
			n, err = parseUint(val, 8)
			f.Table = uint8(n)
		case "n_packets":
			f.Packets, err = parseUint(val, 64)
		case "n_bytes":
			f.Bytes, err = parseUint(val, 64)
		case "duration":
			s, ok := strings.CutSuffix(val, "s")
			var d float64
			// !(0 <= d < max) also refuses NaN; from maxDurationSeconds on
			// time.Duration would overflow (to a negative duration).
			if d, err = strconv.ParseFloat(s, 64); !ok || err != nil || !(d >= 0 && d < maxDurationSeconds) {
				err = syntaxErr("duration %q", clip(val))
			}
			f.Duration = time.Duration(d * float64(time.Second))
		}
		if err != nil {
			return err
		}
		head = rest
		if !more {
			break
		}
	}
	return f.parseMatch("", haveCookie)
}

// parseMatch takes "priority=N,match" (either part may be absent).
func (f *Flow) parseMatch(m string, haveCookie bool) error {
	if !haveCookie {
		return syntaxErr("flow without cookie")
	}
	if p, ok := strings.CutPrefix(m, "priority="); ok {
		num, rest, _ := strings.Cut(p, ",")
		n, err := parseUint(num, 16)
		if err != nil {
			return err
		}
		f.Priority, m = uint16(n), rest
	}
	f.Match = m
	return nil
}

// ParseFlows parses a whole dump-flows output and calls fn for each flow (f
// is reused between calls). Reply headers and blank lines are skipped. It
// returns the number of malformed flow lines and the first of their errors.
func ParseFlows(out string, fn func(f *Flow)) (bad int, first error) {
	var f Flow
	lines(out, func(line string) bool {
		if !IsFlowLine(line) {
			t := strings.TrimSpace(line)
			if t != "" && !strings.Contains(t, " reply ") && !strings.HasSuffix(t, "reply:") {
				bad++
				if first == nil {
					first = syntaxErr("unexpected line %q", clip(t))
				}
			}
			return true
		}
		if err := ParseFlowLine(line, &f); err != nil {
			bad++
			if first == nil {
				first = err
			}
			return true
		}
		fn(&f)
		return true
	})
	return bad, first
}

// matchProtos are the protocol keywords of a match (OVS's canonical
// abbreviations) with their family and IP protocol.
var matchProtos = map[string]struct {
	v6    bool
	proto uint8
}{
	"tcp": {false, flow.ProtoTCP}, "udp": {false, flow.ProtoUDP}, "sctp": {false, flow.ProtoSCTP}, "icmp": {false, flow.ProtoICMP},
	"tcp6": {true, flow.ProtoTCP}, "udp6": {true, flow.ProtoUDP}, "sctp6": {true, flow.ProtoSCTP}, "icmp6": {true, flow.ProtoICMPv6},
}

// MatchTuple extracts the exact 5-tuple of a per-connection counter flow
// match such as "tcp,nw_src=198.18.1.10,nw_dst=198.18.2.11,tp_src=41234,tp_dst=8080"
// or "icmp6,ipv6_src=…,ipv6_dst=…" (ICMP flows have no ports). ok is
// false when the match is not such an exact tuple.
func MatchTuple(m string) (t flow.Tuple, ok bool) {
	kw, rest, _ := strings.Cut(m, ",")
	p, known := matchProtos[kw]
	if !known {
		return t, false
	}
	t.Proto = p.proto
	var src, dst bool
	for rest != "" {
		var f string
		f, rest, _ = strings.Cut(rest, ",")
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "nw_src", "nw_dst", "ipv6_src", "ipv6_dst":
			if strings.HasPrefix(k, "ipv6_") != p.v6 {
				return t, false
			}
			src, dst = src || strings.HasSuffix(k, "_src"), dst || strings.HasSuffix(k, "_dst")
		}
		if _, err := tupleField(&t, k, v); err != nil {
			return flow.Tuple{}, false
		}
	}
	return t, src && dst
}
