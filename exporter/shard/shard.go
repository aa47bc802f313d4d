// Package shard spreads an exporter's records over several collectors so
// that both halves of a cross-node connection reach the same one: the
// collector's correlator can only pair the source node's record with the
// destination node's if it receives both.
//
// Every record is routed by Key, a hash of the connection as the
// correlator keys it (post-NAT, direction-independent), to one member by
// rendezvous (highest-random-weight) hashing: each member's weight for a
// key is a hash of the key and the member's name, and the heaviest member
// wins. Every exporter computes the same weights from the same member
// names, without coordination, so all exporters must be given the same
// member set. Rendezvous hashing was chosen over a ring of virtual nodes
// because it needs no tuning and moves the least: removing a member moves
// exactly its share (each of its keys to that key's next-heaviest member)
// and adding one moves only the keys it now wins, about 1/N of them. The
// cost is O(N) per record, a few nanoseconds per member, for the handful
// of collectors a cluster runs.
//
// Members are a static list or the addresses of a DNS name (a headless
// Service), resolved again periodically; a failed or empty resolution
// keeps the last good set. Each member has its own ipfix.Exporter, so its
// own connection, backoff and bounded buffer (ipfix.Config.BufferBytes,
// drop-oldest).
//
// A member that leaves the DNS answer (a restarting collector pod behind a
// Service without publishNotReadyAddresses) is treated like a member that
// is down: it keeps its share and its buffer until Config.FailoverTimeout
// has passed since it left the answer or, if earlier, since it went down.
// Back in the answer before that, nothing has moved. After it, the member
// is retired: its share moves to the survivors, and its exporter drains
// its buffer for at most ipfix.Config.DrainTimeout, what is left being
// counted as dropped (DroppedShutdown). A new address in the answer is a
// member at once.
//
// Failover. A member that is not connected keeps its share for
// Config.FailoverTimeout: its records wait in its buffer and are sent when
// it is back, or are dropped oldest-first (and counted) when the buffer
// fills. Past the timeout its share moves to the survivors, each key to
// its next-heaviest member, so new halves of one connection still meet;
// when the member is connected again its share returns. Records already
// encoded into a member's buffer are never moved to another member: a
// message may have reached the collector just before the connection broke,
// and sending it elsewhere too would count the connection twice. When
// every member is failed over, records go to their owner among all members
// and wait in its buffer.
//
// A connection whose halves are exported on either side of a failover (or
// of a membership change) may be split between two collectors and stay
// unpaired; that is the price of not buffering without bound.
package shard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dualflow/dualflow/exporter/ipfix"
	"github.com/dualflow/dualflow/flow"
)

// sender is one member's IPFIX exporter; *ipfix.Exporter implements it,
// tests use a fake.
type sender interface {
	Export([]flow.Record)
	Flush()
	Run(ctx context.Context) error
	Stats() ipfix.Stats
}

var _ sender = (*ipfix.Exporter)(nil)

// member is one collector.
type member struct {
	name   string // host:port
	seed   uint64 // nameHash(name)
	snd    sender
	routed atomic.Uint64 // records routed to it

	// The check's (Run's goroutine).
	downSince time.Time // zero while connected
	failed    bool      // down past the failover timeout: its share is elsewhere

	// New's, then Run's goroutine.
	goneSince time.Time // when it left the DNS answer; zero while in it

	// Run's goroutine.
	cancel context.CancelFunc // nil until started
}

func (m *member) export(recs []flow.Record) {
	m.snd.Export(recs)
	m.routed.Add(uint64(len(recs)))
}

// Sharder routes records to several collectors. Export, Flush, Pick and
// Stats are safe for concurrent use; Run must be called once.
type Sharder struct {
	cfg       Config
	log       *slog.Logger
	now       func() time.Time
	lookup    func(ctx context.Context, network, host string) ([]netip.Addr, error)
	newSender func(ipfix.Config) (sender, error)

	// mu is held shared by Export while it routes, exclusively to change
	// the members: a member is never stopped under a routing Export. The
	// slices are replaced, never modified in place.
	mu    sync.RWMutex
	all   []*member // sorted by name
	route []*member // members not failed over; all when every one is

	// Membership is changed by New, then only by Run's goroutine.
	runCtx  context.Context // nil until Run
	wg      sync.WaitGroup  // member goroutines
	started atomic.Bool

	statsMu sync.Mutex
	leaving []*member   // removed, still draining
	retired ipfix.Stats // counters of removed members, so totals never go down

	failovers   atomic.Uint64
	gone        atomic.Int64 // members out of the DNS answer, not yet retired
	dnsErrors   atomic.Uint64
	unrouted    atomic.Uint64 // records dropped while no member was known
	unroutedLog atomic.Int64  // unix nanoseconds of the last warning
}

// New checks cfg (after SetDefaults) and builds the members: those of the
// static list, or those DNS resolves to now (a failure is logged and
// retried by Run). Nothing is sent before Run.
func New(cfg Config) (*Sharder, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("collector sharding: %w", err)
	}
	s := &Sharder{cfg: cfg, log: cfg.Logger, now: cfg.now, lookup: cfg.lookup, newSender: cfg.newSender}
	s.log = cmp.Or(s.log, slog.Default())
	if s.now == nil {
		s.now = time.Now
	}
	if s.lookup == nil {
		s.lookup = net.DefaultResolver.LookupNetIP
	}
	if s.newSender == nil {
		s.newSender = func(c ipfix.Config) (sender, error) { return ipfix.New(c) }
	}
	if cfg.DNS != "" {
		s.resolve(context.Background())
		return s, nil
	}
	names, err := memberNames(cfg.Collectors)
	if err != nil {
		return nil, err
	}
	if err := s.setMembers(names, false); err != nil {
		return nil, err
	}
	return s, nil
}

// Export routes every record to the member Pick chooses for its Key and
// hands it to that member's IPFIX exporter, which encodes it into its
// buffer; it never waits for the network. Consecutive records for one
// member are handed over together. With no member known (DNS has resolved
// nothing yet) the records are dropped and counted.
func (s *Sharder) Export(recs []flow.Record) {
	if len(recs) == 0 {
		return
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	route := s.route
	switch len(route) {
	case 0:
		s.dropUnrouted(len(recs))
		return
	case 1:
		route[0].export(recs)
		return
	}
	start, cur := 0, pick(route, Key(&recs[0]))
	for i := 1; i < len(recs); i++ {
		if m := pick(route, Key(&recs[i])); m != cur {
			cur.export(recs[start:i])
			start, cur = i, m
		}
	}
	cur.export(recs[start:])
}

// pick returns the heaviest of ms for key (ms not empty). Ties, which need
// two 64-bit weights to be equal, go to the first by name.
func pick(ms []*member, key uint64) *member {
	key = mix64(key)
	best, bw := ms[0], weight(ms[0].seed, key)
	for _, m := range ms[1:] {
		if w := weight(m.seed, key); w > bw {
			best, bw = m, w
		}
	}
	return best
}

// Pick returns the member (host:port) that records of key go to now, or
// "" when no member is known.
func (s *Sharder) Pick(key uint64) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if len(s.route) == 0 {
		return ""
	}
	return pick(s.route, key).name
}

// unroutedLogEvery rate-limits the warning about records without a member.
const unroutedLogEvery = time.Minute

func (s *Sharder) dropUnrouted(n int) {
	s.unrouted.Add(uint64(n))
	now, last := time.Now().UnixNano(), s.unroutedLog.Load()
	if now-last >= int64(unroutedLogEvery) && s.unroutedLog.CompareAndSwap(last, now) {
		s.log.Warn("no collector known yet: records dropped", "collectors_dns", s.cfg.DNS, "dropped_total", s.unrouted.Load())
	}
}

// Flush seals every member's partly filled messages so they are sent now.
func (s *Sharder) Flush() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	for _, m := range s.all {
		m.snd.Flush()
	}
}

// Run starts every member's exporter, then checks member health every
// Config.CheckInterval (moving shares on failover and back) and resolves
// Config.DNS every Config.DNSInterval, until ctx is done. Each member then
// drains its buffer for at most ipfix.Config.DrainTimeout, all at once;
// Run returns when they are done. It returns an error only if called twice.
func (s *Sharder) Run(ctx context.Context) error {
	if s.started.Swap(true) {
		return errors.New("collector sharding: Run called twice")
	}
	s.runCtx = ctx
	for _, m := range s.all {
		s.start(m)
	}
	defer s.wg.Wait()
	check := time.NewTicker(s.cfg.CheckInterval)
	defer check.Stop()
	var dnsC <-chan time.Time
	retry := dnsRetryMin
	var dns *time.Timer
	if s.cfg.DNS != "" {
		dns = time.NewTimer(s.dnsDelay(&retry))
		defer dns.Stop()
		dnsC = dns.C
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-check.C:
			s.check(s.now())
		case <-dnsC:
			s.resolve(ctx)
			dns.Reset(s.dnsDelay(&retry))
		}
	}
}

// dnsRetryMin is the first retry delay of a resolution while no member is
// known; it doubles up to Config.DNSInterval.
const dnsRetryMin = time.Second

// dnsDelay is the wait before the next resolution.
func (s *Sharder) dnsDelay(retry *time.Duration) time.Duration {
	if len(s.all) > 0 {
		*retry = dnsRetryMin
		return s.cfg.DNSInterval
	}
	d := min(*retry, s.cfg.DNSInterval)
	*retry = min(2**retry, s.cfg.DNSInterval)
	return d
}

// start runs m's exporter under Run's context.
func (s *Sharder) start(m *member) {
	ctx, cancel := context.WithCancel(s.runCtx)
	m.cancel = cancel
	s.wg.Go(func() {
		m.snd.Run(ctx)
		cancel()
		s.retire(m)
	})
}

// retire moves the counters of a removed member, once its exporter has
// stopped, to the totals of retired members.
func (s *Sharder) retire(m *member) {
	s.statsMu.Lock()
	defer s.statsMu.Unlock()
	i := slices.Index(s.leaving, m)
	if i < 0 {
		return // not removed: still counted among the members
	}
	s.leaving = slices.Delete(slices.Clone(s.leaving), i, i+1)
	addStats(&s.retired, m.snd.Stats())
}

// check looks at every member's connection at now: a member disconnected
// for Config.FailoverTimeout is failed over, a failed-over member that is
// connected again gets its share back, and a member out of the DNS answer
// past its grace (see expired) is retired. Run's goroutine only (tests
// call it with their own clock).
func (s *Sharder) check(now time.Time) {
	changed := false
	var kept, removed []*member
	for _, m := range s.all {
		up := m.snd.Stats().Connected
		switch {
		case up:
			m.downSince = time.Time{}
			if m.failed {
				m.failed, changed = false, true
				s.log.Info("collector back: its share of connections returns to it", "collector", m.name)
			}
		case m.downSince.IsZero():
			m.downSince = now
		case !m.failed && now.Sub(m.downSince) >= s.cfg.FailoverTimeout:
			m.failed, changed = true, true
			s.failovers.Add(1)
			s.log.Warn("collector down past the failover timeout: its share of new records moves to the other collectors",
				"collector", m.name, "down_for", now.Sub(m.downSince), "buffered_records", m.snd.Stats().BufferedRecords)
		}
		if !m.goneSince.IsZero() && s.expired(m, now) {
			removed = append(removed, m)
			s.log.Warn("collector out of DNS past the failover timeout: retired, its share moves to the other collectors; its buffered records are sent if it is reachable, else dropped",
				"collector", m.name, "gone_for", now.Sub(m.goneSince), "connected", m.downSince.IsZero(),
				"buffered_records", m.snd.Stats().BufferedRecords)
			continue
		}
		kept = append(kept, m)
	}
	if len(removed) > 0 {
		s.change(kept, nil, removed) // routes kept, so also what changed above
		return
	}
	if changed {
		s.mu.Lock()
		s.route = routable(s.all)
		s.mu.Unlock()
	}
}

// routable returns the members not failed over, or all of them when every
// one is.
func routable(all []*member) []*member {
	var out []*member
	for _, m := range all {
		if !m.failed {
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		return all
	}
	return out
}

// setMembers makes names (normalised and sorted) the member set: new
// members are built (and started when Run runs). The others are removed
// at once (a static list), or, with grace (a DNS answer), kept with their
// share and buffer like a member that is down, until the next check after
// they expired retires them; one back in names before that is simply kept.
// It returns the errors of members that could not be built; the others
// are in place.
func (s *Sharder) setMembers(names []string, grace bool) error {
	now := s.now()
	var next, added, removed, left, back []*member
	var errs []error
	// An answer that both drops and adds addresses is a replacement (a
	// collector pod recreated under a new address): the dropped ones will
	// not come back at that address, so keeping their share for the
	// failover timeout would only buffer records for nobody. They go at
	// once (draining what they hold, as any removed member).
	replaced := slices.ContainsFunc(names, func(n string) bool {
		return !slices.ContainsFunc(s.all, func(m *member) bool { return m.name == n })
	})
	for _, m := range s.all {
		switch {
		case slices.Contains(names, m.name):
			if !m.goneSince.IsZero() {
				m.goneSince, back = time.Time{}, append(back, m)
			}
			next = append(next, m)
		case !grace || replaced:
			removed = append(removed, m)
		default: // retired by check when expired
			if m.goneSince.IsZero() {
				m.goneSince, left = now, append(left, m)
			}
			next = append(next, m)
		}
	}
	for _, n := range names {
		if slices.ContainsFunc(s.all, func(m *member) bool { return m.name == n }) {
			continue
		}
		m, err := s.newMember(n)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		next, added = append(next, m), append(added, m)
	}
	slices.SortFunc(next, func(a, b *member) int { return strings.Compare(a.name, b.name) })
	if len(added) > 0 || len(removed) > 0 {
		s.change(next, added, removed)
	} else {
		s.gone.Store(int64(countGone(next)))
	}
	if len(added)+len(removed)+len(left)+len(back) > 0 {
		s.log.Info("collectors changed", "collectors", names, "added", memberList(added), "removed", memberList(removed),
			"left_dns", memberList(left), "back_in_dns", memberList(back), "failover_timeout", s.cfg.FailoverTimeout)
	}
	return errors.Join(errs...)
}

// expired reports whether m, out of the DNS answer, has waited its grace:
// Config.FailoverTimeout since it left the answer or, if earlier, since it
// went down (as last checked).
func (s *Sharder) expired(m *member, now time.Time) bool {
	since := m.goneSince
	if !m.downSince.IsZero() && m.downSince.Before(since) {
		since = m.downSince
	}
	return now.Sub(since) >= s.cfg.FailoverTimeout
}

// change makes next (sorted by name) the members: added ones are started
// if Run runs, removed ones stop routing at once, then drain their buffers
// for at most ipfix.Config.DrainTimeout (what is left is counted as
// dropped) and are retired.
func (s *Sharder) change(next, added, removed []*member) {
	// Both under statsMu, so Stats counts a removed member exactly once.
	s.statsMu.Lock()
	s.mu.Lock()
	s.all, s.route = next, routable(next)
	s.mu.Unlock()
	s.leaving = append(slices.Clone(s.leaving), removed...)
	s.statsMu.Unlock()
	s.gone.Store(int64(countGone(next)))
	for _, m := range added {
		if s.runCtx != nil {
			s.start(m)
		}
	}
	for _, m := range removed {
		if m.cancel != nil {
			m.cancel() // drains, then retires
		} else {
			s.retire(m)
		}
	}
}

// countGone is the number of ms out of the DNS answer.
func countGone(ms []*member) int {
	n := 0
	for _, m := range ms {
		if !m.goneSince.IsZero() {
			n++
		}
	}
	return n
}

func memberList(ms []*member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.name
	}
	return out
}

// newMember builds the exporter of member name. A new member counts as
// down since now until it connects, so one that never does is failed over
// after the timeout like one that went away.
func (s *Sharder) newMember(name string) (*member, error) {
	c := s.cfg.IPFIX
	c.Address = name
	c.Logger = s.log.With("collector", name)
	snd, err := s.newSender(c)
	if err != nil {
		return nil, fmt.Errorf("collector %s: %w", name, err)
	}
	return &member{name: name, seed: nameHash(name), snd: snd, downSince: s.now()}, nil
}

// resolve looks Config.DNS up and makes its addresses the member set. A
// failed or empty resolution keeps the members and is logged and counted.
func (s *Sharder) resolve(ctx context.Context) {
	host, port, _ := net.SplitHostPort(s.cfg.DNS)
	network, _ := s.cfg.network()
	ctx, cancel := context.WithTimeout(ctx, dnsTimeout)
	defer cancel()
	addrs, err := s.lookup(ctx, network, host)
	var names []string
	for _, a := range addrs {
		a = a.Unmap()
		if (network == "ip4" && !a.Is4()) || (network == "ip6" && !a.Is6()) {
			continue
		}
		names = append(names, net.JoinHostPort(a.String(), port))
	}
	if err == nil && len(names) == 0 {
		err = errors.New("no address")
	}
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return // shutting down
		}
		s.dnsErrors.Add(1)
		s.log.Warn("collectors DNS resolution failed; keeping the last collectors", "name", s.cfg.DNS,
			"collectors", len(s.all), "err", err)
		return
	}
	names, _ = memberNames(names) // IP literals: cannot fail
	if err := s.setMembers(names, true); err != nil {
		s.log.Warn("collectors DNS resolution: some collectors could not be set up", "name", s.cfg.DNS, "err", err)
	}
}

// Stats returns the counters summed over every member, present and
// removed; BufferedRecords and BufferedBytes are those of the present and
// draining ones. Connected reports whether every member is connected.
func (s *Sharder) Stats() ipfix.Stats {
	s.statsMu.Lock()
	s.mu.RLock()
	all := s.all
	s.mu.RUnlock()
	total, leaving := s.retired, s.leaving
	s.statsMu.Unlock()
	total.Connected = len(all) > 0
	for _, m := range all {
		st := m.snd.Stats()
		addStats(&total, st)
		total.Connected = total.Connected && st.Connected
	}
	for _, m := range leaving {
		addStats(&total, m.snd.Stats())
	}
	return total
}

// addStats adds the counters of s to t (Connected is left alone).
func addStats(t *ipfix.Stats, s ipfix.Stats) {
	t.Connects += s.Connects
	t.Reconnects += s.Reconnects
	t.DialFailures += s.DialFailures
	t.Disconnects += s.Disconnects
	t.Messages += s.Messages
	t.Bytes += s.Bytes
	t.Records[0] += s.Records[0]
	t.Records[1] += s.Records[1]
	t.BufferedRecords += s.BufferedRecords
	t.BufferedBytes += s.BufferedBytes
	t.DroppedBufferFull += s.DroppedBufferFull
	t.DroppedShutdown += s.DroppedShutdown
	t.DroppedInvalid += s.DroppedInvalid
	t.DroppedOversize += s.DroppedOversize
	t.RetriedRecords += s.RetriedRecords
}
