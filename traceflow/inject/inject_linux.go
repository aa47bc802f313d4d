//go:build linux

package inject

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dualflow/dualflow/nsrun"
)

// htons converts a 16-bit value to network byte order for AF_PACKET.
func htons(v uint16) uint16 { return v<<8 | v>>8 }

// Send sends frame (starting with its Ethernet header) out of iface inside
// the network namespace at nsPath.
func Send(nsPath, iface string, frame []byte) error {
	return nsrun.Do(nsPath, func() error {
		ifi, err := net.InterfaceByName(iface)
		if err != nil {
			return fmt.Errorf("send probe: %w", err)
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0) // protocol 0: send only
		if err != nil {
			return fmt.Errorf("send probe: socket: %w", err)
		}
		defer unix.Close(fd)
		sa := &unix.SockaddrLinklayer{Ifindex: ifi.Index, Halen: 6}
		copy(sa.Addr[:], frame[:6])
		if err := unix.Sendto(fd, frame, 0, sa); err != nil {
			return fmt.Errorf("send probe on %s: %w", iface, err)
		}
		return nil
	})
}

// InterfaceMAC returns the MAC address of iface inside the namespace at nsPath.
func InterfaceMAC(nsPath, iface string) (net.HardwareAddr, error) {
	var mac net.HardwareAddr
	err := nsrun.Do(nsPath, func() error {
		ifi, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		mac = ifi.HardwareAddr
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("mac of %s: %w", iface, err)
	}
	return mac, nil
}

// Capture reads the frames that arrive on one interface (incoming only:
// frames the namespace sends are skipped).
type Capture struct {
	fd int
}

// pollInterval bounds how long one read blocks, so Next notices its
// context: pcapgo-style reads that cannot be interrupted are avoided.
const pollInterval = 20 * time.Millisecond

// snapLen is enough for the probe headers (Ethernet + IPv6 + TCP options).
const snapLen = 256

// Listen opens a capture on iface inside the namespace at nsPath. Close it
// when done.
func Listen(nsPath, iface string) (*Capture, error) {
	c := &Capture{fd: -1}
	err := nsrun.Do(nsPath, func() error {
		ifi, err := net.InterfaceByName(iface)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_ALL)))
		if err != nil {
			return fmt.Errorf("socket: %w", err)
		}
		tv := unix.NsecToTimeval(pollInterval.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			unix.Close(fd)
			return fmt.Errorf("rcvtimeo: %w", err)
		}
		if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
			unix.Close(fd)
			return fmt.Errorf("bind: %w", err)
		}
		c.fd = fd
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("capture on %s: %w", iface, err)
	}
	return c, nil
}

// Next returns the next incoming frame, or ctx's error when ctx ends
// first. It is not safe for concurrent use.
func (c *Capture) Next(ctx context.Context) ([]byte, error) {
	buf := make([]byte, snapLen)
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		n, from, err := unix.Recvfrom(c.fd, buf, unix.MSG_TRUNC)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("capture: %w", err)
		}
		if ll, ok := from.(*unix.SockaddrLinklayer); ok && ll.Pkttype == unix.PACKET_OUTGOING {
			continue
		}
		return buf[:min(n, len(buf))], nil
	}
}

// Close releases the socket.
func (c *Capture) Close() error { return unix.Close(c.fd) }
