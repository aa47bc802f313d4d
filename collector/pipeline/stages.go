package pipeline

import (
	"context"
	"errors"

	"github.com/dualflow/dualflow/flow"
)

// Enricher adds metadata to records in place (Kubernetes identities,
// Services, zones). It is called from one goroutine. The Kubernetes
// enrichment implements it; until then the pipeline runs Passthrough.
type Enricher interface {
	Enrich(recs []flow.Record)
}

// Passthrough is the Enricher that changes nothing.
type Passthrough struct{}

// Enrich does nothing.
func (Passthrough) Enrich([]flow.Record) {}

var _ Enricher = Passthrough{}

// StageEnrich and StageWrite are the stage labels of the metrics.
const (
	StageEnrich = "enrich"
	StageWrite  = "write"
)

// RunEnrich enriches each batch of in and puts it on out, blocking while
// out is full (overflow policy: block, so back-pressure reaches the
// decoders). It returns, after closing out, once in is closed and drained.
// ctx only aborts a blocked Put (records then counted as dropped,
// reason aborted); normal shutdown closes in.
func RunEnrich(ctx context.Context, e Enricher, in, out *Queue, m *Metrics) error {
	defer out.Close()
	recIn, recOut := m.RecordsIn.WithLabelValues(StageEnrich), m.RecordsOut.WithLabelValues(StageEnrich)
	for b := range in.C() {
		in.Taken()
		recIn.Add(float64(len(b.Recs)))
		e.Enrich(b.Recs)
		n := len(b.Recs)
		if err := out.Put(ctx, b); err != nil {
			m.Dropped.WithLabelValues(StageEnrich, "aborted").Add(float64(n))
			b.Release()
			continue
		}
		recOut.Add(float64(n))
	}
	return nil
}

// RecordWriter is the sink of the pipeline: store.Writer. Write may block
// (back-pressure from ClickHouse) and must not retain recs.
type RecordWriter interface {
	Write(ctx context.Context, recs []flow.Record) error
}

// RunWrite hands each batch of in to w and releases it. While w blocks,
// in fills up, and so do the queues before it: that is the back-pressure
// path, visible in dualflow_pipeline_queue_length and
// dualflow_pipeline_queue_blocked_seconds_total. Records w refuses are
// counted (dualflow_records_dropped_total{stage="write"}). It returns once
// in is closed and drained.
func RunWrite(ctx context.Context, w RecordWriter, in *Queue, m *Metrics) error {
	recIn, recOut := m.RecordsIn.WithLabelValues(StageWrite), m.RecordsOut.WithLabelValues(StageWrite)
	for b := range in.C() {
		in.Taken()
		n := len(b.Recs)
		recIn.Add(float64(n))
		if err := w.Write(ctx, b.Recs); err != nil {
			reason := "write_error"
			if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
				reason = "aborted"
			}
			// Write may have accepted a prefix; it does not say how
			// many, so the whole batch is counted as dropped.
			m.Dropped.WithLabelValues(StageWrite, reason).Add(float64(n))
		} else {
			recOut.Add(float64(n))
		}
		b.Release()
	}
	return nil
}
