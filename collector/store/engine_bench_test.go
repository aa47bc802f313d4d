package store

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// BenchmarkWriterEmbedded1M writes 1M realistic IPv4/IPv6 flow records
// through the Writer, with its default configuration, into the embedded
// ClickHouse engine (flows table and its four materialized-view rollups) and
// stops the clock when every row is visible to a query. rows/s is the
// end-to-end ingest rate of the storage path; buffered-B/row is the
// writer's memory per row waiting in a batch.
//
// pods=2000 is the cluster shape of benchFlows; distinct-pods gives every
// record a source pod of its own, so the pod rollups aggregate nothing:
// their worst case.
func BenchmarkWriterEmbedded1M(b *testing.B) {
	b.Run("pods=2000", func(b *testing.B) { benchWriterEmbedded(b, benchSrcPods) })
	b.Run("distinct-pods", func(b *testing.B) { benchWriterEmbedded(b, 0) })
}

func benchWriterEmbedded(b *testing.B, srcPods int) {
	e := needEngine(b)
	const total = 1_000_000
	const chunk = 1000
	recs := benchFlowsShape(64*1024, srcPods)
	now := time.Now().UTC()
	for i := range recs {
		recs[i].FlowEnd = now
	}
	cfg := WriterConfig{SpoolDir: b.TempDir()}
	cfg.SetDefaults()
	var bufferedPerRow float64
	// One untimed warm-up run: a run takes seconds, so make bench times
	// just one, which would otherwise include the heap and the engine's
	// caches growing from cold.
	for n := -1; n < b.N; n++ {
		if n == 0 {
			b.ReportAllocs()
			b.ResetTimer()
		}
		b.StopTimer()
		truncate(b, e)
		w, err := NewWriter(cfg, e, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		runtime.GC()
		b.StartTimer()
		batch := make([]flow.Record, chunk)
		for i := 0; i < total; i += chunk {
			for j := range batch {
				batch[j] = recs[(i+j)%len(recs)]
				batch[j].Mark = uint32(i + j)
			}
			if err := w.Write(ctx, batch); err != nil {
				b.Fatal(err)
			}
			if st := w.Stats(); st.BufferedRows > 10_000 && bufferedPerRow == 0 {
				bufferedPerRow = float64(st.BufferedBytes) / float64(st.BufferedRows)
			}
		}
		if err := w.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		if got := queryString(b, e, "SELECT count() FROM dualflow.flows"); got != "1000000" {
			b.Fatalf("visible rows = %s, want 1000000", got)
		}
		b.StopTimer()
		cancel()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
		if st := w.Stats(); st.DroppedRows != 0 || st.SpooledRows != 0 {
			b.Fatalf("writer dropped or spooled rows: %+v", st)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
	b.ReportMetric(bufferedPerRow, "buffered-B/row")
}
