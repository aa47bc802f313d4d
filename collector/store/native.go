package store

import (
	"encoding/binary"
	"fmt"
)

// The embedded engine parses RowBinary row by row, and building
// LowCardinality dictionaries one value at a time made RowBinary inserts of
// the wide flows row 2x slower than the same data in the columnar Native
// format. The writer keeps RowBinary as its batch and spool format (compact,
// append-only, decodable row by row), and the embedded backend transposes a
// batch into one Native block just before inserting it.

// wireKind is how one column of a flow row is laid out in RowBinary, which
// for these types is also its Native layout per value.
type wireKind uint8

const (
	wireFixed  wireKind = iota // n bytes
	wireString                 // uvarint length + bytes
	wireMap                    // uvarint count + count × (string key, string value)
)

type wireColumn struct {
	kind wireKind
	size int    // bytes, for wireFixed
	typ  string // type declared in the Native header; the engine converts it to the table's type
}

// flowWire describes FlowColumns in order. LowCardinality and Enum columns
// are declared as String and Int8: the engine converts whole columns, which
// is cheap, and the table definition stays the only place that names them.
var flowWire = func() []wireColumn {
	f := func(n int, typ string) wireColumn { return wireColumn{kind: wireFixed, size: n, typ: typ} }
	str := wireColumn{kind: wireString, typ: "String"}
	ip := f(16, "IPv6")
	u8, u16, u32, u64, i8 := f(1, "UInt8"), f(2, "UInt16"), f(4, "UInt32"), f(8, "UInt64"), f(1, "Int8")
	ts := f(8, "DateTime64(3, 'UTC')")
	labels := wireColumn{kind: wireMap, typ: "Map(String, String)"}
	policy := []wireColumn{str, str, f(4, "Int32"), i8, i8, str}
	cols := []wireColumn{
		ts, ts, ts, // flow_start, flow_end, time_received
		u8, ip, ip, u16, u16, u8, // ip_version, src_ip_in, dst_ip_in, src_port, dst_port, protocol
		ip, u16, ip, u16, // service_ip_in, service_port, snat_ip_in, snat_port
		u64, u64, u64, u64, u64, u64, u64, u64, // counters
		i8, str, u16, u32, // end_reason, tcp_state, ct_zone, ct_mark
		ip, u32, str, str, // exporter_ip_in, observation_domain_id, exporter_node, source
		str, str, labels, str, str, str, str, // src endpoint
		str, str, labels, str, str, str, str, // dst endpoint
		str, str, str, // dst_service_*
		i8, i8, // flow_type, correlation
	}
	cols = append(cols, policy...)
	cols = append(cols, policy...)
	return append(cols, f(1, "Bool")) // verdict_mismatch
}()

// nativeBuilder transposes RowBinary rows into a Native block. It keeps its
// buffers between batches; it is not safe for concurrent use.
type nativeBuilder struct {
	cols []nativeColumn
	out  []byte
}

type nativeColumn struct {
	data    []byte   // values (for a map: keys)
	values  []byte   // map values
	offsets []uint64 // map offsets (cumulative entry counts)
}

// build returns the Native block (revision 0: no block info, no
// serialization kinds) for rows RowBinary rows of the given columns. The
// returned slice is valid until the next call.
func (nb *nativeBuilder) build(columns []string, wire []wireColumn, rows int, data []byte) ([]byte, error) {
	if len(columns) != len(wire) {
		return nil, fmt.Errorf("native: %d columns but %d wire descriptions", len(columns), len(wire))
	}
	if len(nb.cols) != len(wire) {
		nb.cols = make([]nativeColumn, len(wire))
	}
	for i := range nb.cols {
		c := &nb.cols[i]
		c.data, c.values, c.offsets = c.data[:0], c.values[:0], c.offsets[:0]
	}
	b := data
	var entries uint64
	for r := 0; r < rows; r++ {
		for i := range wire {
			c := &nb.cols[i]
			switch w := &wire[i]; w.kind {
			case wireFixed:
				if len(b) < w.size {
					return nil, fmt.Errorf("native: row %d column %s: %w", r, columns[i], ErrShortRow)
				}
				c.data = append(c.data, b[:w.size]...)
				b = b[w.size:]
			case wireString:
				n, err := stringLen(b)
				if err != nil {
					return nil, fmt.Errorf("native: row %d column %s: %w", r, columns[i], err)
				}
				c.data = append(c.data, b[:n]...)
				b = b[n:]
			case wireMap:
				count, k := binary.Uvarint(b)
				if k <= 0 || count > uint64(len(b)) {
					return nil, fmt.Errorf("native: row %d column %s: %w", r, columns[i], ErrShortRow)
				}
				b = b[k:]
				for j := uint64(0); j < count; j++ {
					n, err := stringLen(b)
					if err != nil {
						return nil, fmt.Errorf("native: row %d column %s key: %w", r, columns[i], err)
					}
					c.data = append(c.data, b[:n]...)
					b = b[n:]
					if n, err = stringLen(b); err != nil {
						return nil, fmt.Errorf("native: row %d column %s value: %w", r, columns[i], err)
					}
					c.values = append(c.values, b[:n]...)
					b = b[n:]
				}
				entries = count
				if l := len(c.offsets); l > 0 {
					entries += c.offsets[l-1]
				}
				c.offsets = append(c.offsets, entries)
			}
		}
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("native: %d bytes after %d rows", len(b), rows)
	}
	out := nb.out[:0]
	out = binary.AppendUvarint(out, uint64(len(wire)))
	out = binary.AppendUvarint(out, uint64(rows))
	for i, w := range wire {
		out = appendString(out, columns[i])
		out = appendString(out, w.typ)
		c := &nb.cols[i]
		for _, o := range c.offsets {
			out = binary.LittleEndian.AppendUint64(out, o)
		}
		out = append(out, c.data...)
		out = append(out, c.values...)
	}
	nb.out = out
	return out, nil
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
