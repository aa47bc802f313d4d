package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/ipfix"
	"github.com/dualflow/dualflow/exporter"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/nsrun"
)

// updateThirdParty rewrites the third-party exporters' golden captures.
var updateThirdParty = flag.Bool("update-thirdparty", false, "rewrite collector/ipfix/testdata/thirdparty/*.pcap from the third-party exporters' live export")

// thirdPartyGolden holds <exporter>-<version>-<mode>.pcap: every datagram
// an exporter sent in one run of TestThirdParty, read by collector/ipfix's
// tests.
const thirdPartyGolden = "../../collector/ipfix/testdata/thirdparty"

// thirdPartyTools are the programs TestThirdParty runs (scripts/deps.sh
// installs them).
var thirdPartyTools = []string{"softflowd", "softflowctl", "pmacctd", "fprobe", "nfcapd", "nfdump", "tcpdump", "ping"}

func requireThirdParty(t *testing.T) {
	t.Helper()
	var missing []string
	for _, bin := range thirdPartyTools {
		if _, err := exec.LookPath(bin); err != nil {
			missing = append(missing, bin)
		}
	}
	if len(missing) == 0 {
		return
	}
	msg := "third-party exporter tools missing: " + strings.Join(missing, ", ") + " (scripts/deps.sh installs softflowd pmacct fprobe nfdump)"
	if os.Getenv("DUALFLOW_E2E") == "1" {
		t.Fatal(msg + " (DUALFLOW_E2E=1 requires them)")
	}
	t.Skip(msg)
}

// Lab addresses of the two namespaces (a: exporters and clients, b: servers).
var (
	tpV4A, tpV4B = netip.MustParseAddr("198.18.9.1"), netip.MustParseAddr("198.18.9.2")
	tpV6A, tpV6B = netip.MustParseAddr("fd00:10:9::1"), netip.MustParseAddr("fd00:10:9::2")
)

const (
	tpTCPPort = 5001
	tpUDPPort = 5002
)

// exporterSeq numbers the forwarding addresses 127.0.0.<n>: the collector
// records them as exporter_ip, which tells each run's rows apart in the
// shared data directory.
var exporterSeq atomic.Int32

func nextExporterAddr() netip.Addr {
	n := 10 + exporterSeq.Add(1)%240
	return netip.AddrFrom4([4]byte{127, 0, 0, byte(n)})
}

// TestThirdParty checks the collector's decoding against exporters no one
// here wrote, in each mode: softflowd (IPFIX, NetFlow v9, v5) and pmacctd's
// nfprobe (IPFIX, v9) read a capture of real lab traffic (TCP, UDP,
// ping), fprobe (v5, IPv4 only) exports it live. Every datagram goes
// through a tee that feeds both the collector (in process, UDP) and
// nfcapd; every record nfdump decodes must be exactly one collector row
// with the same addresses, ports, protocol, counters and times. It also
// sends our own exporter's IPFIX to nfcapd and checks what nfdump reads
// against the capture (ICMP and ICMPv6 type and code included).
func TestThirdParty(t *testing.T) {
	requirePrereqs(t)
	requireCHDB(t)
	requireThirdParty(t)
	t.Parallel() // its own namespaces and in-process collector (its own database)
	if *updateThirdParty {
		if err := os.MkdirAll(thirdPartyGolden, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	c := startUDPCollector(t)
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) { testThirdPartyMode(t, c, mode) })
	}
}

// startUDPCollector runs the collector in process with one IPFIX/NetFlow
// UDP listener on 127.0.0.1 and no inventory.
func startUDPCollector(t *testing.T) *collector.Collector {
	t.Helper()
	var cfg collector.Config
	useSharedStore(t, &cfg)
	cfg.Writer.FlushInterval = 100 * time.Millisecond
	cfg.IPFIX.UDPAddrs = []string{"127.0.0.1:0"}
	c, err := collector.New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("collector: %v", err)
		}
	})
	return c
}

// tpPair is two namespaces joined by a veth (a's veth0, b's veth1) with
// the mode's addresses.
type tpPair struct {
	a, b   string
	mode   manifest.Mode
	dir    string
	procs  []*exec.Cmd
	waited map[*exec.Cmd]chan error
}

func startPair(t *testing.T, mode manifest.Mode) *tpPair {
	t.Helper()
	prefix := labPrefix()
	p := &tpPair{a: prefix + "a", b: prefix + "b", mode: mode, dir: t.TempDir(), waited: map[*exec.Cmd]chan error{}}
	t.Cleanup(func() {
		// Processes in the namespaces first, then the namespaces.
		for _, c := range p.procs {
			if ch := p.waited[c]; ch != nil {
				c.Process.Kill()
				<-ch
			}
		}
		for _, ns := range []string{p.a, p.b} {
			if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
				t.Errorf("ip netns del %s: %v: %s", ns, err, out)
			}
		}
	})
	nft, err := lab.NFTPath()
	if err != nil {
		t.Fatal(err)
	}
	for _, ns := range []string{p.a, p.b} {
		run(t, "ip", "netns", "add", ns)
		if !mode.Has(corev1.IPv6Protocol) {
			// No link-local IPv6 chatter in IPv4-only mode.
			runIn(t, ns, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1")
		}
		runIn(t, ns, "ip", "link", "set", "lo", "up")
	}
	// Conntrack with counters and timestamps in a (our exporter reads it):
	// tracking starts with the first rule that uses ct.
	runIn(t, p.a, "sysctl", "-qw", "net.netfilter.nf_conntrack_acct=1", "net.netfilter.nf_conntrack_timestamp=1")
	runIn(t, p.a, nft, "-f", writeFile(t, p.dir, "ct.nft", `table inet dfx {
	chain out { type filter hook output priority filter; ct state new counter; }
	chain in { type filter hook input priority filter; ct state new counter; }
}
`))
	run(t, "ip", "-n", p.a, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", p.b)
	for _, x := range []struct {
		ns, dev string
		v4, v6  netip.Addr
	}{{p.a, "veth0", tpV4A, tpV6A}, {p.b, "veth1", tpV4B, tpV6B}} {
		if mode.Has(corev1.IPv4Protocol) {
			run(t, "ip", "-n", x.ns, "addr", "add", x.v4.String()+"/24", "dev", x.dev)
		}
		if mode.Has(corev1.IPv6Protocol) {
			run(t, "ip", "-n", x.ns, "addr", "add", x.v6.String()+"/64", "dev", x.dev, "nodad")
		}
		run(t, "ip", "-n", x.ns, "link", "set", x.dev, "up")
	}
	return p
}

// start starts cmd in ns; the pair kills it at the end unless waited for.
func (p *tpPair) start(t *testing.T, ns string, cmd *exec.Cmd) chan error {
	t.Helper()
	if err := startIn(nsrun.Path(ns), cmd); err != nil {
		t.Fatalf("start %s: %v", cmd.Path, err)
	}
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	p.procs = append(p.procs, cmd)
	done := make(chan error, 1)
	p.waited[cmd] = done
	go func() {
		err := <-ch
		done <- err
		close(done)
	}()
	return done
}

// loopback is the export destination address inside a: the mode's family
// (IPv4 in the dual-stack mode).
func (p *tpPair) loopback() netip.Addr {
	if p.mode == manifest.ModeIPv6 {
		return netip.IPv6Loopback()
	}
	return netip.MustParseAddr("127.0.0.1")
}

// traffic sends, per family of the mode, one TCP connection (1000 bytes
// up, 500 down), three UDP datagrams each way and three pings from a to b.
func (p *tpPair) traffic(t *testing.T) {
	t.Helper()
	for _, f := range p.mode.Families() {
		src, dst := tpV4A, tpV4B
		ping := []string{"ping", "-c", "3", "-i", "0.2", "-W", "2"}
		if f == corev1.IPv6Protocol {
			src, dst = tpV6A, tpV6B
			ping = append(ping, "-6")
		}
		tcpExchange(t, p, src, dst)
		udpExchange(t, p, src, dst)
		runIn(t, p.a, append(ping, dst.String())...)
	}
}

func tcpExchange(t *testing.T, p *tpPair, src, dst netip.Addr) {
	t.Helper()
	var ln net.Listener
	if err := nsrun.Do(nsrun.Path(p.b), func() error {
		var err error
		ln, err = net.Listen("tcp", netip.AddrPortFrom(dst, tpTCPPort).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.Copy(io.Discard, c); err != nil {
			served <- err
			return
		}
		_, err = c.Write(make([]byte, 500))
		served <- err
	}()
	var conn net.Conn
	if err := nsrun.Do(nsrun.Path(p.a), func() error {
		d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
		var err error
		conn, err = d.Dial("tcp", netip.AddrPortFrom(dst, tpTCPPort).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
	conn.(*net.TCPConn).CloseWrite()
	// Read to the server's FIN: the client's last ACK is then sent.
	n, err := io.Copy(io.Discard, conn)
	if err != nil || n != 500 {
		t.Fatalf("tcp: read %d bytes, %v", n, err)
	}
	if err := <-served; err != nil {
		t.Fatalf("tcp server: %v", err)
	}
}

func udpExchange(t *testing.T, p *tpPair, src, dst netip.Addr) {
	t.Helper()
	var srv *net.UDPConn
	if err := nsrun.Do(nsrun.Path(p.b), func() error {
		var err error
		srv, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, tpUDPPort)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			srv.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	var cl *net.UDPConn
	if err := nsrun.Do(nsrun.Path(p.a), func() error {
		var err error
		cl, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, tpUDPPort)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	buf := make([]byte, 2048)
	for i := 0; i < 3; i++ {
		if _, err := cl.Write(make([]byte, 100)); err != nil {
			t.Fatal(err)
		}
		cl.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := cl.Read(buf); err != nil || n != 100 {
			t.Fatalf("udp echo: %d bytes, %v", n, err)
		}
	}
}

// exportRun is one exporter's export of the lab traffic.
type exportRun struct {
	name, version string // e.g. softflowd, ipfix
	fwdFrom       netip.Addr
	tee           *tee
	nf            *nfcapd
}

func newExportRun(t *testing.T, p *tpPair, c *collector.Collector, name, version string) *exportRun {
	t.Helper()
	r := &exportRun{name: name, version: version, fwdFrom: nextExporterAddr()}
	r.nf = startNfcapd(t)
	udp := c.IPFIXAddrs()["udp"][0].(*net.UDPAddr).AddrPort()
	r.tee = startTee(t, p.a, p.loopback(), r.fwdFrom, udp, r.nf.addr)
	return r
}

// check ends the run: every datagram forwarded, nfdump's records compared
// with the collector's rows, and the golden capture written with -update-thirdparty.
func (r *exportRun) check(t *testing.T, p *tpPair, c *collector.Collector, truth map[flowKey]dirCounts) {
	t.Helper()
	dgs := r.tee.finish(t, p.a)
	if *updateThirdParty {
		path := filepath.Join(thirdPartyGolden, fmt.Sprintf("%s-%s-%s.pcap", r.name, r.version, p.mode))
		if err := writeDatagramPcap(path, dgs); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %s (%d datagrams)", path, len(dgs))
	}
	if len(dgs) == 0 {
		t.Fatalf("%s %s sent nothing", r.name, r.version)
	}
	want := r.nf.records(t)
	sortRecords(want)
	t.Logf("%s %s: %d datagrams, nfdump %d records", r.name, r.version, len(dgs), len(want))
	if n := exportRecordCount(dgs); n >= 0 && n != len(want) {
		t.Errorf("the datagrams hold %d data records, nfdump decoded %d", n, len(want))
	}
	if len(want) == 0 {
		t.Fatal("nfdump decoded no record")
	}
	checkAgainstCapture(t, want, truth)
	// NetFlow v9 headers carry whole seconds (flow times are relative to
	// them); v5 (unix_nsecs) and IPFIX carry milliseconds, and an exporter
	// may round each packet's time. A v9 time can so be up to a second
	// early, plus that rounding: softflowd's came 1.001 s early once, when
	// its export fell just before a whole second (its uptime and flow
	// times are truncated to the millisecond too).
	tol := 10 * time.Millisecond
	if r.version == "v9" {
		tol = time.Second + tol
	}
	// softflowd and pmacct's nfprobe (derived from it) keep one first and
	// last packet time per exchange and give them to the records of both
	// directions (pmacct's src/nfprobe_plugin/netflow5.c): a reply later
	// than its request by more than tol (a loaded machine) has the
	// request's first time.
	exchange := r.name == "softflowd" || r.name == "pmacct"
	compareCollector(t, c, r.fwdFrom, want, truth, tol, exchange)
}

// checkAgainstCapture logs where an exporter's records (as nfdump reads
// them) differ from the capture: the exporter's own view, not the
// collector's, so differences are reported, not failed.
func checkAgainstCapture(t *testing.T, recs []nfRecord, truth map[flowKey]dirCounts) {
	t.Helper()
	sum := map[flowKey]dirCounts{}
	for _, r := range recs {
		k := flowKey{r.Src, r.Dst, r.SrcPort, r.DstPort, r.Proto}
		c := sum[k]
		c.Packets += r.Packets
		c.Bytes += r.Bytes
		sum[k] = c
	}
	for k, c := range sum {
		if tc, ok := truth[k]; !ok {
			t.Logf("exporter reported %s (%d/%d), not in the capture", k, c.Packets, c.Bytes)
		} else if tc.Packets != c.Packets || tc.Bytes != c.Bytes {
			t.Logf("exporter reported %s %d/%d, capture %d/%d", k, c.Packets, c.Bytes, tc.Packets, tc.Bytes)
		}
	}
}

// compareCollector waits for the collector's rows of exporter (the tee's
// forwarding address) and matches them one to one with nfdump's records:
// same addresses, ports, protocol, counters, and times within 1 ms. Where
// nfdump and the collector differ in the ICMP type/code (destination
// port) or a time, the capture decides: a row that agrees with the capture
// where nfdump does not still matches its record (nfdump's misreading is
// logged); every other difference fails.
//
// Every row's times must also be within tol (the exporter's time
// resolution) of the capture's first and last packet.
//
// With exchange, a row's times may instead be the capture's first and last
// packet of its exchange, both directions together.
func compareCollector(t *testing.T, c *collector.Collector, exporterAddr netip.Addr, want []nfRecord, truth map[flowKey]dirCounts, tol time.Duration, exchange bool) {
	t.Helper()
	// src_ip is '' for :: (docs/schema.md): duplicate address detection
	// and MLD reports are sent from it.
	q := fmt.Sprintf(`SELECT if(src_ip = '' AND ip_version = 6, '::', src_ip), dst_ip, src_port, dst_port, protocol, packets, bytes,
		toUnixTimestamp64Milli(flow_start), toUnixTimestamp64Milli(flow_end)
		FROM %s.flows WHERE exporter_ip = '%s'`, c.Database(), exporterAddr)
	query := func() [][]string {
		out, err := c.Conn().Query(context.Background(), q, "TSV")
		if err != nil {
			t.Fatal(err)
		}
		var rows [][]string
		for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
			if line != "" {
				rows = append(rows, strings.Split(line, "\t"))
			}
		}
		return rows
	}
	// Generous: under load (the cluster tier beside the e2e tier) a dual
	// run's 807 rows took more than 10 s to be written, every message
	// decoded and none lost (its sequence numbers agreed).
	deadline := time.Now().Add(time.Minute)
	rows := query()
	for len(rows) < len(want) && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		rows = query()
	}
	if len(rows) >= len(want) {
		time.Sleep(time.Second) // a late extra row would show here
		rows = query()
	}
	var got []nfRecord
	for _, row := range rows {
		if len(row) != 9 {
			t.Fatalf("row %v", row)
		}
		var r nfRecord
		var err error
		if r.Src, err = netip.ParseAddr(row[0]); err != nil {
			t.Fatalf("row %v: %v", row, err)
		}
		if r.Dst, err = netip.ParseAddr(row[1]); err != nil {
			t.Fatalf("row %v: %v", row, err)
		}
		u := func(s string) uint64 { v, _ := strconv.ParseUint(s, 10, 64); return v }
		r.SrcPort, r.DstPort, r.Proto = uint16(u(row[2])), uint16(u(row[3])), uint8(u(row[4]))
		r.Packets, r.Bytes = u(row[5]), u(row[6])
		r.First, r.Last = time.UnixMilli(int64(u(row[7]))).UTC(), time.UnixMilli(int64(u(row[8]))).UTC()
		got = append(got, r)
	}
	sortRecords(got)
	used := make([]bool, len(got))
	same5 := func(a, b nfRecord) bool {
		return a.Src == b.Src && a.Dst == b.Dst && a.SrcPort == b.SrcPort && a.DstPort == b.DstPort && a.Proto == b.Proto
	}
	near := func(a, b time.Time) bool { d := a.Sub(b); return d <= time.Millisecond && d >= -time.Millisecond }
	key := func(r nfRecord) flowKey { return flowKey{r.Src, r.Dst, r.SrcPort, r.DstPort, r.Proto} }
	within := func(a, b time.Time, d time.Duration) bool { x := a.Sub(b); return x <= d && x >= -d }
	stamp := func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000") }
	// softflowd gives the two records of an exchange whose reply came
	// later than its request by more than its time resolution (a loaded
	// machine) each the other's time as its first: last before first. The
	// collector stores such a record as the span of its two times, which
	// must then cover the capture's times of that direction.
	inverted := map[flowKey]bool{}
	want = slices.Clone(want)
	for i, w := range want {
		if w.First.After(w.Last) {
			want[i].First, want[i].Last = w.Last, w.First
			inverted[key(w)] = true
		}
	}
	if len(inverted) > 0 {
		t.Logf("%d of the exporter's records have their last before their first", len(inverted))
	}
	// nfdumpWrong returns what nfdump got wrong, judged by the capture,
	// where it differs from the row g; ok is false when a difference is
	// not explained that way.
	nfdumpWrong := func(w, g nfRecord) (what []string, ok bool) {
		if w.Src != g.Src || w.Dst != g.Dst || w.SrcPort != g.SrcPort || w.Proto != g.Proto || w.Packets != g.Packets || w.Bytes != g.Bytes {
			return nil, false
		}
		tg, gIn := truth[key(g)]
		if w.DstPort != g.DstPort {
			if _, wIn := truth[key(w)]; wIn || !gIn {
				return nil, false
			}
			what = append(what, fmt.Sprintf("dst port/ICMP type.code %d (capture and collector: %d)", w.DstPort, g.DstPort))
		}
		if inverted[key(w)] {
			// The row spans the record's two times (the same span) and
			// covers the capture's.
			if !gIn || !near(g.First.Add(w.Last.Sub(w.First)), g.Last) || tg.First.Before(g.First.Add(-tol)) || tg.Last.After(g.Last.Add(tol)) {
				return nil, false
			}
			return append(what, fmt.Sprintf("times %s..%s (collector %s..%s, capture %s..%s)",
				stamp(w.First), stamp(w.Last), stamp(g.First), stamp(g.Last), stamp(tg.First), stamp(tg.Last))), true
		}
		for _, f := range []struct {
			name       string
			w, g, capt time.Time
		}{{"first", w.First, g.First, tg.First}, {"last", w.Last, g.Last, tg.Last}} {
			if near(f.w, f.g) {
				continue
			}
			if !gIn || !within(f.g, f.capt, tol) || within(f.w, f.capt, tol) {
				return nil, false
			}
			what = append(what, fmt.Sprintf("%s %s (collector %s, capture %s)", f.name, stamp(f.w), stamp(f.g), stamp(f.capt)))
		}
		return what, true
	}
	var missing []nfRecord
	for _, w := range want {
		found := false
		for i, g := range got {
			if !used[i] && same5(w, g) && w.Packets == g.Packets && w.Bytes == g.Bytes && near(w.First, g.First) && near(w.Last, g.Last) {
				used[i], found = true, true
				break
			}
		}
		if !found {
			missing = append(missing, w)
		}
	}
	var still []nfRecord
	for _, w := range missing {
		found := false
		for i, g := range got {
			if used[i] {
				continue
			}
			if what, ok := nfdumpWrong(w, g); ok {
				used[i], found = true, true
				t.Logf("nfdump misreads %s: %s; the collector agrees with the capture", w, strings.Join(what, ", "))
				break
			}
		}
		if !found {
			still = append(still, w)
		}
	}
	missing = still
	var extra []nfRecord
	for i, g := range got {
		if !used[i] {
			extra = append(extra, g)
		}
	}
	if len(missing) > 0 || len(extra) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "%d nfdump records, %d collector rows; %d records without their row, %d rows without a record\n", len(want), len(got), len(missing), len(extra))
		for _, m := range missing {
			fmt.Fprintf(&b, "  nfdump only:    %s%s\n", m, captureNote(m, truth))
		}
		for _, e := range extra {
			fmt.Fprintf(&b, "  collector only: %s%s\n", e, captureNote(e, truth))
		}
		t.Error(b.String())
	}
	var wrongTime []string
	for _, g := range got {
		tc, ok := truth[key(g)]
		wrong := ok && (!within(g.First, tc.First, tol) || !within(g.Last, tc.Last, tol))
		if ok && inverted[key(g)] {
			wrong = tc.First.Before(g.First.Add(-tol)) || tc.Last.After(g.Last.Add(tol))
		}
		k := key(g)
		if rc, rok := truth[flowKey{k.Dst, k.Src, k.DstPort, k.SrcPort, k.Proto}]; wrong && exchange && rok {
			span := dirCounts{First: tc.First, Last: tc.Last}
			if rc.First.Before(span.First) {
				span.First = rc.First
			}
			if rc.Last.After(span.Last) {
				span.Last = rc.Last
			}
			if within(g.First, span.First, tol) && within(g.Last, span.Last, tol) {
				wrong = false
				t.Logf("%s: times %s..%s, its exchange's (capture %s..%s)", k, stamp(g.First), stamp(g.Last), stamp(span.First), stamp(span.Last))
			}
		}
		if wrong {
			wrongTime = append(wrongTime, fmt.Sprintf("  %s: collector %s..%s, capture %s..%s",
				key(g), stamp(g.First), stamp(g.Last), stamp(tc.First), stamp(tc.Last)))
		}
	}
	if len(wrongTime) > 0 {
		t.Errorf("%d of %d rows have times more than %v (the exporter's time resolution) from the capture's:\n%s",
			len(wrongTime), len(got), tol, strings.Join(wrongTime, "\n"))
	}
}

// captureNote is what the capture shows of r's 5-tuple, for failure messages.
func captureNote(r nfRecord, truth map[flowKey]dirCounts) string {
	c, ok := truth[flowKey{r.Src, r.Dst, r.SrcPort, r.DstPort, r.Proto}]
	if !ok {
		return " [5-tuple not in the capture]"
	}
	return fmt.Sprintf(" [capture %d/%d %s..%s]", c.Packets, c.Bytes, c.First.UTC().Format("2006-01-02 15:04:05.000"), c.Last.UTC().Format("2006-01-02 15:04:05.000"))
}

func testThirdPartyMode(t *testing.T, c *collector.Collector, mode manifest.Mode) {
	p := startPair(t, mode)
	hasV4 := mode.Has(corev1.IPv4Protocol)

	// fprobe exports NetFlow v5 (IPv4 only) from a live capture of veth0.
	var fp *exportRun
	var fpDone chan error
	var fpCmd *exec.Cmd
	if hasV4 {
		fp = newExportRun(t, p, c, "fprobe", "v5")
		fpCmd = exec.Command("fprobe", "-l", "2", "-i", "veth0", "-p", "-d", "1", "-e", "2", "-s", "1", "-n", "5",
			fp.tee.addr().String())
		fpOut := new(strings.Builder)
		fpCmd.Stdout, fpCmd.Stderr = fpOut, fpOut
		fpDone = p.start(t, p.a, fpCmd)
		waitPacketSockets(t, fpCmd.Process.Pid, 1)
	}
	pcap := filepath.Join(p.dir, "traffic.pcap")
	capt := startCapture(t, p.a, "veth0", pcap)
	p.traffic(t)
	capt.stopAfterMarker(t, p.a, "veth0")
	truth := pcapFlows(t, pcap)
	if st, err := os.Stat(pcap); err == nil {
		t.Logf("capture: %d bytes, %d unidirectional flows", st.Size(), len(truth))
	}

	type runSpec struct {
		name, version string
		needV4        bool
		exec          func(t *testing.T, dest netip.AddrPort) *exec.Cmd
		poke          bool
	}
	softflowd := func(v string) func(t *testing.T, dest netip.AddrPort) *exec.Cmd {
		return func(t *testing.T, dest netip.AddrPort) *exec.Cmd {
			return softflowdCmd(pcap, dest, v, filepath.Join(p.dir, "softflowd-"+v+".ctl"), filepath.Join(p.dir, "softflowd-"+v+".pid"))
		}
	}
	pmacct := func(v string) func(t *testing.T, dest netip.AddrPort) *exec.Cmd {
		return func(t *testing.T, dest netip.AddrPort) *exec.Cmd {
			conf := writeFile(t, p.dir, "pmacctd-"+v+".conf", fmt.Sprintf(`daemonize: false
pcap_savefile: %s
plugins: nfprobe
nfprobe_receiver: %s
nfprobe_version: %s
aggregate: src_host, dst_host, src_port, dst_port, proto, tos
`, pcap, dest, v))
			return exec.Command("pmacctd", "-f", conf)
		}
	}
	runs := []runSpec{
		{"softflowd", "ipfix", false, softflowd("10"), true},
		{"softflowd", "v9", false, softflowd("9"), true},
		{"softflowd", "v5", true, softflowd("5"), true},
		{"pmacct", "ipfix", false, pmacct("10"), false},
		{"pmacct", "v9", false, pmacct("9"), false},
	}
	for _, rs := range runs {
		t.Run(rs.name+"-"+rs.version, func(t *testing.T) {
			record(t, mode)
			if rs.needV4 && !hasV4 {
				t.Skip("NetFlow v5 carries IPv4 only")
			}
			r := newExportRun(t, p, c, rs.name, rs.version)
			cmd := rs.exec(t, r.tee.addr())
			out := new(strings.Builder)
			cmd.Stdout, cmd.Stderr = out, out
			done := p.start(t, p.a, cmd)
			ctl := ""
			if rs.poke {
				ctl = cmd.Args[slicesIndex(cmd.Args, "-c")+1]
			}
			err := waitExit(done, ctl, 60*time.Second)
			if err != nil && pmacctShutdownRace(err, out.String()) {
				// pmacctd's core stops its plugin at the end of the
				// capture file and, when it notices the plugin gone
				// before its own exit, exits 1. The plugin flushed what
				// it had on the way out: the records say whether it did.
				t.Logf("%s: %v after its plugin shut down; checking the records", strings.Join(cmd.Args, " "), err)
				err = nil
			}
			if err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
			}
			r.check(t, p, c, truth)
		})
	}

	t.Run("fprobe-v5", func(t *testing.T) {
		record(t, mode)
		if !hasV4 {
			t.Skip("fprobe exports NetFlow v5: IPv4 only, nothing to export in IPv6-only mode")
		}
		// Idle flows expire after 1 s: wait for as many records as the
		// capture has IPv4 flows, then stop fprobe.
		n := 0
		for k := range truth {
			if k.Src.Is4() {
				n++
			}
		}
		deadline := time.Now().Add(30 * time.Second)
		for exportRecordCount(fp.tee.datagrams()) < n && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		fpCmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-fpDone:
		case <-time.After(15 * time.Second):
			t.Errorf("fprobe did not stop on SIGTERM")
		}
		fp.check(t, p, c, truth)
	})

	t.Run("dualflow-exporter-nfdump", func(t *testing.T) {
		record(t, mode)
		testOwnExporterNfdump(t, p)
	})
}

func slicesIndex(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

// waitExit waits for a process to exit by itself. With ctl set (softflowd
// reading a file), its control socket is poked every 200 ms: softflowd
// 1.1.0 blocks in accept() on it between loop iterations, so without the
// pokes it never reaches the end of the file.
// pmacctShutdownRace says err is pmacctd's exit status 1 of its core
// finding its nfprobe plugin already shut down at the end of the capture
// file, not a failure of the export.
func pmacctShutdownRace(err error, out string) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ExitCode() == 1 &&
		strings.Contains(out, "Shutting down on user request") && strings.Contains(out, "no more plugins active. Shutting down.")
}

func waitExit(done chan error, ctl string, timeout time.Duration) error {
	deadline := time.After(timeout)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-deadline:
			return fmt.Errorf("still running after %v", timeout)
		case <-tick.C:
			if ctl != "" {
				if _, err := os.Stat(ctl); err == nil {
					exec.Command("softflowctl", "-c", ctl, "statistics").Run()
				}
			}
		}
	}
}

// waitPacketSockets waits until process pid has at least n AF_PACKET
// sockets open (libpcap is capturing).
func waitPacketSockets(t *testing.T, pid, n int) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		inodes := map[string]bool{}
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/packet", pid)); err == nil {
			for _, l := range strings.Split(string(b), "\n")[1:] {
				if f := strings.Fields(l); len(f) > 0 {
					inodes[f[len(f)-1]] = true
				}
			}
		}
		have := 0
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			link, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
			if ino, ok := strings.CutPrefix(link, "socket:["); ok && inodes[strings.TrimSuffix(ino, "]")] {
				have++
			}
		}
		if have >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("process %d has %d packet sockets after 15 s, want %d", pid, have, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// testOwnExporterNfdump runs our exporter on a's conntrack, sending IPFIX
// over UDP to nfcapd, makes the mode's traffic again and checks what
// nfdump reads: one biflow record per connection with the capture's
// counters each way, ICMP echo as type 8 code 0 (ICMPv6 128.0) with the
// replies as reverse counters.
func testOwnExporterNfdump(t *testing.T, p *tpPair) {
	nf := startNfcapd(t)
	// A tee in the test's namespace: it lets the test see when the
	// records are in (decoded with the collector's decoder, used only to
	// wait; the checks read nfdump).
	tt := startTee(t, "", netip.MustParseAddr("127.0.0.1"), nextExporterAddr(), nf.addr)

	cfg := exporter.NewConfig()
	cfg.NodeName = "thirdparty-a"
	cfg.MetricsAddr = ""
	cfg.NetNS = nsrun.Path(p.a)
	cfg.IPv4, cfg.IPv6 = p.mode.Has(corev1.IPv4Protocol), p.mode.Has(corev1.IPv6Protocol)
	cfg.RequireAccounting = true
	cfg.PollInterval = 200 * time.Millisecond
	cfg.Store.IdleTimeout = time.Second
	cfg.Store.ActiveTimeout = time.Hour
	cfg.IPFIX.Address = tt.addr().String()
	cfg.IPFIX.Transport = "udp"
	cfg.IPFIX.FlushInterval = 50 * time.Millisecond
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	// The third-party phase's connections are still in conntrack; the
	// pings of this phase would reuse their ICMP entries (same echo
	// identifier, within the 30 s ICMP timeout) and keep their start times.
	if out, err := exec.Command("ip", "netns", "exec", p.a, "conntrack", "-F").CombinedOutput(); err != nil {
		t.Fatalf("conntrack -F: %v: %s", err, out)
	}
	e, err := exporter.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	stop := func() {
		if cancel == nil {
			return
		}
		cancel()
		cancel = nil
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("exporter: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("exporter did not stop")
		}
	}
	t.Cleanup(stop)

	pcap := filepath.Join(p.dir, "own.pcap")
	capt := startCapture(t, p.a, "veth0", pcap)
	p.traffic(t)
	capt.stopAfterMarker(t, p.a, "veth0")
	truth := pcapFlows(t, pcap)
	var phaseStart time.Time // connections of the third-party phase are still in conntrack
	for _, c := range truth {
		if phaseStart.IsZero() || c.First.Before(phaseStart) {
			phaseStart = c.First
		}
	}

	// The connections a opened: forward a->b, reverse b->a.
	type conn struct {
		fwd, rev   flowKey
		fwdC, revC dirCounts
		icmpType   uint8
	}
	var conns []conn
	for k, c := range truth {
		if k.Src != tpV4A && k.Src != tpV6A {
			continue
		}
		cn := conn{fwd: k, fwdC: c}
		switch k.Proto {
		case flow.ProtoICMP, flow.ProtoICMPv6:
			if k.DstPort>>8 != 8 && k.DstPort>>8 != 128 {
				continue // neighbour discovery
			}
			cn.icmpType = uint8(k.DstPort >> 8)
			cn.rev = flowKey{k.Dst, k.Src, 0, k.DstPort + 0x100, k.Proto} // echo reply: 129.0 (ICMPv6)
			if k.Proto == flow.ProtoICMP {
				cn.rev.DstPort = 0
			}
		default:
			cn.rev = flowKey{k.Dst, k.Src, k.DstPort, k.SrcPort, k.Proto}
		}
		cn.revC = truth[cn.rev]
		conns = append(conns, cn)
	}
	if len(conns) != 3*len(p.mode.Families()) {
		t.Fatalf("capture shows %d connections from a, want %d: %v", len(conns), 3*len(p.mode.Families()), truth)
	}

	// Wait until the exported forward packets cover the capture's.
	dec := ipfix.NewDecoder()
	sess := ipfix.NewSession(netip.MustParseAddrPort("127.0.0.1:1"), ipfix.UDP, ipfix.Limits{})
	seen := 0
	exported := map[[3]any]uint64{}
	covered := func() bool {
		dgs := tt.datagrams()
		var recs []flow.Record
		for ; seen < len(dgs); seen++ {
			recs, _ = dec.Decode(sess, dgs[seen].payload, time.Now(), recs[:0])
			for _, r := range recs {
				port := r.SrcPort
				if r.Proto == flow.ProtoICMP || r.Proto == flow.ProtoICMPv6 {
					port = 0 // the echo identifier, which the capture's key leaves out
				}
				exported[[3]any{r.SrcAddr.Unmap(), r.Proto, port}] += r.PacketsDelta
			}
		}
		for _, cn := range conns {
			if exported[[3]any{cn.fwd.Src, cn.fwd.Proto, cn.fwd.SrcPort}] < cn.fwdC.Packets {
				return false
			}
		}
		return true
	}
	deadline := time.Now().Add(30 * time.Second)
	for !covered() {
		if time.Now().After(deadline) {
			t.Logf("after 30 s the exported forward packets are %v (decoder stats %+v)", exported, dec.Stats)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	tt.finish(t, "")
	recs := nf.records(t)
	sortRecords(recs)
	for _, r := range recs {
		t.Logf("nfdump: %s icmp %d.%d", r, r.ICMPType, r.ICMPCode)
	}

	for _, cn := range conns {
		name := cn.fwd.String()
		var sum nfRecord
		n := 0
		for _, r := range recs {
			if r.Src != cn.fwd.Src || r.Dst != cn.fwd.Dst || r.Proto != cn.fwd.Proto || r.First.Before(phaseStart.Add(-5*time.Millisecond)) {
				continue
			}
			if cn.icmpType == 0 && (r.SrcPort != cn.fwd.SrcPort || r.DstPort != cn.fwd.DstPort) {
				continue
			}
			n++
			sum.Packets += r.Packets
			sum.Bytes += r.Bytes
			sum.OutPackets += r.OutPackets
			sum.OutBytes += r.OutBytes
			if cn.icmpType != 0 {
				want := uint16(cn.icmpType) << 8
				if r.SrcPort != 0 || r.DstPort != want || (r.ICMPType >= 0 && (r.ICMPType != int(cn.icmpType) || r.ICMPCode != 0)) {
					t.Errorf("%s: nfdump shows ports %d/%d icmp %d.%d, want type.code %d.0 (dst port %d)",
						name, r.SrcPort, r.DstPort, r.ICMPType, r.ICMPCode, cn.icmpType, want)
				}
			}
		}
		if n == 0 {
			t.Errorf("%s: no nfdump record", name)
			continue
		}
		got := fmt.Sprintf("%d/%d reverse %d/%d", sum.Packets, sum.Bytes, sum.OutPackets, sum.OutBytes)
		want := fmt.Sprintf("%d/%d reverse %d/%d", cn.fwdC.Packets, cn.fwdC.Bytes, cn.revC.Packets, cn.revC.Bytes)
		if got != want {
			t.Errorf("%s: nfdump %s (%d records), capture %s", name, got, n, want)
		}
	}
}
