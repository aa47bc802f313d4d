package agent

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/dualflow/dualflow/nsrun"
)

// ErrNoAnswer means the peer never answered within the timeout: for a lab
// flow this is what a policy drop looks like.
var ErrNoAnswer = errors.New("no answer")

// Reply is what a client got back.
type Reply struct {
	// Server is the name the server answered with ("ns/pod"); empty for ICMP.
	Server string
	// Seen is the client address as the server saw it (no SNAT in the lab,
	// so it equals Local); invalid for ICMP.
	Seen netip.AddrPort
	// Local is the client's own address and port (ICMP: the echo id).
	Local netip.AddrPort
	// RTT is the time from dial to answer.
	RTT time.Duration
}

// Dial sends one request from the namespace at netns ("" for the caller's)
// to "to" over proto (TCP, UDP or ICMP; ICMP ignores the port) and waits up
// to timeout for the answer. A drop gives an error wrapping ErrNoAnswer.
func Dial(ctx context.Context, netns, proto string, to netip.AddrPort, timeout time.Duration) (Reply, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch proto {
	case TCP:
		return dialTCP(ctx, netns, to)
	case UDP:
		return dialUDP(ctx, netns, to)
	case ICMP:
		return ping(ctx, netns, to.Addr())
	}
	return Reply{}, fmt.Errorf("dial: unknown protocol %q", proto)
}

// noAnswer classifies a client error: the timeout (or a read cut by the
// timeout's close) means no answer; a cancelled ctx is reported as such.
func noAnswer(ctx context.Context, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%w: %w", ErrNoAnswer, err)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %w", ctx.Err(), err)
	}
	return err
}

func parseReply(line string) (string, netip.AddrPort, error) {
	name, addr, ok := strings.Cut(strings.TrimSpace(line), " ")
	if !ok {
		return "", netip.AddrPort{}, fmt.Errorf("bad reply %q", line)
	}
	ap, err := netip.ParseAddrPort(addr)
	if err != nil {
		return "", netip.AddrPort{}, fmt.Errorf("bad reply address %q: %w", addr, err)
	}
	return name, netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

func dialTCP(ctx context.Context, netns string, to netip.AddrPort) (Reply, error) {
	start := time.Now()
	var c net.Conn
	err := inNetNS(netns, func() error {
		var err error
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", to.String())
		return err
	})
	if err != nil {
		return Reply{}, fmt.Errorf("tcp %s: %w", to, noAnswer(ctx, err))
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })() // cancel aborts the read
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	r := Reply{Local: netip.AddrPortFrom(local.Addr().Unmap(), local.Port())}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("hello\n")); err != nil {
		return r, fmt.Errorf("tcp %s: write: %w", to, err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return r, fmt.Errorf("tcp %s: read: %w", to, noAnswer(ctx, err))
	}
	r.Server, r.Seen, err = parseReply(line)
	r.RTT = time.Since(start)
	return r, err
}

func dialUDP(ctx context.Context, netns string, to netip.AddrPort) (Reply, error) {
	start := time.Now()
	var c *net.UDPConn
	err := inNetNS(netns, func() error {
		var err error
		c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(to))
		return err
	})
	if err != nil {
		return Reply{}, fmt.Errorf("udp %s: %w", to, err)
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })()
	local := c.LocalAddr().(*net.UDPAddr).AddrPort()
	r := Reply{Local: netip.AddrPortFrom(local.Addr().Unmap(), local.Port())}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte("hello\n")); err != nil {
		return r, fmt.Errorf("udp %s: write: %w", to, err)
	}
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return r, fmt.Errorf("udp %s: read: %w", to, noAnswer(ctx, err))
	}
	r.Server, r.Seen, err = parseReply(string(buf[:n]))
	r.RTT = time.Since(start)
	return r, err
}

// ping sends one ICMP (or ICMPv6) echo request from a raw socket and waits
// for the matching reply. Reply.Local carries the echo id as its port, which
// is what conntrack shows as the ICMP "id".
func ping(ctx context.Context, netns string, to netip.Addr) (Reply, error) {
	start := time.Now()
	network, laddr, proto := "ip4:icmp", "0.0.0.0", 1
	var reqType, repType icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if to.Is6() {
		network, laddr, proto = "ip6:ipv6-icmp", "::", 58
		reqType, repType = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	var c *icmp.PacketConn
	err := inNetNS(netns, func() error {
		var err error
		c, err = icmp.ListenPacket(network, laddr)
		return err
	})
	if err != nil {
		return Reply{}, fmt.Errorf("icmp %s: %w", to, err)
	}
	defer c.Close()
	defer context.AfterFunc(ctx, func() { c.Close() })()
	id := 1 + rand.IntN(0xfffe)
	msg := icmp.Message{Type: reqType, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("dualflow-lab")}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return Reply{}, fmt.Errorf("icmp %s: marshal: %w", to, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	if _, err := c.WriteTo(b, &net.IPAddr{IP: net.IP(to.AsSlice())}); err != nil {
		return Reply{}, fmt.Errorf("icmp %s: send: %w", to, err)
	}
	r := Reply{Local: netip.AddrPortFrom(netip.Addr{}, uint16(id))}
	buf := make([]byte, 1500)
	for {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			return r, fmt.Errorf("icmp %s: %w", to, noAnswer(ctx, err))
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || m.Type != repType {
			continue
		}
		echo, ok := m.Body.(*icmp.Echo)
		fa, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP)
		if !ok || echo.ID != id || fa.Unmap() != to {
			continue
		}
		r.RTT = time.Since(start)
		return r, nil
	}
}

// inNetNS runs fn in the namespace at path, or directly when path is empty.
func inNetNS(path string, fn func() error) error {
	if path == "" {
		return fn()
	}
	return nsrun.Do(path, fn)
}
