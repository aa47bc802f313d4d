package segdir

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

func TestNameSeq(t *testing.T) {
	for _, tc := range []struct {
		name string
		seq  uint64
		ok   bool
	}{
		{Name(7, ".wal"), 7, true},
		{Name(1<<64-1, ".seg"), 1<<64 - 1, true},
		{Name(42, ".seg") + ".3", 42, true}, // moved aside beside an earlier 42
		{"7.wal", 0, false},
		{"LOCK", 0, false},
		{"0000000000000000000x.seg", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			seq, ok := Seq(tc.name)
			if seq != tc.seq || ok != tc.ok {
				t.Fatalf("Seq(%q) = %d, %v; want %d, %v", tc.name, seq, ok, tc.seq, tc.ok)
			}
		})
	}
	for _, tc := range []struct {
		name string
		ok   bool
	}{{Name(7, ".wal"), true}, {Name(7, ".seg"), false}, {Name(42, ".seg") + ".3", false}, {"LOCK", false}} {
		if seq, ok := Parse(tc.name, ".wal"); ok != tc.ok || ok && seq != 7 {
			t.Errorf("Parse(%q, .wal) = %d, %v; want ok %v", tc.name, seq, ok, tc.ok)
		}
	}
	if a, b := Name(9, ".wal"), Name(10, ".wal"); a >= b {
		t.Fatalf("%s sorts after %s", a, b)
	}
}

func TestLock(t *testing.T) {
	if runtime.GOOS == "windows" || runtime.GOOS == "plan9" {
		t.Skip("no flock")
	}
	dir := t.TempDir()
	f, held, err := Lock(dir)
	if err != nil || held {
		t.Fatalf("Lock = %v, %v", held, err)
	}
	// flock is per open file: a second open in this process conflicts too.
	if g, held, err := Lock(dir); g != nil || !held || err != nil {
		t.Fatalf("second Lock = %v, %v, %v; want held", g, held, err)
	}
	f.Close()
	g, held, err := Lock(dir)
	if err != nil || held {
		t.Fatalf("Lock after Close = %v, %v", held, err)
	}
	g.Close()
	if _, _, err := Lock(filepath.Join(dir, "missing")); !os.IsNotExist(err) {
		t.Fatalf("Lock of a missing directory = %v", err)
	}
	if err := SyncDir(dir); err != nil {
		t.Fatal(err)
	}
}
