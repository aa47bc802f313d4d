package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/inject"
	"github.com/dualflow/dualflow/traceflow/packet"
	"github.com/dualflow/dualflow/traceflow/podns"
)

// The test builds a node as a CNI would, in namespaces of its own: a node
// namespace that routes, routed pods (a /32 and /128 on eth0, a proxy-ARP
// gateway, Calico-style), a pod on a bridge, and single-family pods; no lab
// code. Probes are sent from a pod found by its address and must arrive at
// the destination pod.

func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
}

type nodeEnv struct {
	t      *testing.T
	prefix string
	node   string // node namespace name
}

func (e *nodeEnv) ip(args ...string) {
	e.t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		e.t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func (e *nodeEnv) sysctl(ns, kv string) {
	e.t.Helper()
	if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", kv).CombinedOutput(); err != nil {
		e.t.Fatalf("sysctl %s in %s: %v\n%s", kv, ns, err, out)
	}
}

func (e *nodeEnv) netns(name string) string {
	e.t.Helper()
	e.ip("netns", "add", name)
	e.t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	e.ip("-n", name, "link", "set", "lo", "up")
	return name
}

func newNode(t *testing.T) *nodeEnv { return newNodeNamed(t, "node") }

func newNodeNamed(t *testing.T, name string) *nodeEnv {
	e := &nodeEnv{t: t, prefix: fmt.Sprintf("dftest-%s-%d-", name, os.Getpid())}
	e.node = e.netns(e.prefix + "n")
	e.sysctl(e.node, "net.ipv4.ip_forward=1")
	e.sysctl(e.node, "net.ipv6.conf.all.forwarding=1")
	// The proxy-ARP gateway answers from an address of the node.
	e.ip("-n", e.node, "addr", "add", "198.18.0.1/32", "dev", "lo")
	e.ip("-n", e.node, "link", "add", "br0", "type", "bridge")
	e.ip("-n", e.node, "addr", "add", "198.18.202.254/24", "dev", "br0")
	e.ip("-n", e.node, "addr", "add", "fd00:10:202::fe/64", "dev", "br0", "nodad")
	e.ip("-n", e.node, "link", "set", "br0", "up")
	return e
}

// routedPod adds a Calico-style pod with addrs (one or both families).
func (e *nodeEnv) routedPod(name string, addrs ...string) string {
	ns := e.netns(e.prefix + name)
	host := "v" + name
	e.ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", host, "netns", e.node)
	e.ip("-n", e.node, "link", "set", host, "address", "ee:ee:ee:ee:ee:ee", "up")
	e.sysctl(e.node, "net.ipv4.conf."+host+".proxy_arp=1")
	e.ip("-n", ns, "link", "set", "eth0", "up")
	for _, a := range addrs {
		if strings.Contains(a, ":") {
			e.ip("-n", ns, "addr", "add", a+"/128", "dev", "eth0", "nodad")
			e.ip("-n", ns, "-6", "route", "add", "default", "via", "fe80::ecee:eeff:feee:eeee", "dev", "eth0")
			e.ip("-n", e.node, "-6", "route", "add", a+"/128", "dev", host)
		} else {
			e.ip("-n", ns, "addr", "add", a+"/32", "dev", "eth0")
			e.ip("-n", ns, "route", "add", "198.18.0.1", "dev", "eth0", "scope", "link")
			e.ip("-n", ns, "route", "add", "default", "via", "198.18.0.1", "dev", "eth0")
			e.ip("-n", e.node, "route", "add", a+"/32", "dev", host)
		}
	}
	return ns
}

// bridgedPod adds a pod on br0 (198.18.202.0/24, fd00:10:202::/64).
func (e *nodeEnv) bridgedPod(name, v4, v6 string) string {
	ns := e.netns(e.prefix + name)
	host := "v" + name
	e.ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", host, "netns", e.node)
	e.ip("-n", e.node, "link", "set", host, "master", "br0", "up")
	e.ip("-n", ns, "link", "set", "eth0", "up")
	e.ip("-n", ns, "addr", "add", v4+"/24", "dev", "eth0")
	e.ip("-n", ns, "addr", "add", v6+"/64", "dev", "eth0", "nodad")
	e.ip("-n", ns, "route", "add", "default", "via", "198.18.202.254")
	e.ip("-n", ns, "-6", "route", "add", "default", "via", "fd00:10:202::fe")
	return ns
}

func TestInjectFromPodFoundByAddress(t *testing.T) {
	needRoot(t)
	e := newNode(t)
	e.routedPod("a", "198.18.201.1", "fd00:10:201::1") // dual-stack
	dst := e.routedPod("b", "198.18.201.2", "fd00:10:201::2")
	e.routedPod("c4", "198.18.201.3")   // IPv4-only
	e.routedPod("c6", "fd00:10:201::4") // IPv6-only
	e.bridgedPod("br", "198.18.202.5", "fd00:10:202::5")

	in := &Injector{Pods: &podns.Finder{Dirs: []string{"/run/netns"}}, NodeNS: filepath.Join("/run/netns", e.node)}
	dstPath := filepath.Join("/run/netns", dst)
	tag := uint8(packet.MinTag)
	for _, c := range []struct{ name, src, dst string }{
		{"dual-stack/IPv4", "198.18.201.1", "198.18.201.2"},
		{"dual-stack/IPv6", "fd00:10:201::1", "fd00:10:201::2"},
		{"IPv4-only", "198.18.201.3", "198.18.201.2"},
		{"IPv6-only", "fd00:10:201::4", "fd00:10:201::2"},
		{"bridged/IPv4", "198.18.202.5", "198.18.201.2"},
		{"bridged/IPv6", "fd00:10:202::5", "fd00:10:201::2"},
	} {
		t.Run(c.name, func(t *testing.T) {
			tag++
			p := traceflow.Probe{Src: netip.MustParseAddr(c.src), Dst: netip.MustParseAddr(c.dst), Protocol: traceflow.UDP,
				SrcPort: 40000 + uint16(tag), DstPort: 8080, Tag: tag}
			src, err := in.Locate(p.Src)
			if err != nil {
				t.Fatal(err)
			}
			frame, err := src.Frame(p)
			if err != nil {
				t.Fatal(err)
			}
			cap, err := inject.Listen(dstPath, "eth0")
			if err != nil {
				t.Fatal(err)
			}
			defer cap.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			got := make(chan packet.Seen, 1)
			go func() {
				for {
					f, err := cap.Next(ctx)
					if err != nil {
						return
					}
					if s, ok := packet.Match(f, p.Tag, p.Src, p.ProtoNumber(), p.SrcPort); ok {
						got <- s
						return
					}
				}
			}()
			// Re-send each second: the node may hold the first copy while it
			// resolves the destination pod's address.
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for {
				if err := src.Send(frame); err != nil {
					t.Fatal(err)
				}
				select {
				case s := <-got:
					if s.Dst != p.Dst || s.DstPort != p.DstPort {
						t.Errorf("arrived as %+v", s)
					}
					return
				case <-tick.C:
				case <-ctx.Done():
					t.Fatalf("probe from %s (sent to %s) never reached %s", p.Src, src.DstMAC, p.Dst)
				}
			}
		})
	}
	if _, err := in.Locate(netip.MustParseAddr("198.18.201.99")); !errors.Is(err, ErrPodNotOnNode) {
		t.Errorf("absent pod: %v", err)
	}
}

// TestLocateOnItsOwnNode puts a pod with the same addresses on two nodes
// of one host (labs side by side do that): each node's injector finds its
// own pod, through the veth peer in its namespace.
func TestLocateOnItsOwnNode(t *testing.T) {
	needRoot(t)
	n1, n2 := newNodeNamed(t, "na"), newNodeNamed(t, "nb")
	p1 := n1.routedPod("a", "198.18.201.1", "fd00:10:201::1")
	p2 := n2.routedPod("a", "198.18.201.1", "fd00:10:201::1")
	pods := &podns.Finder{Dirs: []string{"/run/netns"}}
	for _, c := range []struct {
		node, pod string
	}{{n1.node, p1}, {n2.node, p2}} {
		in := &Injector{Pods: pods, NodeNS: filepath.Join("/run/netns", c.node)}
		for _, a := range []string{"198.18.201.1", "fd00:10:201::1"} {
			src, err := in.Locate(netip.MustParseAddr(a))
			if err != nil {
				t.Fatalf("%s on %s: %v", a, c.node, err)
			}
			if src.NS.Path != filepath.Join("/run/netns", c.pod) || src.HostIface != "va" {
				t.Errorf("%s on %s: found %s (%s), want %s", a, c.node, src.NS.Path, src.HostIface, c.pod)
			}
		}
	}
	// A third node has neither.
	n3 := newNodeNamed(t, "nc")
	in := &Injector{Pods: pods, NodeNS: filepath.Join("/run/netns", n3.node)}
	if _, err := in.Locate(netip.MustParseAddr("198.18.201.1")); !errors.Is(err, ErrPodNotOnNode) {
		t.Errorf("node without the pod: %v", err)
	}
}
