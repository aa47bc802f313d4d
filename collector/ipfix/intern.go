package ipfix

import (
	"hash/maphash"

	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

// The decoder's string cache. Node names, TCP states, record sources,
// namespaces, pod and policy names of a cluster repeat, so after the first
// sighting a string field costs a hash and a compare instead of an
// allocation.
//
// The cache is set-associative with two choices: a name hashes to two sets
// of internWays entries and may sit in any entry of either; a new name goes
// to the emptier of its two sets. The direct-mapped cache it replaces (one
// string per slot, a collision replaced the slot) allocated on every record
// whose names collided: 0.125 allocations per record on a stream of 526
// names in 4096 slots, and more as the names grow. Two choices fill the
// sets evenly, so a set overflows only when the table is nearly full; the
// table doubles then, from internMinSets sets up to internMaxSets, so a
// stream with a few thousand names settles with every name cached and
// decodes without allocating (BenchmarkDecodeManyNames,
// TestInternManyNames). Past the cap, a full set replaces its entries in
// turn: more names than that cost an allocation per miss and nothing else.
//
// Memory: each Decoder (one per TCP session or UDP socket) allocates its
// table at its first string, internMinSets sets of internSetBytes (5 KiB),
// and at most internMaxSets sets (336 KiB); 2,000 pods' names take 512 sets
// (84 KiB). The direct-mapped cache held 64 KiB in every Decoder, idle or
// not. Each field's last value (field) takes NumFields strings (768 bytes)
// of every Decoder.
//
// The hash is maphash with a per-process random seed: exporter data cannot
// be crafted to fall into a few sets (which would cost it nothing worse
// than allocations anyway). Strings are copied out of the message
// (string(b)) before they are cached, so a cached string never aliases a
// buffer that is reused, and callers may keep it.
const (
	internWays    = 8
	internMinSets = 32   // 256 entries
	internMaxSets = 2048 // 16,384 entries

	// internMaxLen is the longest string cached; longer ones are allocated.
	// Kubernetes names are at most 63 (labels) or 253 (DNS subdomains)
	// bytes, and real pod names are far shorter; a longer value is unusual
	// or hostile and not worth a place.
	internMaxLen = 128

	// internSetBytes is the size of an internSet (for the comment above).
	internSetBytes = internWays*4 + internWays*16 + 8
)

// internSeed seeds the interner's hash, once per process.
var internSeed = maphash.MakeSeed()

// interner returns a string for a byte slice, reusing an earlier string
// with the same bytes when it is cached. It is not safe for concurrent use
// (a Decoder's).
type interner struct {
	sets []internSet // len is a power of two; nil until the first string
	mask uint64      // len(sets)-1
	// last holds each field's last string (see field).
	last [fipfix.NumFields]string
}

// internSet is one set: its first n ways hold strings, strs[i] with
// tags[i], the high half of its hash. Ways fill from 0 up and are never
// emptied.
type internSet struct {
	tags [internWays]uint32
	strs [internWays]string
	n    uint8 // ways in use
	next uint8 // the way a full set replaces next, at the cap
}

// The two sets of hash h are h&mask and (h>>internSet2Shift)&mask: bits
// apart from each other and from the tag (the high 32 bits) while
// internMaxSets <= 1<<(32-internSet2Shift).
const internSet2Shift = 16

// field returns the string for b, the value of field f: the field's last
// value without hashing when b is that again, as an exporter's node name
// and source are on every record and a TCP state often is (the hash was
// most of the interner's cost), else bytes(b). A string longer than
// internMaxLen is not kept.
func (in *interner) field(f fipfix.Field, b []byte) string {
	last := &in.last[f%fipfix.NumFields]
	if *last == string(b) { // compared without allocating
		return *last
	}
	s := in.bytes(b)
	if len(s) <= internMaxLen {
		*last = s
	}
	return s
}

func (in *interner) bytes(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > internMaxLen {
		return string(b)
	}
	h := maphash.Bytes(internSeed, b)
	if in.sets != nil {
		tag := uint32(h >> 32)
		set := &in.sets[h&in.mask]
		for i := range set.n {
			if set.tags[i] == tag && set.strs[i] == string(b) { // compared without allocating
				return set.strs[i]
			}
		}
		set = &in.sets[(h>>internSet2Shift)&in.mask]
		for i := range set.n {
			if set.tags[i] == tag && set.strs[i] == string(b) {
				return set.strs[i]
			}
		}
	}
	return in.miss(string(b), h)
}

// miss caches s, whose hash is h, and returns it.
func (in *interner) miss(s string, h uint64) string {
	if in.sets == nil {
		in.resize(internMinSets)
	}
	for !in.add(s, h) {
		if len(in.sets) >= internMaxSets {
			// Both sets full at the cap: replace the first set's entries in
			// turn.
			set := &in.sets[h&in.mask]
			i := set.next % internWays
			set.next = (i + 1) % internWays
			set.tags[i], set.strs[i] = uint32(h>>32), s
			break
		}
		in.resize(2 * len(in.sets))
	}
	return s
}

// add puts s in a free way of the emptier of its sets and reports whether
// there was one.
func (in *interner) add(s string, h uint64) bool {
	set := &in.sets[h&in.mask]
	if other := &in.sets[(h>>internSet2Shift)&in.mask]; other.n < set.n {
		set = other
	}
	if set.n == internWays {
		return false
	}
	set.tags[set.n], set.strs[set.n] = uint32(h>>32), s
	set.n++
	return true
}

// resize moves the cached strings into a table of n sets, and reports
// whether they all fitted: when one does not, it is dropped (the table is
// a cache). Growing, they almost always fit.
func (in *interner) resize(n int) bool {
	old := in.sets
	in.sets, in.mask = make([]internSet, n), uint64(n-1)
	ok := true
	for k := range old {
		set := &old[k]
		for i := range set.n {
			ok = in.add(set.strs[i], maphash.String(internSeed, set.strs[i])) && ok
		}
	}
	return ok
}
