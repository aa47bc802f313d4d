package secretfile

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRead: like ssh with a private key, a secret file group or others may
// read or write is refused, with the fix in the error; group read only for
// the process's own group.
func TestRead(t *testing.T) {
	for _, tc := range []struct {
		mode os.FileMode
		ok   bool
	}{
		{0o600, true},
		{0o400, true},
		{0o700, true},
		{0o640, true}, // the process's own group (a pod's fsGroup)
		{0o440, true},
		{0o644, false},
		{0o604, false},
		{0o620, false},
		{0o602, false},
		{0o660, false},
		{0o666, false},
	} {
		path := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(path, []byte("s3cret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, tc.mode); err != nil { // not subject to the umask
			t.Fatal(err)
		}
		b, err := Read("token file", path)
		switch {
		case tc.ok && (err != nil || string(b) != "s3cret\n"):
			t.Errorf("mode %#o: %q %v", tc.mode, b, err)
		case !tc.ok && err == nil:
			t.Errorf("mode %#o: accepted", tc.mode)
		case !tc.ok && (!strings.Contains(err.Error(), "chmod 600 "+path) || !strings.HasPrefix(err.Error(), "token file ")):
			t.Errorf("mode %#o: the error does not name the file and the fix: %v", tc.mode, err)
		}
	}
	// Group read for a group the process is not in is refused.
	if os.Geteuid() == 0 {
		path := filepath.Join(t.TempDir(), "token")
		os.WriteFile(path, []byte("s3cret\n"), 0o600)
		os.Chmod(path, 0o440)
		const other = 54321 // in no group of this process (checked)
		groups, _ := os.Getgroups()
		if !slices.Contains(append(groups, os.Getegid()), other) {
			if err := os.Chown(path, -1, other); err != nil {
				t.Fatal(err)
			}
			if _, err := Read("token file", path); err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) {
				t.Errorf("mode 0440, group %d: %v, want refused", other, err)
			}
		}
	}
	// Through a symlink (a Kubernetes Secret volume), the file's own mode counts.
	dir := t.TempDir()
	target := filepath.Join(dir, "..data-token")
	os.WriteFile(target, []byte("s3cret\n"), 0o600)
	os.Chmod(target, 0o644)
	link := filepath.Join(dir, "token")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := Read("token file", link); err == nil {
		t.Error("a 0644 file behind a symlink accepted")
	}
	if _, err := Read("token file", filepath.Join(dir, "missing")); err == nil || !strings.HasPrefix(err.Error(), "token file: ") {
		t.Errorf("missing file: %v", err)
	}
}

// TestCreate: a new file is 0600 in a 0700 directory made for it, and an
// existing one is never replaced.
func TestCreate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sub", "token")
	if err := Create("token file", path, []byte("one\n")); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("created %v %v, want mode 0600", fi, err)
	}
	if di, _ := os.Stat(filepath.Dir(path)); di.Mode().Perm() != 0o700 {
		t.Errorf("directory mode %#o, want 0700", di.Mode().Perm())
	}
	if err := Create("token file", path, []byte("two\n")); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("second create: %v, want fs.ErrExist", err)
	}
	if b, err := Read("token file", path); err != nil || string(b) != "one\n" {
		t.Fatalf("after a second create: %q %v, want the first content", b, err)
	}
}
