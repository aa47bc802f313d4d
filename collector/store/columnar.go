package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// appendRecord is the one encoder of a flow row. The writer encodes its
// batches column by column as Write receives the records, straight into the
// Native block the insert sends (the embedded engine, a server over HTTP).
// Encoding RowBinary rows and transposing them at insert time cost about 18%
// of the collector's CPU in BenchmarkEndToEnd/enriched; encoding the columns
// directly does the same work once. RowBinary stays the spool's format and
// the native protocol's input: rowBinary turns the columns into rows for
// them, and AppendFlowRow is the same path for one record.

// columnarConn is implemented by a Conn that inserts flows batches as Native
// blocks built by appendRecord. Like InsertRowBinary, insertColumns must not
// keep nb after it returns.
type columnarConn interface {
	Conn
	insertColumns(ctx context.Context, table, dedupToken string, nb *nativeBuilder) error
}

const (
	flowCols     = 63 // len(FlowColumns) and len(flowWire)
	flowTextCols = 5  // address text columns of flowWire
)

// appendRecord appends r as one row of FlowColumns, plus the address text
// columns, exactly as build makes it from the row rowBinary gives back (a
// test holds them to the same bytes). Label encodings are remembered in lc when it is
// not nil. nb must have been reset for flowWire.
func (nb *nativeBuilder) appendRecord(r *flow.Record, lc *labelCache) {
	c := (*[flowCols]nativeColumn)(nb.cols)
	t := (*[flowTextCols]nativeColumn)(nb.texts)
	ipc := nb.ipc
	c[0].u64(timeMillis(r.FlowStart))
	c[1].u64(timeMillis(r.FlowEnd))
	c[2].u64(timeMillis(r.TimeReceived))
	ipv := r.IPVersion
	if ipv == 0 {
		ipv = flow.Version(r.SrcAddr)
	}
	c[3].u8(ipv)
	c[4].addr(&t[0], ipc, r.SrcAddr)
	c[5].addr(&t[1], ipc, r.DstAddr)
	c[6].u16(r.SrcPort)
	c[7].u16(r.DstPort)
	c[8].u8(r.Proto)
	c[9].addr(&t[2], ipc, r.ServiceAddr)
	c[10].u16(r.ServicePort)
	c[11].addr(&t[3], ipc, r.SNATAddr)
	c[12].u16(r.SNATPort)
	c[13].u64(r.PacketsDelta)
	c[14].u64(r.BytesDelta)
	c[15].u64(r.ReversePacketsDelta)
	c[16].u64(r.ReverseBytesDelta)
	c[17].u64(r.Packets)
	c[18].u64(r.Bytes)
	c[19].u64(r.ReversePackets)
	c[20].u64(r.ReverseBytes)
	c[21].u8(byte(r.EndReason))
	c[22].lc(r.TCPState)
	c[23].u16(r.Zone)
	c[24].u32(r.Mark)
	c[25].addr(&t[4], ipc, r.ExporterAddr)
	c[26].u32(r.ObservationDomainID)
	c[27].lc(r.ExporterNode)
	c[28].lc(r.Source)
	appendEndpointColumns((*[7]nativeColumn)(c[29:36]), &r.Src, lc)
	appendEndpointColumns((*[7]nativeColumn)(c[36:43]), &r.Dst, lc)
	c[43].lc(r.Service.Namespace)
	c[44].str(r.Service.Name)
	c[45].lc(r.Service.PortName)
	c[46].u8(byte(r.Type))
	c[47].u8(byte(r.Correlation))
	appendPolicyColumns((*[6]nativeColumn)(c[48:54]), &r.Ingress)
	appendPolicyColumns((*[6]nativeColumn)(c[54:60]), &r.Egress)
	var mismatch uint8
	if r.VerdictMismatch() {
		mismatch = 1
	}
	c[60].u8(mismatch)
	c[61].u8(boolByte(r.K8sViewStale))
	c[62].lc(r.ProbeTraceID)
	nb.rows++
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func appendEndpointColumns(c *[7]nativeColumn, e *flow.Endpoint, lc *labelCache) {
	c[0].lc(e.PodNamespace)
	c[1].str(e.PodName)
	c[2].labels(e.Labels, lc)
	c[3].lc(e.WorkloadKind)
	c[4].str(e.WorkloadName)
	c[5].lc(e.NodeName)
	c[6].lc(e.Zone)
}

func appendPolicyColumns(c *[6]nativeColumn, p *flow.Policy) {
	c[0].lc(p.Namespace)
	c[1].lc(p.Name)
	rule := p.Rule
	if p.Name == "" {
		rule = -1 // as appendPolicy
	}
	c[2].u32(uint32(rule))
	c[3].u8(byte(p.Verdict))
	c[4].u8(byte(p.ReportedVerdict))
	c[5].lc(p.ReportedName)
}

// timeMillis is appendTime's value: milliseconds since the epoch, 0 for the
// zero time.
func timeMillis(t time.Time) uint64 {
	if t.IsZero() {
		return 0
	}
	return uint64(t.UnixMilli())
}

func (c *nativeColumn) u8(v uint8)   { c.data = append(c.data, v) }
func (c *nativeColumn) u16(v uint16) { c.data = binary.LittleEndian.AppendUint16(c.data, v) }
func (c *nativeColumn) u32(v uint32) { c.data = binary.LittleEndian.AppendUint32(c.data, v) }
func (c *nativeColumn) u64(v uint64) { c.data = binary.LittleEndian.AppendUint64(c.data, v) }

// str appends s as a Native (and RowBinary) String.
func (c *nativeColumn) str(s string) {
	if len(s) < 0x80 {
		c.data = append(c.data, byte(len(s)))
		if len(s) > 0 {
			c.data = append(c.data, s...)
		}
		return
	}
	c.data = appendString(c.data, s)
}

// addr appends a as an IPv6 value (appendAddr's bytes) and its text to the
// text column.
func (c *nativeColumn) addr(text *nativeColumn, ipc *ipTextCache, a netip.Addr) {
	if !a.IsValid() { // none (no Service, no SNAT): zero bytes, empty text
		c.data = append(c.data, make([]byte, 16)...)
		text.data = append(text.data, 0)
		return
	}
	k0, k1 := addrWords(a)
	l := len(c.data)
	if cap(c.data)-l < 16 {
		c.data = slices.Grow(c.data, 16)
	}
	c.data = c.data[:l+16]
	// Two word stores: see appendWords.
	binary.LittleEndian.PutUint64(c.data[l:], k0)
	binary.LittleEndian.PutUint64(c.data[l+8:], k1)
	text.data = ipc.appendWords(text.data, k0, k1)
}

// addrWords returns appendAddr's 16 bytes for a as two little-endian
// words. It reads them through AsSlice, which the compiler keeps on the
// stack and reads back a word at a time. As16 would store its [16]byte as
// two words and copy it as one 16-byte value: a load the CPU cannot
// forward from those stores, a stall that was most of addr's time.
func addrWords(a netip.Addr) (k0, k1 uint64) {
	switch s := a.AsSlice(); len(s) {
	case 4: // ::ffff:a.b.c.d
		return 0, 0xffff<<16 | uint64(binary.LittleEndian.Uint32(s))<<32
	case 16:
		return binary.LittleEndian.Uint64(s[:8]), binary.LittleEndian.Uint64(s[8:])
	}
	return 0, 0
}

// labels appends m as one Map(String, String) value, in key order.
func (c *nativeColumn) labels(m map[string]string, lc *labelCache) {
	if len(m) > 0 {
		if lc != nil {
			keys, vals := lc.columns(m)
			c.data = append(c.data, keys...)
			c.values = append(c.values, vals...)
		} else {
			c.data, c.values = appendLabelColumns(c.data, c.values, m)
		}
	}
	total := uint64(len(m))
	if l := len(c.offsets); l > 0 {
		total += c.offsets[l-1]
	}
	c.offsets = append(c.offsets, total)
}

// appendLabelColumns appends m's keys and values, in key order, as Strings.
func appendLabelColumns(keys, vals []byte, m map[string]string) ([]byte, []byte) {
	var arr [32]string
	ks := arr[:0]
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	for _, k := range ks {
		keys = appendString(keys, k)
		vals = appendString(vals, m[k])
	}
	return keys, vals
}

// size returns the bytes held by the columns.
func (nb *nativeBuilder) size() int {
	n := 0
	for i := range nb.cols {
		c := &nb.cols[i]
		n += len(c.data) + len(c.values) + 8*len(c.offsets)
	}
	for i := range nb.texts {
		n += len(nb.texts[i].data)
	}
	return n
}

// rowBinary appends nb's rows to dst as RowBinary rows of the wire layout:
// the rows the spool keeps for the same records (the text columns are
// left out: the table derives them). It is the way back from a columnar
// batch to the spool's format.
func (nb *nativeBuilder) rowBinary(dst []byte, wire []wireColumn) ([]byte, error) {
	if len(nb.cols) != len(wire) {
		return dst, fmt.Errorf("native: %d columns for %d wire descriptions", len(nb.cols), len(wire))
	}
	type cursor struct{ data, values int }
	cur := make([]cursor, len(wire))
	short := func(r, i int) error {
		return fmt.Errorf("native to rowbinary: row %d column %d: %w", r, i, ErrShortRow)
	}
	dicts := make([][][]byte, len(wire)) // the LowCardinality columns' keys
	for i := range wire {
		if wire[i].kind == wireLowCard {
			var err error
			if dicts[i], err = nb.cols[i].dictKeys(); err != nil {
				return dst, fmt.Errorf("native to rowbinary: column %d: %w", i, err)
			}
		}
	}
	for r := 0; r < nb.rows; r++ {
		for i := range wire {
			c, k := &nb.cols[i], &cur[i]
			switch w := &wire[i]; w.kind {
			case wireFixed:
				if len(c.data)-k.data < w.size {
					return dst, short(r, i)
				}
				dst = append(dst, c.data[k.data:k.data+w.size]...)
				k.data += w.size
			case wireString:
				n, err := stringLen(c.data[k.data:])
				if err != nil {
					return dst, short(r, i)
				}
				dst = append(dst, c.data[k.data:k.data+n]...)
				k.data += n
			case wireLowCard:
				j, ok := c.index(r, len(dicts[i]))
				if !ok {
					return dst, short(r, i)
				}
				dst = append(dst, dicts[i][j]...)
			case wireMap:
				if r >= len(c.offsets) {
					return dst, short(r, i)
				}
				count := c.offsets[r]
				if r > 0 {
					count -= c.offsets[r-1]
				}
				dst = binary.AppendUvarint(dst, count)
				for range count {
					n, err := stringLen(c.data[k.data:])
					if err != nil {
						return dst, short(r, i)
					}
					dst = append(dst, c.data[k.data:k.data+n]...)
					k.data += n
					if n, err = stringLen(c.values[k.values:]); err != nil {
						return dst, short(r, i)
					}
					dst = append(dst, c.values[k.values:k.values+n]...)
					k.values += n
				}
			}
		}
	}
	return dst, nil
}

// colSizes are the lengths of a builder's column buffers: data, values
// and offsets of each column, then data of each text column.
type colSizes []int

// sizes returns nb's buffer lengths.
func (nb *nativeBuilder) sizes() colSizes {
	out := make(colSizes, 0, 3*len(nb.cols)+len(nb.texts))
	for i := range nb.cols {
		c := &nb.cols[i]
		out = append(out, len(c.data), len(c.values), len(c.offsets))
	}
	for i := range nb.texts {
		out = append(out, len(nb.texts[i].data))
	}
	return out
}

// reserve gives nb's empty buffers room for about 1.1 times s (the sizes
// of the last sealed batch), so a new batch's columns do not grow from
// nothing by doubling: that copied about 1.1 GB per million rows.
func (nb *nativeBuilder) reserve(s colSizes) {
	if len(s) != 3*len(nb.cols)+len(nb.texts) {
		return
	}
	room := func(n int) int { return n + n/10 }
	for i := range nb.cols {
		c := &nb.cols[i]
		if n := room(s[3*i]); cap(c.data) < n {
			c.data = make([]byte, 0, n)
		}
		if n := room(s[3*i+1]); cap(c.values) < n {
			c.values = make([]byte, 0, n)
		}
		if n := room(s[3*i+2]); cap(c.offsets) < n {
			c.offsets = make([]uint64, 0, n)
		}
	}
	for i := range nb.texts {
		if n := room(s[3*len(nb.cols)+i]); cap(nb.texts[i].data) < n {
			nb.texts[i].data = make([]byte, 0, n)
		}
	}
}
