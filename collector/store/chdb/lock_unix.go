//go:build unix

package chdb

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// lockedBy reports whether another process holds the engine's lock on
// dir/status (ClickHouse takes an exclusive flock on it), and the holder's
// description from the file ("PID: 123 ..."). Only call it when this process
// has no engine on dir: flock locks taken through another descriptor of
// this process would look foreign too.
func lockedBy(dir string) (bool, string) {
	f, err := os.Open(filepath.Join(dir, "status"))
	if err != nil {
		return false, ""
	}
	defer f.Close()
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == nil {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return false, ""
	}
	if !errors.Is(err, syscall.EWOULDBLOCK) {
		return false, ""
	}
	buf := make([]byte, 256)
	n, _ := f.Read(buf)
	return true, strings.Join(strings.Fields(string(buf[:n])), " ")
}
