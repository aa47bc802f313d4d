//go:build !unix

package spool

import (
	"os"
	"path/filepath"
)

// lockDir opens dir/LOCK without locking it: there is no flock here, so on
// this platform nothing stops two processes from sharing a spool directory.
func lockDir(dir string) (*os.File, error) {
	return os.OpenFile(filepath.Join(dir, lockName), os.O_RDWR|os.O_CREATE, 0o600)
}

// syncDir is a no-op: directories cannot be fsynced on this platform.
func syncDir(string) error { return nil }
