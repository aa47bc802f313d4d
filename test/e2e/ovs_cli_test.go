package e2e

import (
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/topology"
)

// ovsPids returns the pids in the OVS pid files under stateDir/ovs.
func ovsPids(t *testing.T, stateDir string) []int {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(stateDir, "ovs", "*", "*.pid"))
	var out []int
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

func waitDead(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for _, pid := range pids {
		for topology.Alive(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if topology.Alive(pid) {
			t.Errorf("OVS daemon pid %d alive after lab down", pid)
		}
	}
}

// TestOVSCLI drives `dualflow lab up --datapath ovs` (agent processes,
// traffic generator), dials over both families, reads the flows with `lab
// rules`, and checks that `lab down` ends every OVS daemon.
func TestOVSCLI(t *testing.T) {
	requireOVS(t)
	t.Parallel() // its own lab and OVS daemons
	t.Run(string(manifest.ModeDual), func(t *testing.T) {
		recordAs(t, string(manifest.ModeDual)+"/ovs")
		bin := buildBinary(t)
		prefix, stateDir := labPrefix(), t.TempDir()
		t.Cleanup(func() { lab.Down(stateDir, prefix) })
		start := time.Now()
		out, err := exec.Command(bin, "lab", "up", "--datapath", "ovs", "--mode", "dual", "--prefix", prefix, "--state-dir", stateDir, "--traffic.interval", "200ms").CombinedOutput()
		if err != nil {
			t.Fatalf("lab up: %v\n%s", err, out)
		}
		t.Logf("dualflow lab up --datapath ovs --mode dual: %v wall", time.Since(start).Round(time.Millisecond))
		pids := ovsPids(t, stateDir)
		if len(pids) != 4 {
			t.Fatalf("%d OVS pid files, want ovsdb-server and ovs-vswitchd on each of 2 nodes", len(pids))
		}
		l, err := lab.Open(stateDir, lab.Config{})
		if err != nil {
			t.Fatal(err)
		}
		web1, _ := l.PodOn(manifest.NSFrontend, "web", 1)
		api2, _ := l.PodOn(manifest.NSBackend, "api", 2)
		for _, f := range manifest.ModeDual.Families() {
			a, _ := manifest.PodAddr(api2, f)
			if _, err := labDial(t.Context(), l, web1, agent.TCP, netip.AddrPortFrom(a, manifest.PortHTTP)); err != nil {
				t.Errorf("%s: web -> api: %v", f, err)
			}
		}
		out, err = exec.Command(bin, "lab", "rules", "--state-dir", stateDir, "--prefix", prefix, "node-2").CombinedOutput()
		if err != nil || !strings.Contains(string(out), "cookie=0xdf02") || !strings.Contains(string(out), "table=65") {
			t.Errorf("lab rules: %v\n%.2000s", err, out)
		}
		if out, err := exec.Command(bin, "lab", "down", "--state-dir", stateDir, "--prefix", prefix).CombinedOutput(); err != nil {
			t.Fatalf("lab down: %v\n%s", err, out)
		}
		waitDead(t, pids)
		if left, _ := topology.List(prefix); len(left) > 0 {
			t.Errorf("namespaces left: %v", left)
		}
	})
}

// TestOVSDownAfterCrash removes OVS labs whose owner died: once with the
// state directory (pid files) intact, once with it gone (by prefix: the
// daemons live in the node namespaces).
func TestOVSDownAfterCrash(t *testing.T) {
	requireOVS(t)
	t.Parallel() // its own labs and OVS daemons
	t.Run(string(manifest.ModeDual), func(t *testing.T) {
		recordAs(t, string(manifest.ModeDual)+"/ovs")
		for _, lose := range []bool{false, true} {
			prefix, stateDir := labPrefix(), t.TempDir()
			l, err := lab.Up(t.Context(), lab.Config{Mode: manifest.ModeDual, Prefix: prefix, StateDir: stateDir, Datapath: lab.DatapathOVS})
			if err != nil {
				t.Fatal(err)
			}
			l.Close()
			pids := ovsPids(t, stateDir)
			if len(pids) != 4 {
				t.Fatalf("%d OVS pid files", len(pids))
			}
			if lose {
				os.RemoveAll(stateDir)
			}
			if err := lab.Down(stateDir, prefix); err != nil {
				t.Fatal(err)
			}
			waitDead(t, pids)
			if left, _ := topology.List(prefix); len(left) > 0 {
				t.Errorf("namespaces left: %v", left)
			}
		}
	})
}
