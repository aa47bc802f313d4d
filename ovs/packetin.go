package ovs

import (
	"strings"

	"github.com/dualflow/dualflow/flow"
)

// PacketIn is one packet-in of `ovs-ofctl monitor`: a packet a flow sent
// to the controller, with the flow's table and cookie. Drop rules of a
// dualflow datapath send what they drop, so each PacketIn of a KindDrop
// cookie is a denied packet.
type PacketIn struct {
	Table    uint8
	Cookie   uint64
	TotalLen int // frame length
	InPort   uint32
	// Tuple is the packet's own 5-tuple, after any DNAT done before the
	// drop; ports are zero for ICMP.
	Tuple              flow.Tuple
	ICMPType, ICMPCode uint8
	// CTOrig is the original-direction tuple conntrack had for the packet
	// (a Service VIP before DNAT), when the packet was tracked; CTZone its
	// zone.
	CTOrig flow.Tuple
	CTZone uint16
}

// MonitorParser turns `ovs-ofctl monitor` output, line by line, into
// PacketIns. A packet-in spans a header line ("NXT_PACKET_IN2 (xid=…):
// table_id=… cookie=… total_len=… <metadata> (via action) …"), optional
// indented lines (userdata=…), and the packet's flow line ("tcp,vlan_tci=…
// tcp_csum:…"). Other messages are skipped. The zero value is ready.
type MonitorParser struct {
	cur     PacketIn
	pending bool // header seen, waiting for the packet line
}

// Feed parses one line. It returns a PacketIn (done=true) when the line
// completes one, and an error (wrapping ErrSyntax) for a malformed
// packet-in, after which parsing goes on with the next message.
func (p *MonitorParser) Feed(line string) (pi PacketIn, done bool, err error) {
	line = strings.TrimRight(line, "\r")
	switch {
	case line == "":
		return pi, false, nil
	case strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t"):
		return pi, false, nil // userdata=, continuation, …
	case isMessageHeader(line):
		wasPending := p.pending
		p.pending = false
		if strings.Contains(line, "PACKET_IN") {
			if err = p.header(line); err == nil {
				p.pending = true
			}
		}
		if wasPending && err == nil {
			err = syntaxErr("packet-in without a packet line")
		}
		return pi, false, err
	case !p.pending:
		return pi, false, nil // body of another message
	}
	p.pending = false
	if err := p.packet(line); err != nil {
		return pi, false, err
	}
	return p.cur, true, nil
}

// isMessageHeader reports whether line starts an OpenFlow message
// ("NXT_PACKET_IN2 (xid=0x0): …", "OFPT_PORT_STATUS (xid=0x0): …").
func isMessageHeader(line string) bool {
	name, _, ok := strings.Cut(line, " ")
	if !ok || !strings.Contains(line, "(xid=") {
		return false
	}
	return strings.HasPrefix(name, "NXT_") || strings.HasPrefix(name, "OFPT_") || strings.HasPrefix(name, "ONFT_")
}

func (p *MonitorParser) header(line string) error {
	p.cur = PacketIn{}
	_, body, ok := strings.Cut(line, "):")
	if !ok {
		return syntaxErr("packet-in header %q", clip(line))
	}
	var haveCookie, haveLen bool
	for _, tok := range strings.Fields(body) {
		k, v, _ := strings.Cut(tok, "=")
		var err error
		switch k {
		case "table_id":
			var n uint64
			n, err = parseUint(v, 8)
			p.cur.Table = uint8(n)
		case "cookie":
			p.cur.Cookie, err = parseUint(v, 64)
			haveCookie = true
		case "total_len":
			var n uint64
			n, err = parseUint(v, 16)
			p.cur.TotalLen = int(n)
			haveLen = true
		default:
			if strings.Contains(tok, ",") || strings.HasPrefix(tok, "in_port=") || strings.HasPrefix(tok, "ct_") {
				err = p.metadata(tok)
			}
		}
		if err != nil {
			return err
		}
	}
	if !haveCookie || !haveLen {
		return syntaxErr("packet-in header without cookie or total_len: %q", clip(line))
	}
	return nil
}

// metadata parses the comma-separated metadata of a packet-in header.
func (p *MonitorParser) metadata(s string) error {
	var ct flow.Tuple
	for s != "" {
		var f string
		f, s, _ = strings.Cut(s, ",")
		k, v, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "in_port":
			var n uint64
			if n, err = parseUint(v, 32); err != nil {
				n, err = 0, nil // a port name (monitor --names)
			}
			p.cur.InPort = uint32(n)
		case "ct_zone":
			var n uint64
			n, err = parseUint(v, 16)
			p.cur.CTZone = uint16(n)
		case "ct_nw_proto":
			var n uint64
			n, err = parseUint(v, 8)
			ct.Proto = uint8(n)
		default:
			if f, ok := strings.CutPrefix(k, "ct_"); ok {
				_, err = tupleField(&ct, f, v)
			}
		}
		if err != nil {
			return err
		}
	}
	if ct.Src.IsValid() && ct.Dst.IsValid() {
		p.cur.CTOrig = ct
	}
	return nil
}

// packetProtos are the protocol keywords of a packet flow line.
var packetProtos = map[string]uint8{
	"tcp": flow.ProtoTCP, "tcp6": flow.ProtoTCP, "udp": flow.ProtoUDP, "udp6": flow.ProtoUDP,
	"sctp": flow.ProtoSCTP, "sctp6": flow.ProtoSCTP, "icmp": flow.ProtoICMP, "icmp6": flow.ProtoICMPv6,
	"ip": 0, "ipv6": 0,
}

// packet parses the flow line of the packet ("tcp,…,tp_dst=8080,tcp_flags=syn tcp_csum:…").
func (p *MonitorParser) packet(line string) error {
	fl, _, _ := strings.Cut(strings.TrimSpace(line), " ")
	kw, rest, _ := strings.Cut(fl, ",")
	proto, ok := packetProtos[kw]
	if !ok {
		return syntaxErr("packet of unsupported type %q", clip(kw))
	}
	t := &p.cur.Tuple
	t.Proto = proto
	for rest != "" {
		var f string
		f, rest, _ = strings.Cut(rest, ",")
		k, v, _ := strings.Cut(f, "=")
		var err error
		switch k {
		case "nw_proto":
			var n uint64
			n, err = parseUint(v, 8)
			if t.Proto == 0 {
				t.Proto = uint8(n)
			}
		case "icmp_type", "icmpv6_type":
			var n uint64
			n, err = parseUint(v, 8)
			p.cur.ICMPType = uint8(n)
		case "icmp_code", "icmpv6_code":
			var n uint64
			n, err = parseUint(v, 8)
			p.cur.ICMPCode = uint8(n)
		default:
			_, err = tupleField(t, k, v)
		}
		if err != nil {
			return err
		}
	}
	if !t.Src.IsValid() || !t.Dst.IsValid() || flow.Version(t.Src) != flow.Version(t.Dst) {
		return syntaxErr("packet without addresses of one family: %q", clip(line))
	}
	if t.Proto == flow.ProtoICMP || t.Proto == flow.ProtoICMPv6 {
		// OVS prints ICMP type and code as tp_src and tp_dst as well.
		t.SrcPort, t.DstPort = 0, 0
	}
	return nil
}
