package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/topology"
	"github.com/dualflow/dualflow/nsrun"
	"github.com/dualflow/dualflow/test/kubeapi"
)

// Config describes a cluster.
type Config struct {
	// Prefix starts the name of every namespace, cgroup and CNI network
	// of the cluster (2..8 characters of [a-z0-9-]); Down removes what
	// carries it.
	Prefix string
	// Index picks the address block (0..MaxIndex): clusters that run at
	// once need different ones.
	Index int
	Mode  manifest.Mode
	// Dir holds every file of the cluster: state, certificates, logs,
	// containerd's and kubelet's directories (a few GB with images).
	Dir  string
	Bins Bins
	// Images are docker-archives imported into every node's containerd
	// (the pause image is always).
	Images []string
	// Progress receives one line per step.
	Progress io.Writer
}

// Nodes is the number of nodes.
const Nodes = 2

// Cluster is a running cluster.
type Cluster struct {
	cfg  Config
	plan plan
	// API is the control plane; API.Admin a clientset (system:masters)
	// that dials into the control plane's namespace.
	API *kubeapi.Server
	// Kubeconfig is the admin's kubeconfig (valid inside the control
	// plane's namespace: see Kubectl and Exec).
	Kubeconfig string

	mu    sync.Mutex
	procs []*proc
}

type proc struct {
	name string
	cmd  *exec.Cmd
	done chan error
}

// state is what Down needs, in <Dir>/cluster.json.
type state struct {
	Prefix string `json:"prefix"`
	Index  int    `json:"index"`
	Mode   string `json:"mode"`
	Dir    string `json:"dir"`
}

// NetNS names.
func (c *Cluster) cpNS() string              { return c.cfg.Prefix + "cp" }
func nodeName(n int) string                  { return "n" + strconv.Itoa(n) }
func (c *Cluster) nodeNS(n int) string       { return c.cfg.Prefix + nodeName(n) }
func (c *Cluster) nodeDir(n int) string      { return filepath.Join(c.cfg.Dir, nodeName(n)) }
func cgroupRoot(prefix string, n int) string { return "/" + prefix + nodeName(n) }
func runcRoot(prefix string, n int) string   { return "/run/" + prefix + nodeName(n) + "-runc" }

// NodeNetNS is the /run/netns path of node n (1-based).
func (c *Cluster) NodeNetNS(n int) string { return nsrun.Path(c.nodeNS(n)) }

// ControlPlaneNetNS is the /run/netns path of the control plane.
func (c *Cluster) ControlPlaneNetNS() string { return nsrun.Path(c.cpNS()) }

// Mode is the cluster's IP mode.
func (c *Cluster) Mode() manifest.Mode { return c.cfg.Mode }

// Dir is the cluster's directory.
func (c *Cluster) Dir() string { return c.cfg.Dir }

func (c *Cluster) progress(format string, args ...any) {
	if c.cfg.Progress != nil {
		fmt.Fprintf(c.cfg.Progress, "[cluster %s] %s\n", strings.TrimSuffix(c.cfg.Prefix, "-"), fmt.Sprintf(format, args...))
	}
}

func validPrefix(p string) error {
	if len(p) < 2 || len(p) > 8 {
		return fmt.Errorf("cluster: prefix %q: want 2..8 characters", p)
	}
	for _, r := range p {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' {
			return fmt.Errorf("cluster: prefix %q: want [a-z0-9-]", p)
		}
	}
	return nil
}

// Up brings the cluster up and waits until its nodes are Ready. On error
// it tears down what it started.
func Up(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if err := validPrefix(cfg.Prefix); err != nil {
		return nil, err
	}
	if cfg.Index < 0 || cfg.Index > MaxIndex {
		return nil, fmt.Errorf("cluster: index %d: want 0..%d", cfg.Index, MaxIndex)
	}
	if _, err := manifest.ParseMode(string(cfg.Mode)); err != nil {
		return nil, err
	}
	if left, _ := topology.List(cfg.Prefix); len(left) > 0 {
		return nil, fmt.Errorf("cluster: namespaces %v exist: another cluster with prefix %q runs (or crashed: make cluster-down)", left, cfg.Prefix)
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "logs"), 0o700); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, plan: plan{mode: cfg.Mode, index: cfg.Index}}
	st, _ := json.Marshal(state{Prefix: cfg.Prefix, Index: cfg.Index, Mode: string(cfg.Mode), Dir: cfg.Dir})
	if err := os.WriteFile(filepath.Join(cfg.Dir, "cluster.json"), st, 0o600); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Down()
		}
	}()
	began := time.Now()
	if err := c.network(ctx); err != nil {
		return nil, err
	}
	c.progress("network in %s", time.Since(began).Round(100*time.Millisecond))
	if err := c.controlPlane(ctx); err != nil {
		return nil, err
	}
	c.progress("control plane in %s", time.Since(began).Round(100*time.Millisecond))
	if err := enterSysctls(cfg.Prefix); err != nil {
		return nil, err
	}
	errs := make([]error, Nodes)
	var wg sync.WaitGroup
	for n := 1; n <= Nodes; n++ {
		wg.Go(func() { errs[n-1] = c.node(ctx, n) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	c.progress("nodes started in %s", time.Since(began).Round(100*time.Millisecond))
	if err := c.waitNodesReady(ctx); err != nil {
		return nil, err
	}
	if err := c.setPodCIDRs(ctx); err != nil {
		return nil, err
	}
	// kubelet rewrote the kernel's panic and overcommit settings at start;
	// it never does again.
	if err := leaveSysctls(cfg.Prefix); err != nil {
		return nil, err
	}
	for n := 1; n <= Nodes; n++ {
		if err := c.networkPolicy(n); err != nil {
			return nil, err
		}
	}
	c.progress("%d nodes Ready in %s", Nodes, time.Since(began).Round(100*time.Millisecond))
	if err := c.dns(ctx); err != nil {
		return nil, fmt.Errorf("cluster DNS: %w", err)
	}
	c.progress("cluster DNS ready in %s", time.Since(began).Round(100*time.Millisecond))
	return c, nil
}

func (c *Cluster) network(ctx context.Context) error {
	p := c.plan
	spec := &topology.Spec{Fabric: c.cfg.Prefix + "fabric"}
	cp := topology.Node{NetNS: c.cpNS(), FabricPort: c.cfg.Prefix + "cp", Addrs: p.hostAddrs(1)}
	for n := 1; n <= Nodes; n++ {
		for i, sub := range p.podSubnets(n) {
			cp.Routes = append(cp.Routes, topology.Route{Dst: sub, Via: p.nodeIPs(n)[i]})
		}
	}
	spec.Nodes = append(spec.Nodes, cp)
	for n := 1; n <= Nodes; n++ {
		node := topology.Node{NetNS: c.nodeNS(n), FabricPort: c.cfg.Prefix + nodeName(n), Addrs: p.hostAddrs(10 + n)}
		for m := 1; m <= Nodes; m++ {
			if m == n {
				continue
			}
			for i, sub := range p.podSubnets(m) {
				node.Routes = append(node.Routes, topology.Route{Dst: sub, Via: p.nodeIPs(m)[i]})
			}
		}
		// A default route, as nodes have: to the control plane, which
		// forwards nothing out of the cluster's namespaces.
		for _, a := range p.controlPlane() {
			dst := netip.PrefixFrom(netip.IPv4Unspecified(), 0)
			if a.Is6() {
				dst = netip.PrefixFrom(netip.IPv6Unspecified(), 0)
			}
			node.Routes = append(node.Routes, topology.Route{Dst: dst, Via: a})
		}
		spec.Nodes = append(spec.Nodes, node)
	}
	return topology.Build(ctx, spec)
}

// users of the API server's token file. The default RBAC bindings give
// each of them its component's rights; kube-router (test infrastructure)
// is a cluster admin.
func users() []kubeapi.User {
	us := []kubeapi.User{
		{Name: "system:kube-controller-manager"},
		{Name: "system:kube-scheduler"},
		{Name: "system:kube-proxy"},
		{Name: "kube-router", Groups: []string{"system:masters"}},
	}
	for n := 1; n <= Nodes; n++ {
		us = append(us, kubeapi.User{Name: "system:node:" + nodeName(n), Groups: []string{"system:nodes"}})
	}
	return us
}

func (c *Cluster) controlPlane(ctx context.Context) error {
	p := c.plan
	s, err := kubeapi.Start(ctx, kubeapi.Options{
		Dir: filepath.Join(c.cfg.Dir, "cp"), Binary: c.cfg.Bins.APIServer,
		NetNS: c.ControlPlaneNetNS(), Address: p.apiAddr().String(), Port: 6443,
		ServiceCIDRs: join(p.serviceCIDRs()), Authorization: "Node,RBAC", Users: users(),
		ExtraArgs: []string{
			"--enable-admission-plugins=NodeRestriction",
			"--allow-privileged=true",
			// Without it, logs, exec and port-forward look node names up
			// in the machine's DNS.
			"--kubelet-preferred-address-types=InternalIP",
		},
	})
	if err != nil {
		return err
	}
	c.API = s
	c.Kubeconfig = s.AdminKubeconfig
	ca := filepath.Join(c.cfg.Dir, "ca.crt")
	if err := os.WriteFile(ca, s.CA(), 0o644); err != nil {
		return err
	}
	kc := func(user string) (string, error) {
		path := filepath.Join(c.cfg.Dir, "kubeconfig-"+strings.ReplaceAll(user, ":", "-"))
		return path, s.Kubeconfig(path, user)
	}
	kcm, err := kc("system:kube-controller-manager")
	if err != nil {
		return err
	}
	if err := c.start("kube-controller-manager", c.cpNS(), nil, c.cfg.Bins.ControllerManager,
		"--kubeconfig", kcm, "--secure-port=0", "--leader-elect=false",
		"--cluster-cidr", join(p.podCIDRs()), "--service-cluster-ip-range", join(p.serviceCIDRs()),
		"--allocate-node-cidrs=false", "--use-service-account-credentials=true",
		"--service-account-private-key-file", s.ServiceAccountKey(), "--root-ca-file", ca,
		"--v=1"); err != nil {
		return err
	}
	sched, err := kc("system:kube-scheduler")
	if err != nil {
		return err
	}
	return c.start("kube-scheduler", c.cpNS(), nil, c.cfg.Bins.Scheduler,
		"--kubeconfig", sched, "--secure-port=0", "--leader-elect=false", "--v=1")
}

// start starts a process of the cluster in namespace netns (empty: this
// process's), tied to this process's life, with its output in logs/.
func (c *Cluster) start(name, netns string, env []string, argv ...string) error {
	f, err := os.Create(filepath.Join(c.cfg.Dir, "logs", name+".log"))
	if err != nil {
		return err
	}
	if netns != "" {
		argv = append([]string{"nsenter", "--net=" + nsrun.Path(netns), "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := kubeapi.StartTied(cmd); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan error, 1)}
	go func() {
		p.done <- cmd.Wait()
		f.Close()
	}()
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	return nil
}

// Log returns the end of a process's log (name as started: kubelet-n1, ...).
func (c *Cluster) Log(name string, max int) string {
	b, _ := os.ReadFile(filepath.Join(c.cfg.Dir, "logs", name+".log"))
	if len(b) > max {
		b = b[len(b)-max:]
	}
	return string(b)
}

// exited returns the error of a process that ended, by name.
func (c *Cluster) exited(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.procs {
		if p.name != name {
			continue
		}
		select {
		case err := <-p.done:
			p.done <- err
			return fmt.Errorf("%s exited: %v\n--- %s.log ---\n%s", name, err, name, c.Log(name, 3000))
		default:
		}
	}
	return nil
}

func (c *Cluster) waitNodesReady(ctx context.Context) error {
	return poll(ctx, 3*time.Minute, func() (bool, error) {
		for n := 1; n <= Nodes; n++ {
			for _, name := range []string{"containerd-" + nodeName(n), "kubelet-" + nodeName(n), "kube-proxy-" + nodeName(n)} {
				if err := c.exited(name); err != nil {
					return false, err
				}
			}
		}
		nodes, err := c.API.Admin.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, nil
		}
		ready := 0
		for _, nd := range nodes.Items {
			for _, cond := range nd.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		return ready == Nodes, nil
	})
}

// setPodCIDRs records each node's pod subnets in its spec.podCIDRs, as
// kube-controller-manager's node IPAM does on most clusters (here the CNI
// configuration has them statically, so they are set to match): the
// collector attributes an address of a node's pod CIDR that is no pod's,
// such as the bridge's gateway the kubelet probes from, to the node.
func (c *Cluster) setPodCIDRs(ctx context.Context) error {
	for n := 1; n <= Nodes; n++ {
		subs := c.plan.podSubnets(n)
		patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%s]}}`, subs[0], quoted(subs))
		if _, err := c.API.Admin.CoreV1().Nodes().Patch(ctx, nodeName(n), types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("node %s: set podCIDRs: %w", nodeName(n), err)
		}
	}
	return nil
}

func quoted(ps []netip.Prefix) string {
	q := make([]string, len(ps))
	for i, p := range ps {
		q[i] = strconv.Quote(p.String())
	}
	return strings.Join(q, ",")
}

// poll calls ok every 200 ms until it is true, fails, or timeout passes.
func poll(ctx context.Context, timeout time.Duration, ok func() (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		done, err := ok()
		if err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not within %s: %w", timeout, ctx.Err())
		case <-t.C:
		}
	}
}

// Kubectl runs the cluster's kubectl as the admin, inside the control
// plane's namespace, and returns its combined output.
func (c *Cluster) Kubectl(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	return c.Exec(ctx, stdin, append([]string{c.cfg.Bins.Kubectl, "--kubeconfig", c.Kubeconfig}, args...)...)
}

// Exec runs argv inside the control plane's namespace (helm, kubectl,
// a browser) with KUBECONFIG set to the admin's.
func (c *Cluster) Exec(ctx context.Context, stdin io.Reader, argv ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + c.ControlPlaneNetNS(), "--"}, argv...)...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	cmd.Stdin = stdin
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s: %w\n%s", strings.Join(argv, " "), err, out)
	}
	return out, nil
}
