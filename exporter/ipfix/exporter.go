// Package ipfix ships flow records to an IPFIX collector (RFC 7011) over
// TCP, UDP or TLS, encoded with the shared mapping of flow/ipfix: one
// template per IP family, many records per message.
//
// Export never blocks on the network: records are encoded at once into a
// bounded buffer of messages, and Run sends them. When the collector is
// unreachable, Run keeps reconnecting with exponential backoff and the
// buffer keeps the newest records: past Config.BufferBytes the oldest
// messages are dropped and counted. A message whose write fails is sent
// again on the next connection; one the collector accepted into its socket
// but never read is lost (IPFIX has no acknowledgements).
//
// Run logs the first failure of an outage at once, then a summary (failed
// attempts, records dropped and retried) at most once a minute, and one
// line when the connection is back; the counters are in Stats.
//
// Memory is bounded by BufferBytes plus three messages (one being filled per
// family, one being written). A record that cannot fit in a message of
// Config.MaxMessageSize on its own (long strings) is dropped and counted:
// the 16-bit message length could not describe it.
package ipfix

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

// Template IDs of the two families. They are fixed, so a collector that
// restarts mid-session can still match data sets to the templates that are
// resent on the next connection.
const (
	TemplateIPv4 uint16 = fipfix.MinDataSetID
	TemplateIPv6 uint16 = fipfix.MinDataSetID + 1
)

// headerLen is the message and set header in front of every data set.
const headerLen = fipfix.MessageHeaderLen + fipfix.SetHeaderLen

// message is one encoded data message: header space, then records of one
// family.
type message struct {
	fam     int // 0 IPv4, 1 IPv6
	buf     []byte
	records int
}

// Stats are the exporter's counters since New.
type Stats struct {
	Connected    bool
	Connects     uint64    // successful connections
	Reconnects   uint64    // connection attempts after the first
	DialFailures uint64    // failed connection attempts
	Disconnects  uint64    // established connections lost (write error, collector closed)
	Messages     uint64    // data messages written
	Bytes        uint64    // bytes written, templates included
	Records      [2]uint64 // records written per family (0 IPv4, 1 IPv6)
	// BufferedRecords and BufferedBytes are waiting for the collector.
	BufferedRecords int
	BufferedBytes   int
	// Records dropped, by reason.
	DroppedBufferFull uint64 // oldest messages evicted from the full buffer
	DroppedShutdown   uint64 // still buffered when the drain timeout expired
	DroppedInvalid    uint64 // record with neither an IPv4 nor an IPv6 source
	DroppedOversize   uint64 // record larger than a whole message (Config.MaxMessageSize)
	// RetriedRecords counts records of messages whose write failed, put
	// back at the head of the buffer for the next connection.
	RetriedRecords uint64
}

// Exporter buffers and sends records. Export is safe for concurrent use;
// Run must be called once.
type Exporter struct {
	cfg  Config
	tls  *tls.Config
	encs [2]*fipfix.Encoder
	// templates holds the two template messages' sets (no message header).
	templates [2][]byte

	mu       sync.Mutex
	open     [2]*message // being filled, per family
	queue    []*message  // sealed, oldest first
	queued   int         // bytes in queue
	queuedN  int         // records in queue
	free     []*message  // recycled buffers
	scratch  []byte
	stats    Stats
	wake     chan struct{} // cap 1: queue went non-empty
	started  atomic.Bool
	dropHook func(n int) // tests
	link     *linkLog    // Run's goroutine only
}

// maxFree is how many sent message buffers are kept for reuse.
const maxFree = 8

// New checks cfg (after SetDefaults), loads the TLS files and returns an
// exporter ready to buffer records; nothing is sent before Run.
func New(cfg Config) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("ipfix exporter: %w", err)
	}
	log := cmp.Or(cfg.Logger, slog.Default())
	e := &Exporter{cfg: cfg, wake: make(chan struct{}, 1), link: newLinkLog(log, cfg)}
	if cfg.Transport == TLS {
		t, err := cfg.tlsConfig()
		if err != nil {
			return nil, err
		}
		e.tls = t
	}
	for i, v := range []uint8{4, 6} {
		enc, err := fipfix.NewEncoder(v, TemplateIPv4+uint16(i))
		if err != nil {
			return nil, err
		}
		e.encs[i] = enc
		e.templates[i] = enc.AppendTemplateSet(nil)
	}
	return e, nil
}

// Export encodes recs into the buffer and returns without waiting for the
// network. Records are sent within Config.FlushInterval, or sooner when a
// message fills up. A record whose encoding does not fit in an empty
// message is dropped (Stats.DroppedOversize).
func (e *Exporter) Export(recs []flow.Record) {
	if len(recs) == 0 {
		return
	}
	e.mu.Lock()
	sealed := false
	for i := range recs {
		r := &recs[i]
		var fam int
		switch flow.Version(r.SrcAddr) {
		case 4:
			fam = 0
		case 6:
			fam = 1
		default:
			e.stats.DroppedInvalid++
			continue
		}
		e.scratch = e.encs[fam].AppendRecord(e.scratch[:0], r)
		if headerLen+len(e.scratch) > e.cfg.MaxMessageSize {
			e.stats.DroppedOversize++
			continue
		}
		m := e.open[fam]
		if m != nil && len(m.buf)+len(e.scratch) > e.cfg.MaxMessageSize {
			e.seal(fam)
			sealed = true
			m = nil
		}
		if m == nil {
			m = e.newMessage(fam)
			e.open[fam] = m
		}
		m.buf = append(m.buf, e.scratch...)
		m.records++
	}
	e.mu.Unlock()
	if sealed {
		e.signal()
	}
}

// Flush seals the partly filled messages so Run sends them now.
func (e *Exporter) Flush() {
	e.mu.Lock()
	sealed4 := e.seal(0)
	sealed6 := e.seal(1)
	sealed := sealed4 || sealed6
	e.mu.Unlock()
	if sealed {
		e.signal()
	}
}

func (e *Exporter) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

func (e *Exporter) newMessage(fam int) *message {
	if n := len(e.free); n > 0 {
		m := e.free[n-1]
		e.free = e.free[:n-1]
		m.fam, m.buf, m.records = fam, m.buf[:headerLen], 0
		return m
	}
	return &message{fam: fam, buf: make([]byte, headerLen, e.cfg.MaxMessageSize)}
}

// seal moves the open message of fam to the queue, evicting the oldest
// messages when the buffer is full. It reports whether it sealed anything.
// e.mu must be held.
func (e *Exporter) seal(fam int) bool {
	m := e.open[fam]
	if m == nil || m.records == 0 {
		return false
	}
	e.open[fam] = nil
	e.push(m)
	return true
}

// push appends m to the queue and evicts from the head past the bound.
func (e *Exporter) push(m *message) {
	e.queue = append(e.queue, m)
	e.queued += len(m.buf)
	e.queuedN += m.records
	e.evict()
}

// pushFront puts back a message whose write failed, to be sent first.
func (e *Exporter) pushFront(m *message) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.queue = append(e.queue, nil)
	copy(e.queue[1:], e.queue)
	e.queue[0] = m
	e.queued += len(m.buf)
	e.queuedN += m.records
	e.stats.RetriedRecords += uint64(m.records)
	e.evict()
}

func (e *Exporter) evict() {
	for e.queued > e.cfg.BufferBytes && len(e.queue) > 0 {
		old := e.queue[0]
		e.queue[0] = nil
		e.queue = e.queue[1:]
		e.queued -= len(old.buf)
		e.queuedN -= old.records
		e.stats.DroppedBufferFull += uint64(old.records)
		if e.dropHook != nil {
			e.dropHook(old.records)
		}
		e.recycle(old)
	}
}

func (e *Exporter) recycle(m *message) {
	if len(e.free) < maxFree && cap(m.buf) == e.cfg.MaxMessageSize {
		e.free = append(e.free, m)
	}
}

// pop takes the oldest sealed message, or nil.
func (e *Exporter) pop() *message {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.queue) == 0 {
		return nil
	}
	m := e.queue[0]
	e.queue[0] = nil
	e.queue = e.queue[1:]
	e.queued -= len(m.buf)
	e.queuedN -= m.records
	return m
}

// Stats returns a snapshot of the counters.
func (e *Exporter) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.stats
	s.BufferedRecords, s.BufferedBytes = e.queuedN, e.queued
	for _, m := range e.open {
		if m != nil {
			s.BufferedRecords += m.records
			s.BufferedBytes += len(m.buf)
		}
	}
	return s
}

func (e *Exporter) count(f func(s *Stats)) {
	e.mu.Lock()
	f(&e.stats)
	e.mu.Unlock()
}

// Run connects to the collector and sends buffered records until ctx is
// done, reconnecting with backoff whenever the connection fails. After ctx
// is done it seals what is buffered and keeps sending for at most
// Config.DrainTimeout (on the current connection, or on a new one if it was
// down), counts what is left as dropped, closes the connection and returns
// nil. It returns an error only if called twice.
func (e *Exporter) Run(ctx context.Context) error {
	if e.started.Swap(true) {
		return errors.New("ipfix exporter: Run called twice")
	}
	flush := time.NewTicker(e.cfg.FlushInterval)
	defer flush.Stop()
	defer e.dropRest()
	backoff := e.cfg.BackoffMin
	e.link.start(time.Now())
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			// Down at shutdown: one last try within the drain timeout.
			dctx, cancel := context.WithTimeout(context.Background(), e.cfg.DrainTimeout)
			defer cancel()
			if nc, err := e.dial(dctx); err == nil {
				e.drain(dctx, &conn{Conn: nc})
				nc.Close()
			}
			return nil
		}
		if attempt > 0 {
			e.count(func(s *Stats) { s.Reconnects++ })
		}
		nc, err := e.dial(ctx)
		if err != nil {
			e.count(func(s *Stats) { s.DialFailures++ })
			if ctx.Err() == nil {
				e.link.failed(time.Now(), err, e.Stats())
			}
			sleep(ctx, jitter(backoff), flush, e.Flush)
			backoff = min(2*backoff, e.cfg.BackoffMax)
			continue
		}
		backoff = e.cfg.BackoffMin
		err = e.session(ctx, nc, flush)
		nc.Close()
		e.count(func(s *Stats) { s.Connected = false })
		if err == nil {
			return nil // drained on this connection
		}
		e.count(func(s *Stats) { s.Disconnects++ })
		e.link.failed(time.Now(), err, e.Stats())
		sleep(ctx, jitter(backoff), flush, e.Flush)
	}
}

// jitter spreads reconnects of many exporters over ±20%.
func jitter(d time.Duration) time.Duration {
	return d + time.Duration((rand.Float64()*0.4-0.2)*float64(d))
}

// sleep waits d or until ctx is done, sealing partly filled messages on
// every flush tick so the buffer bound applies to them too.
func sleep(ctx context.Context, d time.Duration, flush *time.Ticker, onTick func()) {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			return
		case <-flush.C:
			onTick()
		}
	}
}

func (e *Exporter) dial(ctx context.Context) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.DialTimeout)
	defer cancel()
	switch e.cfg.Transport {
	case TLS:
		d := tls.Dialer{Config: e.tls}
		return d.DialContext(ctx, "tcp", e.cfg.Address)
	default:
		var d net.Dialer
		return d.DialContext(ctx, e.cfg.Transport, e.cfg.Address)
	}
}

// conn is one transport session: sequence numbers restart at 0.
type conn struct {
	net.Conn
	seq      uint32
	dead     chan struct{} // closed when the collector closed or reset the connection
	lastTmpl time.Time
	buf      []byte

	mu       sync.Mutex // orders the write deadline changes of write and of the shutdown
	deadline time.Time  // of the write in flight
	drainBy  time.Time  // zero until the shutdown; then no write outlasts it
}

// setWriteDeadline sets the deadline of the next write to d, or to the
// drain deadline when that is sooner.
func (c *conn) setWriteDeadline(d time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.drainBy.IsZero() && c.drainBy.Before(d) {
		d = c.drainBy
	}
	c.deadline = d
	c.SetWriteDeadline(d)
}

// drainUntil sets the drain deadline to by, unless one is set already that
// is sooner, cuts a write in flight short to it, and returns it.
func (c *conn) drainUntil(by time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.drainBy.IsZero() || by.Before(c.drainBy) {
		c.drainBy = by
	}
	if c.deadline.IsZero() || c.drainBy.Before(c.deadline) {
		c.deadline = c.drainBy
		c.SetWriteDeadline(c.drainBy)
	}
	return c.drainBy
}

// session sends until the connection fails (error) or ctx is done, when it
// drains the buffer on the connection and returns nil.
func (e *Exporter) session(ctx context.Context, nc net.Conn, flush *time.Ticker) error {
	c := &conn{Conn: nc, dead: make(chan struct{})}
	// The collector never talks back: a read returns only when it closes
	// or resets the connection (or, over UDP, when ICMP reports it gone).
	// Noticing that early keeps us from writing more messages into a dead
	// socket.
	go func() {
		io.Copy(io.Discard, nc)
		close(c.dead)
	}()
	// The drain timeout runs from the moment ctx is done, even through a
	// write a slow collector holds up then.
	stop := context.AfterFunc(ctx, func() { c.drainUntil(time.Now().Add(e.cfg.DrainTimeout)) })
	defer stop()
	if err := e.sendTemplates(c); err != nil {
		return err
	}
	e.count(func(s *Stats) { s.Connected = true; s.Connects++ })
	e.link.connected(time.Now())
	for {
		e.link.tick(time.Now(), e.Stats())
		if err := e.sendQueued(ctx, c); err != nil {
			if ctx.Err() != nil {
				return nil // the drain deadline cut the write: no time left
			}
			return err
		}
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithDeadline(context.Background(), c.drainUntil(time.Now().Add(e.cfg.DrainTimeout)))
			defer cancel()
			e.drain(dctx, c)
			return nil
		case <-c.dead:
			return errors.New("collector closed the connection")
		case <-e.wake:
		case <-flush.C:
			e.Flush()
			if e.cfg.Transport == UDP && time.Since(c.lastTmpl) >= e.cfg.TemplateRefresh {
				if err := e.sendTemplates(c); err != nil {
					return err
				}
			}
		}
	}
}

var zeroHeader [fipfix.MessageHeaderLen]byte

func (e *Exporter) sendTemplates(c *conn) error {
	for _, set := range e.templates {
		c.buf = append(c.buf[:0], zeroHeader[:]...)
		c.buf = append(c.buf, set...)
		fipfix.PutMessageHeader(c.buf, time.Now(), c.seq, e.cfg.ObservationDomainID)
		if err := e.write(c, c.buf); err != nil {
			return fmt.Errorf("send template: %w", err)
		}
	}
	c.lastTmpl = time.Now()
	return nil
}

// sendQueued writes every queued message, or stops early and returns nil
// when ctx is done (what is left stays queued). A message whose write
// fails goes back to the head of the queue.
func (e *Exporter) sendQueued(ctx context.Context, c *conn) error {
	for {
		select {
		case <-c.dead:
			return errors.New("collector closed the connection")
		case <-ctx.Done():
			return nil
		default:
		}
		m := e.pop()
		if m == nil {
			return nil
		}
		fipfix.PutSetHeader(m.buf[fipfix.MessageHeaderLen:], e.encs[m.fam].TemplateID())
		fipfix.PutMessageHeader(m.buf, time.Now(), c.seq, e.cfg.ObservationDomainID)
		if err := e.write(c, m.buf); err != nil {
			e.pushFront(m)
			return fmt.Errorf("send data: %w", err)
		}
		c.seq += uint32(m.records)
		e.mu.Lock()
		e.stats.Messages++
		e.stats.Records[m.fam] += uint64(m.records)
		e.recycle(m)
		e.mu.Unlock()
	}
}

// write writes b within Config.WriteTimeout, and never past the drain
// deadline.
func (e *Exporter) write(c *conn, b []byte) error {
	c.setWriteDeadline(time.Now().Add(e.cfg.WriteTimeout))
	n, err := c.Write(b)
	e.count(func(s *Stats) { s.Bytes += uint64(n) })
	return err
}

// drain seals and sends what is buffered on c until done or ctx ends, then
// closes c's write side in order so the collector reads everything. What
// is left when ctx ends stays buffered (for dropRest), however fast the
// collector reads.
func (e *Exporter) drain(ctx context.Context, c *conn) {
	e.Flush()
	if d, ok := ctx.Deadline(); ok {
		c.drainUntil(d)
	}
	stop := context.AfterFunc(ctx, func() {
		c.drainUntil(time.Now()) // unblock a write stuck past the deadline
	})
	defer stop()
	if c.dead == nil {
		c.dead = make(chan struct{}) // a fresh connection: templates first
		if e.sendTemplates(c) != nil {
			return
		}
	}
	if e.sendQueued(ctx, c) != nil || ctx.Err() != nil {
		return
	}
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
}

// dropRest counts what is still buffered when Run returns as dropped.
func (e *Exporter) dropRest() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range e.queue {
		e.stats.DroppedShutdown += uint64(m.records)
	}
	for fam, m := range e.open {
		if m != nil {
			e.stats.DroppedShutdown += uint64(m.records)
			e.open[fam] = nil
		}
	}
	e.queue, e.queued, e.queuedN = nil, 0, 0
}
