// Package ctlab builds, for the exporter's tests, a small routed network in
// network namespaces: a client and a server, each behind its own veth to a
// router namespace whose kernel conntrack tracks, DNATs and SNATs the
// traffic between them. Nothing changes in the root namespace.
//
//	client (eth0 198.18.10.1, fd00:10:10::1) ── va  router  vb ── (eth0 198.18.11.1, fd00:10:11::1) server
//
// The router has forwarding, nf_conntrack_acct and nf_conntrack_timestamp on
// and this ruleset (the ct expressions also start tracking in the netns):
//
//   - DNAT: VIP:80 (198.19.0.10, fd00:10:ff::10) → server:8080, TCP and UDP;
//   - SNAT: traffic to server port 8081 is masqueraded to the router's
//     server-side address;
//   - every new forwarded connection gets ct mark 0x42 and ct label bit 3.
//
// Tests that use it need root and ip, nft and conntrack (looked up on PATH,
// then in the sbin directories): Require skips them otherwise, or fails
// them when DUALFLOW_E2E=1. The first New of a test process removes the
// namespaces that test processes now gone left behind (a test binary
// killed by its timeout skips t.Cleanup).
package ctlab

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dualflow/dualflow/lab/topology"
	"github.com/dualflow/dualflow/nsrun"
)

// Addresses of the lab, per IP family.
type Family struct {
	Version                  uint8
	Client, Server, VIP      netip.Addr
	RouterClient, RouterSide netip.Addr // router's addresses towards client and server
}

// Families are the lab's IPv4 and IPv6 addressing.
var Families = []Family{
	{4, netip.MustParseAddr("198.18.10.1"), netip.MustParseAddr("198.18.11.1"), netip.MustParseAddr("198.19.0.10"),
		netip.MustParseAddr("198.18.10.254"), netip.MustParseAddr("198.18.11.254")},
	{6, netip.MustParseAddr("fd00:10:10::1"), netip.MustParseAddr("fd00:10:11::1"), netip.MustParseAddr("fd00:10:ff::10"),
		netip.MustParseAddr("fd00:10:10::fe"), netip.MustParseAddr("fd00:10:11::fe")},
}

// Ports of the lab's services.
const (
	VIPPort    = 80   // DNAT-ed to ServerPort
	ServerPort = 8080 // plain
	SNATPort   = 8081 // masqueraded by the router
	Mark       = 0x42 // ct mark of every forwarded connection
)

const ruleset = `
table inet dfx {
	chain pre {
		type nat hook prerouting priority dstnat;
		ip daddr 198.19.0.10 tcp dport 80 dnat ip to 198.18.11.1:8080
		ip daddr 198.19.0.10 udp dport 80 dnat ip to 198.18.11.1:8080
		ip6 daddr fd00:10:ff::10 tcp dport 80 dnat ip6 to [fd00:10:11::1]:8080
		ip6 daddr fd00:10:ff::10 udp dport 80 dnat ip6 to [fd00:10:11::1]:8080
	}
	chain post {
		type nat hook postrouting priority srcnat;
		oifname "vb" tcp dport 8081 masquerade
		oifname "vb" udp dport 8081 masquerade
	}
	chain forward_filter {
		type filter hook forward priority filter;
		ct state new ct mark set 0x42 ct label set 3 counter
	}
}
`

// tools are the commands the lab runs.
var tools = []string{"ip", "nft", "conntrack"}

// command returns argv with its command resolved by topology.Tool when it is
// one of tools.
func command(argv []string) []string {
	for _, tool := range tools {
		if argv[0] == tool {
			if p, err := topology.Tool(tool); err == nil {
				return append([]string{p}, argv[1:]...)
			}
		}
	}
	return argv
}

// Require skips the test unless it runs as root with ip, nft and
// conntrack available; with DUALFLOW_E2E=1 it fails instead of skipping.
func Require(t testing.TB) {
	t.Helper()
	var why string
	if os.Geteuid() != 0 {
		why = "needs root (network namespaces)"
	} else {
		for _, tool := range tools {
			if _, err := topology.Tool(tool); err != nil {
				why = "needs " + err.Error()
			}
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("DUALFLOW_E2E") == "1" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// Lab is a built network. Its namespaces are removed by the test's cleanup.
type Lab struct {
	Router, Client, Server string // namespace names
}

var seq atomic.Int32

// prefixRoot starts every namespace name of the lab.
const prefixRoot = "dfx-"

var sweepOnce sync.Once

// sweepDeadRuns removes the labs of test processes that no longer exist:
// namespaces dfx-<tag>-<pid>-<n>-<role> whose pid is gone. It reports
// what it could not remove on t's log.
func sweepDeadRuns(t testing.TB) {
	names, err := topology.List(prefixRoot)
	if err != nil {
		t.Logf("ctlab: sweep: %v", err)
		return
	}
	done := map[string]bool{}
	for _, n := range names {
		f := strings.Split(n, "-")
		if len(f) < 5 {
			continue
		}
		pid, err := strconv.Atoi(f[len(f)-3])
		if err != nil || pid <= 0 || topology.Alive(pid) {
			continue
		}
		prefix := strings.Join(f[:len(f)-1], "-") + "-"
		if done[prefix] {
			continue
		}
		done[prefix] = true
		if err := topology.Destroy(prefix, time.Second); err != nil {
			t.Logf("ctlab: sweep %s: %v", prefix, err)
		}
	}
}

// New builds a lab whose namespaces are named dfx-<tag>-<pid>-<n>-{r,c,s}
// (tag without dashes) and registers its teardown with t.Cleanup.
func New(t testing.TB, tag string) *Lab {
	t.Helper()
	Require(t)
	sweepOnce.Do(func() { sweepDeadRuns(t) })
	base := fmt.Sprintf("%s%s-%d-%d", prefixRoot, tag, os.Getpid(), seq.Add(1))
	l := &Lab{Router: base + "-r", Client: base + "-c", Server: base + "-s"}
	t.Cleanup(func() { l.destroy(t) })
	ip, err := topology.Tool("ip")
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ip, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	for _, ns := range []string{l.Router, l.Client, l.Server} {
		run("netns", "add", ns)
		run("-n", ns, "link", "set", "lo", "up")
	}
	// Sysctls first: counters and timestamps only apply to connections
	// created after they are set.
	l.Sysctl(t, l.Router, map[string]string{
		"net.ipv4.ip_forward": "1", "net.ipv6.conf.all.forwarding": "1",
		"net.netfilter.nf_conntrack_acct": "1", "net.netfilter.nf_conntrack_timestamp": "1",
	})
	for _, side := range []struct {
		dev, ns string
		idx     int
	}{{"va", l.Client, 0}, {"vb", l.Server, 1}} {
		run("-n", l.Router, "link", "add", side.dev, "type", "veth", "peer", "name", "eth0", "netns", side.ns)
		for _, f := range Families {
			host, router := f.Client, f.RouterClient
			if side.idx == 1 {
				host, router = f.Server, f.RouterSide
			}
			bits := 24
			if f.Version == 6 {
				bits = 64
			}
			run("-n", side.ns, "addr", "add", fmt.Sprintf("%s/%d", host, bits), "dev", "eth0", "nodad")
			run("-n", l.Router, "addr", "add", fmt.Sprintf("%s/%d", router, bits), "dev", side.dev, "nodad")
		}
		run("-n", side.ns, "link", "set", "eth0", "up")
		run("-n", l.Router, "link", "set", side.dev, "up")
		for _, f := range Families {
			router := f.RouterClient
			if side.idx == 1 {
				router = f.RouterSide
			}
			run("-n", side.ns, fmt.Sprintf("-%d", f.Version), "route", "add", "default", "via", router.String())
		}
	}
	if _, err := nsrun.Output(context.Background(), nsrun.Path(l.Router), []byte(ruleset), command([]string{"nft", "-f", "-"})...); err != nil {
		t.Fatal(err)
	}
	return l
}

func (l *Lab) destroy(t testing.TB) {
	for _, ns := range []string{l.Client, l.Server, l.Router} {
		if err := topology.DeleteNS(ns); err != nil { // a namespace New did not create is no error
			t.Error(err)
		}
	}
}

// Sysctl sets sysctls in namespace ns.
func (l *Lab) Sysctl(t testing.TB, ns string, kv map[string]string) {
	t.Helper()
	err := nsrun.Do(nsrun.Path(ns), func() error {
		for k, v := range kv {
			if err := os.WriteFile("/proc/sys/"+strings.ReplaceAll(k, ".", "/"), []byte(v), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Run runs a command in namespace ns and returns its output. ip, nft and
// conntrack are found in the sbin directories when PATH lacks them.
func (l *Lab) Run(t testing.TB, ns string, argv ...string) string {
	t.Helper()
	out, err := nsrun.Output(context.Background(), nsrun.Path(ns), nil, command(argv)...)
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}

// Echo serves TCP and UDP echo on the server's addresses, ports ServerPort
// and SNATPort, until the test ends.
func (l *Lab) Echo(t testing.TB) {
	t.Helper()
	var wg sync.WaitGroup
	var closers []io.Closer
	err := nsrun.Do(nsrun.Path(l.Server), func() error {
		for _, port := range []int{ServerPort, SNATPort} {
			ln, err := net.Listen("tcp", fmt.Sprintf("[::]:%d", port))
			if err != nil {
				return err
			}
			pc, err := net.ListenPacket("udp", fmt.Sprintf("[::]:%d", port))
			if err != nil {
				return err
			}
			closers = append(closers, ln, pc)
			wg.Add(2)
			go func() {
				defer wg.Done()
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						io.Copy(c, c)
					}()
				}
			}()
			go func() {
				defer wg.Done()
				buf := make([]byte, 65536)
				for {
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					pc.WriteTo(buf[:n], from)
				}
			}()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range closers {
			c.Close()
		}
		wg.Wait()
	})
}

// Exchange dials network ("tcp" or "udp") from the client to dst, sends
// payload, reads the echo back and closes. It returns the client's local
// address.
func (l *Lab) Exchange(t testing.TB, network string, dst netip.AddrPort, payload []byte) netip.AddrPort {
	t.Helper()
	var c net.Conn
	err := nsrun.Do(nsrun.Path(l.Client), func() error {
		var err error
		c, err = net.DialTimeout(network, dst.String(), 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("%s %v: read echo: %v", network, dst, err)
	}
	if !bytes.Equal(got, payload) {
		t.Fatalf("%s %v: echo differs", network, dst)
	}
	return netip.MustParseAddrPort(c.LocalAddr().String())
}

// ExchangeTCPFrom is Exchange over TCP from the client's local port
// srcPort, closed with a reset (SO_LINGER 0): no TIME_WAIT is left on the
// client, so the next exchange from the same port opens the same tuple
// again, and conntrack replaces its entry with a new connection's.
func (l *Lab) ExchangeTCPFrom(t testing.TB, srcPort uint16, dst netip.AddrPort, payload []byte) netip.AddrPort {
	t.Helper()
	var c *net.TCPConn
	err := nsrun.Do(nsrun.Path(l.Client), func() error {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{Port: int(srcPort)}}
		nc, err := d.Dial("tcp", dst.String())
		if err == nil {
			c = nc.(*net.TCPConn)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetLinger(0)
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(payload); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(payload))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("tcp %v: read echo: %v", dst, err)
	}
	return netip.MustParseAddrPort(c.LocalAddr().String())
}

// Entry is one line of `conntrack -L -o extended`, the independent reading
// of the table the tests compare against.
type Entry struct {
	Proto                      string
	Src, Dst                   netip.Addr
	SrcPort, DstPort           uint16
	ReplySrc, ReplyDst         netip.Addr
	ReplySrcPort, ReplyDstPort uint16
	Packets, Bytes             uint64
	ReplyPackets, ReplyBytes   uint64
	Zone                       uint16
	Mark                       uint32
	State                      string
}

// List runs conntrack -L in the router namespace and parses every entry.
func (l *Lab) List(t testing.TB) []Entry {
	t.Helper()
	out := l.Run(t, l.Router, "conntrack", "-L", "-o", "extended")
	var entries []Entry
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 6 {
			continue
		}
		e := Entry{Proto: f[2]}
		seen := map[string]int{}
		for _, kv := range f[4:] {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				continue
			}
			seen[k]++
			reply := seen[k] == 2
			var n uint64
			fmt.Sscan(v, &n)
			switch k {
			case "src":
				if reply {
					e.ReplySrc = netip.MustParseAddr(v)
				} else {
					e.Src = netip.MustParseAddr(v)
				}
			case "dst":
				if reply {
					e.ReplyDst = netip.MustParseAddr(v)
				} else {
					e.Dst = netip.MustParseAddr(v)
				}
			case "sport":
				if reply {
					e.ReplySrcPort = uint16(n)
				} else {
					e.SrcPort = uint16(n)
				}
			case "dport":
				if reply {
					e.ReplyDstPort = uint16(n)
				} else {
					e.DstPort = uint16(n)
				}
			case "packets":
				if reply {
					e.ReplyPackets = n
				} else {
					e.Packets = n
				}
			case "bytes":
				if reply {
					e.ReplyBytes = n
				} else {
					e.Bytes = n
				}
			case "zone":
				e.Zone = uint16(n)
			case "mark":
				e.Mark = uint32(n)
			}
		}
		if e.Proto == "tcp" && !strings.Contains(f[5], "=") {
			e.State = f[5] // "ipv4 2 tcp 6 <timeout> <STATE> src=…"
		}
		entries = append(entries, e)
	}
	return entries
}

// Find returns the entry whose original source is src.
func Find(entries []Entry, proto string, src netip.AddrPort) (Entry, bool) {
	for _, e := range entries {
		if e.Proto == proto && e.Src == src.Addr() && e.SrcPort == src.Port() {
			return e, true
		}
	}
	return Entry{}, false
}
