package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
)

func TestWrite(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := Write(path, 0o600, func(w io.Writer) error { _, err := io.WriteString(w, "one"); return err }); err != nil {
		t.Fatal(err)
	}
	fail := errors.New("half written")
	if err := Write(path, 0o600, func(w io.Writer) error { io.WriteString(w, "tw"); return fail }); !errors.Is(err, fail) {
		t.Fatalf("err %v, want the writer's", err)
	}
	b, err := os.ReadFile(path)
	fi, _ := os.Stat(path)
	if err != nil || string(b) != "one" || fi.Mode().Perm() != 0o600 {
		t.Fatalf("after a failed write: %q %v %v, want the old content, 0600", b, err, fi.Mode())
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 {
		t.Fatalf("%d files left, want only f", len(left))
	}
}
