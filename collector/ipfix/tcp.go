package ipfix

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"github.com/dualflow/dualflow/collector/pipeline"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

// tcpReadBuffer is the framer's buffer: one maximum-size message. Every
// session holds one, so it stays small (1,500 sessions with 256 KiB each
// took 375 MB); at full rate one read still brings many messages.
const tcpReadBuffer = 64 << 10

// errFraming means a message header cannot be trusted: on a stream there
// is no way to find the next message, so the session must end. The framer
// returns it as a *badHeader.
var errFraming = errors.New("ipfix stream framing lost")

// badHeader is a message header a stream cannot be framed by: a version
// other than IPFIX's (NetFlow v9 and v5 have no length field) or a length
// below the header's.
type badHeader struct {
	version uint16
	length  int
}

func (e *badHeader) Error() string {
	if e.netflow() {
		return fmt.Sprintf("%v: NetFlow v%d over a stream (NetFlow has no length field)", errFraming, e.version)
	}
	return fmt.Sprintf("%v: version %d, length %d", errFraming, e.version, e.length)
}

func (e *badHeader) Is(target error) bool { return target == errFraming }

// netflow reports whether the header is NetFlow's.
func (e *badHeader) netflow() bool { return e.version == 9 || e.version == 5 }

// reason is the drop reason of the message: version for another protocol
// (as for a datagram), length for an IPFIX header shorter than itself.
func (e *badHeader) reason() Reason {
	if e.version != fipfix.Version {
		return ReasonVersion
	}
	return ReasonLength
}

// errIdle and errSlowMessage end a session whose exporter sent no message
// for the idle timeout, or did not finish a message within the message
// timeout after its header.
var (
	errIdle        = errors.New("ipfix session idle")
	errSlowMessage = errors.New("ipfix message not completed in time")
)

// deadliner is the part of net.Conn the framer bounds its reads with.
type deadliner interface{ SetReadDeadline(time.Time) error }

// framer cuts a TCP/TLS stream into IPFIX messages using the length field
// of each message header. With a deadliner, waiting for a message header
// is bounded by idle after active (the last message with a valid set: bare
// headers do not hold the session) and the rest of a message by message.
type framer struct {
	r             *bufio.Reader
	prev          int // length of the message returned last, discarded on next
	d             deadliner
	idle, message time.Duration
	active        time.Time
}

func newFramer(c io.Reader) *framer {
	return &framer{r: bufio.NewReaderSize(c, tcpReadBuffer)}
}

// deadline bounds the reads that may follow by at when fewer than n bytes
// are buffered.
func (f *framer) deadline(n int, at time.Time) {
	if f.d != nil && f.r.Buffered() < n {
		f.d.SetReadDeadline(at)
	}
}

// next returns the next message; it is valid until the following call. A
// header with the wrong version or a length below the header size returns
// a *badHeader (errFraming); a read that hits a deadline returns errIdle or
// errSlowMessage.
func (f *framer) next() ([]byte, error) {
	if f.prev > 0 {
		f.r.Discard(f.prev)
		f.prev = 0
	}
	if f.idle > 0 {
		f.deadline(4, f.active.Add(f.idle))
	}
	h, err := f.r.Peek(4)
	if err != nil {
		if isTimeout(err) {
			err = fmt.Errorf("%w: %w", errIdle, err)
		}
		return nil, err
	}
	l := int(binary.BigEndian.Uint16(h[2:]))
	if v := binary.BigEndian.Uint16(h); v != fipfix.Version || l < fipfix.MessageHeaderLen {
		return nil, &badHeader{version: v, length: l}
	}
	if f.message > 0 {
		f.deadline(l, time.Now().Add(f.message))
	}
	m, err := f.r.Peek(l)
	if err != nil {
		switch {
		case errors.Is(err, io.EOF):
			err = io.ErrUnexpectedEOF
		case isTimeout(err):
			err = fmt.Errorf("%w: %w", errSlowMessage, err)
		}
		return nil, err
	}
	f.prev = l
	return m, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ready reports whether the next message is already buffered, so reading
// it will not block.
func (f *framer) ready() bool {
	n := f.r.Buffered() - f.prev
	if n < 4 {
		return false
	}
	h, _ := f.r.Peek(f.prev + 4)
	return n >= int(binary.BigEndian.Uint16(h[f.prev+2:]))
}

func (l *Listener) accept(ctx context.Context, ln net.Listener, tr Transport, conns *connSet, wg interface{ Go(func()) }) {
	var delay time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Temporary failure (EMFILE...): back off like net/http.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			l.log.Warn("ipfix accept", "transport", tr, "err", err)
			time.Sleep(delay)
			continue
		}
		delay = 0
		// Counted before the close: a client that sees its connection
		// closed sees the refusal counted.
		if src := addrOfNet(c.RemoteAddr()); !l.cfg.AllowedSources.Allows(src) {
			l.m.dropped[ReasonSourceNotAllowed].Inc()
			l.m.closed.WithLabelValues(tr.String(), "source_not_allowed").Inc()
			c.Close() // before the TLS handshake, before any byte is read
			l.warns.Warn("source_not_allowed", src, "ipfix connection from a source outside --collector.ipfix.allowed-sources refused (one line per source a minute; see dualflow_ipfix_sessions_closed_total)",
				"transport", tr.String(), "remote", c.RemoteAddr())
			continue
		}
		ci, refused := conns.add(c, time.Now())
		if refused != admitted {
			l.m.dropped[ReasonTooManySessions].Inc()
			l.m.closed.WithLabelValues(tr.String(), refused.String()).Inc()
			c.Close()
			// One line a minute per reason, whatever the number of sources:
			// a flood of connections costs no more.
			l.warns.Warn("refused_"+refused.String(), netip.Addr{}, "ipfix connection refused: no session may give its place (one line a minute per reason; see dualflow_ipfix_sessions_closed_total)",
				"transport", tr.String(), "remote", c.RemoteAddr(), "reason", refused.String(), "max_sessions", l.cfg.MaxSessions,
				"max_sessions_per_source", l.cfg.MaxSessionsPerSource, "max_sessions_per_prefix", l.cfg.MaxSessionsPerPrefix)
			continue
		}
		wg.Go(func() { l.serveConn(ctx, ci, tr, conns) })
	}
}

// serveConn decodes one TCP or TLS session of conns until it ends.
func (l *Listener) serveConn(ctx context.Context, ci *connInfo, tr Transport, conns *connSet) {
	c := ci.conn
	// Last, once the final batch is handed on: the place in conns is given
	// back before the exporter can see the close (see connSet.add).
	defer func() {
		conns.remove(ci)
		c.Close()
	}()
	t := tr.String()
	l.m.sessions.WithLabelValues(t).Inc()
	defer l.m.sessions.WithLabelValues(t).Dec()
	if tc, ok := c.(*tls.Conn); ok {
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			l.m.closed.WithLabelValues(t, "tls_handshake").Inc()
			l.warns.Warn("tls_handshake", ci.src, "ipfix tls handshake failed (one line per source a minute; see dualflow_ipfix_sessions_closed_total)",
				"remote", c.RemoteAddr(), "err", err)
			return
		}
	}
	remote, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	s := NewSession(remote, tr, l.cfg.Limits)
	l.m.newExporter(tr, remote.Addr().Unmap())
	defer s.Close()
	d := l.newDecoder()
	var prev Stats
	f := newFramer(c)
	f.d, f.idle, f.message, f.active = ci, l.cfg.IdleTimeout, l.cfg.MessageTimeout, time.Now()
	// A batch is held only while messages are being decoded: an idle
	// session holds none (1,500 sessions each holding a 1.5 MB batch took
	// the collector past 2 GB).
	var b *pipeline.Batch
	msgs := 0 // messages with records in b
	defer func() {
		if b != nil && !l.handOn(ctx, b, tr, msgs) {
			b.Release()
		}
		l.m.flush(tr, d, &prev, l.log)
	}()
	for {
		msg, err := f.next()
		if err != nil {
			reason := "error"
			var bad *badHeader
			switch {
			case errors.Is(err, io.EOF) && ctx.Err() == nil:
				reason = "eof"
			case errors.As(err, &bad):
				reason = "bad_framing"
				d.Stats.Messages++
				d.Stats.Dropped[bad.reason()]++
				if bad.netflow() {
					l.warns.Warn("netflow_over_tcp", ci.src, "ipfix session closed: NetFlow over TCP (or TLS) cannot be framed, NetFlow has no length field: send it over UDP (one line per source a minute; see dualflow_ipfix_messages_dropped_total{reason=\"version\"})",
						"transport", t, "remote", remote, "version", bad.version)
					break
				}
				l.warns.Warn("bad_framing", ci.src, "ipfix session closed: bad message header (one line per source a minute; see dualflow_ipfix_sessions_closed_total)",
					"transport", t, "remote", remote, "version", bad.version, "length", bad.length)
			case ctx.Err() != nil:
				reason = "shutdown"
			case ci.evicted.Load() != 0:
				reason = "evicted"
				l.warns.Warn("evicted", netip.Addr{}, "ipfix session evicted for a new connection: it delivered under one record a minute (one line a minute; see dualflow_ipfix_sessions_closed_total)",
					"transport", t, "remote", remote, "limit", refusal(ci.evicted.Load()).String(), "records", s.Records)
			case errors.Is(err, errIdle):
				reason = "idle"
			case errors.Is(err, errSlowMessage):
				reason = "slow_message"
				l.warns.Warn("slow_message", ci.src, "ipfix session closed: a message did not complete in time (one line per source a minute; see dualflow_ipfix_sessions_closed_total)",
					"transport", t, "remote", remote, "timeout", l.cfg.MessageTimeout)
			}
			l.m.closed.WithLabelValues(t, reason).Inc()
			return
		}
		now := time.Now()
		if b == nil {
			b = l.pool.Get()
		}
		had, active, recs := len(b.Recs), s.Active, s.Records
		if b.Recs, err = d.Decode(s, msg, now, b.Recs); err != nil {
			l.warnDropped(tr, remote, err)
		}
		l.warnStamped(tr, remote, d)
		if !s.Active.Equal(active) { // a valid set: the session earns its place
			ci.useful(now, s.Records-recs)
			f.active = now
		}
		if len(b.Recs) > had {
			msgs++
		}
		if idle := !f.ready(); len(b.Recs) >= l.cfg.BatchRecords || idle {
			if l.handOn(ctx, b, tr, msgs) {
				b = nil // the queue has it; the next message takes a batch
			} else if idle { // the next read may wait: hold no batch
				b.Release()
				b = nil
			}
			msgs = 0
			l.m.flush(tr, d, &prev, l.log)
		}
	}
}

// warnDropped logs a message the decoder dropped, at most once a minute per
// source with the number held back; dualflow_ipfix_messages_dropped_total
// counts them all.
func (l *Listener) warnDropped(tr Transport, remote netip.AddrPort, err error) {
	l.warns.Warn("malformed", remote.Addr().Unmap(), "ipfix message dropped (one line per source a minute; see dualflow_ipfix_messages_dropped_total)",
		"transport", tr.String(), "remote", remote, "err", err)
}
