// Package cluster brings up a real Kubernetes cluster on this machine,
// offline, for the real-cluster tier and `make cluster`: etcd,
// kube-apiserver, kube-controller-manager and kube-scheduler in a
// control-plane network namespace, and two nodes, each a network namespace
// running containerd, kubelet and kube-proxy (nftables mode), with pods
// networked by the CNI bridge and host-local plugins, in one of three IP
// modes (ipv4, ipv6, dual). Nothing of it touches the host's network: the
// namespaces are joined by the lab's fabric bridge (lab/topology), and the
// harness's own clients dial into the control plane's namespace.
//
// The binaries come from scripts/k8s-cluster.sh (built once, cached in
// .cache). The recipe, with every setting this machine needs, is in
// ../shared/notes/real-k8s.md; this package is its code.
//
// What it changes on the host, and undoes in Down (also after a crash,
// from the prefix alone): three global sysctls that kubelet rewrites at
// start (restored as soon as the nodes are up), cgroups named after the
// prefix in every hierarchy, mounts under the cluster's directory, the
// network namespaces containerd creates for pods (/run/netns/cni-*), and
// CNI's result cache entries of the cluster's network.
package cluster

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/dualflow/dualflow/lab/manifest"
)

// MaxIndex bounds Config.Index: clusters with different indexes have
// disjoint addresses and can run side by side.
const MaxIndex = 7

// plan is the address plan of a cluster: all inside 198.19.128.0/17 and
// fd00:10:c0::/45, one /20 and one /48 per index.
//
//	                  IPv4                     IPv6
//	nodes network     198.19.B.0/24            fd00:10:cI::/64
//	  control plane   .1                       ::1
//	  node n          .10+n                    ::10+n (hex)
//	pod CIDR          198.19.B+4.0/22          fd00:10:cI:100::/56
//	  node n          198.19.B+3+n.0/24        fd00:10:cI:10n::/64
//	services          198.19.B+8.0/24          fd00:10:cI:200::/112
//	  cluster DNS     .10                      ::a
//
// with B = 128 + 16×index and cI = c0 + index.
type plan struct {
	mode  manifest.Mode
	index int
}

func (p plan) v4() bool { return p.mode != manifest.ModeIPv6 }
func (p plan) v6() bool { return p.mode != manifest.ModeIPv4 }

func (p plan) b() int { return 128 + 16*p.index }

func (p plan) pfx4(third, bits int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("198.19.%d.0/%d", third, bits))
}

func (p plan) pfx6(suffix string, bits int) netip.Prefix {
	return netip.MustParsePrefix(fmt.Sprintf("fd00:10:%x:%s/%d", 0xc0+p.index, suffix, bits))
}

// families returns the IPv4 and IPv6 values that the mode has, IPv4
// first (the cluster's primary family in dual mode).
func (p plan) families(v4, v6 netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	if p.v4() {
		out = append(out, v4)
	}
	if p.v6() {
		out = append(out, v6)
	}
	return out
}

func (p plan) nodeNets() []netip.Prefix {
	return p.families(p.pfx4(p.b(), 24), p.pfx6(":", 64))
}

// host returns the address of prefix p whose last byte is b.
func host(p netip.Prefix, b byte) netip.Addr {
	s := p.Addr().AsSlice()
	s[len(s)-1] = b
	a, _ := netip.AddrFromSlice(s)
	return a
}

// hostAddrs returns the addresses, with the nodes network's length, of
// host h: 1 for the control plane, 10+n for node n.
func (p plan) hostAddrs(h int) []netip.Prefix {
	var out []netip.Prefix
	for _, n := range p.nodeNets() {
		out = append(out, netip.PrefixFrom(host(n, byte(h)), n.Bits()))
	}
	return out
}

func addrsOf(ps []netip.Prefix) []netip.Addr {
	out := make([]netip.Addr, len(ps))
	for i, p := range ps {
		out[i] = p.Addr()
	}
	return out
}

func (p plan) controlPlane() []netip.Addr { return addrsOf(p.hostAddrs(1)) }
func (p plan) nodeIPs(n int) []netip.Addr { return addrsOf(p.hostAddrs(10 + n)) }

func (p plan) podCIDRs() []netip.Prefix {
	return p.families(p.pfx4(p.b()+4, 22), p.pfx6("100::", 56))
}

func (p plan) podSubnets(n int) []netip.Prefix {
	return p.families(p.pfx4(p.b()+3+n, 24), p.pfx6(fmt.Sprintf("10%d::", n), 64))
}

func (p plan) serviceCIDRs() []netip.Prefix {
	return p.families(p.pfx4(p.b()+8, 24), p.pfx6("200::", 112))
}

func (p plan) clusterDNS() []netip.Addr {
	var out []netip.Addr
	for _, s := range p.serviceCIDRs() {
		out = append(out, host(s, 10))
	}
	return out
}

// apiAddr is the address the API server listens on and advertises: of the
// primary family.
func (p plan) apiAddr() netip.Addr { return p.controlPlane()[0] }

func join[T fmt.Stringer](xs []T) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = x.String()
	}
	return strings.Join(s, ",")
}

// contains reports whether a is in one of the cluster's prefixes.
func (p plan) contains(a netip.Addr) bool {
	for _, set := range [][]netip.Prefix{p.nodeNets(), p.podCIDRs(), p.serviceCIDRs()} {
		for _, pf := range set {
			if pf.Contains(a) {
				return true
			}
		}
	}
	return false
}
