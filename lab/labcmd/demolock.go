package labcmd

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dualflow/dualflow/internal/segdir"
)

// demoLockFile, in a lab's state directory, is held (flock, exclusive) by
// the demo running on that lab, and holds its pid.
const demoLockFile = "demo.lock"

// ErrDemoRunning is returned by Demo when another demo holds the lab's
// state directory or the data directory: the second demo refuses before
// it touches either, so the first keeps running.
var ErrDemoRunning = errors.New("a demo is already running")

// demoLock is the exclusive lock of a running demo on its lab's state
// directory.
type demoLock struct {
	f    *os.File
	path string
}

// lockDemo takes the demo lock of stateDir without waiting. When another
// process holds it, the error wraps ErrDemoRunning and names that
// process's pid and web URL (from the state directory).
func lockDemo(stateDir string) (*demoLock, error) {
	if !filepath.IsAbs(stateDir) {
		return nil, fmt.Errorf("demo: state dir %q: want an absolute path", stateDir)
	}
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return nil, fmt.Errorf("demo: state dir: %w", err)
	}
	path := filepath.Join(stateDir, demoLockFile)
	// Unlock removes the file: a lock taken on a file that was removed
	// meanwhile guards nothing, so check that the path is still the file
	// locked, and retry otherwise.
	for range 10 {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			return nil, fmt.Errorf("demo: lock file: %w", err)
		}
		held, err := segdir.TryLock(f)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("demo: lock %s: %w", path, err)
		}
		if held {
			b, _ := os.ReadFile(path)
			f.Close()
			return nil, runningErr(stateDir, strings.TrimSpace(string(b)))
		}
		if !samePath(f, path) {
			f.Close()
			continue
		}
		if err := f.Truncate(0); err == nil {
			_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("demo: lock file: %w", err)
		}
		return &demoLock{f: f, path: path}, nil
	}
	return nil, fmt.Errorf("demo: lock %s: the file keeps being replaced", path)
}

// runningErr says which demo holds the lab of stateDir.
func runningErr(stateDir, pid string) error {
	who := "pid " + pid
	if pid == "" {
		who = "pid unknown"
	}
	if u, err := DemoWebURL(stateDir); err == nil {
		who += ", web UI " + u
	}
	return fmt.Errorf("%w on the lab of %s (%s): it was left as it is; stop it first (Ctrl-C in its terminal, or kill %s), or start this one with another --state-dir, --prefix, --data-dir and ports (make run: see make help)",
		ErrDemoRunning, stateDir, who, cmp.Or(pid, "its pid"))
}

// samePath reports whether path still names the open file f.
func samePath(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

// Unlock removes the lock file and releases the lock (in that order, so a
// demo starting meanwhile either waits for this one or finds a fresh
// file).
func (l *demoLock) Unlock() {
	if l == nil || l.f == nil {
		return
	}
	os.Remove(l.path)
	l.f.Close() // releases the flock
	l.f = nil
	os.Remove(filepath.Dir(l.path)) // only if empty, as lab.Down leaves it
}

// refusal is an error with its own message that still matches its causes
// (errors.Is).
type refusal struct {
	msg    string
	causes []error
}

func (r *refusal) Error() string   { return r.msg }
func (r *refusal) Unwrap() []error { return r.causes }

// lockPrefix takes the lock of the lab namespace prefix (lab.Down removes
// every namespace of a prefix, whatever the state directory): a lock
// directory per prefix under the system's temporary directory.
func lockPrefix(prefix string) (*demoLock, error) {
	clean := strings.Map(func(r rune) rune {
		if r == '/' || r == 0 {
			return '_'
		}
		return r
	}, prefix)
	l, err := lockDemo(filepath.Join(os.TempDir(), "dualflow-lab-prefix-"+clean))
	if err != nil && errors.Is(err, ErrDemoRunning) {
		return nil, &refusal{msg: fmt.Sprintf("%v on the lab namespaces %s* (%v); pass another --prefix", ErrDemoRunning, prefix, err),
			causes: []error{ErrDemoRunning}}
	}
	return l, err
}
