package ipfix

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/netip"
	"time"

	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

// tcpReadBuffer is the framer's buffer: several maximum-size messages, so
// one read syscall brings many messages at full rate.
const tcpReadBuffer = 256 << 10

// errFraming means a message header cannot be trusted: on a stream there
// is no way to find the next message, so the session must end.
var errFraming = errors.New("ipfix stream framing lost")

// framer cuts a TCP/TLS stream into IPFIX messages using the length field
// of each message header.
type framer struct {
	r    *bufio.Reader
	prev int // length of the message returned last, discarded on next
}

func newFramer(c io.Reader) *framer {
	return &framer{r: bufio.NewReaderSize(c, tcpReadBuffer)}
}

// next returns the next message; it is valid until the following call. A
// header with the wrong version or a length below the header size returns
// errFraming.
func (f *framer) next() ([]byte, error) {
	if f.prev > 0 {
		f.r.Discard(f.prev)
		f.prev = 0
	}
	h, err := f.r.Peek(4)
	if err != nil {
		return nil, err
	}
	l := int(binary.BigEndian.Uint16(h[2:]))
	if binary.BigEndian.Uint16(h) != fipfix.Version || l < fipfix.MessageHeaderLen {
		return nil, errFraming
	}
	m, err := f.r.Peek(l)
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	f.prev = l
	return m, nil
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
		if !conns.add(c, l.cfg.MaxSessions) {
			c.Close()
			l.m.dropped[ReasonTooManySessions].Inc()
			l.m.closed.WithLabelValues(tr.String(), "limit").Inc()
			continue
		}
		wg.Go(func() {
			defer conns.remove(c)
			l.serveConn(ctx, c, tr)
		})
	}
}

// serveConn decodes one TCP or TLS session until it ends.
func (l *Listener) serveConn(ctx context.Context, c net.Conn, tr Transport) {
	defer c.Close()
	t := tr.String()
	l.m.sessions.WithLabelValues(t).Inc()
	defer l.m.sessions.WithLabelValues(t).Dec()
	if tc, ok := c.(*tls.Conn); ok {
		hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			l.m.closed.WithLabelValues(t, "tls_handshake").Inc()
			l.log.Warn("ipfix tls handshake", "remote", c.RemoteAddr(), "err", err)
			return
		}
	}
	remote, _ := netip.ParseAddrPort(c.RemoteAddr().String())
	s := NewSession(remote, tr, l.cfg.Limits)
	d := NewDecoder()
	d.Direction = l.cfg.Direction
	var prev Stats
	f := newFramer(c)
	b := l.pool.Get()
	defer func() {
		l.deliver(ctx, b, tr).Release()
		l.m.flush(tr, d, &prev, l.log)
	}()
	for {
		msg, err := f.next()
		if err != nil {
			reason := "error"
			switch {
			case errors.Is(err, io.EOF):
				reason = "eof"
			case errors.Is(err, errFraming):
				reason = "bad_framing"
				d.Stats.Messages++
				d.Stats.Dropped[ReasonLength]++
				l.log.Warn("ipfix session closed: bad message header", "remote", remote)
			case ctx.Err() != nil:
				reason = "shutdown"
			}
			l.m.closed.WithLabelValues(t, reason).Inc()
			return
		}
		b.Recs, _ = d.Decode(s, msg, time.Now(), b.Recs)
		if len(b.Recs) >= l.cfg.BatchRecords || !f.ready() {
			b = l.deliver(ctx, b, tr)
			l.m.flush(tr, d, &prev, l.log)
		}
	}
}
