package store

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// BenchmarkWriterEmbedded1M writes 1M realistic IPv4/IPv6 flow records
// into the embedded ClickHouse engine (flows table and its materialized-view
// rollups) two ways, over the same rows, and stops each clock when every
// row is visible to a query:
//
//   - the ceiling, the engine's own limit: the Native blocks the writer
//     sends (the same records, the same batch size, encoded by the same
//     appendRecord, so the same bytes) are built before the clock starts
//     and inserted by as many goroutines as the writer has inserters, each
//     with a fresh dedup token as the writer's: the engine's work and no Go
//     work;
//   - the writer with its default configuration: encoding, batching,
//     sealing and inserting the same records.
//
// An op is one run of each, their order alternating from op to op (this
// shared VM's speed drifts by tens of percent within minutes: runs far apart
// compare badly). rows/s is the writer's rate, ceiling-rows/s the engine's,
// and %-of-ceiling the writer's as a share of it (total times over all
// ops). buffered-B/row is the writer's memory per row waiting in a batch.
//
// pods=2000 is the cluster shape of benchFlows; distinct-pods gives every
// record a source pod of its own, so the pod rollups aggregate nothing:
// their worst case.
func BenchmarkWriterEmbedded1M(b *testing.B) {
	b.Run("pods=2000", func(b *testing.B) { benchWriterEmbedded(b, 1_000_000, benchSrcPods) })
	b.Run("distinct-pods", func(b *testing.B) { benchWriterEmbedded(b, 1_000_000, 0) })
}

// BenchmarkWriterEmbedded5M is the pods=2000 pair over 5M rows, the stream
// length of BenchmarkEndToEnd: long enough for the engine to merge the
// flows table's parts (about 20 at a time, 2M rows at the default batch
// size) while it inserts, as a sustained stream does. Its ceiling is the
// reference of the end-to-end target, which test/benchtable prints as a
// share of it. The prebuilt blocks take about 3.5 GB.
func BenchmarkWriterEmbedded5M(b *testing.B) {
	b.Run("pods=2000", func(b *testing.B) { benchWriterEmbedded(b, 5_000_000, benchSrcPods) })
}

// embeddedBenchChunk is how many records the writer benchmark passes per
// Write call.
const embeddedBenchChunk = 1000

// embeddedBenchRecords returns the stream's record source: 64,000
// distinct records (a whole number of chunks) cycled, each row made
// distinct by embeddedBenchRecord.
func embeddedBenchRecords(srcPods int) []flow.Record {
	recs := benchFlowsShape(64*embeddedBenchChunk, srcPods)
	now := time.Now().UTC()
	for i := range recs {
		recs[i].FlowEnd = now
	}
	return recs
}

// embeddedBenchRecord sets *dst to row i of the stream.
func embeddedBenchRecord(dst *flow.Record, recs []flow.Record, i int) {
	*dst = recs[i%len(recs)]
	dst.Mark = uint32(i)
}

// ceilingBlocks returns the stream's rows as the Native blocks the writer
// seals: batchRows rows each, and their size.
func ceilingBlocks(recs []flow.Record, total, batchRows int) ([]*NativeBlock, int) {
	var blocks []*NativeBlock
	batch := make([]flow.Record, batchRows)
	size := 0
	for i := 0; i < total; i += batchRows {
		n := min(batchRows, total-i)
		for j := range n {
			embeddedBenchRecord(&batch[j], recs, i+j)
		}
		blk := NewNativeBlock(batch[:n])
		blocks = append(blocks, blk)
		size += blk.nb.size()
	}
	return blocks, size
}

// benchWriterEmbedded runs the ceiling and the writer over total rows (see
// BenchmarkWriterEmbedded1M).
//
// One Writer serves the warm-up and every timed run, as one serves a
// collector's lifetime: a fresh Writer per run grew its batch buffers from
// empty every time (1.1 GB of allocation and copying per 1M rows, half of
// its encoding time), which a long-running writer pays once.
func benchWriterEmbedded(b *testing.B, total, srcPods int) {
	e := needEngine(b)
	recs := embeddedBenchRecords(srcPods)
	cfg := WriterConfig{SpoolDir: b.TempDir()}
	cfg.SetDefaults()
	blocks, blockBytes := ceilingBlocks(recs, total, cfg.BatchRows)
	want := fmt.Sprint(total)
	w, err := NewWriter(cfg, e, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	var bufferedPerRow float64
	writer := func() {
		// The chunks are windows of recs, marked in place: copying each
		// record into a batch of its own (792 bytes, with write
		// barriers) took a third of the writer's Go time, and was the
		// harness's work, not the writer's, which copies none.
		for i := 0; i < total; i += embeddedBenchChunk {
			batch := recs[i%len(recs):][:embeddedBenchChunk]
			for j := range batch {
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
	}
	ceiling := func() {
		// What the writer's senders do, without the writer.
		err := e.InsertNativeBlocks(context.Background(), cfg.Inserters, len(blocks), func(i, _ int) *NativeBlock { return blocks[i] })
		if err != nil {
			b.Fatal(err)
		}
	}
	// timed runs f on an empty table and returns its time to visible rows;
	// it adds the process's CPU time over that span to *cpu.
	var ceilingCPU, writerCPU time.Duration
	timed := func(f func(), cpu *time.Duration) time.Duration {
		b.StopTimer()
		truncate(b, e) // the writer is idle: its last run was flushed
		runtime.GC()
		b.StartTimer()
		t0, c0 := time.Now(), processCPU(b)
		f()
		if got := queryString(b, e, "SELECT count() FROM dualflow.flows"); got != want {
			b.Fatalf("visible rows = %s, want %s", got, want)
		}
		*cpu += processCPU(b) - c0
		return time.Since(t0)
	}
	// An untimed warm-up run of each: a run takes seconds, so bench times
	// are a few ops, which would otherwise include the heap, the writer's
	// buffers and the engine's caches growing from cold.
	var warm time.Duration
	timed(ceiling, &warm)
	timed(writer, &warm)
	b.ReportAllocs()
	b.ResetTimer()
	var ceilingTime, writerTime time.Duration
	for n := 0; n < b.N; n++ {
		if n%2 == 0 {
			ceilingTime += timed(ceiling, &ceilingCPU)
			writerTime += timed(writer, &writerCPU)
		} else {
			writerTime += timed(writer, &writerCPU)
			ceilingTime += timed(ceiling, &ceilingCPU)
		}
	}
	b.StopTimer()
	if st := w.Stats(); st.DroppedRows != 0 || st.SpooledRows != 0 {
		b.Fatalf("writer dropped or spooled rows: %+v", st)
	}
	rows := float64(total) * float64(b.N)
	b.ReportMetric(rows/writerTime.Seconds(), "rows/s")
	b.ReportMetric(rows/ceilingTime.Seconds(), "ceiling-rows/s")
	b.ReportMetric(100*ceilingTime.Seconds()/writerTime.Seconds(), "%-of-ceiling")
	b.ReportMetric(bufferedPerRow, "buffered-B/row")
	// CPU per row, of the whole process (the engine runs in it): the
	// writer's Go work is the difference; cores is how many were busy.
	b.ReportMetric(float64(writerCPU.Nanoseconds())/1e3/rows, "writer-cpu-µs/row")
	b.ReportMetric(float64(ceilingCPU.Nanoseconds())/1e3/rows, "ceiling-cpu-µs/row")
	b.ReportMetric(writerCPU.Seconds()/writerTime.Seconds(), "writer-cores")
	b.ReportMetric(ceilingCPU.Seconds()/ceilingTime.Seconds(), "ceiling-cores")
	b.ReportMetric(float64(blockBytes)/float64(total), "block-B/row")
}

// processCPU returns the user and system CPU time of the process so far.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
