package collector

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/pipeline"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
	"github.com/dualflow/dualflow/lab/manifest"
)

// dataDir is the embedded engine's directory shared by this package's
// tests and benchmarks, run one after the other: chDB supports one data
// directory per process at a time.
var dataDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dualflow-collector-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dataDir = filepath.Join(dir, "data")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func needCHDB(tb testing.TB) {
	tb.Helper()
	if _, err := chdb.FindLibrary(""); err != nil {
		if os.Getenv("DUALFLOW_REQUIRE_CHDB") == "1" {
			tb.Fatalf("DUALFLOW_REQUIRE_CHDB=1 but: %v", err)
		}
		tb.Skip("libchdb not available (make deps)")
	}
}

// inventoryFile writes the lab's 2-node dual-stack manifest.
func inventoryFile(tb testing.TB) string {
	m, err := manifest.Generate(manifest.Spec{Mode: manifest.ModeDual, Nodes: 2})
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(tb.TempDir(), "manifest.yaml")
	f, err := os.Create(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := m.Encode(f); err != nil {
		tb.Fatal(err)
	}
	return path
}

// startCollector runs a collector on the shared data directory with IPFIX
// on loopback ports chosen by the kernel. The returned stop cancels it and
// waits for Run.
func startCollector(tb testing.TB, mutate func(*Config)) (*Collector, func()) {
	tb.Helper()
	return startCollectorThen(tb, mutate, nil)
}

// startCollectorThen is startCollector, calling before (if not nil) on
// the collector before it runs.
func startCollectorThen(tb testing.TB, mutate func(*Config), before func(*Collector)) (*Collector, func()) {
	tb.Helper()
	needCHDB(tb)
	var cfg Config
	cfg.Store.DataDir = dataDir
	cfg.Writer.FlushInterval = 100 * time.Millisecond
	cfg.IPFIX.TCPAddrs = []string{"127.0.0.1:0", "[::1]:0"}
	cfg.IPFIX.UDPAddrs = []string{"127.0.0.1:0"}
	cfg.Correlate.Timeout = 500 * time.Millisecond
	cfg.InventoryFile = inventoryFile(tb)
	if mutate != nil {
		mutate(&cfg)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := New(context.Background(), cfg, log)
	if err != nil {
		tb.Fatal(err)
	}
	if before != nil {
		before(c)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("collector run: %v", err)
		}
	}
	tb.Cleanup(stop)
	return c, stop
}

// exporter sends IPFIX over one TCP connection as a node's exporter would.
type exporter struct {
	buf    []byte // reused message buffer
	body   []byte // reused message body
	conn   net.Conn
	enc    map[uint8]*fipfix.Encoder
	seq    uint32
	domain uint32
}

func dialExporter(tb testing.TB, addr net.Addr, domain uint32) *exporter {
	c, err := net.Dial(addr.Network(), addr.String())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { c.Close() })
	e4, _ := fipfix.NewEncoder(4, 256)
	e6, _ := fipfix.NewEncoder(6, 257)
	x := &exporter{conn: c, enc: map[uint8]*fipfix.Encoder{4: e4, 6: e6}, domain: domain}
	var body []byte
	body = e4.AppendTemplateSet(body)
	body = e6.AppendTemplateSet(body)
	x.write(tb, body, 0)
	return x
}

func (x *exporter) write(tb testing.TB, body []byte, records int) {
	x.buf = fipfix.AppendMessageHeader(x.buf[:0], fipfix.MessageHeaderLen+len(body), time.Now(), x.seq, x.domain)
	x.seq += uint32(records)
	x.buf = append(x.buf, body...)
	if _, err := x.conn.Write(x.buf); err != nil {
		tb.Fatal(err)
	}
}

// send sends recs in one message, one data set per family.
func (x *exporter) send(tb testing.TB, recs ...flow.Record) {
	x.body = x.appendBody(x.body[:0], recs)
	x.write(tb, x.body, len(recs))
}

// sendRepeated sends msgs messages of recs, encoding the data sets once and
// packing the messages into writes of about 64 KiB: the benchmark's
// exporter shares the collector's two cores and should take little of them.
// It may run in its own goroutine, alone on x.
func (x *exporter) sendRepeated(recs []flow.Record, msgs int) error {
	x.body = x.appendBody(x.body[:0], recs)
	buf := x.buf[:0]
	defer func() { x.buf = buf }()
	for i := range msgs {
		buf = fipfix.AppendMessageHeader(buf, fipfix.MessageHeaderLen+len(x.body), time.Now(), x.seq, x.domain)
		x.seq += uint32(len(recs))
		buf = append(buf, x.body...)
		if len(buf) >= 64<<10-len(x.body)-fipfix.MessageHeaderLen || i == msgs-1 {
			if _, err := x.conn.Write(buf); err != nil {
				return err
			}
			buf = buf[:0]
		}
	}
	return nil
}

// appendBody appends recs as one data set per family.
func (x *exporter) appendBody(body []byte, recs []flow.Record) []byte {
	for _, v := range []uint8{4, 6} {
		start := len(body)
		body = append(body, 0, 0, 0, 0)
		n := 0
		for i := range recs {
			if flow.Version(recs[i].SrcAddr) == v {
				body = x.enc[v].AppendRecord(body, &recs[i])
				n++
			}
		}
		if n == 0 {
			body = body[:start]
			continue
		}
		fipfix.PutSetHeader(body[start:], x.enc[v].TemplateID())
	}
	return body
}

func half(node, src, dst string, sport uint16, packets uint64) flow.Record {
	now := time.Now().Truncate(time.Millisecond)
	return flow.Record{
		FlowStart: now.Add(-time.Second), FlowEnd: now,
		SrcAddr: netip.MustParseAddr(src), DstAddr: netip.MustParseAddr(dst),
		SrcPort: sport, DstPort: 8080, Proto: flow.ProtoTCP,
		Packets: packets, Bytes: packets * 60, ReversePackets: packets, ReverseBytes: packets * 70,
		PacketsDelta: packets, BytesDelta: packets * 60, ReversePacketsDelta: packets, ReverseBytesDelta: packets * 70,
		EndReason: flow.EndReasonEndOfFlow, TCPState: "TIME_WAIT",
		ExporterNode: node, Source: fipfix.SourceConntrack,
	}
}

// query runs q until it returns want rows or the deadline passes.
func query(tb testing.TB, c *Collector, q string, want int) []string {
	tb.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := c.Conn().Query(context.Background(), q, "TSV")
		if err != nil {
			tb.Fatal(err)
		}
		rows := strings.Split(strings.TrimSpace(string(out)), "\n")
		if len(out) == 0 {
			rows = nil
		}
		if len(rows) >= want || time.Now().After(deadline) {
			return rows
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestPipeline sends the halves of cross-node, intra-node and one-sided
// connections of both families from two "node exporters" and checks what
// lands in ClickHouse.
func TestPipeline(t *testing.T) {
	c, stop := startCollector(t, nil)
	addrs := c.IPFIXAddrs()["tcp"]
	n1 := dialExporter(t, addrs[0], 1) // IPv4 socket
	n2 := dialExporter(t, addrs[1], 2) // IPv6 socket
	// Distinct source ports per case; the query selects by port.
	type fam struct{ p1a, p1b, p2 string }
	fams := map[string]fam{
		"ipv4": {"198.18.1.10", "198.18.1.11", "198.18.2.11"},
		"ipv6": {"fd00:10:0:1::10", "fd00:10:0:1::11", "fd00:10:0:2::11"},
	}
	base := map[string]uint16{"ipv4": 41000, "ipv6": 42000}
	for name, f := range fams {
		p := base[name]
		n1.send(t, half("node-1", f.p1a, f.p2, p+1, 10), half("node-1", f.p1a, f.p1b, p+2, 3), half("node-1", f.p1a, f.p2, p+3, 1))
		n2.send(t, half("node-2", f.p1a, f.p2, p+1, 9), half("node-2", f.p1a, f.p2, p+4, 2))
	}
	rows := query(t, c, "SELECT ip_version, src_port, correlation, packets_total, exporter_node, src_node, dst_node FROM dualflow.flows WHERE src_port BETWEEN 41000 AND 42999 ORDER BY src_port", 8)
	want := []string{
		"4\t41001\tmerged\t10\tnode-1\tnode-1\tnode-2",
		"4\t41002\tnone\t3\tnode-1\tnode-1\tnode-1",
		"4\t41003\tsource_only\t1\tnode-1\tnode-1\tnode-2",
		"4\t41004\tdestination_only\t2\tnode-2\tnode-1\tnode-2",
		"6\t42001\tmerged\t10\tnode-1\tnode-1\tnode-2",
		"6\t42002\tnone\t3\tnode-1\tnode-1\tnode-1",
		"6\t42003\tsource_only\t1\tnode-1\tnode-1\tnode-2",
		"6\t42004\tdestination_only\t2\tnode-2\tnode-1\tnode-2",
	}
	if strings.Join(rows, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(rows, "\n"), strings.Join(want, "\n"))
	}
	stop()
}

// TestShutdownFlushesHeld checks that halves still waiting at shutdown are
// written (unmatched), not lost.
func TestShutdownFlushesHeld(t *testing.T) {
	c, stop := startCollector(t, func(c *Config) { c.Correlate.Timeout = time.Hour })
	x := dialExporter(t, c.IPFIXAddrs()["tcp"][0], 1)
	x.send(t, half("node-1", "198.18.1.10", "198.18.2.11", 43001, 5), half("node-1", "fd00:10:0:1::10", "fd00:10:0:2::11", 43002, 5))
	// Wait until the correlator holds both, then stop.
	deadline := time.Now().Add(5 * time.Second)
	for c.correlator.Held() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	c2, _ := startCollector(t, nil)
	rows := query(t, c2, "SELECT src_port, correlation FROM dualflow.flows WHERE src_port IN (43001, 43002) ORDER BY src_port", 2)
	if strings.Join(rows, ",") != "43001\tsource_only,43002\tsource_only" {
		t.Errorf("rows %q", rows)
	}
}

// BenchmarkEndToEnd measures records/s from IPFIX over TCP into the
// embedded ClickHouse, counted when the rows are visible to a query.
//
// bare: records of connections the collector knows nothing about (no
// inventory), so rows carry addresses, ports and counters only.
// enriched: pod-to-pod connections of the lab inventory (same node, so no
// correlation wait), so every row also carries both pods' namespaces,
// names, labels, workloads, nodes and zones, and the policy verdicts the
// auditor evaluates: the widest rows the collector writes. With the
// write-ahead log (the default) it is measured against the engine's
// ceiling for the same rows (benchEndToEndCeiling).
func BenchmarkEndToEnd(b *testing.B) {
	for _, wal := range []bool{true, false} {
		name := ""
		if !wal {
			name = "/no-wal" // the cost of crash protection: compare with the default
		}
		b.Run("bare"+name, func(b *testing.B) {
			benchEndToEnd(b, false, wal, true, "198.18.1.10", "198.18.2.11", "fd00:10:0:1::10", "fd00:10:0:2::11")
		})
		b.Run("enriched"+name, func(b *testing.B) {
			if wal {
				benchEndToEndCeiling(b, "198.18.1.10", "198.18.1.11", "fd00:10:0:1::10", "fd00:10:0:1::11")
				return
			}
			benchEndToEnd(b, true, wal, true, "198.18.1.10", "198.18.1.11", "fd00:10:0:1::10", "fd00:10:0:1::11")
		})
	}
	// The flow metrics' share (issue 39: at most 5% of the pipeline):
	// compare with enriched/no-wal, whose flow metrics are the default.
	b.Run("enriched/no-wal/no-flow-metrics", func(b *testing.B) {
		benchEndToEnd(b, true, false, false, "198.18.1.10", "198.18.1.11", "fd00:10:0:1::10", "fd00:10:0:1::11")
	})
}

func benchEndToEnd(b *testing.B, enriched, wal, flowMetrics bool, src4, dst4, src6, dst6 string) {
	c, stop := startCollector(b, func(c *Config) {
		if !wal {
			c.WAL.Dir = "off"
		}
		if !flowMetrics {
			c.FlowMetricsFile = filepath.Join(b.TempDir(), "flow-metrics.yaml")
			if err := os.WriteFile(c.FlowMetricsFile, []byte("metrics: []\n"), 0o644); err != nil {
				b.Fatal(err)
			}
		}
		if enriched {
			c.K8s = enrich.NewConfig()
			c.K8s.Source, c.K8s.Inventory = enrich.SourceInventory, []string{c.InventoryFile}
		} else {
			c.InventoryFile = "" // nothing to enrich, no correlation wait
		}
		c.Writer.FlushInterval = time.Second
	})
	defer stop()
	x := dialExporter(b, c.IPFIXAddrs()["tcp"][0], 1)
	recs := endToEndRecords(src4, dst4, src6, dst6)
	count := func(q string) int {
		out, err := c.Conn().Query(context.Background(), q, "TSV")
		if err != nil {
			b.Fatal(err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
		return n
	}
	countRows := func() int { return count("SELECT count() FROM dualflow.flows") }
	before := countRows()
	// The exporter streams without pause: an untimed warm-up (the heap and
	// the engine's caches grow from cold), then b.N times 5M records, then
	// two batches more. The timer runs from the moment the warm-up's rows
	// are all visible to the moment b.N×5M more are: the sustained rate,
	// which is what sizes a collector. The pipeline's fill at the start and
	// the insert of the last batch at the end (one batch of latency, with
	// one inserter busy) fall outside it.
	//
	// 5M rather than the 1M of the reference stream: the engine
	// merges the flows table's parts about 20 at a time (migration 0005),
	// 2M rows at the default batch size, and a sustained stream pays for
	// those merges. A 1M stream ends before the first one: it gave
	// 300k-420k enriched records/s where 5-6M gave 260k-290k for the
	// same code, in the same hour.
	const total, warm = 5_000_000, 200_000
	want := warm + total*b.N
	sent := make(chan error, 1)
	go func() { sent <- x.sendRepeated(recs, (want+2*store.DefaultBatchRows)/endToEndPerMsg) }()
	// Rows are visible once their insert returns (see awaitRows).
	written := func() int64 { return c.Writer().Stats().RowsWritten }
	before64 := written()
	waitRows := func(n int) {
		awaitRows(b, n, 2*time.Minute, func() int64 { return written() - before64 }, func() int { return countRows() - before }, sent)
	}
	waitRows(warm)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	waitRows(want)
	b.StopTimer()
	// CPU time per record, of the whole process (the engine runs in it):
	// steadier than the rate on a shared VM, whose speed varies.
	b.ReportMetric(float64((processCPU(b)-cpu0).Microseconds())/float64(total*b.N), "cpu-µs/record")
	if err := <-sent; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(total*b.N)/b.Elapsed().Seconds(), "records/s")
	if enriched {
		// The measurement is only what it says if the rows were enriched.
		if got := count(enrichedRowsSQL); got < want {
			out, _ := c.Conn().Query(context.Background(), "SELECT src_ip, dst_ip, src_pod_name, dst_pod_name, src_pod_labels, ingress_verdict, egress_verdict, correlation FROM dualflow.flows WHERE src_port < "+strconv.Itoa(endToEndPerMsg)+" ORDER BY time_received DESC LIMIT 2", "TSV")
			b.Fatalf("%d enriched rows, want at least %d; newest rows:\n%s", got, want, out)
		}
	}
}

// endToEndPerMsg is the records per IPFIX message of the end-to-end
// benchmarks: endToEndRecords, sent again and again.
const endToEndPerMsg = 40

// endToEndRecords returns the end-to-end benchmarks' records: node-1's
// halves of endToEndPerMsg connections, 3 in 5 IPv4, the rest IPv6.
func endToEndRecords(src4, dst4, src6, dst6 string) []flow.Record {
	recs := make([]flow.Record, endToEndPerMsg)
	for i := range recs {
		if i%5 < 3 {
			recs[i] = half("node-1", src4, dst4, uint16(i), uint64(i+1))
		} else {
			recs[i] = half("node-1", src6, dst6, uint16(i), uint64(i+1))
		}
	}
	return recs
}

// enrichedRowsSQL counts the end-to-end benchmarks' rows that carry both
// pods, labels and a verdict: a measurement of the enriched pipeline is
// only what it says if its rows were enriched.
var enrichedRowsSQL = "SELECT count() FROM dualflow.flows WHERE src_port < " + strconv.Itoa(endToEndPerMsg) +
	" AND src_pod_name != '' AND dst_pod_name != '' AND mapContains(src_pod_labels, 'app') AND ingress_verdict != 'unknown'"

// awaitRows waits until written() and rows() both reach n, the writer's
// counter first: a query costs the engine CPU (about 1.3 ms; polling it
// every 20 ms took 3% of the machine from the pipeline being measured), so
// the table is asked only once the rows may be there. A send error on
// sent fails the benchmark; a nil one is put back for the caller.
func awaitRows(b *testing.B, n int, budget time.Duration, written func() int64, rows func() int, sent chan error) {
	deadline := time.Now().Add(budget)
	for written() < int64(n) || rows() < n {
		select {
		case err := <-sent:
			if err != nil {
				b.Fatal(err)
			}
			sent <- nil
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d rows of %d arrived", rows(), n)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// processCPU returns the user and system CPU time of the process so far.
func processCPU(tb testing.TB) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestHTTPInterfaceAuth: the embedded store's HTTP interface authenticates
// with the users the collector writes at first start (it had no
// authentication: any local user could read and write through it).
func TestHTTPInterfaceAuth(t *testing.T) {
	c, _ := startCollector(t, func(c *Config) { c.Store.HTTPAddr = "127.0.0.1:0" })
	path := filepath.Join(dataDir, "http-users.json")
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("users file: %v %v, want mode 0600", err, fi)
	}
	users, err := chhttp.LoadUsers(path)
	if err != nil {
		t.Fatal(err)
	}
	post := func(user, password, q string) (int, string) {
		req, _ := http.NewRequest("POST", "http://"+c.HTTPAddr().String()+"/", strings.NewReader(q))
		if user != "" {
			req.SetBasicAuth(user, password)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := post("", "", "SELECT count() FROM dualflow.flows"); code != 401 {
		t.Errorf("anonymous: %d %s", code, body)
	}
	admin, _ := chhttp.Find(users, chhttp.AdminUser)
	reader, _ := chhttp.Find(users, chhttp.ReaderUser)
	if code, body := post(admin.Name, admin.Password, "SELECT count() > -1 FROM dualflow.flows"); code != 200 || strings.TrimSpace(body) != "1" {
		t.Errorf("admin: %d %s", code, body)
	}
	if code, body := post(reader.Name, reader.Password, "CREATE TABLE dualflow.reader_was_here (a UInt8) ENGINE = Memory"); code == 200 {
		t.Errorf("reader created a table: %s", body)
	}
}

// captureEnricher passes records to next and keeps a copy of the first
// want it enriched.
type captureEnricher struct {
	next pipeline.Enricher
	want int
	mu   sync.Mutex
	recs []flow.Record
	full atomic.Bool
}

func (c *captureEnricher) Enrich(recs []flow.Record) {
	c.next.Enrich(recs)
	if c.full.Load() {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.recs == nil {
		c.recs = make([]flow.Record, 0, c.want)
	}
	n := min(len(recs), c.want-len(c.recs))
	c.recs = append(c.recs, recs[:n]...)
	if len(c.recs) == c.want {
		c.full.Store(true)
	}
}

// benchEndToEndCeiling measures the enriched pipeline (IPFIX over TCP ->
// decode -> write-ahead log -> correlate -> enrich -> audit -> write), the
// collector's default configuration, as a share of the engine's own limit
// for the same rows, in the same process and on the same engine:
//
//   - the ceiling: the rows the pipeline wrote in the warm-up (one batch
//     of them, captured after enrichment and auditing) encoded once as the
//     writer's Native block, and inserted as many times as the stream has
//     batches by as many goroutines as the writer has inserters: the
//     engine's work with no Go work;
//   - the pipeline: the exporter sends the same number of records.
//
// Each is timed from its start to the moment every row is visible to a
// query, on emptied tables. An op runs ceiling, pipeline, pipeline,
// ceiling (this shared VM's speed drifts: runs far apart compare badly).
// records/s is the pipeline's rate, ceiling-rows/s the engine's,
// %-of-ceiling their ratio (total times).
func benchEndToEndCeiling(b *testing.B, src4, dst4, src6, dst6 string) {
	capture := &captureEnricher{want: store.DefaultBatchRows}
	c, stop := startCollectorThen(b, func(c *Config) {
		c.K8s = enrich.NewConfig()
		c.K8s.Source, c.K8s.Inventory = enrich.SourceInventory, []string{c.InventoryFile}
		c.Writer.FlushInterval = time.Second
	}, func(c *Collector) {
		capture.next = c.enricher
		c.enricher = capture // before Run
	})
	defer stop()
	e, ok := c.Conn().(*store.Embedded)
	if !ok {
		b.Fatalf("the collector's store is %T, not the embedded engine", c.Conn())
	}
	x := dialExporter(b, c.IPFIXAddrs()["tcp"][0], 1)
	recs := endToEndRecords(src4, dst4, src6, dst6)
	ctx := context.Background()
	count := func(q string) int {
		out, err := e.Query(ctx, q, "TSV")
		if err != nil {
			b.Fatal(err)
		}
		n, _ := strconv.Atoi(strings.TrimSpace(string(out)))
		return n
	}
	countRows := func() int { return count("SELECT count() FROM dualflow.flows") }
	truncate := func() {
		for _, t := range []string{"flows", "rollup_pod_to_pod_1m", "rollup_pod_to_service_1m", "rollup_node_to_node_1m", "rollup_policy_1m"} {
			if err := e.Exec(ctx, "TRUNCATE TABLE dualflow."+t); err != nil {
				b.Fatal(err)
			}
		}
	}
	// visible waits until n rows are in the (emptied) table.
	visible := func(n int, written func() int64, sent chan error) {
		awaitRows(b, n, 5*time.Minute, written, countRows, sent)
		if got := countRows(); got != n {
			b.Fatalf("%d rows, want %d", got, n)
		}
	}
	// pipeline streams n records (whole batches: the last one is not left
	// to the flush interval), returns the time to visible rows, and checks
	// (untimed) that every row was enriched.
	const total = 5_000_000
	var cpu time.Duration
	pipeline := func(n int) time.Duration {
		truncate()
		runtime.GC()
		w0 := c.Writer().Stats().RowsWritten
		written := func() int64 { return c.Writer().Stats().RowsWritten - w0 }
		cpu0 := processCPU(b)
		t0 := time.Now()
		sent := make(chan error, 1)
		go func() { sent <- x.sendRepeated(recs, n/endToEndPerMsg) }()
		visible(n, written, sent)
		d := time.Since(t0)
		cpu += processCPU(b) - cpu0
		if err := <-sent; err != nil {
			b.Fatal(err)
		}
		// The measurement is only what it says if the rows were enriched.
		if got := count(enrichedRowsSQL); got != n {
			b.Fatalf("%d enriched rows of %d", got, n)
		}
		return d
	}
	// The warm-up, untimed: the heap, the writer's buffers and the
	// engine's caches grow from cold, and the capture fills.
	pipeline(2 * store.DefaultBatchRows)
	if !capture.full.Load() {
		b.Fatalf("captured %d enriched records of %d", len(capture.recs), capture.want)
	}
	blocks := make([]*store.NativeBlock, store.DefaultInserters)
	for i := range blocks {
		blocks[i] = store.NewNativeBlock(capture.recs)
	}
	var ceilingCPU time.Duration
	ceiling := func() time.Duration {
		truncate()
		runtime.GC()
		cpu0 := processCPU(b)
		t0 := time.Now()
		err := e.InsertNativeBlocks(ctx, len(blocks), total/blocks[0].Rows(), func(_, w int) *store.NativeBlock { return blocks[w] })
		if err != nil {
			b.Fatal(err)
		}
		if got := countRows(); got != total {
			b.Fatalf("ceiling: %d rows, want %d", got, total)
		}
		d := time.Since(t0)
		ceilingCPU += processCPU(b) - cpu0
		return d
	}
	ceiling()
	cpu, ceilingCPU = 0, 0
	b.ReportAllocs()
	b.ResetTimer()
	var ceilingTime, pipelineTime time.Duration
	for range b.N {
		ceilingTime += ceiling()
		pipelineTime += pipeline(total)
		pipelineTime += pipeline(total)
		ceilingTime += ceiling()
	}
	b.StopTimer()
	runs := float64(2 * total * b.N)
	b.ReportMetric(runs/pipelineTime.Seconds(), "records/s")
	b.ReportMetric(runs/ceilingTime.Seconds(), "ceiling-rows/s")
	b.ReportMetric(100*ceilingTime.Seconds()/pipelineTime.Seconds(), "%-of-ceiling")
	b.ReportMetric(float64(cpu.Microseconds())/runs, "cpu-µs/record")
	// The engine's CPU per row: the pipeline's Go work is the difference.
	b.ReportMetric(float64(ceilingCPU.Microseconds())/runs, "ceiling-cpu-µs/row")
}

// TestInserterCollector: a collector of `dualflow store` logs in as the
// inserter, which may not apply migrations (before, collectors had to be
// the admin because they did): it checks that the schema is current
// instead, and inserts.
func TestInserterCollector(t *testing.T) {
	owner, _ := startCollector(t, func(c *Config) { c.Store.HTTPAddr = "127.0.0.1:0" })
	users, err := chhttp.LoadUsers(filepath.Join(dataDir, "http-users.json"))
	if err != nil {
		t.Fatal(err)
	}
	inserter, ok := chhttp.Find(users, chhttp.InserterUser)
	if !ok {
		t.Fatalf("no inserter in %+v", users)
	}
	pw := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(pw, []byte(inserter.Password), 0o600); err != nil {
		t.Fatal(err)
	}
	var cfg Config
	cfg.Store.DSN = "http://" + owner.HTTPAddr().String() + "/"
	cfg.Store.Username, cfg.Store.PasswordFile = inserter.Name, pw
	cfg.StoreWait = 10 * time.Second
	cfg.IPFIX.TCPAddrs = []string{"127.0.0.1:0"}
	cfg.InventoryFile = inventoryFile(t)
	c, err := New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("a collector logged in as the inserter: %v", err)
	}
	defer c.Conn().Close()
	ctx := context.Background()
	before, err := owner.Conn().Query(ctx, "SELECT count() FROM dualflow.flows", "TSV")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Conn().Exec(ctx, "INSERT INTO dualflow.flows (flow_end, ip_version, src_ip_in, dst_ip_in) VALUES (now(), 6, 'fd00:10::1', 'fd00:10::2'), (now(), 4, '::ffff:198.18.0.1', '::ffff:198.18.0.2')"); err != nil {
		t.Fatalf("insert as the inserter: %v", err)
	}
	after, err := owner.Conn().Query(ctx, "SELECT count() FROM dualflow.flows", "TSV")
	if err != nil {
		t.Fatal(err)
	}
	var n0, n1 int
	fmt.Sscan(string(before), &n0)
	fmt.Sscan(string(after), &n1)
	if n1 != n0+2 {
		t.Errorf("rows %d → %d after the inserter's INSERT of 2", n0, n1)
	}
	if err := c.Conn().Exec(ctx, "DROP TABLE dualflow.flows"); err == nil {
		t.Error("the inserter dropped the flows table")
	}
}

// TestDroppedTableRecreated: DROP TABLE dualflow.flows through SQL left
// the store empty for good: /readyz said ok, inserts spooled, and a
// restart did not recreate the table because the ledger said it existed.
// Now the collector compares the database with what the migrations make:
// at start it recreates what is missing, while it runs it does so every
// schemaCheckInterval, and readiness fails while the table refuses rows.
func TestDroppedTableRecreated(t *testing.T) {
	needCHDB(t)
	old := schemaCheckInterval
	schemaCheckInterval = time.Hour // the running repair is triggered below
	t.Cleanup(func() { schemaCheckInterval = old })
	ctx := context.Background()
	count := func(c *Collector, q string) string {
		out, err := c.Conn().Query(ctx, q, "TSV")
		if err != nil {
			return err.Error()
		}
		return strings.TrimSpace(string(out))
	}
	c, stop := startCollector(t, nil)
	<-c.Ready()
	if err := c.Readiness(ctx); err != nil {
		t.Fatalf("a new collector is not ready: %v", err)
	}
	for _, q := range []string{"DROP TABLE dualflow.flows SYNC", "DROP TABLE dualflow.rollup_policy_1m_ingress_mv SYNC"} {
		if err := c.Conn().Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	// A batch is refused: readiness says so.
	rec := flow.Record{FlowEnd: time.Now(), IPVersion: 6, SrcAddr: netip.MustParseAddr("fd00:10::1"), DstAddr: netip.MustParseAddr("fd00:10::2"), Proto: 6, SrcPort: 40000, DstPort: 8080, Packets: 1, Bytes: 60}
	if err := c.Writer().Write(ctx, []flow.Record{rec}); err != nil {
		t.Fatal(err)
	}
	_ = c.Writer().Flush(ctx)
	deadline := time.Now().Add(time.Minute)
	for c.Readiness(ctx) == nil {
		if time.Now().After(deadline) {
			t.Fatal("readiness stayed ok with the flows table dropped and a batch refused")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("not ready: %v", c.Readiness(ctx))
	// The running collector repairs at its next check.
	fixed, err := c.schema.Ensure(ctx)
	if err != nil || len(fixed) != 2 {
		t.Fatalf("repair: %v %v, want the table and the view", fixed, err)
	}
	if got := count(c, "EXISTS TABLE dualflow.flows"); got != "1" {
		t.Fatalf("flows after the repair: %s", got)
	}
	stop()

	// A restart repairs too: the ledger is not trusted alone.
	db, err := chdb.Open(chdb.Config{DataDir: dataDir})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(ctx, "DROP TABLE dualflow.flows SYNC"); err != nil {
		t.Fatal(err)
	}
	db.Close()
	c2, _ := startCollector(t, nil)
	<-c2.Ready()
	if got := count(c2, "EXISTS TABLE dualflow.flows"); got != "1" {
		t.Fatalf("flows after a restart: %s", got)
	}
	if err := c2.Readiness(ctx); err != nil {
		t.Errorf("not ready after the restart's repair: %v", err)
	}
	mfs, _ := c2.Registry().Gather()
	for _, mf := range mfs {
		if mf.GetName() == "dualflow_store_schema_repairs_total" {
			for _, m := range mf.GetMetric() {
				t.Logf("repairs %v = %v", m.GetLabel(), m.GetCounter().GetValue())
			}
		}
	}
}
