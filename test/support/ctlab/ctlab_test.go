package ctlab

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/dualflow/dualflow/lab/topology"
	"github.com/dualflow/dualflow/nsrun"
)

// TestToolPath: topology.Tool finds the lab's commands in the sbin directories when PATH
// lacks them, as under a non-login root shell.
func TestToolPath(t *testing.T) {
	Require(t)
	t.Setenv("PATH", t.TempDir())
	for _, tool := range tools {
		p, err := topology.Tool(tool)
		if err != nil {
			t.Fatal(err)
		}
		if d := filepath.Dir(p); d != "/usr/sbin" && d != "/sbin" && d != "/usr/local/sbin" {
			t.Errorf("%s found at %s", tool, p)
		}
		if got := command([]string{tool, "-V"}); got[0] != p || got[1] != "-V" {
			t.Errorf("command %v", got)
		}
	}
	if _, err := topology.Tool("dfx-no-such-tool"); err == nil {
		t.Error("missing tool: no error")
	}
}

// TestSweepDeadRuns leaves a namespace named for a process that has exited
// and one named for this live process: the sweep removes only the first.
func TestSweepDeadRuns(t *testing.T) {
	Require(t)
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	dead := fmt.Sprintf("%ssweep-%d-1-r", prefixRoot, cmd.Process.Pid)
	live := fmt.Sprintf("%ssweep-%d-999-r", prefixRoot, os.Getpid())
	ip, _ := topology.Tool("ip")
	for _, ns := range []string{dead, live} {
		if out, err := exec.Command(ip, "netns", "add", ns).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		t.Cleanup(func() {
			if _, err := os.Stat(nsrun.Path(ns)); err == nil {
				exec.Command(ip, "netns", "del", ns).Run()
			}
		})
	}
	sweepDeadRuns(t)
	if _, err := os.Stat(nsrun.Path(dead)); err == nil {
		t.Errorf("%s of a dead process left", dead)
	}
	if _, err := os.Stat(nsrun.Path(live)); err != nil {
		t.Errorf("%s of this process removed: %v", live, err)
	}
}
