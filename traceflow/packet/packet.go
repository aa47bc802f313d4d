// Package packet builds and recognises traceflow probe packets.
//
// A probe is one Ethernet frame (IPv4 or IPv6; TCP, UDP, ICMP or ICMPv6)
// built with gopacket. It carries a tag in the DSCP bits of the IPv4 TOS
// byte or of the IPv6 traffic class, so that nftables rules, OVS flows and
// captures can single it out; together with the source address and the
// source port (or ICMP echo id) the tag identifies one trace. Build and
// Match are pure functions and safe for concurrent use.
package packet

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
)

// IANA protocol numbers of the probe protocols (as in package flow).
const (
	ProtoICMP   uint8 = 1
	ProtoTCP    uint8 = 6
	ProtoUDP    uint8 = 17
	ProtoICMPv6 uint8 = 58
)

// Tag limits. DSCP is 6 bits; 0 is what all unmarked traffic carries, so
// tags are 1..MaxTag and at most MaxTag traces can run at once per source.
const (
	MinTag = 1
	MaxTag = 63
)

// TCP flag bits as in the TCP header (SYN is 0x02, as ofproto/trace's
// tcp_flags=0x002).
const (
	FIN uint8 = 0x01
	SYN uint8 = 0x02
	RST uint8 = 0x04
	PSH uint8 = 0x08
	ACK uint8 = 0x10
	URG uint8 = 0x20
)

// Spec describes one probe.
type Spec struct {
	SrcMAC, DstMAC net.HardwareAddr
	Src, Dst       netip.Addr
	Proto          uint8  // ProtoTCP, ProtoUDP, ProtoICMP or ProtoICMPv6
	SrcPort        uint16 // TCP/UDP; for ICMP and ICMPv6 the echo id
	DstPort        uint16 // TCP/UDP only
	TCPFlags       uint8  // TCP only; 0 means SYN
	TTL            uint8  // TTL or hop limit; 0 means 64
	Tag            uint8  // DSCP value, MinTag..MaxTag
}

// ErrSpec is wrapped by Build for a spec that cannot be built.
var ErrSpec = errors.New("invalid probe spec")

// Validate reports a spec that Build would reject.
func (s Spec) Validate() error {
	switch {
	case !s.Src.IsValid() || !s.Dst.IsValid():
		return fmt.Errorf("%w: source and destination addresses required", ErrSpec)
	case s.Src.Unmap().Is4() != s.Dst.Unmap().Is4():
		return fmt.Errorf("%w: source %s and destination %s are of different families", ErrSpec, s.Src, s.Dst)
	case s.Tag < MinTag || s.Tag > MaxTag:
		return fmt.Errorf("%w: tag %d not in %d..%d", ErrSpec, s.Tag, MinTag, MaxTag)
	case len(s.SrcMAC) != 6 || len(s.DstMAC) != 6:
		return fmt.Errorf("%w: source and destination MAC required", ErrSpec)
	}
	v4 := s.Src.Unmap().Is4()
	switch s.Proto {
	case ProtoTCP, ProtoUDP:
		if s.DstPort == 0 {
			return fmt.Errorf("%w: destination port required", ErrSpec)
		}
	case ProtoICMP:
		if !v4 {
			return fmt.Errorf("%w: ICMP over IPv6 (use ICMPv6)", ErrSpec)
		}
	case ProtoICMPv6:
		if v4 {
			return fmt.Errorf("%w: ICMPv6 over IPv4 (use ICMP)", ErrSpec)
		}
	default:
		return fmt.Errorf("%w: protocol %d (want TCP, UDP, ICMP or ICMPv6)", ErrSpec, s.Proto)
	}
	return nil
}

// payload marks probes for a human reading a capture.
var payload = []byte("dualflow-traceflow")

// Build returns the probe frame, checksums and lengths filled in.
func Build(s Spec) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	ttl := cmp.Or(s.TTL, 64)
	src, dst := s.Src.Unmap(), s.Dst.Unmap()
	eth := &layers.Ethernet{SrcMAC: s.SrcMAC, DstMAC: s.DstMAC}
	var ls []gopacket.SerializableLayer
	var netLayer gopacket.NetworkLayer
	if src.Is4() {
		eth.EthernetType = layers.EthernetTypeIPv4
		ip := &layers.IPv4{Version: 4, TOS: s.Tag << 2, TTL: ttl, Flags: layers.IPv4DontFragment,
			Protocol: layers.IPProtocol(s.Proto), SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		ls, netLayer = append(ls, eth, ip), ip
	} else {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip := &layers.IPv6{Version: 6, TrafficClass: s.Tag << 2, HopLimit: ttl,
			NextHeader: layers.IPProtocol(s.Proto), SrcIP: src.AsSlice(), DstIP: dst.AsSlice()}
		ls, netLayer = append(ls, eth, ip), ip
	}
	switch s.Proto {
	case ProtoTCP:
		flags := cmp.Or(s.TCPFlags, SYN)
		tcp := &layers.TCP{SrcPort: layers.TCPPort(s.SrcPort), DstPort: layers.TCPPort(s.DstPort),
			Seq: 0x64660000 | uint32(s.SrcPort), Window: 64240,
			FIN: flags&FIN != 0, SYN: flags&SYN != 0, RST: flags&RST != 0, PSH: flags&PSH != 0, ACK: flags&ACK != 0, URG: flags&URG != 0}
		if tcp.ACK {
			tcp.Ack = 1
		}
		if err := tcp.SetNetworkLayerForChecksum(netLayer); err != nil {
			return nil, fmt.Errorf("build probe: %w", err)
		}
		ls = append(ls, tcp) // no payload on a SYN
	case ProtoUDP:
		udp := &layers.UDP{SrcPort: layers.UDPPort(s.SrcPort), DstPort: layers.UDPPort(s.DstPort)}
		if err := udp.SetNetworkLayerForChecksum(netLayer); err != nil {
			return nil, fmt.Errorf("build probe: %w", err)
		}
		ls = append(ls, udp, gopacket.Payload(payload))
	case ProtoICMP:
		ls = append(ls, &layers.ICMPv4{TypeCode: layers.CreateICMPv4TypeCode(layers.ICMPv4TypeEchoRequest, 0), Id: s.SrcPort, Seq: 1},
			gopacket.Payload(payload))
	case ProtoICMPv6:
		icmp := &layers.ICMPv6{TypeCode: layers.CreateICMPv6TypeCode(layers.ICMPv6TypeEchoRequest, 0)}
		if err := icmp.SetNetworkLayerForChecksum(netLayer); err != nil {
			return nil, fmt.Errorf("build probe: %w", err)
		}
		ls = append(ls, icmp, &layers.ICMPv6Echo{Identifier: s.SrcPort, SeqNumber: 1}, gopacket.Payload(payload))
	}
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, ls...); err != nil {
		return nil, fmt.Errorf("build probe: %w", err)
	}
	return buf.Bytes(), nil
}

// Seen is what Match reads from a frame that is a probe.
type Seen struct {
	Src, Dst netip.Addr
	SrcPort  uint16 // or ICMP echo id
	DstPort  uint16
	TTL      uint8
}

// Match reports whether frame (starting at the Ethernet header) is a probe
// with tag, source src and source port or echo id srcPort, of protocol
// proto, and returns its addresses after any NAT on the way.
func Match(frame []byte, tag uint8, src netip.Addr, proto uint8, srcPort uint16) (Seen, bool) {
	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.DecodeOptions{Lazy: true, NoCopy: true})
	var s Seen
	switch ip := p.NetworkLayer().(type) {
	case *layers.IPv4:
		if ip.TOS>>2 != tag || uint8(ip.Protocol) != proto {
			return s, false
		}
		s.Src, _ = netip.AddrFromSlice(ip.SrcIP)
		s.Dst, _ = netip.AddrFromSlice(ip.DstIP)
		s.TTL = ip.TTL
	case *layers.IPv6:
		if ip.TrafficClass>>2 != tag || uint8(ip.NextHeader) != proto {
			return s, false
		}
		s.Src, _ = netip.AddrFromSlice(ip.SrcIP)
		s.Dst, _ = netip.AddrFromSlice(ip.DstIP)
		s.TTL = ip.HopLimit
	default:
		return s, false
	}
	s.Src, s.Dst = s.Src.Unmap(), s.Dst.Unmap()
	if s.Src != src.Unmap() {
		return s, false
	}
	switch proto {
	case ProtoTCP:
		t, ok := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
		if !ok {
			return s, false
		}
		s.SrcPort, s.DstPort = uint16(t.SrcPort), uint16(t.DstPort)
	case ProtoUDP:
		u, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP)
		if !ok {
			return s, false
		}
		s.SrcPort, s.DstPort = uint16(u.SrcPort), uint16(u.DstPort)
	case ProtoICMP:
		i, ok := p.Layer(layers.LayerTypeICMPv4).(*layers.ICMPv4)
		if !ok || i.TypeCode.Type() != layers.ICMPv4TypeEchoRequest {
			return s, false
		}
		s.SrcPort = i.Id
	case ProtoICMPv6:
		e, ok := p.Layer(layers.LayerTypeICMPv6Echo).(*layers.ICMPv6Echo)
		if !ok {
			return s, false
		}
		i, ok := p.Layer(layers.LayerTypeICMPv6).(*layers.ICMPv6)
		if !ok || i.TypeCode.Type() != layers.ICMPv6TypeEchoRequest {
			return s, false
		}
		s.SrcPort = e.Identifier
	}
	return s, s.SrcPort == srcPort
}
