package ipfix

import (
	"log/slog"
	"net/netip"
	"sync"
	"time"
)

// Rate limits of the listeners' warnings about what exporters send.
const (
	// warnEvery is the interval of warnings per kind and source: one line,
	// then the number held back with the next one. Counters see everything.
	warnEvery = time.Minute
	// warnSources bounds the sources remembered per limiter (about 100 B
	// each); past it, new sources share one line per kind.
	warnSources = 1024
)

// logLimiter lets through one warning per (kind, source) per interval and
// counts the others, reported with the next line that goes through. A
// flood of bad messages, spoofed from many UDP sources or not, costs a
// bounded map and a few lines a minute. Safe for concurrent use.
type logLimiter struct {
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

func newLogLimiter(log *slog.Logger, every time.Duration, max int) *logLimiter {
	return &logLimiter{log: log, every: every, max: max, now: time.Now, m: map[logKey]*logSlot{}}
}

// allow reports whether a line of kind about src may be logged now, and how
// many were held back since the last one that was (with those of sources
// forgotten since).
func (l *logLimiter) allow(kind string, src netip.Addr) (bool, int) {
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
func (l *logLimiter) purge(now time.Time) {
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

// warn logs msg at most once per interval for kind and src, adding the
// number of lines held back since the last one ("suppressed").
func (l *logLimiter) warn(kind string, src netip.Addr, msg string, args ...any) {
	ok, n := l.allow(kind, src)
	if !ok {
		return
	}
	if n > 0 {
		args = append(args, "suppressed", n)
	}
	l.log.Warn(msg, args...)
}
