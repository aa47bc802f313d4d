// Package secretfile reads files that hold secrets (bearer tokens,
// passwords) and creates new ones. It refuses them, like ssh with a
// private key, when others may read or write them or their group may
// write them. Group read is accepted only
// for a group the process belongs to: Kubernetes mounts a Secret
// root-owned and readable by the pod's fsGroup (defaultMode 0440), so that
// a non-root process can read it and nobody else.
package secretfile

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// maxSize bounds what Read reads: a token file is a few lines.
const maxSize = 1 << 20

// Read opens path, checks its mode (Check, on the file opened, so a file
// swapped between the check and the read is not read) and returns its
// content. what names the file in errors ("traceflow token file").
func Read(what, path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := Check(what, path, fi); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if len(b) > maxSize {
		return nil, fmt.Errorf("%s %s: larger than %d bytes", what, path, maxSize)
	}
	return b, nil
}

// Check refuses a secret file (fi, of path) that others may access or its
// group may write, and group read by a group the process is not in. The
// error names the file as what and says the fix (chmod 600 path).
func Check(what, path string, fi os.FileInfo) error {
	perm := fi.Mode().Perm()
	if perm&0o027 != 0 {
		return fmt.Errorf("%s %s has mode %#o: it holds secrets, so others must have no access and the group no write (chmod 600 %s)", what, path, perm, path)
	}
	if perm&0o040 == 0 {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("%s %s has mode %#o: group read is accepted only for the process's own group (chmod 600 %s)", what, path, perm, path)
	}
	groups, _ := os.Getgroups()
	groups = append(groups, os.Getegid())
	for _, g := range groups {
		if uint32(g) == st.Gid {
			return nil
		}
	}
	return fmt.Errorf("%s %s has mode %#o and group %d, which this process is not in: group and others must have no access (chmod 600 %s)", what, path, perm, st.Gid, path)
}

// Create writes data to a new secret file at path, mode 0600, creating
// its directory (mode 0700) when missing. It never replaces a file: when
// path exists (another process created it first) the error wraps
// fs.ErrExist, and the caller reads that one. On any other error nothing
// is left at path.
func Create(what, path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	_, err = f.Write(data)
	if err2 := f.Close(); err == nil {
		err = err2
	}
	if err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	return nil
}
