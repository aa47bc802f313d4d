// Package segdir is what the collector's write-ahead log and its spool
// share on disk: a directory one process owns (an exclusive flock on its
// LOCK file), holding segment files named by a sequence number, their
// CRC-32C checksums, and the fsync of the directory after a rename or an
// unlink. The segments' formats are their owners'. TryLock is also the
// flock of the lab demo's lock and of the embedded engine's holder check.
package segdir

import (
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
)

// Castagnoli is the table of the segments' CRC-32C checksums.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// seqDigits is the width of a sequence number in a name, that of the
// largest uint64: names sort in sequence order, as os.ReadDir lists them.
const seqDigits = 20

// Name returns the file name of segment seq: its number, then suffix.
func Name(seq uint64, suffix string) string {
	return fmt.Sprintf("%0*d%s", seqDigits, seq, suffix)
}

// Seq returns the sequence number a file name starts with: a segment
// moved aside may carry more after it.
func Seq(name string) (uint64, bool) {
	if len(name) < seqDigits {
		return 0, false
	}
	seq, err := strconv.ParseUint(name[:seqDigits], 10, 64)
	return seq, err == nil
}

// Parse returns the sequence number of segment file name, Name(seq,
// suffix); ok is false for any other name (LOCK, stray files).
func Parse(name, suffix string) (seq uint64, ok bool) {
	seq, ok = Seq(name)
	return seq, ok && name == Name(seq, suffix)
}

// Lock takes the exclusive lock of dir without waiting: a flock on
// dir/LOCK (created 0600). Closing the returned file releases it, as the
// process's exit does. held reports that another open file holds it, in
// this process or another; the file is nil then.
func Lock(dir string) (f *os.File, held bool, err error) {
	f, err = os.OpenFile(filepath.Join(dir, "LOCK"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, false, err
	}
	if held, err = TryLock(f); held || err != nil {
		f.Close()
		return nil, held, err
	}
	return f, false, nil
}
