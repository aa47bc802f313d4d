package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/flow"
)

// appendColumn is appendWords for the address a.
func (c *ipTextCache) appendColumn(b []byte, a [16]byte) []byte {
	return c.appendWords(b, binary.LittleEndian.Uint64(a[:8]), binary.LittleEndian.Uint64(a[8:]))
}

// ipTextCases are addresses whose text has a special form, plus random lab
// addresses (fd00:10::/32) in which each later 16-bit group is zero half
// the time (zero runs of every length and position, ties included). Only
// lab, loopback and unspecified addresses: they are data here, but the
// project uses no others.
func ipTextCases(n int) [][16]byte {
	var out [][16]byte
	for _, s := range []string{
		"::", "::1", "::0.0.0.1", "::198.18.0.1", "::198.19.255.255", "::ffff:0.0.0.0",
		"::ffff:198.18.0.1", "::ffff:198.19.255.255", "::fffe:198.18.0.1", "::ffff:0:198.18.0.1", "::1:ffff:198.18.0.1",
		"fd00:10::", "fd00:10:0:2:0:0:3:4", "fd00:10:0:0:2:0:0:4", "fd00:10:1:2:3:4:5:0", "fd00:10:0:1:2:3:4:5",
		"fd00:10::1", "fd00:10:0:1::", "fd00:10:0:0:1:0:0:1", "fd00:10:ffff:ffff:ffff:ffff:ffff:ffff",
		"198.18.0.1", "198.19.255.255", "127.0.0.1", "0.0.0.0",
	} {
		a := netip.MustParseAddr(s)
		out = append(out, a.As16())
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range n {
		a := [16]byte{0xfd, 0x00, 0x00, 0x10}
		for g := 2; g < 8; g++ {
			if r.IntN(2) == 0 {
				binary.BigEndian.PutUint16(a[2*g:], uint16(r.IntN(1<<16)))
			}
		}
		out = append(out, a)
	}
	return out
}

// TestAppendIPTextMatchesEngine checks the Go formatting of the address
// text columns against the table's own DEFAULT expression, evaluated by the
// engine, so rows the writer inserts and rows a user inserts with only the
// *_in columns show the same text.
func TestAppendIPTextMatchesEngine(t *testing.T) {
	e := needEngine(t)
	ctx := context.Background()
	exprOut, err := e.Query(ctx, "SELECT default_expression FROM system.columns WHERE database = 'dualflow' AND table = 'flows' AND name = 'src_ip'", "TSVRaw")
	if err != nil {
		t.Fatal(err)
	}
	expr := strings.TrimSpace(string(exprOut))
	if !strings.Contains(expr, "src_ip_in") {
		t.Fatalf("src_ip default expression %q does not use src_ip_in", expr)
	}
	cases := ipTextCases(3000)
	var lits []string
	for _, a := range cases {
		lits = append(lits, "'"+netip.AddrFrom16(a).String()+"'")
	}
	q := "SELECT " + expr + " FROM (SELECT toIPv6(arrayJoin([" + strings.Join(lits, ",") + "])) AS src_ip_in)"
	out, err := e.Query(ctx, q, "TSVRaw")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(got) != len(cases) {
		t.Fatalf("engine returned %d rows, want %d", len(got), len(cases))
	}
	bad := 0
	cache := new(ipTextCache)
	for i, a := range cases {
		// Through the cache, twice: a miss and then a hit (or a collision).
		for range 2 {
			col := cache.appendColumn(nil, a)
			if len(col) == 0 || int(col[0]) != len(col)-1 || string(col[1:]) != got[i] {
				t.Errorf("%s: cached column value %q, engine %q", netip.AddrFrom16(a), col, got[i])
			}
		}
		if g := string(appendIPText(nil, a)); g != got[i] {
			bad++
			if bad <= 10 {
				t.Errorf("%s: Go %q, engine %q", netip.AddrFrom16(a), g, got[i])
			}
		}
	}
}

func BenchmarkNativeBuild(b *testing.B) {
	recs := benchFlows(50_000)
	data := encodeRows(recs)
	var nb nativeBuilder
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if _, err := nb.build(FlowColumns, flowWire, len(recs), data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)*float64(len(recs))/b.Elapsed().Seconds(), "rows/s")
}

// TestNativeBuildRejectsShortRows: a truncated batch is an error, never a
// block with the wrong row count.
func TestNativeBuildRejectsShortRows(t *testing.T) {
	recs := benchFlows(3)
	data := encodeRows(recs)
	var nb nativeBuilder
	if _, err := nb.build(FlowColumns, flowWire, 3, data); err != nil {
		t.Fatal(err)
	}
	for _, cut := range []int{1, 17, len(data) / 2, len(data) - 1} {
		if _, err := nb.build(FlowColumns, flowWire, 3, data[:len(data)-cut]); err == nil {
			t.Errorf("build of a batch cut by %d bytes: no error", cut)
		}
	}
	if _, err := nb.build(FlowColumns, flowWire, 2, data); err == nil {
		t.Error("build of 2 rows from 3 rows of data: no error")
	}
}

// edgeStringRecords are records, of both families, whose strings and
// labels are 0, 1, 15, 16, 17, 31, 32, 33, 127, 128 and 200 bytes long:
// every boundary of the encoders' fast paths, a two-byte length included.
func edgeStringRecords() []flow.Record {
	var recs []flow.Record
	for i, n := range []int{0, 1, 15, 16, 17, 31, 32, 33, 127, 128, 200, 0, 1, 2} {
		r := sampleRecord(i, i%2 == 1)
		s := strings.Repeat(string(rune('a'+i)), n)
		r.TCPState, r.ExporterNode, r.Src.PodName, r.Dst.WorkloadName, r.Egress.ReportedName = s, s, s, s, s
		r.Src.Labels = map[string]string{s + "k": s, "app": s}
		if n == 0 {
			r.Dst.Labels = nil
		}
		recs = append(recs, r)
	}
	return recs
}

// encodeRows encodes recs as RowBinary rows of FlowColumns.
func encodeRows(recs []flow.Record) []byte {
	var data []byte
	for i := range recs {
		data = AppendFlowRow(data, &recs[i])
	}
	return data
}

// TestNativeBuildMatchesPlainTransposition checks build's columns against a
// plain transposition (one append per value, lengths parsed with
// stringLen), on rows whose strings cross every fast-path boundary: empty,
// 16, 31, 32, 33 and 200 bytes (a two-byte length), in every string and
// map column, with the last rows closer to the end of the data than the
// fast path's 32-byte copy.
func TestNativeBuildMatchesPlainTransposition(t *testing.T) {
	recs := edgeStringRecords()
	data := encodeRows(recs)
	var nb nativeBuilder
	if _, err := nb.build(FlowColumns, flowWire, len(recs), data); err != nil {
		t.Fatal(err)
	}
	want := make([]nativeColumn, len(flowWire))
	b := data
	take := func(n int) []byte { v := b[:n]; b = b[n:]; return v }
	str := func() []byte {
		n, err := stringLen(b)
		if err != nil {
			t.Fatal(err)
		}
		return take(n)
	}
	for range recs {
		for i, w := range flowWire {
			c := &want[i]
			switch w.kind {
			case wireFixed:
				c.data = append(c.data, take(w.size)...)
			case wireString, wireLowCard:
				c.data = append(c.data, str()...)
			case wireMap:
				count, k := binary.Uvarint(b)
				take(k)
				for range count {
					c.data = append(c.data, str()...)
					c.values = append(c.values, str()...)
				}
				total := count
				if l := len(c.offsets); l > 0 {
					total += c.offsets[l-1]
				}
				c.offsets = append(c.offsets, total)
			}
		}
	}
	for i := range want {
		g, w := nb.cols[i], want[i]
		if flowWire[i].kind == wireLowCard {
			g = nativeColumn{data: lowCardValues(t, &g, len(recs))}
		}
		if string(g.data) != string(w.data) || string(g.values) != string(w.values) || fmt.Sprint(g.offsets) != fmt.Sprint(w.offsets) {
			t.Errorf("column %s differs from the plain transposition", FlowColumns[i])
		}
	}
}

// lowCardValues returns the rows of a LowCardinality column as the
// Strings of a String column.
func lowCardValues(t testing.TB, c *nativeColumn, rows int) []byte {
	t.Helper()
	keys, err := c.dictKeys()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(c.dict) {
		t.Fatalf("dictionary of %d keys, map of %d", len(keys), len(c.dict))
	}
	var out []byte
	for r := range rows {
		j, ok := c.index(r, len(keys))
		if !ok {
			t.Fatalf("row %d: no index", r)
		}
		out = append(out, keys[j]...)
	}
	if len(c.values) != rows*indexWidth(len(keys)) {
		t.Fatalf("%d bytes of indexes for %d rows of %d keys", len(c.values), rows, len(keys))
	}
	return out
}
