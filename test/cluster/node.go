package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// node starts node n: its cgroups, containerd (and the images), the CNI
// configuration, kubelet and kube-proxy, all in the node's namespace.
// nsenter --net (not ip netns exec, which also unshares the mount
// namespace): kubelet and containerd must see each other's mounts.
func (c *Cluster) node(ctx context.Context, n int) error {
	dir := c.nodeDir(n)
	for _, d := range []string{"containerd", "cni/net.d", "cni/ipam", "kubelet", "podlogs", "opt"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return err
		}
	}
	if err := makeCgroups(cgroupRoot(c.cfg.Prefix, n)); err != nil {
		return fmt.Errorf("node %d: %w", n, err)
	}
	sock := filepath.Join(dir, "containerd", "containerd.sock")
	if err := os.WriteFile(filepath.Join(dir, "containerd.toml"), []byte(c.containerdConfig(n)), 0o600); err != nil {
		return err
	}
	bin := filepath.Join(c.cfg.Bins.ContainerdDir, "usr", "bin")
	if err := c.start("containerd-"+nodeName(n), c.nodeNS(n), []string{"PATH=" + bin + ":" + os.Getenv("PATH")},
		filepath.Join(bin, "containerd"), "--config", filepath.Join(dir, "containerd.toml")); err != nil {
		return err
	}
	ctr := func(args ...string) error {
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "ctr"), append([]string{"--address", sock, "--namespace", "k8s.io"}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("node %d: ctr %s: %w: %s", n, strings.Join(args, " "), err, out)
		}
		return nil
	}
	if err := poll(ctx, time.Minute, func() (bool, error) {
		if err := c.exited("containerd-" + nodeName(n)); err != nil {
			return false, err
		}
		return ctr("version") == nil, nil
	}); err != nil {
		return fmt.Errorf("node %d: containerd: %w", n, err)
	}
	for _, img := range append([]string{c.cfg.Bins.PauseArchive, c.cfg.Bins.CoreDNSArchive}, c.cfg.Images...) {
		if err := ctr("images", "import", img); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "cni", "net.d", "10-pods.conflist"), c.cniConfig(n), 0o600); err != nil {
		return err
	}
	kubeconfig := filepath.Join(c.cfg.Dir, "kubeconfig-system-node-"+nodeName(n))
	if err := c.API.Kubeconfig(kubeconfig, "system:node:"+nodeName(n)); err != nil {
		return err
	}
	resolv := filepath.Join(c.cfg.Dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("# no upstream resolver: nothing leaves the cluster\noptions ndots:5\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "kubelet.yaml"), []byte(c.kubeletConfig(n, sock, resolv)), 0o600); err != nil {
		return err
	}
	if err := c.start("kubelet-"+nodeName(n), c.nodeNS(n), nil, c.cfg.Bins.Kubelet,
		"--config", filepath.Join(dir, "kubelet.yaml"), "--kubeconfig", kubeconfig,
		"--root-dir", filepath.Join(dir, "kubelet"), "--hostname-override", nodeName(n),
		"--node-ip", join(c.plan.nodeIPs(n)), "--v=1"); err != nil {
		return err
	}
	proxyKC := filepath.Join(c.cfg.Dir, "kubeconfig-system-kube-proxy")
	if err := c.API.Kubeconfig(proxyKC, "system:kube-proxy"); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "kube-proxy.yaml"), []byte(c.proxyConfig(n, proxyKC)), 0o600); err != nil {
		return err
	}
	return c.start("kube-proxy-"+nodeName(n), c.nodeNS(n), nil, c.cfg.Bins.Proxy,
		"--config", filepath.Join(dir, "kube-proxy.yaml"), "--v=1")
}

// networkPolicy runs kube-router on node n as the cluster's NetworkPolicy
// implementation, its firewall only (iptables and ipset in the node's
// namespace; kube-proxy does the Services, the CNI bridge the routes),
// once the node is registered (kube-router exits when it cannot find it).
// kube-network-policies, the reference implementation, cannot work here:
// it needs nftables queues (CONFIG_NFT_QUEUE), which this kernel lacks.
func (c *Cluster) networkPolicy(n int) error {
	kc := filepath.Join(c.cfg.Dir, "kubeconfig-kube-router")
	if err := c.API.Kubeconfig(kc, "kube-router"); err != nil {
		return err
	}
	args := []string{c.cfg.Bins.KubeRouter, "--kubeconfig", kc, "--hostname-override", nodeName(n),
		"--run-firewall=true", "--run-router=false", "--run-service-proxy=false",
		fmt.Sprintf("--enable-ipv4=%v", c.plan.v4()), fmt.Sprintf("--enable-ipv6=%v", c.plan.v6()),
		"--metrics-port=0", "--health-port=0", "--v=1"}
	for _, s := range c.plan.serviceCIDRs() {
		args = append(args, "--service-cluster-ip-range="+s.String())
	}
	return c.start("kube-router-"+nodeName(n), c.nodeNS(n), []string{"NODE_NAME=" + nodeName(n)}, args...)
}

// containerdConfig: Debian's containerd 1.6 (version-2 configuration),
// everything under the node's directory. restrict_oom_score_adj: root here
// lacks CAP_SYS_RESOURCE, and runc fails every sandbox that kubelet asks a
// score of -998 for.
func (c *Cluster) containerdConfig(n int) string {
	d := filepath.Join(c.nodeDir(n), "containerd")
	return fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.tracing"]
[grpc]
  address = %[3]q
[ttrpc]
  address = %[4]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[5]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "localhost/pause:local"
  stream_server_address = "127.0.0.1"
  enable_selinux = false
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %[6]q
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        BinaryName = "/usr/sbin/runc"
        Root = %[7]q
`, filepath.Join(d, "root"), filepath.Join(d, "state"), filepath.Join(d, "containerd.sock"),
		filepath.Join(d, "containerd.sock.ttrpc"), filepath.Join(c.nodeDir(n), "opt"),
		filepath.Join(c.nodeDir(n), "cni", "net.d"), runcRoot(c.cfg.Prefix, n))
}

// cniNetwork is the name of the cluster's CNI network (CNI's result cache
// files start with it).
func cniNetwork(prefix string) string { return prefix + "pods" }

// cniConfig: the bridge plugin (cni0 in the node's namespace, the pods'
// gateway) with host-local addresses from the node's pod subnets, in each
// family of the mode.
func (c *Cluster) cniConfig(n int) []byte {
	type rng struct {
		Subnet string `json:"subnet"`
	}
	type route struct {
		Dst string `json:"dst"`
	}
	var ranges [][]rng
	var routes []route
	for _, s := range c.plan.podSubnets(n) {
		ranges = append(ranges, []rng{{Subnet: s.String()}})
		dst := "0.0.0.0/0"
		if s.Addr().Is6() {
			dst = "::/0"
		}
		routes = append(routes, route{Dst: dst})
	}
	conf := map[string]any{
		"cniVersion": "1.0.0",
		"name":       cniNetwork(c.cfg.Prefix),
		"plugins": []any{
			map[string]any{
				"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
				"ipam": map[string]any{"type": "host-local", "dataDir": filepath.Join(c.nodeDir(n), "cni", "ipam"),
					"ranges": ranges, "routes": routes},
			},
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	b, _ := json.MarshalIndent(conf, "", "  ")
	return b
}

// kubeletConfig: cgroupfs (the machine's cgroups are v1/hybrid and PID 1
// is not systemd, so failCgroupV1 is off), the node's own cgroup root, pod
// logs and directories; the API's anonymous access is on for the probe of
// logs and exec only.
func (c *Cluster) kubeletConfig(n int, sock, resolv string) string {
	addr := "0.0.0.0"
	if c.plan.v6() {
		addr = "::"
	}
	return fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
cgroupRoot: %s
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
address: %q
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
clusterDomain: cluster.local
clusterDNS: [%s]
resolvConf: %s
evictionHard: {memory.available: "100Mi", nodefs.available: "1%%", imagefs.available: "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
`, cgroupRoot(c.cfg.Prefix, n), sock, filepath.Join(c.nodeDir(n), "podlogs"), addr,
		join(c.plan.clusterDNS()), resolv)
}

// proxyConfig: kube-proxy in nftables mode; conntrack sysctls untouched
// (they are the machine's, not the node's).
func (c *Cluster) proxyConfig(n int, kubeconfig string) string {
	return fmt.Sprintf(`apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: %s}
mode: nftables
clusterCIDR: %s
hostnameOverride: %s
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
`, kubeconfig, join(c.plan.podCIDRs()), nodeName(n))
}

// cgroupHierarchies returns the mount points of the machine's cgroup
// hierarchies (v1 controllers, named ones and the unified v2 one).
func cgroupHierarchies() ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		if !ok {
			continue
		}
		fs := strings.Fields(post)
		f := strings.Fields(pre)
		if len(fs) > 0 && (fs[0] == "cgroup" || fs[0] == "cgroup2") && len(f) > 4 {
			out = append(out, f[4])
		}
	}
	return out, nil
}

// makeCgroups creates root in every hierarchy (kubelet refuses a missing
// cgroupRoot); cpuset needs its cpus and mems set before any task joins.
func makeCgroups(root string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		d := filepath.Join(h, root)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if v, err := os.ReadFile(filepath.Join(h, f)); err == nil {
				if err := os.WriteFile(filepath.Join(d, f), v, 0o644); err != nil {
					return fmt.Errorf("cgroup %s: %w", filepath.Join(d, f), err)
				}
			}
		}
	}
	return nil
}
