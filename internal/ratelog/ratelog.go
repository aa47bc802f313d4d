// Package ratelog is the one rate limit of warning lines: one line per
// kind and source per interval, the number held back with the next, and a
// bounded memory of sources. The IPFIX listeners, the exporter and the
// store's writer log through it.
package ratelog

import (
	"log/slog"
	"net/netip"
	"sync"
	"time"
)

// Limiter lets through one warning per (kind, source) per interval and
// counts the others, reported with the next line that goes through. A
// flood of bad messages, spoofed from many UDP sources or not, costs a
// bounded map and a few lines a minute. Safe for concurrent use.
type Limiter struct {
	log   *slog.Logger
	every time.Duration
	max   int
	now   func() time.Time // tests

	mu sync.Mutex
	m  map[logKey]*logSlot
}

type logKey struct {
	kind string
	src  netip.Addr // zero: every source past the bound
}

type logSlot struct {
	last       time.Time
	suppressed int
}

// New returns a Limiter that logs to log at most once per every for each
// kind and source, remembering up to max sources (about 100 B each); past
// it, new sources share one line per kind.
func New(log *slog.Logger, every time.Duration, max int) *Limiter {
	return &Limiter{log: log, every: every, max: max, now: time.Now, m: map[logKey]*logSlot{}}
}

// Allow reports whether a line of kind about src may be logged now, and how
// many were held back since the last one that was (with those of sources
// forgotten since).
func (l *Limiter) Allow(kind string, src netip.Addr) (bool, int) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := logKey{kind, src}
	s := l.m[k]
	if s == nil {
		if len(l.m) >= l.max {
			l.purge(now)
		}
		if len(l.m) >= l.max {
			k.src = netip.Addr{}
			s = l.m[k]
		}
		if s == nil {
			s = &logSlot{}
			l.m[k] = s
		}
	}
	if !s.last.IsZero() && now.Sub(s.last) < l.every {
		s.suppressed++
		return false, 0
	}
	n := s.suppressed
	s.last, s.suppressed = now, 0
	if k.src.IsValid() {
		if shared := l.m[logKey{kind: kind}]; shared != nil {
			n += shared.suppressed // held back by forgotten sources
			shared.suppressed = 0
		}
	}
	return true, n
}

// purge forgets the sources whose interval is over; the lines they held
// back are reported with the next line of the shared slot of their kind.
// l.mu must be held.
func (l *Limiter) purge(now time.Time) {
	for k, s := range l.m {
		if !k.src.IsValid() || now.Sub(s.last) < l.every {
			continue
		}
		delete(l.m, k)
		if s.suppressed > 0 {
			shared := logKey{kind: k.kind}
			if l.m[shared] == nil {
				l.m[shared] = &logSlot{}
			}
			l.m[shared].suppressed += s.suppressed
		}
	}
}

// Warn logs msg at most once per interval for kind and src, adding the
// number of lines held back since the last one ("suppressed").
func (l *Limiter) Warn(kind string, src netip.Addr, msg string, args ...any) {
	ok, n := l.Allow(kind, src)
	if !ok {
		return
	}
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	l.log.Warn(msg, args...)
}
