package ovs

import (
	"strconv"
	"strings"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// Entry is one connection of `ovs-appctl dpctl/dump-conntrack [-m] [-s]`.
// The userspace datapath prints no counters, no timestamps and id=0;
// the kernel datapath (with -s and nf_conntrack_acct) adds packets/bytes
// per direction and start times, which are parsed when present.
type Entry struct {
	// Orig is the tuple as the client sent it (a Service VIP before DNAT),
	// Reply the tuple of the answer (its source is the endpoint).
	Orig, Reply flow.Tuple
	// ICMP echo id, type and code of the original direction (ICMP, ICMPv6).
	ICMPID             uint16
	ICMPType, ICMPCode uint8
	ID                 uint32 // connection id; 0 on the userspace datapath
	Zone               uint16
	Status             uint32
	Mark               uint32
	// LabelHi and LabelLo are the 128-bit ct_label.
	LabelHi, LabelLo uint64
	// TCPState is the conntrack-style TCP state (ESTABLISHED, TIME_WAIT, …),
	// as dump-conntrack prints it without -m; empty for other protocols.
	TCPState string
	// Counters, present only on the kernel datapath with -s.
	OrigPackets, OrigBytes, ReplyPackets, ReplyBytes uint64
	HasCounters                                      bool
	Start                                            time.Time
}

// IngressRule and EgressRule return the rule IDs a dualflow datapath stored
// in ct_label when it committed the connection (0: none).
func (e *Entry) IngressRule() uint32 { return uint32(e.LabelLo) }

// EgressRule: see IngressRule.
func (e *Entry) EgressRule() uint32 { return uint32(e.LabelLo >> 32) }

// DstNAT reports whether the connection was DNAT-ed: the answer comes from
// another address or port than the client sent to.
func (e *Entry) DstNAT() bool {
	return e.Reply.Src != e.Orig.Dst || e.Reply.SrcPort != e.Orig.DstPort
}

// ParseConntrackLine parses one line of dpctl/dump-conntrack output into e.
// Unknown keys are ignored (newer OVS versions add some); a missing or
// malformed tuple, number or address is an error wrapping ErrSyntax.
func ParseConntrackLine(line string, e *Entry) error {
	*e = Entry{}
	line = strings.TrimSpace(line)
	proto, num, rest, err := nextField(line)
	if err != nil {
		return err
	}
	p, ok := protoNumbers[proto]
	if !ok {
		if proto != "proto" {
			return syntaxErr("protocol %q", clip(proto))
		}
		n, err := strconv.ParseUint(num, 10, 8)
		if err != nil {
			return syntaxErr("protocol %q", clip(proto))
		}
		p = uint8(n)
	}
	var haveOrig, haveReply bool
	var stOrig, stReply string
	for rest != "" {
		var key, val string
		if key, val, rest, err = nextField(rest); err != nil {
			return err
		}
		switch key {
		case "orig", "reply":
			t := &e.Orig
			if key == "reply" {
				t = &e.Reply
			}
			pk, by, err := e.parseTuple(val, p, t, key == "orig")
			if err != nil {
				return err
			}
			if key == "orig" {
				haveOrig, e.OrigPackets, e.OrigBytes = true, pk, by
			} else {
				haveReply, e.ReplyPackets, e.ReplyBytes = true, pk, by
			}
		case "id":
			v, err := parseUint(val, 32)
			if err != nil {
				return err
			}
			e.ID = uint32(v)
		case "zone":
			v, err := parseUint(val, 16)
			if err != nil {
				return err
			}
			e.Zone = uint16(v)
		case "status":
			v, err := parseUint(val, 32)
			if err != nil {
				return err
			}
			e.Status = uint32(v)
		case "mark":
			v, err := parseUint(val, 32)
			if err != nil {
				return err
			}
			e.Mark = uint32(v)
		case "labels":
			if e.LabelHi, e.LabelLo, err = parseHex128(val); err != nil {
				return err
			}
		case "start":
			ts, err := time.Parse("2006-01-02T15:04:05.999999999", val)
			if err != nil {
				return syntaxErr("start %q", clip(val))
			}
			e.Start = ts
		case "protoinfo":
			in, err := inParens(val)
			if err != nil {
				return err
			}
			for in != "" {
				var k, v string
				if k, v, in, err = nextField(in); err != nil {
					return err
				}
				switch k {
				case "state":
					e.TCPState = v
				case "state_orig":
					stOrig = v
				case "state_reply":
					stReply = v
				}
			}
		}
	}
	if !haveOrig || !haveReply {
		return syntaxErr("entry without orig and reply tuples: %q", clip(line))
	}
	if flow.Version(e.Orig.Src) != flow.Version(e.Orig.Dst) || flow.Version(e.Reply.Src) != flow.Version(e.Orig.Src) ||
		flow.Version(e.Reply.Dst) != flow.Version(e.Orig.Src) {
		return syntaxErr("mixed address families in %q", clip(line))
	}
	if e.TCPState == "" && (stOrig != "" || stReply != "") {
		e.TCPState = coalesceTCPState(stOrig, stReply)
	}
	return nil
}

// parseTuple parses the inside of orig=(...) or reply=(...).
func (e *Entry) parseTuple(val string, proto uint8, t *flow.Tuple, orig bool) (packets, bytes uint64, err error) {
	in, err := inParens(val)
	if err != nil {
		return 0, 0, err
	}
	t.Proto = proto
	var haveSrc, haveDst bool
	for in != "" {
		var k, v string
		if k, v, in, err = nextField(in); err != nil {
			return 0, 0, err
		}
		switch k {
		case "src":
			t.Src, err = parseAddr(v)
			haveSrc = true
		case "dst":
			t.Dst, err = parseAddr(v)
			haveDst = true
		case "sport", "dport":
			var n uint64
			if n, err = parseUint(v, 16); err == nil {
				if k == "sport" {
					t.SrcPort = uint16(n)
				} else {
					t.DstPort = uint16(n)
				}
			}
		case "id", "type", "code":
			var n uint64
			bits := 8
			if k == "id" {
				bits = 16
			}
			if n, err = parseUint(v, bits); err == nil && orig {
				switch k {
				case "id":
					e.ICMPID = uint16(n)
				case "type":
					e.ICMPType = uint8(n)
				case "code":
					e.ICMPCode = uint8(n)
				}
			}
		case "packets":
			packets, err = parseUint(v, 64)
			e.HasCounters = true
		case "bytes":
			bytes, err = parseUint(v, 64)
			e.HasCounters = true
		}
		if err != nil {
			return 0, 0, err
		}
	}
	if !haveSrc || !haveDst {
		return 0, 0, syntaxErr("tuple without src and dst: %q", clip(val))
	}
	return packets, bytes, nil
}

// tcpStates are the userspace conntrack's per-direction TCP states, in
// the order of OVS's enum ct_dpif_tcp_state (pf's states).
var tcpStates = []string{"CLOSED", "LISTEN", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "CLOSE_WAIT",
	"FIN_WAIT_1", "CLOSING", "LAST_ACK", "FIN_WAIT_2", "TIME_WAIT"}

// coalesceTCPState turns the two per-direction states of -m output into
// the one state dump-conntrack prints without -m (OVS's
// ct_dpif_format_protoinfo_tcp): the further of the two, with FIN_WAIT_2
// shown as TIME_WAIT and SYN_RECV as ESTABLISHED like the kernel.
func coalesceTCPState(orig, reply string) string {
	idx := func(s string) int {
		for i, x := range tcpStates {
			if x == s {
				return i
			}
		}
		return -1
	}
	i := max(idx(orig), idx(reply))
	if i < 0 {
		return orig
	}
	switch tcpStates[i] {
	case "FIN_WAIT_2":
		return "TIME_WAIT"
	case "SYN_RECV":
		return "ESTABLISHED"
	}
	return tcpStates[i]
}

// ParseConntrack parses a whole dump-conntrack output and calls fn for
// each entry (e is reused between calls). Blank lines are skipped. It
// returns the number of malformed lines and the first of their errors;
// parsing goes on after a bad line.
func ParseConntrack(out string, fn func(e *Entry)) (bad int, first error) {
	var e Entry
	lines(out, func(line string) bool {
		if strings.TrimSpace(line) == "" {
			return true
		}
		if err := ParseConntrackLine(line, &e); err != nil {
			bad++
			if first == nil {
				first = err
			}
			return true
		}
		fn(&e)
		return true
	})
	return bad, first
}

// CounterKeys returns the counter-flow tuples of entry e's two directions:
// the original direction as it leaves conntrack (after DNAT: the reply
// tuple reversed) and the reply direction (after un-DNAT: the original
// tuple reversed). ICMP counter flows carry no ports.
func CounterKeys(e *Entry) (orig, reply flow.Tuple) {
	orig, reply = e.Reply.Reverse(), e.Orig.Reverse()
	if e.Orig.Proto == flow.ProtoICMP || e.Orig.Proto == flow.ProtoICMPv6 {
		orig.SrcPort, orig.DstPort, reply.SrcPort, reply.DstPort = 0, 0, 0, 0
	}
	return orig, reply
}
