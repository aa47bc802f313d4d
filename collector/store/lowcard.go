package store

import (
	"encoding/binary"
	"fmt"
	"unsafe"
)

// A LowCardinality(String) column of a Native block is sent as the
// engine stores it: a dictionary of the block's distinct values and one
// index into it per row. Sent as String, the engine hashed every row's
// value into a dictionary of its own; now Go writes each distinct value
// once per block and the engine takes the dictionary as it is.
//
// The wire layout (ClickHouse's SerializationLowCardinality, for Native
// blocks, which carry no shared dictionary), all integers little-endian:
//
//	UInt64 1                        keys serialization version (the column's prefix)
//	UInt64 index type | 1<<9 | 1<<10 the index width (0: UInt8, 1: UInt16, 2: UInt32),
//	                                 "has additional keys" and "update dictionary"
//	UInt64 N, N Strings             the dictionary ("additional keys")
//	UInt64 rows, rows indexes       each row's index in the dictionary
//
// A block with no rows has none of it. The index width is the smallest
// that holds the dictionary's indexes.

const (
	lowCardVersion    = 1            // KeysSerializationVersion SharedDictionariesWithAdditionalKeys
	lowCardKeysFlags  = 1<<9 | 1<<10 // HasAdditionalKeysBit | NeedUpdateDictionary
	lowCardHeader     = 4 * 8        // version, flags, keys and rows
	maxKeptDictionary = 1 << 12      // keys of a dictionary map kept for the next batch
)

// indexWidth returns the bytes of an index into a dictionary of n keys.
func indexWidth(n int) int {
	switch {
	case n <= 1<<8:
		return 1
	case n <= 1<<16:
		return 2
	}
	return 4
}

// lc appends s to a LowCardinality(String) column: its index in the
// block's dictionary, to which s is added when new.
//
// Most values come from a few shared strings (the enricher's pods and
// nodes, the decoder's interned names), so a small cache keyed by the
// string's address answers most rows before the dictionary's map, which
// hashes the bytes: 20 map lookups per row were a third of the writer's
// Go time. A hit needs the same address and length, and Go strings are
// immutable (dualflow builds none with unsafe), so the same address and
// length is the same value; the cache holds the string, so its memory is
// not reused while cached.
func (c *nativeColumn) lc(s string) {
	r := c.recent
	if r != nil {
		if len(s) == 0 {
			if r.hasEmpty {
				c.appendIndex(r.empty)
				return
			}
		} else if e := &r.slots[recentSlot(s)]; len(e.s) == len(s) && unsafe.StringData(e.s) == unsafe.StringData(s) {
			c.appendIndex(e.i)
			return
		}
	}
	i, ok := c.dict[s]
	if !ok {
		i = c.addKey(s)
	}
	c.remember(s, i)
	c.appendIndex(i)
}

// recentKeys is a LowCardinality column's cache of recently appended
// values, reset with the dictionary.
type recentKeys struct {
	slots [64]struct {
		s string
		i uint32
	}
	empty    uint32
	hasEmpty bool
}

// recentSlot returns the cache slot of s, from its address.
func recentSlot(s string) uintptr {
	return uintptr(unsafe.Pointer(unsafe.StringData(s))) * 0x9E3779B97F4A7C15 >> 58
}

// remember caches s's dictionary index i.
func (c *nativeColumn) remember(s string, i uint32) {
	if c.recent == nil {
		c.recent = new(recentKeys)
	}
	if len(s) == 0 {
		c.recent.empty, c.recent.hasEmpty = i, true
		return
	}
	e := &c.recent.slots[recentSlot(s)]
	e.s, e.i = s, i
}

// addKey adds s, not yet in the dictionary, and returns its index. The
// 257th and the 65537th keys widen the indexes already written.
func (c *nativeColumn) addKey(s string) uint32 {
	if c.dict == nil {
		c.dict = make(map[string]uint32)
	}
	i := uint32(len(c.dict))
	c.dict[s] = i
	c.data = appendString(c.data, s)
	if from, to := indexWidth(int(i)), indexWidth(int(i)+1); from != to {
		c.values = widenIndexes(c.values, from, to)
	}
	return i
}

// appendIndex appends index i, in the width of the dictionary's size.
func (c *nativeColumn) appendIndex(i uint32) {
	switch n := len(c.dict); {
	case n <= 1<<8:
		c.values = append(c.values, byte(i))
	case n <= 1<<16:
		c.values = binary.LittleEndian.AppendUint16(c.values, uint16(i))
	default:
		c.values = binary.LittleEndian.AppendUint32(c.values, i)
	}
}

// widenIndexes returns the indexes of b, from bytes wide, as to bytes wide.
func widenIndexes(b []byte, from, to int) []byte {
	n := len(b) / from
	out := make([]byte, 0, max(2*n*to, 1<<10))
	for k := range n {
		var v uint32
		if from == 1 {
			v = uint32(b[k])
		} else {
			v = uint32(binary.LittleEndian.Uint16(b[from*k:]))
		}
		if to == 2 {
			out = binary.LittleEndian.AppendUint16(out, uint16(v))
		} else {
			out = binary.LittleEndian.AppendUint32(out, v)
		}
	}
	return out
}

// resetDict empties the dictionary for a new block. A map that grew large
// is dropped rather than kept for the next batch: an idle builder holds
// little.
func (c *nativeColumn) resetDict() {
	if c.recent != nil {
		*c.recent = recentKeys{}
	}
	if len(c.dict) > maxKeptDictionary {
		c.dict = nil
		return
	}
	clear(c.dict)
}

// appendDictHeader appends what comes before the dictionary's keys: the
// version, the index type and flags, the number of keys.
func (c *nativeColumn) appendDictHeader(b []byte) []byte {
	n := len(c.dict)
	typ := uint64(0)
	switch indexWidth(n) {
	case 2:
		typ = 1
	case 4:
		typ = 2
	}
	b = binary.LittleEndian.AppendUint64(b, lowCardVersion)
	b = binary.LittleEndian.AppendUint64(b, typ|lowCardKeysFlags)
	return binary.LittleEndian.AppendUint64(b, uint64(n))
}

// dictKeys returns the keys of the column's dictionary as they are
// encoded in it (Strings, length included), in index order.
func (c *nativeColumn) dictKeys() ([][]byte, error) {
	var keys [][]byte
	for b := c.data; len(b) > 0; {
		n, err := stringLen(b)
		if err != nil {
			return nil, fmt.Errorf("dictionary key %d: %w", len(keys), err)
		}
		keys = append(keys, b[:n])
		b = b[n:]
	}
	return keys, nil
}

// index returns row r's index into a dictionary of n keys.
func (c *nativeColumn) index(r, n int) (int, bool) {
	w := indexWidth(n)
	if len(c.values) < (r+1)*w {
		return 0, false
	}
	var i int
	switch v := c.values[r*w:]; w {
	case 1:
		i = int(v[0])
	case 2:
		i = int(binary.LittleEndian.Uint16(v))
	default:
		i = int(binary.LittleEndian.Uint32(v))
	}
	return i, i < n
}
