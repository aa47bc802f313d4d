package main

import (
	"bytes"
	"log/slog"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// TestRouteKlog: a line client-go logs through klog comes out of the
// process's slog handler, with its key-value pairs.
func TestRouteKlog(t *testing.T) {
	var buf bytes.Buffer
	routeKlog(slog.New(slog.NewTextHandler(&buf, nil)))
	defer klog.ClearLogger()
	klog.InfoS("watch of *v1.Pod ended", "reason", "test")
	klog.ErrorS(nil, "failed to list", "resource", "endpointslices")
	klog.Flush()
	out := buf.String()
	for _, want := range []string{`msg="watch of *v1.Pod ended"`, "reason=test", `msg="failed to list"`, "resource=endpointslices", "level=ERROR"} {
		if !strings.Contains(out, want) {
			t.Errorf("slog output lacks %q:\n%s", want, out)
		}
	}
}

// TestProductDoesNotImportLab: the demo is the product plus a lab. No
// product package imports the lab; the binary reaches the lab's commands
// through lab/labcmd only.
func TestProductDoesNotImportLab(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "github.com/dualflow/dualflow/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/dualflow/dualflow/"
	isLab := func(p string) bool { return p == mod+"lab" || strings.HasPrefix(p, mod+"lab/") }
	checked := 0
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || isLab(f[0]) || strings.HasPrefix(f[0], mod+"test/") {
			continue
		}
		checked++
		for _, imp := range f[1:] {
			if isLab(imp) && !(f[0] == mod+"cmd/dualflow" && imp == mod+"lab/labcmd") {
				t.Errorf("%s imports %s", f[0], imp)
			}
		}
	}
	if checked < 20 {
		t.Errorf("only %d product packages listed", checked)
	}
}
