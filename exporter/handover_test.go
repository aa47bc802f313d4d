package exporter

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/flow"
)

func TestHandoverFile(t *testing.T) {
	now := time.Now()
	marks := []connstore.Mark{
		{Key: connstore.Key{Tuple: flow.Tuple{Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.18.2.11"), Proto: 6, SrcPort: 40000, DstPort: 8080}},
			ID: 7, Start: now.UnixNano(), HasCounters: true, Packets: 5, Bytes: 500},
		{Key: connstore.Key{Tuple: flow.Tuple{Src: netip.MustParseAddr("fd00:10:0:1::10"), Dst: netip.MustParseAddr("fd00:10:0:2::11"), Proto: 17, SrcPort: 5353, DstPort: 53}, Zone: 3},
			ID: 8, ReverseBytes: 90},
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "handover")
	if err := writeHandover(path, "node-1", "", marks, now); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the file: %v %v, want mode 0600", fi, err)
	}
	got, err := readHandover(path, "node-1", "", now.Add(time.Minute))
	if err != nil || len(got) != 2 || got[0] != marks[0] || got[1] != marks[1] {
		t.Fatalf("read back %+v, %v", got, err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the file is still there after it was taken over: %v", err)
	}
	if got, err := readHandover(path, "node-1", "", now); got != nil || err != nil {
		t.Errorf("no file: %v %v, want no handover", got, err)
	}

	for _, tc := range []struct {
		name, node string
		at         time.Time
		content    string // instead of a written handover
		want       string
	}{
		{"another node's", "node-2", now, "", "written for node"},
		{"too old", "node-1", now.Add(time.Hour), "", "older than"},
		{"corrupted", "node-1", now, "not gob at all", "unreadable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.content != "" {
				os.WriteFile(path, []byte(tc.content), 0o600)
			} else if err := writeHandover(path, "node-1", "", marks, now); err != nil {
				t.Fatal(err)
			}
			got, err := readHandover(path, tc.node, "", tc.at)
			if got != nil || err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, %v; want an error saying %q", got, err, tc.want)
			}
			if _, err := os.Stat(path); !os.IsNotExist(err) {
				t.Errorf("an ignored file stays: %v", err)
			}
		})
	}
	// No directory to write to: an error, not a crash.
	if err := writeHandover(filepath.Join(dir, "missing", "handover"), "node-1", "", marks, now); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
}
