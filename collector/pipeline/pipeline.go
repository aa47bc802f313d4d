// Package pipeline holds what the collector's stages share: batches of flow
// records recycled through a pool, and bounded, named queues between stages
// with their metrics (length, capacity, records in and out, records dropped
// by reason).
//
// The data path is decode → correlate → enrich → write; each arrow is a
// Queue. A stage takes a batch from its input queue, owns it until it puts
// it on its output queue or releases it, and never keeps a reference after
// that.
package pipeline

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/dualflow/dualflow/flow"
)

// Batch is a slice of records travelling between stages. Its owner is the
// stage holding it; Release hands it back to its pool.
type Batch struct {
	Recs []flow.Record
	pool *Pool
}

// Release clears the batch and returns it to its pool. The caller must not
// use b afterwards.
func (b *Batch) Release() {
	if b.pool == nil {
		return
	}
	clear(b.Recs) // drop string and map references held by old records
	b.Recs = b.Recs[:0]
	select {
	case b.pool.free <- b:
	default: // the free list is full: let the GC have it
	}
}

// Pool recycles batches so the steady state allocates none. It is safe for
// concurrent use. A sync.Pool would be emptied at every GC, and batches
// are large (~1.5 MB), so the pool keeps a bounded free list instead.
type Pool struct {
	size int
	free chan *Batch
}

// NewPool returns a pool of batches with room for size records, which
// keeps up to keep idle ones: as many as can be in flight at once (the
// queues' capacities and the stages'), or the steady state allocates a
// batch each time the queues fill and drops one each time they drain.
func NewPool(size, keep int) *Pool {
	return &Pool{size: size, free: make(chan *Batch, keep)}
}

// Get returns an empty batch.
func (p *Pool) Get() *Batch {
	select {
	case b := <-p.free:
		return b
	default:
		return &Batch{Recs: make([]flow.Record, 0, p.size), pool: p}
	}
}

// Metrics are the per-stage metrics, shared by every queue and stage of one
// collector. Labels: queue or stage name, and reason for drops.
type Metrics struct {
	QueueLength   *prometheus.GaugeVec   // dualflow_pipeline_queue_length{queue} (batches)
	QueueCapacity *prometheus.GaugeVec   // dualflow_pipeline_queue_capacity{queue} (batches)
	RecordsIn     *prometheus.CounterVec // dualflow_pipeline_records_in_total{stage}
	RecordsOut    *prometheus.CounterVec // dualflow_pipeline_records_out_total{stage}
	// Dropped is dualflow_records_dropped_total{stage,reason}: every record
	// the pipeline drops is counted here.
	Dropped *prometheus.CounterVec
	// Blocked is dualflow_pipeline_queue_blocked_seconds_total{queue}: time
	// producers spent waiting on a full queue (back-pressure).
	Blocked *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them on reg unless it is nil.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg) // registers on reg unless it is nil
	m := &Metrics{
		QueueLength: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dualflow_pipeline_queue_length", Help: "Batches waiting in a pipeline queue.",
		}, []string{"queue"}),
		QueueCapacity: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "dualflow_pipeline_queue_capacity", Help: "Capacity of a pipeline queue, in batches.",
		}, []string{"queue"}),
		RecordsIn: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_pipeline_records_in_total", Help: "Records a pipeline stage received.",
		}, []string{"stage"}),
		RecordsOut: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_pipeline_records_out_total", Help: "Records a pipeline stage passed on.",
		}, []string{"stage"}),
		Dropped: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_records_dropped_total", Help: "Records dropped by a pipeline stage, by reason.",
		}, []string{"stage", "reason"}),
		Blocked: f.NewCounterVec(prometheus.CounterOpts{
			Name: "dualflow_pipeline_queue_blocked_seconds_total", Help: "Time producers waited on a full pipeline queue (back-pressure).",
		}, []string{"queue"}),
	}
	return m
}

// Queue is a bounded FIFO of batches between two stages. Put blocks when it
// is full (back-pressure); TryPut does not, and the caller counts the drop.
// It is safe for concurrent use by many producers and one consumer.
type Queue struct {
	journal Journal // nil: not journaled
	name    string
	ch      chan *Batch
	length  prometheus.Gauge
	blocked prometheus.Counter
}

// NewQueue returns a queue of capacity batches named name (the label of
// its metrics). m may be nil.
func NewQueue(name string, capacity int, m *Metrics) *Queue {
	if m == nil {
		m = NewMetrics(nil)
	}
	q := &Queue{name: name, ch: make(chan *Batch, capacity),
		length: m.QueueLength.WithLabelValues(name), blocked: m.Blocked.WithLabelValues(name)}
	m.QueueCapacity.WithLabelValues(name).Set(float64(capacity))
	return q
}

// Journal is a write-ahead log of the records entering a queue
// (*wal.Log): Append journals them, AckRecords forgets records dropped on
// purpose (a full queue) so that a restart does not bring them back.
type Journal interface {
	Append(recs []flow.Record) error
	AckRecords(recs []flow.Record)
}

// SetJournal journals every batch put on the queue before it is queued.
// Call it before the first Put.
func (q *Queue) SetJournal(j Journal) { q.journal = j }

// Name returns the queue's name.
func (q *Queue) Name() string { return q.name }

// Len returns the number of batches waiting.
func (q *Queue) Len() int { return len(q.ch) }

// Put appends b, blocking while the queue is full. It returns ctx.Err() if
// ctx ends first; b is then still the caller's.
func (q *Queue) Put(ctx context.Context, b *Batch) error {
	if q.journal != nil {
		// A failed append is counted and logged by the journal; the
		// records go on without crash protection. If ctx ends before
		// they are queued (shutdown), they stay journaled: the next
		// start replays them.
		_ = q.journal.Append(b.Recs)
	}
	select {
	case q.ch <- b:
		q.length.Set(float64(len(q.ch)))
		return nil
	default:
	}
	start := time.Now()
	defer func() { q.blocked.Add(time.Since(start).Seconds()) }()
	select {
	case q.ch <- b:
		q.length.Set(float64(len(q.ch)))
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// TryPut appends b if there is room and reports whether it did; if not, b
// is still the caller's.
func (q *Queue) TryPut(b *Batch) bool {
	if len(q.ch) == cap(q.ch) {
		return false // full: do not journal what will be dropped
	}
	if q.journal != nil {
		_ = q.journal.Append(b.Recs)
	}
	select {
	case q.ch <- b:
		q.length.Set(float64(len(q.ch)))
		return true
	default:
		if q.journal != nil {
			q.journal.AckRecords(b.Recs) // dropped and counted by the caller
		}
		return false
	}
}

// Get returns the next batch, blocking until one is queued. It returns
// false once the queue is closed and drained, or when ctx ends.
func (q *Queue) Get(ctx context.Context) (*Batch, bool) {
	select {
	case b, ok := <-q.ch:
		q.length.Set(float64(len(q.ch)))
		return b, ok
	case <-ctx.Done():
		return nil, false
	}
}

// C returns the receive side, for stages that select on a timer too; the
// caller should call Taken after each receive to refresh the length gauge.
func (q *Queue) C() <-chan *Batch { return q.ch }

// Taken refreshes the length gauge after a receive from C.
func (q *Queue) Taken() { q.length.Set(float64(len(q.ch))) }

// Close marks the end of input: the consumer drains what is queued, then
// Get returns false. Only the last producer may call it, once.
func (q *Queue) Close() { close(q.ch) }
