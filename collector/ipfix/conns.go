package ipfix

import (
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// evictIdle is how long a session must have sent nothing before a new
// connection may take its place when every session is taken: long enough
// that a session never loses its place between two messages of a busy
// exporter, short enough that sockets opened and left idle cannot lock
// well-behaved exporters out for long. A variable for the tests.
var evictIdle = 10 * time.Second

// connInfo is what the set knows of one TCP/TLS session.
type connInfo struct {
	conn    net.Conn
	src     netip.Addr
	active  atomic.Int64 // unix ns of the last complete message (or of the accept)
	evicted atomic.Bool
}

// touch records a complete message.
func (ci *connInfo) touch(now time.Time) { ci.active.Store(now.UnixNano()) }

// connSet holds the TCP/TLS sessions of a listener, bounded in all and per
// source address. Safe for concurrent use.
type connSet struct {
	max, perSource int

	mu     sync.Mutex
	m      map[net.Conn]*connInfo
	bySrc  map[netip.Addr]int
	closed bool
}

func newConnSet(max, perSource int) *connSet {
	return &connSet{max: max, perSource: perSource, m: map[net.Conn]*connInfo{}, bySrc: map[netip.Addr]int{}}
}

// Refusal reasons of add.
const (
	refusedNone = iota
	refusedFull
	refusedSource
)

// add admits c, or returns why not. When every session is taken, the
// session idle the longest is evicted to make room if it has been idle for
// evictIdle: it leaves the set and is closed (its goroutine sees the close
// and counts the eviction).
//
// A session gives its place back before its connection closes (here, or
// remove before Close when it ends), so an exporter that sees its session
// closed can connect again at once, and a new connection never evicts a
// live session for the place of one that has already ended.
func (s *connSet) add(c net.Conn, now time.Time) (*connInfo, int) {
	src := netip.Addr{}
	if ap, err := netip.ParseAddrPort(c.RemoteAddr().String()); err == nil {
		src = ap.Addr().Unmap()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, refusedFull
	}
	if s.bySrc[src] >= s.perSource {
		return nil, refusedSource
	}
	if len(s.m) >= s.max {
		var victim *connInfo
		for _, ci := range s.m {
			if victim == nil || ci.active.Load() < victim.active.Load() {
				victim = ci
			}
		}
		if victim == nil || now.UnixNano()-victim.active.Load() < int64(evictIdle) {
			return nil, refusedFull
		}
		victim.evicted.Store(true)
		s.removeLocked(victim.conn)
		victim.conn.Close()
	}
	ci := &connInfo{conn: c, src: src}
	ci.touch(now)
	s.m[c] = ci
	s.bySrc[src]++
	return ci, refusedNone
}

// remove gives c's place back; call it before closing c. Removing a
// session that is not in the set (evicted) does nothing.
func (s *connSet) remove(c net.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeLocked(c)
}

func (s *connSet) removeLocked(c net.Conn) {
	if ci, ok := s.m[c]; ok {
		delete(s.m, c)
		if s.bySrc[ci.src]--; s.bySrc[ci.src] <= 0 {
			delete(s.bySrc, ci.src)
		}
	}
}

func (s *connSet) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for c := range s.m {
		c.Close()
	}
}
