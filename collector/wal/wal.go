// Package wal is the collector's write-ahead log of received flow records.
// The IPFIX listeners journal each decoded batch before it enters the
// pipeline; the store writer acknowledges records once they are in
// ClickHouse or in the spool. A crash (kill -9, OOM) loses the in-memory
// queues, the correlator's held halves and the writer's pending batches;
// at the next start Replay feeds every record not acknowledged back into
// the pipeline, so nothing decoded is lost.
//
// The log is a directory of segments (00000000000000000007.wal), the
// newest one open for appends. A segment holds frames: a data frame is one
// journaled batch with its frame id; an ack frame lists frames whose every
// record is durable. A segment is rotated after SegmentBytes or SegmentAge
// and deleted once it and every older segment are fully acknowledged, so
// the log stays about as large as what is in flight.
//
// Acknowledgement is per record. A record's journal reference
// (flow.JournalRefs) is its frame id and its index in the frame
// (frame<<RefBits | index). A frame all of whose records are durable is
// named in an ack frame; records durable while others of their frame are
// not are named, as runs of references, in a partial ack frame. Replay
// skips both: a frame partly durable at a crash replays only its other
// records. (It used to replay whole, and a half already stored in a merged
// row was stored again beside it.)
//
// An intent frame is written before each insert: the batch's dedup token,
// the flow_end range of its rows and the references of its records. A
// crash between the end of an insert and its acknowledgement leaves an
// intent whose records are not acknowledged; ReplayVerified asks the store
// whether the token's batch is there (flows.ingest_batch, migration 0008,
// or the writer's spool) and treats its records as durable when it is, so
// the batch is not stored twice. When the store cannot answer, those
// records are replayed (at-least-once, counted in
// dualflow_wal_unverified_batches_total).
//
// Writes go to the page cache at once (a killed process loses nothing
// written) and are fsynced every SyncInterval (a power loss loses at most
// that much). Lock, names and checksums are internal/segdir's, shared with
// the writer's spool; collector/README.md says why both exist.
package wal

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/segdir"
)

// Defaults for Config.
const (
	DefaultSegmentBytes = 16 << 20
	DefaultSegmentAge   = 2 * time.Second
	DefaultSyncInterval = time.Second
	// maxFrameBytes bounds one frame when reading, so a corrupt length
	// cannot make Replay allocate gigabytes.
	maxFrameBytes = 256 << 20
)

// Config configures a Log.
type Config struct {
	// Dir is the log directory (created 0700). Required.
	Dir string
	// SegmentBytes and SegmentAge rotate the active segment; 0 means the
	// defaults.
	SegmentBytes int64
	SegmentAge   time.Duration
	// SyncInterval is how often appends are fsynced; 0 means the default,
	// negative never (a process crash still loses nothing; a power loss
	// loses what the kernel had not written back).
	SyncInterval time.Duration
}

const (
	segSuffix = ".wal"
	// segMagic starts every segment. 02 added partial ack frames, 03
	// intent frames, 04 records encoded against the record before them
	// (codec.go): a binary that knows only an older version refuses such
	// a segment whole, instead of reading it up to the first frame of an
	// unknown kind and skipping the rest, or misreading its records.
	segMagic    = "DFWAL04\n"
	segMagicV3  = "DFWAL03\n" // read: records not encoded against the one before
	segMagicV2  = "DFWAL02\n" // read: no intent frames
	segMagicV1  = "DFWAL01\n" // read: no partial ack frames
	frameData   = 'D'
	frameAck    = 'A'
	framePart   = 'P' // runs (reference, count) of durable records of frames not all durable
	frameIntent = 'I' // a batch about to be inserted: token, flow_end range, runs (reference, count)
	headerSize  = 8   // payload length, CRC-32C of the payload
)

// RefBits is the width of a record's index in its journal reference:
// frame<<RefBits | index. A frame holds at most MaxFrameRecords records,
// one less than the index allows, so that the reference after a frame's
// last record never names the next frame's first (the writer counts runs
// of consecutive references).
const (
	RefBits         = 16
	MaxFrameRecords = 1<<RefBits - 1
)

// Ref returns the journal reference of record i of frame.
func Ref(frame uint64, i int) uint64 { return frame<<RefBits | uint64(i) }

func refFrame(ref uint64) uint64 { return ref >> RefBits }
func refIndex(ref uint64) int    { return int(ref & (1<<RefBits - 1)) }

// Log is a write-ahead log. Append, Ack and Replay are safe for concurrent
// use.
type Log struct {
	cfg  Config
	log  *slog.Logger
	m    *metrics
	lock *os.File

	nextFrame atomic.Uint64

	mu       sync.Mutex
	f        *os.File
	active   *segment
	segs     []*segment // alive, oldest first; the active one last
	frames   map[uint64]*frameState
	acks     []uint64 // acknowledged frames not yet written
	partial  []uint64 // (reference, count) runs of durable records of unfinished frames, not yet written
	dirty    bool     // written since the last fsync
	newSeg   bool     // a segment created since the last fsync of the directory
	closed   bool
	old      []*segment // left by a previous run, for Replay
	acked    map[uint64]bool
	durable  map[uint64][]uint64 // frame of a previous run → (index, count) runs of its durable records
	intents  []Intent            // intent frames of a previous run
	replayed bool
	errLog   time.Time

	stop chan struct{}
	wg   sync.WaitGroup
}

type segment struct {
	n       uint64
	path    string
	size    int64
	opened  time.Time
	unacked int  // data frames not fully acknowledged
	sealed  bool // no more frames will be registered: deletable once acknowledged
}

type frameState struct {
	seg       *segment
	remaining int
}

// Open opens (or creates) the log in cfg.Dir, takes its lock, and reads
// what a previous run left: Replay feeds it back.
func Open(cfg Config, reg prometheus.Registerer, log *slog.Logger) (*Log, error) {
	if cfg.Dir == "" {
		return nil, errors.New("wal: Config.Dir is required")
	}
	if cfg.SegmentBytes <= 0 {
		cfg.SegmentBytes = DefaultSegmentBytes
	}
	if cfg.SegmentAge <= 0 {
		cfg.SegmentAge = DefaultSegmentAge
	}
	if cfg.SyncInterval == 0 {
		cfg.SyncInterval = DefaultSyncInterval
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	lf, held, err := segdir.Lock(cfg.Dir)
	if held {
		return nil, fmt.Errorf("wal: %s is in use by another process", cfg.Dir)
	}
	if err != nil {
		return nil, fmt.Errorf("wal: %w", err)
	}
	l := &Log{cfg: cfg, log: log, lock: lf, frames: map[uint64]*frameState{}, acked: map[uint64]bool{}, durable: map[uint64][]uint64{}, stop: make(chan struct{})}
	l.m = newMetrics(l)
	if err := l.scan(); err != nil {
		lf.Close()
		return nil, err
	}
	if reg != nil {
		if err := l.m.register(reg); err != nil {
			lf.Close()
			return nil, err
		}
	}
	if len(l.old) > 0 {
		log.Info("write-ahead log holds records of a previous run; they will be replayed", "dir", cfg.Dir, "segments", len(l.old))
	}
	if cfg.SyncInterval > 0 {
		l.wg.Go(l.syncLoop)
	}
	return l, nil
}

// scan lists the segments of a previous run, oldest first (os.ReadDir
// sorts their names by sequence), and reads their ack frames and largest
// frame id.
func (l *Log) scan() error {
	ents, err := os.ReadDir(l.cfg.Dir)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	var maxID uint64
	for _, e := range ents {
		name := e.Name()
		n, ok := segdir.Parse(name, segSuffix)
		if !ok {
			continue
		}
		s := &segment{n: n, path: filepath.Join(l.cfg.Dir, name), sealed: false}
		err = readSegment(s.path, func(kind byte, id uint64, payload []byte, _ bool) error {
			switch kind {
			case frameData:
				maxID = max(maxID, id)
			case frameAck:
				d := decoder{b: payload}
				n := d.uvarint()
				if n > uint64(len(payload)) {
					return nil
				}
				for range n {
					id := d.uvarint()
					l.acked[id] = true
					// New frames must not reuse an id an old ack names.
					maxID = max(maxID, id)
				}
			case framePart:
				d := decoder{b: payload}
				n := d.uvarint()
				if n > uint64(len(payload)) {
					return nil
				}
				for range n {
					ref, count := d.uvarint(), d.uvarint()
					if d.err != nil {
						return nil
					}
					f := refFrame(ref)
					l.durable[f] = append(l.durable[f], uint64(refIndex(ref)), count)
					maxID = max(maxID, f)
				}
			case frameIntent:
				if in, ok := decodeIntent(payload); ok {
					l.intents = append(l.intents, in)
				}
			}
			return nil
		}, l.corrupt)
		if err != nil {
			return err
		}
		l.old = append(l.old, s)
	}
	l.segs = append(l.segs, l.old...)
	l.nextFrame.Store(maxID)
	return nil
}

// corrupt counts and logs a segment's unreadable tail.
func (l *Log) corrupt(path string, off int64, err error) {
	l.m.corrupt.Inc()
	l.log.Warn("write-ahead log segment has an unreadable tail (a write cut by a crash, or damage); records after it are skipped",
		"segment", path, "offset", off, "err", err)
}

// readSegment calls fn for each frame of the segment at path, with delta
// set when the segment's records are encoded against the record before
// them (format 04 on; decoder.delta). A bad frame ends the segment: onBad
// is told, and the frames before it count.
func readSegment(path string, fn func(kind byte, id uint64, payload []byte, delta bool) error, onBad func(string, int64, error)) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	magic := make([]byte, len(segMagic))
	if _, err := io.ReadFull(r, magic); err != nil || (string(magic) != segMagic && string(magic) != segMagicV3 &&
		string(magic) != segMagicV2 && string(magic) != segMagicV1) {
		if err == io.EOF { // created, nothing written yet
			return nil
		}
		onBad(path, 0, fmt.Errorf("not a wal segment"))
		return nil
	}
	delta := string(magic) == segMagic
	off := int64(len(segMagic))
	var hdr [headerSize]byte
	var payload []byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if err != io.EOF {
				onBad(path, off, fmt.Errorf("frame header: %w", err))
			}
			return nil
		}
		n := binary.LittleEndian.Uint32(hdr[0:])
		if n == 0 || n > maxFrameBytes {
			onBad(path, off, fmt.Errorf("frame length %d", n))
			return nil
		}
		if cap(payload) < int(n) {
			payload = make([]byte, n)
		}
		payload = payload[:n]
		if _, err := io.ReadFull(r, payload); err != nil {
			onBad(path, off, fmt.Errorf("frame payload: %w", err))
			return nil
		}
		if crc32.Checksum(payload, segdir.Castagnoli) != binary.LittleEndian.Uint32(hdr[4:]) {
			onBad(path, off, errors.New("frame checksum mismatch"))
			return nil
		}
		off += headerSize + int64(n)
		kind := payload[0]
		d := decoder{b: payload[1:]}
		var id uint64
		if kind == frameData {
			id = d.uvarint()
		}
		if d.err != nil || (kind != frameData && kind != frameAck && kind != framePart && kind != frameIntent) {
			onBad(path, off, fmt.Errorf("frame kind %q", kind))
			return nil
		}
		if err := fn(kind, id, d.b, delta); err != nil {
			return err
		}
	}
}

// Intent is a batch the writer was about to insert: its dedup token, the
// flow_end range of its rows (Unix milliseconds; 0 when unknown), its row
// count and its records' journal references as (reference, count) runs.
type Intent struct {
	Token          string
	MinEnd, MaxEnd int64
	Rows           int
	Runs           []uint64
}

// StoredFunc reports which of the intents' batches are stored whole (in
// ClickHouse, every one of its rows, or in the writer's spool), by token.
// A batch partly stored (an insert cut short across shards or partitions)
// must not be reported: its records are then replayed. An error means the
// store could not tell.
type StoredFunc func(intents []Intent) (map[string]bool, error)

// Intent journals that a batch of rows rows is about to be inserted under
// token, with rows whose flow_end spans [minEnd, maxEnd] (Unix ms; 0, 0
// when unknown) and records runs ((reference, count) pairs). It writes at
// once (to the page cache, which a killed process does not lose). A
// failure is counted, and the batch goes on: after a crash its records are
// then replayed, as before intents.
func (l *Log) Intent(token string, minEnd, maxEnd int64, rows int, runs []uint64) {
	if token == "" || len(runs) == 0 {
		return
	}
	buf := getBuf()
	defer putBuf(buf)
	b := beginFrame((*buf)[:0], frameIntent)
	b = appendString(b, token)
	b = binary.AppendVarint(b, minEnd)
	b = binary.AppendVarint(b, maxEnd)
	b = binary.AppendUvarint(b, uint64(rows))
	b = binary.AppendUvarint(b, uint64(len(runs)/2))
	for _, v := range runs[:len(runs)/2*2] {
		b = binary.AppendUvarint(b, v)
	}
	sealFrame(b, 0)
	*buf = b

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	if err := l.writeLocked(b); err != nil {
		l.m.errors.Inc()
	}
}

// decodeIntent decodes an intent frame's payload.
func decodeIntent(payload []byte) (Intent, bool) {
	d := decoder{b: payload}
	in := Intent{Token: d.string(), MinEnd: d.varint(), MaxEnd: d.varint()}
	rows := d.uvarint()
	if rows > uint64(MaxFrameRecords)<<RefBits {
		return Intent{}, false
	}
	in.Rows = int(rows)
	n := d.uvarint()
	if d.err != nil || n > uint64(len(payload)) {
		return Intent{}, false
	}
	in.Runs = make([]uint64, 0, 2*n)
	for range n {
		in.Runs = append(in.Runs, d.uvarint(), d.uvarint())
	}
	return in, d.err == nil && in.Token != ""
}

// Replay is ReplayVerified without a store to ask: every record no ack
// frame covers is replayed.
func (l *Log) Replay(batch int, fn func([]flow.Record) error) (int, error) {
	return l.ReplayVerified(batch, nil, fn)
}

// ReplayVerified feeds fn, oldest first, the records of the previous run
// that no ack frame covers, in batches of at most batch records, each
// record journaled under its original frame. Call it once, before new
// records are appended matter; it may run concurrently with Append. It
// returns the number of records replayed.
//
// First, stored (when not nil) is asked about the intents whose records
// are not all acknowledged: the records of a batch it reports stored are
// durable, and are acknowledged instead of replayed.
func (l *Log) ReplayVerified(batch int, stored StoredFunc, fn func([]flow.Record) error) (int, error) {
	l.mu.Lock()
	if l.replayed {
		l.mu.Unlock()
		return 0, errors.New("wal: Replay called twice")
	}
	l.replayed = true
	old := l.old
	l.old = nil
	intents := l.intents
	l.intents = nil
	l.mu.Unlock()
	l.verify(intents, stored)
	total := 0
	var recs []flow.Record
	for _, s := range old {
		err := readSegment(s.path, func(kind byte, id uint64, payload []byte, delta bool) error {
			if kind != frameData || l.acked[id] {
				return nil
			}
			d := decoder{b: payload, delta: delta}
			n := d.uvarint()
			if n == 0 || n > uint64(len(payload)) {
				return nil
			}
			recs = recs[:0]
			runs := l.durable[id]
			var prev flow.Record
			for i := range int(n) {
				var r flow.Record
				d.record(&r, &prev)
				prev = r
				if isDurable(runs, i) {
					continue // stored before the crash
				}
				r.Journal = flow.JournalRefs{Frame: Ref(id, i)}
				recs = append(recs, r)
			}
			if d.err != nil {
				l.corrupt(s.path, -1, fmt.Errorf("frame %d: %w", id, d.err))
				return nil
			}
			if len(recs) == 0 {
				return nil
			}
			l.mu.Lock()
			l.frames[id] = &frameState{seg: s, remaining: len(recs)}
			s.unacked++
			l.mu.Unlock()
			for i := 0; i < len(recs); i += batch {
				if err := fn(recs[i:min(i+batch, len(recs))]); err != nil {
					return err
				}
			}
			total += len(recs)
			l.m.replayed.Add(float64(len(recs)))
			return nil
		}, func(string, int64, error) {}) // counted by scan
		l.mu.Lock()
		s.sealed = true
		l.deleteAckedLocked()
		l.mu.Unlock()
		if err != nil {
			return total, err
		}
	}
	l.mu.Lock()
	l.acked, l.durable = nil, nil
	l.mu.Unlock()
	return total, nil
}

// verify asks stored about the intents with records not yet durable and
// marks the records of those stored as durable.
func (l *Log) verify(intents []Intent, stored StoredFunc) {
	var open []Intent
	for _, in := range intents {
		if !l.allDurable(in.Runs) {
			open = append(open, in)
		}
	}
	if len(open) == 0 {
		return
	}
	if stored == nil {
		l.m.unverified.Add(float64(len(open)))
		return
	}
	found, err := stored(open)
	if err != nil {
		l.m.unverified.Add(float64(len(open)))
		l.log.Warn("write-ahead log: cannot ask the store which batches of the previous run it holds; their records are replayed and may be stored twice",
			"batches", len(open), "err", err)
		return
	}
	n := 0
	var acks []uint64
	for _, in := range open {
		if !found[in.Token] {
			continue
		}
		l.m.verified.Inc()
		for k := 0; k+1 < len(in.Runs); k += 2 {
			ref, count := in.Runs[k], in.Runs[k+1]
			f := refFrame(ref)
			l.durable[f] = append(l.durable[f], uint64(refIndex(ref)), count)
			acks = append(acks, ref, count)
			n += int(count)
		}
	}
	if len(acks) > 0 {
		// Written as partial acks, so a crash before the old segments are
		// gone does not ask the store again (it may not answer then).
		l.mu.Lock()
		l.partial = append(l.partial, acks...)
		l.flushAcksLocked()
		l.mu.Unlock()
	}
	if n > 0 {
		l.m.skipped.Add(float64(n))
		l.log.Info("write-ahead log: batches of the previous run found in the store; their records are not replayed",
			"records", n)
	}
}

// allDurable says whether every record of runs ((reference, count) pairs)
// is acknowledged by an ack or partial ack frame of the previous run.
func (l *Log) allDurable(runs []uint64) bool {
	for k := 0; k+1 < len(runs); k += 2 {
		ref, count := runs[k], runs[k+1]
		f := refFrame(ref)
		if l.acked[f] {
			continue
		}
		for i := range int(count) {
			if !isDurable(l.durable[f], refIndex(ref)+i) {
				return false
			}
		}
	}
	return true
}

// isDurable says whether runs ((index, count) pairs) cover index i.
func isDurable(runs []uint64, i int) bool {
	for k := 0; k+1 < len(runs); k += 2 {
		if uint64(i) >= runs[k] && uint64(i) < runs[k]+runs[k+1] {
			return true
		}
	}
	return false
}

// Append journals recs as one frame and marks them with it. Records that
// carry a frame already (replayed ones) are not journaled again. On a
// write error the records go on unjournaled: the error is counted, logged
// at most once a minute, and returned.
func (l *Log) Append(recs []flow.Record) error {
	if len(recs) == 0 || recs[0].Journal.Frame != 0 {
		return nil
	}
	for len(recs) > MaxFrameRecords {
		if err := l.appendFrame(recs[:MaxFrameRecords]); err != nil {
			return err
		}
		recs = recs[MaxFrameRecords:]
	}
	return l.appendFrame(recs)
}

// appendFrame journals recs (at most MaxFrameRecords) as one frame.
func (l *Log) appendFrame(recs []flow.Record) error {
	id := l.nextFrame.Add(1)
	buf := getBuf()
	defer putBuf(buf)
	b := beginFrame((*buf)[:0], frameData)
	b = binary.AppendUvarint(b, id)
	b = binary.AppendUvarint(b, uint64(len(recs)))
	var zero flow.Record
	prev := &zero
	for i := range recs {
		b = appendRecord(b, &recs[i], prev)
		prev = &recs[i]
	}
	sealFrame(b, 0)
	*buf = b

	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("wal: closed")
	}
	if err := l.writeLocked(b); err != nil {
		l.m.errors.Inc()
		if time.Since(l.errLog) > time.Minute {
			l.errLog = time.Now()
			l.log.Error("write-ahead log append failed: records go on without crash protection", "err", err)
		}
		return err
	}
	l.frames[id] = &frameState{seg: l.active, remaining: len(recs)}
	l.active.unacked++
	l.m.records.Add(float64(len(recs)))
	for i := range recs {
		recs[i].Journal = flow.JournalRefs{Frame: Ref(id, i)}
	}
	return nil
}

// writeLocked writes a data frame to the active segment, opening or
// rotating it first, and writes pending acks before it.
func (l *Log) writeLocked(frame []byte) error {
	if l.active != nil && (l.active.size >= l.cfg.SegmentBytes || time.Since(l.active.opened) >= l.cfg.SegmentAge) {
		l.rotateLocked()
	}
	if l.active == nil {
		if err := l.openSegmentLocked(); err != nil {
			return err
		}
	}
	if len(l.acks)+len(l.partial) > 0 {
		if err := l.writeAcksLocked(); err != nil {
			return err
		}
	}
	return l.appendLocked(frame)
}

// appendLocked writes frames to the active segment. A short write (a full
// disk) would leave a torn frame mid-segment, where a replay stops reading
// the segment: the frames after it, written once space came back, would be
// skipped. The tail is cut back to the last whole frame instead; if that
// fails too, the segment is sealed so later frames go to a new one.
func (l *Log) appendLocked(b []byte) error {
	n, err := l.f.Write(b)
	if err != nil {
		if n > 0 {
			if terr := l.f.Truncate(l.active.size); terr != nil {
				l.active.size += int64(n)
				l.sealActiveLocked()
				return err
			}
		}
		return err
	}
	l.active.size += int64(n)
	l.m.bytes.Add(float64(n))
	l.dirty = true
	return nil
}

func (l *Log) openSegmentLocked() error {
	var n uint64 = 1
	if k := len(l.segs); k > 0 {
		n = l.segs[k-1].n + 1
	}
	path := filepath.Join(l.cfg.Dir, segdir.Name(n, segSuffix))
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	if _, err := f.WriteString(segMagic); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("wal: %w", err)
	}
	l.f, l.newSeg = f, true
	l.active = &segment{n: n, path: path, size: int64(len(segMagic)), opened: time.Now()}
	l.segs = append(l.segs, l.active)
	return nil
}

// rotateLocked seals the active segment; the next write opens a new one.
func (l *Log) rotateLocked() {
	if l.active == nil {
		return
	}
	if len(l.acks)+len(l.partial) > 0 {
		_ = l.writeAcksLocked()
	}
	if l.active != nil { // a failed write may have sealed it
		l.sealActiveLocked()
	}
}

// sealActiveLocked closes the active segment as it is.
func (l *Log) sealActiveLocked() {
	if l.dirty && l.cfg.SyncInterval > 0 {
		_ = l.f.Sync()
	}
	_ = l.f.Close()
	l.f, l.dirty = nil, false
	l.active.sealed = true
	l.active = nil
	l.deleteAckedLocked()
}

// writeAcksLocked writes the pending acknowledgements; they stay pending
// if the write fails.
func (l *Log) writeAcksLocked() error {
	var b []byte
	if len(l.acks) > 0 {
		b = l.appendAckFrame(b, frameAck, l.acks, 1)
	}
	if len(l.partial) > 0 {
		b = l.appendAckFrame(b, framePart, l.partial, 2)
	}
	if len(b) == 0 {
		return nil
	}
	if err := l.appendLocked(b); err != nil {
		return err
	}
	l.acks, l.partial = l.acks[:0], l.partial[:0]
	return nil
}

// appendAckFrame appends a frame of kind listing vals, per items of
// width values each.
func (l *Log) appendAckFrame(b []byte, kind byte, vals []uint64, width int) []byte {
	start := len(b)
	b = beginFrame(b, kind)
	b = binary.AppendUvarint(b, uint64(len(vals)/width))
	for _, v := range vals {
		b = binary.AppendUvarint(b, v)
	}
	sealFrame(b, start)
	return b
}

// beginFrame appends the header of a frame of kind, to be filled by
// sealFrame, and the kind byte.
func beginFrame(b []byte, kind byte) []byte {
	return append(b, 0, 0, 0, 0, 0, 0, 0, 0, kind)
}

// sealFrame fills the header of the frame starting at b[start:] (the rest
// of b is its payload): payload length and CRC-32C.
func sealFrame(b []byte, start int) {
	payload := b[start+headerSize:]
	binary.LittleEndian.PutUint32(b[start:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(payload, segdir.Castagnoli))
}

// Ack acknowledges n records from ref on (ref, ref+1, ...: consecutive
// records of one frame): they are durable. When every record of a frame
// is, the frame is acknowledged in the log; until then the run is.
//
// The acknowledgement is written by FlushAcks (the writer calls it once per
// batch), by the next append, or by the sync tick.
func (l *Log) Ack(ref uint64, n int) {
	if ref == 0 {
		return
	}
	l.mu.Lock()
	l.ackLocked(ref, n)
	l.mu.Unlock()
}

// FlushAcks writes the acknowledgements given so far, in one write.
func (l *Log) FlushAcks() {
	l.mu.Lock()
	l.flushAcksLocked()
	l.mu.Unlock()
}

// flushAcksLocked writes the pending acknowledgements at once (to the page
// cache, which a killed process does not lose). They used to wait for the
// next data frame or the sync tick (1 s): a collector killed meanwhile
// replayed, and stored again, batches that were already in ClickHouse,
// which every SIGKILL of TestShardedCollectors showed.
// Acknowledgements of replayed records may come before any append: they
// open the active segment.
func (l *Log) flushAcksLocked() {
	if l.closed || len(l.acks)+len(l.partial) == 0 {
		return
	}
	if l.active == nil {
		if err := l.openSegmentLocked(); err != nil {
			l.m.errors.Inc()
			return
		}
	}
	if err := l.writeAcksLocked(); err != nil {
		l.m.errors.Inc()
	}
}

// AckRecords acknowledges every record recs stand for.
func (l *Log) AckRecords(recs []flow.Record) {
	if len(recs) == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	var run uint64 // the first reference of a run of consecutive ones
	n := 0
	for i := range recs {
		j := &recs[i].Journal
		if j.Frame != run+uint64(n) || n == 0 {
			l.ackLocked(run, n)
			run, n = j.Frame, 0
		}
		n++
		if j.Frame2 != 0 {
			l.ackLocked(j.Frame2, 1)
		}
		for _, f := range j.More {
			l.ackLocked(f, 1)
		}
	}
	l.ackLocked(run, n)
	l.flushAcksLocked()
}

func (l *Log) ackLocked(ref uint64, n int) {
	if ref == 0 || n == 0 {
		return
	}
	frame := refFrame(ref)
	fs := l.frames[frame]
	if fs == nil {
		return
	}
	fs.remaining -= n
	if fs.remaining > 0 {
		if !l.closed {
			l.partial = append(l.partial, ref, uint64(n))
		}
		return
	}
	delete(l.frames, frame)
	if !l.closed {
		l.acks = append(l.acks, frame)
	}
	fs.seg.unacked--
	if fs.seg.unacked == 0 {
		l.deleteAckedLocked()
	}
}

// deleteAckedLocked deletes the oldest segments while they are sealed and
// fully acknowledged. Only a prefix goes: the ack frames of a segment are
// about frames of it or of older segments.
func (l *Log) deleteAckedLocked() {
	for len(l.segs) > 0 {
		s := l.segs[0]
		if s == l.active || !s.sealed || s.unacked > 0 {
			return
		}
		if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			l.m.errors.Inc()
			l.log.Warn("write-ahead log: cannot delete an acknowledged segment", "segment", s.path, "err", err)
			return
		}
		l.segs = l.segs[1:]
	}
}

func (l *Log) syncLoop() {
	t := time.NewTicker(l.cfg.SyncInterval)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		l.mu.Lock()
		if l.active != nil && len(l.acks)+len(l.partial) > 0 {
			_ = l.writeAcksLocked()
		}
		if l.active != nil && time.Since(l.active.opened) >= l.cfg.SegmentAge {
			l.rotateLocked()
		}
		var f *os.File
		if l.dirty && l.f != nil {
			f, l.dirty = l.f, false
		}
		newSeg := l.newSeg
		l.newSeg = false
		l.mu.Unlock()
		// A segment's data is durable only with its name: a power loss
		// could otherwise lose a new segment whose frames were fsynced.
		if newSeg {
			if err := segdir.SyncDir(l.cfg.Dir); err != nil {
				l.m.errors.Inc()
			}
		}
		if f != nil {
			// Outside the lock: appends go on while the disk syncs. A
			// rotation may close f meanwhile, after its own sync.
			if err := f.Sync(); err != nil && !errors.Is(err, os.ErrClosed) {
				l.m.errors.Inc()
			}
		}
	}
}

// Close writes the pending acks, syncs and closes the log, deleting every
// fully acknowledged segment: after a clean shutdown the log is empty
// unless some records were not made durable.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.rotateLocked()
	l.closed = true
	left := 0
	for _, fs := range l.frames {
		left += fs.remaining
	}
	l.mu.Unlock()
	close(l.stop)
	l.wg.Wait()
	if left > 0 {
		l.log.Warn("write-ahead log keeps records that were not made durable; the next start replays them", "records", left, "dir", l.cfg.Dir)
	}
	return l.lock.Close()
}

// Stats are the log's figures.
type Stats struct {
	Segments       int // segment files
	UnackedFrames  int // frames with records not yet durable
	PendingRecords int // their records
}

// Stats returns the log's figures.
func (l *Log) Stats() Stats {
	l.mu.Lock()
	defer l.mu.Unlock()
	st := Stats{Segments: len(l.segs), UnackedFrames: len(l.frames)}
	for _, fs := range l.frames {
		st.PendingRecords += fs.remaining
	}
	return st
}

var bufs = sync.Pool{New: func() any { b := make([]byte, 0, 256<<10); return &b }}

func getBuf() *[]byte  { return bufs.Get().(*[]byte) }
func putBuf(b *[]byte) { bufs.Put(b) }

type metrics struct {
	records  prometheus.Counter
	bytes    prometheus.Counter
	replayed prometheus.Counter
	verified prometheus.Counter
	skipped  prometheus.Counter
	// unverified counts intents the store could not be asked about.
	unverified prometheus.Counter
	corrupt    prometheus.Counter
	errors     prometheus.Counter
	gauges     []prometheus.Collector
}

func newMetrics(l *Log) *metrics {
	m := &metrics{
		records: prometheus.NewCounter(prometheus.CounterOpts{Name: "dualflow_wal_records_total",
			Help: "Received records journaled in the write-ahead log."}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "dualflow_wal_bytes_total",
			Help: "Bytes written to the write-ahead log."}),
		replayed: prometheus.NewCounter(prometheus.CounterOpts{Name: "dualflow_wal_replayed_records_total",
			Help: "Records of a previous run replayed from the write-ahead log at start (after a crash; some may have been written before it)."}),
		verified: prometheus.NewCounter(prometheus.CounterOpts{Name: "dualflow_wal_verified_batches_total",
			Help: "Batches of a previous run, inserted but not acknowledged at a crash, found in the store at start: their records were not replayed."}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{Name: "dualflow_wal_verified_records_total",
			Help: "Records of those batches (not replayed, since stored)."}),
		unverified: prometheus.NewCounter(prometheus.CounterOpts{Name: "dualflow_wal_unverified_batches_total",
			Help: "Batches of a previous run, inserted but not acknowledged at a crash, that the store could not be asked about: their records were replayed and may be stored twice."}),
		corrupt: prometheus.NewCounter(prometheus.CounterOpts{Name: "dualflow_wal_corrupt_segments_total",
			Help: "Write-ahead log segments with an unreadable tail, skipped from there."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "dualflow_wal_errors_total",
			Help: "Write-ahead log write, sync or delete failures (records then go on without crash protection)."}),
	}
	stat := func(f func(Stats) int) func() float64 { return func() float64 { return float64(f(l.Stats())) } }
	m.gauges = []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dualflow_wal_segments", Help: "Write-ahead log segment files."},
			stat(func(s Stats) int { return s.Segments })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "dualflow_wal_pending_records", Help: "Journaled records not yet in ClickHouse or the spool."},
			stat(func(s Stats) int { return s.PendingRecords })),
	}
	return m
}

func (m *metrics) register(reg prometheus.Registerer) error {
	for _, c := range append([]prometheus.Collector{m.records, m.bytes, m.replayed, m.verified, m.skipped, m.unverified, m.corrupt, m.errors}, m.gauges...) {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("wal metrics: %w", err)
		}
	}
	return nil
}
