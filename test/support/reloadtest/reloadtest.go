// Package reloadtest lays files out for tests as the kubelet does in a
// mounted Secret volume, and updates them as it does: each file is a
// symlink to ..data/<name>, ..data a symlink to a timestamped directory
// holding the content, and an update writes a new directory and swaps
// ..data to it with one rename (the atomic writer of
// k8s.io/kubernetes/pkg/volume/util).
package reloadtest

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// Volume is a directory laid out like a mounted Secret.
type Volume struct {
	// Dir is the mount point: Dir/<name> are the files.
	Dir string
	// Mode is the files' mode in the next Update (the Secret volume's
	// defaultMode).
	Mode os.FileMode
	t    testing.TB
	n    int    // updates so far (names the timestamped directories)
	cur  string // the directory ..data points to
}

// NewVolume writes files (name → content) with mode (the Secret volume's
// defaultMode) into a new temporary directory.
func NewVolume(t testing.TB, mode os.FileMode, files map[string][]byte) *Volume {
	t.Helper()
	v := &Volume{Dir: t.TempDir(), t: t, Mode: mode}
	v.Update(files)
	return v
}

// Path returns the path of the file name.
func (v *Volume) Path(name string) string { return filepath.Join(v.Dir, name) }

// Update replaces the content with files at once, as the kubelet does
// when the Secret changes: names no longer in files disappear.
func (v *Volume) Update(files map[string][]byte) {
	v.t.Helper()
	v.n++
	ts := fmt.Sprintf("..2026_01_01_00_00_%02d.%09d", v.n%60, v.n)
	dir := filepath.Join(v.Dir, ts)
	if err := os.Mkdir(dir, 0o755); err != nil {
		v.t.Fatal(err)
	}
	for name, b := range files {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			v.t.Fatal(err)
		}
		if err := os.Chmod(p, v.Mode); err != nil { // not subject to the umask
			v.t.Fatal(err)
		}
	}
	tmp := filepath.Join(v.Dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		v.t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(v.Dir, "..data")); err != nil {
		v.t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(v.Dir, name)
		if _, err := os.Lstat(link); err == nil {
			continue
		}
		if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
			v.t.Fatal(err)
		}
	}
	ents, err := os.ReadDir(v.Dir)
	if err != nil {
		v.t.Fatal(err)
	}
	for _, e := range ents {
		if link := filepath.Join(v.Dir, e.Name()); e.Type()&os.ModeSymlink != 0 && e.Name() != "..data" {
			if _, ok := files[e.Name()]; !ok {
				os.Remove(link)
			}
		}
	}
	if v.cur != "" {
		if err := os.RemoveAll(filepath.Join(v.Dir, v.cur)); err != nil {
			v.t.Fatal(err)
		}
	}
	v.cur = ts
}
