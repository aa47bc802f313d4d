package spool

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the fuzz seed corpus in testdata/")

// seedSegments are the seed inputs of FuzzDecodeSegment, valid and broken.
func seedSegments() map[string][]byte {
	full := appendSegment(nil, &Batch{
		Table:   "flows",
		Columns: []string{"flow_start", "src_ip", "dst_ip"},
		Token:   "0123456789abcdef0123456789abcdef",
		Rows:    2,
		Data:    []byte("\x01\x02\x03\x04\x05\x06\x07\x08"),
	})
	flipped := bytes.Clone(full)
	flipped[len(flipped)-1] ^= 0xff
	return map[string][]byte{
		"empty-batch":    appendSegment(nil, &Batch{}),
		"valid":          full,
		"truncated":      full[:len(full)-3],
		"header-only":    full[:headerSize],
		"bad-payload":    flipped,
		"trailing-bytes": append(bytes.Clone(full), 0),
	}
}

// TestSeedCorpus checks that testdata/fuzz holds the current seeds (run with
// -update to rewrite them after a format change).
func TestSeedCorpus(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeSegment")
	for name, data := range seedSegments() {
		path := filepath.Join(dir, name)
		want := fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", data)
		if *update {
			if err := os.MkdirAll(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s is stale or missing (%v): run go test -run TestSeedCorpus -update", path, err)
		}
	}
}

// FuzzDecodeSegment feeds arbitrary bytes to the segment parser. It must
// never panic, and whatever it accepts must encode back to the same bytes.
// The seed corpus is in testdata/fuzz/FuzzDecodeSegment.
func FuzzDecodeSegment(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := decodeSegment(data)
		if err != nil {
			return
		}
		if again := appendSegment(nil, &b); !bytes.Equal(again, data) {
			t.Fatalf("round trip mismatch:\n in  %x\n out %x", data, again)
		}
	})
}
