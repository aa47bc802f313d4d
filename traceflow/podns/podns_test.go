package podns

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The tests build namespaces like a node's pods: bind-mounted ones (as
// runtimes and `ip netns` make them) and one held only by a process (as a
// pause container holds it), each with an eth0 in IPv4-only, IPv6-only or
// dual-stack. Addresses are lab addresses, inside those namespaces only.

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2")
	}
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// pod adds eth0 (a veth whose peer stays in the namespace) with addrs;
// ip is the command that runs ip in the namespace.
func pod(t *testing.T, ip []string, addrs ...string) {
	t.Helper()
	run(t, append(ip, "link", "add", "eth0", "type", "veth", "peer", "name", "peer0")...)
	run(t, append(ip, "link", "set", "eth0", "up")...)
	for _, a := range addrs {
		args := append(ip, "addr", "add", a, "dev", "eth0")
		if strings.Contains(a, ":") {
			args = append(args, "nodad")
		}
		run(t, args...)
	}
}

// netnsPod makes a bind-mounted namespace (ip netns add) with addrs.
func netnsPod(t *testing.T, name string, addrs ...string) string {
	t.Helper()
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	pod(t, []string{"ip", "-n", name}, addrs...)
	return filepath.Join("/run/netns", name)
}

func prefix(t *testing.T) string { return fmt.Sprintf("dftest-podns-%d-", os.Getpid()) }

func TestFindThreeModes(t *testing.T) {
	needRoot(t)
	p := prefix(t)
	v4 := netnsPod(t, p+"v4", "198.18.77.10/32")
	v6 := netnsPod(t, p+"v6", "fd00:10:77::20/128")
	dual := netnsPod(t, p+"dual", "198.18.77.30/32", "fd00:10:77::30/128")

	// A namespace no bind mount names: only its process holds it.
	sleeper := exec.Command("unshare", "--net", "--", "sleep", "600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	pid := fmt.Sprint(sleeper.Process.Pid)
	procPath := filepath.Join("/proc", pid, "ns", "net")
	deadline := time.Now().Add(time.Minute)
	for { // unshare has switched namespace once the link differs from ours
		a, _ := inode(procPath)
		b, _ := inode("/proc/self/ns/net")
		if a != 0 && a != b {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("unshare did not enter a new namespace")
		}
		time.Sleep(10 * time.Millisecond)
	}
	pod(t, []string{"nsenter", "--net=" + procPath, "ip"}, "198.18.77.40/32", "fd00:10:77::40/128")

	f := &Finder{Dirs: []string{"/run/netns"}, SkipOwn: true}
	for _, c := range []struct {
		mode, addr, path string
	}{
		{"ipv4", "198.18.77.10", v4},
		{"ipv6", "fd00:10:77::20", v6},
		{"dual/ipv4", "198.18.77.30", dual},
		{"dual/ipv6", "fd00:10:77::30", dual},
		{"dual/ipv4-mapped", "::ffff:198.18.77.30", dual},
		{"process-held/ipv4", "198.18.77.40", procPath},
		{"process-held/ipv6", "fd00:10:77::40", procPath},
	} {
		ns, err := f.Find(netip.MustParseAddr(c.addr))
		if err != nil {
			t.Errorf("%s: %v", c.mode, err)
			continue
		}
		want, _ := inode(c.path)
		if ns.Inode != want || ns.Iface != "eth0" {
			t.Errorf("%s: got %+v, want the namespace of %s (inode %d) on eth0", c.mode, ns, c.path, want)
		}
		if strings.HasPrefix(c.mode, "process-held") && !strings.HasPrefix(ns.Path, "/proc/") {
			t.Errorf("%s: path %s", c.mode, ns.Path)
		}
	}
	if n := f.Scans(); n != 1 {
		t.Errorf("%d scans for answers one scan gave", n)
	}
	if _, err := f.Find(netip.MustParseAddr("198.18.77.99")); !errors.Is(err, ErrNotFound) {
		t.Errorf("absent address: %v", err)
	}
}

// TestPodsComeAndGo: the pod that held an address is gone and another has
// it now: the cached answer is checked and not returned.
func TestPodsComeAndGo(t *testing.T) {
	needRoot(t)
	p := prefix(t)
	netnsPod(t, p+"old", "198.18.77.50/32", "fd00:10:77::50/128")
	f := &Finder{Dirs: []string{"/run/netns"}, SkipOwn: true}
	for _, a := range []string{"198.18.77.50", "fd00:10:77::50"} {
		if _, err := f.Find(netip.MustParseAddr(a)); err != nil {
			t.Fatal(err)
		}
	}
	run(t, "ip", "netns", "del", p+"old")
	newPath := netnsPod(t, p+"new", "198.18.77.50/32", "fd00:10:77::50/128")
	want, _ := inode(newPath)
	for _, a := range []string{"198.18.77.50", "fd00:10:77::50"} {
		ns, err := f.Find(netip.MustParseAddr(a))
		if err != nil || ns.Inode != want {
			t.Errorf("%s after the pod moved: %+v %v, want inode %d", a, ns, err, want)
		}
	}
	// The address leaves its interface: not found, not a stale answer.
	run(t, "ip", "-n", p+"new", "addr", "del", "198.18.77.50/32", "dev", "eth0")
	if ns, err := f.Find(netip.MustParseAddr("198.18.77.50")); !errors.Is(err, ErrNotFound) {
		t.Errorf("removed address: %+v %v", ns, err)
	}
}

// BenchmarkScan measures one scan of the node's namespaces (the cost of a
// cache miss) with 20 pods of both families.
func BenchmarkScan(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	p := fmt.Sprintf("dfbench-podns-%d-", os.Getpid())
	for i := range 20 {
		name := fmt.Sprintf("%s%d", p, i)
		if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
			b.Fatalf("%v %s", err, out)
		}
		b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
		for _, args := range [][]string{
			{"link", "add", "eth0", "type", "veth", "peer", "name", "peer0"},
			{"addr", "add", fmt.Sprintf("198.18.78.%d/32", i+1), "dev", "eth0"},
			{"addr", "add", fmt.Sprintf("fd00:10:78::%x/128", i+1), "dev", "eth0", "nodad"},
		} {
			if out, err := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput(); err != nil {
				b.Fatalf("%v %s", err, out)
			}
		}
	}
	f := &Finder{Dirs: []string{"/run/netns"}, SkipOwn: true}
	b.ReportAllocs()
	for b.Loop() {
		f.mu.Lock()
		if err := f.scanLocked(); err != nil {
			b.Fatal(err)
		}
		f.mu.Unlock()
	}
	if _, err := f.Find(netip.MustParseAddr("fd00:10:78::14")); err != nil {
		b.Fatal(err)
	}
}
