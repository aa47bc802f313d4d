// Package connstore keeps the connections a source (kernel conntrack, later
// OVS) reports, turns their cumulative counters into per-export deltas, and
// decides when each connection is exported and with which IPFIX flow end
// reason:
//
//   - end of flow: the source reported the end (conntrack DESTROY), the
//     connection vanished from a full dump (Sweep), or its tuple was reused
//     by a new connection;
//   - idle timeout: the counters did not move for Config.IdleTimeout;
//   - active timeout: the connection is active and was last exported
//     Config.ActiveTimeout ago;
//   - forced end: Flush (exporter shutdown);
//   - lack of resources: the store is full (Config.MaxConns); the
//     connection is not tracked but still exported.
//
// Deltas never double count: summing the deltas of every record of a
// connection gives its final totals at most once. A connection exported on
// idle timeout stays in the store (so its counters keep their baseline) until
// the source drops it, and is exported again only if it moves.
//
// A deleted connection leaves a tombstone for Config.TombstoneTTL: its
// identity (conntrack ID, start time) and the counters already exported.
// Sources report late: a DESTROY event may still be queued when a dump finds
// the connection gone and Sweep ends it, and a dump taken while the table
// churns may skip a live entry, which the next dump shows again. An
// observation that matches a tombstone continues from the exported counters
// instead of starting from zero: a late end event that brings nothing new is
// dropped, one with more traffic exports only the rest, and a connection
// seen again is tracked again with its old baseline.
package connstore

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/defaults"
)

// Key identifies a connection: its original-direction tuple (the
// destination may be a Service VIP) and its conntrack zone. It is
// comparable; addresses must be unmapped.
type Key struct {
	flow.Tuple
	Zone uint16
}

// Conn is one observation of a connection by a source.
type Conn struct {
	Key Key
	// ID is the source's identifier of the connection (the conntrack id),
	// 0 if the source has none. When both the stored and the observed ID
	// are set, a different ID means the tuple was reused by a new
	// connection; without IDs, counters going down mean the same.
	ID uint32
	// DstAddr/DstPort are the endpoint actually reached: the source of the
	// reply tuple. They differ from Key.Dst/DstPort when the connection was
	// DNAT-ed (Key.Dst is then the Service VIP).
	DstAddr netip.Addr
	DstPort uint16
	// SNATAddr/SNATPort are the destination of the reply tuple when it
	// differs from Key.Src/SrcPort (SNAT, masquerade); zero otherwise.
	SNATAddr netip.Addr
	SNATPort uint16
	// Start is the first packet (conntrack start timestamp) and Stop the
	// end (DESTROY events only); zero when unknown.
	Start, Stop time.Time
	// Cumulative counters of the original (forward) and reply (reverse)
	// directions. They are meaningful only when HasCounters is set: NEW
	// events and tables without nf_conntrack_acct carry none.
	Packets, Bytes               uint64
	ReversePackets, ReverseBytes uint64
	HasCounters                  bool
	TCPState                     string // conntrack name (ESTABLISHED, TIME_WAIT, …); empty for non-TCP
	Mark                         uint32
	// Labels are the 128 conntrack label bits. The store keeps them but
	// flow.Record has no field for them yet, so they are not exported.
	Labels [16]byte
	// Ended is set when the source reported the end of the connection
	// (conntrack DESTROY).
	Ended bool
}

// Config bounds the store and sets its timeouts.
type Config struct {
	// ActiveTimeout is how often a long-lived active connection is exported.
	ActiveTimeout time.Duration
	// IdleTimeout is how long the counters must stay still before the
	// connection is exported as idle.
	IdleTimeout time.Duration
	// MaxConns is the most connections tracked at once. A new connection
	// seen while the store is full is exported at once with reason lack of
	// resources and counted (Stats.Overflow), never silently dropped.
	MaxConns int
	// TombstoneTTL is how long a deleted connection is remembered so a late
	// observation of it is not counted twice (see the package doc). It
	// should cover the lag of the source's events and the gap between two
	// dumps: the exporter sets twice its poll interval.
	TombstoneTTL time.Duration
	// MaxTombstones bounds the tombstones kept. Past it the oldest is
	// forgotten early (overwrite-oldest: it is the least likely to see a
	// late observation) and counted (Stats.TombstonesEvicted).
	MaxTombstones int
}

// Defaults of Config.
const (
	DefaultActiveTimeout = 60 * time.Second
	DefaultIdleTimeout   = 15 * time.Second
	// DefaultMaxConns bounds the store to about 80 MB at ~300 B per
	// connection (see BenchmarkMemoryPerConn), and is the default
	// nf_conntrack_max of a node with 16 GiB or more.
	DefaultMaxConns = 262144
	// DefaultTombstoneTTL is twice the exporter's default poll interval.
	DefaultTombstoneTTL = 10 * time.Second
	// DefaultMaxTombstones bounds tombstones to about 16 MB at ~250 B each
	// (map entry plus queue slot, see BenchmarkMemoryPerTombstone). At the
	// default TTL it holds every connection of a node that ends up to
	// 6,500 a second.
	DefaultMaxTombstones = 65536
)

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	c.ActiveTimeout = cmp.Or(c.ActiveTimeout, DefaultActiveTimeout)
	c.IdleTimeout = cmp.Or(c.IdleTimeout, DefaultIdleTimeout)
	c.MaxConns = cmp.Or(c.MaxConns, DefaultMaxConns)
	c.TombstoneTTL = cmp.Or(c.TombstoneTTL, DefaultTombstoneTTL)
	c.MaxTombstones = cmp.Or(c.MaxTombstones, DefaultMaxTombstones)
}

// Validate checks the configuration.
func (c Config) Validate() error {
	return errors.Join(defaults.RequirePositive("active timeout", c.ActiveTimeout),
		defaults.RequirePositive("idle timeout", c.IdleTimeout),
		defaults.RequirePositive("max connections", c.MaxConns),
		defaults.RequirePositive("tombstone TTL", c.TombstoneTTL),
		defaults.RequirePositive("max tombstones", c.MaxTombstones))
}

// Stats are the store's counters since New, per IP family (index 0 for
// IPv4, 1 for IPv6).
type Stats struct {
	Conns    [2]int    // connections tracked now
	Overflow [2]uint64 // new connections not tracked because the store was full
	Reused   [2]uint64 // tuples reused by a new connection before the old one was seen ending
	Swept    [2]uint64 // connections found gone by Sweep (their end event was missed)
	// Tombstones are the deleted connections remembered now;
	// TombstonesEvicted those forgotten before TombstoneTTL because
	// MaxTombstones was reached.
	Tombstones        [2]int
	TombstonesEvicted [2]uint64
	// Late counts observations of deleted connections that matched their
	// tombstone: late end events (dropped, or only their rest exported)
	// and connections a dump had skipped, tracked again.
	Late [2]uint64
}

const (
	flagCounters     uint8 = 1 << iota // cur holds real counters
	flagEnded                          // the connection is over; export and delete
	flagIdleExported                   // exported on idle timeout and not moved since
)

type counters struct{ packets, bytes, rpackets, rbytes uint64 }

// entry is a tracked connection. Times are Unix nanoseconds to keep the
// entry small (about 200 bytes).
type entry struct {
	id        uint32
	mark      uint32
	dstPort   uint16
	snatPort  uint16
	flags     uint8
	dst, snat netip.Addr
	tcpState  string
	labels    [16]byte
	start     int64 // first packet, from the source; 0 if unknown
	stop      int64 // end, from the source; 0 if unknown
	firstSeen int64
	lastSeen  int64 // last observation, for Sweep
	active    int64 // last time the counters moved (or firstSeen)
	exported  int64 // last export (or firstSeen)
	cur, base counters
}

// tomb is what the store remembers of a deleted connection.
type tomb struct {
	id          uint32
	hasCounters bool
	start       int64    // as entry.start
	until       int64    // forgotten at this time, Unix nanoseconds
	base        counters // exported so far
}

// tombRef is a tombstone's place in the expiry queue. A ref whose until
// differs from its key's tombstone is stale (the tombstone was replaced or
// removed) and is skipped.
type tombRef struct {
	key   Key
	until int64
}

// Store is the connection table. It is safe for concurrent use.
type Store struct {
	cfg   Config
	mu    sync.Mutex
	conns map[Key]*entry
	stats Stats

	tombs    map[Key]tomb
	tombQ    []tombRef // oldest first from tombHead: every TTL is the same
	tombHead int
}

// New returns an empty store. cfg must have passed Validate after
// SetDefaults.
func New(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("connstore: %w", err)
	}
	return &Store{cfg: cfg, conns: make(map[Key]*entry), tombs: make(map[Key]tomb)}, nil
}

func fam(k Key) int {
	if flow.Version(k.Src) == 6 {
		return 1
	}
	return 0
}

// Merge records a batch of observations made at now (a dump, or events).
// It appends to out the records due at once (the end of a connection whose
// tuple was reused; lack of resources; the rest of a late end event whose
// tuple a new connection took meanwhile) and returns the extended slice.
func (s *Store) Merge(batch []Conn, now time.Time, out []flow.Record) []flow.Record {
	ns := now.UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range batch {
		c := &batch[i]
		f := fam(c.Key)
		e, ok := s.conns[c.Key]
		if ok && !e.reusedBy(c) {
			e.update(c, ns)
			continue
		}
		// c is not the tracked connection, if any: it may be a late
		// observation of one already exported and deleted.
		var base counters
		late := false
		if t, found := s.tombs[c.Key]; found && t.until > ns && t.matches(c) {
			s.stats.Late[f]++
			if !c.movedFrom(t.base) && (c.Ended || ok) {
				continue // a late end event, or a stale sighting, with nothing new
			}
			if ok {
				// A newer connection holds the tuple now: export what the
				// old one did since its last record, at once.
				var old entry
				old.reset(c, ns)
				old.resume(t.base)
				old.flags |= flagEnded
				out = append(out, old.record(c.Key, flow.EndReasonEndOfFlow))
				t.base = old.cur
				s.tombs[c.Key] = t
				continue
			}
			base, late = t.base, true
			s.unbury(c.Key)
		}
		if ok {
			s.stats.Reused[f]++
			if e.due() {
				out = append(out, e.record(c.Key, flow.EndReasonEndOfFlow))
			}
			s.bury(c.Key, e, ns)
			e.reset(c, ns)
			continue
		}
		if len(s.conns) >= s.cfg.MaxConns {
			s.stats.Overflow[f]++
			out = append(out, untracked(c, base, now))
			continue
		}
		e = new(entry)
		e.reset(c, ns)
		if late {
			e.resume(base)
		}
		s.conns[c.Key] = e
		s.stats.Conns[f]++
	}
	return out
}

// Sweep marks as ended every connection of IP version 4 or 6 not observed
// since since (the start of a complete dump of that family): the source no
// longer has it, so its end event was missed. They are exported by the next
// Expire. It returns how many it marked.
func (s *Store) Sweep(version uint8, since time.Time) int {
	ns := since.UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, e := range s.conns {
		if e.flags&flagEnded != 0 || e.lastSeen >= ns || flow.Version(k.Src) != version {
			continue
		}
		e.flags |= flagEnded
		n++
	}
	switch version {
	case 4:
		s.stats.Swept[0] += uint64(n)
	case 6:
		s.stats.Swept[1] += uint64(n)
	}
	return n
}

// Expire appends to out the records due at now and returns the extended
// slice: ended connections (removed from the store, leaving a tombstone),
// connections idle for IdleTimeout, and active connections last exported
// ActiveTimeout ago. It also forgets tombstones older than TombstoneTTL.
func (s *Store) Expire(now time.Time, out []flow.Record) []flow.Record {
	ns := now.UnixNano()
	idle, active := s.cfg.IdleTimeout.Nanoseconds(), s.cfg.ActiveTimeout.Nanoseconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pruneTombs(ns)
	for k, e := range s.conns {
		switch {
		case e.flags&flagEnded != 0:
			if e.due() {
				out = append(out, e.record(k, flow.EndReasonEndOfFlow))
			}
			s.bury(k, e, ns)
			delete(s.conns, k)
			s.stats.Conns[fam(k)]--
		case e.flags&flagIdleExported != 0:
			// Exported as idle and still: nothing new to say.
		case ns-e.active >= idle:
			out = append(out, e.record(k, flow.EndReasonIdleTimeout))
			e.markExported(ns)
			e.flags |= flagIdleExported
		case ns-e.exported >= active:
			out = append(out, e.record(k, flow.EndReasonActiveTimeout))
			e.markExported(ns)
		}
	}
	return out
}

// Flush appends a record with the given reason (normally forced end) for
// every tracked connection that has something unexported, empties the store
// (tombstones too) and returns the extended slice, and marks appended with
// a Mark of every connection it held or remembered: what the next store on
// the node (the exporter restarted) takes over with Resume.
func (s *Store) Flush(reason flow.EndReason, out []flow.Record, marks []Mark) ([]flow.Record, []Mark) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, e := range s.conns {
		if e.due() {
			out = append(out, e.record(k, reason))
			e.markExported(0)
		}
		marks = append(marks, Mark{Key: k, ID: e.id, Start: e.start, HasCounters: e.flags&flagCounters != 0,
			Packets: e.base.packets, Bytes: e.base.bytes, ReversePackets: e.base.rpackets, ReverseBytes: e.base.rbytes})
	}
	for k, t := range s.tombs {
		if _, held := s.conns[k]; !held {
			marks = append(marks, Mark{Key: k, ID: t.id, Start: t.start, HasCounters: t.hasCounters,
				Packets: t.base.packets, Bytes: t.base.bytes, ReversePackets: t.base.rpackets, ReverseBytes: t.base.rbytes})
		}
	}
	clear(s.conns)
	s.stats.Conns = [2]int{}
	clear(s.tombs)
	clear(s.tombQ)
	s.tombQ, s.tombHead = s.tombQ[:0], 0
	s.stats.Tombstones = [2]int{}
	return out, marks
}

// Mark is a connection a store exported, as the store that takes over
// from it must know it: its identity and the counters exported so far.
type Mark struct {
	Key         Key
	ID          uint32
	Start       int64 // first packet, Unix nanoseconds; 0 if unknown
	HasCounters bool
	// Cumulative counters exported so far.
	Packets, Bytes, ReversePackets, ReverseBytes uint64
}

// Resume takes over from a store that flushed marks (the exporter's last
// run on this node): each becomes a tombstone for TombstoneTTL from now,
// so that the first dumps, which still show the connections the last run
// exported (TCP's TIME_WAIT keeps them two minutes), continue from the
// exported counters instead of exporting them again; a connection that
// moved since exports only the rest. Past MaxTombstones the oldest marks
// are forgotten and counted as evicted: those connections are exported
// again. Call it before the first Merge.
func (s *Store) Resume(marks []Mark, now time.Time) {
	ns := now.UnixNano()
	until := ns + s.cfg.TombstoneTTL.Nanoseconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, m := range marks {
		if _, held := s.conns[m.Key]; held {
			continue
		}
		if _, ok := s.tombs[m.Key]; !ok {
			s.stats.Tombstones[fam(m.Key)]++
		}
		s.tombs[m.Key] = tomb{id: m.ID, hasCounters: m.HasCounters, start: m.Start, until: until,
			base: counters{m.Packets, m.Bytes, m.ReversePackets, m.ReverseBytes}}
		s.tombQ = append(s.tombQ, tombRef{m.Key, until})
	}
	s.compactTombs()
	s.pruneTombs(ns)
}

// bury remembers e, deleted (or replaced) at ns, under k for TombstoneTTL,
// then enforces the TTL and MaxTombstones. s.mu must be held.
func (s *Store) bury(k Key, e *entry, ns int64) {
	until := ns + s.cfg.TombstoneTTL.Nanoseconds()
	if _, ok := s.tombs[k]; !ok {
		s.stats.Tombstones[fam(k)]++
	}
	s.tombs[k] = tomb{id: e.id, hasCounters: e.flags&flagCounters != 0, start: e.start, until: until, base: e.cur}
	s.tombQ = append(s.tombQ, tombRef{k, until})
	if len(s.tombQ)-s.tombHead > 2*s.cfg.MaxTombstones {
		s.compactTombs() // stale refs of replaced tombstones pile up
	}
	s.pruneTombs(ns)
}

// unbury forgets the tombstone of k; its queue ref goes stale. s.mu must
// be held.
func (s *Store) unbury(k Key) {
	delete(s.tombs, k)
	s.stats.Tombstones[fam(k)]--
}

// pruneTombs forgets tombstones due at ns, and the oldest ones past
// MaxTombstones. s.mu must be held.
func (s *Store) pruneTombs(ns int64) {
	for s.tombHead < len(s.tombQ) {
		r := s.tombQ[s.tombHead]
		t, ok := s.tombs[r.key]
		live := ok && t.until == r.until
		if live && r.until > ns && len(s.tombs) <= s.cfg.MaxTombstones {
			break
		}
		if live {
			if r.until > ns {
				s.stats.TombstonesEvicted[fam(r.key)]++
			}
			s.unbury(r.key)
		}
		s.tombQ[s.tombHead] = tombRef{}
		s.tombHead++
	}
	if s.tombHead > 0 && s.tombHead >= len(s.tombQ)/2 {
		n := copy(s.tombQ, s.tombQ[s.tombHead:])
		clear(s.tombQ[n:])
		s.tombQ, s.tombHead = s.tombQ[:n], 0
	}
}

// compactTombs drops the stale refs from the queue. s.mu must be held.
func (s *Store) compactTombs() {
	q := s.tombQ[:0]
	for _, r := range s.tombQ[s.tombHead:] {
		if t, ok := s.tombs[r.key]; ok && t.until == r.until {
			q = append(q, r)
		}
	}
	clear(s.tombQ[len(q):])
	s.tombQ, s.tombHead = q, 0
}

// matches reports whether c is (probably) the connection t remembers:
// every identity both know (conntrack ID, start time) agrees. Without any,
// only counters that did not go down tell; without counters either, c is
// taken as a new connection.
func (t *tomb) matches(c *Conn) bool {
	known := false
	if t.id != 0 && c.ID != 0 {
		if t.id != c.ID {
			return false
		}
		known = true
	}
	if t.start != 0 && !c.Start.IsZero() {
		if t.start != c.Start.UnixNano() {
			return false
		}
		known = true
	}
	if known {
		return true
	}
	return t.hasCounters && c.HasCounters && c.Packets >= t.base.packets && c.Bytes >= t.base.bytes &&
		c.ReversePackets >= t.base.rpackets && c.ReverseBytes >= t.base.rbytes
}

// movedFrom reports whether a counter of c is beyond base.
func (c *Conn) movedFrom(base counters) bool {
	return c.HasCounters && (c.Packets > base.packets || c.Bytes > base.bytes ||
		c.ReversePackets > base.rpackets || c.ReverseBytes > base.rbytes)
}

// Len returns the number of connections tracked.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Stats returns a snapshot of the counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// reset makes e a fresh entry for c, first seen at ns.
func (e *entry) reset(c *Conn, ns int64) {
	*e = entry{firstSeen: ns, lastSeen: ns, active: ns, exported: ns}
	e.update(c, ns)
}

// resume makes the fresh entry e continue a deleted connection whose
// counters up to base were exported: later deltas start from base (and
// clamp at zero). If it did not move since, it is in the exported-as-idle
// state: nothing to export until it moves.
func (e *entry) resume(base counters) {
	e.base = base
	// Counters never go down within a connection: an observation older
	// than the last export does not lower them (as in update).
	e.cur = counters{max(e.cur.packets, base.packets), max(e.cur.bytes, base.bytes),
		max(e.cur.rpackets, base.rpackets), max(e.cur.rbytes, base.rbytes)}
	if e.cur == base {
		e.flags |= flagIdleExported
	}
}

// reusedBy reports whether c is a new connection on e's tuple: a
// different conntrack ID or a different start time. Either suffices: the
// kernel may recycle a TIME_WAIT entry for the same tuple under the same
// ID (its slab reused at once), and only the start time then tells.
func (e *entry) reusedBy(c *Conn) bool {
	if e.id != 0 && c.ID != 0 && e.id != c.ID {
		return true
	}
	if e.start != 0 && !c.Start.IsZero() && e.start != c.Start.UnixNano() {
		return true
	}
	if e.id != 0 && c.ID != 0 {
		return false // same ID and no start time that differs
	}
	if e.flags&flagCounters == 0 || !c.HasCounters {
		return false
	}
	return c.Packets < e.cur.packets || c.Bytes < e.cur.bytes ||
		c.ReversePackets < e.cur.rpackets || c.ReverseBytes < e.cur.rbytes
}

// update folds observation c, made at ns, into e.
func (e *entry) update(c *Conn, ns int64) {
	e.lastSeen = ns
	if c.ID != 0 {
		e.id = c.ID
	}
	if c.HasCounters {
		// Take the larger value of each counter: a dump that started before
		// a DESTROY event may deliver the same connection with older counters.
		next := counters{max(e.cur.packets, c.Packets), max(e.cur.bytes, c.Bytes),
			max(e.cur.rpackets, c.ReversePackets), max(e.cur.rbytes, c.ReverseBytes)}
		if next != e.cur {
			e.cur = next
			e.active = ns
			e.flags &^= flagIdleExported
		}
		e.flags |= flagCounters
	}
	if c.DstAddr.IsValid() {
		e.dst, e.dstPort = c.DstAddr, c.DstPort
	}
	if c.SNATAddr.IsValid() {
		e.snat, e.snatPort = c.SNATAddr, c.SNATPort
	}
	if !c.Start.IsZero() {
		e.start = c.Start.UnixNano()
	}
	if c.TCPState != "" {
		e.tcpState = c.TCPState
	}
	e.mark, e.labels = c.Mark, c.Labels
	if c.Ended {
		e.flags |= flagEnded
		if !c.Stop.IsZero() {
			e.stop = c.Stop.UnixNano()
		}
	}
}

// due reports whether e has anything not yet exported: it was never
// exported as idle, or it moved since.
func (e *entry) due() bool { return e.flags&flagIdleExported == 0 }

func (e *entry) markExported(ns int64) {
	e.exported = ns
	e.base = e.cur
}

// record builds the export record of e with the deltas since its last
// export. It does not move the baseline: see markExported.
func (e *entry) record(k Key, reason flow.EndReason) flow.Record {
	r := flow.Record{
		FlowStart: unixTime(e.start), FlowEnd: unixTime(e.active),
		SrcAddr: k.Src, SrcPort: k.SrcPort, Proto: k.Proto,
		DstAddr: k.Dst, DstPort: k.DstPort,
		Packets: e.cur.packets, Bytes: e.cur.bytes, ReversePackets: e.cur.rpackets, ReverseBytes: e.cur.rbytes,
		PacketsDelta:        delta(e.cur.packets, e.base.packets),
		BytesDelta:          delta(e.cur.bytes, e.base.bytes),
		ReversePacketsDelta: delta(e.cur.rpackets, e.base.rpackets),
		ReverseBytesDelta:   delta(e.cur.rbytes, e.base.rbytes),
		EndReason:           reason, TCPState: e.tcpState, Zone: k.Zone, Mark: e.mark,
		IPVersion: k.IPVersion(),
	}
	if e.start == 0 {
		r.FlowStart = unixTime(e.firstSeen)
	}
	switch {
	case e.stop != 0:
		r.FlowEnd = unixTime(e.stop)
	case e.flags&flagCounters == 0:
		// Without counters activity is unknown: the last sighting is the
		// best bound.
		r.FlowEnd = unixTime(e.lastSeen)
	}
	setNAT(&r, k, e.dst, e.dstPort, e.snat, e.snatPort)
	return r
}

// untracked builds the lack-of-resources record of a connection the full
// store could not take. It carries the totals. Its deltas are zero, except
// for an end event: then they are the totals less base, what earlier records
// of the connection exported (zero for one never tracked), and no later
// record of it can exist, so deltas still never double count.
func untracked(c *Conn, base counters, now time.Time) flow.Record {
	r := flow.Record{
		FlowStart: c.Start, FlowEnd: now,
		SrcAddr: c.Key.Src, SrcPort: c.Key.SrcPort, Proto: c.Key.Proto,
		DstAddr: c.Key.Dst, DstPort: c.Key.DstPort,
		Packets: c.Packets, Bytes: c.Bytes, ReversePackets: c.ReversePackets, ReverseBytes: c.ReverseBytes,
		EndReason: flow.EndReasonLackOfResources, TCPState: c.TCPState, Zone: c.Key.Zone, Mark: c.Mark,
		IPVersion: c.Key.IPVersion(),
	}
	if r.FlowStart.IsZero() {
		r.FlowStart = now
	}
	if c.Ended {
		r.PacketsDelta, r.BytesDelta = delta(c.Packets, base.packets), delta(c.Bytes, base.bytes)
		r.ReversePacketsDelta, r.ReverseBytesDelta = delta(c.ReversePackets, base.rpackets), delta(c.ReverseBytes, base.rbytes)
		if !c.Stop.IsZero() {
			r.FlowEnd = c.Stop
		}
	}
	setNAT(&r, c.Key, c.DstAddr, c.DstPort, c.SNATAddr, c.SNATPort)
	return r
}

// setNAT fills the endpoint, service and SNAT fields of r: the endpoint is
// the reply source, the service the original destination when they differ.
func setNAT(r *flow.Record, k Key, dst netip.Addr, dstPort uint16, snat netip.Addr, snatPort uint16) {
	if dst.IsValid() && (dst != k.Dst || dstPort != k.DstPort) {
		r.DstAddr, r.DstPort = dst, dstPort
		r.ServiceAddr, r.ServicePort = k.Dst, k.DstPort
	}
	if snat.IsValid() && (snat != k.Src || snatPort != k.SrcPort) {
		r.SNATAddr, r.SNATPort = snat, snatPort
	}
}

// delta is cur-base, clamped at zero.
func delta(cur, base uint64) uint64 {
	if cur < base {
		return 0
	}
	return cur - base
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
