// Package e2e runs dualflow's end-to-end scenarios against a real lab
// (package lab): network namespaces, real packets, real conntrack and real
// nftables drops. Every scenario runs in the three lab modes (ipv4, ipv6,
// dual), each family of the mode checked; the run ends with a count of
// passed and failed scenarios per mode.
//
// The tests need root. As non-root they skip, unless DUALFLOW_E2E=1 (set by
// `make test`): then missing prerequisites fail the run.
package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/topology"
	"github.com/dualflow/dualflow/nsrun"
)

// prefixRoot starts the namespace prefix of every lab of this package:
// "dfe<pid>t<n>-", so that a later run can tell leftovers of a dead run.
const prefixRoot = "dfe"

var labSeq atomic.Int32

// labPrefix returns a prefix unique to this process and call.
func labPrefix() string {
	return fmt.Sprintf("%s%dt%d-", prefixRoot, os.Getpid(), labSeq.Add(1))
}

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		sweepDeadRuns()
	}
	code := m.Run()
	removeSharedDataDir()
	printSummary()
	os.Exit(code)
}

// sweepDeadRuns removes labs left by test processes that no longer exist
// (e.g. killed by a test timeout, which skips t.Cleanup).
func sweepDeadRuns() {
	names, err := topology.List(prefixRoot)
	if err != nil {
		return
	}
	done := map[string]bool{}
	for _, n := range names {
		rest := strings.TrimPrefix(n, prefixRoot)
		i := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
		if i <= 0 {
			continue
		}
		pid, _ := strconv.Atoi(rest[:i])
		dash := strings.IndexByte(n, '-')
		if dash < 0 || topology.Alive(pid) {
			continue
		}
		prefix := n[:dash+1]
		if !done[prefix] {
			done[prefix] = true
			if err := topology.Destroy(prefix, time.Second); err != nil {
				fmt.Fprintf(os.Stderr, "e2e: sweep %s: %v\n", prefix, err)
			}
		}
	}
}

// requirePrereqs skips (or with DUALFLOW_E2E=1 fails) when the machine
// cannot run a lab.
func requirePrereqs(t *testing.T) {
	t.Helper()
	var missing []string
	if os.Geteuid() != 0 {
		missing = append(missing, "root")
	}
	if _, err := lab.NFTPath(); err != nil {
		missing = append(missing, "nft (apt-get install nftables)")
	}
	if len(missing) == 0 {
		return
	}
	msg := "e2e prerequisites missing: " + strings.Join(missing, ", ")
	if os.Getenv("DUALFLOW_E2E") == "1" {
		t.Fatal(msg + " (DUALFLOW_E2E=1 requires them)")
	}
	t.Skip(msg + "; set DUALFLOW_E2E=1 to make this an error")
}

// requireOVS skips (or with DUALFLOW_E2E=1 fails) when Open vSwitch is
// missing (scripts/deps.sh installs it).
func requireOVS(t *testing.T) {
	t.Helper()
	requirePrereqs(t)
	var missing []string
	for _, bin := range []string{"ovs-vswitchd", "ovsdb-server", "ovsdb-tool", "ovs-vsctl", "ovs-ofctl", "ovs-appctl", "ethtool"} {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := "OVS e2e prerequisites missing: " + strings.Join(missing, ", ") + " (apt-get install openvswitch-switch ethtool)"
	if os.Getenv("DUALFLOW_E2E") == "1" {
		t.Fatal(msg + " (DUALFLOW_E2E=1 requires them)")
	}
	t.Skip(msg)
}

// startLab builds a lab with the kernel datapath for the test and removes
// it when the test ends, even if it fails. The lab's agents run inside the
// test process.
func startLab(t *testing.T, mode manifest.Mode) *lab.Lab {
	t.Helper()
	return startLabOn(t, mode, lab.DatapathKernel)
}

// startLabOn is startLab with the given datapath (lab.DatapathKernel or
// lab.DatapathOVS).
func startLabOn(t *testing.T, mode manifest.Mode, datapath string) *lab.Lab {
	t.Helper()
	requirePrereqs(t)
	if datapath == lab.DatapathOVS {
		requireOVS(t)
	}
	prefix := labPrefix()
	stateDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	l, err := lab.Up(ctx, lab.Config{Mode: mode, Prefix: prefix, StateDir: stateDir, Datapath: datapath})
	t.Cleanup(func() {
		if l != nil {
			l.Close()
		}
		if err := lab.Down(stateDir, prefix); err != nil {
			t.Errorf("lab down: %v", err)
		}
		if left, _ := topology.List(prefix); len(left) > 0 {
			t.Errorf("namespaces left after down: %v", left)
		}
	})
	if err != nil {
		t.Fatalf("lab up (%s): %v", mode, err)
	}
	t.Logf("lab %s (%s, %s datapath) up in %v", prefix, mode, datapath, time.Since(start).Round(time.Millisecond))
	return l
}

// results counts scenario outcomes per mode for the summary.
var results = struct {
	sync.Mutex
	m map[string]*[3]int // passed, failed, skipped
}{m: map[string]*[3]int{}}

// record counts t's outcome under mode when t ends.
func record(t *testing.T, mode manifest.Mode) { recordAs(t, string(mode)) }

// recordAs counts t's outcome under label (a mode, or "<mode>/ovs" for
// the OVS datapath) when t ends.
func recordAs(t *testing.T, label string) {
	t.Cleanup(func() {
		results.Lock()
		defer results.Unlock()
		c := results.m[label]
		if c == nil {
			c = new([3]int)
			results.m[label] = c
		}
		switch {
		case t.Failed():
			c[1]++
		case t.Skipped():
			c[2]++
		default:
			c[0]++
		}
	})
}

func printSummary() {
	results.Lock()
	defer results.Unlock()
	if len(results.m) == 0 {
		return
	}
	modes := make([]string, 0, len(results.m))
	for m := range results.m {
		modes = append(modes, m)
	}
	sort.Strings(modes)
	fmt.Println("e2e summary (scenarios per mode; <mode>/ovs: OVS datapath):")
	for _, m := range modes {
		c := results.m[m]
		fmt.Printf("  %-9s %3d passed, %d failed, %d skipped\n", m, c[0], c[1], c[2])
	}
}

// dialTimeout bounds labDial: a dropped flow costs this, and an answered
// one must come within it. 700 ms was too little for a TCP exchange over
// OVS's userspace datapath with the tier's tests at once on 2 cores.
const dialTimeout = 2 * time.Second

// labDial sends one request from pod "from" of the lab to "to" over proto
// (agent.TCP, agent.UDP or agent.ICMP). A policy drop returns an error
// wrapping agent.ErrNoAnswer.
func labDial(ctx context.Context, l *lab.Lab, from *corev1.Pod, proto string, to netip.AddrPort) (agent.Reply, error) {
	return agent.Dial(ctx, l.PodNetNSPath(from), proto, to, dialTimeout)
}

// labExec runs argv inside pod's network namespace and returns its
// combined output.
func labExec(ctx context.Context, l *lab.Lab, p *corev1.Pod, argv ...string) ([]byte, error) {
	return nsrun.Output(ctx, l.PodNetNSPath(p), nil, argv...)
}

// labPod returns the pod "namespace/name" of the lab.
func labPod(l *lab.Lab, ref string) (*corev1.Pod, error) {
	i := slices.IndexFunc(l.Manifest.Pods, func(p corev1.Pod) bool { return p.Namespace+"/"+p.Name == ref })
	if i < 0 {
		return nil, fmt.Errorf("pod %q not in lab", ref)
	}
	return &l.Manifest.Pods[i], nil
}

// startIn starts cmd inside the network namespace at path.
func startIn(path string, cmd *exec.Cmd) error { return nsrun.Start(path, cmd) }
