package main

import (
	"bytes"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// envRunMain makes the test binary run main with its arguments, so that
// a test runs the command as a user does (runDualflow).
const envRunMain = "DUALFLOW_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(envRunMain) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runDualflow runs `dualflow args...` and returns its stdout, stderr and
// exit status.
func runDualflow(t *testing.T, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), envRunMain+"=1")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		status = exit.ExitCode()
	case err != nil:
		t.Fatalf("run dualflow %v: %v", args, err)
	}
	return out.String(), errOut.String(), status
}

// TestErrorOutput: a command's error is one plain "dualflow: <message>"
// line on stderr and exit status 1; a service (the collector) logs it as
// the log lines it writes while running; --help exits 0.
func TestErrorOutput(t *testing.T) {
	noDemo := t.TempDir()
	for _, tc := range []struct {
		name   string
		args   []string
		status int
		stderr string // the whole of stderr, or with log: a part of it
		log    bool
	}{
		{"unknown audit subcommand", []string{"audit", "bogus"}, 1,
			"dualflow: audit: unknown subcommand \"bogus\" (want findings, unprotected, eval, denied, unused or whatif)\n", false},
		{"trace without a demo", []string{"trace", "-s", "ns/a", "-d", "ip:[fd00:10::1]:80", "--state-dir", noDemo}, 1,
			"dualflow: trace: no --server, and no demo running on the lab of " + noDemo, false},
		{"collector", []string{"collector", "extra"}, 1, `ERROR dualflow collector failed err="collector: unexpected arguments [extra]"`, true},
		{"help", []string{"trace", "--help"}, 0, "Exit status: 0 when every requested family arrived", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, stderr, status := runDualflow(t, tc.args...)
			if status != tc.status {
				t.Errorf("exit status %d, want %d; stderr:\n%s", status, tc.status, stderr)
			}
			switch {
			case tc.log:
				if !strings.Contains(stderr, tc.stderr) {
					t.Errorf("stderr lacks %q:\n%s", tc.stderr, stderr)
				}
			case strings.Count(stderr, "\n") != 1 || !strings.HasPrefix(stderr, tc.stderr):
				t.Errorf("stderr = %q, want one line starting %q", stderr, tc.stderr)
			}
		})
	}
}

// TestExitReported: an error the command reported itself (dualflow
// trace's last line) exits 1 and prints nothing more.
func TestExitReported(t *testing.T) {
	var buf bytes.Buffer
	if got := exit(&buf, command{name: "trace"}, reportedError{errFamilyMissing}); got != 1 || buf.Len() != 0 {
		t.Errorf("exit = %d, printed %q", got, buf.String())
	}
}

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
