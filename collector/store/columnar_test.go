package store

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/dualflow/dualflow/flow"
)

// columnarCases are records whose strings cross every fast-path boundary
// (edgeStringRecords, both families, every optional field set), zero records (no addresses, no times) and
// benchmark-shaped records with shared label maps.
func columnarCases() []flow.Record {
	recs := append(edgeStringRecords(), flow.Record{}, flow.Record{SrcAddr: netip.MustParseAddr("fd00:10::1")}, flow.Record{IPVersion: 4})
	return append(recs, benchFlows(500)...)
}

func joinParts(parts [][]byte) []byte { return bytes.Join(parts, nil) }

// TestAppendRecordMatchesBuild holds the two ways to a Native block to the
// same bytes: columns encoded from the records (the writer's way for the
// embedded engine) and RowBinary rows transposed by build (the spool
// replay's way), with and without the label cache, over two batches in the
// same builder.
func TestAppendRecordMatchesBuild(t *testing.T) {
	if len(flowWire) != flowCols || len(FlowColumns) != flowCols {
		t.Fatalf("flowWire has %d columns, FlowColumns %d, want %d", len(flowWire), len(FlowColumns), flowCols)
	}
	texts := 0
	for _, w := range flowWire {
		if w.text != "" {
			texts++
		}
	}
	if texts != flowTextCols {
		t.Fatalf("%d text columns, want %d", texts, flowTextCols)
	}
	recs := columnarCases()
	var ref nativeBuilder
	wantBlock, err := ref.build(FlowColumns, flowWire, len(recs), encodeRows(recs))
	if err != nil {
		t.Fatal(err)
	}
	want := joinParts(wantBlock)
	var lc labelCache
	for _, cache := range []*labelCache{nil, &lc, &lc} {
		var nb nativeBuilder
		for round := range 2 {
			nb.reset(flowWire)
			for i := range recs {
				nb.appendRecord(&recs[i], cache)
			}
			if nb.rows != len(recs) {
				t.Fatalf("rows %d, want %d", nb.rows, len(recs))
			}
			got := joinParts(nb.assemble(FlowColumns, flowWire))
			if !bytes.Equal(got, want) {
				for i := range flowWire {
					g, w := nb.cols[i], ref.cols[i]
					if !bytes.Equal(g.data, w.data) || !bytes.Equal(g.values, w.values) || len(g.offsets) != len(w.offsets) {
						t.Errorf("cache %v round %d: column %s differs", cache != nil, round, FlowColumns[i])
					}
				}
				for i := range nb.texts {
					if !bytes.Equal(nb.texts[i].data, ref.texts[i].data) {
						t.Errorf("cache %v round %d: text column %d differs", cache != nil, round, i)
					}
				}
				t.Fatalf("cache %v round %d: block of %d bytes differs from build's %d", cache != nil, round, len(got), len(want))
			}
			if sz := nb.size(); sz <= 0 || sz > len(got) {
				t.Errorf("size %d for a block of %d bytes", sz, len(got))
			}
		}
	}
}

// TestColumnsToRowBinary: a columnar batch turned back into rows (for the
// spool) gives AppendFlowRow's bytes, and a damaged block is an error.
func TestColumnsToRowBinary(t *testing.T) {
	recs := columnarCases()
	var nb nativeBuilder
	nb.reset(flowWire)
	var lc labelCache
	for i := range recs {
		nb.appendRecord(&recs[i], &lc)
	}
	got, err := nb.rowBinary([]byte("prefix"), flowWire)
	if err != nil {
		t.Fatal(err)
	}
	if want := append([]byte("prefix"), encodeRows(recs)...); !bytes.Equal(got, want) {
		t.Fatalf("rowBinary gives %d bytes, AppendFlowRow %d", len(got), len(want))
	}
	var back []flow.Record
	for b := got[len("prefix"):]; len(b) > 0; {
		var r flow.Record
		if b, err = DecodeFlowRow(b, &r); err != nil {
			t.Fatal(err)
		}
		back = append(back, r)
	}
	if len(back) != len(recs) {
		t.Fatalf("%d rows back, want %d", len(back), len(recs))
	}

	// Damage: one row more than the columns hold, a string column cut
	// short, a fixed column cut short.
	nb.rows++
	if _, err := nb.rowBinary(nil, flowWire); err == nil {
		t.Error("rows beyond the columns: no error")
	}
	nb.rows--
	for _, i := range []int{22, 0} {
		saved := nb.cols[i].data
		nb.cols[i].data = saved[:len(saved)-1]
		if _, err := nb.rowBinary(nil, flowWire); err == nil {
			t.Errorf("column %s cut by a byte: no error", FlowColumns[i])
		}
		nb.cols[i].data = saved
	}
}

// BenchmarkAppendRecord is the writer's per-row cost: a record into the
// columns of a Native block.
func BenchmarkAppendRecord(b *testing.B) {
	recs := benchFlows(50_000)
	var nb nativeBuilder
	var lc labelCache
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		nb.reset(flowWire)
		for i := range recs {
			nb.appendRecord(&recs[i], &lc)
		}
		nb.assemble(FlowColumns, flowWire)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/row")
}

// TestAddrWords: the words are appendAddr's bytes for every kind of
// address.
func TestAddrWords(t *testing.T) {
	for _, s := range []string{"198.18.0.1", "0.0.0.0", "198.19.255.255", "::ffff:198.18.0.1", "fd00:10::1", "fd00:10:ffff:ffff:ffff:ffff:ffff:ffff", "::", "::1", "fd00:10::1%eth0"} {
		a := netip.MustParseAddr(s)
		k0, k1 := addrWords(a)
		var got [16]byte
		binary.LittleEndian.PutUint64(got[:8], k0)
		binary.LittleEndian.PutUint64(got[8:], k1)
		if want := a.As16(); got != want {
			t.Errorf("%s: words give % x, want % x", s, got, want)
		}
	}
	if k0, k1 := addrWords(netip.Addr{}); k0 != 0 || k1 != 0 {
		t.Errorf("zero Addr: %x %x", k0, k1)
	}
}
