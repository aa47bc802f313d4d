package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/topology"
	"github.com/dualflow/dualflow/nsrun"
)

// Down tears the cluster down and undoes what it changed on the host. It
// is safe to call more than once.
func (c *Cluster) Down() error {
	began := time.Now()
	var errs []error
	// The pods' namespaces, known by their addresses while they have
	// them: CNI removes the addresses when a pod stops, and containerd
	// the namespace only if it outlives that.
	podNS, _ := podNetNS(c.plan)
	if c.API != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		// Pods first, so that kubelet stops their sandboxes and CNI
		// removes their network namespaces and addresses.
		if err := c.deletePods(ctx); err != nil {
			c.progress("pods not all gone before the nodes stop (teardown goes on): %v", err)
		}
		cancel()
	}
	c.mu.Lock()
	procs := slices.Clone(c.procs)
	c.procs = nil
	c.mu.Unlock()
	slices.Reverse(procs)
	stop(procs)
	if c.API != nil {
		c.API.Stop()
	}
	errs = append(errs, cleanup(state{Prefix: c.cfg.Prefix, Index: c.cfg.Index, Mode: string(c.cfg.Mode), Dir: c.cfg.Dir}))
	for _, name := range podNS {
		errs = append(errs, topology.DeleteNS(name))
	}
	c.progress("down in %s", time.Since(began).Round(100*time.Millisecond))
	return errors.Join(errs...)
}

// DownDir tears down the cluster whose directory is dir, from its state
// file alone: after a crash of the process that ran it (its processes died
// with it) or from another process.
func DownDir(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "cluster.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var st state
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("%s/cluster.json: %w", dir, err)
	}
	if err := validPrefix(st.Prefix); err != nil {
		return err
	}
	return cleanup(st)
}

// deletePods deletes every workload and pod, and waits until no node runs
// a container.
func (c *Cluster) deletePods(ctx context.Context) error {
	_, err1 := c.Kubectl(ctx, nil, "delete", "deployments,daemonsets,statefulsets,replicasets,jobs", "--all", "--all-namespaces", "--wait=false")
	_, err2 := c.Kubectl(ctx, nil, "delete", "pods", "--all", "--all-namespaces", "--grace-period=1", "--wait=false")
	if err := errors.Join(err1, err2); err != nil {
		return err
	}
	bin := filepath.Join(c.cfg.Bins.ContainerdDir, "usr", "bin", "ctr")
	return poll(ctx, time.Minute, func() (bool, error) {
		for n := 1; n <= Nodes; n++ {
			sock := filepath.Join(c.nodeDir(n), "containerd", "containerd.sock")
			out, err := exec.CommandContext(ctx, bin, "--address", sock, "--namespace", "k8s.io", "tasks", "list", "-q").Output()
			if err != nil {
				return false, nil
			}
			if strings.TrimSpace(string(out)) != "" {
				return false, nil
			}
		}
		return true, nil
	})
}

// stop ends processes: SIGTERM to each group, then SIGKILL after 10 s.
func stop(procs []*proc) {
	for _, p := range procs {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	}
	deadline := time.After(10 * time.Second)
	for _, p := range procs {
		select {
		case err := <-p.done:
			p.done <- err
		case <-deadline:
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
	}
	for _, p := range procs {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// cleanup removes what a cluster leaves on the host once its own
// processes are gone: the pods' processes (by cgroup), every namespace of
// the prefix (killing what still runs there: containerd's shims), the
// pods' network namespaces, mounts under the directory, cgroups, runc's
// state, CNI's cache entries and the kubelet's links in
// /var/log/containers; and the kernel settings kubelet changed, if still
// changed.
func cleanup(st state) error {
	var errs []error
	p := plan{mode: manifest.Mode(st.Mode), index: st.Index}
	for n := 1; n <= Nodes; n++ {
		killCgroup(cgroupRoot(st.Prefix, n))
	}
	if err := topology.Destroy(st.Prefix, 3*time.Second); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, removePodNetNS(p))
	errs = append(errs, unmountUnder(st.Dir))
	for n := 1; n <= Nodes; n++ {
		errs = append(errs, removeCgroup(cgroupRoot(st.Prefix, n)))
		errs = append(errs, os.RemoveAll(runcRoot(st.Prefix, n)))
	}
	if m, _ := filepath.Glob("/var/lib/cni/results/" + cniNetwork(st.Prefix) + "-*"); len(m) > 0 {
		for _, f := range m {
			os.Remove(f)
		}
	}
	if links, _ := filepath.Glob("/var/log/containers/*"); len(links) > 0 {
		for _, l := range links {
			if t, err := os.Readlink(l); err == nil && strings.HasPrefix(t, st.Dir+"/") {
				os.Remove(l)
			}
		}
	}
	errs = append(errs, leaveSysctls(st.Prefix))
	return errors.Join(errs...)
}

// killCgroup kills every process in root's cgroups (the pods' containers,
// which run in network namespaces of their own).
func killCgroup(root string) {
	hs, _ := cgroupHierarchies()
	for _, h := range hs {
		base := filepath.Join(h, root)
		filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(path)
			for f := range strings.FieldsSeq(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
			return nil
		})
	}
}

// removeCgroup removes root's cgroups, deepest first, once their
// processes are gone.
func removeCgroup(root string) error {
	hs, err := cgroupHierarchies()
	if err != nil {
		return err
	}
	var errs []error
	for _, h := range hs {
		base := filepath.Join(h, root)
		var dirs []string
		filepath.WalkDir(base, func(path string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		slices.Reverse(dirs)
		for _, d := range dirs {
			err := poll(context.Background(), 10*time.Second, func() (bool, error) {
				err := unix.Rmdir(d)
				return err == nil || errors.Is(err, unix.ENOENT), nil
			})
			if err != nil {
				errs = append(errs, fmt.Errorf("remove cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

// removePodNetNS removes the network namespaces containerd made for pods
// (/run/netns/cni-*) that hold an address of this cluster's pod CIDRs:
// only this cluster's, whatever else runs.
func removePodNetNS(p plan) error {
	names, err := podNetNS(p)
	var errs []error
	for _, name := range names {
		errs = append(errs, topology.DeleteNS(name))
	}
	return errors.Join(append(errs, err)...)
}

// podNetNS returns the names of the pods' network namespaces
// (/run/netns/cni-*) that hold an address of the cluster's pod CIDRs.
func podNetNS(p plan) ([]string, error) {
	names, err := topology.List("cni-")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, name := range names {
		path := nsrun.Path(name)
		ours := false
		_ = nsrun.Do(path, func() error {
			addrs, err := net.InterfaceAddrs()
			if err != nil {
				return err
			}
			for _, a := range addrs {
				if ipn, ok := a.(*net.IPNet); ok {
					if ip, ok := netip.AddrFromSlice(ipn.IP); ok && p.contains(ip.Unmap()) {
						ours = true
					}
				}
			}
			return nil
		})
		if ours {
			out = append(out, name)
		}
	}
	return out, nil
}

// unmountUnder lazily unmounts every mount under dir, deepest first
// (kubelet's volumes, containerd's snapshots and shm).
func unmountUnder(dir string) error {
	if dir == "" || dir == "/" {
		return fmt.Errorf("unmount under %q: refused", dir)
	}
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var mounts []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(unescapeMount(f[4]), dir+"/") {
			mounts = append(mounts, unescapeMount(f[4]))
		}
	}
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	var errs []error
	for _, m := range mounts {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
