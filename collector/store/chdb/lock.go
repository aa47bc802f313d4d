package chdb

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/dualflow/dualflow/internal/segdir"
)

// lockedBy reports whether another process holds the engine's lock on
// dir/status (ClickHouse takes an exclusive flock on it), and the holder's
// description from the file ("PID: 123 ..."). Only call it when this process
// has no engine on dir: flock locks taken through another descriptor of
// this process would look foreign too. Without flock (not Unix, where
// chDB does not run) it reports false.
func lockedBy(dir string) (bool, string) {
	f, err := os.Open(filepath.Join(dir, "status"))
	if err != nil {
		return false, ""
	}
	defer f.Close() // releases the lock if it was free and is now ours
	if held, _ := segdir.TryLock(f); !held {
		return false, ""
	}
	buf := make([]byte, 256)
	n, _ := f.Read(buf)
	return true, strings.Join(strings.Fields(string(buf[:n])), " ")
}
