//go:build !unix

package segdir

import "os"

// TryLock cannot lock here (no flock): nothing stops two processes from
// sharing a directory on this platform.
func TryLock(*os.File) (held bool, err error) { return false, nil }

// SyncDir does nothing: directories cannot be fsynced on this platform.
func SyncDir(string) error { return nil }
