// Package atomicfile replaces files whole: a reader (or the next run,
// after a crash) finds the old content or the new, never part of it.
package atomicfile

import (
	"io"
	"os"
	"path/filepath"
)

// Write replaces path with what write writes, with mode: into a
// temporary file of path's directory, synced, then renamed over path. On
// an error path is unchanged and the temporary file removed.
func Write(path string, mode os.FileMode, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after the rename, nothing is there
	err = tmp.Chmod(mode)
	if err == nil {
		err = write(tmp)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
