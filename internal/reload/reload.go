// Package reload keeps what a process loads from files current while it
// runs: TLS certificates, keys and CAs (LoadTLS), and bearer tokens.
// Kubernetes replaces the files of a mounted Secret under a running pod
// (cert-manager renewing a certificate, an operator rotating a token) by
// swapping a symlink, ..data, to a new directory, and nothing restarts the
// pod; a File sees the change and loads the new content.
//
// A File checks its files when it is used (a TLS handshake, a request),
// at most once per Options.Interval: one os.Stat per file, following the
// symlinks, compared with the last by device, inode, size and
// modification time. Between checks a use costs a clock read and two
// atomic loads (BenchmarkGet). Changed files are loaded in full before
// they replace the value: content that does not load (half written,
// unparsable, a key that does not match its certificate) leaves the last
// good value in use, is logged once and counted (Metrics), and is tried
// again at each check until it loads.
package reload

import (
	"cmp"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// DefaultInterval is how often a File checks its files by default. The
// kubelet takes up to a minute or so to update a Secret volume, so a
// second more is nothing, and a stat a second is nothing either.
const DefaultInterval = time.Second

// Options configure a File.
type Options struct {
	// Name says what the files are, in logs and in the name label of the
	// metrics ("ipfix-server", "web-tokens"). Names are unique in a
	// process.
	Name string
	// Logger logs the reloads and the failed ones (nil: slog.Default()).
	Logger *slog.Logger
	// Interval between two checks of the files (0: DefaultInterval).
	Interval time.Duration
}

// File is a value loaded from files and reloaded when they change. Get is
// safe for concurrent use.
type File[T any] struct {
	name  string
	paths []string
	load  func() (T, error)
	every time.Duration
	log   *slog.Logger
	epoch time.Time // monotonic origin of next

	cur  atomic.Pointer[T]
	next atomic.Int64 // when the files are due a check, in ns since epoch
	mu   sync.Mutex   // held by the one check under way; other users go on with cur
	seen []Stamp      // the files cur was loaded from (under mu)
	bad  []Stamp      // the files that last failed to load, logged (under mu)

	reloads, errors atomic.Uint64
}

// NewFile loads a value with load, which reads paths, and returns the File
// that reloads it when they change. The first load's error is returned:
// a process does not start on files it cannot use.
func NewFile[T any](o Options, load func() (T, error), paths ...string) (*File[T], error) {
	f := &File[T]{name: o.Name, paths: paths, load: load, every: cmp.Or(o.Interval, DefaultInterval),
		log: cmp.Or(o.Logger, slog.Default()), epoch: time.Now()}
	f.seen = Stamps(paths) // before the read: a change after it is seen next time
	v, err := load()
	if err != nil {
		return nil, err
	}
	f.cur.Store(&v)
	f.next.Store(int64(f.every))
	return f, nil
}

// Get returns the value, first reloading it if the files are due a check
// and have changed. Only one caller checks at a time; the others get the
// current value without waiting.
func (f *File[T]) Get() T {
	if now := int64(time.Since(f.epoch)); now >= f.next.Load() && f.mu.TryLock() {
		if now >= f.next.Load() {
			f.next.Store(now + int64(f.every))
			f.check()
		}
		f.mu.Unlock()
	}
	return *f.cur.Load()
}

// check reloads the value if the files changed since it was loaded. A
// failure is logged and counted once per content (its stamps), and tried
// again at every check: a file caught half written may be complete by
// the next one with the same stamps (modification times are coarse).
func (f *File[T]) check() {
	st := Stamps(f.paths)
	if slices.Equal(st, f.seen) {
		return
	}
	v, err := f.load()
	if err != nil {
		if !slices.Equal(st, f.bad) {
			f.bad = st
			f.errors.Add(1)
			f.log.Error("reloading changed files failed: the last good content stays in use until they load",
				"name", f.name, "files", f.paths, "err", err)
		}
		return
	}
	f.cur.Store(&v)
	f.seen, f.bad = st, nil
	f.reloads.Add(1)
	f.log.Info("reloaded changed files", "name", f.name, "files", f.paths)
}

// Stamp identifies the content of a file without reading it. Kubernetes
// and `dualflow certs` replace files (a new inode); an editor rewriting in
// place changes the size or the modification time. Comparable: equal
// stamps mean an unchanged file.
type Stamp struct {
	dev, ino uint64
	size     int64
	mtime    int64
	err      string // the stat failed (a file missing in the middle of a swap)
}

// Stamps returns the stamps of paths, following symlinks.
func Stamps(paths []string) []Stamp {
	out := make([]Stamp, len(paths))
	for i, p := range paths {
		fi, err := os.Stat(p)
		if err != nil {
			out[i].err = err.Error()
			continue
		}
		out[i].size, out[i].mtime = fi.Size(), fi.ModTime().UnixNano()
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			out[i].dev, out[i].ino = uint64(st.Dev), st.Ino
		}
	}
	return out
}
