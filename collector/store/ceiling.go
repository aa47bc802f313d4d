package store

import (
	"context"
	"sync/atomic"

	"golang.org/x/sync/errgroup"

	"github.com/dualflow/dualflow/flow"
)

// NativeBlock is a batch of flow records encoded once, as the Native block
// the writer sends the embedded engine for them (the same appendRecord,
// the same bytes). Inserting it again and again with InsertNativeBlock is
// the engine's own limit for that data, with no Go work per row: the
// benchmarks report the writer (BenchmarkWriterEmbedded5M) and the whole
// collector pipeline (the collector's BenchmarkEndToEnd) as shares of it.
// A block is not safe for concurrent inserts: give each inserter its own.
type NativeBlock struct {
	nb nativeBuilder
}

// NewNativeBlock encodes recs.
func NewNativeBlock(recs []flow.Record) *NativeBlock {
	b := new(NativeBlock)
	b.nb.reset(flowWire)
	var lc labelCache
	for i := range recs {
		b.nb.appendRecord(&recs[i], &lc)
	}
	return b
}

// Rows returns the rows of the block.
func (b *NativeBlock) Rows() int { return b.nb.rows }

// InsertNativeBlock inserts b into the flows table (and so its rollups)
// with a fresh dedup token, as the writer inserts a batch.
func (e *Embedded) InsertNativeBlock(ctx context.Context, b *NativeBlock) error {
	return e.insertColumns(ctx, FlowsTable, newDedupToken(), &b.nb)
}

// InsertNativeBlocks inserts n blocks from inserters goroutines, as the
// writer's inserters do, and returns the first error. Insert i (0 to n-1)
// of goroutine worker inserts block(i, worker); goroutines must not share
// a block.
func (e *Embedded) InsertNativeBlocks(ctx context.Context, inserters, n int, block func(i, worker int) *NativeBlock) error {
	var next atomic.Int64
	var g errgroup.Group
	for w := range inserters {
		g.Go(func() error {
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				if err := e.InsertNativeBlock(ctx, block(i, w)); err != nil {
					return err
				}
			}
			return nil
		})
	}
	return g.Wait()
}
