package observe

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
)

// Open vSwitch datapath: the probe is followed by `ovs-appctl ofproto/trace`
// on each node it crosses (which tables and flows it hits; the flows'
// cookies name the NetworkPolicy rule or Service), by packet-ins of the
// drop flows (a real drop of the real probe), and by the capture at the
// destination pod.

// OFStep is one flow an ofproto/trace went through.
type OFStep struct {
	Table  int
	Match  string
	Cookie uint64
	// Actions are the action lines printed under the flow.
	Actions []string
}

// OFTrace is the parsed output of ofproto/trace.
type OFTrace struct {
	Steps []OFStep
	// DatapathActions of the last pass ("drop", "ct(...),recirc(0x3)", "3").
	DatapathActions string
	// NoLiveBucket: the trace stopped at a select group (the bucket is
	// chosen by the datapath's hash, which the trace cannot simulate).
	NoLiveBucket bool
}

var ofStepRE = regexp.MustCompile(`^\s*(\d+)\. (.*?),? ?priority (\d+)(?:, cookie (0x[0-9a-f]+))?$`)

// ParseOFTrace reads `ovs-appctl ofproto/trace` output, every
// recirculation pass in order.
//
//  30. ct_state=+new+trk,tcp,nw_dst=198.19.0.11,tp_dst=80, priority 100, cookie 0xdf040000b76046bc
//     group:1
//     -> no live bucket
func ParseOFTrace(out string) OFTrace {
	var t OFTrace
	for _, l := range strings.Split(out, "\n") {
		if m := ofStepRE.FindStringSubmatch(l); m != nil {
			tbl, _ := strconv.Atoi(m[1])
			s := OFStep{Table: tbl, Match: m[2]}
			if m[4] != "" {
				s.Cookie, _ = strconv.ParseUint(strings.TrimPrefix(m[4], "0x"), 16, 64)
			}
			t.Steps = append(t.Steps, s)
			continue
		}
		trim := strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(trim, "Datapath actions: "):
			t.DatapathActions = strings.TrimPrefix(trim, "Datapath actions: ")
		case strings.Contains(trim, "no live bucket"):
			t.NoLiveBucket = true
		case trim != "" && len(t.Steps) > 0 && strings.HasPrefix(l, "    ") && !strings.HasPrefix(trim, "Resuming") && trim != "thaw":
			last := &t.Steps[len(t.Steps)-1]
			last.Actions = append(last.Actions, trim)
		}
	}
	return t
}

// OFFlow returns the ofproto/trace flow of a probe entering the bridge at
// inPort: addresses, protocol (1, 6, 17 or 58), ports or echo id, DSCP tag
// and TTL; TCP carries tcp_flags (0x002 is SYN: `+syn` is refused).
func OFFlow(inPort int, src, dst netip.Addr, proto uint8, sport, dport uint16, tcpFlags, tag, ttl uint8) string {
	v6 := dst.Unmap().Is6()
	s, d, suf := "nw_src", "nw_dst", ""
	if v6 {
		s, d, suf = "ipv6_src", "ipv6_dst", "6"
	}
	f := fmt.Sprintf("in_port=%d,", inPort)
	switch proto {
	case 6:
		f += "tcp" + suf
	case 17:
		f += "udp" + suf
	case 1:
		f += "icmp"
	case 58:
		f += "icmp6"
	}
	f += fmt.Sprintf(",dl_dst=ee:ee:ee:ee:ee:ee,%s=%s,%s=%s,nw_tos=%d,nw_ttl=%d", s, src.Unmap(), d, dst.Unmap(), tag<<2, ttl)
	switch proto {
	case 6:
		f += fmt.Sprintf(",tp_src=%d,tp_dst=%d,tcp_flags=%#03x", sport, dport, tcpFlags)
	case 17: // tp_src is TCP's name in exact flows; UDP needs its own
		f += fmt.Sprintf(",udp_src=%d,udp_dst=%d", sport, dport)
	case 1:
		f += ",icmp_type=8,icmp_code=0"
	case 58:
		f += ",icmpv6_type=128,icmpv6_code=0"
	}
	return f
}
