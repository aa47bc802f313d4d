package exporter

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/exporter/conntrack"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/test/support/ipfixtest"
	"github.com/dualflow/dualflow/test/support/logtest"
)

// fakeSource is a conntrack table in memory.
type fakeSource struct {
	mu     sync.Mutex
	table  []connstore.Conn
	acct   conntrack.Accounting
	acctEr error
	dumps  atomic.Int32
	events chan []connstore.Conn
	errs   chan error
	// dumpErr makes every Dump fail.
	dumpErr error
}

func newFake(conns ...connstore.Conn) *fakeSource {
	return &fakeSource{table: conns, acct: conntrack.Accounting{Acct: true, Timestamp: true, Events: true},
		events: make(chan []connstore.Conn), errs: make(chan error)}
}

func (f *fakeSource) set(conns ...connstore.Conn) {
	f.mu.Lock()
	f.table = conns
	f.mu.Unlock()
}

func (f *fakeSource) Dump(v uint8, dst []connstore.Conn) ([]connstore.Conn, error) {
	f.dumps.Add(1)
	if f.dumpErr != nil {
		return dst, f.dumpErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range f.table {
		if c.Key.IPVersion() == v {
			dst = append(dst, c)
		}
	}
	return dst, nil
}

func (f *fakeSource) Listen(ctx context.Context, fn func([]connstore.Conn)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case b := <-f.events:
			fn(b)
		case err := <-f.errs:
			return err
		}
	}
}

func (f *fakeSource) Accounting() (conntrack.Accounting, error) { return f.acct, f.acctEr }
func (f *fakeSource) Close() error                              { return nil }

func a(s string) netip.Addr { return netip.MustParseAddr(s) }

// conn is a TCP connection client:sport → server:8080 with p packets each
// way.
// connStart is the start time of every conn: a connection's start time
// does not change between observations (a new one means a new connection
// on the tuple).
var connStart = time.Now().Add(-time.Second).Truncate(time.Millisecond)

func conn(client, server string, sport uint16, p uint64) connstore.Conn {
	k := connstore.Key{Tuple: flow.Tuple{Src: a(client), Dst: a(server), Proto: flow.ProtoTCP, SrcPort: sport, DstPort: 8080}}
	return connstore.Conn{Key: k, ID: uint32(sport), DstAddr: k.Dst, DstPort: k.DstPort, Start: connStart,
		Packets: p, Bytes: 100 * p, ReversePackets: p, ReverseBytes: 100 * p, HasCounters: true, TCPState: "ESTABLISHED", Mark: 7}
}

func testConfig(collector string) Config {
	c := NewConfig()
	c.NodeName = "node-a"
	c.MetricsAddr = "127.0.0.1:0"
	c.PollInterval = 50 * time.Millisecond
	c.Store.IdleTimeout = 300 * time.Millisecond
	c.Store.ActiveTimeout = time.Hour
	c.IPFIX.Address = collector
	c.IPFIX.FlushInterval = 20 * time.Millisecond
	c.LocalCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("fd00:10:1::/64")}
	c.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16"), netip.MustParsePrefix("fd00:10::/32")}
	c.SetDefaults()
	return c
}

// run starts e and returns a stop func that cancels and waits for Run.
func run(t *testing.T, e *Exporter) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	select {
	case <-e.Ready():
	case err := <-done:
		t.Fatalf("Run: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("exporter did not start")
	}
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(15 * time.Second):
				err = errors.New("Run did not return")
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	return stop
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func byReason(recs []flow.Record, reason flow.EndReason, v uint8) []flow.Record {
	var out []flow.Record
	for _, r := range recs {
		if r.EndReason == reason && r.IPVersion == v {
			out = append(out, r)
		}
	}
	return out
}

// TestPipeline runs the whole exporter on a fake table, both families, to
// a collector at [::1]: polls, idle export, an end event, lost events and
// the forced-end flush at shutdown.
func TestPipeline(t *testing.T) {
	col := ipfixtest.Start(t, ipfixtest.Options{Address: "[::1]:0"})
	v4 := conn("198.18.1.1", "198.18.2.2", 1000, 10)
	v6 := conn("fd00:10:1::1", "fd00:10:1::2", 1000, 20)
	src := newFake(v4, v6)
	e, err := newExporter(testConfig(col.Addr), src)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, e)

	// Idle timeout: both connections stand still.
	recs := col.Wait(t, 5*time.Second, func(r []flow.Record) bool {
		return len(byReason(r, flow.EndReasonIdleTimeout, 4)) == 1 && len(byReason(r, flow.EndReasonIdleTimeout, 6)) == 1
	})
	for _, tc := range []struct {
		v        uint8
		c        connstore.Conn
		typ      flow.FlowType
		src, dst string
	}{
		{4, v4, flow.FlowTypeInterNode, "node-a", ""},
		{6, v6, flow.FlowTypeIntraNode, "node-a", "node-a"},
	} {
		r := byReason(recs, flow.EndReasonIdleTimeout, tc.v)[0]
		if r.SrcAddr != tc.c.Key.Src || r.DstAddr != tc.c.Key.Dst || r.Packets != tc.c.Packets || r.PacketsDelta != tc.c.Packets ||
			r.ReverseBytesDelta != tc.c.ReverseBytes || r.Mark != 7 || r.TCPState != "ESTABLISHED" {
			t.Errorf("IPv%d idle record %+v", tc.v, r)
		}
		if r.ExporterNode != "node-a" || r.Source != "conntrack" || r.Type != tc.typ || r.Src.NodeName != tc.src || r.Dst.NodeName != tc.dst {
			t.Errorf("IPv%d identity: node %q source %q type %v src node %q dst node %q", tc.v, r.ExporterNode, r.Source, r.Type, r.Src.NodeName, r.Dst.NodeName)
		}
	}

	// An end event for the IPv6 connection, with more traffic.
	end := conn("fd00:10:1::1", "fd00:10:1::2", 1000, 25)
	end.Ended = true
	src.set(v4)
	src.events <- []connstore.Conn{end}
	recs = col.Wait(t, 5*time.Second, func(r []flow.Record) bool { return len(byReason(r, flow.EndReasonEndOfFlow, 6)) == 1 })
	if r := byReason(recs, flow.EndReasonEndOfFlow, 6)[0]; r.Packets != 25 || r.PacketsDelta != 5 {
		t.Errorf("end of flow: total %d delta %d, want 25 and 5", r.Packets, r.PacketsDelta)
	}

	// Lost events are counted (TestLostEventsTriggerDump checks the dump).
	src.errs <- conntrack.ErrEventsLost
	var body string
	waitFor(t, 5*time.Second, "event loss not counted", func() bool {
		body = scrape(t, e)
		return strings.Contains(body, "dualflow_exporter_conntrack_event_loss_total 1")
	})
	// Ready: the probes the DaemonSet uses answer 200.
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := http.Get("http://" + e.metricsAddr.String() + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s: %s, want 200 once Ready", path, resp.Status)
		}
	}
	for _, want := range []string{
		"dualflow_exporter_conntrack_event_loss_total 1",
		`dualflow_exporter_conntrack_events_total{type="destroy"} 1`,
		`dualflow_exporter_connections{family="ipv4"} 1`,
		`dualflow_exporter_connections{family="ipv6"} 0`,
		`dualflow_exporter_records_total{family="ipv6",reason="end_of_flow"} 1`,
		`dualflow_exporter_conntrack_sysctl{name="nf_conntrack_acct"} 1`,
		"dualflow_exporter_ipfix_connected 1",
		`dualflow_records_dropped_total{reason="buffer_full",stage="exporter"} 0`,
		`dualflow_records_dropped_total{reason="oversize",stage="exporter"} 0`,
		`dualflow_exporter_store_late_total{family="ipv6"} 0`,
		"dualflow_exporter_poll_duration_seconds_bucket",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	// The IPv4 connection moves; shutdown exports it with forced end.
	src.set(conn("198.18.1.1", "198.18.2.2", 1000, 14))
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	recs = col.Wait(t, 5*time.Second, func(r []flow.Record) bool { return len(byReason(r, flow.EndReasonForcedEnd, 4)) == 1 })
	if r := byReason(recs, flow.EndReasonForcedEnd, 4)[0]; r.Packets != 14 || r.PacketsDelta != 4 {
		t.Errorf("forced end: total %d delta %d, want 14 and 4", r.Packets, r.PacketsDelta)
	}
	// Deltas of every record of a connection add up to its final total.
	sum := map[uint8]uint64{}
	for _, r := range col.Records() {
		sum[r.IPVersion] += r.PacketsDelta
	}
	if sum[4] != 14 || sum[6] != 25 {
		t.Errorf("delta sums %v, want 14 and 25", sum)
	}
}

// TestLostEventsTriggerDump: with polls an hour apart, lost events must
// bring a dump at once.
func TestLostEventsTriggerDump(t *testing.T) {
	cfg := testConfig("127.0.0.1:1") // nothing listens on port 1
	cfg.PollInterval, cfg.Store.IdleTimeout = time.Hour, time.Hour
	cfg.IPFIX.DrainTimeout = 50 * time.Millisecond
	src := newFake(conn("198.18.1.1", "198.18.2.2", 1000, 10), conn("fd00:10:1::1", "fd00:10:1::2", 1000, 20))
	e, err := newExporter(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	run(t, e) // returns after the first dump
	before := src.dumps.Load()
	src.errs <- conntrack.ErrEventsLost
	waitFor(t, 5*time.Second, "no dump after lost events", func() bool { return src.dumps.Load() > before })
	if n := src.dumps.Load() - before; n != 2 {
		t.Errorf("%d dumps after lost events, want one per family", n)
	}
}

// TestLateObservations runs the two late cases through the whole exporter,
// per family: a connection ends in the kernel and a dump finds it gone
// before its DESTROY event is merged; a dump skips a live connection that
// the next dump shows again. Either way the deltas a collector receives
// add up to the connection's final counters once.
func TestLateObservations(t *testing.T) {
	for _, tc := range []struct{ name, client, server string }{
		{"ipv4", "198.18.1.1", "198.18.2.2"},
		{"ipv6", "fd00:10:1::1", "fd00:10:2::2"},
	} {
		t.Run(tc.name+"/swept, then late DESTROY", func(t *testing.T) {
			col := ipfixtest.Start(t, ipfixtest.Options{Address: "[::1]:0"})
			cfg := testConfig(col.Addr)
			cfg.Store.TombstoneTTL = time.Minute // the test, not the TTL, sets the pace
			c := conn(tc.client, tc.server, 1000, 10)
			src := newFake(c)
			e, err := newExporter(cfg, src)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, e)
			src.set() // ends in the kernel; its DESTROY is late
			waitFor(t, 5*time.Second, "the swept connection is still tracked", func() bool { return e.store.Len() == 0 })
			end := conn(tc.client, tc.server, 1000, 12)
			end.Ended, end.Start = true, c.Start
			src.events <- []connstore.Conn{end}
			waitFor(t, 5*time.Second, "the late DESTROY was not matched", func() bool {
				st := e.store.Stats()
				return st.Late[0]+st.Late[1] == 1 && e.store.Len() == 0
			})
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			checkDeltas(t, col, 12)
		})
		t.Run(tc.name+"/skipped by a dump, then seen again", func(t *testing.T) {
			col := ipfixtest.Start(t, ipfixtest.Options{Address: "[::1]:0"})
			cfg := testConfig(col.Addr)
			cfg.Store.TombstoneTTL = time.Minute
			c := conn(tc.client, tc.server, 1000, 10)
			src := newFake(c)
			e, err := newExporter(cfg, src)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, e)
			src.set() // a dump skips it
			waitFor(t, 5*time.Second, "the skipped connection is still tracked", func() bool { return e.store.Len() == 0 })
			c.Packets, c.Bytes, c.ReversePackets, c.ReverseBytes = 15, 1500, 15, 1500
			src.set(c) // and the next one shows it again
			waitFor(t, 5*time.Second, "the connection was not tracked again", func() bool {
				st := e.store.Stats()
				return st.Late[0]+st.Late[1] == 1 && e.store.Len() == 1
			})
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			checkDeltas(t, col, 15)
		})
	}
}

// checkDeltas waits for the records of the one connection of a test and
// checks their packet deltas add up to total.
func checkDeltas(t *testing.T, col *ipfixtest.Collector, total uint64) {
	t.Helper()
	var sum uint64
	recs := col.Wait(t, 5*time.Second, func(recs []flow.Record) bool {
		sum = 0
		for _, r := range recs {
			sum += r.PacketsDelta
		}
		return sum >= total
	})
	if sum != total {
		t.Errorf("deltas add up to %d, want %d; records:", sum, total)
		for _, r := range recs {
			t.Logf("  %v total %d delta %d", r.EndReason, r.Packets, r.PacketsDelta)
		}
	}
}

// TestLogger checks the exporter logs through Config.Logger.
func TestLogger(t *testing.T) {
	var buf logtest.Buffer
	cfg := testConfig("127.0.0.1:1")
	cfg.IPFIX.DrainTimeout = 50 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(&buf, nil))
	e, err := newExporter(cfg, newFake())
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, e)
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"exporter started", "exporter stopped", "node=node-a"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, buf.String())
		}
	}
}

func scrape(t *testing.T, e *Exporter) string {
	t.Helper()
	resp, err := http.Get("http://" + e.metricsAddr.String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestFamilies runs each IP mode and checks only its families are dumped
// and exported.
func TestFamilies(t *testing.T) {
	for _, tc := range []struct {
		name       string
		ipv4, ipv6 bool
		collector  string
	}{
		{"ipv4", true, false, "127.0.0.1:0"},
		{"ipv6", false, true, "[::1]:0"},
		{"dual", true, true, "[::1]:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			col := ipfixtest.Start(t, ipfixtest.Options{Address: tc.collector})
			cfg := testConfig(col.Addr)
			cfg.IPv4, cfg.IPv6 = tc.ipv4, tc.ipv6
			src := newFake(conn("198.18.1.1", "198.18.2.2", 1, 1), conn("fd00:10:1::1", "fd00:10:1::2", 1, 1))
			e, err := newExporter(cfg, src)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, e) // returns after the first dump
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			// Run drained before returning: what was sent is final.
			var want [2]uint64
			for i, on := range []bool{tc.ipv4, tc.ipv6} {
				if on {
					want[i] = 1
				}
			}
			if st := e.sender.Stats(); st.Records != want {
				t.Fatalf("sent %v records per family, want %v", st.Records, want)
			}
			recs := col.WaitN(t, 5*time.Second, int(want[0]+want[1]))
			for _, r := range recs {
				if (r.IPVersion == 4 && !tc.ipv4) || (r.IPVersion == 6 && !tc.ipv6) {
					t.Errorf("IPv%d record exported in mode %s", r.IPVersion, tc.name)
				}
			}
		})
	}
}

// TestCollectorDownKeepsPolling: with no collector the exporter keeps
// polling and counts; its buffer stays bounded. The outage is logged once
// through Config.Logger, not once per attempt.
func TestCollectorDownKeepsPolling(t *testing.T) {
	var logs logtest.Buffer
	cfg := testConfig("127.0.0.1:1") // nothing listens on port 1
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	cfg.IPFIX.BufferBytes = 64 << 10
	cfg.IPFIX.BackoffMin, cfg.IPFIX.BackoffMax = 10*time.Millisecond, 50*time.Millisecond
	cfg.IPFIX.DrainTimeout = 100 * time.Millisecond
	src := newFake()
	e, err := newExporter(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, e)
	for i := range 2000 {
		src.events <- []connstore.Conn{func() connstore.Conn {
			c := conn("198.18.1.1", "198.18.2.2", uint16(i), 1)
			c.Ended = true
			return c
		}()}
	}
	before := src.dumps.Load()
	waitFor(t, 5*time.Second, "polling stopped while the collector is down", func() bool { return src.dumps.Load() >= before+4 })
	// Once the partly filled messages are sealed (every flush interval),
	// the buffer is within its bound.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st := e.sender.Stats()
		if st.DroppedBufferFull > 0 && st.DialFailures > 0 && st.BufferedBytes <= cfg.IPFIX.BufferBytes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("want drops, dial failures and the buffer within %d bytes; sender stats %+v", cfg.IPFIX.BufferBytes, st)
		}
	}
	waitFor(t, 5*time.Second, "a second failed attempt", func() bool { return e.sender.Stats().DialFailures >= 2 })
	if n := strings.Count(logs.String(), "ipfix collector unreachable"); n != 1 {
		t.Errorf("%d lines about the unreachable collector, want 1:\n%s", n, logs.String())
	}
	m := scrape(t, e)
	for _, want := range []string{"dualflow_exporter_ipfix_dial_failures_total", `dualflow_records_dropped_total{reason="buffer_full",stage="exporter"}`,
		"dualflow_exporter_ipfix_records_retried_total"} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}

func TestRequireAccounting(t *testing.T) {
	for _, tc := range []struct {
		name    string
		acct    conntrack.Accounting
		require bool
		fails   bool
	}{
		{"all on", conntrack.Accounting{Acct: true, Timestamp: true, Events: true}, true, false},
		{"acct off, required", conntrack.Accounting{Timestamp: true, Events: true}, true, true},
		{"timestamp off, required", conntrack.Accounting{Acct: true, Events: true}, true, true},
		{"events off, required", conntrack.Accounting{Acct: true, Timestamp: true}, true, false},
		{"acct off, warn only", conntrack.Accounting{}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("127.0.0.1:1")
			cfg.RequireAccounting = tc.require
			cfg.IPFIX.DrainTimeout = 50 * time.Millisecond
			src := newFake()
			src.acct = tc.acct
			e, _ := newExporter(cfg, src)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			err := e.Run(ctx)
			if (err != nil) != tc.fails {
				t.Fatalf("Run: %v", err)
			}
			if tc.fails && !strings.Contains(err.Error(), "nf_conntrack_") {
				t.Errorf("error does not name the sysctl: %v", err)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	c := classifier{node: "n1",
		local:   []netip.Prefix{netip.MustParsePrefix("198.18.1.0/24"), netip.MustParsePrefix("fd00:10:1::/64")},
		cluster: []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16"), netip.MustParsePrefix("fd00:10::/40")}}
	for _, tc := range []struct {
		name, src, dst   string
		typ              flow.FlowType
		srcNode, dstNode string
	}{
		{"ipv4/intra-node", "198.18.1.1", "198.18.1.2", flow.FlowTypeIntraNode, "n1", "n1"},
		{"ipv4/inter-node out", "198.18.1.1", "198.18.2.2", flow.FlowTypeInterNode, "n1", ""},
		{"ipv4/inter-node in", "198.18.2.2", "198.18.1.1", flow.FlowTypeInterNode, "", "n1"},
		{"ipv4/to external", "198.18.1.1", "198.19.255.1", flow.FlowTypeToExternal, "n1", ""},
		{"ipv4/from external", "198.19.255.1", "198.18.1.1", flow.FlowTypeFromExternal, "", "n1"},
		{"ipv6/intra-node", "fd00:10:1::1", "fd00:10:1::2", flow.FlowTypeIntraNode, "n1", "n1"},
		{"ipv6/inter-node", "fd00:10:1::1", "fd00:10:2::2", flow.FlowTypeInterNode, "n1", ""},
		{"ipv6/to external", "fd00:10:1::1", "fd00:10:ffff::1", flow.FlowTypeToExternal, "n1", ""},
		{"ipv6/from external", "fd00:10:ffff::1", "fd00:10:1::1", flow.FlowTypeFromExternal, "", "n1"},
		{"ipv6/unrelated", "fd00:10:ffff::1", "fd00:10:ffff::2", flow.FlowTypeUnknown, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := flow.Record{SrcAddr: a(tc.src), DstAddr: a(tc.dst)}
			c.classify(&r)
			if r.Type != tc.typ || r.Src.NodeName != tc.srcNode || r.Dst.NodeName != tc.dstNode {
				t.Errorf("type %v src node %q dst node %q", r.Type, r.Src.NodeName, r.Dst.NodeName)
			}
		})
	}
	var none classifier
	r := flow.Record{SrcAddr: a("198.18.1.1"), DstAddr: a("198.18.1.2")}
	none.classify(&r)
	if r.Type != flow.FlowTypeUnknown {
		t.Errorf("no CIDRs: type %v", r.Type)
	}
}

func TestFlags(t *testing.T) {
	for _, tc := range []struct {
		name  string
		args  []string
		ok    bool
		check func(*testing.T, Config)
	}{
		{"defaults", nil, true, func(t *testing.T, c Config) {
			if !c.IPv4 || !c.IPv6 || !c.Events || c.MetricsAddr != "127.0.0.1:9465" || c.IPFIX.Transport != "tcp" ||
				c.Store.ActiveTimeout != 60*time.Second || c.IPFIX.MaxMessageSize != 65535 || c.IPFIX.ObservationDomainID == 0 ||
				c.Store.TombstoneTTL != 10*time.Second {
				t.Errorf("%+v", c)
			}
		}},
		{"tombstones follow the poll interval", []string{"--exporter.poll-interval", "1s"}, true, func(t *testing.T, c Config) {
			if c.Store.TombstoneTTL != 2*time.Second {
				t.Errorf("tombstone TTL %v", c.Store.TombstoneTTL)
			}
		}},
		{"ipv6 only over ipv6", []string{"--exporter.ipv4=false", "--exporter.ipfix.collector", "[::1]:4739", "--node-name", "n1",
			"--exporter.netns", "df-node-1", "--exporter.zones", "0,7,7", "--exporter.active-timeout", "30s", "--exporter.idle-timeout", "10s",
			"--exporter.max-connections", "1000", "--exporter.local-cidrs", "198.18.1.0/24,fd00:10:1::/64"}, true,
			func(t *testing.T, c Config) {
				if c.IPv4 || c.IPFIX.Address != "[::1]:4739" || c.NodeName != "n1" || c.NetNS != "df-node-1" ||
					len(c.Zones) != 2 || c.Zones[1] != 7 || c.Store.ActiveTimeout != 30*time.Second || c.Store.MaxConns != 1000 ||
					len(c.LocalCIDRs) != 2 || !c.LocalCIDRs[1].Addr().Is6() {
					t.Errorf("%+v", c)
				}
			}},
		{"udp picks small messages", []string{"--exporter.ipfix.transport", "udp"}, true, func(t *testing.T, c Config) {
			if c.IPFIX.MaxMessageSize != 1400 {
				t.Errorf("udp message size %d", c.IPFIX.MaxMessageSize)
			}
		}},
		{"observation domain", []string{"--exporter.ipfix.observation-domain-id", "42"}, true, func(t *testing.T, c Config) {
			if c.IPFIX.ObservationDomainID != 42 {
				t.Errorf("domain %d", c.IPFIX.ObservationDomainID)
			}
		}},
		{"no family", []string{"--exporter.ipv4=false", "--exporter.ipv6=false"}, false, nil},
		{"bad zone", []string{"--exporter.zones", "70000"}, false, nil},
		{"bad cidr", []string{"--exporter.local-cidrs", "198.18.1.0"}, false, nil},
		{"poll longer than idle", []string{"--exporter.poll-interval", "20s"}, false, nil},
		{"bad transport", []string{"--exporter.ipfix.transport", "sctp"}, false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			c := NewConfig()
			c.BindFlags(fs)
			err := fs.Parse(tc.args)
			if err == nil {
				c.SetDefaults()
				err = c.Validate()
			}
			if (err == nil) != tc.ok {
				t.Fatalf("err %v", err)
			}
			if tc.check != nil {
				tc.check(t, c)
			}
		})
	}
}

// TestRunRefusedDump: without CAP_NET_ADMIN the kernel refuses conntrack
// dumps; the exporter stops at start saying what it needs instead of
// running, ready-looking, exporting nothing. Other dump errors are logged
// and retried by the poll loop.
func TestRunRefusedDump(t *testing.T) {
	src := newFake()
	src.dumpErr = fmt.Errorf("conntrack dump IPv4: netfilter query: netlink receive: %w", syscall.EPERM)
	cfg := testConfig("127.0.0.1:1")
	cfg.MetricsAddr = ""
	e, err := newExporter(cfg, src)
	if err != nil {
		t.Fatal(err)
	}
	err = e.Run(context.Background())
	if err == nil || !strings.Contains(err.Error(), "CAP_NET_ADMIN") || !errors.Is(err, os.ErrPermission) {
		t.Fatalf("Run: %v, want a refusal naming CAP_NET_ADMIN", err)
	}
}
