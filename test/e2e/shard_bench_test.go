package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/exporter"
	"github.com/dualflow/dualflow/exporter/shard"
	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
	"github.com/dualflow/dualflow/lab/manifest"
)

// Sizes of BenchmarkShardedCollectors.
const (
	// shardBenchConns is the number of connections timed per
	// sub-benchmark when b.N is smaller (it is 1 under -benchtime 1x and
	// make bench's 1s, since one run takes longer). The clock includes
	// the pipeline's fill at the start and, at the end, the last batch's
	// wait for the collectors' flush interval (1 s) and its insert: 1M
	// halves, 10-20 s at this machine's rates, make that a small part.
	// (200k connections took under 5 s, a second of which was that
	// tail.) A larger -benchtime Nx times N connections.
	shardBenchConns = 500_000
	// shardBenchWarm connections go first, untimed: they open the
	// exporters' connections, send the templates and warm the
	// collectors' and the store's caches.
	shardBenchWarm = 10_000
	// shardBenchBatch connections are exported at a time, per node: a
	// poll's worth of a busy node.
	shardBenchBatch = 1000
	// shardBenchWindow bounds the records a node's sharder holds unsent
	// before the generator waits. The exporter's buffer drops the oldest
	// when full (ipfix.DefaultBufferBytes, ~100k records): this keeps the
	// generator well under it.
	shardBenchWindow = 20_000
	// shardBenchMaxHeld is the collectors' --collector.correlate.max-held,
	// four times the default (65,536 halves, ~50 MB): the exporters'
	// window does not bound how far one node's session runs ahead of the
	// other's inside a saturated collector, since the kernel's socket
	// buffers on loopback hold megabytes (tens of thousands of records)
	// per connection. With the default, one run of collectors=1 (of
	// four, the machine shared with make test) wrote 494,688 halves early,
	// unmatched, and never got its merged rows. The peak of
	// dualflow_correlate_held is logged; any half flushed early fails the
	// run at once.
	shardBenchMaxHeld = 1 << 18
	// shardBenchDeadline bounds the wait for the store's rows.
	shardBenchDeadline = 10 * time.Minute
	// shardBenchPortBase is the first client port; ports run up to 65535.
	shardBenchPortBase = 1024
)

// BenchmarkShardedCollectors measures the scale-out path of issue 22 on
// this machine: `dualflow store` owns the embedded engine, N `dualflow
// collector` processes write to it over its ClickHouse HTTP interface, and
// two exporter nodes (node-1, node-2: two shard.Sharders with the
// exporters' configuration, in this process) shard their records over the
// N collectors by connection. Sub-benchmarks collectors=1 and collectors=3
// run in the same process, each with a store and collectors of its own.
//
// Records are synthetic, no lab is needed: cross-node TCP connections
// between pods of the lab manifest (which the collectors load as their
// inventory), half IPv4 and half IPv6, each exported as a source-node half
// by node-1 and a destination-node half by node-2 with the same post-NAT
// tuple and counters, as conntrack on both nodes reports an ended
// connection. Every connection must become one merged row.
//
// The clock runs from the first timed record exported to the moment the
// store holds every connection's merged row (polled every 250 ms through
// the HTTP interface). records/s counts halves (two per connection),
// rows/s merged rows. cpu-µs/record is the CPU time of the store and
// collector processes per half, steadier than the rate on a shared
// machine; store-cpu-µs/record is the store's part of it, and
// exporter-cpu-µs/record the CPU time of this process (both nodes'
// sharders and the generator). ns/op is the whole run: b.N is 1 unless
// -benchtime Nx asks for more than shardBenchConns connections.
//
// It needs no lab (no network namespaces). Run it with the binary built:
//
//	make build && DUALFLOW_E2E=1 DUALFLOW_BIN=$PWD/bin/dualflow CHDB_LIB_PATH=$PWD/.cache/chdb/current/libchdb.so \
//	    go test ./test/e2e/ -run '^$' -bench BenchmarkShardedCollectors -benchtime 1x -timeout 20m
func BenchmarkShardedCollectors(b *testing.B) {
	if testing.Short() {
		b.Skip("starts a store and collector processes")
	}
	requireCHDB(b)
	bin := buildBinary(b)
	m, err := manifest.Generate(manifest.Spec{Mode: manifest.ModeDual})
	if err != nil {
		b.Fatal(err)
	}
	inventory := filepath.Join(b.TempDir(), "manifest.yaml")
	f, err := os.Create(inventory)
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Encode(f); err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	pairs := shardBenchPairs(b, m)
	for _, n := range []int{1, 3} {
		b.Run(fmt.Sprintf("collectors=%d", n), func(b *testing.B) {
			benchSharded(b, bin, inventory, pairs, n)
		})
	}
}

func benchSharded(b *testing.B, bin, inventory string, pairs []shardBenchPair, n int) {
	conns := max(b.N, shardBenchConns)
	if limit := 2 * len(pairs) * (65536 - shardBenchPortBase); conns > limit {
		b.Fatalf("%d connections: the manifest's pod pairs give %d distinct tuples", conns, limit)
	}
	st := startStoreProcess(b, bin)
	store := st.daemon
	var cols []*daemon
	var addrs []string
	for i := range n {
		dir := b.TempDir()
		c := newDaemon(b, fmt.Sprintf("collector-%d", i+1), bin, "collector",
			"--clickhouse.dsn", st.dsn, "--clickhouse.user", chhttp.InserterUser, "--clickhouse.password-file", st.passwordFile,
			"--collector.wal.dir", filepath.Join(dir, "wal"), "--clickhouse.spool-dir", filepath.Join(dir, "spool"),
			"--k8s.source", "inventory", "--k8s.inventory", inventory,
			"--metrics-addr", "127.0.0.1:0", "--web.addr", "",
			"--collector.ipfix.tcp-addr", "[::1]:0", "--collector.ipfix.udp-addr", "",
			"--collector.correlate.max-held", strconv.Itoa(shardBenchMaxHeld))
		m := c.start(logIPFIXTCP)
		cols = append(cols, c)
		addrs = append(addrs, m[0])
	}
	ctx, cancel := context.WithCancel(context.Background())
	nodes := []*benchNode{startBenchNode(b, ctx, "node-1", addrs), startBenchNode(b, ctx, "node-2", addrs)}
	b.Cleanup(func() {
		cancel()
		for _, nd := range nodes {
			select {
			case err := <-nd.done:
				if err != nil {
					b.Errorf("%s: %v", nd.name, err)
				}
			case <-time.After(30 * time.Second):
				b.Errorf("%s's sharder did not stop", nd.name)
			}
		}
	})
	for _, nd := range nodes {
		await(b, time.Minute, nd.name+" connected to every collector", func() (bool, string) {
			s := nd.s.Stats()
			return s.Connected, fmt.Sprintf("%d connects, %d dial failures", s.Connects, s.DialFailures)
		})
	}

	merged := func() (int, int, error) {
		rows, err := st.query(`SELECT countIf(toString(correlation) = 'merged'), count() FROM dualflow.flows`)
		if err != nil {
			return 0, 0, err
		}
		if len(rows) != 1 || len(rows[0]) != 2 {
			return 0, 0, fmt.Errorf("count: %q", rows)
		}
		m, err1 := strconv.Atoi(rows[0][0])
		all, err2 := strconv.Atoi(rows[0][1])
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("count: %q", rows)
		}
		return m, all, nil
	}
	peakHeld := 0.0 // the most halves one collector held, seen at a poll
	awaitMerged := func(want int, sent chan error) {
		b.Helper()
		var last string
		deadline := time.Now().Add(shardBenchDeadline)
		for {
			for _, c := range cols {
				if held, err := c.metric("dualflow_correlate_held"); err == nil {
					peakHeld = max(peakHeld, held)
				}
				if early, err := c.metric("dualflow_correlate_flushed_early_total"); err == nil && early > 0 {
					b.Fatalf("%s wrote %.0f halves early, unmatched (correlate.max-held %d); %s", c.name, early, shardBenchMaxHeld, shardBenchState(nodes, cols))
				}
			}
			select {
			case err := <-sent:
				if err != nil {
					b.Fatal(err)
				}
				sent <- nil // for the caller
			default:
			}
			m, all, err := merged()
			if err == nil && m >= want {
				return
			}
			last = fmt.Sprintf("%d merged rows, %d rows (%v)", m, all, err)
			if time.Now().After(deadline) {
				b.Fatalf("%d merged rows: not within %v; last: %s; %s", want, shardBenchDeadline, last, shardBenchState(nodes, cols))
			}
			time.Sleep(250 * time.Millisecond)
		}
	}

	// Warm-up, untimed, on another destination port than the timed
	// connections so that no tuple repeats.
	warmSent := make(chan error, 1)
	warmSent <- sendBenchConns(ctx, nodes, pairs, shardBenchWarm, manifest.PortHTTP+1)
	awaitMerged(shardBenchWarm, warmSent)

	store0, cpu0, err := benchCPU(store, cols)
	if err != nil {
		b.Fatal(err)
	}
	self0 := selfCPU(b)
	b.ResetTimer()
	sent := make(chan error, 1)
	go func() { sent <- sendBenchConns(ctx, nodes, pairs, conns, manifest.PortHTTP) }()
	awaitMerged(shardBenchWarm+conns, sent)
	b.StopTimer()
	store1, cpu1, err := benchCPU(store, cols)
	if err != nil {
		b.Fatal(err)
	}
	self1 := selfCPU(b)
	if err := <-sent; err != nil {
		b.Fatal(err)
	}
	secs := b.Elapsed().Seconds()
	b.ReportMetric(float64(2*conns)/secs, "records/s")
	b.ReportMetric(float64(conns)/secs, "rows/s")
	b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(2*conns), "cpu-µs/record")
	b.ReportMetric(float64((store1-store0).Microseconds())/float64(2*conns), "store-cpu-µs/record")
	// The two nodes' sharders (this process): the generator must not be
	// what limits the rate.
	b.ReportMetric(float64((self1-self0).Microseconds())/float64(2*conns), "exporter-cpu-µs/record")

	// The rate only means something if every half was delivered and
	// paired: nothing dropped by the exporters, every collector a share,
	// no half held, folded into another or written early, unmatched (no
	// stray half can be written later), and every row merged.
	for _, nd := range nodes {
		s := nd.s.Stats()
		if lost := s.DroppedBufferFull + s.DroppedShutdown + s.DroppedInvalid + s.DroppedOversize; lost > 0 {
			b.Errorf("%s dropped %d records: %+v", nd.name, lost, s)
		}
	}
	var shares []string
	for _, c := range cols {
		got, err := c.metric("dualflow_ipfix_records_total")
		if err != nil || got == 0 {
			b.Errorf("%s received %v records (%v): no share", c.name, got, err)
		}
		shares = append(shares, fmt.Sprintf("%s %.0f", c.name, got))
		for _, name := range []string{"dualflow_correlate_held", "dualflow_correlate_coalesced_total", "dualflow_correlate_flushed_early_total"} {
			if v, err := c.metric(name); err != nil || v != 0 {
				b.Errorf("%s: %s %v (%v), want 0", c.name, name, v, err)
			}
		}
	}
	m, all, err := merged()
	if err != nil {
		b.Fatal(err)
	}
	if want := shardBenchWarm + conns; m != want || all != want {
		b.Errorf("%d merged rows of %d rows, want %d merged and nothing else", m, all, want)
	}
	b.Logf("%d collectors: %d connections (%d halves, %d pod pairs) in %.2f s; records received (warm-up included): %s; peak halves held by a collector: %.0f",
		n, conns, 2*conns, len(pairs), secs, strings.Join(shares, ", "), peakHeld)
}

// shardBenchPair is a pod on node-1 and a pod on node-2, both dual-stack:
// [0] IPv4, [1] IPv6.
type shardBenchPair struct {
	src, dst [2]netip.Addr
}

// shardBenchPairs returns every pair of a pod-network pod on node-1 and
// one on node-2 of m.
func shardBenchPairs(b *testing.B, m *manifest.Manifest) []shardBenchPair {
	addrs := func(node string) [][2]netip.Addr {
		var out [][2]netip.Addr
		for _, p := range m.PodsOnNode(node) {
			if p.Spec.HostNetwork {
				continue
			}
			v4, ok4 := manifest.PodAddr(p, corev1.IPv4Protocol)
			v6, ok6 := manifest.PodAddr(p, corev1.IPv6Protocol)
			if ok4 && ok6 {
				out = append(out, [2]netip.Addr{v4, v6})
			}
		}
		return out
	}
	var pairs []shardBenchPair
	for _, s := range addrs("node-1") {
		for _, d := range addrs("node-2") {
			pairs = append(pairs, shardBenchPair{src: s, dst: d})
		}
	}
	if len(pairs) == 0 {
		b.Fatal("the manifest has no dual-stack pods on node-1 and node-2")
	}
	return pairs
}

// benchNode is one exporter node's sharder.
type benchNode struct {
	name string
	s    *shard.Sharder
	done chan error // Run's result
}

// startBenchNode runs a sharder configured as node's exporter configures
// it (exporter.Config.SetDefaults: the IPFIX defaults, the observation
// domain of the node name) over collectors.
func startBenchNode(b *testing.B, ctx context.Context, node string, collectors []string) *benchNode {
	cfg := exporter.NewConfig()
	cfg.NodeName = node
	cfg.Shard.Collectors = collectors
	cfg.SetDefaults()
	cfg.Shard.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).With("node", node)
	s, err := shard.New(cfg.Shard)
	if err != nil {
		b.Fatal(err)
	}
	nd := &benchNode{name: node, s: s, done: make(chan error, 1)}
	go func() { nd.done <- s.Run(ctx) }()
	return nd
}

// sendBenchConns exports conns connections to dstPort: connection i is
// IPv4 when i is even, IPv6 when odd, between pair (i/2)%len(pairs), from
// client port shardBenchPortBase+(i/2)/len(pairs). node-1 exports the
// source halves, node-2 the destination halves, a batch at a time, each
// waiting while its sharder holds shardBenchWindow records unsent.
func sendBenchConns(ctx context.Context, nodes []*benchNode, pairs []shardBenchPair, conns int, dstPort uint16) error {
	src := make([]flow.Record, 0, shardBenchBatch)
	dst := make([]flow.Record, 0, shardBenchBatch)
	for first := 0; first < conns; first += shardBenchBatch {
		now := time.Now().Truncate(time.Millisecond)
		src, dst = src[:0], dst[:0]
		for i := first; i < min(first+shardBenchBatch, conns); i++ {
			j := i / 2
			p := pairs[j%len(pairs)]
			r := flow.Record{
				FlowStart: now.Add(-2 * time.Second), FlowEnd: now,
				SrcAddr: p.src[i%2], DstAddr: p.dst[i%2],
				SrcPort: uint16(shardBenchPortBase + j/len(pairs)), DstPort: dstPort, Proto: flow.ProtoTCP,
				EndReason: flow.EndReasonEndOfFlow, TCPState: "TIME_WAIT", Source: fipfix.SourceConntrack,
			}
			// A short request and response: a handshake, a few data
			// segments, the close. Both nodes count the same packets.
			pk, rpk := uint64(6+i%5), uint64(5+i%4)
			r.Packets, r.Bytes = pk, pk*66+uint64(200+i%300)
			r.ReversePackets, r.ReverseBytes = rpk, rpk*66+uint64(1000+i%3000)
			r.PacketsDelta, r.BytesDelta, r.ReversePacketsDelta, r.ReverseBytesDelta = r.Packets, r.Bytes, r.ReversePackets, r.ReverseBytes
			r.Normalize()
			r.ExporterNode = nodes[0].name
			src = append(src, r)
			r.ExporterNode = nodes[1].name
			dst = append(dst, r)
		}
		for k, recs := range [][]flow.Record{src, dst} {
			nd := nodes[k]
			deadline := time.Now().Add(shardBenchDeadline)
			for nd.s.Stats().BufferedRecords > shardBenchWindow {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("%s: %d records unsent for %v", nd.name, nd.s.Stats().BufferedRecords, shardBenchDeadline)
				}
				time.Sleep(time.Millisecond)
			}
			nd.s.Export(recs)
			nd.s.Flush()
		}
	}
	return nil
}

// shardBenchState describes the sharders and collectors for a failure.
func shardBenchState(nodes []*benchNode, cols []*daemon) string {
	var parts []string
	for _, nd := range nodes {
		s := nd.s.Stats()
		parts = append(parts, fmt.Sprintf("%s: sent %d, buffered %d, dropped %d/%d, connected %v", nd.name,
			s.Records[0]+s.Records[1], s.BufferedRecords, s.DroppedBufferFull, s.DroppedShutdown, s.Connected))
	}
	for _, c := range cols {
		recv, _ := c.metric("dualflow_ipfix_records_total")
		early, _ := c.metric("dualflow_correlate_flushed_early_total")
		parts = append(parts, fmt.Sprintf("%s: received %.0f, flushed early %.0f (log %s)", c.name, recv, early, c.logPath))
	}
	return strings.Join(parts, "; ")
}

// benchCPU returns the user and system CPU time the store has used so
// far, and the store and the collectors together (/proc/<pid>/stat).
func benchCPU(store *daemon, cols []*daemon) (storeCPU, total time.Duration, err error) {
	for i, p := range append([]*daemon{store}, cols...) {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
		if err != nil {
			return 0, 0, fmt.Errorf("%s cpu: %w", p.name, err)
		}
		// Fields after the command name (in parentheses, which may hold
		// spaces): utime and stime are the 12th and 13th.
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) < 13 {
			return 0, 0, fmt.Errorf("%s cpu: short /proc stat", p.name)
		}
		ut, err1 := strconv.ParseInt(f[11], 10, 64)
		st, err2 := strconv.ParseInt(f[12], 10, 64)
		if err1 != nil || err2 != nil {
			return 0, 0, fmt.Errorf("%s cpu: /proc stat %q %q", p.name, f[11], f[12])
		}
		// USER_HZ is 100 on Linux (sysconf(_SC_CLK_TCK)).
		d := time.Duration(ut+st) * 10 * time.Millisecond
		if i == 0 {
			storeCPU = d
		}
		total += d
	}
	return storeCPU, total, nil
}

// selfCPU returns the user and system CPU time of this process so far.
func selfCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
