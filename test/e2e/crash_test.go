package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/test/kubeapi"
	"github.com/dualflow/dualflow/web"
)

// TestCrashLosesNothing kills the collector with SIGKILL while records it
// has received sit in its queues and unflushed batches, restarts it on the
// same directories, and counts every record sent against every row
// stored, in three IP modes. The write-ahead log must replay what the
// crash lost (before it, kill -9 lost 20% of a stream).
func TestCrashLosesNothing(t *testing.T) {
	t.Parallel() // its own collector processes, directories and ports
	bin := buildBinary(t)
	for _, mode := range []manifest.Mode{manifest.ModeIPv4, manifest.ModeIPv6, manifest.ModeDual} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel() // each mode its own collector process, directory and ports; most of a run waits for flushes
			record(t, mode)
			testCrash(t, bin, mode)
		})
	}
}

var (
	logCHHTTP = regexp.MustCompile(`serving the ClickHouse HTTP interface.* url=(http://[^ ]+)/`)
)

// binaryCollector is one run of the collector binary.
type binaryCollector struct {
	cmd              *exec.Cmd
	exited           chan error
	ipfix, ch, metrs string
	ipfixAll         []string // every TCP listener: IPv4 then IPv6 in dual-stack
	web              string
	log              string
}

func startBinaryCollector(t *testing.T, bin, dir string, mode manifest.Mode, run int, extra ...string) *binaryCollector {
	t.Helper()
	return startBinaryCollectorEnv(t, bin, dir, mode, run, nil, extra...)
}

// startBinaryCollectorEnv is startBinaryCollector with env added to the
// collector's environment.
func startBinaryCollectorEnv(t *testing.T, bin, dir string, mode manifest.Mode, run int, env []string, extra ...string) *binaryCollector {
	t.Helper()
	listen := map[manifest.Mode]string{manifest.ModeIPv4: "127.0.0.1:0", manifest.ModeIPv6: "[::1]:0", manifest.ModeDual: "127.0.0.1:0,[::1]:0"}[mode]
	args := []string{"collector",
		"--k8s.source", "off",
		"--clickhouse.data-dir", filepath.Join(dir, "data"),
		"--clickhouse.http-addr", "127.0.0.1:0",
		// Long enough that a crash always finds rows not yet inserted.
		"--clickhouse.flush-interval", "5s",
		"--metrics-addr", "127.0.0.1:0",
		"--web.addr", "",
		"--collector.ipfix.tcp-addr", listen,
		"--collector.ipfix.udp-addr", "",
	}
	cmd := exec.Command(bin, append(args, extra...)...)
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	c := &binaryCollector{cmd: cmd, exited: make(chan error, 1), log: filepath.Join(dir, fmt.Sprintf("collector-%d.log", run))}
	lf, err := os.Create(c.log)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = lf, io.MultiWriter(lf, pw)
	// Killed with the test process (a plain Pdeathsig fires when the thread
	// that forked it ends, which a parallel test's netns code can cause).
	if err := kubeapi.StartTied(cmd); err != nil {
		t.Fatal(err)
	}
	go func() { c.exited <- cmd.Wait(); pw.Close(); lf.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(c.log)
			if len(b) > 6000 {
				b = b[len(b)-6000:]
			}
			t.Logf("collector run %d log (end):\n%s", run, b)
		}
	})
	wantWeb := slices.Contains(extra, "--web.addr")
	ready := make(chan struct{})
	go func() {
		closed := false
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if m := logCHHTTP.FindStringSubmatch(line); m != nil {
				c.ch = m[1]
			}
			if m := logMetrics.FindStringSubmatch(line); m != nil {
				c.metrs = m[1] + "/metrics"
			}
			if m := logWebURL.FindStringSubmatch(line); m != nil {
				c.web = m[1]
			}
			if m := logIPFIXTCP.FindStringSubmatch(line); m != nil {
				c.ipfixAll = append(c.ipfixAll, m[1])
				slices.SortFunc(c.ipfixAll, func(a, b string) int { return strings.Compare(a, b) }) // "127…" before "[::1]…"
				c.ipfix = c.ipfixAll[0]
			}
			if !closed && len(c.ipfixAll) == strings.Count(listen, ",")+1 && (c.web != "" || !wantWeb) {
				closed = true
				close(ready)
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	select {
	case <-ready:
	case err := <-c.exited:
		t.Fatalf("collector exited at start: %v", err)
	case <-time.After(3 * time.Minute):
		t.Fatal("collector not listening within 3 minutes")
	}
	if c.web != "" {
		registerOperator(t, c.web, filepath.Join(dir, "data", web.LocalTokenFileName))
	}
	return c
}

// metric reads one unlabelled sample from the collector's /metrics.
func (c *binaryCollector) metric(t *testing.T, name string) float64 {
	t.Helper()
	return c.metricWith(t, name, "")
}

// metricWith sums the samples of name whose labels contain label
// (e.g. reason="source_limit").
func (c *binaryCollector) metricWith(t *testing.T, name, label string) float64 {
	t.Helper()
	resp, err := http.Get(c.metrs)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sum := 0.0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		n, labels, _ := strings.Cut(f[0], "{")
		if n == name && strings.Contains(labels, label) {
			v, _ := strconv.ParseFloat(f[1], 64)
			sum += v
		}
	}
	return sum
}

// query runs SQL as the admin user of the users file.
func (c *binaryCollector) query(t *testing.T, dir, q string) string {
	t.Helper()
	users, err := chhttp.LoadUsers(filepath.Join(dir, "data", "http-users.json"))
	if err != nil {
		t.Fatal(err)
	}
	admin, _ := chhttp.Find(users, chhttp.AdminUser)
	req, _ := http.NewRequest("POST", c.ch+"/", strings.NewReader(q))
	req.SetBasicAuth(admin.Name, admin.Password)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("query %q: %d %s", q, resp.StatusCode, b)
	}
	return strings.TrimSpace(string(b))
}

// crashRecords returns records first..first+n-1: ct_mark is the id; the
// family follows the mode (alternating in dual-stack).
func crashRecords(mode manifest.Mode, first, n int) []flow.Record {
	recs := make([]flow.Record, n)
	now := time.Now()
	for i := range recs {
		id := first + i
		six := mode == manifest.ModeIPv6 || (mode == manifest.ModeDual && id%2 == 1)
		src, dst := netip.AddrFrom4([4]byte{198, 18, 1, byte(id % 250)}), netip.AddrFrom4([4]byte{198, 18, 2, 7})
		if six {
			src, dst = netip.MustParseAddr(fmt.Sprintf("fd00:10:0:1::%x", id%250+1)), netip.MustParseAddr("fd00:10:0:2::7")
		}
		recs[i] = flow.Record{FlowStart: now.Add(-time.Second), FlowEnd: now, SrcAddr: src, DstAddr: dst,
			SrcPort: uint16(10000 + id%50000), DstPort: 8080, Proto: flow.ProtoTCP, Packets: 3, Bytes: 300,
			PacketsDelta: 3, BytesDelta: 300, Mark: uint32(id), ExporterNode: "node-1", Source: "conntrack",
			EndReason: flow.EndReasonActiveTimeout}
		recs[i].Normalize()
	}
	return recs
}

// sendIPFIX sends recs over one IPFIX/TCP session, 100 records a message.
func sendIPFIX(t *testing.T, addr string, recs []flow.Record) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	enc := map[uint8]*fipfix.Encoder{}
	enc[4], _ = fipfix.NewEncoder(4, 256)
	enc[6], _ = fipfix.NewEncoder(6, 257)
	var seq uint32
	w := bufio.NewWriterSize(conn, 256<<10)
	write := func(body []byte, n int) {
		hdr := fipfix.AppendMessageHeader(nil, fipfix.MessageHeaderLen+len(body), time.Now(), seq, 1)
		seq += uint32(n)
		if _, err := w.Write(append(hdr, body...)); err != nil {
			t.Fatal(err)
		}
	}
	write(enc[6].AppendTemplateSet(enc[4].AppendTemplateSet(nil)), 0)
	for i := 0; i < len(recs); i += 100 {
		chunk := recs[i:min(i+100, len(recs))]
		var body []byte
		for _, v := range []uint8{4, 6} {
			start := len(body)
			body = append(body, 0, 0, 0, 0)
			k := 0
			for j := range chunk {
				if chunk[j].IPVersion == v {
					body = enc[v].AppendRecord(body, &chunk[j])
					k++
				}
			}
			if k == 0 {
				body = body[:start]
				continue
			}
			fipfix.PutSetHeader(body[start:], enc[v].TemplateID())
		}
		write(body, len(chunk))
	}
	if err := w.Flush(); err != nil {
		t.Fatal(err)
	}
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func testCrash(t *testing.T, bin string, mode manifest.Mode) {
	const half = 60000
	dir := t.TempDir()
	a := startBinaryCollector(t, bin, dir, mode, 1)
	// A first part reaches the store (its frames are acknowledged and must
	// not come back), then the rest of the half follows.
	sendIPFIX(t, a.ipfix, crashRecords(mode, 1, half/2))
	waitFor(t, "the first part stored", 3*time.Minute, func() bool {
		return a.query(t, dir, "SELECT count() FROM dualflow.flows") == strconv.Itoa(half/2)
	})
	sendIPFIX(t, a.ipfix, crashRecords(mode, half/2+1, half-half/2))
	// Every record is read, decoded and journaled: kill -9 now, while the
	// writer holds unflushed batches.
	waitFor(t, "the first half journaled", 3*time.Minute, func() bool { return a.metric(t, "dualflow_wal_records_total") >= half })
	stored := a.query(t, dir, "SELECT count() FROM dualflow.flows")
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.exited
	t.Logf("killed with %s of %d rows stored", stored, half)

	b := startBinaryCollector(t, bin, dir, mode, 2)
	replayed := b.metric(t, "dualflow_wal_replayed_records_total")
	sendIPFIX(t, b.ipfix, crashRecords(mode, half+1, half))
	var uniq, rows, v4, v6 int
	waitFor(t, "every record stored", 4*time.Minute, func() bool {
		f := strings.Fields(b.query(t, dir, "SELECT uniqExact(ct_mark), count(), countIf(ip_version = 4), countIf(ip_version = 6) FROM dualflow.flows"))
		uniq, _ = strconv.Atoi(f[0])
		rows, _ = strconv.Atoi(f[1])
		v4, _ = strconv.Atoi(f[2])
		v6, _ = strconv.Atoi(f[3])
		return uniq >= 2*half
	})
	t.Logf("%s: sent %d, stored %d distinct (%d IPv4, %d IPv6 rows), %d written twice; %v replayed after the kill",
		mode, 2*half, uniq, v4, v6, rows-uniq, replayed)
	if replayed == 0 {
		t.Errorf("nothing replayed: the kill did not find records in flight (the test proves nothing)")
	}
	if rows != uniq {
		t.Errorf("%d records written twice", rows-uniq)
	}
	if lost := 2*half - uniq; lost != 0 {
		t.Errorf("%d records lost", lost)
	}
	if mode == manifest.ModeIPv4 && v6 != 0 || mode == manifest.ModeIPv6 && v4 != 0 || mode == manifest.ModeDual && (v4 == 0 || v6 == 0) {
		t.Errorf("families: %d IPv4, %d IPv6 rows in mode %s", v4, v6, mode)
	}
	// A clean stop leaves an empty log.
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-b.exited:
		if err != nil {
			t.Errorf("collector exited with %v after SIGTERM", err)
		}
	case <-time.After(2 * time.Minute):
		t.Fatal("collector did not stop within 2 minutes of SIGTERM")
	}
	if segs, _ := filepath.Glob(filepath.Join(dir, "wal", "*.wal")); len(segs) != 0 {
		t.Errorf("%d write-ahead log segments left after a clean stop", len(segs))
	}
}

// TestCrashAfterInsert kills the collector in the window the write-ahead
// log alone cannot cover: its first batch is stored, and the process dies
// before acknowledging it (the writer's failpoint, store.FailpointEnv, in
// a binary built with it).
// The restarted collector must find that batch in the store by its token
// (flows.ingest_batch) and not replay it: every record is stored once, in
// three IP modes. Before intents, the whole batch was stored twice.
func TestCrashAfterInsert(t *testing.T) {
	t.Parallel() // as TestCrashLosesNothing
	bin := failpointBinary(t)
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel() // as TestCrashLosesNothing: 20 s of each mode's run is the flush interval
			record(t, mode)
			testCrashAfterInsert(t, bin, mode)
		})
	}
}

func testCrashAfterInsert(t *testing.T, bin string, mode manifest.Mode) {
	const n = 20000
	dir := t.TempDir()
	// The first flush comes 20 s after the start: every record sent is
	// read and journaled by then, so none is lost with the process.
	a := startBinaryCollectorEnv(t, bin, dir, mode, 1, []string{store.FailpointEnv + "=kill-after-insert"}, "--clickhouse.flush-interval", "20s")
	sendIPFIX(t, a.ipfix, crashRecords(mode, 1, n))
	select {
	case <-a.exited:
	case <-time.After(3 * time.Minute):
		t.Fatal("the collector did not kill itself after its first insert")
	}
	b := startBinaryCollector(t, bin, dir, mode, 2)
	verified := b.metric(t, "dualflow_wal_verified_batches_total")
	skipped := b.metric(t, "dualflow_wal_verified_records_total")
	unverified := b.metric(t, "dualflow_wal_unverified_batches_total")
	replayed := b.metric(t, "dualflow_wal_replayed_records_total")
	var uniq, rows int
	waitFor(t, "every record stored", 4*time.Minute, func() bool {
		f := strings.Fields(b.query(t, dir, "SELECT uniqExact(ct_mark), count() FROM dualflow.flows"))
		uniq, _ = strconv.Atoi(f[0])
		rows, _ = strconv.Atoi(f[1])
		return uniq >= n
	})
	t.Logf("%s: sent %d, stored %d distinct, %d rows; at restart %v batches (%v records) found stored, %v unverified, %v records replayed",
		mode, n, uniq, rows, verified, skipped, unverified, replayed)
	if verified < 1 || skipped < 1 {
		t.Errorf("the restart found no stored batch (verified %v, records %v): the failpoint did not fire after an insert, or the lookup failed", verified, skipped)
	}
	if unverified != 0 {
		t.Errorf("%v batches could not be verified", unverified)
	}
	if rows != uniq {
		t.Errorf("%d records written twice", rows-uniq)
	}
	if uniq != n {
		t.Errorf("%d records lost", n-uniq)
	}
	if float64(n) != skipped+replayed {
		t.Errorf("%v records found stored + %v replayed, want the %d journaled", skipped, replayed, n)
	}
}
