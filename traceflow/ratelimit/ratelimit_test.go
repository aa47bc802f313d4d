package ratelimit

import (
	"fmt"
	"math"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func TestTakeRefillsAtTheRate(t *testing.T) {
	k := NewKeyed(Limit{Rate: 10, Burst: 3})
	b := k.Bucket("alice")
	for i := range 3 {
		if w, _, ok := Take(t0, 1, 0, b); !ok || w != 0 {
			t.Fatalf("take %d of the burst: %v %v", i, w, ok)
		}
	}
	w, _, ok := Take(t0, 1, 0, b)
	if ok || w != 100*time.Millisecond {
		t.Fatalf("take beyond the burst: %v %v, want refused, 100ms", w, ok)
	}
	// The refusal took nothing: one token back 100 ms later.
	if _, _, ok := Take(t0.Add(100*time.Millisecond), 1, 0, b); !ok {
		t.Fatal("no token after 100ms")
	}
	// Another key has its own bucket.
	if _, _, ok := Take(t0, 3, 0, k.Bucket("bob")); !ok {
		t.Fatal("bob shares alice's bucket")
	}
	// Waiting within maxWait takes the tokens and says how long.
	if w, _, ok := Take(t0.Add(100*time.Millisecond), 1, time.Second, b); !ok || w != 100*time.Millisecond {
		t.Fatalf("take with wait: %v %v", w, ok)
	}
}

func TestTakeAllOrNone(t *testing.T) {
	callers := NewKeyed(Limit{Rate: 1, Burst: 5})
	nodes := NewKeyed(Limit{Rate: 1, Burst: 2})
	c, n := callers.Bucket("alice"), nodes.Bucket("node-1")
	if _, _, ok := Take(t0, 2, 0, c, n); !ok {
		t.Fatal("first take refused")
	}
	// The node is empty: the caller's tokens are not taken either.
	if w, slowest, ok := Take(t0, 2, 0, c, n); ok || w != 2*time.Second || slowest != 1 {
		t.Fatalf("take from an empty node: %v %d %v, want refused, 2s, by the node", w, slowest, ok)
	}
	if _, _, ok := Take(t0, 3, 0, c); !ok {
		t.Fatal("the refused take used the caller's tokens")
	}
	// More than a burst: never.
	if w, _, ok := Take(t0.Add(time.Hour), 6, time.Hour, c); ok || w != math.MaxInt64 {
		t.Fatalf("take above the burst: %v %v", w, ok)
	}
}

// TestRefusalsTakeNothing: a flood of refused takes, at once from many
// goroutines, leaves the bucket as it was: the tokens are back on time
// for the next caller.
func TestRefusalsTakeNothing(t *testing.T) {
	k := NewKeyed(Limit{Rate: 10, Burst: 4})
	for _, key := range []string{"addr:198.18.0.10", "addr:fd00:10::10"} {
		b := k.Bucket(key)
		if _, _, ok := Take(t0, 4, 0, b); !ok {
			t.Fatal("burst refused")
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for i := range 2000 {
					if _, _, ok := Take(t0.Add(time.Duration(i)*time.Microsecond), 2, 0, b); ok {
						t.Error("a take of an empty bucket succeeded")
						return
					}
				}
			})
		}
		wg.Wait()
		// 4 tokens are back 400 ms after the burst, whatever was refused.
		if w, _, ok := Take(t0.Add(400*time.Millisecond), 4, 0, b); !ok {
			t.Errorf("%s: refused after the refill (retry in %v): the refusals took tokens", key, w)
		}
	}
}

func TestUnlimited(t *testing.T) {
	k := NewKeyed(Limit{})
	for range 1000 {
		if _, _, ok := Take(t0, 100, 0, k.Bucket("x")); !ok {
			t.Fatal("unlimited bucket refused")
		}
	}
	if k.Len() != 0 {
		t.Fatalf("unlimited keeps %d buckets", k.Len())
	}
	var nilKeyed *Keyed
	if _, _, ok := Take(t0, 1, 0, nilKeyed.Bucket("x")); !ok {
		t.Fatal("nil Keyed refused")
	}
}

// TestKeysBounded: identities by the thousand do not grow the buckets
// beyond maxKeys; idle (full) buckets are forgotten first, and the rest
// share the overflow bucket.
func TestKeysBounded(t *testing.T) {
	k := NewKeyed(Limit{Rate: 1, Burst: 1})
	for i := range 3 * maxKeys {
		Take(t0, 1, 0, k.Bucket(fmt.Sprintf("addr:198.18.%d.%d", i/256, i%256)))
	}
	if k.Len() > maxKeys {
		t.Fatalf("%d buckets, want at most %d", k.Len(), maxKeys)
	}
	// The overflow bucket is shared: it is empty now.
	if _, _, ok := Take(t0, 1, 0, k.Bucket("addr:fd00:10::99")); ok {
		t.Fatal("a key beyond the bound got a fresh bucket")
	}
	// Once the buckets refill (idle), new keys get their own again.
	if _, _, ok := Take(t0.Add(time.Minute), 1, 0, k.Bucket("addr:fd00:10::98")); !ok {
		t.Fatal("no bucket for a new key after the others went idle")
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{{0, 1}, {time.Millisecond, 1}, {time.Second, 1}, {1001 * time.Millisecond, 2}, {math.MaxInt64, 3600}} {
		if got := RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

func BenchmarkTake(b *testing.B) {
	k := NewKeyed(Limit{Rate: 1e9, Burst: 1 << 30})
	bk := k.Bucket("alice")
	b.ReportAllocs()
	for b.Loop() {
		Take(time.Now(), 1, 0, bk)
	}
}
