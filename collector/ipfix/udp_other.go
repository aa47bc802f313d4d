//go:build !linux

package ipfix

import "net"

// portableReader reads one datagram per call; drops are not reported.
type portableReader struct{ c *net.UDPConn }

func newUDPReader(c *net.UDPConn) udpReader { return portableReader{c} }

func (r portableReader) read(dgs []datagram) (int, uint32, bool, error) {
	n, from, err := r.c.ReadFromUDPAddrPort(dgs[0].buf)
	if err != nil {
		return 0, 0, false, err
	}
	dgs[0].n, dgs[0].from = n, from
	return 1, 0, false, nil
}

// tuneUDP sets the receive buffer and returns its size.
func tuneUDP(c *net.UDPConn, size int) (int, error) {
	return size, c.SetReadBuffer(size)
}
