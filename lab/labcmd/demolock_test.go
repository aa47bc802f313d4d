//go:build unix

package labcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/lab"
)

// testPrefix returns a lab prefix of this test process alone ("dfu<pid>t<n>-"),
// never the default "df-": a demo running on the machine (`make run`)
// holds the default prefix's lock.
func testPrefix() string {
	return fmt.Sprintf("dfu%dt%d-", os.Getpid(), prefixSeq.Add(1))
}

var prefixSeq atomic.Int32

func testCommands() *Commands {
	return &Commands{NewFlagSet: func(name, _, _ string) *flag.FlagSet {
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		return fs
	}}
}

// TestDemoRefusesWhileOneRuns: a second demo on the lab of a running one
// refuses with the first one's pid and web URL, and leaves its lab's
// state as it is; once the first stops, the lock is free again.
func TestDemoRefusesWhileOneRuns(t *testing.T) {
	stateDir, prefix := filepath.Join(t.TempDir(), "lab"), testPrefix()
	first, err := lockDemo(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	// What the running demo has in its state directory.
	stateFile := filepath.Join(stateDir, "state.json")
	if err := os.WriteFile(stateFile, []byte(`{"prefix":"`+prefix+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	const url = "http://127.0.0.1:18080"
	if err := os.WriteFile(filepath.Join(stateDir, webURLFile), []byte(url+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	err = testCommands().Demo(context.Background(), []string{"--state-dir", stateDir, "--prefix", testPrefix(), "--data-dir", t.TempDir()})
	if !errors.Is(err, ErrDemoRunning) {
		t.Fatalf("second demo: err = %v, want ErrDemoRunning", err)
	}
	for _, want := range []string{"pid " + strconv.Itoa(os.Getpid()), url, stateDir} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("second demo: %q does not say %q", err, want)
		}
	}
	if _, err := os.Stat(stateFile); err != nil {
		t.Errorf("the running demo's lab state was touched: %v", err)
	}
	if _, err := lockDemo(stateDir); !errors.Is(err, ErrDemoRunning) {
		t.Fatalf("lock while held: err = %v, want ErrDemoRunning", err)
	}

	// lab down and lab up would remove the demo's lab: refused too.
	for _, cmd := range [][]string{{"down", "--state-dir", stateDir}, {"up", "--state-dir", stateDir, "--prefix", testPrefix()}} {
		if err := testCommands().Lab(context.Background(), cmd); !errors.Is(err, ErrDemoRunning) {
			t.Errorf("lab %s while a demo runs: err = %v, want ErrDemoRunning", cmd[0], err)
		}
	}
	if _, err := os.Stat(stateFile); err != nil {
		t.Errorf("lab down touched the running demo's lab: %v", err)
	}

	// Another state directory with the demo's prefix is the same lab.
	other := testPrefix()
	pl, err := lockPrefix(other)
	if err != nil {
		t.Fatal(err)
	}
	if err := testCommands().Lab(context.Background(), []string{"down", "--state-dir", filepath.Join(t.TempDir(), "other"), "--prefix", other}); !errors.Is(err, ErrDemoRunning) {
		t.Errorf("lab down of a running demo's prefix from another state dir: err = %v, want ErrDemoRunning", err)
	}
	pl.Unlock()

	first.Unlock()
	again, err := lockDemo(stateDir)
	if err != nil {
		t.Fatalf("lock after the first demo stopped: %v", err)
	}
	again.Unlock()
}

// TestDemoRefusesHeldDataDir: a demo whose data directory another process
// holds (the engine's flock on dir/status) refuses before it builds a
// lab, naming the holder, and leaves no state behind.
func TestDemoRefusesHeldDataDir(t *testing.T) {
	dataDir := t.TempDir()
	f, err := os.OpenFile(filepath.Join(dataDir, "status"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("PID: 4242\nStarted at: now\n"); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(t.TempDir(), "lab")
	err = testCommands().Demo(context.Background(), []string{"--state-dir", stateDir, "--prefix", testPrefix(), "--data-dir", dataDir})
	if !errors.Is(err, ErrDemoRunning) || !errors.Is(err, chdb.ErrLocked) {
		t.Fatalf("demo on a held data dir: err = %v, want ErrDemoRunning and chdb.ErrLocked", err)
	}
	if !strings.Contains(err.Error(), "PID: 4242") {
		t.Errorf("%q does not name the holder", err)
	}
	if _, err := os.Stat(stateDir); !os.IsNotExist(err) {
		t.Errorf("state dir left behind: %v", err)
	}
}

// TestLabDownOtherPrefixWhileDemoRuns: `lab down --state-dir DIR` removes
// the lab DIR records, whose prefix is not the default one, while a demo
// holds the default prefix (this test's lock, or a real `make run`): the
// guard is on the prefix lab down removes, not on the flag's default.
func TestLabDownOtherPrefixWhileDemoRuns(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("labs are Linux only")
	}
	held, err := lockPrefix(lab.DefaultPrefix)
	if err == nil {
		defer held.Unlock()
	} else if !errors.Is(err, ErrDemoRunning) {
		t.Fatal(err)
	} // else a demo on this machine holds it: the same situation.
	stateDir := filepath.Join(t.TempDir(), "lab")
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		t.Fatal(err)
	}
	stateFile := filepath.Join(stateDir, lab.StateFile)
	if err := os.WriteFile(stateFile, []byte(`{"prefix":"`+testPrefix()+`"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := testCommands().Lab(context.Background(), []string{"down", "--state-dir", stateDir}); err != nil {
		t.Fatalf("lab down of a lab with its own prefix while the default prefix is held: %v", err)
	}
	if _, err := os.Stat(stateFile); !os.IsNotExist(err) {
		t.Errorf("state file left after lab down: %v", err)
	}
	// Without a state file the flag's prefix is the one removed: refused.
	if err := testCommands().Lab(context.Background(), []string{"down", "--state-dir", filepath.Join(t.TempDir(), "none")}); !errors.Is(err, ErrDemoRunning) {
		t.Errorf("lab down of the default prefix while a demo holds it: err = %v, want ErrDemoRunning", err)
	}
}

// TestRunCheckScript: scripts/run-check.sh, the first step of `make run`,
// sees the locks a running demo holds (its state directory, its prefix)
// and a taken port, by the names lockDemo and lockPrefix use; with none
// held and free ports it lets make run go on.
func TestRunCheckScript(t *testing.T) {
	script, err := filepath.Abs("../../scripts/run-check.sh")
	if err != nil {
		t.Fatal(err)
	}
	free := func() string { // a loopback port nothing listens on
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp) // lockPrefix's directory, for the test and the script
	run := func(stateDir, prefix, webAddr string) (string, bool) {
		cmd := exec.Command("bash", script)
		cmd.Env = append(os.Environ(), "STATE_DIR="+stateDir, "PREFIX="+prefix, "DATA_DIR="+filepath.Join(tmp, "data"),
			"WEB_ADDR="+webAddr, "CLICKHOUSE_HTTP_ADDR="+free(), "METRICS_ADDR="+free(), "IPFIX_ADDR="+free())
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			t.Fatalf("run-check.sh: %v", err)
		}
		return string(out), err == nil
	}

	stateDir, prefix := filepath.Join(tmp, "lab"), testPrefix()
	if out, ok := run(stateDir, prefix, free()); !ok {
		t.Fatalf("nothing runs, yet run-check.sh refused:\n%s", out)
	}
	lock, err := lockDemo(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Unlock()
	plock, err := lockPrefix(prefix)
	if err != nil {
		t.Fatal(err)
	}
	defer plock.Unlock()
	web, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		web, err = net.Listen("tcp", "127.0.0.1:0")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer web.Close()
	out, ok := run(stateDir, prefix, web.Addr().String())
	if ok {
		t.Fatalf("a demo holds the locks, yet run-check.sh let make run go on:\n%s", out)
	}
	for _, want := range []string{"STATE_DIR=" + stateDir + " (pid " + strconv.Itoa(os.Getpid()), "PREFIX=" + prefix + " (pid " + strconv.Itoa(os.Getpid()),
		"WEB_ADDR=" + web.Addr().String() + ": something listens", "make run STATE_DIR="} {
		if !strings.Contains(out, want) {
			t.Errorf("run-check.sh does not say %q:\n%s", want, out)
		}
	}
}
