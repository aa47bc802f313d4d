package main

import (
	"bytes"
	"log/slog"
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
