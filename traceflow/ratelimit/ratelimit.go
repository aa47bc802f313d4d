// Package ratelimit bounds how often a caller may do something: token
// buckets (golang.org/x/time/rate) kept by key, such as a caller's
// identity or a node's name, and taken from several buckets at once, all
// or none. The traceflow controller limits the traces each REST caller and
// each source node may start with it; a node agent the probes each caller
// and the node may send.
package ratelimit

import (
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limit is a token bucket's refill rate and size.
type Limit struct {
	// Rate is how many tokens come back per second; 0 or less means no
	// limit.
	Rate float64
	// Burst is how many tokens the bucket holds (what may be taken at
	// once after a quiet while). At least 1 when Rate > 0.
	Burst int
}

// Unlimited reports whether l limits nothing.
func (l Limit) Unlimited() bool { return l.Rate <= 0 }

func (l Limit) String() string {
	if l.Unlimited() {
		return "no limit"
	}
	return fmt.Sprintf("%g/s, burst %d", l.Rate, l.Burst)
}

// maxKeys bounds the buckets a Keyed holds. Beyond it, buckets that are
// full again (idle) are forgotten, and if none is, new keys share one
// overflow bucket: many identities (an attacker's addresses) cannot grow
// the map, and get one bucket between them.
const maxKeys = 4096

// overflowKey is the bucket of keys beyond maxKeys.
const overflowKey = "\x00overflow"

// Keyed holds one bucket of its Limit per key, created full on first use.
// It is safe for concurrent use.
type Keyed struct {
	limit Limit
	mu    sync.Mutex
	m     map[string]*rate.Limiter
	swept time.Time // last sweep of idle buckets
}

// NewKeyed returns the buckets of limit l.
func NewKeyed(l Limit) *Keyed {
	if !l.Unlimited() && l.Burst < 1 {
		l.Burst = 1
	}
	return &Keyed{limit: l, m: map[string]*rate.Limiter{}}
}

// Limit returns the limit of every bucket.
func (k *Keyed) Limit() Limit { return k.limit }

// Bucket returns key's bucket, to Take from.
func (k *Keyed) Bucket(key string) Bucket { return Bucket{k: k, key: key} }

// limiter returns key's limiter (nil: no limit) as of now.
func (k *Keyed) limiter(key string, now time.Time) *rate.Limiter {
	if k == nil || k.limit.Unlimited() {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if l, ok := k.m[key]; ok {
		return l
	}
	// One place is kept for the overflow bucket. A sweep is O(maxKeys):
	// at most one a second.
	if len(k.m) >= maxKeys-1 && now.Sub(k.swept) >= time.Second {
		k.swept = now
		for key, l := range k.m {
			if key != overflowKey && l.TokensAt(now) >= float64(k.limit.Burst) {
				delete(k.m, key)
			}
		}
	}
	if len(k.m) >= maxKeys-1 {
		key = overflowKey
		if l, ok := k.m[key]; ok {
			return l
		}
	}
	l := rate.NewLimiter(rate.Limit(k.limit.Rate), k.limit.Burst)
	k.m[key] = l
	return l
}

// Len returns how many buckets k holds.
func (k *Keyed) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}

// Bucket is one key's bucket of a Keyed.
type Bucket struct {
	k   *Keyed
	key string
}

// takeMu makes each Take one step for every bucket: a refusal then
// leaves the buckets as they were. (With rate.Reservation, refusals that
// overlap could not give their tokens back, CancelAt restoring none once a
// later reservation exists: a flood of refused requests would put a
// bucket in debt and lock its legitimate callers out.) A Take is a few
// hundred nanoseconds: one lock for all buckets is no bottleneck.
var takeMu sync.Mutex

// Take takes n tokens from every bucket of bs as of now, all or none.
//
// When every bucket has them, or will have them within maxWait, they are
// taken and Take returns how long the caller must wait before acting
// (0: at once) and ok. Otherwise nothing is taken, ok is false and wait is
// how long until they all would have them (a Retry-After); wait is
// math.MaxInt64 when n exceeds a bucket's burst (never). slowest is the
// index in bs of the bucket that waits longest (-1 when none waits).
func Take(now time.Time, n int, maxWait time.Duration, bs ...Bucket) (wait time.Duration, slowest int, ok bool) {
	slowest = -1
	ls := make([]*rate.Limiter, len(bs))
	for i, b := range bs {
		ls[i] = b.k.limiter(b.key, now)
	}
	takeMu.Lock()
	defer takeMu.Unlock()
	for i, l := range ls {
		if l == nil {
			continue
		}
		if n > l.Burst() {
			return math.MaxInt64, i, false
		}
		if short := float64(n) - l.TokensAt(now); short > 0 {
			if d := time.Duration(math.Ceil(short / float64(l.Limit()) * float64(time.Second))); d > wait {
				wait, slowest = d, i
			}
		}
	}
	if wait > maxWait {
		return wait, slowest, false
	}
	// Every bucket has the tokens by now+wait: take them (a bucket short
	// of them goes into debt until then, as its caller waits).
	for _, l := range ls {
		if l != nil {
			l.ReserveN(now, n)
		}
	}
	return wait, slowest, true
}

// RetryAfterSeconds is wait as a Retry-After header's whole seconds,
// rounded up, at least 1.
func RetryAfterSeconds(wait time.Duration) int {
	if wait >= time.Hour {
		return 3600
	}
	return max(1, int(math.Ceil(wait.Seconds())))
}
