package ovs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fakeOfctl writes a script that prints its arguments, then a reply on
// stdout and a message on stderr, then runs tail (e.g. "exit 1").
func fakeOfctl(t *testing.T, tail string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ofctl")
	script := "#!/bin/sh\necho \"args $*\"\necho 'NXST_FLOW_MONITOR reply'\necho 'NXT_PACKET_IN2 (xid=0x0): x' >&2\n" + tail + "\n"
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestMonitor(t *testing.T) {
	t.Run("exit", func(t *testing.T) {
		var lines []string
		err := Monitor(context.Background(), fakeOfctl(t, "echo 'ovs-ofctl: br0 is not a bridge' >&2; exit 1"), "", "br0",
			func(l string) { lines = append(lines, l) }, "watch:")
		want := []string{"args --no-names monitor br0 65534 watch:", "NXST_FLOW_MONITOR reply", "NXT_PACKET_IN2 (xid=0x0): x", "ovs-ofctl: br0 is not a bridge"}
		if !slices.Equal(lines, want) {
			t.Errorf("lines %q, want %q", lines, want)
		}
		if err == nil || !strings.Contains(err.Error(), "br0 is not a bridge") {
			t.Errorf("err %v, want the last line", err)
		}
	})
	t.Run("ctx", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		n := 0
		err := Monitor(ctx, fakeOfctl(t, "exec sleep 30"), "", "br0", func(string) {
			if n++; n == 3 {
				cancel()
			}
		})
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err %v, want context.Canceled", err)
		}
	})
	t.Run("missing binary", func(t *testing.T) {
		start := time.Now()
		if err := Monitor(context.Background(), filepath.Join(t.TempDir(), "none"), "", "br0", func(string) {}); err == nil || time.Since(start) > 5*time.Second {
			t.Errorf("err %v after %v", err, time.Since(start))
		}
	})
}
