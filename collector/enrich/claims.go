package enrich

import (
	"math"
	"time"
)

// An address (or pod CIDR) is held by an object for a time: a claim. Pod
// IPs are reused, Service VIPs too, so each key keeps the list of its
// claims: the active ones (until == active) and those that ended less than
// the grace period ago, so that records that arrive late still resolve to
// the object that held the address at the flow's time.
//
// Claims are derived from each object's own state and the time of the
// event, never from the order in which different objects' events arrive,
// and ties are broken by the claimant's identity: the index is the same
// whatever the interleaving of Pod, Service and EndpointSlice events.

// active is the until of a claim that has not ended.
const active = math.MaxInt64

// clockSkew is how far outside a claim's interval a flow time may be and
// still resolve to it when no claim covers the time exactly: node clocks
// (conntrack timestamps) and the API server's clock (creationTimestamp)
// differ, and an address added by an update is stamped when the watch
// event arrives, a little after the kubelet assigned it.
const clockSkew = int64(ClockSkew)

// ClockSkew is how long after an object gave up an address (a Service
// its ClusterIP, a deleted pod its IP with no new holder) flows that
// start still resolve to it; a new holder takes over at once.
const ClockSkew = 5 * time.Second

// claimer is a claim's value: it names its claimant, so that an update can
// find the claim it made and ties resolve the same way in every order.
type claimer interface {
	comparable
	claimID() string
}

type claim[V claimer] struct {
	v           V
	from, until int64 // unix ns; [from, until)
}

func (c *claim[V]) covers(t int64) bool { return c.from <= t && t < c.until }

// distance is how far t is outside c (0 inside).
func (c *claim[V]) distance(t int64) int64 {
	switch {
	case t < c.from:
		return c.from - t
	case t >= c.until:
		return t - c.until + 1
	}
	return 0
}

// better reports whether a should be chosen over b when both cover a time
// equally well: the later claim (the current holder of a reused address),
// then the active one, then the smaller claimant ID.
func better[V claimer](a, b *claim[V]) bool {
	if a.from != b.from {
		return a.from > b.from
	}
	if a.until != b.until {
		return a.until > b.until
	}
	return a.v.claimID() < b.v.claimID()
}

// claims is the list of claims on one key. The first is stored inline:
// most keys have one claim, and a lookup then touches the map entry only.
type claims[V claimer] struct {
	one  claim[V] // valid when one.v is not the zero V
	more []claim[V]
}

func (l *claims[V]) n() int {
	var zero V
	if l.one.v == zero {
		return 0
	}
	return 1 + len(l.more)
}

func (l *claims[V]) get(i int) *claim[V] {
	if i == 0 {
		return &l.one
	}
	return &l.more[i-1]
}

func (l *claims[V]) push(c claim[V]) {
	var zero V
	if l.one.v == zero {
		l.one = c
		return
	}
	l.more = append(l.more, c)
}

func (l *claims[V]) remove(i int) {
	if i == 0 {
		if len(l.more) == 0 {
			l.one = claim[V]{}
			return
		}
		l.one = l.more[0]
		i = 1
	}
	l.more = append(l.more[:i-1], l.more[i:]...)
	if len(l.more) == 0 {
		l.more = nil
	}
}

// ended is a key whose claim ended at some time, queued for collection.
type ended[K comparable] struct {
	key K
	at  int64
}

// history maps keys to claims. It is not safe for concurrent use: the
// index's lock guards it.
type history[K comparable, V claimer] struct {
	m map[K]claims[V]
	// queue holds keys with ended claims in the order they ended (at is
	// the time of the call to end, non-decreasing), for collection.
	queue []ended[K]
	head  int
	// retained counts ended claims not yet collected.
	retained int
}

func newHistory[K comparable, V claimer]() history[K, V] {
	return history[K, V]{m: map[K]claims[V]{}}
}

// has reports whether *k has any claim.
//
// The lookups (has, resolve, latest) take the key by pointer, for callers
// whose key is in memory written a while ago (a record's address): the
// map hashes it there. A key passed by value was stored, field by field,
// just before the hash read it 16 bytes at a time, which the CPU does not
// forward from those stores: the hash of the pod address history's
// netip.Addr keys took 1.3 s of the 2.1 s of its lookups (by enrichment
// and by the correlator's NodesForIPs) in the end-to-end benchmark's CPU
// profile, with maps of a few entries.
func (h *history[K, V]) has(k *K) bool {
	_, ok := h.m[*k]
	return ok
}

// add records that v holds k from from on.
func (h *history[K, V]) add(k K, v V, from int64) {
	l := h.m[k]
	l.push(claim[V]{v: v, from: from, until: active})
	h.m[k] = l
}

// replace swaps the value of the active claim on k made by v's claimant
// (a newer version of the same object). It reports whether there was one.
func (h *history[K, V]) replace(k K, v V) bool {
	l, ok := h.m[k]
	if !ok {
		return false
	}
	id := v.claimID()
	for i := range l.n() {
		if c := l.get(i); c.until == active && c.v.claimID() == id {
			c.v = v
			h.m[k] = l
			return true
		}
	}
	return false
}

// end ends the active claim on k made by claimant id at until. With keep
// false (no grace period) the claim is dropped at once; otherwise k is
// queued for collection at now.
func (h *history[K, V]) end(k K, id string, until, now int64, keep bool) {
	l, ok := h.m[k]
	if !ok {
		return
	}
	for i := range l.n() {
		c := l.get(i)
		if c.until != active || c.v.claimID() != id {
			continue
		}
		if !keep {
			l.remove(i)
			if l.n() == 0 {
				delete(h.m, k)
			} else {
				h.m[k] = l
			}
			return
		}
		c.until = max(until, c.from+1) // keep the interval non-empty
		h.m[k] = l
		h.retained++
		h.queue = append(h.queue, ended[K]{key: k, at: now})
		return
	}
}

// collect drops the claims that ended at or before cutoff, for keys queued
// at or before cutoff. It returns the number of claims dropped.
func (h *history[K, V]) collect(cutoff int64) int {
	n := 0
	for h.head < len(h.queue) && h.queue[h.head].at <= cutoff {
		k := h.queue[h.head].key
		h.queue[h.head] = ended[K]{}
		h.head++
		l, ok := h.m[k]
		if !ok {
			continue
		}
		for i := l.n() - 1; i >= 0; i-- {
			if c := l.get(i); c.until != active && c.until <= cutoff {
				l.remove(i)
				n++
			}
		}
		if l.n() == 0 {
			delete(h.m, k)
		} else {
			h.m[k] = l
		}
	}
	h.retained = max(h.retained-n, 0)
	if h.head > 1024 && h.head*2 > len(h.queue) {
		h.queue = append(h.queue[:0], h.queue[h.head:]...)
		h.head = 0
	}
	return n
}

// resolve picks the claim on *k for a flow that started at start and ended
// at end (both unix ns; equal when only one time is known), among the
// claims whose value match accepts (all when match is nil):
//  1. a claim covering start (the holder when the flow began);
//  2. else a claim covering end;
//  3. else the claim nearest to start, if within clockSkew.
//
// Among equals, better decides.
func (h *history[K, V]) resolve(k *K, start, end int64, match func(V) bool) (V, bool) {
	l := h.m[*k]
	return resolve(&l, start, end, match)
}

func resolve[V claimer](l *claims[V], start, end int64, match func(V) bool) (V, bool) {
	var zero V
	n := l.n()
	if n == 1 { // the common case: one holder
		c := &l.one
		if (match == nil || match(c.v)) && (c.covers(start) || c.covers(end) || c.distance(start) <= clockSkew) {
			return c.v, true
		}
		return zero, false
	}
	if i := pick(l, start, match); i >= 0 {
		return l.get(i).v, true
	}
	if end != start {
		if i := pick(l, end, match); i >= 0 {
			return l.get(i).v, true
		}
	}
	best := -1
	var bestD int64
	for i := range n {
		c := l.get(i)
		d := c.distance(start)
		if d > clockSkew || (match != nil && !match(c.v)) {
			continue
		}
		if best < 0 || d < bestD || (d == bestD && better(c, l.get(best))) {
			best, bestD = i, d
		}
	}
	if best < 0 {
		return zero, false
	}
	return l.get(best).v, true
}

// pick returns the index of the best claim covering t that match accepts,
// or -1.
func pick[V claimer](l *claims[V], t int64, match func(V) bool) int {
	best := -1
	for i := range l.n() {
		c := l.get(i)
		if c.covers(t) && (match == nil || match(c.v)) && (best < 0 || better(c, l.get(best))) {
			best = i
		}
	}
	return best
}

// latest returns the value of the active claim on *k, or else of the
// claim that ended last (retained within the grace period).
func (h *history[K, V]) latest(k *K) (V, bool) {
	var zero V
	l := h.m[*k]
	best := -1
	for i := range l.n() {
		c := l.get(i)
		if best < 0 || c.until > l.get(best).until || (c.until == l.get(best).until && better(c, l.get(best))) {
			best = i
		}
	}
	if best < 0 {
		return zero, false
	}
	return l.get(best).v, true
}
