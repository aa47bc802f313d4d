package ipfix

// internSlots is the size of the direct-mapped string cache: node names,
// TCP states, record sources, namespaces and pod names of a cluster repeat,
// so a few thousand slots make string fields free in steady state. A slot
// holds one string; a collision replaces it (bounded memory, no eviction
// bookkeeping).
const internSlots = 4096

// internMaxLen is the longest string cached; longer ones are allocated.
const internMaxLen = 128

// interner returns a string for a byte slice, reusing an earlier string
// with the same bytes when it is cached.
type interner struct {
	slots [internSlots]string
}

func (in *interner) bytes(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > internMaxLen {
		return string(b)
	}
	h := uint32(2166136261) // FNV-1a
	for _, c := range b {
		h ^= uint32(c)
		h *= 16777619
	}
	slot := &in.slots[h%internSlots]
	if *slot == string(b) { // compared without allocating
		return *slot
	}
	s := string(b)
	*slot = s
	return s
}
