// Package podns finds, on a node, the network namespace that holds a pod's
// address, without asking a container runtime: the node agent of traceflow
// injects a probe from there and captures at the destination pod there.
//
// It scans the namespaces a node can see: the bind mounts container
// runtimes and `ip netns` make (/run/netns, /var/run/netns, /run/docker/netns)
// and every process's /proc/<pid>/ns/net (a pod's pause process holds its
// namespace). Namespaces are told apart by inode, so a pod with fifty
// processes is read once. Each is entered only by a netlink socket opened in
// it (vishvananda/netlink's handle), and its interface addresses are listed.
//
// Pods come and go, and addresses are reused: a scan's answers are cached
// until the next miss, and an answer is checked again (same namespace inode,
// the address still on the interface) before it is returned.
package podns

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// DefaultDirs are where container runtimes and iproute2 bind-mount network
// namespaces.
var DefaultDirs = []string{"/run/netns", "/var/run/netns", "/run/docker/netns"}

// ErrNotFound means no namespace of the node holds the address.
var ErrNotFound = errors.New("no network namespace on this node has the address")

// Namespace is where an address lives.
type Namespace struct {
	// Path opens the namespace (a bind mount, or /proc/<pid>/ns/net while
	// that process lives).
	Path string
	// Iface is the interface holding the address (a pod's eth0).
	Iface string
	// Inode identifies the namespace.
	Inode uint64
}

// missTTL is how long an address not found in a scan is answered "not
// found" without scanning again.
const missTTL = time.Second

// Finder finds namespaces by address. The zero value scans DefaultDirs and
// /proc. It is safe for concurrent use.
type Finder struct {
	// Dirs are the bind-mount directories to scan (nil: DefaultDirs).
	Dirs []string
	// Proc is the proc file system (empty: /proc).
	Proc string
	// SkipOwn leaves out the caller's own namespace (the node's): a probe
	// from a host-network pod is not what a pod address means.
	SkipOwn bool

	mu        sync.Mutex
	cache     map[netip.Addr][]Namespace
	scannedAt time.Time
	scans     int
}

// ifaceAddr is an address of an interface.
type ifaceAddr struct {
	addr  netip.Addr
	iface string
}

// Scans returns how many times the namespaces were scanned.
func (f *Finder) Scans() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.scans
}

// Find returns the namespace holding addr (IPv4-mapped IPv6 is unmapped);
// the first one found when several do (see FindAll).
func (f *Finder) Find(addr netip.Addr) (Namespace, error) {
	all, err := f.FindAll(addr)
	if err != nil {
		return Namespace{}, err
	}
	return all[0], nil
}

// FindAll returns every namespace holding addr. On a node of a cluster a
// pod address is in one namespace; several labs on one host (or a stale
// namespace) can hold the same address, and the caller then keeps the one
// that is its node's (its veth peer is in the node's namespace).
func (f *Finder) FindAll(addr netip.Addr) ([]Namespace, error) {
	addr = addr.Unmap()
	if !addr.IsValid() {
		return nil, errors.New("podns: invalid address")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if nss, ok := f.cache[addr]; ok && !slices.ContainsFunc(nss, func(ns Namespace) bool { return !f.still(ns, addr) }) {
		return slices.Clone(nss), nil
	}
	if _, cached := f.cache[addr]; !cached && time.Since(f.scannedAt) < missTTL {
		// Scanned a moment ago and not there: most targets of a Service
		// are on other nodes, and each would cost a scan of every
		// namespace otherwise.
		return nil, fmt.Errorf("%s: %w", addr, ErrNotFound)
	}
	if err := f.scanLocked(); err != nil {
		return nil, err
	}
	if nss, ok := f.cache[addr]; ok {
		return slices.Clone(nss), nil
	}
	return nil, fmt.Errorf("%s: %w", addr, ErrNotFound)
}

// still reports whether ns is still the namespace holding addr on iface.
func (f *Finder) still(ns Namespace, addr netip.Addr) bool {
	if ino, err := inode(ns.Path); err != nil || ino != ns.Inode {
		return false
	}
	addrs, err := listAddrs(ns.Path)
	if err != nil {
		return false
	}
	return slices.Contains(addrs, ifaceAddr{addr, ns.Iface})
}

// scanLocked rebuilds the cache from every namespace of the node.
func (f *Finder) scanLocked() error {
	f.scans++
	paths, err := f.candidates()
	if err != nil {
		return err
	}
	own := uint64(0)
	if f.SkipOwn {
		own, _ = inode(filepath.Join(f.proc(), "self", "ns", "net"))
	}
	cache := map[netip.Addr][]Namespace{}
	seen := map[uint64]bool{}
	for _, p := range paths {
		ino, err := inode(p)
		if err != nil || seen[ino] || ino == own {
			continue // gone since it was listed, or read already
		}
		seen[ino] = true
		addrs, err := listAddrs(p)
		if err != nil {
			continue // gone meanwhile
		}
		for _, a := range addrs {
			cache[a.addr] = append(cache[a.addr], Namespace{Path: p, Iface: a.iface, Inode: ino})
		}
	}
	f.cache, f.scannedAt = cache, time.Now()
	return nil
}

func (f *Finder) proc() string {
	if f.Proc != "" {
		return f.Proc
	}
	return "/proc"
}

// candidates lists bind mounts first (their paths outlive processes), then
// each process's namespace link.
func (f *Finder) candidates() ([]string, error) {
	dirs := f.Dirs
	if dirs == nil {
		dirs = DefaultDirs
	}
	var paths []string
	for _, d := range dirs {
		ents, err := os.ReadDir(d)
		if err != nil {
			continue // absent on this node
		}
		for _, e := range ents {
			paths = append(paths, filepath.Join(d, e.Name()))
		}
	}
	ents, err := os.ReadDir(f.proc())
	if err != nil {
		return nil, fmt.Errorf("podns: %w", err)
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err == nil {
			paths = append(paths, filepath.Join(f.proc(), e.Name(), "ns", "net"))
		}
	}
	return paths, nil
}

// inode returns the inode of the namespace at path.
func inode(path string) (uint64, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}
