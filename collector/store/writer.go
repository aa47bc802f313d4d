package store

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/collector/store/spool"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/ratelog"
)

// Writer defaults. A flow row with Kubernetes metadata is 400-600 bytes as
// RowBinary and about 550 as the columns of a Native block (which add the
// address texts and map offsets, and hold a LowCardinality value as an
// index), so a default batch is 40-60 MB and the default memory bound
// ((MaxPending+1) batches) is about 170 MB. The
// embedded store keeps one more batch-sized Native block for the spool
// replay, which turns RowBinary rows into columns (made the first time a
// spooled batch is replayed).
//
// Batches of 100k rows rather than 50k took the embedded store from about
// 210k to 250k rows/s (BenchmarkWriterEmbedded1M): each insert writes one
// part to flows and to every rollup, so fewer, larger parts cost less to
// write and to merge. 200k rows gained little more for twice the memory.
// Two pending batches are enough to keep the store busy while the next one
// fills.
const (
	DefaultBatchRows       = 100_000
	DefaultFlushInterval   = time.Second
	DefaultMaxPending      = 2
	DefaultInserters       = 2
	DefaultRetries         = 3
	DefaultRetryBackoff    = 100 * time.Millisecond
	DefaultMaxBackoff      = 30 * time.Second
	DefaultInsertTimeout   = 30 * time.Second
	DefaultSpoolMaxBytes   = 1 << 30 // 1 GiB: ~2M rows, ~30 min of a busy cluster
	DefaultRejectAfter     = 5 * time.Minute
	DefaultShutdownTimeout = 10 * time.Second

	// minRejectAttempts is how many non-retryable failures a spooled batch
	// must collect, on top of RejectAfter, before it is moved aside: a single
	// failure after a long outage proves nothing.
	minRejectAttempts = 3
	// logEvery rate-limits the writer's repeated warnings (insert failures,
	// spool full): one line per kind per interval, with a suppressed count.
	logEvery = 10 * time.Second
)

// Reasons of dualflow_store_dropped_rows_total.
const (
	DropSpoolFull  = "spool_full"  // insert failed and the spool is at SpoolMaxBytes
	DropSpoolError = "spool_error" // insert failed and writing the spool failed (disk error)
	DropNoSpool    = "no_spool"    // insert failed and the spool is disabled
	// DropRejected counts batches ClickHouse refused with a non-retryable
	// error for RejectAfter: they are moved to <SpoolDir>/rejected/ (or
	// dropped at once when the spool is disabled).
	DropRejected = "rejected"
)

// ErrWriterClosed is returned by Write and Flush once Run is shutting down or
// has returned.
var ErrWriterClosed = errors.New("store writer closed")

// WriterConfig configures a Writer. Zero values take the defaults above
// (SetDefaults).
type WriterConfig struct {
	// BatchRows seals a batch at this many rows.
	BatchRows int
	// FlushInterval seals and sends the current batch at least this often.
	FlushInterval time.Duration
	// Inserters is how many batches are inserted at once. One INSERT runs
	// on about one core in ClickHouse (plus its materialized views), so two
	// keep a small store busy while the next batch fills. Batches may then
	// commit out of order; each is still written exactly once.
	Inserters int
	// MaxPending is how many sealed batches are held in memory (queued or
	// being inserted) before Write blocks. Overflow policy: block (back-
	// pressure to the caller); memory is bounded by MaxPending+1 batches.
	MaxPending int
	// Retries is the number of fast retries of a failed insert before the
	// batch is spooled; negative disables fast retries.
	Retries int
	// RetryBackoff is the first retry delay; it doubles up to MaxBackoff,
	// which also caps the spool replay backoff.
	RetryBackoff, MaxBackoff time.Duration
	// InsertTimeout bounds one insert attempt. A timeout is ambiguous (the
	// server may have committed); the retry reuses the dedup token.
	InsertTimeout time.Duration
	// SpoolDir is the spool directory; "" disables the spool, and then
	// batches that cannot be inserted are dropped and counted.
	SpoolDir string
	// SpoolMaxBytes bounds the spool on disk; when full, new failed
	// batches are dropped and counted (reason spool_full).
	SpoolMaxBytes int64
	// RejectAfter is how long ClickHouse may refuse a spooled batch with a
	// non-retryable error (bad query, schema mismatch) before the batch is
	// moved to <SpoolDir>/rejected/ so it stops blocking the batches behind
	// it. The grace covers a schema migration that lags a collector upgrade.
	RejectAfter time.Duration
	// ShutdownTimeout bounds the time Run spends inserting after its
	// context is cancelled; what is not written by then is spooled (local
	// disk writes, not bounded by it) or, without a spool, dropped.
	ShutdownTimeout time.Duration
}

// SetDefaults fills zero fields with the defaults.
func (c *WriterConfig) SetDefaults() {
	c.BatchRows = cmp.Or(c.BatchRows, DefaultBatchRows)
	c.FlushInterval = cmp.Or(c.FlushInterval, DefaultFlushInterval)
	c.MaxPending = cmp.Or(c.MaxPending, DefaultMaxPending)
	c.Inserters = cmp.Or(c.Inserters, DefaultInserters)
	if c.MaxPending > 0 && c.Inserters > c.MaxPending {
		c.Inserters = c.MaxPending // a batch must be pending to be inserted
	}
	c.Retries = cmp.Or(c.Retries, DefaultRetries)
	c.RetryBackoff = cmp.Or(c.RetryBackoff, DefaultRetryBackoff)
	c.MaxBackoff = cmp.Or(c.MaxBackoff, DefaultMaxBackoff)
	c.InsertTimeout = cmp.Or(c.InsertTimeout, DefaultInsertTimeout)
	c.SpoolMaxBytes = cmp.Or(c.SpoolMaxBytes, DefaultSpoolMaxBytes)
	c.RejectAfter = cmp.Or(c.RejectAfter, DefaultRejectAfter)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
}

// Validate reports every invalid field.
func (c WriterConfig) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.BatchRows > 0, "batch rows %d must be positive", c.BatchRows)
	check(c.FlushInterval > 0, "flush interval %v must be positive", c.FlushInterval)
	check(c.MaxPending > 0, "max pending %d must be positive", c.MaxPending)
	check(c.Inserters > 0 && c.Inserters <= c.MaxPending, "inserters %d must be between 1 and max pending (%d)", c.Inserters, c.MaxPending)
	check(c.RetryBackoff > 0, "retry backoff %v must be positive", c.RetryBackoff)
	check(c.MaxBackoff >= c.RetryBackoff, "max backoff %v must be at least the retry backoff %v", c.MaxBackoff, c.RetryBackoff)
	check(c.InsertTimeout > 0, "insert timeout %v must be positive", c.InsertTimeout)
	check(c.SpoolDir == "" || c.SpoolMaxBytes > 0, "spool max bytes %d must be positive", c.SpoolMaxBytes)
	check(c.RejectAfter >= 0, "reject after %v must not be negative", c.RejectAfter)
	check(c.ShutdownTimeout > 0, "shutdown timeout %v must be positive", c.ShutdownTimeout)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("store writer config: %w", err)
	}
	return nil
}

// WriterStats is a snapshot of a Writer's counters.
type WriterStats struct {
	RowsWritten    int64 // rows inserted into ClickHouse, directly or from the spool
	BatchesWritten int64
	Retries        int64 // insert attempts that followed a failed one
	InsertErrors   int64 // failed insert attempts
	SpooledRows    int64 // rows pushed to the spool since start
	SpoolBatches   int   // batches in the spool now
	SpoolRows      int64 // rows in the spool now
	SpoolBytes     int64 // bytes of the spool files now
	DroppedRows    int64 // rows lost, all reasons (see the Drop* reasons)
	BufferedRows   int64 // rows in memory: current batch and sealed batches
	BufferedBytes  int64 // encoded bytes of those rows
}

// Writer batches flow records, encodes each row once, and inserts the
// batches into FlowsTable, Inserters at a time. A batch is the columns of a
// Native block, built as records arrive (columnar.go); spooled batches are
// RowBinary rows. Failed inserts are retried with backoff and then spooled
// to disk; the spool is replayed oldest-first, and while it holds anything
// new batches queue behind it.
// With one inserter rows arrive in order; with more, a batch may overtake
// one in flight (by as many batches as the other inserters write meanwhile,
// or the length of an outage for a batch that was spooled). Every batch carries a random dedup token kept across retries,
// spooling and restarts, so an ambiguous failure never writes a batch twice
// (within the table's non_replicated_deduplication_window: a batch replayed
// after more newer inserts than the window holds can be duplicated).
//
// Failure policy:
//   - ClickHouse unreachable (ErrUnavailable, network errors, timeouts):
//     Retries fast retries, then the batch is spooled and replayed with
//     capped exponential backoff for as long as it takes.
//   - ClickHouse refuses the insert (any other error: bad query, schema
//     mismatch): no fast retry; the batch is spooled and replayed like
//     above, logged at Error level, so a schema migration that lags an
//     upgrade loses nothing. A batch still refused after RejectAfter is
//     moved to <SpoolDir>/rejected/ (same file format: move it back to
//     replay it) and counted in dropped_rows_total{reason="rejected"}, so
//     one poison batch cannot block the spool forever.
//   - Spool full, unwritable or disabled: the batch is dropped and counted
//     in dropped_rows_total{reason}, with one rate-limited log line.
//
// Memory holds at most MaxPending+1 batch buffers (the one being filled and
// the sealed ones), plus one batch read back from the spool while it is
// replayed. Write, Flush and Stats are safe for concurrent use. Run must be
// called once; it owns the goroutines and the spool.
type Writer struct {
	cfg      WriterConfig
	conn     Conn
	columnar columnarConn // conn, which takes the batches as Native blocks
	log      *slog.Logger
	m        writerMetrics

	mu        sync.Mutex
	cur       *pendingBatch    // batch being filled
	queue     []*pendingBatch  // sealed batches, oldest first, until they and every older one are done
	pending   int              // batches of queue not done yet: they hold buffers
	free      []*nativeBuilder // buffers of finished batches for reuse; with cur and the pending batches, at most MaxPending+1
	lastCols  colSizes         // column sizes of the last full batch sealed, to size new buffers
	labels    labelCache       // encodings of the label maps Write has seen
	sealedSeq uint64           // sequence number of the last sealed batch
	doneSeq   uint64           // sequence number of the last batch written, spooled or dropped
	bufRows   int64            // rows in cur and in the pending batches of queue
	bufBytes  int64            // bytes in cur and in the pending batches of queue
	closed    bool             // shutting down or exited: no more records accepted
	exited    bool             // Run has returned
	changed   chan struct{}    // closed and replaced on every state change above

	acker Acker // nil: records are not journaled

	started   atomic.Bool
	spool     atomic.Pointer[spool.Spool]
	spoolOpen chan struct{} // closed once Run has opened the spool (or failed to)
	kick      chan struct{} // wakes the drain loop after a Push; size 1, extra kicks are dropped

	stats struct {
		rowsWritten, batchesWritten, retries, insertErrors, spooledRows, droppedRows atomic.Int64
	}
	warns *ratelog.Limiter // kinds fail, reject, drop and spool: a line per logEvery each

	// last is the outcome of the latest insert attempt (Writable).
	last struct {
		sync.Mutex
		err       error
		permanent bool
		failing   time.Time // when the failures began; zero after a success
	}
}

// Writable reports whether the flows table takes rows: nil when the last
// insert succeeded (or none was tried), else why not: ClickHouse refused
// the last batch (a table dropped, a column missing, a user without the
// right), or it has been unreachable for a while. Readiness reads it.
func (w *Writer) Writable() error {
	w.last.Lock()
	defer w.last.Unlock()
	switch {
	case w.last.err == nil:
		return nil
	case w.last.permanent:
		return fmt.Errorf("the flows table refuses rows: %w", w.last.err)
	case time.Since(w.last.failing) > 30*time.Second:
		return fmt.Errorf("no insert has succeeded for %s: %w", time.Since(w.last.failing).Round(time.Second), w.last.err)
	}
	return nil
}

// noteInsert records an insert attempt's outcome for Writable.
func (w *Writer) noteInsert(err error) {
	w.last.Lock()
	defer w.last.Unlock()
	if err == nil {
		w.last.err, w.last.failing = nil, time.Time{}
		return
	}
	if w.last.failing.IsZero() {
		w.last.failing = time.Now()
	}
	w.last.err, w.last.permanent = err, !Unavailable(err)
}

// pendingBatch is a sealed or filling batch of encoded rows.
type pendingBatch struct {
	seq   uint64
	token string
	rows  int
	cols  *nativeBuilder // the rows, as the columns of a Native block; nil once done
	bytes int            // encoded size, as counted in Writer.bufBytes
	taken bool           // a sender is delivering it
	done  bool           // written, spooled or dropped
	// journal holds the batch's journal references as (first reference,
	// count) runs, to acknowledge once the batch is written, spooled or
	// dropped; minEnd and maxEnd are its rows' flow_end range (Unix ms),
	// for the journal's intent.
	journal        []uint64
	minEnd, maxEnd int64
	noEnd          bool // a row without flow_end: the range is unknown
}

// Acker is told when journaled records are durable: written to
// ClickHouse, spooled, or dropped and counted. Ack(ref, n) names n
// records by their consecutive journal references ref, ref+1, ...
// *wal.Log implements it.
type Acker interface {
	// Intent is told before a batch is first sent: its dedup token, its
	// rows' flow_end range (Unix ms; 0, 0 when unknown), its row count and
	// its records' (reference, count) runs. After a crash that cut off the batch's acknowledgement, the
	// journal asks the store whether the token's batch is there
	// (Writer.Spooled, StoredBatches) instead of replaying it.
	Intent(token string, minEnd, maxEnd int64, rows int, runs []uint64)
	Ack(ref uint64, n int)
	// FlushAcks makes the acknowledgements given so far durable.
	FlushAcks()
}

// SetAcker makes the writer acknowledge the journal frames of the records
// it is given (flow.Record.Journal). Call it before Write.
func (w *Writer) SetAcker(a Acker) { w.acker = a }

// addJournal adds a record's journal references to the batch, as runs of
// consecutive references (the records of a received message mostly come
// together and in order), and its flow_end to the batch's range.
func (b *pendingBatch) addJournal(r *flow.Record) {
	j := &r.Journal
	add := func(f uint64) {
		if f == 0 {
			return
		}
		if k := len(b.journal); k > 0 && b.journal[k-2]+b.journal[k-1] == f {
			b.journal[k-1]++
			return
		}
		b.journal = append(b.journal, f, 1)
	}
	add(j.Frame)
	add(j.Frame2)
	for _, f := range j.More {
		add(f)
	}
	end := int64(timeMillis(r.FlowEnd))
	if end <= 0 {
		b.noEnd = true
		return
	}
	if b.minEnd == 0 || end < b.minEnd {
		b.minEnd = end
	}
	b.maxEnd = max(b.maxEnd, end)
}

// NewWriter returns a Writer inserting through conn. cfg goes through
// SetDefaults and Validate. Metrics are registered on reg unless it is nil.
// conn must take Native blocks, as the store's backends do. The writer does
// not close conn. conn must not retain the data it is given after an insert
// returns: buffers are reused.
func NewWriter(cfg WriterConfig, conn Conn, reg prometheus.Registerer, log *slog.Logger) (*Writer, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if conn == nil {
		return nil, errors.New("store writer: nil Conn")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Writer{
		cfg:       cfg,
		conn:      conn,
		log:       log,
		warns:     ratelog.New(log, logEvery, 4),
		changed:   make(chan struct{}),
		kick:      make(chan struct{}, 1),
		spoolOpen: make(chan struct{}),
	}
	var ok bool
	if w.columnar, ok = conn.(columnarConn); !ok {
		return nil, fmt.Errorf("store writer: %T does not take Native blocks", conn)
	}
	w.cur = w.newBatchLocked()
	w.m = newWriterMetrics(w)
	if reg != nil {
		if err := w.m.register(reg); err != nil {
			return nil, fmt.Errorf("store writer metrics: %w", err)
		}
	}
	return w, nil
}

// Write encodes recs into the current batch, sealing it every BatchRows
// rows. It blocks while MaxPending sealed batches wait to be written (back-
// pressure) and returns ctx.Err() if ctx ends while blocked, or
// ErrWriterClosed once Run is shutting down. On error, a prefix of recs may
// have been accepted; those records will be written. Write does not retain
// recs.
func (w *Writer) Write(ctx context.Context, recs []flow.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range recs {
		if w.closed {
			return ErrWriterClosed
		}
		w.cur.cols.appendRecord(&recs[i], &w.labels)
		if w.acker != nil {
			w.cur.addJournal(&recs[i])
		}
		w.cur.rows++
		w.bufRows++
		if w.cur.rows >= w.cfg.BatchRows {
			w.countBytesLocked()
			if err := w.waitRoomLocked(ctx); err != nil {
				return err
			}
			w.sealLocked()
		}
	}
	w.countBytesLocked()
	return nil
}

// countBytesLocked brings bufBytes up to date with the current batch. It
// runs once per Write and before the lock is released: sizing a columnar
// batch adds up its columns, too much work for every row.
func (w *Writer) countBytesLocked() {
	n := w.cur.cols.size()
	w.bufBytes += int64(n - w.cur.bytes)
	w.cur.bytes = n
}

// newBatchLocked returns an empty batch, with the buffers of a finished
// batch when one is free.
func (w *Writer) newBatchLocked() *pendingBatch {
	b := &pendingBatch{}
	if n := len(w.free); n > 0 {
		b.cols = w.free[n-1]
		w.free = w.free[:n-1]
	} else {
		b.cols = new(nativeBuilder)
	}
	b.cols.reset(flowWire)
	b.cols.reserve(w.lastCols)
	return b
}

// Flush seals the current batch and waits until every batch sealed so far
// is in ClickHouse, in the spool, or counted as dropped.
func (w *Writer) Flush(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur.rows > 0 {
		if err := w.waitRoomLocked(ctx); err != nil {
			return err
		}
		w.sealLocked()
	}
	target := w.sealedSeq
	for w.doneSeq < target {
		if w.exited {
			return ErrWriterClosed
		}
		if err := w.waitLocked(ctx); err != nil {
			return err
		}
	}
	return nil
}

// waitRoomLocked waits, with w.mu held, until a batch can be sealed.
func (w *Writer) waitRoomLocked(ctx context.Context) error {
	for {
		if w.closed {
			return ErrWriterClosed
		}
		if w.pending < w.cfg.MaxPending {
			return nil
		}
		if err := w.waitLocked(ctx); err != nil {
			return err
		}
	}
}

// waitLocked releases w.mu until the next state change or the end of ctx,
// and takes it again.
func (w *Writer) waitLocked(ctx context.Context) error {
	ch := w.changed
	w.mu.Unlock()
	defer w.mu.Lock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (w *Writer) broadcastLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// sealLocked moves the current batch, if not empty, to the queue with a
// fresh dedup token.
func (w *Writer) sealLocked() {
	if w.cur.rows == 0 {
		return
	}
	w.sealedSeq++
	b := w.cur
	b.seq = w.sealedSeq
	b.token = newDedupToken()
	w.queue = append(w.queue, b)
	w.pending++
	if b.rows >= w.cfg.BatchRows/2 {
		// Sized on full batches: a small one sealed by the flush tick
		// would make the next buffers too small again.
		w.lastCols = b.cols.sizes()
	}
	w.cur = w.newBatchLocked()
	w.broadcastLocked()
}

// newDedupToken returns a random 128-bit dedup token in hex.
func newDedupToken() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand aborts the program instead)
	return hex.EncodeToString(b[:])
}

// Run sends sealed batches until ctx is cancelled, then shuts down: it seals
// the current batch, tries to insert what is queued for at most
// ShutdownTimeout, spools the rest, closes the spool and returns. It opens
// the spool first and replays what a previous run left there before any new
// batch. Run returns nil after a clean shutdown, or an error if the spool
// cannot be opened.
func (w *Writer) Run(ctx context.Context) error {
	if !w.started.CompareAndSwap(false, true) {
		return errors.New("store writer: Run called twice")
	}
	defer func() {
		w.mu.Lock()
		w.closed, w.exited = true, true
		w.broadcastLocked()
		w.mu.Unlock()
	}()

	var sp *spool.Spool
	defer func() {
		select {
		case <-w.spoolOpen:
		default:
			close(w.spoolOpen)
		}
	}()
	if w.cfg.SpoolDir != "" {
		s, err := spool.Open(w.cfg.SpoolDir, w.cfg.SpoolMaxBytes)
		if err != nil {
			return fmt.Errorf("store writer: %w", err)
		}
		sp = s
		w.spool.Store(sp)
		if n := sp.Len(); n > 0 {
			w.log.Info("replaying spooled batches", "dir", sp.Dir(), "batches", n, "rows", sp.Rows(), "bytes", sp.Bytes())
		}
		if n := sp.Corrupt(); n > 0 {
			w.log.Error("corrupt spool files moved aside", "dir", sp.Dir(), "files", n)
		}
	}

	close(w.spoolOpen)

	// Inserts outlive ctx: they are cancelled ShutdownTimeout after it ends.
	ioCtx, cancelIO := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelIO()
	stop := make(chan struct{}) // closed when shutdown starts
	var wg sync.WaitGroup
	for range w.cfg.Inserters {
		wg.Go(func() { w.send(ioCtx, sp, stop) })
	}
	if sp != nil {
		wg.Go(func() { w.drain(ioCtx, sp, stop) })
	}

	tick := time.NewTicker(w.cfg.FlushInterval)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			done = true
		case <-tick.C:
			w.mu.Lock()
			if w.pending < w.cfg.MaxPending { // never block: a full queue is flushing anyway
				w.sealLocked()
			}
			w.mu.Unlock()
		}
	}
	tick.Stop()

	// Shutdown: refuse new records, seal the last batch (even over
	// MaxPending: it is already in memory), let the sender finish.
	start := time.Now()
	close(stop)
	w.mu.Lock()
	w.closed = true
	w.sealLocked()
	w.broadcastLocked()
	w.mu.Unlock()
	deadline := time.AfterFunc(w.cfg.ShutdownTimeout, cancelIO)
	wg.Wait()
	deadline.Stop()

	attrs := []any{"took", time.Since(start).Round(time.Millisecond), "rows_written", w.stats.rowsWritten.Load(), "dropped_rows", w.stats.droppedRows.Load()}
	var err error
	if sp != nil {
		attrs = append(attrs, "spool_batches", sp.Len(), "spool_rows", sp.Rows())
		if cerr := sp.Close(); cerr != nil {
			err = fmt.Errorf("close spool: %w", cerr)
		}
	}
	w.log.Info("store writer stopped", attrs...)
	return err
}

// send delivers sealed batches until shutdown empties the queue. Inserters
// goroutines run it: each takes the oldest batch nobody has taken, so up to
// Inserters inserts run at once. A batch leaves the queue (and counts as
// done for Flush) when it and every older batch are done.
func (w *Writer) send(ctx context.Context, sp *spool.Spool, stop <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for {
		var b *pendingBatch
		for {
			for _, q := range w.queue {
				if !q.taken {
					b = q
					break
				}
			}
			if b != nil {
				break
			}
			if w.closed {
				return
			}
			w.waitLocked(context.Background()) // only a state change ends the wait
		}
		b.taken = true
		w.mu.Unlock()
		if w.acker != nil && len(b.journal) > 0 {
			minEnd, maxEnd := b.minEnd, b.maxEnd
			if b.noEnd {
				minEnd, maxEnd = 0, 0 // look the batch up in the whole table
			}
			w.acker.Intent(b.token, minEnd, maxEnd, b.rows, b.journal)
		}
		failed := w.deliver(ctx, sp, stop, b)
		if w.acker != nil && len(b.journal) > 0 && killAfterInsert {
			killSelf() // a test's crash between an insert and its acknowledgement
		}
		if w.acker != nil {
			for k := 0; k+1 < len(b.journal); k += 2 {
				w.acker.Ack(b.journal[k], int(b.journal[k+1]))
			}
			// One write for the batch's acknowledgements, at once: a crash
			// after it does not replay the batch.
			w.acker.FlushAcks()
		}
		w.mu.Lock()
		// A done batch gives its buffer back at once, so room for a new
		// batch does not wait for older inserts still running: with two
		// inserters, a batch done before the one sealed ahead of it kept
		// an inserter idle until that one ended.
		b.done = true
		w.pending--
		w.bufRows -= int64(b.rows)
		w.bufBytes -= int64(b.bytes)
		// Keep the buffer while cur, the pending batches and the free list
		// hold at most MaxPending+1 buffers in all: the memory bound.
		// A failed insert's transport may still read the buffers after
		// the attempt returned (net/http closes a request body in its own
		// time): such a batch's buffers are left to the collector.
		if !failed && w.pending+len(w.free) < w.cfg.MaxPending {
			w.free = append(w.free, b.cols)
		}
		b.cols, b.journal = nil, nil
		for len(w.queue) > 0 && w.queue[0].done {
			w.doneSeq = w.queue[0].seq
			w.queue[0] = nil
			w.queue = w.queue[1:]
		}
		w.broadcastLocked()
	}
}

// outgoing is a batch on its way to ClickHouse: RowBinary rows in Data
// (a new batch, or one read back from the spool), or a columnar batch in
// cols, turned into rows only if it has to be spooled.
type outgoing struct {
	spool.Batch
	cols   *nativeBuilder
	failed bool // an insert attempt failed
}

// deliver inserts b, or spools it, or drops and counts it. It reports
// whether an insert attempt failed.
func (w *Writer) deliver(ctx context.Context, sp *spool.Spool, stop <-chan struct{}, b *pendingBatch) (failed bool) {
	sb := outgoing{Batch: spool.Batch{Table: FlowsTable, Columns: FlowColumns, Token: b.token, Rows: b.rows}, cols: b.cols}
	if sp != nil && sp.Len() > 0 {
		// Older batches wait in the spool: queue behind them to keep order.
		w.push(sp, &sb)
		return
	}
	err := w.insertWithRetries(ctx, stop, &sb)
	if err == nil {
		return sb.failed
	}
	permanent := !Unavailable(err)
	switch {
	case sp != nil:
		if permanent {
			if ok, n := w.warns.Allow("reject", netip.Addr{}); ok {
				w.log.Error("clickhouse rejected a batch; spooled, replay will retry it for the reject-after grace",
					"rows", sb.Rows, "token", sb.Token, "err", err, "suppressed", n)
			}
		} else if ok, n := w.warns.Allow("fail", netip.Addr{}); ok {
			w.log.Warn("clickhouse insert failed; spooling", "rows", sb.Rows, "err", err, "suppressed", n)
		}
		w.push(sp, &sb)
	case permanent:
		w.drop(DropRejected, sb.Rows, err)
	default:
		w.drop(DropNoSpool, sb.Rows, err)
	}
	return true
}

// insertWithRetries tries b up to 1+Retries times with exponential backoff.
// A non-retryable error ends it at once; so does shutdown, after the first
// attempt.
func (w *Writer) insertWithRetries(ctx context.Context, stop <-chan struct{}, b *outgoing) error {
	var err error
	for i := 0; i <= max(w.cfg.Retries, 0); i++ {
		if i > 0 {
			if !sleepOrStop(stop, backoffDelay(w.cfg.RetryBackoff, w.cfg.MaxBackoff, i-1)) {
				break
			}
			w.stats.retries.Add(1)
			w.m.retries.Inc()
		}
		if ctx.Err() != nil { // shutdown deadline passed: spool without trying
			return cmp.Or(err, ctx.Err())
		}
		if err = w.insert(ctx, b); err == nil || !Unavailable(err) {
			return err
		}
	}
	return err
}

// insert makes one insert attempt and records its outcome.
func (w *Writer) insert(ctx context.Context, b *outgoing) error {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.InsertTimeout)
	defer cancel()
	start := time.Now()
	var err error
	if b.cols != nil {
		err = w.columnar.insertColumns(ctx, b.Table, b.Token, b.cols)
	} else {
		err = w.conn.InsertRowBinary(ctx, b.Table, b.Columns, b.Token, b.Rows, b.Data)
	}
	w.m.insertDuration.Observe(time.Since(start).Seconds())
	w.noteInsert(err)
	if err != nil {
		b.failed = true
		w.stats.insertErrors.Add(1)
		if Unavailable(err) {
			w.m.insertErrUnavailable.Inc()
		} else {
			w.m.insertErrRejected.Inc()
		}
		return fmt.Errorf("insert %d rows into %s: %w", b.Rows, b.Table, err)
	}
	w.stats.rowsWritten.Add(int64(b.Rows))
	w.stats.batchesWritten.Add(1)
	w.m.rowsWritten.Add(float64(b.Rows))
	w.m.batchesWritten.Inc()
	return nil
}

// push spools b; when the spool refuses it the batch is dropped and counted.
// A columnar batch is turned into RowBinary rows first, the spool's format.
func (w *Writer) push(sp *spool.Spool, b *outgoing) {
	if b.cols != nil {
		data, err := b.cols.rowBinary(nil, flowWire)
		if err != nil { // a bug, not bad input: the writer built the columns
			w.drop(DropSpoolError, b.Rows, err)
			return
		}
		b.Data, b.cols = data, nil
	}
	err := sp.Push(b.Batch)
	switch {
	case err == nil:
		w.stats.spooledRows.Add(int64(b.Rows))
		select {
		case w.kick <- struct{}{}:
		default:
		}
	case errors.Is(err, spool.ErrFull):
		w.drop(DropSpoolFull, b.Rows, err)
	default:
		w.drop(DropSpoolError, b.Rows, err)
	}
}

func (w *Writer) drop(reason string, rows int, err error) {
	w.stats.droppedRows.Add(int64(rows))
	w.m.dropped.WithLabelValues(reason).Add(float64(rows))
	if ok, n := w.warns.Allow("drop", netip.Addr{}); ok {
		w.log.Error("dropping flow rows", "reason", reason, "rows", rows, "err", err,
			"dropped_rows_total", w.stats.droppedRows.Load(), "suppressed", n)
	}
}

// drain replays the spool oldest-first until shutdown. While ClickHouse
// fails it backs off exponentially, capped at MaxBackoff. A batch refused
// with a non-retryable error for RejectAfter (and minRejectAttempts tries)
// is moved to <SpoolDir>/rejected/ and counted as dropped.
func (w *Writer) drain(ctx context.Context, sp *spool.Spool, stop <-chan struct{}) {
	var (
		failures      int       // consecutive failed attempts: the backoff exponent
		head          string    // token of the batch the reject state is about
		rejectedSince time.Time // first non-retryable failure of head
		rejects       int       // non-retryable failures of head
	)
	for {
		select {
		case <-stop:
			return
		default:
		}
		b, ok, err := sp.Peek()
		if err != nil {
			if ok, n := w.warns.Allow("spool", netip.Addr{}); ok {
				w.log.Error("read spool", "err", err, "suppressed", n)
			}
			if !sleepOrStop(stop, backoffDelay(w.cfg.RetryBackoff, w.cfg.MaxBackoff, failures)) {
				return
			}
			failures++
			continue
		}
		if !ok {
			select {
			case <-w.kick:
				continue
			case <-stop:
				return
			}
		}
		if b.Token != head {
			head, rejectedSince, rejects = b.Token, time.Time{}, 0
		}
		if failures > 0 {
			w.stats.retries.Add(1)
			w.m.retries.Inc()
		}
		err = w.insert(ctx, &outgoing{Batch: b})
		if err == nil {
			if err := sp.Pop(); err != nil {
				w.log.Error("remove replayed batch from spool; it will be replayed (and deduplicated) after a restart", "err", err)
			}
			failures = 0
			continue
		}
		if !Unavailable(err) {
			now := time.Now()
			if rejects == 0 {
				rejectedSince = now
			}
			rejects++
			if rejects >= minRejectAttempts && now.Sub(rejectedSince) >= w.cfg.RejectAfter {
				path, rerr := sp.Reject()
				w.stats.droppedRows.Add(int64(b.Rows))
				w.m.dropped.WithLabelValues(DropRejected).Add(float64(b.Rows))
				w.log.Error("clickhouse keeps rejecting a spooled batch; moved aside",
					"path", path, "rows", b.Rows, "token", b.Token, "since", rejectedSince, "err", err, "move_err", rerr)
				failures = 0
				continue
			}
			if ok, n := w.warns.Allow("reject", netip.Addr{}); ok {
				w.log.Error("clickhouse rejected a spooled batch; retrying", "rows", b.Rows, "token", b.Token,
					"since", rejectedSince, "err", err, "suppressed", n)
			}
		} else if ok, n := w.warns.Allow("fail", netip.Addr{}); ok {
			w.log.Warn("clickhouse unavailable; spool replay backing off", "spool_batches", sp.Len(),
				"spool_bytes", sp.Bytes(), "err", err, "suppressed", n)
		}
		if !sleepOrStop(stop, backoffDelay(w.cfg.RetryBackoff, w.cfg.MaxBackoff, failures)) {
			return
		}
		failures++
	}
}

// Unavailable reports whether err means ClickHouse could not be reached or
// did not answer in time (worth retrying), as opposed to refusing the
// statement. Timeouts and cancellations are retryable: the outcome is
// unknown and the dedup token makes a retried insert safe.
func Unavailable(err error) bool {
	var ne net.Error
	return errors.Is(err, ErrUnavailable) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.As(err, &ne) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// backoffDelay returns base doubled n times, capped at limit.
func backoffDelay(base, limit time.Duration, n int) time.Duration {
	d := base
	for ; n > 0 && d < limit; n-- {
		d *= 2
	}
	return min(d, limit)
}

// sleepOrStop waits d; it returns false if stop closes first.
func sleepOrStop(stop <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-stop:
		return false
	}
}

// Spooled reports whether the batch with this dedup token waits in the
// spool. It waits for Run to open the spool; without a spool it is false.
// A restarting collector asks it, before StoredBatches, about the batches
// its journal holds unacknowledged: a batch spooled but not acknowledged at
// a crash is stored by the spool's replay. (Asking the spool first leaves
// no gap: a batch the replay moves to ClickHouse meanwhile is found there.)
func (w *Writer) Spooled(ctx context.Context, token string) (bool, error) {
	select {
	case <-w.spoolOpen:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	sp := w.spool.Load()
	if sp == nil {
		if w.cfg.SpoolDir != "" {
			return false, errors.New("store writer: spool not open")
		}
		return false, nil
	}
	return sp.Has(token), nil
}

// Stats returns a snapshot of the writer's counters.
func (w *Writer) Stats() WriterStats {
	w.mu.Lock()
	s := WriterStats{BufferedRows: w.bufRows, BufferedBytes: w.bufBytes}
	w.mu.Unlock()
	s.RowsWritten = w.stats.rowsWritten.Load()
	s.BatchesWritten = w.stats.batchesWritten.Load()
	s.Retries = w.stats.retries.Load()
	s.InsertErrors = w.stats.insertErrors.Load()
	s.SpooledRows = w.stats.spooledRows.Load()
	s.DroppedRows = w.stats.droppedRows.Load()
	if sp := w.spool.Load(); sp != nil {
		s.SpoolBatches, s.SpoolRows, s.SpoolBytes = sp.Len(), sp.Rows(), sp.Bytes()
	}
	return s
}

// writerMetrics are the writer's Prometheus collectors.
type writerMetrics struct {
	rowsWritten, batchesWritten, retries    prometheus.Counter
	insertErrUnavailable, insertErrRejected prometheus.Counter
	insertErrors, dropped                   *prometheus.CounterVec
	insertDuration                          prometheus.Histogram
	gauges                                  []prometheus.Collector
}

func newWriterMetrics(w *Writer) writerMetrics {
	const ns, sub = "dualflow", "store"
	m := writerMetrics{
		rowsWritten: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "rows_written_total", Help: "Flow rows inserted into ClickHouse (directly or replayed from the spool)."}),
		batchesWritten: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "batches_written_total", Help: "Batches inserted into ClickHouse."}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "insert_retries_total", Help: "Insert attempts that followed a failed attempt (fast retries and spool replays)."}),
		insertErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "insert_errors_total", Help: "Failed insert attempts, by kind: unavailable (retryable) or rejected (refused by ClickHouse)."},
			[]string{"kind"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "dropped_rows_total", Help: "Flow rows not written to ClickHouse, by reason: spool_full, spool_error, no_spool, rejected (moved to <spool>/rejected/)."},
			[]string{"reason"}),
		insertDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub,
			Name: "insert_duration_seconds", Help: "Duration of insert attempts, failed ones included.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12)}), // 1ms .. 24s
	}
	m.insertErrUnavailable = m.insertErrors.WithLabelValues("unavailable")
	m.insertErrRejected = m.insertErrors.WithLabelValues("rejected")
	for _, r := range []string{DropSpoolFull, DropSpoolError, DropNoSpool, DropRejected} {
		m.dropped.WithLabelValues(r) // export zeros
	}
	spoolStat := func(f func(*spool.Spool) float64) func() float64 {
		return func() float64 {
			if sp := w.spool.Load(); sp != nil {
				return f(sp)
			}
			return 0
		}
	}
	m.gauges = []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "spool_batches", Help: "Batches waiting in the on-disk spool."},
			spoolStat(func(sp *spool.Spool) float64 { return float64(sp.Len()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "spool_bytes", Help: "Size of the on-disk spool in bytes."},
			spoolStat(func(sp *spool.Spool) float64 { return float64(sp.Bytes()) })),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "spool_corrupt_files_total", Help: "Unreadable spool files moved to <spool>/corrupt/."},
			spoolStat(func(sp *spool.Spool) float64 { return float64(sp.Corrupt()) })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "buffered_rows", Help: "Flow rows held in memory (current batch and sealed batches)."},
			func() float64 { return float64(w.Stats().BufferedRows) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "buffered_bytes", Help: "Encoded bytes of the flow rows held in memory."},
			func() float64 { return float64(w.Stats().BufferedBytes) }),
	}
	return m
}

func (m *writerMetrics) register(reg prometheus.Registerer) error {
	cs := append([]prometheus.Collector{m.rowsWritten, m.batchesWritten, m.retries, m.insertErrors, m.dropped, m.insertDuration}, m.gauges...)
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
