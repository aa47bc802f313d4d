package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/flow"
)

// TestLowCardIndexWidths: the indexes take the smallest width that holds
// the dictionary, widen as it grows past 256 and 65536 keys, and read back
// as the values appended.
func TestLowCardIndexWidths(t *testing.T) {
	for _, tc := range []struct{ keys, width, typ int }{
		{1, 1, 0}, {256, 1, 0}, {257, 2, 1}, {65536, 2, 1}, {65537, 4, 2},
	} {
		t.Run(fmt.Sprint(tc.keys), func(t *testing.T) {
			var c nativeColumn
			var want []string
			for i := range tc.keys + 10 { // every key, then ten repeats
				s := fmt.Sprint(i % tc.keys)
				if i%tc.keys == 0 {
					s = "" // the empty string is a key like another
				}
				c.lc(s)
				want = append(want, s)
			}
			if len(c.values) != len(want)*tc.width {
				t.Fatalf("%d bytes of indexes for %d rows, want width %d", len(c.values), len(want), tc.width)
			}
			hdr := c.appendDictHeader(nil)
			if v, flags, n := binary.LittleEndian.Uint64(hdr), binary.LittleEndian.Uint64(hdr[8:]), binary.LittleEndian.Uint64(hdr[16:]); v != 1 || flags != uint64(tc.typ)|1<<9|1<<10 || n != uint64(tc.keys) {
				t.Errorf("header: version %d, flags %#x, keys %d", v, flags, n)
			}
			got := lowCardValues(t, &c, len(want))
			var w []byte
			for _, s := range want {
				w = appendString(w, s)
			}
			if string(got) != string(w) {
				t.Error("values read back differ from the values appended")
			}
			c.resetDict()
			if tc.keys > maxKeptDictionary && c.dict != nil {
				t.Errorf("a dictionary of %d keys is kept for the next batch", tc.keys)
			}
			if len(c.dict) != 0 {
				t.Errorf("%d keys after reset", len(c.dict))
			}
		})
	}
}

// lowCardRecords returns n records whose LowCardinality columns have
// different numbers of distinct values: one (the empty string), 256, 257,
// 65536 and n (keyed by Mark), and long and empty values.
func lowCardRecords(n int) []flow.Record {
	recs := make([]flow.Record, n)
	for i := range recs {
		r := sampleRecord(i, i%2 == 1)
		r.Mark = uint32(i)
		r.TCPState = ""
		r.ExporterNode = fmt.Sprintf("node-%d", i%256)
		r.Source = fmt.Sprintf("source-%d", i%257)
		r.Src.NodeName = fmt.Sprintf("src-%d", i%65536)
		r.Dst.NodeName = fmt.Sprintf("dst-%d", i)
		r.Src.Zone = strings.Repeat("z", i%3*100) // 0, 100 and 200 bytes: a two-byte length
		r.ProbeTraceID = ""
		if i%1000 == 999 {
			r.ProbeTraceID = "tf-1"
		}
		recs[i] = r
	}
	return recs
}

// TestLowCardinalityRoundTrip inserts blocks whose LowCardinality columns
// take every index width, one distinct value, empty and long values, into
// the engine, both ways a block is made (the writer's appendRecord and
// build from the spool's rows), and reads every value back.
func TestLowCardinalityRoundTrip(t *testing.T) {
	e := needEngine(t)
	ctx := context.Background()
	cols := "ct_mark, tcp_state, exporter_node, source, src_node, dst_node, length(src_zone), probe_trace_id, src_pod_namespace, egress_reported_policy"
	for _, tc := range []struct {
		name string
		recs []flow.Record
	}{
		{"widths", lowCardRecords(65537)},
		{"one row", lowCardRecords(1)},
		{"edge strings", edgeStringRecords()},
	} {
		var want strings.Builder
		for i, r := range tc.recs {
			mark := r.Mark
			if tc.name == "edge strings" {
				mark = uint32(i)
				tc.recs[i].Mark = mark
			}
			fmt.Fprintf(&want, "%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\n", mark, r.TCPState, r.ExporterNode, r.Source,
				r.Src.NodeName, r.Dst.NodeName, len(r.Src.Zone), r.ProbeTraceID, r.Src.PodNamespace, r.Egress.ReportedName)
		}
		for _, path := range []string{"columns", "rows"} {
			t.Run(tc.name+"/"+path, func(t *testing.T) {
				truncate(t, e)
				var nb nativeBuilder
				nb.reset(flowWire)
				for i := range tc.recs {
					nb.appendRecord(&tc.recs[i], nil)
				}
				var err error
				if path == "columns" {
					err = e.insertColumns(ctx, FlowsTable, "", &nb)
				} else {
					// The spool's rows (AppendFlowRow's bytes: TestColumnsToRowBinary).
					data, rerr := nb.rowBinary(nil, flowWire)
					if rerr != nil {
						t.Fatal(rerr)
					}
					err = e.InsertRowBinary(ctx, FlowsTable, FlowColumns, "", len(tc.recs), data)
				}
				if err != nil {
					t.Fatal(err)
				}
				out, err := e.Query(ctx, "SELECT "+cols+" FROM dualflow.flows ORDER BY ct_mark", "TSVRaw")
				if err != nil {
					t.Fatal(err)
				}
				if got := string(out); got != want.String() {
					gl, wl := strings.Split(got, "\n"), strings.Split(want.String(), "\n")
					for i := range min(len(gl), len(wl)) {
						if gl[i] != wl[i] {
							t.Fatalf("line %d (of %d, want %d):\n%q\nwant\n%q", i, len(gl), len(wl), gl[i], wl[i])
						}
					}
					t.Fatalf("%d lines, want %d", len(gl), len(wl))
				}
			})
		}
	}
}

// TestLowCardColumnsMatchTable: the columns sent as LowCardinality are the
// flows table's LowCardinality(String) columns among FlowColumns, so no
// such column is sent as String for the engine to hash row by row.
func TestLowCardColumnsMatchTable(t *testing.T) {
	e := needEngine(t)
	out, err := e.Query(context.Background(), "SELECT name FROM system.columns WHERE database = 'dualflow' AND table = 'flows' AND type = 'LowCardinality(String)' ORDER BY name", "TSVRaw")
	if err != nil {
		t.Fatal(err)
	}
	table := map[string]bool{}
	for _, n := range strings.Fields(string(out)) {
		table[n] = true
	}
	for i, w := range flowWire {
		if sent := w.kind == wireLowCard; sent != table[FlowColumns[i]] {
			t.Errorf("column %s: sent as LowCardinality %v, LowCardinality(String) in the table %v", FlowColumns[i], sent, table[FlowColumns[i]])
		}
	}
}
