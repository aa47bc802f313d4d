package spool

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
)

// appendSegment appends b encoded as a whole segment file to dst, as Put
// writes it.
func appendSegment(dst []byte, b *Batch) []byte {
	return append(appendHeader(dst, b), b.Data...)
}

func testBatch(i int) Batch {
	return Batch{
		Table:   "flows",
		Columns: []string{"flow_start", "src_ip", "dst_ip"},
		Token:   fmt.Sprintf("%032x", i),
		Rows:    i + 1,
		Data:    bytes.Repeat([]byte{byte(i)}, 100+i),
	}
}

func mustOpen(t *testing.T, dir string, max int64) *Spool {
	t.Helper()
	s, err := Open(dir, max)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// drain pops every batch and returns them in order.
func drain(t *testing.T, s *Spool) []Batch {
	t.Helper()
	var out []Batch
	for {
		b, ok, err := s.Peek()
		if err != nil {
			t.Fatalf("Peek: %v", err)
		}
		if !ok {
			return out
		}
		out = append(out, b)
		if err := s.Pop(); err != nil {
			t.Fatalf("Pop: %v", err)
		}
	}
}

func TestOpenEmptyDir(t *testing.T) {
	for _, tc := range []struct {
		name string
		dir  func(t *testing.T) string
	}{
		{"existing", func(t *testing.T) string { return t.TempDir() }},
		{"missing", func(t *testing.T) string { return filepath.Join(t.TempDir(), "a", "b") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustOpen(t, tc.dir(t), 1<<20)
			if s.Len() != 0 || s.Bytes() != 0 || s.Rows() != 0 || s.Corrupt() != 0 {
				t.Fatalf("new spool: len %d bytes %d rows %d corrupt %d", s.Len(), s.Bytes(), s.Rows(), s.Corrupt())
			}
			if _, ok, err := s.Peek(); ok || err != nil {
				t.Fatalf("Peek on empty = %v, %v", ok, err)
			}
			if err := s.Pop(); !errors.Is(err, ErrEmpty) {
				t.Fatalf("Pop on empty = %v, want ErrEmpty", err)
			}
			if tc.name == "missing" { // the spool holds flows: its owner's only
				if fi, err := os.Stat(s.Dir()); err != nil || fi.Mode().Perm() != 0o700 {
					t.Errorf("spool dir mode %v (%v), want 0700", fi.Mode().Perm(), err)
				}
			}
		})
	}
}

func TestOpenBadMax(t *testing.T) {
	if _, err := Open(t.TempDir(), 0); err == nil {
		t.Fatal("Open with max 0 succeeded")
	}
}

func TestOrderAcrossReopen(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var want []Batch
	for i := range 5 {
		b := testBatch(i)
		want = append(want, b)
		if err := s.Push(b); err != nil {
			t.Fatalf("Push %d: %v", i, err)
		}
	}
	// Pop the first one, then "restart".
	if err := s.Pop(); err != nil {
		t.Fatal(err)
	}
	want = want[1:]
	bytesBefore, rowsBefore := s.Bytes(), s.Rows()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = mustOpen(t, dir, 1<<20)
	// The tokens of the recovered batches are known (a restarting collector
	// asks, for its journal's unacknowledged batches); the popped one's not.
	for i, want := range []bool{false, true, true, true, true, false} {
		if got := s.Has(testBatch(i).Token); got != want {
			t.Errorf("reopened: Has(batch %d) = %v, want %v", i, got, want)
		}
	}
	if s.Has("") {
		t.Error("Has(\"\") = true")
	}
	if s.Len() != 4 || s.Bytes() != bytesBefore || s.Rows() != rowsBefore {
		t.Fatalf("reopened: len %d bytes %d rows %d, want 4 %d %d", s.Len(), s.Bytes(), s.Rows(), bytesBefore, rowsBefore)
	}
	// New batches go after the recovered ones.
	b := testBatch(9)
	want = append(want, b)
	if err := s.Push(b); err != nil {
		t.Fatal(err)
	}
	if !s.Has(b.Token) {
		t.Error("Has(pushed batch) = false")
	}
	got := drain(t, s)
	if s.Has(b.Token) {
		t.Error("Has(popped batch) = true")
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("batches after reopen:\n got %v\nwant %v", tokens(got), tokens(want))
	}
	if s.Bytes() != 0 || s.Rows() != 0 {
		t.Fatalf("drained spool: bytes %d rows %d", s.Bytes(), s.Rows())
	}
}

func tokens(bs []Batch) []string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Token)
	}
	return out
}

func TestBound(t *testing.T) {
	b := testBatch(0)
	size := int64(len(appendSegment(nil, &b)))
	s := mustOpen(t, t.TempDir(), 2*size+size/2)
	for i := range 2 {
		if err := s.Push(b); err != nil {
			t.Fatalf("Push %d: %v", i, err)
		}
	}
	if err := s.Push(b); !errors.Is(err, ErrFull) {
		t.Fatalf("Push over the bound = %v, want ErrFull", err)
	}
	if s.Len() != 2 || s.Bytes() != 2*size {
		t.Fatalf("after full: len %d bytes %d, want 2 %d", s.Len(), s.Bytes(), 2*size)
	}
	if err := s.Pop(); err != nil {
		t.Fatal(err)
	}
	if err := s.Push(b); err != nil {
		t.Fatalf("Push after Pop: %v", err)
	}
}

func TestCorruptFiles(t *testing.T) {
	good := testBatch(1)
	seg := appendSegment(nil, &good)
	for _, tc := range []struct {
		name   string
		data   []byte
		atOpen bool // detected from the header at Open, else by Peek
	}{
		{"empty", nil, true},
		{"truncated header", seg[:10], true},
		{"truncated payload", seg[:len(seg)-1], true},
		{"trailing garbage", append(bytes.Clone(seg), 0), true},
		{"bad magic", append([]byte("XXXX"), seg[4:]...), true},
		{"bad version", func() []byte { b := bytes.Clone(seg); b[4] = 9; return b }(), true},
		{"flipped metadata", func() []byte { b := bytes.Clone(seg); b[headerSize+2] ^= 1; return b }(), true},
		{"flipped payload", func() []byte { b := bytes.Clone(seg); b[len(b)-1] ^= 1; return b }(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			s := mustOpen(t, dir, 1<<20)
			for i := range 3 {
				if err := s.Push(testBatch(i)); err != nil {
					t.Fatal(err)
				}
			}
			s.Close()
			// Replace the middle segment.
			if err := os.WriteFile(filepath.Join(dir, segName(2)), tc.data, 0o600); err != nil {
				t.Fatal(err)
			}
			// Leftover temp files of interrupted writes: atomicfile's, and
			// an older spool's <name>.tmp.
			temps := []string{"." + segName(4) + tmpSuffix + "-123", segName(5) + tmpSuffix}
			for _, tmp := range temps {
				if err := os.WriteFile(filepath.Join(dir, tmp), seg[:7], 0o600); err != nil {
					t.Fatal(err)
				}
			}

			s = mustOpen(t, dir, 1<<20)
			if tc.atOpen && (s.Corrupt() != 1 || s.Len() != 2) {
				t.Fatalf("after Open: corrupt %d len %d, want 1 2", s.Corrupt(), s.Len())
			}
			got := drain(t, s)
			if want := []Batch{testBatch(0), testBatch(2)}; !reflect.DeepEqual(got, want) {
				t.Fatalf("drained %v, want %v", tokens(got), tokens(want))
			}
			if s.Corrupt() != 1 {
				t.Fatalf("corrupt = %d, want 1", s.Corrupt())
			}
			moved, err := os.ReadFile(filepath.Join(dir, CorruptDir, segName(2)))
			if err != nil || !bytes.Equal(moved, tc.data) {
				t.Fatalf("corrupt file not moved aside intact: %v", err)
			}
			for _, tmp := range temps {
				if _, err := os.Stat(filepath.Join(dir, tmp)); !os.IsNotExist(err) {
					t.Fatalf("temp file %s not removed: %v", tmp, err)
				}
			}
			// Sequence numbers are not reused after the corrupt file.
			if err := s.Push(testBatch(7)); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(dir, segName(4))); err != nil {
				t.Fatalf("next segment: %v", err)
			}
		})
	}
}

func TestReject(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, 1<<20)
	for i := range 2 {
		if err := s.Push(testBatch(i)); err != nil {
			t.Fatal(err)
		}
	}
	path, err := s.Reject()
	if err != nil {
		t.Fatal(err)
	}
	if path != filepath.Join(dir, RejectedDir, segName(1)) {
		t.Fatalf("rejected to %s", path)
	}
	if got := drain(t, s); !reflect.DeepEqual(got, []Batch{testBatch(1)}) {
		t.Fatalf("after reject: %v", tokens(got))
	}
	if _, err := s.Reject(); !errors.Is(err, ErrEmpty) {
		t.Fatalf("Reject on empty = %v", err)
	}
	s.Close()

	// Moving the rejected file back replays it, before newer batches.
	if err := os.Rename(path, filepath.Join(dir, segName(1))); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, dir, 1<<20)
	if err := s.Push(testBatch(5)); err != nil {
		t.Fatal(err)
	}
	if got, want := drain(t, s), []Batch{testBatch(0), testBatch(5)}; !reflect.DeepEqual(got, want) {
		t.Fatalf("replayed %v, want %v", tokens(got), tokens(want))
	}
}

func TestLocked(t *testing.T) {
	dir := t.TempDir()
	s := mustOpen(t, dir, 1<<20)
	if _, err := Open(dir, 1<<20); !errors.Is(err, ErrLocked) {
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	s.Close()
	if err := s.Push(testBatch(0)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Push after Close = %v", err)
	}
	s2 := mustOpen(t, dir, 1<<20)
	s2.Close()
}

func TestConcurrent(t *testing.T) {
	s := mustOpen(t, t.TempDir(), 1<<30)
	const producers, each = 4, 25
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			for i := range each {
				b := testBatch(p*each + i)
				if err := s.Push(b); err != nil {
					t.Error(err)
				}
				_ = s.Len() + int(s.Bytes())
			}
		})
	}
	seen := map[string]bool{}
	last := map[int]int{} // producer → last index seen, for per-producer FIFO
	for len(seen) < producers*each {
		b, ok, err := s.Peek()
		if err != nil {
			t.Fatal(err)
		}
		if !ok {
			continue
		}
		if seen[b.Token] {
			t.Fatalf("batch %s seen twice", b.Token)
		}
		seen[b.Token] = true
		idx := b.Rows - 1
		p := idx / each
		if prev, ok := last[p]; ok && prev >= idx {
			t.Fatalf("producer %d: batch %d after %d", p, idx, prev)
		}
		last[p] = idx
		if err := s.Pop(); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	if s.Len() != 0 || s.Bytes() != 0 {
		t.Fatalf("after drain: len %d bytes %d", s.Len(), s.Bytes())
	}
}
