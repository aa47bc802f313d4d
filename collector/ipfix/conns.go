package ipfix

import (
	"math"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// How the TCP/TLS sessions share the places of a listener (issue 33: 4,200
// connections sending a bare header every 4–5 s held all 4,096 sessions).
// A session keeps its place by what it delivers, not by what it sends: its
// useful-record rate (data records of messages with valid sets) decides
// whether a new connection may take its place. A session that delivers
// nothing holds a place only until someone else needs it, so connecting
// faster than an exporter wins an attacker nothing: every new connection
// gets in while such a session is left, and keeps its place by delivering.

// evictIdle is how old a session must be before a new connection from its
// own address may take its place: past MaxSessionsPerSource a host is
// refused rather than let churn its own sessions, and an exporter
// restarted with stale connections gets in after evictIdle. A variable for
// the tests.
var evictIdle = 10 * time.Second

const (
	// rateWindow is the time constant of a session's decaying record rate.
	// Exporters send at every active timeout (1 min for ours and OVS by
	// default), so the window spans several exports, and a burst of records
	// long ago does not buy a session its place for ever.
	rateWindow = 10 * time.Minute
	// minUsefulRate (records/s) is what a session must deliver to keep its
	// place when a new connection needs it: one record a minute. A working
	// exporter reports each flow it tracks at least every active timeout,
	// and a node always has some (kubelet probes, DNS), so only sessions
	// that send nothing, bare headers, templates alone or garbage fall
	// under it; a busy exporter is never evicted.
	minUsefulRate = 1.0 / 60
	// reservedShare: MaxSessions/reservedShare places (at least 1) are kept
	// for preferred sources (AllowList.preferred); others never hold them.
	reservedShare = 8
)

// sourcePrefix is the group of src that MaxSessionsPerPrefix bounds: its
// /24 (IPv4) or /64 (IPv6, the smallest network a host is given, so that a
// host's unlimited addresses count once). All of 127.0.0.0/8 is one group:
// any local process may bind any of its 16 million addresses (the attack of
// issue 33 used 263 of them).
func sourcePrefix(src netip.Addr) netip.Prefix {
	src = src.Unmap().WithZone("")
	bits := 64
	switch {
	case src.Is4() && src.IsLoopback():
		bits = 8
	case src.Is4():
		bits = 24
	}
	p, _ := src.Prefix(bits)
	return p
}

// connInfo is what the set knows of one TCP/TLS session.
type connInfo struct {
	conn      net.Conn
	src       netip.Addr
	prefix    netip.Prefix // sourcePrefix(src)
	preferred bool         // may take the reserved places
	start     int64        // unix ns of the accept
	// active is when a message last carried a valid set (unix ns; at first
	// the accept); score is the data records of those messages decayed by
	// rateWindow up to active (float64 bits); healthyUntil is when, without
	// more records, its rate falls under minUsefulRate (unix ns; at first
	// the accept), which spares add the rate of every session. Only the
	// session's goroutine writes them (useful); add reads them.
	active, healthyUntil atomic.Int64
	score                atomic.Uint64
	// evicted is the limit (refusal) whose place a new connection took.
	evicted atomic.Uint32
	idx     int // in connSet.all; -1 out of the set (connSet.mu)

	dmu     sync.Mutex // orders the read deadline changes of the session and of the shutdown
	drainBy time.Time  // zero until the shutdown; then no read outlasts it
}

// SetReadDeadline sets the session's read deadline to at, or to the
// shutdown's drain deadline when that is sooner (the framer's deadliner).
func (ci *connInfo) SetReadDeadline(at time.Time) error {
	ci.dmu.Lock()
	defer ci.dmu.Unlock()
	if !ci.drainBy.IsZero() && ci.drainBy.Before(at) {
		at = ci.drainBy
	}
	return ci.conn.SetReadDeadline(at)
}

// drain tells the exporter the collector is closing, without losing what
// it sent: the write side closes (FIN, or TLS close_notify) and reads go
// on, bounded by by, until the exporter closes its side. Closing at once
// reset the connection, and the messages still in the socket buffer or on
// the wire were lost, though the exporter had counted them as sent.
func (ci *connInfo) drain(by time.Time) {
	ci.dmu.Lock()
	ci.drainBy = by
	ci.conn.SetReadDeadline(by)
	ci.dmu.Unlock()
	if cw, ok := ci.conn.(interface{ CloseWrite() error }); !ok || cw.CloseWrite() != nil {
		ci.conn.Close() // a TLS handshake not yet done: it delivered nothing
	}
}

// useful records a message with a valid set and n data records. Not safe
// for concurrent use (one writer: the session's goroutine).
func (ci *connInfo) useful(now time.Time, n uint64) {
	t := now.UnixNano()
	s := decay(math.Float64frombits(ci.score.Load()), t-ci.active.Load()) + float64(n)
	ci.score.Store(math.Float64bits(s))
	ci.active.Store(t)
	// rate(u) = minUsefulRate solved for u: with a = t-start and w the
	// window, s·e^(-(u-t)/w) = m·w·(1-e^(-(u-start)/w)) gives
	// u-start = a + w·ln(e^(-a/w) + s/(m·w)), in a form that does not
	// overflow for old sessions (nor underflow: -Inf when s is 0 and the
	// exponential 0, clamped).
	w := float64(rateWindow)
	a := float64(max(t-ci.start, 0))
	until := a + w*math.Log(math.Exp(-a/w)+s/(minUsefulRate*rateWindow.Seconds()))
	ci.healthyUntil.Store(ci.start + int64(min(max(until, 0), float64(math.MaxInt64/2))))
}

// rate is the session's data records per second at now (unix ns),
// averaged over rateWindow with exponential decay; a session younger than
// that is averaged over its age.
func (ci *connInfo) rate(now int64) float64 {
	s := decay(math.Float64frombits(ci.score.Load()), now-ci.active.Load())
	if s == 0 {
		return 0
	}
	age := float64(max(now-ci.start, 1))
	window := -float64(rateWindow) * math.Expm1(-age/float64(rateWindow)) // ns: age when young, rateWindow when old
	return s / window * 1e9
}

// decay is score as it stands dt ns after it was counted.
func decay(score float64, dt int64) float64 {
	if score == 0 || dt <= 0 {
		return score
	}
	return score * math.Exp(-float64(dt)/float64(rateWindow))
}

// refusal is why add refused a connection, or which limit an evicted
// session gave its place for: the reason label of
// dualflow_ipfix_sessions_closed_total.
type refusal uint8

const (
	admitted        refusal = iota
	refusedSource           // MaxSessionsPerSource of its address
	refusedPrefix           // MaxSessionsPerPrefix of its /24 or /64
	refusedReserved         // only the places kept for preferred sources are left
	refusedFull             // MaxSessions
)

var refusalNames = [...]string{"", "source_limit", "prefix_limit", "reserved", "limit"}

func (r refusal) String() string { return refusalNames[r] }

// connLimits are the bounds of a connSet.
type connLimits struct {
	max, perSource, perPrefix int
	// reserved places (of max) only preferred sources may take.
	reserved int
}

// newConnLimits returns the limits of cfg, its reserve included.
func newConnLimits(cfg Config) connLimits {
	return connLimits{max: cfg.MaxSessions, perSource: cfg.MaxSessionsPerSource, perPrefix: cfg.MaxSessionsPerPrefix,
		reserved: min(cfg.MaxSessions-1, max(1, cfg.MaxSessions/reservedShare))}
}

// connSet holds the TCP/TLS sessions of a listener, bounded in all, per
// source address, per source prefix (sourcePrefix) and, for sources not
// preferred, to max minus the reserve. Safe for concurrent use.
type connSet struct {
	lim       connLimits
	preferred AllowList // sources that may take the reserved places

	mu       sync.Mutex
	all      []*connInfo // a slice: add scans it on every connection past a limit
	bySrc    map[netip.Addr]int
	byPrefix map[netip.Prefix]int
	others   int // sessions of sources not preferred
	closed   bool
}

// newConnSet returns a set bounded by lim whose reserved places are for
// the sources preferred allows (an empty list allows all: then there is no
// reserve to speak of).
func newConnSet(lim connLimits, preferred AllowList) *connSet {
	return &connSet{lim: lim, preferred: preferred, bySrc: map[netip.Addr]int{}, byPrefix: map[netip.Prefix]int{}}
}

// add admits c, or returns why not. When c would pass a limit (its
// address's, its prefix's, the reserve or the total), it takes the place of
// a session within that limit (of its address and at least evictIdle old,
// of its prefix, of a source not preferred, any) that delivers under
// minUsefulRate: the lowest rate first and, among equals, the oldest
// connection (a new one, still sending its templates, goes last). The
// evicted session leaves the set and is closed (its goroutine sees the
// close and counts it). When none may give its place, c is refused with
// the narrowest limit.
//
// A session gives its place back before its connection closes (here, or
// remove before Close when it ends), so an exporter that sees its session
// closed can connect again at once, and a new connection never evicts a
// live session for the place of one that has already ended.
func (s *connSet) add(c net.Conn, now time.Time) (*connInfo, refusal) {
	src := addrOfNet(c.RemoteAddr())
	ci := &connInfo{conn: c, src: src, prefix: sourcePrefix(src), preferred: s.preferred.Allows(src), start: now.UnixNano()}
	ci.active.Store(ci.start)
	ci.healthyUntil.Store(ci.start)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, refusedFull
	}
	var hit uint8 // bit per limit c would pass
	if s.bySrc[src] >= s.lim.perSource {
		hit |= 1 << refusedSource
	}
	if s.byPrefix[ci.prefix] >= s.lim.perPrefix {
		hit |= 1 << refusedPrefix
	}
	if !ci.preferred && s.others >= s.lim.max-s.lim.reserved {
		hit |= 1 << refusedReserved
	}
	if len(s.all) >= s.lim.max {
		hit |= 1 << refusedFull
	}
	if hit != 0 {
		narrowest := refusedSource
		for hit&(1<<narrowest) == 0 {
			narrowest++
		}
		// One place within every limit passed frees them all: each was
		// at its bound, and the victim counts in each.
		v := s.victim(ci, hit, ci.start)
		if v == nil {
			return nil, narrowest
		}
		v.evicted.Store(uint32(narrowest))
		s.removeLocked(v)
		v.conn.Close()
	}
	ci.idx = len(s.all)
	s.all = append(s.all, ci)
	s.bySrc[src]++
	s.byPrefix[ci.prefix]++
	if !ci.preferred {
		s.others++
	}
	return ci, admitted
}

// victim returns the session whose place ci may take within the limits of
// hit, or nil. s.mu must be held.
func (s *connSet) victim(ci *connInfo, hit uint8, now int64) *connInfo {
	var v *connInfo
	var vRate float64
	for _, o := range s.all {
		switch {
		case now < o.healthyUntil.Load(): // delivers enough
			continue
		case hit&(1<<refusedSource) != 0 && (o.src != ci.src || now-o.start < int64(evictIdle)),
			hit&(1<<refusedPrefix) != 0 && o.prefix != ci.prefix,
			hit&(1<<refusedReserved) != 0 && o.preferred:
			continue
		}
		r := o.rate(now)
		if v == nil || r < vRate || (r == vRate && o.start < v.start) {
			v, vRate = o, r
		}
	}
	return v
}

// remove gives ci's place back; call it before closing its connection.
// Removing a session that is not in the set (evicted) does nothing.
func (s *connSet) remove(ci *connInfo) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeLocked(ci)
}

func (s *connSet) removeLocked(ci *connInfo) {
	if ci.idx < 0 {
		return
	}
	last := s.all[len(s.all)-1]
	s.all[ci.idx], last.idx = last, ci.idx
	s.all[len(s.all)-1] = nil
	s.all = s.all[:len(s.all)-1]
	ci.idx = -1
	if s.bySrc[ci.src]--; s.bySrc[ci.src] <= 0 {
		delete(s.bySrc, ci.src)
	}
	if s.byPrefix[ci.prefix]--; s.byPrefix[ci.prefix] <= 0 {
		delete(s.byPrefix, ci.prefix)
	}
	if !ci.preferred {
		s.others--
	}
}

// drainAll refuses new sessions and drains every session until by (see
// connInfo.drain); each ends when its exporter closes or by passes.
func (s *connSet) drainAll(by time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for _, ci := range s.all {
		ci.drain(by)
	}
}
