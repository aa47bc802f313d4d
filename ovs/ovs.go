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
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
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
