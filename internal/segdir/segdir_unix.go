//go:build unix

package segdir

import (
	"errors"
	"os"
	"syscall"
)

// TryLock takes an exclusive flock on f without waiting; held reports
// that another open file holds it.
func TryLock(f *os.File) (held bool, err error) {
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	return false, err
}

// SyncDir fsyncs a directory, so a rename or an unlink in it is durable.
func SyncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
