package ipfix

import (
	"net/netip"
	"sync/atomic"
	"time"
)

// Transport is how a session's messages arrive.
type Transport uint8

const (
	TCP Transport = iota
	UDP
	TLS
)

var transportNames = [...]string{"tcp", "udp", "tls"}

func (t Transport) String() string {
	if int(t) < len(transportNames) {
		return transportNames[t]
	}
	return "unknown"
}

// Limits bound what one exporter can make the collector hold. Zero fields
// take the defaults (SetDefaults).
type Limits struct {
	// MaxDomains is the number of observation domains per session, an
	// IPFIX domain and a NetFlow source ID of the same number counting
	// as two; messages of further domains are dropped (reason
	// too_many_domains).
	MaxDomains int
	// MaxTemplates is the number of templates and options templates per
	// session, over all its domains; further definitions are ignored and
	// counted (too_many_templates), and their data sets are then unknown.
	MaxTemplates int
	// MaxTemplateBytes bounds the memory of a session's templates.
	MaxTemplateBytes int
	// MaxFields is the number of fields one template may have.
	MaxFields int
	// TemplateLifetime is how long a UDP template lives without being
	// refreshed (RFC 7011 8.4). TCP and TLS templates live as long as the
	// connection.
	TemplateLifetime time.Duration
	// Budget bounds the template memory of every session sharing it (the
	// Listener gives all its sessions one); nil bounds nothing beyond
	// MaxTemplateBytes per session.
	Budget *TemplateBudget
	// TupleBudget bounds the memory of the tuples flowDirection auto
	// tracks (dirTracker) over every session sharing it; nil bounds
	// nothing beyond the per-session cap.
	TupleBudget *TemplateBudget
}

// TemplateBudget is the template memory of many sessions together: a
// session's caps bound one exporter, the budget bounds all of them (1,500
// hostile sessions at MaxTemplateBytes each would otherwise hold 1.5 GB).
// Safe for concurrent use.
type TemplateBudget struct {
	max  int64
	used atomic.Int64
}

// NewTemplateBudget returns a budget of maxBytes.
func NewTemplateBudget(maxBytes int64) *TemplateBudget { return &TemplateBudget{max: maxBytes} }

// Used is the template memory held now, in bytes.
func (b *TemplateBudget) Used() int64 { return b.used.Load() }

func (b *TemplateBudget) take(n int) bool {
	if b == nil {
		return true
	}
	if b.used.Add(int64(n)) > b.max {
		b.used.Add(-int64(n))
		return false
	}
	return true
}

func (b *TemplateBudget) give(n int) {
	if b != nil {
		b.used.Add(-int64(n))
	}
}

// Defaults of Limits. Our exporter sends 2 templates per domain and OVS about
// 40, so the caps leave a wide margin while bounding a hostile exporter to
// about MaxTemplateBytes of memory.
const (
	DefaultMaxDomains       = 64
	DefaultMaxTemplates     = 1024
	DefaultMaxTemplateBytes = 1 << 20
	DefaultMaxFields        = 512
	// DefaultTemplateLifetime is 3× the usual 10-minute refresh of UDP
	// exporters (OVS refreshes every 600 s).
	DefaultTemplateLifetime = 30 * time.Minute
)

// SetDefaults fills zero fields.
func (l *Limits) SetDefaults() {
	if l.MaxDomains <= 0 {
		l.MaxDomains = DefaultMaxDomains
	}
	if l.MaxTemplates <= 0 {
		l.MaxTemplates = DefaultMaxTemplates
	}
	if l.MaxTemplateBytes <= 0 {
		l.MaxTemplateBytes = DefaultMaxTemplateBytes
	}
	if l.MaxFields <= 0 {
		l.MaxFields = DefaultMaxFields
	}
	if l.TemplateLifetime <= 0 {
		l.TemplateLifetime = DefaultTemplateLifetime
	}
}

// Session is the template state of one exporter session: one TCP or TLS
// connection, or one UDP source address and port (RFC 7011 10.3.1).
// Templates are scoped by session, protocol and observation domain: an
// IPFIX domain and the NetFlow v9 source ID of the same number are two
// domains, whose templates of the same ID never replace each other. A
// Session is not safe for concurrent use; it belongs to the goroutine that
// reads its transport.
type Session struct {
	Exporter  netip.AddrPort
	Transport Transport
	lim       Limits
	domains   map[domainKey]*domain
	last      *domain // the domain of the previous message
	templates int     // templates over all domains
	bytes     int     // template memory over all domains
	tuples    int     // flowDirection tuples tracked over all domains (dirTracker)
	// Active is when a message with a valid set last arrived: one that
	// defined templates or held data records. Bare headers, empty sets,
	// sets of unknown templates and dropped messages leave it: they do not
	// keep a session alive (issue 33).
	Active time.Time
	// Records counts the data records of the session's decoded messages,
	// options records and records skipped included: the work it does.
	Records  uint64
	exporter netip.Addr // Exporter's address, unmapped
}

// domainKey names a domain of a session: its protocol (IPFIX, NetFlow v9
// or v5) and its ID (observation domain, v9 source ID, v5 engine).
type domainKey struct {
	id    uint32
	proto protocol
}

// domain is the state of one observation domain of a protocol of a
// session.
type domain struct {
	id        uint32
	proto     protocol
	templates map[uint16]*template
	seq       seqState
	sysInitMs uint64     // systemInitTimeMilliseconds from options data
	dirs      dirTracker // DirectionAuto's kept direction per tuple
}

// NewSession returns the state of a new session of exporter over transport.
func NewSession(exporter netip.AddrPort, transport Transport, lim Limits) *Session {
	lim.SetDefaults()
	return &Session{
		Exporter: exporter, Transport: transport, lim: lim,
		domains:  map[domainKey]*domain{},
		exporter: exporter.Addr().Unmap(),
	}
}

// domain returns the state of domain id of protocol p, creating it, or
// nil when the session has MaxDomains already (the domains of every
// protocol count).
func (s *Session) domain(p protocol, id uint32) *domain {
	if d := s.last; d != nil && d.id == id && d.proto == p {
		return d
	}
	k := domainKey{id: id, proto: p}
	d := s.domains[k]
	if d == nil {
		if len(s.domains) >= s.lim.MaxDomains {
			return nil
		}
		d = &domain{id: id, proto: p, templates: map[uint16]*template{}}
		s.domains[k] = d
	}
	s.last = d
	return d
}

// note records a decoded message that held c: activity when it had a
// valid set.
func (s *Session) note(c seqCounts, now time.Time) {
	if c.templates > 0 || c.data > 0 {
		s.Active = now
		s.Records += uint64(c.data)
	}
}

func (s *Session) removeTemplate(d *domain, id uint16) bool {
	t := d.templates[id]
	if t == nil {
		return false
	}
	delete(d.templates, id)
	s.templates--
	s.bytes -= t.size()
	s.lim.Budget.give(t.size())
	return true
}

// Close forgets the session's templates and gives their memory back to the
// budget. Call it when the session ends; it may be called more than once.
func (s *Session) Close() {
	s.lim.Budget.give(s.bytes)
	s.lim.TupleBudget.give(s.tuples * dirTupleBytes)
	s.bytes, s.templates, s.tuples = 0, 0, 0
	clear(s.domains)
	s.last = nil
}

// withdrawAll removes every template (options false) or every options
// template (options true) of d and returns how many.
func (s *Session) withdrawAll(d *domain, options bool) int {
	n := 0
	for id, t := range d.templates {
		if t.options == options {
			s.removeTemplate(d, id)
			n++
		}
	}
	return n
}
