package e2e

import (
	"bytes"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/test/kubeapi"
)

// TestDemoTwice: a second `dualflow demo` (what `make run` runs) while one
// is live refuses at once with a message naming the running one (pid and
// web URL), and leaves it intact: its lab, its web and its process. A
// demo on another lab but the running one's data directory refuses too,
// before it builds a lab.
func TestDemoTwice(t *testing.T) {
	requirePrereqs(t)
	t.Parallel() // its own lab prefixes, directories and free ports
	record(t, manifest.ModeDual)
	bin := buildBinary(t)
	prefix, stateDir := labPrefix(), filepath.Join(t.TempDir(), "lab")
	dataDir := filepath.Join(t.TempDir(), "data")
	// Every listener on a free port, so that nothing else on the machine
	// (a `make run`) is in the way.
	demo := func(prefix, stateDir string) *exec.Cmd {
		return exec.Command(bin, "demo", "--nodes", "1", "--prefix", prefix, "--state-dir", stateDir, "--data-dir", dataDir,
			"--web.addr", "127.0.0.1:0", "--clickhouse.http-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0",
			"--collector.ipfix.tcp-addr", "127.0.0.1:0")
	}
	first := demo(prefix, stateDir)
	var out bytes.Buffer
	first.Stdout, first.Stderr = &out, &out
	// Tied: killed with the test process, from a thread that outlives it
	// (a plain Pdeathsig killed it when a parallel test's netns code
	// ended the thread that had forked it).
	if err := kubeapi.StartTied(first); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- first.Wait() }()
	t.Cleanup(func() {
		_ = first.Process.Signal(os.Interrupt)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = first.Process.Kill()
			<-exited
		}
		if err := lab.Down(stateDir, prefix); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if t.Failed() {
			t.Logf("first demo output:\n%s", out.String())
		}
	})
	// The first demo is up once it has written its web URL.
	var webURL string
	waitFor(t, "the first demo's web URL", 3*time.Minute, func() bool {
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the first demo exited: %v", err)
		default:
		}
		b, err := os.ReadFile(filepath.Join(stateDir, "web-url"))
		webURL = strings.TrimSpace(string(b))
		return err == nil && webURL != ""
	})
	manifestBefore, err := os.ReadFile(filepath.Join(stateDir, lab.ManifestFile))
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name, prefix, stateDir string
		want                   []string
	}{
		{"same lab", labPrefix(), stateDir, []string{"a demo is already running", "pid " + strconv.Itoa(first.Process.Pid), webURL}},
		{"same data directory", labPrefix(), filepath.Join(t.TempDir(), "lab2"), []string{"a demo is already running", dataDir, "--data-dir"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			b, err := demo(tc.prefix, tc.stateDir).CombinedOutput()
			if err == nil {
				t.Fatalf("second demo succeeded:\n%s", b)
			}
			t.Logf("refused in %v: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(string(b)))
			for _, w := range tc.want {
				if !strings.Contains(string(b), w) {
					t.Errorf("second demo's message does not say %q:\n%s", w, b)
				}
			}
			if strings.Contains(string(b), "DB::Exception") {
				t.Errorf("second demo shows a raw engine exception:\n%s", b)
			}
			if took := time.Since(start); took > 30*time.Second {
				t.Errorf("second demo took %v to refuse", took)
			}
			if tc.stateDir != stateDir {
				if _, err := os.Stat(tc.stateDir); !os.IsNotExist(err) {
					t.Errorf("the refused demo left its state dir: %v", err)
				}
			}
		})
	}

	// The first demo is intact: running, its lab as it was, its web up.
	select {
	case err := <-exited:
		exited <- err
		t.Fatalf("the first demo exited: %v", err)
	default:
	}
	if b, err := os.ReadFile(filepath.Join(stateDir, lab.ManifestFile)); err != nil || !bytes.Equal(b, manifestBefore) {
		t.Errorf("the first demo's lab manifest changed or went: %v", err)
	}
	l, err := lab.Open(stateDir, lab.Config{})
	if err != nil {
		t.Fatalf("the first demo's lab: %v", err)
	}
	web, err := l.PodOn(manifest.NSFrontend, "web", 1)
	if err != nil {
		t.Fatal(err)
	}
	if ns := l.PodNetNSPath(web); ns == "" {
		t.Error("the first demo's web pod has no network namespace")
	} else if _, err := os.Stat(ns); err != nil {
		t.Errorf("the first demo's pod namespace: %v", err)
	}
	resp, err := http.Get(strings.TrimSuffix(webURL, "/") + "/healthz")
	if err != nil {
		t.Fatalf("the first demo's web: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the first demo's web /healthz: %s", resp.Status)
	}
}
