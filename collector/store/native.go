package store

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
)

// The embedded engine parses RowBinary row by row, and building
// LowCardinality dictionaries one value at a time made RowBinary inserts of
// the wide flows row 2x slower than the same data in the columnar Native
// format. The writer builds the Native columns as records arrive
// (appendRecord, columnar.go); RowBinary stays the spool's format (compact,
// append-only, decodable row by row), and a backend transposes a RowBinary
// batch (a spooled one, or one from another caller) into a Native block
// just before inserting it (build).
//
// Both fill the address text columns (src_ip, dst_ip,
// service_ip, snat_ip, exporter_ip) from the *_in columns. The table computes
// them with a DEFAULT expression when an insert leaves them out, but that
// expression was a fifth of the engine's insert time; Go formats the same
// text (appendIPText, tested against the engine) on the writer's side, where
// it overlaps with the engine's work on the previous batch.

// wireKind is how one column of a flow row is laid out in RowBinary, which
// for these types but LowCardinality is also its Native layout per value.
type wireKind uint8

const (
	wireFixed   wireKind = iota // n bytes
	wireString                  // uvarint length + bytes
	wireMap                     // uvarint count + count × (string key, string value)
	wireLowCard                 // a String in RowBinary; in Native, a LowCardinality(String) column (lowcard.go)
)

type wireColumn struct {
	kind wireKind
	size int    // bytes, for wireFixed
	typ  string // type declared in the Native header; the engine converts it to the table's type
	// text names the String column that shows this IPv6 column as text
	// (see appendIPText); "" for none.
	text string
}

// flowWire describes FlowColumns in order. The table's LowCardinality(String)
// columns go as LowCardinality, with a dictionary per block (lowcard.go):
// sent as String, the engine hashed every row's value into a dictionary.
// Enum columns go as Int8: the engine converts whole columns, which is
// cheap, and the table definition stays the only place that names them.
var flowWire = func() []wireColumn {
	f := func(n int, typ string) wireColumn { return wireColumn{kind: wireFixed, size: n, typ: typ} }
	str := wireColumn{kind: wireString, typ: "String"}
	lc := wireColumn{kind: wireLowCard, typ: "LowCardinality(String)"}
	ip := func(text string) wireColumn { c := f(16, "IPv6"); c.text = text; return c }
	u8, u16, u32, u64, i8 := f(1, "UInt8"), f(2, "UInt16"), f(4, "UInt32"), f(8, "UInt64"), f(1, "Int8")
	ts := f(8, "DateTime64(3, 'UTC')")
	labels := wireColumn{kind: wireMap, typ: "Map(String, String)"}
	policy := []wireColumn{lc, lc, f(4, "Int32"), i8, i8, lc}
	cols := []wireColumn{
		ts, ts, ts, // flow_start, flow_end, time_received
		u8, ip("src_ip"), ip("dst_ip"), u16, u16, u8, // ip_version, src_ip_in, dst_ip_in, src_port, dst_port, protocol
		ip("service_ip"), u16, ip("snat_ip"), u16, // service_ip_in, service_port, snat_ip_in, snat_port
		u64, u64, u64, u64, u64, u64, u64, u64, // counters
		i8, lc, u16, u32, // end_reason, tcp_state, ct_zone, ct_mark
		ip("exporter_ip"), u32, lc, lc, // exporter_ip_in, observation_domain_id, exporter_node, source
		lc, str, labels, lc, str, lc, lc, // src endpoint: namespace, pod, labels, workload kind and name, node, zone
		lc, str, labels, lc, str, lc, lc, // dst endpoint
		lc, str, lc, // dst_service_namespace, _name, _port_name
		i8, i8, // flow_type, correlation
	}
	cols = append(cols, policy...)
	cols = append(cols, policy...)
	return append(cols, f(1, "Bool"), f(1, "Bool"), lc) // verdict_mismatch, k8s_view_stale, probe_trace_id
}()

// nativeBuilder transposes RowBinary rows into a Native block. It keeps its
// buffers between batches; it is not safe for concurrent use.
type nativeBuilder struct {
	cols  []nativeColumn
	texts []nativeColumn // the text columns, in wire order
	ipc   *ipTextCache
	parts [][]byte // the block, as pieces that reference the buffers above
	hdr   []byte   // backs the header pieces
	rows  int      // rows in the columns
}

type nativeColumn struct {
	data    []byte            // values (for a map: keys; for LowCardinality: the dictionary)
	values  []byte            // map values; LowCardinality indexes
	offsets []uint64          // map offsets (cumulative entry counts)
	dict    map[string]uint32 // LowCardinality: the index of each dictionary key
	recent  *recentKeys       // LowCardinality: the last indexes, by the string's address
}

// nativeColumns returns the columns of the Native block build makes for
// columns: columns plus the text columns of wire.
func nativeColumns(columns []string, wire []wireColumn) []string {
	out := append([]string(nil), columns...)
	for _, w := range wire {
		if w.text != "" {
			out = append(out, w.text)
		}
	}
	return out
}

// reset empties nb for rows of the given wire layout, keeping its buffers.
func (nb *nativeBuilder) reset(wire []wireColumn) {
	ntext := 0
	for _, w := range wire {
		if w.text != "" {
			ntext++
		}
	}
	if len(nb.cols) != len(wire) || len(nb.texts) != ntext {
		nb.cols = make([]nativeColumn, len(wire))
		nb.texts = make([]nativeColumn, ntext)
	}
	for i := range nb.cols {
		c := &nb.cols[i]
		c.data, c.values, c.offsets = c.data[:0], c.values[:0], c.offsets[:0]
		c.resetDict()
	}
	for i := range nb.texts {
		nb.texts[i].data = nb.texts[i].data[:0]
	}
	if nb.ipc == nil {
		nb.ipc = new(ipTextCache)
	}
	nb.rows = 0
}

// build returns the Native block (revision 0: no block info, no
// serialization kinds) for rows RowBinary rows of the given columns, with
// the columns named by nativeColumns. The block is returned as pieces to be
// sent in order, without copying them into one buffer; they are valid until
// the next call.
func (nb *nativeBuilder) build(columns []string, wire []wireColumn, rows int, data []byte) ([][]byte, error) {
	if len(columns) != len(wire) {
		return nil, fmt.Errorf("native: %d columns but %d wire descriptions", len(columns), len(wire))
	}
	nb.reset(wire)
	if err := nb.transpose(columns, wire, rows, data); err != nil {
		return nil, err
	}
	nb.rows = rows
	return nb.assemble(columns, wire), nil
}

// transpose appends rows RowBinary rows to the columns.
func (nb *nativeBuilder) transpose(columns []string, wire []wireColumn, rows int, data []byte) error {
	b := data
	for r := 0; r < rows; r++ {
		t := 0
		for i := range wire {
			c := &nb.cols[i]
			switch w := &wire[i]; w.kind {
			case wireFixed:
				if len(b) < w.size {
					return fmt.Errorf("native: row %d column %s: %w", r, columns[i], ErrShortRow)
				}
				// Fixed sizes without a memmove call per value.
				switch w.size {
				case 1:
					c.data = append(c.data, b[0])
				case 2:
					c.data = append(c.data, b[0], b[1])
				case 4:
					c.data = binary.LittleEndian.AppendUint32(c.data, binary.LittleEndian.Uint32(b))
				case 8:
					c.data = binary.LittleEndian.AppendUint64(c.data, binary.LittleEndian.Uint64(b))
				case 16:
					c.data = appendShort(c.data, b, 16)
				default:
					c.data = append(c.data, b[:w.size]...)
				}
				if w.text != "" && w.size == 16 {
					tc := &nb.texts[t]
					t++
					tc.data = nb.ipc.appendWords(tc.data, binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:]))
				}
				b = b[w.size:]
			case wireString:
				// Most strings of a flow row are empty or short: their
				// length prefix is one byte and appendShort copies them
				// without a memmove call.
				if len(b) > 0 && b[0] < 0x80 {
					n := 1 + int(b[0])
					if n > len(b) {
						return fmt.Errorf("native: row %d column %s: %w", r, columns[i], ErrShortRow)
					}
					c.data = appendShort(c.data, b, n)
					b = b[n:]
					continue
				}
				n, err := stringLen(b)
				if err != nil {
					return fmt.Errorf("native: row %d column %s: %w", r, columns[i], err)
				}
				c.data = append(c.data, b[:n]...)
				b = b[n:]
			case wireLowCard:
				l, k := binary.Uvarint(b)
				if k <= 0 || l > uint64(len(b)-k) {
					return fmt.Errorf("native: row %d column %s: %w", r, columns[i], ErrShortRow)
				}
				v := b[k : k+int(l)]
				// The lookup does not copy v; only a new key does.
				j, ok := c.dict[string(v)]
				if !ok {
					j = c.addKey(string(v))
				}
				c.appendIndex(j)
				b = b[k+int(l):]
			case wireMap:
				count, k := binary.Uvarint(b)
				if k <= 0 || count > uint64(len(b)) {
					return fmt.Errorf("native: row %d column %s: %w", r, columns[i], ErrShortRow)
				}
				b = b[k:]
				for j := uint64(0); j < count; j++ {
					n, err := stringLen(b)
					if err != nil {
						return fmt.Errorf("native: row %d column %s key: %w", r, columns[i], err)
					}
					c.data = appendShort(c.data, b, n)
					b = b[n:]
					if n, err = stringLen(b); err != nil {
						return fmt.Errorf("native: row %d column %s value: %w", r, columns[i], err)
					}
					c.values = appendShort(c.values, b, n)
					b = b[n:]
				}
				entries := count
				if l := len(c.offsets); l > 0 {
					entries += c.offsets[l-1]
				}
				c.offsets = append(c.offsets, entries)
			}
		}
	}
	if len(b) != 0 {
		return fmt.Errorf("native: %d bytes after %d rows", len(b), rows)
	}
	return nil
}

// assemble returns the Native block of the rows in the columns, as pieces
// that reference nb's buffers: valid until nb changes.
func (nb *nativeBuilder) assemble(columns []string, wire []wireColumn) [][]byte {
	rows := nb.rows
	ntext := len(nb.texts)

	// The header pieces live in hdr; it is sized first so that appending
	// never moves the pieces already taken from it.
	need := 20
	for i, w := range wire {
		need += 20 + len(columns[i]) + len(w.typ) + 8*len(nb.cols[i].offsets) + len(w.text) + lowCardHeader
	}
	if cap(nb.hdr) < need {
		nb.hdr = make([]byte, 0, need)
	}
	hdr := nb.hdr[:0]
	parts := nb.parts[:0]
	mark := 0
	piece := func() {
		if len(hdr) > mark {
			parts = append(parts, hdr[mark:len(hdr):len(hdr)])
			mark = len(hdr)
		}
	}
	hdr = binary.AppendUvarint(hdr, uint64(len(wire)+ntext))
	hdr = binary.AppendUvarint(hdr, uint64(rows))
	for i, w := range wire {
		hdr = appendString(hdr, columns[i])
		hdr = appendString(hdr, w.typ)
		c := &nb.cols[i]
		for _, o := range c.offsets {
			hdr = binary.LittleEndian.AppendUint64(hdr, o)
		}
		lowCard := w.kind == wireLowCard && rows > 0 // no rows: no data at all
		if lowCard {
			hdr = c.appendDictHeader(hdr)
		}
		piece()
		if len(c.data) > 0 {
			parts = append(parts, c.data)
		}
		if lowCard {
			hdr = binary.LittleEndian.AppendUint64(hdr, uint64(rows))
			piece()
		}
		if len(c.values) > 0 {
			parts = append(parts, c.values)
		}
	}
	t := 0
	for _, w := range wire {
		if w.text == "" {
			continue
		}
		hdr = appendString(hdr, w.text)
		hdr = appendString(hdr, "String")
		piece()
		if d := nb.texts[t].data; len(d) > 0 {
			parts = append(parts, d)
		}
		t++
	}
	nb.hdr, nb.parts = hdr, parts
	return parts
}

// ipTextCache remembers the text of recently seen addresses. Flow rows
// repeat addresses (pods, Service VIPs, exporters) far more often than they
// bring new ones, and a lookup is several times cheaper than formatting.
type ipTextCache struct {
	e [1 << 12]struct {
		k0, k1 uint64 // the address's bytes, as two little-endian words
		n      uint8  // text length + 1; 0: empty slot
		text   [maxIPText]byte
	}
}

const maxIPText = 45 // longest IPv6 text, dotted tail included

// appendWords appends the Native/RowBinary string of appendIPText for the
// address whose bytes are the little-endian words k0, k1. Words rather than a [16]byte: a 16-byte load
// of a value just stored as two words stalls the CPU (no store forwarding).
func (c *ipTextCache) appendWords(b []byte, k0, k1 uint64) []byte {
	h := (k0*0x9e3779b97f4a7c15 ^ k1) * 0xbf58476d1ce4e5b9
	slot := &c.e[h>>(64-12)]
	if slot.n == 0 || slot.k0 != k0 || slot.k1 != k1 {
		var a [16]byte
		binary.LittleEndian.PutUint64(a[:8], k0)
		binary.LittleEndian.PutUint64(a[8:], k1)
		t := appendIPText(slot.text[:0], a)
		slot.k0, slot.k1, slot.n = k0, k1, uint8(copy(slot.text[:], t)+1)
	}
	n := int(slot.n - 1)
	l := len(b)
	if n <= 31 && cap(b)-l >= 32 {
		// One fixed 32-byte copy (the text array is longer), no memmove.
		b = b[:l+32]
		b[l] = byte(n)
		*(*[31]byte)(b[l+1:]) = [31]byte(slot.text[:31])
		return b[:l+1+n]
	}
	b = append(b, byte(n)) // at most maxIPText: a one-byte uvarint
	return append(b, slot.text[:n]...)
}

// appendIPText appends the text the flows table shows for an IPv6 column
// value, exactly as its DEFAULT expression (migrations' ipText) computes it:
// "" for ::, a dotted quad for an IPv4-mapped address, and otherwise
// ClickHouse's IPv6NumToString, which is RFC 5952 text except that an
// IPv4-compatible address (::a.b.c.d, deprecated) keeps its dotted tail.
func appendIPText(b []byte, a [16]byte) []byte {
	addr := netip.AddrFrom16(a)
	switch {
	case a == [16]byte{}:
		return b
	case addr.Is4In6():
		return addr.Unmap().AppendTo(b)
	case [12]byte(a[:12]) == [12]byte{} && (a[12] != 0 || a[13] != 0):
		b = append(b, ':', ':')
		return netip.AddrFrom4([4]byte(a[12:])).AppendTo(b)
	}
	return addr.AppendTo(b)
}

// appendShort appends src[:n] to dst. For n <= 32, when src holds 32
// bytes and dst has room for 32, it copies one fixed 32-byte word and keeps
// n of it: a value of a flow row is usually that short, and a memmove call
// per value was a third of build's time. It is small enough to inline.
func appendShort(dst, src []byte, n int) []byte {
	l := len(dst)
	if n > 32 || len(src) < 32 || cap(dst)-l < 32 {
		return appendGrow(dst, src, n)
	}
	*(*[32]byte)(dst[l : l+32]) = [32]byte(src[:32])
	return dst[:l+n]
}

// appendGrow is appendShort's slow path; it leaves room for the next value.
func appendGrow(dst, src []byte, n int) []byte {
	dst = slices.Grow(dst, n+32)
	return append(dst, src[:n]...)
}

// stringLen returns the length of the RowBinary string at the start of b,
// prefix included.
func stringLen(b []byte) (int, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)-k) {
		return 0, ErrShortRow
	}
	return k + int(n), nil
}
