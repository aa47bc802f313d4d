package ipfix

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"time"

	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

// datagram is one received UDP datagram.
type datagram struct {
	buf  []byte // MaxMessageLen bytes, owned by the reader
	n    int
	from netip.AddrPort
}

// udpReader reads datagrams in batches. drops is the kernel's cumulative
// count of datagrams dropped on the socket, when the platform reports it.
type udpReader interface {
	read(dgs []datagram) (n int, drops uint32, hasDrops bool, err error)
}

// serveUDP reads one UDP socket. Sessions are keyed by exporter address
// and port; each socket has its own sessions, decoder and batch.
func (l *Listener) serveUDP(ctx context.Context, c *net.UDPConn) {
	l.readUDP(ctx, newUDPReader(c), c.LocalAddr())
}

// readUDP serves the datagrams of rd, read from the socket bound to local,
// until a read fails after ctx is done or with net.ErrClosed.
func (l *Listener) readUDP(ctx context.Context, rd udpReader, local net.Addr) {
	dgs := make([]datagram, udpBatch)
	for i := range dgs {
		dgs[i].buf = make([]byte, fipfix.MaxMessageLen)
	}
	sessions := map[netip.AddrPort]*Session{}
	d := l.newDecoder()
	var prev Stats
	var lastDrops uint32
	dropsKnown := false
	b := l.pool.Get()
	msgs := 0 // messages with records in b
	sweep := time.Now()
	gauge := l.m.sessions.WithLabelValues(UDP.String())
	defer func() {
		l.deliver(ctx, b, UDP, msgs).Release()
		l.m.flush(UDP, d, &prev, l.log)
		gauge.Sub(float64(len(sessions)))
		l.m.closed.WithLabelValues(UDP.String(), "shutdown").Add(float64(len(sessions)))
		for _, s := range sessions {
			s.Close()
		}
	}()
	for {
		n, drops, hasDrops, err := rd.read(dgs)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			l.log.Warn("ipfix udp read", "addr", local, "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if hasDrops {
			if dropsKnown && drops != lastDrops {
				l.m.kernelDrop.Add(float64(drops - lastDrops))
			}
			lastDrops, dropsKnown = drops, true
		}
		now := time.Now()
		for i := range n {
			dg := &dgs[i]
			from := netip.AddrPortFrom(dg.from.Addr().Unmap(), dg.from.Port())
			if !l.cfg.AllowedSources.Allows(from.Addr()) {
				d.Stats.Messages++
				d.Stats.Dropped[ReasonSourceNotAllowed]++
				l.warns.Warn("source_not_allowed", from.Addr(), "ipfix datagram from a source outside --collector.ipfix.allowed-sources dropped (one line per source a minute; see dualflow_ipfix_messages_dropped_total)",
					"transport", UDP.String(), "remote", from)
				continue
			}
			s := sessions[from]
			if s == nil {
				if len(sessions) >= l.cfg.MaxSessions {
					l.expire(sessions, now, 0)
				}
				if len(sessions) >= l.cfg.MaxSessions {
					d.Stats.Messages++
					d.Stats.Dropped[ReasonTooManySessions]++
					continue
				}
				s = NewSession(from, UDP, l.cfg.Limits)
				l.m.newExporter(UDP, from.Addr())
				// Active from its first datagram, so that the sweep does not
				// take it before its templates come (NetFlow v9 exporters
				// send them every so many packets).
				s.Active = now
				sessions[from] = s
				gauge.Inc()
			}
			had := len(b.Recs)
			var err error
			if b.Recs, err = d.Decode(s, dg.buf[:dg.n], now, b.Recs); err != nil {
				l.warnDropped(UDP, from, err)
			}
			l.warnStamped(UDP, from, d)
			if len(b.Recs) > had {
				msgs++
			}
			if len(b.Recs) >= l.cfg.BatchRecords {
				b, msgs = l.deliver(ctx, b, UDP, msgs), 0
			}
		}
		// Hand on what we have whenever the socket is drained (a short
		// batch), so records never wait for more traffic.
		if n < len(dgs) || len(b.Recs) >= l.cfg.BatchRecords {
			b, msgs = l.deliver(ctx, b, UDP, msgs), 0
			l.m.flush(UDP, d, &prev, l.log)
		}
		if now.Sub(sweep) > sessionSweep {
			sweep = now
			l.expire(sessions, now, l.cfg.Limits.TemplateLifetime)
		}
	}
}

// expire forgets UDP sessions with no valid set (Session.Active) for
// longer than idle (all their templates have expired by then). With idle 0
// it forgets the single longest-silent session, to make room.
func (l *Listener) expire(sessions map[netip.AddrPort]*Session, now time.Time, idle time.Duration) {
	var oldest netip.AddrPort
	var oldestSeen time.Time
	for k, s := range sessions {
		if idle > 0 {
			if now.Sub(s.Active) > idle {
				s.Close()
				delete(sessions, k)
				l.m.sessions.WithLabelValues(UDP.String()).Dec()
				l.m.closed.WithLabelValues(UDP.String(), "idle").Inc()
			}
			continue
		}
		if !oldest.IsValid() || s.Active.Before(oldestSeen) {
			oldest, oldestSeen = k, s.Active
		}
	}
	if idle == 0 && oldest.IsValid() && now.Sub(oldestSeen) > time.Minute {
		sessions[oldest].Close()
		delete(sessions, oldest)
		l.m.sessions.WithLabelValues(UDP.String()).Dec()
		l.m.closed.WithLabelValues(UDP.String(), "limit").Inc()
	}
}
