// Package spool is a bounded, crash-safe, on-disk FIFO of batches. The
// ClickHouse writer spools the batches it cannot insert and replays them,
// oldest first, when ClickHouse is back, including after a restart.
//
// Each batch is one file named by a monotonically increasing sequence number
// (00000000000000000042.seg). A file is written under a temporary name,
// fsynced, then renamed and the directory fsynced, so a crash leaves either
// the whole batch or nothing. Files carry a magic, a format version and
// CRC-32C checksums of the metadata and the payload; a file that fails to
// parse is moved to <dir>/corrupt/ and counted, never returned and never
// fatal. The spool holds an exclusive lock on its directory (flock on unix)
// so two processes cannot replay the same batches. Lock, names and checksums
// are internal/segdir's, shared with the write-ahead log (collector/wal).
package spool

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/dualflow/dualflow/internal/atomicfile"
	"github.com/dualflow/dualflow/internal/segdir"
)

// Batch is one unit of the spool: an encoded payload and what is needed to
// insert it again.
type Batch struct {
	Table   string   // destination table
	Columns []string // column list the payload was encoded for
	// Token is the unique deduplication token of the batch, reused on every
	// replay so that ClickHouse writes the batch once.
	Token string
	Rows  int    // number of rows in Data
	Data  []byte // RowBinary payload
}

var (
	// ErrFull is returned (wrapped) by Push when adding the batch would take
	// the spool over its byte bound. The batch is not stored.
	ErrFull = errors.New("spool: full")
	// ErrEmpty is returned by Pop and Reject when the spool holds no batch.
	ErrEmpty = errors.New("spool: empty")
	// ErrClosed is returned by Push, Peek, Pop and Reject after Close.
	ErrClosed = errors.New("spool: closed")
	// ErrLocked is returned by Open when another Spool (in this process or
	// another) holds the directory.
	ErrLocked = errors.New("spool: directory in use")
)

const (
	segSuffix = ".seg"
	tmpSuffix = ".tmp" // in atomicfile's temporary names (and older spools' <name>.tmp)

	// CorruptDir and RejectedDir are the subdirectories of the spool
	// directory where unreadable and rejected segments are moved. Their
	// files keep the segment format: moving a rejected file back into the
	// spool directory replays it at the next Open.
	CorruptDir  = "corrupt"
	RejectedDir = "rejected"
)

// Spool is an on-disk FIFO of batches. It is safe for concurrent use;
// Peek, Pop and Reject act on the oldest batch and are meant for a single
// consumer (Push may run concurrently with them).
type Spool struct {
	dir      string
	maxBytes int64
	lock     *os.File

	pushMu sync.Mutex // serialises Push so segments are queued in sequence order

	mu      sync.Mutex
	entries []entry // queued segments, oldest first
	bytes   int64   // sizes of entries plus the size reserved by a Push in progress
	rows    int64
	nextSeq uint64
	corrupt int64
	closed  bool
}

// entry is one segment file in the queue.
type entry struct {
	seq   uint64
	size  int64
	rows  int
	token string // the batch's dedup token
}

func segName(seq uint64) string { return segdir.Name(seq, segSuffix) }

// Open opens the spool in dir, creating the directory if needed, and
// recovers the segments left by a previous run in sequence order. It removes
// temporary files of interrupted writes and moves segments whose header is
// unreadable or whose size does not match the header to dir/corrupt/ (the
// payload checksum is verified by Peek). maxBytes bounds the total size of
// the segment files; a spool recovered over its bound accepts no Push until
// it has drained below it.
func Open(dir string, maxBytes int64) (*Spool, error) {
	if maxBytes <= 0 {
		return nil, fmt.Errorf("spool open %s: max bytes %d must be positive", dir, maxBytes)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool open: %w", err)
	}
	lock, held, err := segdir.Lock(dir)
	if held {
		err = ErrLocked
	}
	if err != nil {
		return nil, fmt.Errorf("spool open %s: %w", dir, err)
	}
	s := &Spool{dir: dir, maxBytes: maxBytes, lock: lock, nextSeq: 1}
	if err := s.recover(); err != nil {
		lock.Close()
		return nil, fmt.Errorf("spool open %s: %w", dir, err)
	}
	return s, nil
}

func (s *Spool) recover() error {
	des, err := os.ReadDir(s.dir) // sorted by name, so by sequence
	if err != nil {
		return err
	}
	for _, de := range des {
		name := de.Name()
		if !de.Type().IsRegular() {
			continue
		}
		if strings.Contains(name, tmpSuffix) {
			// An interrupted Push: it never returned success, so nobody
			// counts on this batch.
			if err := os.Remove(filepath.Join(s.dir, name)); err != nil {
				return err
			}
			continue
		}
		seq, ok := segdir.Parse(name, segSuffix)
		if !ok {
			continue // not ours (LOCK, stray files)
		}
		s.nextSeq = max(s.nextSeq, seq+1)
		h, size, err := readHeader(filepath.Join(s.dir, name))
		if err == nil && size != h.size() {
			err = fmt.Errorf("%w: size %d, header says %d", ErrCorrupt, size, h.size())
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				return err
			}
			s.corrupt++
			s.moveAside(seq, CorruptDir) // best effort: the file is skipped either way
			continue
		}
		s.entries = append(s.entries, entry{seq: seq, size: size, rows: h.rows, token: h.token})
		s.bytes += size
		s.rows += int64(h.rows)
	}
	// Never reuse a sequence number of a file moved aside, so a file moved
	// back from rejected/ cannot collide with a newer one.
	for _, sub := range []string{CorruptDir, RejectedDir} {
		des, err := os.ReadDir(filepath.Join(s.dir, sub))
		if err != nil {
			continue
		}
		for _, de := range des {
			if seq, ok := segdir.Seq(de.Name()); ok {
				s.nextSeq = max(s.nextSeq, seq+1)
			}
		}
	}
	return nil
}

// readHeader reads and parses the header and metadata of a segment file and
// returns them with the file size.
func readHeader(path string) (header, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return header{}, 0, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return header{}, 0, err
	}
	buf := make([]byte, headerSize)
	if _, err := io.ReadFull(f, buf); err != nil {
		return header{}, 0, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	h, err := parseFixed(buf)
	if err != nil {
		return h, 0, err
	}
	buf = append(buf, make([]byte, h.metaLen)...)
	if _, err := io.ReadFull(f, buf[headerSize:]); err != nil {
		return header{}, 0, fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	h, err = parseHeader(buf)
	return h, st.Size(), err
}

// Push appends b to the spool: when it returns nil the batch is durable on
// disk. It returns an error wrapping ErrFull, without writing, when the
// batch would take the spool over its bound. Push does not retain b.Data.
func (s *Spool) Push(b Batch) error {
	hdr := appendHeader(nil, &b)
	size := int64(len(hdr) + len(b.Data))

	s.pushMu.Lock()
	defer s.pushMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	if s.bytes+size > s.maxBytes {
		used := s.bytes
		s.mu.Unlock()
		return fmt.Errorf("spool push %d bytes (%d of %d used): %w", size, used, s.maxBytes, ErrFull)
	}
	seq := s.nextSeq
	s.nextSeq++
	s.bytes += size // reserve, so Bytes never under-reports during the write
	s.mu.Unlock()

	err := s.write(seq, hdr, b.Data)

	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.bytes -= size
		return err
	}
	s.entries = append(s.entries, entry{seq: seq, size: size, rows: b.Rows, token: b.Token})
	s.rows += int64(b.Rows)
	return nil
}

// write stores one segment atomically (atomicfile: a synced temporary
// file renamed over the name), then syncs the directory.
func (s *Spool) write(seq uint64, hdr, data []byte) error {
	name := segName(seq)
	err := atomicfile.Write(filepath.Join(s.dir, name), 0o600, func(w io.Writer) error {
		_, err := (&net.Buffers{hdr, data}).WriteTo(w)
		return err
	})
	if err == nil {
		err = segdir.SyncDir(s.dir)
	}
	if err != nil {
		return fmt.Errorf("spool write %s: %w", name, err)
	}
	return nil
}

// Peek returns the oldest batch without removing it; ok is false when the
// spool is empty. It reads and verifies the whole file: a segment that fails
// verification is moved to dir/corrupt/, counted, and skipped. The returned
// Data is a fresh buffer owned by the caller.
func (s *Spool) Peek() (b Batch, ok bool, err error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return Batch{}, false, ErrClosed
		}
		if len(s.entries) == 0 {
			s.mu.Unlock()
			return Batch{}, false, nil
		}
		e := s.entries[0]
		s.mu.Unlock()

		data, err := os.ReadFile(filepath.Join(s.dir, segName(e.seq)))
		if err == nil {
			b, err = decodeSegment(data)
			if err == nil {
				return b, true, nil
			}
		}
		if !errors.Is(err, ErrCorrupt) && !errors.Is(err, fs.ErrNotExist) {
			return Batch{}, false, fmt.Errorf("spool peek: %w", err)
		}
		// Unreadable or removed behind our back: skip it for good.
		s.mu.Lock()
		s.corrupt++
		s.removeHeadLocked(e.seq)
		s.mu.Unlock()
		s.moveAside(e.seq, CorruptDir)
	}
}

// Pop removes the oldest batch, once it has been written elsewhere. The
// batch leaves the queue even if deleting its file fails (the error is
// returned); such a file is replayed after the next Open, which is why
// batches carry a deduplication token.
func (s *Spool) Pop() error {
	seq, err := s.takeHead()
	if err != nil {
		return err
	}
	if err := os.Remove(filepath.Join(s.dir, segName(seq))); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("spool pop: %w", err)
	}
	if err := segdir.SyncDir(s.dir); err != nil {
		return fmt.Errorf("spool pop: %w", err)
	}
	return nil
}

// Reject moves the oldest batch to dir/rejected/ and returns its new path.
// It is for batches the destination refuses for good: they leave the queue
// but stay on disk for an operator.
func (s *Spool) Reject() (string, error) {
	seq, err := s.takeHead()
	if err != nil {
		return "", err
	}
	path, err := s.moveAside(seq, RejectedDir)
	if err != nil {
		return "", fmt.Errorf("spool reject: %w", err)
	}
	return path, nil
}

func (s *Spool) takeHead() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, ErrClosed
	}
	if len(s.entries) == 0 {
		return 0, ErrEmpty
	}
	seq := s.entries[0].seq
	s.removeHeadLocked(seq)
	return seq, nil
}

func (s *Spool) removeHeadLocked(seq uint64) {
	if len(s.entries) == 0 || s.entries[0].seq != seq {
		return
	}
	e := s.entries[0]
	s.entries[0] = entry{}
	s.entries = s.entries[1:]
	s.bytes -= e.size
	s.rows -= int64(e.rows)
}

// moveAside renames segment seq into the subdirectory sub, without
// overwriting an earlier file of the same name.
func (s *Spool) moveAside(seq uint64, sub string) (string, error) {
	dst := filepath.Join(s.dir, sub)
	if err := os.MkdirAll(dst, 0o700); err != nil {
		return "", err
	}
	name := segName(seq)
	to := filepath.Join(dst, name)
	for i := 1; ; i++ {
		_, err := os.Lstat(to)
		if errors.Is(err, fs.ErrNotExist) {
			break
		}
		if err != nil { // EACCES, ENOTDIR…: no free name can be found
			return "", fmt.Errorf("spool: move %s aside: %w", name, err)
		}
		to = filepath.Join(dst, name+"."+strconv.Itoa(i))
	}
	if err := os.Rename(filepath.Join(s.dir, name), to); err != nil {
		return "", err
	}
	if err := segdir.SyncDir(s.dir); err != nil {
		return "", err
	}
	return to, segdir.SyncDir(dst)
}

// Has reports whether a batch with this dedup token is in the spool (not
// the rejected or corrupt ones).
func (s *Spool) Has(token string) bool {
	if token == "" {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.ContainsFunc(s.entries, func(e entry) bool { return e.token == token })
}

// Len returns the number of batches in the spool.
func (s *Spool) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// Bytes returns the total size of the spool's segment files (including a
// Push in progress).
func (s *Spool) Bytes() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}

// Rows returns the total number of rows in the spool.
func (s *Spool) Rows() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rows
}

// Corrupt returns how many segments were found unreadable and moved to
// dir/corrupt/ since Open.
func (s *Spool) Corrupt() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.corrupt
}

// Dir returns the spool directory.
func (s *Spool) Dir() string { return s.dir }

// Close releases the directory lock. The batches stay on disk for the next
// Open. Len, Bytes, Rows and Corrupt keep reporting the last state.
func (s *Spool) Close() error {
	s.pushMu.Lock() // wait for a Push in progress
	defer s.pushMu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return s.lock.Close()
}
