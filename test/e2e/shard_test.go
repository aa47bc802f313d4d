package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/exporter"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/test/kubeapi"
	"github.com/dualflow/dualflow/test/support/labtruth"
)

// shardFailover is the exporters' --exporter.collector-failover-timeout
// in TestShardedCollectors.
const shardFailover = 3 * time.Second

// TestShardedCollectors runs the scale-out path of issue 22 in each mode:
// `dualflow store` owns the embedded engine and serves its ClickHouse HTTP
// interface; three `dualflow collector` processes write to it through
// clickhouse-go; the two nodes' exporters shard their records over the
// three collectors by connection.
//
//   - Every cross-node connection becomes exactly one merged row, with the
//     counters of the source node's conntrack entry: both halves met at
//     one collector. Every collector received a share.
//   - One collector is killed (SIGKILL) while connections are made, and
//     started again on its address after the failover timeout. No
//     connection is written twice (two merged rows, or two rows of one
//     side); connections whose halves were split by the failover are
//     written unmerged, never merged with another's half; and the
//     connections lost are counted against the documented bound (the
//     records in flight on the killed collector's TCP connections).
func TestShardedCollectors(t *testing.T) {
	requirePrereqs(t)
	requireCHDB(t)
	// Serial: beside other tests, a collector's SIGKILL left a half stored again beside its merged row (0 records replayed); not yet understood.
	bin := buildBinary(t)
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			record(t, mode)
			testShardedMode(t, bin, mode)
		})
	}
}

func testShardedMode(t *testing.T, bin string, mode manifest.Mode) {
	l := startLab(t, mode)
	st := startStoreProcess(t, bin)
	host := "[::1]"
	if mode == manifest.ModeIPv4 {
		host = "127.0.0.1"
	}
	var cols []*daemon
	var addrs []string
	for i := range 3 {
		addr := net.JoinHostPort(strings.Trim(host, "[]"), fmt.Sprint(freePort(t, host)))
		dir := t.TempDir()
		d := newDaemon(t, fmt.Sprintf("collector-%d", i+1), bin, "collector",
			"--clickhouse.dsn", st.dsn, "--clickhouse.user", chhttp.InserterUser, "--clickhouse.password-file", st.passwordFile,
			"--collector.wal.dir", filepath.Join(dir, "wal"), "--clickhouse.spool-dir", filepath.Join(dir, "spool"),
			"--clickhouse.flush-interval", "200ms",
			"--k8s.source", "inventory", "--k8s.inventory", l.ManifestPath(),
			"--metrics-addr", "127.0.0.1:0", "--web.addr", "",
			"--collector.ipfix.tcp-addr", addr, "--collector.ipfix.udp-addr", "",
			"--collector.correlate.timeout", "3s")
		d.start(logMetrics)
		cols = append(cols, d)
		addrs = append(addrs, addr)
	}
	for _, node := range []string{"node-1", "node-2"} {
		startExporterWith(t, l, mode, node, func(c *exporter.Config) {
			c.Shard.Collectors = addrs
			c.Shard.FailoverTimeout = shardFailover
		})
	}

	web1, err := l.PodOn(manifest.NSFrontend, "web", 1)
	if err != nil {
		t.Fatal(err)
	}
	api2, err := l.PodOn(manifest.NSBackend, "api", 2)
	if err != nil {
		t.Fatal(err)
	}
	dial := func(f corev1.IPFamily) (shardConn, error) {
		to, _ := manifest.PodAddr(api2, f)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := labDial(ctx, l, web1, agent.TCP, netip.AddrPortFrom(to, manifest.PortHTTP))
		return shardConn{local: r.Local, at: time.Now()}, err
	}

	// Steady state: every connection one merged row, counters equal to
	// conntrack's.
	// 36 connections in every mode (12 were one family's only: one of
	// three collectors got no share about once in 50 runs).
	var steady []shardConn
	for range 36 / len(mode.Families()) {
		for _, f := range mode.Families() {
			c, err := dial(f)
			if err != nil {
				t.Fatal(err)
			}
			steady = append(steady, c)
		}
	}
	got := st.awaitConns(t, steady, true)
	for i, c := range steady {
		// One merged row, or a few when a packet came after an idle
		// export (a FIN late on a loaded machine): a continuation, with
		// larger totals, never the same row twice.
		sh := classify(got[i])
		if sh.twice || sh.stray || sh.unknown || sh.halves > 0 {
			t.Errorf("%v: rows %+v, want merged rows with distinct totals", c.local, got[i])
		}
	}
	checkCounters(t, l, st, steady, nil)
	for _, d := range cols {
		if n, err := d.metric(`dualflow_ipfix_records_total`); err != nil || n == 0 {
			t.Errorf("%s received %v records (%v): no share", d.name, n, err)
		}
	}
	if t.Failed() {
		return
	}

	// A collector killed mid-traffic, and back after the failover.
	var mu sync.Mutex
	var churn []shardConn
	stop := make(chan struct{})
	dialed := make(chan struct{})
	go func() {
		defer close(dialed)
		fams := mode.Families()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(150 * time.Millisecond):
			}
			c, err := dial(fams[i%len(fams)])
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			mu.Lock()
			churn = append(churn, c)
			mu.Unlock()
		}
	}()
	awaitN := func(n int) {
		await(t, time.Minute, fmt.Sprintf("%d connections", n), func() (bool, string) {
			mu.Lock()
			defer mu.Unlock()
			return len(churn) >= n, fmt.Sprint(len(churn))
		})
	}
	awaitN(10)
	killed := time.Now()
	cols[1].kill()
	// Past the failover timeout, with connections made meanwhile.
	awaitN(len(churn) + int((2*shardFailover)/(150*time.Millisecond)))
	cols[1].start(logMetrics)
	back := time.Now()
	awaitN(len(churn) + 30)
	close(stop)
	<-dialed
	t.Logf("%d connections; collector-2 killed at +%v, back at +%v", len(churn), killed.Sub(churn[0].at).Round(time.Millisecond), back.Sub(churn[0].at).Round(time.Millisecond))

	got = st.awaitConns(t, churn, false)
	// The killed collector replays what its write-ahead log had not
	// acknowledged (per record), except the batches it finds in the store
	// by their token (a kill between an insert and its acknowledgement):
	// nothing may be stored twice, neither a whole merged row nor one half
	// again beside the merged row. Only a store that could not be asked
	// (dualflow_wal_unverified_batches_total) would excuse a duplicate.
	replayed, err := cols[1].metric(`dualflow_wal_replayed_records_total`)
	if err != nil {
		t.Fatal(err)
	}
	verified, err := cols[1].metric(`dualflow_wal_verified_batches_total`)
	if err != nil {
		t.Fatal(err)
	}
	unverified, err := cols[1].metric(`dualflow_wal_unverified_batches_total`)
	if err != nil {
		t.Fatal(err)
	}
	var merged, split, lost, twice, strays, continued int
	for i, c := range churn {
		rows := got[i]
		sh := classify(rows)
		if sh.continued {
			continued++
			t.Logf("exported again after an idle export: %v %+v", c.local, rows)
		}
		switch {
		case sh.unknown:
			t.Errorf("%v: rows %+v", c.local, rows)
		case len(rows) == 0:
			lost++
			t.Logf("lost: %v made at +%v", c.local, c.at.Sub(killed).Round(time.Millisecond))
		case sh.twice:
			twice++
			t.Logf("stored twice: %v %+v", c.local, rows)
		case sh.stray:
			strays++
			t.Logf("a half stored again beside the merged row: %v %+v", c.local, rows)
		case sh.merged:
			merged++
		default:
			split++
		}
	}
	t.Logf("after a collector's SIGKILL: %d connections, %d merged, %d split (written unmerged), %d lost, %d stored twice, %d with a half stored again, %d exported again after an idle export (%v records replayed, %v batches found stored, %v unverified)",
		len(churn), merged, split, lost, twice, strays, continued, replayed, verified, unverified)
	if unverified != 0 {
		t.Errorf("the restarted collector could not ask the store about %v batches", unverified)
	}
	if twice+strays > 0 {
		t.Errorf("%d connections stored twice and %d halves stored again", twice, strays)
	}
	// A connection exported again after its idle export (a late FIN) may
	// have sent that last record to collector-2 just before the kill.
	short := checkCounters(t, l, st, churn, func(c shardConn) bool {
		return c.at.After(killed.Add(-10*time.Second)) && c.at.Before(back)
	})
	// The bound: what was in flight on the killed collector's
	// connections (its socket buffers and the exporters' last flush, 50 ms
	// here), a few connections at this rate, whole or their last records.
	if lost+short > 3 {
		t.Errorf("%d connections lost and %d short of their last records, over the bound of 3", lost, short)
	}
	if merged < len(churn)/2 {
		t.Errorf("only %d of %d connections merged", merged, len(churn))
	}
}

// shardConn is one connection the test made.
type shardConn struct {
	local netip.AddrPort // the client's address and port
	at    time.Time
}

// shardRow is a flows row of one connection.
type shardRow struct {
	correlation                 string
	packets, bytes, rp, rb      uint64 // *_total
	srcNode, dstNode, exporter  string
	deltaPackets, sumDeltaBytes uint64
}

// shape is what the rows of one connection say.
type shape struct {
	// twice: one row stored twice (the same correlation and totals: a
	// record replayed after it was stored).
	twice bool
	// stray: a half beside a merged row that is not later than it (its
	// totals not above the merged row's): a half stored again.
	stray bool
	// continued: rows of one correlation with different totals, a
	// connection exported again after its idle export (a packet came
	// later), which is no duplicate.
	continued bool
	merged    bool // some row is merged
	halves    int  // source_only and destination_only rows
	unknown   bool // a correlation the test does not know
}

func classify(rows []shardRow) shape {
	type key struct {
		corr         string
		p, b, rp, rb uint64
	}
	var sh shape
	seen := map[key]bool{}
	totals := map[string]map[[4]uint64]bool{} // per correlation
	newestMerged := int64(-1)                 // packets both ways of the largest merged row
	for _, r := range rows {
		switch r.correlation {
		case "merged":
			sh.merged = true
			newestMerged = max(newestMerged, int64(r.packets+r.rp))
		case "source_only", "destination_only":
			sh.halves++
		default:
			sh.unknown = true
		}
		k := key{r.correlation, r.packets, r.bytes, r.rp, r.rb}
		sh.twice = sh.twice || seen[k]
		seen[k] = true
		if totals[r.correlation] == nil {
			totals[r.correlation] = map[[4]uint64]bool{}
		}
		totals[r.correlation][[4]uint64{r.packets, r.bytes, r.rp, r.rb}] = true
	}
	for _, r := range rows {
		if r.correlation != "merged" && newestMerged >= 0 && int64(r.packets+r.rp) <= newestMerged {
			sh.stray = true
		}
	}
	for _, t := range totals {
		sh.continued = sh.continued || len(t) > 1
	}
	return sh
}

// checkCounters compares the newest source-side row (merged, or the source
// node's half) of every connection with the source node's conntrack entry
// (it lingers in TIME_WAIT). A packet after an idle export (a late FIN on
// a loaded machine) moves conntrack first and the store an idle timeout
// later, so this waits for them to agree. A connection for which short
// says yes may end short of conntrack's counters (the record of its last
// packets in flight to a collector that was killed): it is not an error,
// and the number of such connections is returned.
func checkCounters(t *testing.T, l *lab.Lab, st *storeProcess, sent []shardConn, short func(shardConn) bool) int {
	t.Helper()
	var errs []string
	var excused int
	deadline := time.Now().Add(time.Minute)
	for {
		errs, excused = errs[:0], 0
		conns, err := labtruth.Conntrack(l, "node-1")
		if err != nil {
			t.Fatal(err)
		}
		got, err := st.readConns(sent)
		if err != nil {
			t.Fatal(err)
		}
		// conntrack holds the newest connection of an address and port:
		// the kernel reuses a client port within seconds, and a SYN
		// replaces the entry in TIME_WAIT with a new one (new counters).
		latest := map[netip.AddrPort]int{}
		for i, c := range sent {
			latest[c.local] = i
		}
		for i, rows := range got {
			local := sent[i].local
			if latest[local] != i {
				continue // its port was used again: conntrack has the later one
			}
			var newest *shardRow
			for j := range rows {
				r := &rows[j]
				if r.correlation == "destination_only" {
					continue
				}
				if newest == nil || r.packets+r.rp > newest.packets+newest.rp {
					newest = r
				}
			}
			if newest == nil || newest.correlation != "merged" {
				continue // split by the failover: no merged row to compare
			}
			ct, ok := labtruth.FindConn(conns, flow.ProtoTCP, local)
			if !ok {
				errs = append(errs, fmt.Sprintf("%v: no conntrack entry on node-1", local))
				continue
			}
			r := newest
			equal := r.packets == ct.OrigPackets && r.bytes == ct.OrigBytes && r.rp == ct.ReplyPackets && r.rb == ct.ReplyBytes
			below := r.packets <= ct.OrigPackets && r.bytes <= ct.OrigBytes && r.rp <= ct.ReplyPackets && r.rb <= ct.ReplyBytes
			switch {
			case r.srcNode != "node-1" || r.dstNode != "node-2" || (!equal && !(below && short != nil && short(sent[i]))):
				errs = append(errs, fmt.Sprintf("%v: row %+v, conntrack %d/%d %d/%d", local, *r, ct.OrigPackets, ct.OrigBytes, ct.ReplyPackets, ct.ReplyBytes))
			case !equal:
				excused++
				if time.Now().After(deadline) {
					t.Logf("%v: row %+v short of conntrack %d/%d %d/%d: its last export was in flight to the killed collector", local, *r, ct.OrigPackets, ct.OrigBytes, ct.ReplyPackets, ct.ReplyBytes)
				}
			}
		}
		if (len(errs) == 0 && excused == 0) || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	for _, e := range errs {
		t.Error(e)
	}
	return excused
}

// storeProcess is a running `dualflow store`.
type storeProcess struct {
	*daemon
	dsn          string // http://user@host:port for the collectors
	httpURL      string
	passwordFile string // the admin's password
	password     string
}

var logStoreHTTP = regexp.MustCompile(`serving the ClickHouse HTTP interface.* url=(http://[^ ]+)/`)

func startStoreProcess(t testing.TB, bin string) *storeProcess {
	t.Helper()
	s := newStoreProcess(t, bin, "127.0.0.1:0")
	s.run()
	return s
}

// newStoreProcess prepares a `dualflow store` serving its HTTP interface
// on httpAddr, with its users and the inserter's password file, without
// starting it (run does).
func newStoreProcess(t testing.TB, bin, httpAddr string) *storeProcess {
	t.Helper()
	dir := t.TempDir()
	usersFile := filepath.Join(dir, "users.json")
	users, _, err := chhttp.LoadOrCreateUsers(usersFile)
	if err != nil {
		t.Fatal(err)
	}
	// The collectors log in as the inserter (they insert, the store
	// migrates); the test's own queries as the admin.
	s := &storeProcess{passwordFile: filepath.Join(dir, "inserter-password")}
	inserter := ""
	for _, u := range users {
		switch u.Name {
		case chhttp.AdminUser:
			s.password = u.Password
		case chhttp.InserterUser:
			inserter = u.Password
		}
	}
	if err := os.WriteFile(s.passwordFile, []byte(inserter+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s.daemon = newDaemon(t, "store", bin, "store",
		"--clickhouse.data-dir", filepath.Join(dir, "data"),
		"--clickhouse.http-addr", httpAddr, "--clickhouse.http-users-file", usersFile,
		"--metrics-addr", "127.0.0.1:0")
	return s
}

// run starts the store and waits until it serves.
func (s *storeProcess) run() {
	m := s.start(logStoreHTTP)
	s.httpURL = m[0]
	s.dsn = m[0]
}

// query runs SQL on the store's HTTP interface as the admin, TSV.
func (s *storeProcess) query(q string) ([][]string, error) {
	req, err := http.NewRequest(http.MethodPost, s.httpURL+"/?default_format=TabSeparated", strings.NewReader(q))
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(chhttp.AdminUser, s.password)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, b)
	}
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if line != "" {
			rows = append(rows, strings.Split(line, "\t"))
		}
	}
	return rows, nil
}

// readConns reads the flows rows of conns, per connection (see
// awaitConns for how rows are matched to connections).
func (s *storeProcess) readConns(conns []shardConn) (map[int][]shardRow, error) {
	byLocal := map[netip.AddrPort][]int{} // in the order made
	for i, c := range conns {
		byLocal[c.local] = append(byLocal[c.local], i)
	}
	var ports []string
	for _, c := range conns {
		ports = append(ports, fmt.Sprint(c.local.Port()))
	}
	rows, err := s.query(fmt.Sprintf(`SELECT src_ip, src_port, toString(correlation), packets_total, bytes_total, reverse_packets_total, reverse_bytes_total,
		src_node, dst_node, exporter_node, toUnixTimestamp64Milli(flow_start) FROM dualflow.flows WHERE protocol = 6 AND src_port IN (%s)`, strings.Join(ports, ",")))
	if err != nil {
		return nil, err
	}
	out := map[int][]shardRow{}
	for _, r := range rows {
		if len(r) != 11 {
			return nil, fmt.Errorf("row %q", r)
		}
		a, err := netip.ParseAddr(r[0])
		if err != nil {
			return nil, err
		}
		var port uint16
		fmt.Sscan(r[1], &port)
		row := shardRow{correlation: r[2], srcNode: r[7], dstNode: r[8], exporter: r[9]}
		fmt.Sscan(r[3], &row.packets)
		fmt.Sscan(r[4], &row.bytes)
		fmt.Sscan(r[5], &row.rp)
		fmt.Sscan(r[6], &row.rb)
		var start int64
		fmt.Sscan(r[10], &start)
		owner := -1
		for _, i := range byLocal[netip.AddrPortFrom(a, port)] {
			if at := conns[i].at.UnixMilli(); at >= start && at-start < 5000 {
				owner = i
				break
			}
		}
		if owner < 0 {
			continue // a connection of another phase on a reused port
		}
		out[owner] = append(out[owner], row)
	}
	return out, nil
}

// awaitConns waits until every connection has a row (merged ones when
// merged is set), then past the correlation timeout for stray halves, and
// returns the rows per connection.
//
// Rows are matched to connections by client address and port and, since
// the kernel reuses a client port within seconds, by time: a row belongs
// to the first connection with its address and port made after the row's
// flow_start, and within 5 s of it.
func (s *storeProcess) awaitConns(t *testing.T, conns []shardConn, merged bool) map[int][]shardRow {
	t.Helper()
	var got map[int][]shardRow
	await(t, 2*time.Minute, "rows of every connection", func() (bool, string) {
		var err error
		if got, err = s.readConns(conns); err != nil {
			return false, err.Error()
		}
		missing := 0
		for i := range conns {
			rows := got[i]
			if len(rows) == 0 || merged && rows[len(rows)-1].correlation != "merged" {
				missing++
			}
		}
		// Without merged, a lost connection has no row ever: settle for
		// all but a few once the writers are idle.
		return missing == 0 || !merged && missing <= 3, fmt.Sprintf("%d of %d connections without their row", missing, len(conns))
	})
	// Stray halves are written a correlation timeout after their arrival.
	time.Sleep(4 * time.Second)
	var err error
	if got, err = s.readConns(conns); err != nil {
		t.Fatal(err)
	}
	return got
}

// daemon is a dualflow process the test can kill and start again with
// the same arguments.
type daemon struct {
	t       testing.TB
	name    string
	bin     string
	args    []string
	cmd     *exec.Cmd
	exited  chan error
	logPath string
	metrics string
	starts  int
}

func newDaemon(t testing.TB, name, bin string, args ...string) *daemon {
	d := &daemon{t: t, name: name, bin: bin, args: args}
	t.Cleanup(d.stop)
	return d
}

// start runs the process and waits until its log has matched every
// pattern (and the metrics URL), returning each pattern's first group.
func (d *daemon) start(patterns ...*regexp.Regexp) []string {
	t := d.t
	t.Helper()
	d.starts++
	d.logPath = filepath.Join(t.TempDir(), fmt.Sprintf("%s-%d.log", d.name, d.starts))
	logFile, err := os.Create(d.logPath)
	if err != nil {
		t.Fatal(err)
	}
	d.cmd = exec.Command(d.bin, d.args...)
	pr, pw := io.Pipe()
	d.cmd.Stdout, d.cmd.Stderr = logFile, io.MultiWriter(logFile, pw)
	if err := kubeapi.StartTied(d.cmd); err != nil {
		t.Fatal(err)
	}
	d.exited = make(chan error, 1)
	go func() { err := d.cmd.Wait(); pw.Close(); logFile.Close(); d.exited <- err }()
	all := append([]*regexp.Regexp{logMetrics}, patterns...)
	found := make([]string, len(all))
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		left := len(all)
		for sc.Scan() {
			for i, re := range all {
				if m := re.FindStringSubmatch(sc.Text()); m != nil && found[i] == "" {
					found[i] = m[1]
					if left--; left == 0 {
						close(ready)
					}
				}
			}
		}
		io.Copy(io.Discard, pr)
	}()
	select {
	case <-ready:
	case err := <-d.exited:
		d.exited <- err
		b, _ := os.ReadFile(d.logPath)
		t.Fatalf("%s exited at start: %v\n%s", d.name, err, b)
	case <-time.After(3 * time.Minute):
		b, _ := os.ReadFile(d.logPath)
		t.Fatalf("%s did not log its addresses within 3 minutes:\n%s", d.name, b)
	}
	d.metrics = found[0] + "/metrics"
	return found[1:]
}

// kill kills the process (SIGKILL) and waits for it.
func (d *daemon) kill() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Kill()
	<-d.exited
	d.cmd = nil
}

// stop ends the process with SIGTERM: it must exit cleanly.
func (d *daemon) stop() {
	if d.cmd == nil {
		return
	}
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-d.exited:
		if err != nil {
			d.t.Errorf("%s exited with %v after SIGTERM; log %s", d.name, err, d.logPath)
		}
	case <-time.After(90 * time.Second):
		_ = d.cmd.Process.Kill()
		d.t.Errorf("%s did not stop within 90 s of SIGTERM; log %s", d.name, d.logPath)
	}
	if d.t.Failed() {
		b, _ := os.ReadFile(d.logPath)
		if len(b) > 6000 {
			b = b[len(b)-6000:]
		}
		d.t.Logf("%s log (end):\n%s", d.name, b)
	}
	d.cmd = nil
}

// metric reads one sample of the process's metrics (the sum over the
// series of name, labels ignored).
func (d *daemon) metric(name string) (float64, error) {
	resp, err := http.Get(d.metrics)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	found := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		var v float64
		if _, err := fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v); err == nil {
			sum += v
			found = true
		}
	}
	if !found {
		return 0, fmt.Errorf("no %s in %s", name, d.metrics)
	}
	return sum, nil
}

// freePort returns a TCP port of host ("127.0.0.1" or "[::1]") that was
// free a moment ago.
func freePort(t testing.TB, host string) int {
	t.Helper()
	ln, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
