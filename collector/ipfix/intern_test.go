package ipfix

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

// TestIntern: an interned string equals its bytes, is a copy of them (the
// decoder's message buffers are reused), is the same string the next time,
// and strings longer than internMaxLen are returned but not cached.
func TestIntern(t *testing.T) {
	var in interner
	if s := in.bytes(nil); s != "" {
		t.Errorf("empty: %q", s)
	}
	buf := []byte("worker-01")
	s := in.bytes(buf)
	if s != "worker-01" {
		t.Fatalf("got %q", s)
	}
	if unsafe.StringData(s) == &buf[0] {
		t.Fatal("the string aliases the buffer")
	}
	copy(buf, "XXXXXXXXX") // the buffer is reused for the next message
	if s != "worker-01" {
		t.Fatalf("the string changed with the buffer: %q", s)
	}
	if again := in.bytes([]byte("worker-01")); unsafe.StringData(again) != unsafe.StringData(s) {
		t.Error("the same bytes gave a new string")
	}
	if x := in.bytes(buf); x != "XXXXXXXXX" {
		t.Errorf("got %q after the buffer changed", x)
	}

	long := []byte(strings.Repeat("a", internMaxLen+1))
	n := in.len()
	if s := in.bytes(long); s != string(long) {
		t.Errorf("long string: %q", s)
	}
	if in.len() != n {
		t.Error("a string longer than internMaxLen was cached")
	}
	if allocs := testing.AllocsPerRun(10, func() { in.bytes(long) }); allocs != 1 {
		t.Errorf("long string: %.0f allocations, want 1 (not cached)", allocs)
	}
	edge := []byte(strings.Repeat("b", internMaxLen))
	in.bytes(edge)
	if allocs := testing.AllocsPerRun(10, func() { in.bytes(edge) }); allocs != 0 {
		t.Errorf("a string of internMaxLen bytes: %.0f allocations, want 0 (cached)", allocs)
	}
}

// TestInternField: a field's repeated value is its last string, not a copy
// of the (reused) buffer; a changed value, an empty one and a long one read
// as their bytes, and a long one is not kept as the field's last value.
func TestInternField(t *testing.T) {
	var in interner
	buf := []byte("worker-01")
	s := in.field(fipfix.FieldExporterNode, buf)
	if s != "worker-01" || unsafe.StringData(s) == &buf[0] {
		t.Fatalf("got %q (aliasing the buffer: %v)", s, unsafe.StringData(s) == &buf[0])
	}
	if again := in.field(fipfix.FieldExporterNode, []byte("worker-01")); unsafe.StringData(again) != unsafe.StringData(s) {
		t.Error("the same value gave a new string")
	}
	if allocs := testing.AllocsPerRun(10, func() { in.field(fipfix.FieldExporterNode, buf) }); allocs != 0 {
		t.Errorf("repeated value: %.0f allocations, want 0", allocs)
	}
	copy(buf, "worker-02")
	if got := in.field(fipfix.FieldExporterNode, buf); got != "worker-02" || s != "worker-01" {
		t.Errorf("changed value: got %q, earlier string now %q", got, s)
	}
	if got := in.field(fipfix.FieldExporterNode, nil); got != "" {
		t.Errorf("empty value: %q", got)
	}
	if got := in.field(fipfix.FieldSource, []byte("worker-02")); got != "worker-02" {
		t.Errorf("another field: %q", got)
	}
	long := []byte(strings.Repeat("a", internMaxLen+1))
	if got := in.field(fipfix.FieldTCPState, long); got != string(long) || in.last[fipfix.FieldTCPState] == got {
		t.Error("a string longer than internMaxLen was kept or misread")
	}
}

// TestInternManyNames: the names of clusters up to 10,000 pods are all
// cached after one sighting (no allocation afterwards), each lookup returns
// the string of its bytes, and a stream of more names than the cap keeps the
// table within it and still returns the right strings.
func TestInternManyNames(t *testing.T) {
	for _, pods := range []int{526, 2000, 5000, 10_000} {
		names := manyNames(pods)
		bufs := make([][]byte, len(names))
		for i, n := range names {
			bufs[i] = []byte(n)
		}
		var in interner
		for _, b := range bufs {
			in.bytes(b)
		}
		if in.len() != len(names) {
			t.Errorf("%d names: %d cached", len(names), in.len())
		}
		allocs := testing.AllocsPerRun(5, func() {
			for i, b := range bufs {
				if s := in.bytes(b); s != names[i] {
					panic(fmt.Sprintf("%q for %q", s, names[i]))
				}
			}
		})
		if allocs != 0 {
			t.Errorf("%d names: %.0f allocations per pass after the first, want 0", len(names), allocs)
		}
		t.Logf("%d names: %d sets (%d KiB)", len(names), len(in.sets), len(in.sets)*int(unsafe.Sizeof(internSet{}))/1024)
	}

	var in interner
	for i := range 3 * internMaxSets * internWays {
		name := fmt.Sprintf("pod-%d", i)
		if s := in.bytes([]byte(name)); s != name {
			t.Fatalf("%q for %q", s, name)
		}
		if s := in.bytes([]byte(name)); s != name {
			t.Fatalf("again: %q for %q", s, name)
		}
	}
	if len(in.sets) != internMaxSets || in.len() > internMaxSets*internWays {
		t.Errorf("past the cap: %d sets, %d strings", len(in.sets), in.len())
	}
	if int(unsafe.Sizeof(internSet{})) != internSetBytes {
		t.Errorf("internSet is %d bytes, internSetBytes says %d", unsafe.Sizeof(internSet{}), internSetBytes)
	}
}
