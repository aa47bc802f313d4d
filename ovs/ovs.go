// Package ovs is the Open vSwitch vocabulary of dualflow, a leaf that
// exporter/ovs (OVS as a flow source), traceflow/node (probes on an OVS
// datapath) and lab/ovs (the lab's datapath) share: parsers of the CLIs'
// output (ParseConntrack for `ovs-appctl dpctl/dump-conntrack`, ParseFlows
// for `ovs-ofctl dump-flows`, MonitorParser for the packet-ins of
// `ovs-ofctl monitor`) and the contract with a dualflow-aware datapath:
// the cookie layout (Cookie, SplitCookie), the rules file (Rules) and the
// per-connection counter flows (CounterKeys). Parse errors wrap ErrSyntax.
// Run runs one CLI; nothing here logs. See README.md.
package ovs

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Defaults of the CLIs' callers.
const (
	DefaultBridge         = "br-int"
	DefaultCommandTimeout = 5 * time.Second
	DefaultMonitorMissLen = 65534 // enables packet-ins on the monitor's service connection
)

// Env is the environment of an OVS CLI for the ovs-vswitchd whose sockets
// are in runDir (empty: the CLIs' default, /var/run/openvswitch).
func Env(runDir string) []string {
	env := os.Environ()
	if runDir != "" {
		env = append(env, "OVS_RUNDIR="+runDir)
	}
	return env
}

// Run runs argv (an OVS CLI) against the ovs-vswitchd of runDir, under
// timeout, and returns its stdout; an error names the command and carries
// its stderr.
func Run(ctx context.Context, runDir string, timeout time.Duration, argv ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = Env(runDir)
	cmd.WaitDelay = time.Second // a child holding the pipes cannot hold the run past the timeout
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = ctx.Err()
		}
		return "", fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return stdout.String(), nil
}

// Monitor runs `ofctl --no-names monitor bridge <DefaultMonitorMissLen>
// args...` against the ovs-vswitchd of runDir and calls line with every
// line it prints, its replies (stdout) and the messages it receives
// (stderr: packet-ins) in order on one pipe, until the CLI exits or ctx
// ends (the CLI is killed then). It returns ctx's error, or the exit with
// the last line printed (the CLI's own error message, typically).
func Monitor(ctx context.Context, ofctl, runDir, bridge string, line func(string), args ...string) error {
	cmd := exec.CommandContext(ctx, ofctl, append([]string{"--no-names", "monitor", bridge, strconv.Itoa(DefaultMonitorMissLen)}, args...)...)
	cmd.Env = Env(runDir)
	cmd.WaitDelay = time.Second // a child holding the pipe cannot hold Wait past the kill
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	cmd.Stdout, cmd.Stderr = w, w
	err = cmd.Start()
	w.Close()
	if err != nil {
		return fmt.Errorf("ovs-ofctl monitor: %w", err)
	}
	// Unblock the reader when ctx ends even if something still holds the
	// pipe's write end.
	defer context.AfterFunc(ctx, func() { r.Close() })()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	last := ""
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			last = l
		}
		line(sc.Text())
	}
	err = cmd.Wait()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("ovs-ofctl monitor %s exited (%v): %s", bridge, err, last)
}
