//go:build linux

package ipfix

import (
	"encoding/binary"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsghdr is struct mmsghdr of recvmmsg(2).
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
	_   [4]byte
}

// oobLen holds one SO_RXQ_OVFL control message (a uint32) with room to
// spare.
const oobLen = 64

// mmsgReader reads up to len(dgs) datagrams per recvmmsg(2) call without
// allocating, and the socket's drop counter from SO_RXQ_OVFL.
type mmsgReader struct {
	rc    syscall.RawConn
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6
	oob   []byte
	// result of the last read, set by readFn
	n     int
	errno syscall.Errno
	// readFn is built once so the read loop does not allocate a closure.
	readFn func(fd uintptr) bool
	bound  []datagram
}

func newUDPReader(c *net.UDPConn) udpReader {
	rc, err := c.SyscallConn()
	if err != nil {
		return errReader{err}
	}
	r := &mmsgReader{rc: rc}
	r.readFn = func(fd uintptr) bool {
		n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, fd, uintptr(unsafe.Pointer(&r.hdrs[0])), uintptr(len(r.hdrs)), unix.MSG_DONTWAIT, 0, 0)
		if e == unix.EAGAIN || e == unix.EWOULDBLOCK {
			return false // wait for readiness
		}
		r.n, r.errno = int(n), e
		return true
	}
	return r
}

type errReader struct{ err error }

func (r errReader) read([]datagram) (int, uint32, bool, error) { return 0, 0, false, r.err }

func (r *mmsgReader) bind(dgs []datagram) {
	n := len(dgs)
	r.hdrs = make([]mmsghdr, n)
	r.iovs = make([]unix.Iovec, n)
	r.names = make([]unix.RawSockaddrInet6, n)
	r.oob = make([]byte, n*oobLen)
	for i := range dgs {
		r.iovs[i].Base = &dgs[i].buf[0]
		r.iovs[i].SetLen(len(dgs[i].buf))
	}
	r.bound = dgs
}

func (r *mmsgReader) read(dgs []datagram) (int, uint32, bool, error) {
	if len(r.bound) != len(dgs) || &r.bound[0] != &dgs[0] {
		r.bind(dgs)
	}
	for i := range r.hdrs {
		h := &r.hdrs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&r.names[i]))
		h.Namelen = unix.SizeofSockaddrInet6
		h.Iov = &r.iovs[i]
		h.SetIovlen(1)
		h.Control = &r.oob[i*oobLen]
		h.SetControllen(oobLen)
		h.Flags = 0
		r.hdrs[i].len = 0
	}
	if err := r.rc.Read(r.readFn); err != nil {
		return 0, 0, false, err
	}
	if r.errno != 0 {
		return 0, 0, false, r.errno
	}
	var drops uint32
	hasDrops := false
	for i := range r.n {
		h := &r.hdrs[i]
		dgs[i].n = int(h.len)
		dgs[i].from = sockaddr(&r.names[i])
		if d, ok := rxqOverflow(r.oob[i*oobLen : i*oobLen+int(h.hdr.Controllen)]); ok {
			drops, hasDrops = d, true
		}
	}
	return r.n, drops, hasDrops, nil
}

// sockaddr decodes a sockaddr_in or sockaddr_in6.
func sockaddr(sa *unix.RawSockaddrInet6) netip.AddrPort {
	port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
	switch sa.Family {
	case unix.AF_INET:
		sa4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		return netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), port)
	case unix.AF_INET6:
		return netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), port)
	}
	return netip.AddrPort{}
}

// rxqOverflow finds the SO_RXQ_OVFL control message (the socket's
// cumulative drop counter) in oob.
func rxqOverflow(oob []byte) (uint32, bool) {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		l := int(h.Len)
		if l < unix.SizeofCmsghdr || l > len(oob) {
			return 0, false
		}
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL && l >= unix.CmsgLen(4) {
			return *(*uint32)(unsafe.Pointer(&oob[unix.CmsgLen(0)])), true
		}
		oob = oob[min(unix.CmsgSpace(l-unix.CmsgLen(0)), len(oob)):]
	}
	return 0, false
}

// tuneUDP sets the receive buffer (SO_RCVBUFFORCE when permitted, which
// ignores net.core.rmem_max) and enables SO_RXQ_OVFL. It returns the
// buffer size the kernel reports (which the kernel doubles for overhead).
func tuneUDP(c *net.UDPConn, size int) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	var got int
	var serr error
	err = rc.Control(func(fd uintptr) {
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, size); e != nil {
			if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, size); e != nil {
				serr = e
			}
		}
		if e := unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1); e != nil && serr == nil {
			serr = e
		}
		got, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF)
		got /= 2 // the kernel reports twice the requested size
	})
	if err != nil {
		return 0, err
	}
	return got, serr
}
