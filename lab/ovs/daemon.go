package ovs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dualflow/dualflow/lab/topology"
	"github.com/dualflow/dualflow/nsrun"
)

// cmdTimeout bounds every OVS CLI run.
const cmdTimeout = 10 * time.Second

// daemons are the two OVS daemons of a node, in start order.
var daemons = []string{"ovsdb-server", "ovs-vswitchd"}

// Node is the OVS of one lab node: an ovsdb-server and an ovs-vswitchd
// running inside the node's network namespace (so the interfaces they
// open are the node's), with every file in Dir: conf.db, db.sock, the pid
// files, the control sockets, the bridge's management socket and the logs.
// Dir is both OVS_RUNDIR, OVS_DBDIR and OVS_LOGDIR, so the CLIs reach this
// node's OVS (and never the system's) with Env.
type Node struct {
	Dir   string
	NetNS string // path of the node's network namespace
}

// Env returns the environment for OVS CLIs and daemons of the node.
func (n Node) Env() []string {
	return append(os.Environ(), "OVS_RUNDIR="+n.Dir, "OVS_DBDIR="+n.Dir, "OVS_LOGDIR="+n.Dir)
}

// DB returns the ovsdb remote of the node.
func (n Node) DB() string { return "unix:" + filepath.Join(n.Dir, "db.sock") }

// Start creates the database and starts both daemons. The daemons detach
// and outlive the caller; Stop ends them.
func (n Node) Start(ctx context.Context) error {
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return fmt.Errorf("ovs dir: %w", err)
	}
	db := filepath.Join(n.Dir, "conf.db")
	if _, err := n.run(ctx, "", "ovsdb-tool", "create", db); err != nil {
		return err
	}
	if _, err := n.run(ctx, n.NetNS, "ovsdb-server", db, "--remote=punix:"+filepath.Join(n.Dir, "db.sock"),
		"--pidfile="+filepath.Join(n.Dir, "ovsdb-server.pid"), "--detach", "--no-chdir",
		"--log-file="+filepath.Join(n.Dir, "ovsdb-server.log"), "-vconsole:off"); err != nil {
		return err
	}
	if _, err := n.Vsctl(ctx, "--no-wait", "init"); err != nil {
		return err
	}
	_, err := n.run(ctx, n.NetNS, "ovs-vswitchd", n.DB(),
		"--pidfile="+filepath.Join(n.Dir, "ovs-vswitchd.pid"), "--detach", "--no-chdir",
		"--log-file="+filepath.Join(n.Dir, "ovs-vswitchd.log"), "-vconsole:off")
	return err
}

// Vsctl runs ovs-vsctl against the node's database.
func (n Node) Vsctl(ctx context.Context, args ...string) (string, error) {
	return n.run(ctx, "", "ovs-vsctl", append([]string{"--db=" + n.DB(), "--timeout=10"}, args...)...)
}

// Ofctl runs ovs-ofctl with OpenFlow 1.3 enabled (meters).
func (n Node) Ofctl(ctx context.Context, args ...string) (string, error) {
	return n.run(ctx, "", "ovs-ofctl", append([]string{"-O", "OpenFlow13"}, args...)...)
}

// run runs a command with the node's environment under cmdTimeout, inside
// netns when it is set, with stdin from the last "-" argument's data when
// given through ofctlInput. Daemons write their output to their log files;
// the command's own output goes to a buffer (a daemon that detaches closes
// its copy of the descriptors).
func (n Node) run(ctx context.Context, netns, name string, args ...string) (string, error) {
	return n.runInput(ctx, netns, nil, name, args...)
}

func (n Node) runInput(ctx context.Context, netns string, stdin []byte, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, cmdTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = n.Env()
	// Bounds a child that keeps the pipes after it exits; generous, as a
	// loaded machine (e2e tests at once on 2 cores) can take over a second
	// to drain them, which failed dump-flows with ErrWaitDelay.
	cmd.WaitDelay = cmdTimeout
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	var err error
	if netns != "" {
		err = nsrun.Do(netns, cmd.Run)
	} else {
		err = cmd.Run()
	}
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args[:min(len(args), 3)], " "), err, bytes.TrimSpace(errb.Bytes()))
	}
	return out.String(), nil
}

// Stop ends the daemons whose pid files are in dir: `ovs-appctl exit`,
// then SIGKILL for what is still alive after grace. A pid is only signalled
// when its command line names the daemon and dir, so a stale pid file
// never hits another process. It works after a crash, from dir alone.
func Stop(dir string, grace time.Duration) error {
	var errs []error
	for i := len(daemons) - 1; i >= 0; i-- {
		name := daemons[i]
		pid, ok := topology.PidFile(filepath.Join(dir, name+".pid"), name, dir)
		if !ok {
			continue
		}
		ctl := filepath.Join(dir, name+"."+strconv.Itoa(pid)+".ctl")
		ctx, cancel := context.WithTimeout(context.Background(), grace)
		exec.CommandContext(ctx, "ovs-appctl", "-T", "1", "-t", ctl, "exit").Run()
		cancel()
		if err := topology.Reap([]int{pid}, grace); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

// Setup creates the bridge on the userspace datapath, attaches the ports,
// and loads the meter, groups and flows of rs.
func (n Node) Setup(ctx context.Context, rs *Ruleset) error {
	args := []string{"add-br", Bridge, "--", "set", "bridge", Bridge, "datapath_type=netdev", "fail_mode=secure",
		"protocols=OpenFlow10,OpenFlow13,OpenFlow15"}
	for _, p := range rs.Ports {
		args = append(args, "--", "add-port", Bridge, p.Name, "--", "set", "interface", p.Name, "ofport_request="+strconv.Itoa(p.OFPort))
	}
	if _, err := n.Vsctl(ctx, args...); err != nil {
		return err
	}
	if _, err := n.Ofctl(ctx, "add-meter", Bridge, fmt.Sprintf("meter=%d,pktps,band=type=drop,rate=%d", DropMeter, DropMeterRate)); err != nil {
		return err
	}
	return n.Apply(ctx, rs)
}

// Apply loads the groups and flows of rs, replacing those of an earlier
// Apply. The flows are replaced table by table in one bundle (atomically);
// the learned counter flows of table 65 are kept.
func (n Node) Apply(ctx context.Context, rs *Ruleset) error {
	if rs.Groups != "" {
		// Groups are replaced one by one (mod-group --may-create) so that
		// flows pointing at them are not removed.
		for line := range strings.Lines(rs.Groups) {
			if _, err := n.runInput(ctx, "", nil, "ovs-ofctl", "-O", "OpenFlow15", "--may-create", "mod-group", Bridge, strings.TrimSpace(line)); err != nil {
				return err
			}
		}
	}
	var b strings.Builder
	for _, t := range []int{TableClassify, TableNeighbor, TableConntrack, TableCTState, TableService, TableEgress, TableIngress, TableCommit, TableCount, TableForward} {
		fmt.Fprintf(&b, "delete table=%d\n", t)
	}
	fmt.Fprintf(&b, "delete table=%d,cookie=%#x/-1\n", TableConnCounts, pipe(TableConnCounts))
	for line := range strings.Lines(rs.Flows) {
		b.WriteString("add " + line)
	}
	_, err := n.runInput(ctx, "", []byte(b.String()), "ovs-ofctl", "-O", "OpenFlow15", "--bundle", "add-flows", Bridge, "-")
	return err
}
