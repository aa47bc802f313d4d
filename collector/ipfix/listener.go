package ipfix

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/collector/pipeline"
	"github.com/dualflow/dualflow/internal/ratelog"
	"github.com/dualflow/dualflow/internal/reload"
)

// Default listener settings.
const (
	DefaultTCPAddr = ":4739" // IANA port of IPFIX over TCP and UDP; ":" listens on IPv4 and IPv6
	DefaultUDPAddr = ":4739"
	DefaultTLSAddr = ":4740" // IANA port of IPFIX over TLS
	// DefaultMaxSessions caps TCP/TLS connections and UDP exporters per
	// listener: a node runs one exporter, so this is the cluster size
	// with a wide margin.
	DefaultMaxSessions = 4096
	// DefaultMaxSessionsPerSource: a node's exporter holds one session
	// (one per family at most); more from one address is a fault or an
	// attack.
	DefaultMaxSessionsPerSource = 16
	// DefaultMaxSessionsPerPrefix bounds the sessions of an IPv4 /24 or an
	// IPv6 /64 (sourcePrefix): a /24 holds at most 254 nodes with one
	// session each. A flat IPv6 node network of more than 256 nodes needs
	// it raised.
	DefaultMaxSessionsPerPrefix = 256
	// DefaultIdleTimeout closes TCP/TLS sessions silent for this long. An
	// exporter with flows sends at least every active timeout (ours: 1 min
	// at most by default).
	DefaultIdleTimeout = 10 * time.Minute
	// DefaultMessageTimeout bounds the arrival of a message after its
	// header: at most 65,535 bytes, from a host on the same network.
	DefaultMessageTimeout = 30 * time.Second
	// DefaultMaxTemplateBytesTotal is the template memory of all sessions
	// together: 64 sessions at their own 1 MiB cap, while a node's exporter
	// needs a few KiB (OVS about 40 templates).
	DefaultMaxTemplateBytesTotal = 64 << 20
	// DefaultBatchRecords is the size of the batches handed to the
	// pipeline: big enough to amortize the queue, small enough (~0.7 MB)
	// to keep latency low.
	DefaultBatchRecords = 1024
	// DefaultUDPReadBuffer is SO_RCVBUF of UDP sockets: about 1 s of
	// 30k messages/s bursts at 1 KiB, before the kernel drops.
	DefaultUDPReadBuffer = 32 << 20
	// udpBatch is how many datagrams one recvmmsg call reads.
	udpBatch = 32
	// sessionSweep is how often idle UDP sessions are looked for.
	sessionSweep = time.Minute
)

// Config configures the IPFIX listeners.
type Config struct {
	// TCPAddrs, UDPAddrs and TLSAddrs are the listen addresses; an
	// address without a host (":4739") takes IPv4 and IPv6. Empty lists
	// disable the transport.
	TCPAddrs, UDPAddrs, TLSAddrs []string
	// AllowedSources are the exporter addresses accepted on every
	// listener; messages and connections from others are dropped before
	// decoding and counted (source_not_allowed). Empty allows all, and New
	// then warns about listeners bound to non-loopback addresses (TLS ones
	// too, unless they require client certificates). Its prefixes but /0
	// (or, empty, loopback and the private networks) are also the
	// preferred sources, for which MaxSessions/8 TCP/TLS places are kept.
	AllowedSources AllowList
	// TLSCertFile and TLSKeyFile are the server certificate (PEM). With
	// TLSClientCAFile set, clients must present a certificate signed by
	// one of its CAs (mutual TLS). The files are read again when they
	// change, for the sessions that start after (package reload).
	TLSCertFile, TLSKeyFile, TLSClientCAFile string
	// Limits bound each session's templates.
	Limits Limits
	// Direction selects records by flowDirection (default ingress: an
	// exporter that reports each packet in and out counts it once).
	Direction Direction
	// Retention is how long the store keeps a flow after its end (the TTL
	// of --clickhouse.ttl-days on flow_end); 0 is unknown or unlimited. A
	// record whose end is further than TimeWindow(Retention) from its
	// message's export time or its receive time is stamped with the
	// export (or receive) time, so that no row is written that its TTL
	// deletes at once (see StampReason).
	Retention time.Duration
	// MaxSessions caps the sessions of each listener: further UDP
	// exporters' messages are dropped (too_many_sessions). TCP and TLS
	// share one set of places, MaxSessions/8 (at least 1) of them kept for
	// preferred sources (AllowedSources); a connection past a limit takes
	// the place of a session within it that delivers under one record a
	// minute, or is closed at once; all counted (see connSet.add).
	MaxSessions int
	// MaxSessionsPerSource caps the TCP/TLS sessions from one address, so
	// that one host cannot take every session.
	MaxSessionsPerSource int
	// MaxSessionsPerPrefix caps the TCP/TLS sessions from one IPv4 /24 or
	// IPv6 /64, all of 127.0.0.0/8 counting as one (sourcePrefix), so that
	// a network of addresses (a host's IPv6 /64 is millions) cannot take
	// every session.
	MaxSessionsPerPrefix int
	// IdleTimeout closes a TCP/TLS session that sent no message with a
	// valid set (templates or records; see Session.Active) for this long;
	// the exporter reconnects (and resends its templates) when it has
	// flows again.
	IdleTimeout time.Duration
	// MessageTimeout bounds the arrival of the rest of a message once its
	// header is in: a header that promises bytes that never come holds the
	// session no longer than this.
	MessageTimeout time.Duration
	// MaxTemplateBytesTotal bounds the template memory of all sessions
	// together (Limits.Budget); further templates are refused and counted.
	MaxTemplateBytesTotal int64
	// BatchRecords is the number of records per batch handed on.
	BatchRecords int
	// UDPReadBuffer is the UDP socket receive buffer in bytes. As root,
	// SO_RCVBUFFORCE lifts it above net.core.rmem_max.
	UDPReadBuffer int
}

// SetDefaults fills zero fields (not the address lists: empty disables).
func (c *Config) SetDefaults() {
	c.Limits.SetDefaults()
	if c.MaxSessions <= 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.MaxSessionsPerSource <= 0 {
		c.MaxSessionsPerSource = DefaultMaxSessionsPerSource
	}
	if c.MaxSessionsPerPrefix <= 0 {
		c.MaxSessionsPerPrefix = DefaultMaxSessionsPerPrefix
	}
	if c.IdleTimeout <= 0 {
		c.IdleTimeout = DefaultIdleTimeout
	}
	if c.MessageTimeout <= 0 {
		c.MessageTimeout = DefaultMessageTimeout
	}
	if c.MaxTemplateBytesTotal <= 0 {
		c.MaxTemplateBytesTotal = DefaultMaxTemplateBytesTotal
	}
	if c.BatchRecords <= 0 {
		c.BatchRecords = DefaultBatchRecords
	}
	if c.UDPReadBuffer <= 0 {
		c.UDPReadBuffer = DefaultUDPReadBuffer
	}
}

// Validate reports an unusable configuration.
func (c Config) Validate() error {
	var errs []error
	if len(c.TLSAddrs) > 0 && (c.TLSCertFile == "" || c.TLSKeyFile == "") {
		errs = append(errs, errors.New("ipfix tls listener needs a certificate and a key file"))
	}
	if len(c.TLSAddrs) == 0 && c.TLSClientCAFile != "" {
		errs = append(errs, errors.New("ipfix tls client CA set without a tls listener"))
	}
	for _, p := range c.AllowedSources {
		if !p.IsValid() {
			errs = append(errs, fmt.Errorf("ipfix allowed sources: invalid prefix %v", p))
		}
	}
	if len(c.TCPAddrs)+len(c.UDPAddrs)+len(c.TLSAddrs) == 0 {
		errs = append(errs, errors.New("ipfix: no listener address"))
	}
	return errors.Join(errs...)
}

// SplitAddrs splits a comma-separated flag value into addresses.
func SplitAddrs(s string) []string {
	var out []string
	for a := range strings.SplitSeq(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// Listener receives IPFIX over TCP, UDP and TLS, decodes it and puts the
// record batches on its output queue. Create it with New (which binds the
// sockets), then call Run.
type Listener struct {
	cfg  Config
	out  *pipeline.Queue
	pool *pipeline.Pool
	m    *metrics
	pm   *pipeline.Metrics
	log  *slog.Logger

	tcp, tls []net.Listener
	udp      []*net.UDPConn
	tlsFiles *reload.TLS // the TLS listeners' certificate and client CA; nil without them

	// warns rate-limits the warnings about what exporters send (bad
	// framing, malformed messages, stamped records, refused sources and
	// connections, evictions, failed handshakes).
	warns *ratelog.Limiter
}

// newDecoder returns a decoder configured for one reading goroutine.
func (l *Listener) newDecoder() *Decoder {
	d := NewDecoder()
	d.Direction = l.cfg.Direction
	d.TimeWindow = TimeWindow(l.cfg.Retention)
	return d
}

// warnStamped logs that the last message from remote had records stamped
// (d.stamped), at most once a minute per source;
// dualflow_ipfix_records_stamped_total counts them all.
func (l *Listener) warnStamped(tr Transport, remote netip.AddrPort, d *Decoder) {
	if d.stamped == StampNone {
		return
	}
	l.warns.Warn("stamped", remote.Addr().Unmap(), "ipfix records without usable times stamped with their message's export time, or the receive time (one line per source a minute; see dualflow_ipfix_records_stamped_total)",
		"transport", tr.String(), "remote", remote, "reason", d.stamped.String(), "time_window", d.window())
}

// New binds every configured socket. The caller must call Run, which
// closes them, or Close.
func New(cfg Config, out *pipeline.Queue, pool *pipeline.Pool, pm *pipeline.Metrics, reg prometheus.Registerer, log *slog.Logger) (*Listener, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	if pm == nil {
		pm = pipeline.NewMetrics(nil)
	}
	if cfg.Limits.Budget == nil {
		cfg.Limits.Budget = NewTemplateBudget(cfg.MaxTemplateBytesTotal)
	}
	if cfg.Limits.TupleBudget == nil {
		cfg.Limits.TupleBudget = NewTemplateBudget(DefaultTupleBytesTotal)
	}
	cfg.AllowedSources = cfg.AllowedSources.normalize()
	l := &Listener{cfg: cfg, out: out, pool: pool, m: newMetrics(reg), pm: pm, log: log,
		warns: ratelog.New(log, warnEvery, warnSources)}
	if reg != nil {
		budget := cfg.Limits.Budget
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "dualflow_ipfix_template_bytes", Help: "Template memory held by all IPFIX sessions (bounded by --collector.ipfix.max-template-bytes-total).",
		}, func() float64 { return float64(budget.Used()) }))
	}
	if err := l.bind(); err != nil {
		l.Close()
		return nil, err
	}
	if reg != nil && l.tlsFiles != nil {
		reg.MustRegister(reload.Metrics(l.tlsFiles))
	}
	l.warnOpen()
	return l, nil
}

func (l *Listener) bind() error {
	for _, a := range l.cfg.TCPAddrs {
		ln, err := net.Listen("tcp", a)
		if err != nil {
			return fmt.Errorf("ipfix tcp listener: %w", err)
		}
		l.tcp = append(l.tcp, ln)
	}
	if len(l.cfg.TLSAddrs) > 0 {
		// The files are reloaded when they change (cert-manager renewing
		// the Secret): new sessions get the new certificate and CA.
		files, err := reload.LoadTLS(reload.TLSFiles{Cert: l.cfg.TLSCertFile, Key: l.cfg.TLSKeyFile, CA: l.cfg.TLSClientCAFile},
			reload.Options{Name: "ipfix-server", Logger: l.log})
		if err != nil {
			return fmt.Errorf("ipfix tls: %w", err)
		}
		l.tlsFiles = files
		tc := files.ServerConfig()
		for _, a := range l.cfg.TLSAddrs {
			ln, err := tls.Listen("tcp", a, tc)
			if err != nil {
				return fmt.Errorf("ipfix tls listener: %w", err)
			}
			l.tls = append(l.tls, ln)
		}
	}
	for _, a := range l.cfg.UDPAddrs {
		ua, err := net.ResolveUDPAddr("udp", a)
		if err != nil {
			return fmt.Errorf("ipfix udp listener: %w", err)
		}
		c, err := net.ListenUDP("udp", ua)
		if err != nil {
			return fmt.Errorf("ipfix udp listener: %w", err)
		}
		l.udp = append(l.udp, c)
		if got, err := tuneUDP(c, l.cfg.UDPReadBuffer); err != nil {
			l.log.Warn("ipfix udp socket tuning", "addr", c.LocalAddr(), "err", err)
		} else if got < l.cfg.UDPReadBuffer {
			l.log.Warn("ipfix udp receive buffer smaller than configured (raise net.core.rmem_max or run as root)", "want", l.cfg.UDPReadBuffer, "got", got)
		}
	}
	return nil
}

// TCPAddrs, UDPAddrs and TLSAddrs return the bound addresses (useful with
// port 0).
func (l *Listener) TCPAddrs() []net.Addr { return addrsOf(l.tcp) }
func (l *Listener) TLSAddrs() []net.Addr { return addrsOf(l.tls) }
func (l *Listener) UDPAddrs() []net.Addr {
	var out []net.Addr
	for _, c := range l.udp {
		out = append(out, c.LocalAddr())
	}
	return out
}

func addrsOf(lns []net.Listener) []net.Addr {
	var out []net.Addr
	for _, ln := range lns {
		out = append(out, ln.Addr())
	}
	return out
}

// Close closes the sockets of a Listener that was not Run.
func (l *Listener) Close() error {
	var errs []error
	for _, ln := range append(l.tcp, l.tls...) {
		errs = append(errs, ln.Close())
	}
	for _, c := range l.udp {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// shutdownDrain bounds how long the sessions are read at shutdown, once
// the collector has said it is closing, for their exporters to close
// their side (the product's exporter does within a round trip).
const shutdownDrain = 5 * time.Second

// Run serves until ctx ends, then closes every socket, drains every TCP
// and TLS session (for at most shutdownDrain: see connInfo.drain) and
// returns once all its goroutines have handed on their last batch. It does
// not close the output queue.
func (l *Listener) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	conns := newConnSet(newConnLimits(l.cfg), l.cfg.AllowedSources.preferred())
	for _, ln := range l.tcp {
		wg.Go(func() { l.accept(ctx, ln, TCP, conns, &wg) })
	}
	for _, ln := range l.tls {
		wg.Go(func() { l.accept(ctx, ln, TLS, conns, &wg) })
	}
	for _, c := range l.udp {
		wg.Go(func() { l.serveUDP(ctx, c) })
	}
	<-ctx.Done()
	l.Close()
	conns.drainAll(time.Now().Add(shutdownDrain))
	wg.Wait()
	return nil
}

// deliver hands a non-empty batch on and returns a fresh one, or b itself,
// emptied, when its records were dropped; see handOn.
func (l *Listener) deliver(ctx context.Context, b *pipeline.Batch, tr Transport, msgs int) *pipeline.Batch {
	if l.handOn(ctx, b, tr, msgs) {
		return l.pool.Get()
	}
	return b
}

// handOn puts a non-empty batch on the queue and reports whether the queue
// took it; when not, b is still the caller's, emptied. msgs is the number
// of messages whose records it holds (a message's records are never split
// between batches). TCP and TLS block while the queue is full
// (back-pressure reaches the exporter through TCP flow control); UDP drops
// and counts the records and their messages (blocking would only move the
// loss into the kernel socket buffer, and stall every other exporter of the
// socket).
func (l *Listener) handOn(ctx context.Context, b *pipeline.Batch, tr Transport, msgs int) bool {
	if len(b.Recs) == 0 {
		return false
	}
	n := float64(len(b.Recs))
	if tr == UDP {
		if !l.out.TryPut(b) {
			l.pm.Dropped.WithLabelValues(stageDecode, "queue_full").Add(n)
			l.m.dropped[ReasonQueueFull].Add(float64(msgs))
			b.Recs = b.Recs[:0]
			return false
		}
	} else if err := l.out.Put(context.WithoutCancel(ctx), b); err != nil {
		l.pm.Dropped.WithLabelValues(stageDecode, "aborted").Add(n)
		b.Recs = b.Recs[:0]
		return false
	}
	l.pm.RecordsOut.WithLabelValues(stageDecode).Add(n)
	return true
}

// stageDecode is the stage label of the listeners' pipeline metrics.
const stageDecode = "decode"
