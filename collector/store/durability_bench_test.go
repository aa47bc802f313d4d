package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/collector/store/spool"
	"github.com/dualflow/dualflow/collector/wal"
	"github.com/dualflow/dualflow/flow"
)

// The collector's two disk layers, measured over the same rows (see the
// durability section of collector/README.md for what was decided from
// them): the write-ahead log journals every received record for a few
// seconds; the spool holds the encoded batches ClickHouse could not take,
// for as long as an outage lasts.

// durabilityBatchRows is the writer's default batch: the spool's unit.
const durabilityBatchRows = DefaultBatchRows

// durabilityChunk is how many records an IPFIX listener journals at once
// (its default batch).
const durabilityChunk = 1000

// rawRecords returns recs as the IPFIX decoder gives them before
// enrichment: no Kubernetes metadata, no verdicts.
func rawRecords(recs []flow.Record) []flow.Record {
	raw := make([]flow.Record, len(recs))
	for i, r := range recs {
		r.Src, r.Dst, r.Service = flow.Endpoint{}, flow.Endpoint{}, flow.Service{}
		r.Ingress, r.Egress = flow.Policy{}, flow.Policy{}
		r.Type, r.Correlation = 0, 0
		raw[i] = r
	}
	return raw
}

// walBytes returns dualflow_wal_bytes_total from reg.
func walBytes(b *testing.B, reg *prometheus.Registry) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		b.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "dualflow_wal_bytes_total" {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	b.Fatal("no dualflow_wal_bytes_total")
	return 0
}

// BenchmarkDurabilityWrite is the cost of each layer per row on its write
// path, and its bytes on disk per row. An op is one writer batch (100k
// rows):
//
//   - wal/raw: the records as decoded (no Kubernetes metadata), journaled
//     in listener batches of 1000 and acknowledged as the writer does once
//     their batch is stored: what every record pays, outage or not;
//   - wal/enriched: the same with every field filled, the largest record
//     the log can hold (an exporter may send pod names);
//   - spool: the enriched rows encoded as RowBinary, as the writer spools
//     them while ClickHouse is down: written, fsynced, renamed (the
//     encoding is the writer's, not counted here).
func BenchmarkDurabilityWrite(b *testing.B) {
	enriched := benchFlows(durabilityBatchRows)
	for _, tc := range []struct {
		name string
		recs []flow.Record
	}{{"wal/raw", rawRecords(enriched)}, {"wal/enriched", enriched}} {
		b.Run(tc.name, func(b *testing.B) {
			reg := prometheus.NewRegistry()
			l, err := wal.Open(wal.Config{Dir: b.TempDir()}, reg, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			recs := make([]flow.Record, len(tc.recs))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				copy(recs, tc.recs) // fresh, unjournaled records
				for i := 0; i < len(recs); i += durabilityChunk {
					if err := l.Append(recs[i:min(i+durabilityChunk, len(recs))]); err != nil {
						b.Fatal(err)
					}
				}
				l.AckRecords(recs)
			}
			rows := float64(b.N * len(recs))
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/rows, "ns/row")
			b.ReportMetric(walBytes(b, reg)/rows, "disk-B/row")
		})
	}
	b.Run("spool", func(b *testing.B) {
		var data []byte
		for i := range enriched {
			data = AppendFlowRow(data, &enriched[i])
		}
		sp, err := spool.Open(b.TempDir(), 1<<40)
		if err != nil {
			b.Fatal(err)
		}
		defer sp.Close()
		var size int64
		b.ReportAllocs()
		b.ResetTimer()
		n := 0
		for b.Loop() {
			n++
			batch := spool.Batch{Table: FlowsTable, Columns: FlowColumns, Token: fmt.Sprintf("%032x", n), Rows: len(enriched), Data: data}
			if err := sp.Push(batch); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			size = sp.Bytes()
			if err := sp.Pop(); err != nil { // keep the disk use at one batch
				b.Fatal(err)
			}
			b.StartTimer()
		}
		b.StopTimer()
		rows := float64(n * len(enriched))
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/rows, "ns/row")
		b.ReportMetric(float64(size)/float64(len(enriched)), "disk-B/row")
	})
}

// BenchmarkBacklogReplay replays an outage's backlog of 1M enriched rows
// into the embedded engine two ways, and stops each clock when every row
// is visible to a query:
//
//   - spool: a writer starting on a spool holding the backlog as the
//     writer spooled it (10 RowBinary batches), inserting them oldest
//     first, each under its dedup token;
//   - wal: a write-ahead log holding the same records unacknowledged
//     (what it would have to hold if it were the outage's only store),
//     replayed into a writer that acknowledges them. This leaves out the
//     stages a replay runs between the two (correlation, enrichment,
//     audit), so it is the least such a replay costs.
//
// An op runs each once, their order alternating from op to op (this shared
// VM's speed drifts). rows/s are over all ops.
func BenchmarkBacklogReplay(b *testing.B) {
	const total = 1_000_000
	e := needEngine(b)
	recs := embeddedBenchRecords(benchSrcPods)
	want := fmt.Sprint(total)
	batch := make([]flow.Record, durabilityChunk)
	row := func(i int) *flow.Record { embeddedBenchRecord(&batch[0], recs, i); return &batch[0] }
	ctx := context.Background()

	// run starts a writer with cfg, calls feed, and waits for every row.
	run := func(cfg WriterConfig, acker Acker, feed func(w *Writer)) {
		w, err := NewWriter(cfg, e, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		if acker != nil {
			w.SetAcker(acker)
		}
		rctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- w.Run(rctx) }()
		feed(w)
		for w.Stats().RowsWritten < total {
			time.Sleep(5 * time.Millisecond)
		}
		if got := queryString(b, e, "SELECT count() FROM dualflow.flows"); got != want {
			b.Fatalf("visible rows = %s, want %s", got, want)
		}
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	op := 0
	fromSpool := func() time.Duration {
		b.StopTimer()
		truncate(b, e)
		dir := b.TempDir()
		sp, err := spool.Open(dir, 1<<40)
		if err != nil {
			b.Fatal(err)
		}
		var data []byte
		for i := 0; i < total; i += durabilityBatchRows {
			data = data[:0]
			for j := i; j < i+durabilityBatchRows; j++ {
				data = AppendFlowRow(data, row(j))
			}
			op++
			if err := sp.Push(spool.Batch{Table: FlowsTable, Columns: FlowColumns, Token: fmt.Sprintf("%032x", op), Rows: durabilityBatchRows, Data: data}); err != nil {
				b.Fatal(err)
			}
		}
		sp.Close()
		b.StartTimer()
		t0 := time.Now()
		cfg := WriterConfig{SpoolDir: dir, SpoolMaxBytes: 1 << 40}
		cfg.SetDefaults()
		run(cfg, nil, func(*Writer) {})
		return time.Since(t0)
	}
	fromWAL := func() time.Duration {
		b.StopTimer()
		truncate(b, e)
		dir := b.TempDir()
		l, err := wal.Open(wal.Config{Dir: dir}, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		for i := 0; i < total; i += len(batch) {
			for j := range batch {
				embeddedBenchRecord(&batch[j], recs, i+j)
			}
			if err := l.Append(batch); err != nil {
				b.Fatal(err)
			}
		}
		l.Close() // nothing acknowledged: all of it is replayed
		b.StartTimer()
		t0 := time.Now()
		l, err = wal.Open(wal.Config{Dir: dir}, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		defer l.Close()
		cfg := WriterConfig{}
		cfg.SetDefaults()
		run(cfg, l, func(w *Writer) {
			n, err := l.Replay(durabilityChunk, func(recs []flow.Record) error { return w.Write(ctx, recs) })
			if err != nil || n != total {
				b.Fatalf("replayed %d records: %v", n, err)
			}
			if err := w.Flush(ctx); err != nil {
				b.Fatal(err)
			}
		})
		return time.Since(t0)
	}
	// An untimed warm-up of each.
	fromSpool()
	fromWAL()
	b.ReportAllocs()
	b.ResetTimer()
	var spoolTime, walTime time.Duration
	for n := 0; n < b.N; n++ {
		if n%2 == 0 {
			spoolTime += fromSpool()
			walTime += fromWAL()
		} else {
			walTime += fromWAL()
			spoolTime += fromSpool()
		}
	}
	b.StopTimer()
	rows := float64(total) * float64(b.N)
	b.ReportMetric(rows/spoolTime.Seconds(), "spool-rows/s")
	b.ReportMetric(rows/walTime.Seconds(), "wal-rows/s")
	b.ReportMetric(1e9*spoolTime.Seconds()/rows, "spool-ns/row")
	b.ReportMetric(1e9*walTime.Seconds()/rows, "wal-ns/row")
}
