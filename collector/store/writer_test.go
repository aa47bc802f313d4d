package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/collector/store/spool"
	"github.com/dualflow/dualflow/flow"
)

// fakeConn is a Conn whose methods call its function fields; a nil field
// succeeds.
type fakeConn struct {
	ExecFunc            func(ctx context.Context, query string) error
	QueryFunc           func(ctx context.Context, query, format string) ([]byte, error)
	InsertRowBinaryFunc func(ctx context.Context, table string, columns []string, dedupToken string, rows int, data []byte) error
	CloseFunc           func() error
}

var _ Conn = (*fakeConn)(nil)

func (f *fakeConn) Exec(ctx context.Context, query string) error {
	if f.ExecFunc == nil {
		return nil
	}
	return f.ExecFunc(ctx, query)
}

func (f *fakeConn) Query(ctx context.Context, query, format string) ([]byte, error) {
	if f.QueryFunc == nil {
		return nil, nil
	}
	return f.QueryFunc(ctx, query, format)
}

func (f *fakeConn) InsertRowBinary(ctx context.Context, table string, columns []string, dedupToken string, rows int, data []byte) error {
	if f.InsertRowBinaryFunc == nil {
		return nil
	}
	return f.InsertRowBinaryFunc(ctx, table, columns, dedupToken, rows, data)
}

// insertColumns takes the writer's columnar batches as the RowBinary rows
// they spool as, through InsertRowBinaryFunc.
func (f *fakeConn) insertColumns(ctx context.Context, table, token string, nb *nativeBuilder) error {
	data, err := nb.rowBinary(nil, flowWire)
	if err != nil {
		return err
	}
	return f.InsertRowBinary(ctx, table, FlowColumns, token, nb.rows, data)
}

func (f *fakeConn) Close() error {
	if f.CloseFunc == nil {
		return nil
	}
	return f.CloseFunc()
}

// fakeTable stands for the flows table: it decodes inserted batches and
// deduplicates them on the token, as ClickHouse does with
// non_replicated_deduplication_window.
type fakeTable struct {
	t      *testing.T
	mu     sync.Mutex
	tokens map[string]bool
	rows   []flow.Record
	calls  []fakeCall
	// fail, when set, decides the outcome of each call before (stored
	// false) or after (stored true) the batch is stored.
	fail func(call int, first *flow.Record) (err error, stored bool)
	// columnarInserts counts the calls that came as columnar batches.
	columnarInserts int
}

type fakeCall struct {
	token string
	rows  int
	first int // id of the first row
	err   error
}

func newFakeTable(t *testing.T) *fakeTable {
	return &fakeTable{t: t, tokens: map[string]bool{}}
}

// conn returns a fake Conn inserting into f: one that takes the writer's
// batches as their RowBinary rows, or with fakeColumnar set one that also
// holds each batch's Native block to the block built from those rows.
func (f *fakeTable) conn() Conn {
	c := &fakeConn{InsertRowBinaryFunc: f.insert}
	if fakeColumnar {
		return columnarFake{c, f}
	}
	return c
}

// fakeColumnar switches fakeTable.conn to columnar batches:
// TestWriterColumnar runs the writer tests again with it.
var fakeColumnar bool

// TestWriterNoHeadOfLineBlocking holds the first batch's insert while
// later ones complete: the other inserter keeps writing them, and Write
// keeps sealing new batches, within MaxPending batches in memory. (A done
// batch used to count against MaxPending until every older batch was done,
// so a slow insert left the other inserter idle. It did not limit the
// writer's share of the engine's ceiling, as it turned out: see the
// collector README.)
func TestWriterNoHeadOfLineBlocking(t *testing.T) {
	tbl := newFakeTable(t)
	release := make(chan struct{})
	var first sync.Once
	conn := &fakeConn{InsertRowBinaryFunc: func(ctx context.Context, table string, columns []string, token string, rows int, data []byte) error {
		hold := false
		first.Do(func() { hold = true })
		if hold {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return tbl.insert(ctx, table, columns, token, rows, data)
	}}
	cfg := testConfig()
	cfg.BatchRows, cfg.Inserters, cfg.MaxPending = 1, 2, 2
	w := startWriter(t, cfg, conn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i := range 6 { // batch 0 hangs; 1 to 5 go through the other inserter
		if err := w.Write(ctx, testFlows(i, 1)); err != nil {
			t.Fatalf("Write %d while the first insert hangs: %v", i, err)
		}
	}
	eventually(t, "5 batches written past the held one", func() bool { return len(tbl.ids()) >= 5 })
	if s := w.Stats(); s.BufferedRows > int64(cfg.MaxPending+1) {
		t.Fatalf("buffered %d rows, more than MaxPending+1 batches of one row", s.BufferedRows)
	}
	close(release)
	flush(t, w)
	wantIDSet(t, tbl, seq(0, 6))
}

// columnarFake is a fakeConn that also takes columnar batches. It holds
// each block to the bytes build makes from the same rows (what the engine
// gets does not depend on the path) and stores the rows in its table.
type columnarFake struct {
	*fakeConn
	tbl *fakeTable
}

func (c columnarFake) insertColumns(ctx context.Context, table, token string, nb *nativeBuilder) error {
	data, err := nb.rowBinary(nil, flowWire)
	if err != nil {
		c.tbl.t.Errorf("columnar batch to rows: %v", err)
		return err
	}
	var ref nativeBuilder
	want, err := ref.build(FlowColumns, flowWire, nb.rows, data)
	if err != nil {
		c.tbl.t.Errorf("build the reference block: %v", err)
		return err
	}
	if !bytes.Equal(joinParts(nb.assemble(FlowColumns, flowWire)), joinParts(want)) {
		c.tbl.t.Error("columnar block differs from the block built from its rows")
	}
	c.tbl.mu.Lock()
	c.tbl.columnarInserts++
	c.tbl.mu.Unlock()
	return c.tbl.insert(ctx, table, FlowColumns, token, nb.rows, data)
}

func (f *fakeTable) insert(ctx context.Context, table string, columns []string, token string, rows int, data []byte) error {
	if table != FlowsTable || !slices.Equal(columns, FlowColumns) {
		f.t.Errorf("insert into %s %v, want %s FlowColumns", table, columns, FlowsTable)
	}
	var recs []flow.Record
	for b := data; len(b) > 0; {
		var r flow.Record
		var err error
		if b, err = DecodeFlowRow(b, &r); err != nil {
			f.t.Errorf("decode inserted row: %v", err)
			return err
		}
		recs = append(recs, r)
	}
	if len(recs) != rows || rows == 0 {
		f.t.Errorf("insert of %d rows carries %d", rows, len(recs))
	}
	if token == "" {
		f.t.Error("insert without dedup token")
	}

	f.mu.Lock()
	defer f.mu.Unlock()
	call := fakeCall{token: token, rows: rows, first: flowID(&recs[0])}
	var err error
	stored := true
	if f.fail != nil {
		err, stored = f.fail(len(f.calls), &recs[0])
	}
	if stored && !f.tokens[token] {
		f.tokens[token] = true
		f.rows = append(f.rows, recs...)
	}
	call.err = err
	f.calls = append(f.calls, call)
	return err
}

func (f *fakeTable) ids() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := make([]int, len(f.rows))
	for i := range f.rows {
		ids[i] = flowID(&f.rows[i])
	}
	return ids
}

func (f *fakeTable) callList() []fakeCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

func (f *fakeTable) setFail(fn func(call int, first *flow.Record) (error, bool)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = fn
}

var errDown = fmt.Errorf("%w: dial tcp 127.0.0.1:9000: connect: connection refused", ErrUnavailable)

// down makes every insert fail as if ClickHouse were unreachable.
func down(int, *flow.Record) (error, bool) { return errDown, false }

var testEpoch = time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)

// testFlow returns a realistic record whose id is recoverable with flowID.
// Even ids are IPv4, odd ids IPv6.
func testFlow(id int) flow.Record {
	v6 := id%2 == 1
	src, dst, svc, exp := "198.18.1.10", "198.18.2.20", "198.19.0.10", "198.18.255.1"
	if v6 {
		src, dst, svc, exp = "fd00:10:244:1::a", "fd00:10:244:2::14", "fd00:10:96::a", "fd00:192:168::1"
	}
	start := testEpoch.Add(time.Duration(id) * time.Millisecond)
	r := flow.Record{
		FlowStart: start, FlowEnd: start.Add(5 * time.Second), TimeReceived: start.Add(6 * time.Second),
		SrcAddr: netip.MustParseAddr(src), DstAddr: netip.MustParseAddr(dst),
		SrcPort: uint16(32768 + id%28000), DstPort: 8080, Proto: flow.ProtoTCP,
		ServiceAddr: netip.MustParseAddr(svc), ServicePort: 80,
		Packets: 12, Bytes: 1500, ReversePackets: 10, ReverseBytes: 9000,
		PacketsDelta: 2, BytesDelta: 150, ReversePacketsDelta: 1, ReverseBytesDelta: 900,
		EndReason: flow.EndReasonActiveTimeout, TCPState: "ESTABLISHED", Zone: 0, Mark: 0x42,
		ExporterAddr: netip.MustParseAddr(exp), ObservationDomainID: 1, ExporterNode: "node-a", Source: "conntrack",
		Src: flow.Endpoint{PodNamespace: "shop", PodName: fmt.Sprintf("frontend-7d9f8c-%05d", id%1000),
			WorkloadKind: "Deployment", WorkloadName: "frontend", NodeName: "node-a", Zone: "zone-1",
			Labels: map[string]string{"app": "frontend", "tier": "web", "pod-template-hash": "7d9f8c"}},
		Dst: flow.Endpoint{PodNamespace: "shop", PodName: "cart-0", WorkloadKind: "StatefulSet", WorkloadName: "cart",
			NodeName: "node-b", Zone: "zone-2", Labels: map[string]string{"app": "cart", "tier": "backend", "release": "stable"}},
		Service:     flow.Service{Namespace: "shop", Name: "cart", PortName: "http"},
		Type:        flow.FlowTypeInterNode,
		Correlation: flow.CorrelationMerged,
		Ingress:     flow.Policy{Namespace: "shop", Name: "cart-allow-frontend", Rule: 0, Verdict: flow.VerdictAllowed},
		Egress:      flow.Policy{Namespace: "shop", Name: "frontend-egress", Rule: 2, Verdict: flow.VerdictAllowed},
	}
	r.Normalize()
	return r
}

func flowID(r *flow.Record) int { return int(r.FlowStart.Sub(testEpoch) / time.Millisecond) }

func testFlows(from, n int) []flow.Record {
	recs := make([]flow.Record, n)
	for i := range recs {
		recs[i] = testFlow(from + i)
	}
	return recs
}

func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// testConfig is a fast configuration: tiny batches, millisecond backoffs,
// timers that never fire unless a test wants them to. One inserter, so
// batches commit in order and tests can check the order; the tests of
// Inserters > 1 say so.
func testConfig() WriterConfig {
	return WriterConfig{
		BatchRows:       10,
		FlushInterval:   time.Hour,
		MaxPending:      4,
		Inserters:       1,
		Retries:         2,
		RetryBackoff:    time.Millisecond,
		MaxBackoff:      5 * time.Millisecond,
		InsertTimeout:   10 * time.Second,
		RejectAfter:     time.Hour,
		ShutdownTimeout: 5 * time.Second,
	}
}

type runningWriter struct {
	*Writer
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

// stop cancels Run and returns its error once it has returned.
func (r *runningWriter) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // let the cleanup see it too
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return")
		return nil
	}
}

func startWriter(t *testing.T, cfg WriterConfig, conn Conn) *runningWriter {
	return startWriterLog(t, cfg, conn, nil)
}

func startWriterLog(t *testing.T, cfg WriterConfig, conn Conn, log *slog.Logger) *runningWriter {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	w, err := NewWriter(cfg, conn, reg, log)
	if err != nil {
		t.Fatalf("NewWriter: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningWriter{Writer: w, reg: reg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-r.done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return r
}

func write(t *testing.T, w *runningWriter, recs []flow.Record) {
	t.Helper()
	if err := w.Write(context.Background(), recs); err != nil {
		t.Fatalf("Write: %v", err)
	}
}

func flush(t *testing.T, w *runningWriter) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := w.Flush(ctx); err != nil {
		t.Fatalf("Flush: %v", err)
	}
}

// eventually polls cond for up to 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func wantIDs(t *testing.T, tbl *fakeTable, want []int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d rows", len(want)), func() bool { return len(tbl.ids()) >= len(want) })
	if got := tbl.ids(); !slices.Equal(got, want) {
		t.Fatalf("rows in table (ids):\n got %v\nwant %v", got, want)
	}
}

// wantIDSet is wantIDs for any arrival order: each row exactly once.
func wantIDSet(t *testing.T, tbl *fakeTable, want []int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d rows", len(want)), func() bool { return len(tbl.ids()) >= len(want) })
	got := tbl.ids()
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("rows in table (sorted ids):\n got %v\nwant %v", got, want)
	}
}

func batchSizes(calls []fakeCall) []int {
	var out []int
	for _, c := range calls {
		out = append(out, c.rows)
	}
	return out
}

func TestWriterConfig(t *testing.T) {
	// A Conn that takes only rows cannot take the writer's batches.
	type rowsOnly struct{ Conn }
	if _, err := NewWriter(WriterConfig{}, rowsOnly{&fakeConn{}}, nil, nil); err == nil {
		t.Error("NewWriter took a Conn without Native blocks")
	}
	var def WriterConfig
	def.SetDefaults()
	if err := def.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	if def.BatchRows != 100_000 || def.FlushInterval != time.Second || def.MaxPending != 2 || def.Inserters != 2 || def.SpoolMaxBytes != 1<<30 {
		t.Fatalf("unexpected defaults %+v", def)
	}
	clamped := WriterConfig{MaxPending: 1}
	clamped.SetDefaults()
	if clamped.Inserters != 1 {
		t.Fatalf("inserters %d with max pending 1, want 1", clamped.Inserters)
	}
	for _, tc := range []struct {
		name string
		edit func(*WriterConfig)
		want string // substring of the error, "" for valid
	}{
		{"no fast retries", func(c *WriterConfig) { c.Retries = -1 }, ""},
		{"spool", func(c *WriterConfig) { c.SpoolDir = "/tmp/x" }, ""},
		{"negative batch rows", func(c *WriterConfig) { c.BatchRows = -1 }, "batch rows"},
		{"negative max pending", func(c *WriterConfig) { c.MaxPending = -2 }, "max pending"},
		{"more inserters than pending batches", func(c *WriterConfig) { c.Inserters, c.MaxPending = 3, 2 }, ""}, // clamped
		{"negative inserters", func(c *WriterConfig) { c.Inserters = -1 }, "inserters"},
		{"max below retry backoff", func(c *WriterConfig) { c.RetryBackoff, c.MaxBackoff = time.Second, time.Millisecond }, "max backoff"},
		{"negative spool bytes", func(c *WriterConfig) { c.SpoolDir, c.SpoolMaxBytes = "/tmp/x", -1 }, "spool max bytes"},
		{"negative shutdown timeout", func(c *WriterConfig) { c.ShutdownTimeout = -time.Second }, "shutdown timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c WriterConfig
			tc.edit(&c)
			c.SetDefaults()
			err := c.Validate()
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate() = %v, want %q", err, tc.want)
			}
			if _, err2 := NewWriter(c, &fakeConn{}, nil, nil); (err2 == nil) != (err == nil) {
				t.Fatalf("NewWriter error %v disagrees with Validate %v", err2, err)
			}
		})
	}
}

func TestWriterBatchesBySize(t *testing.T) {
	tbl := newFakeTable(t)
	w := startWriter(t, testConfig(), tbl.conn())
	write(t, w, testFlows(0, 23))
	write(t, w, testFlows(23, 12))
	// Three full batches go without Flush; 5 rows wait for more.
	eventually(t, "3 batches", func() bool { return len(tbl.callList()) == 3 })
	if s := w.Stats(); s.BufferedRows != 5 || s.BufferedBytes <= 0 {
		t.Fatalf("buffered %d rows %d bytes, want 5 rows", s.BufferedRows, s.BufferedBytes)
	}
	flush(t, w)
	wantIDs(t, tbl, seq(0, 35))
	if got := batchSizes(tbl.callList()); !slices.Equal(got, []int{10, 10, 10, 5}) {
		t.Fatalf("batch sizes %v", got)
	}
	s := w.Stats()
	if s.RowsWritten != 35 || s.BatchesWritten != 4 || s.BufferedRows != 0 || s.BufferedBytes != 0 {
		t.Fatalf("stats %+v", s)
	}
	if got := testutil.ToFloat64(w.m.rowsWritten); got != 35 {
		t.Fatalf("rows_written_total = %v", got)
	}
	// Every batch has its own token.
	tokens := map[string]bool{}
	for _, c := range tbl.callList() {
		if len(c.token) != 32 || tokens[c.token] {
			t.Fatalf("token %q not a fresh 128-bit hex token", c.token)
		}
		tokens[c.token] = true
	}
}

func TestWriterBatchesByInterval(t *testing.T) {
	tbl := newFakeTable(t)
	cfg := testConfig()
	cfg.BatchRows = 1000
	cfg.FlushInterval = 10 * time.Millisecond
	w := startWriter(t, cfg, tbl.conn())
	write(t, w, testFlows(0, 3))
	wantIDs(t, tbl, seq(0, 3)) // no Flush: the ticker seals it
	write(t, w, testFlows(3, 2))
	wantIDs(t, tbl, seq(0, 5))
	if got := batchSizes(tbl.callList()); !slices.Equal(got, []int{3, 2}) {
		t.Fatalf("batch sizes %v", got)
	}
}

func TestWriterFlush(t *testing.T) {
	tbl := newFakeTable(t)
	cfg := testConfig()
	cfg.BatchRows = 1000
	w := startWriter(t, cfg, tbl.conn())
	flush(t, w) // nothing to flush
	write(t, w, testFlows(0, 7))
	flush(t, w)
	// Flush returned: the rows are in the table already.
	if got := tbl.ids(); !slices.Equal(got, seq(0, 7)) {
		t.Fatalf("after Flush: %v", got)
	}
	flush(t, w)
	if n := len(tbl.callList()); n != 1 {
		t.Fatalf("%d inserts, want 1", n)
	}
}

func TestWriterBackPressure(t *testing.T) {
	tbl := newFakeTable(t)
	entered := make(chan struct{}, 10)
	release := make(chan struct{})
	conn := &fakeConn{InsertRowBinaryFunc: func(ctx context.Context, table string, cols []string, token string, rows int, data []byte) error {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		return tbl.insert(ctx, table, cols, token, rows, data)
	}}
	cfg := testConfig()
	cfg.BatchRows = 1
	cfg.MaxPending = 1
	w := startWriter(t, cfg, conn)

	write(t, w, testFlows(0, 1)) // sealed; the insert hangs
	<-entered

	// The next batch is full and MaxPending batches are pending: Write blocks.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if err := w.Write(ctx, testFlows(1, 1)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("blocked Write = %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d < 40*time.Millisecond {
		t.Fatalf("Write returned after %v without blocking", d)
	}
	// Memory bound: (MaxPending+1) batches of BatchRows rows.
	if s := w.Stats(); s.BufferedRows != 2 {
		t.Fatalf("buffered %d rows, want 2", s.BufferedRows)
	}

	done := make(chan error, 1)
	go func() { done <- w.Write(context.Background(), testFlows(2, 1)) }()
	select {
	case err := <-done:
		t.Fatalf("Write did not block (err %v)", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Write after release: %v", err)
	}
	flush(t, w)
	// The row accepted before the timeout is not lost.
	wantIDs(t, tbl, seq(0, 3))
}

// TestWriterOutage runs with one inserter (rows arrive in order) and two
// (batches in flight may commit out of order; none is lost or written
// twice).
func TestWriterOutage(t *testing.T) {
	for _, inserters := range []int{1, 2} {
		t.Run(fmt.Sprintf("inserters=%d", inserters), func(t *testing.T) { testWriterOutage(t, inserters) })
	}
}

func testWriterOutage(t *testing.T, inserters int) {
	tbl := newFakeTable(t)
	tbl.setFail(down)
	cfg := testConfig()
	cfg.Inserters = inserters
	cfg.SpoolDir = t.TempDir()
	w := startWriter(t, cfg, tbl.conn())

	for i := 0; i < 100; i += 7 {
		write(t, w, testFlows(i, min(7, 100-i)))
	}
	flush(t, w) // returns once everything is spooled
	s := w.Stats()
	if s.SpoolBatches != 10 || s.SpoolRows != 100 || s.RowsWritten != 0 || s.SpooledRows != 100 || s.DroppedRows != 0 {
		t.Fatalf("during outage: %+v", s)
	}
	if s.Retries < int64(cfg.Retries) || s.InsertErrors <= s.Retries {
		t.Fatalf("retries %d errors %d", s.Retries, s.InsertErrors)
	}
	if got := testutil.ToFloat64(w.m.gauges[0]); got != 10 {
		t.Fatalf("spool_batches = %v", got)
	}
	if got := testutil.ToFloat64(w.m.insertErrUnavailable); got == 0 {
		t.Fatal("insert_errors_total{kind=unavailable} = 0")
	}

	// ClickHouse comes back while new rows keep coming: the spool is
	// replayed first and new batches queue behind it.
	tbl.setFail(nil)
	for i := 100; i < 150; i += 10 {
		write(t, w, testFlows(i, 10))
	}
	flush(t, w)
	if inserters == 1 {
		wantIDs(t, tbl, seq(0, 150))
	} else {
		wantIDSet(t, tbl, seq(0, 150))
	}
	eventually(t, "empty spool", func() bool { return w.Stats().SpoolBatches == 0 })
	if s := w.Stats(); s.RowsWritten != 150 || s.SpoolBytes != 0 || s.DroppedRows != 0 {
		t.Fatalf("after recovery: %+v", s)
	}
}

func TestWriterAmbiguousFailure(t *testing.T) {
	for _, tc := range []struct {
		name        string
		err         error
		retries     int
		spool       bool
		wantRetries int64 // the first replay from the spool is not a retry
	}{
		{"timeout after commit", context.DeadlineExceeded, 2, false, 1},
		{"connection reset after commit", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, 2, false, 1},
		{"unavailable after commit", errDown, 2, false, 1},
		{"replayed from spool", context.DeadlineExceeded, -1, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := newFakeTable(t)
			// The first attempt is committed by the server, but the client
			// sees an error.
			tbl.setFail(func(call int, _ *flow.Record) (error, bool) {
				if call == 0 {
					return tc.err, true
				}
				return nil, true
			})
			cfg := testConfig()
			cfg.Retries = tc.retries
			if tc.spool {
				cfg.SpoolDir = t.TempDir()
			}
			w := startWriter(t, cfg, tbl.conn())
			write(t, w, testFlows(0, 10))
			flush(t, w)
			eventually(t, "2 inserts", func() bool { return len(tbl.callList()) == 2 })
			calls := tbl.callList()
			if calls[0].token != calls[1].token {
				t.Fatalf("retry used token %s, first attempt %s", calls[1].token, calls[0].token)
			}
			wantIDs(t, tbl, seq(0, 10)) // once, not twice
			eventually(t, "retry counted", func() bool { return w.Stats().RowsWritten == 10 })
			if s := w.Stats(); s.Retries != tc.wantRetries || s.InsertErrors != 1 {
				t.Fatalf("stats %+v", s)
			}
		})
	}
}

func TestWriterRestartReplaysSpool(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig()
	cfg.SpoolDir = dir

	// Writer A runs during an outage and stops with 30 rows spooled and 5
	// still in memory: shutdown spools those too.
	tblA := newFakeTable(t)
	tblA.setFail(down)
	a := startWriter(t, cfg, tblA.conn())
	write(t, a, testFlows(0, 30))
	flush(t, a)
	write(t, a, testFlows(30, 5))
	if err := a.stop(t); err != nil {
		t.Fatalf("Run A: %v", err)
	}
	if err := a.Write(context.Background(), testFlows(99, 1)); !errors.Is(err, ErrWriterClosed) {
		t.Fatalf("Write after Run = %v, want ErrWriterClosed", err)
	}
	sp, err := spool.Open(dir, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if sp.Len() != 4 || sp.Rows() != 35 {
		t.Fatalf("spool after A: %d batches %d rows, want 4 35", sp.Len(), sp.Rows())
	}
	sp.Close()
	firstToken := tblA.callList()[0].token

	// Writer B on the same directory replays A's batches before its own.
	tblB := newFakeTable(t)
	b := startWriter(t, cfg, tblB.conn())
	write(t, b, testFlows(35, 10))
	flush(t, b)
	wantIDs(t, tblB, seq(0, 45))
	if got := tblB.callList()[0].token; got != firstToken {
		t.Fatalf("replayed batch has token %s, A used %s", got, firstToken)
	}
}

func TestWriterSpoolFull(t *testing.T) {
	// Room for one batch of 10 rows (rows plus ~1 KiB of segment header),
	// not two.
	var rows []byte
	for _, r := range testFlows(0, 10) {
		rows = AppendFlowRow(rows, &r)
	}
	cfg := testConfig()
	cfg.SpoolDir = t.TempDir()
	cfg.SpoolMaxBytes = int64(len(rows))*3/2 + 2048
	cfg.Retries = -1

	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))
	tbl := newFakeTable(t)
	tbl.setFail(down)
	w := startWriterLog(t, cfg, tbl.conn(), log)
	write(t, w, testFlows(0, 50))
	flush(t, w)
	s := w.Stats()
	if s.SpoolBatches != 1 || s.DroppedRows != 40 {
		t.Fatalf("stats %+v, want 1 spooled batch and 40 dropped rows", s)
	}
	if got := testutil.ToFloat64(w.m.dropped.WithLabelValues(DropSpoolFull)); got != 40 {
		t.Fatalf(`dropped_rows_total{reason="spool_full"} = %v`, got)
	}
	w.stop(t)
	if n := strings.Count(logs.String(), "dropping flow rows"); n != 1 {
		t.Fatalf("%d drop log lines for 4 dropped batches, want 1 (rate-limited):\n%s", n, logs.String())
	}
}

// syncWriter serialises writes to w (the log handler is shared by goroutines).
type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func TestWriterNoSpool(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		reason   string
		attempts int
	}{
		{"unavailable", errDown, DropNoSpool, 3},
		{"rejected", errors.New("code: 60, DB::Exception: Table dualflow.flows does not exist"), DropRejected, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := newFakeTable(t)
			tbl.setFail(func(int, *flow.Record) (error, bool) { return tc.err, false })
			w := startWriter(t, testConfig(), tbl.conn())
			write(t, w, testFlows(0, 10))
			flush(t, w)
			if n := len(tbl.callList()); n != tc.attempts {
				t.Fatalf("%d attempts, want %d", n, tc.attempts)
			}
			if got := testutil.ToFloat64(w.m.dropped.WithLabelValues(tc.reason)); got != 10 || w.Stats().DroppedRows != 10 {
				t.Fatalf("dropped{%s} = %v", tc.reason, got)
			}
		})
	}
}

func TestWriterNonRetryable(t *testing.T) {
	schemaErr := errors.New("code: 16, DB::Exception: No such column ct_zone in table dualflow.flows")

	t.Run("transient schema mismatch", func(t *testing.T) {
		// Rejected until a migration runs: spooled without fast retries,
		// then replayed; nothing is lost.
		tbl := newFakeTable(t)
		tbl.setFail(func(call int, _ *flow.Record) (error, bool) {
			if call < 4 {
				return schemaErr, false
			}
			return nil, true
		})
		cfg := testConfig()
		cfg.SpoolDir = t.TempDir()
		w := startWriter(t, cfg, tbl.conn())
		write(t, w, testFlows(0, 20))
		flush(t, w)
		wantIDs(t, tbl, seq(0, 20))
		if got := testutil.ToFloat64(w.m.insertErrRejected); got != 4 {
			t.Fatalf("insert_errors_total{kind=rejected} = %v, want 4", got)
		}
		if s := w.Stats(); s.DroppedRows != 0 {
			t.Fatalf("dropped %d", s.DroppedRows)
		}
	})

	t.Run("poison batch", func(t *testing.T) {
		// One batch is refused for good: after RejectAfter it is moved to
		// rejected/ and the batches behind it go through.
		tbl := newFakeTable(t)
		tbl.setFail(func(_ int, first *flow.Record) (error, bool) {
			if flowID(first) == 10 {
				return schemaErr, false
			}
			return nil, true
		})
		cfg := testConfig()
		cfg.SpoolDir = t.TempDir()
		cfg.RejectAfter = time.Nanosecond
		w := startWriter(t, cfg, tbl.conn())
		write(t, w, testFlows(0, 30))
		flush(t, w)
		wantIDs(t, tbl, append(seq(0, 10), seq(20, 10)...))
		eventually(t, "rejected batch counted", func() bool { return w.Stats().DroppedRows == 10 })
		if got := testutil.ToFloat64(w.m.dropped.WithLabelValues(DropRejected)); got != 10 {
			t.Fatalf("dropped{rejected} = %v", got)
		}
		n := 0
		for _, c := range tbl.callList() {
			if c.first == 10 {
				n++
			}
		}
		if n != 1+minRejectAttempts { // the direct attempt, then the replays
			t.Fatalf("poison batch tried %d times, want %d", n, 1+minRejectAttempts)
		}
		files, _ := filepath.Glob(filepath.Join(cfg.SpoolDir, spool.RejectedDir, "*.seg"))
		if len(files) != 1 {
			t.Fatalf("rejected files %v", files)
		}
	})
}

func TestWriterShutdownTimeout(t *testing.T) {
	for _, withSpool := range []bool{true, false} {
		t.Run(fmt.Sprintf("spool=%v", withSpool), func(t *testing.T) {
			// ClickHouse accepts connections but never answers.
			conn := &fakeConn{InsertRowBinaryFunc: func(ctx context.Context, _ string, _ []string, _ string, _ int, _ []byte) error {
				<-ctx.Done()
				return ctx.Err()
			}}
			cfg := testConfig()
			cfg.InsertTimeout = time.Hour
			cfg.ShutdownTimeout = 100 * time.Millisecond
			if withSpool {
				cfg.SpoolDir = t.TempDir()
			}
			w := startWriter(t, cfg, conn)
			write(t, w, testFlows(0, 15)) // one batch in flight, 5 rows in memory
			start := time.Now()
			if err := w.stop(t); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if d := time.Since(start); d < cfg.ShutdownTimeout || d > cfg.ShutdownTimeout+2*time.Second {
				t.Fatalf("shutdown took %v, timeout %v", d, cfg.ShutdownTimeout)
			}
			s := w.Stats()
			if withSpool && (s.SpoolRows != 15 || s.DroppedRows != 0) || !withSpool && s.DroppedRows != 15 {
				t.Fatalf("after shutdown: %+v", s)
			}
			if s.BufferedRows != 0 {
				t.Fatalf("%d rows still buffered", s.BufferedRows)
			}
		})
	}
}

func TestWriterIPFamilies(t *testing.T) {
	v4 := testFlow(0)
	v6 := testFlow(1)
	mapped := testFlow(2)
	mapped.SrcAddr = netip.MustParseAddr("::ffff:198.18.1.10") // not normalized by the caller
	mapped.IPVersion = 0
	wantMapped := mapped
	wantMapped.SrcAddr = netip.MustParseAddr("198.18.1.10")
	wantMapped.IPVersion = 4
	external6 := testFlow(3)
	external6.DstAddr = netip.MustParseAddr("fd00:10:db8::1")
	external6.Dst = flow.Endpoint{}
	external6.Service = flow.Service{}
	external6.ServiceAddr = netip.Addr{}
	external6.ServicePort = 0
	external6.Type = flow.FlowTypeToExternal
	external6.Egress = flow.Policy{Rule: -1, Verdict: flow.VerdictNotIsolated}

	for _, tc := range []struct {
		name string
		in   []flow.Record
		want []flow.Record
	}{
		{"ipv4", []flow.Record{v4}, []flow.Record{v4}},
		{"ipv6", []flow.Record{v6}, []flow.Record{v6}},
		{"ipv4 mapped in ipv6", []flow.Record{mapped}, []flow.Record{wantMapped}},
		{"ipv6 to external", []flow.Record{external6}, []flow.Record{external6}},
		{"dual-stack batch", []flow.Record{v4, v6, wantMapped, external6}, []flow.Record{v4, v6, wantMapped, external6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tbl := newFakeTable(t)
			w := startWriter(t, testConfig(), tbl.conn())
			write(t, w, tc.in)
			flush(t, w)
			tbl.mu.Lock()
			got := tbl.rows
			tbl.mu.Unlock()
			if len(got) != len(tc.want) {
				t.Fatalf("%d rows, want %d", len(got), len(tc.want))
			}
			for i := range got {
				if !reflect.DeepEqual(got[i], tc.want[i]) {
					t.Errorf("row %d:\n got %+v\nwant %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func TestWriterConcurrentWrites(t *testing.T) {
	// Writers in parallel, ClickHouse failing every third insert, the spool
	// absorbing the failures: every row arrives once, and each producer's
	// rows arrive in the order it wrote them.
	tbl := newFakeTable(t)
	tbl.setFail(func(call int, _ *flow.Record) (error, bool) {
		if call%3 == 1 {
			return errDown, call%2 == 0 // sometimes ambiguous
		}
		return nil, true
	})
	cfg := testConfig()
	cfg.SpoolDir = t.TempDir()
	cfg.BatchRows = 50
	cfg.MaxPending = 2
	cfg.Retries = 1
	cfg.FlushInterval = 5 * time.Millisecond
	w := startWriter(t, cfg, tbl.conn())

	const producers, each = 8, 500
	var wg sync.WaitGroup
	var buffered atomic.Int64 // Stats under load, for the race detector
	for p := range producers {
		wg.Go(func() {
			for i := 0; i < each; i += 25 {
				if err := w.Write(context.Background(), testFlows(p*each+i, 25)); err != nil {
					t.Error(err)
					return
				}
				buffered.Add(w.Stats().BufferedRows)
			}
		})
	}
	wg.Wait()
	flush(t, w)
	eventually(t, "all rows", func() bool { return len(tbl.ids()) >= producers*each })
	ids := tbl.ids()
	seen := map[int]bool{}
	last := map[int]int{}
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("row %d written twice", id)
		}
		seen[id] = true
		p := id / each
		if prev, ok := last[p]; ok && id < prev {
			t.Fatalf("producer %d: row %d after %d", p, id, prev)
		}
		last[p] = id
	}
	if len(ids) != producers*each {
		t.Fatalf("%d rows, want %d", len(ids), producers*each)
	}
}

func TestWriterRunTwice(t *testing.T) {
	w, err := NewWriter(testConfig(), &fakeConn{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := w.Run(ctx); err == nil {
		t.Fatal("second Run succeeded")
	}
}

func TestWriterSpoolOpenError(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig()
	cfg.SpoolDir = filepath.Join(file, "spool") // under a regular file
	w, err := NewWriter(cfg, &fakeConn{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(context.Background()); err == nil {
		t.Fatal("Run with an unusable spool dir succeeded")
	}
	if err := w.Write(context.Background(), testFlows(0, 1)); !errors.Is(err, ErrWriterClosed) {
		t.Fatalf("Write after failed Run = %v", err)
	}
}

func TestWriterMetricsRegistered(t *testing.T) {
	w := startWriter(t, testConfig(), &fakeConn{})
	write(t, w, testFlows(0, 10))
	flush(t, w)
	mfs, err := w.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	for _, want := range []string{
		"dualflow_store_rows_written_total", "dualflow_store_batches_written_total", "dualflow_store_insert_retries_total",
		"dualflow_store_insert_errors_total", "dualflow_store_spool_batches", "dualflow_store_spool_bytes",
		"dualflow_store_dropped_rows_total", "dualflow_store_buffered_rows", "dualflow_store_insert_duration_seconds",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("metric %s not registered (have %v)", want, names)
		}
	}
	// Registering twice on one registry fails loudly.
	if _, err := NewWriter(testConfig(), &fakeConn{}, w.reg, nil); err == nil {
		t.Fatal("duplicate registration succeeded")
	}
}

func TestIsRetryable(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"unavailable", errDown, true},
		{"wrapped unavailable", fmt.Errorf("insert: %w", errDown), true},
		{"timeout", context.DeadlineExceeded, true},
		{"net error", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, true},
		{"i/o deadline", fmt.Errorf("read: %w", os.ErrDeadlineExceeded), true},
		{"unexpected eof", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"server exception", errors.New("code: 62, DB::Exception: Syntax error"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Unavailable(tc.err); got != tc.want {
				t.Fatalf("Unavailable(%v) = %v", tc.err, got)
			}
		})
	}
}

func TestBackoffDelay(t *testing.T) {
	for n, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		if got := backoffDelay(100, 1000, n); got != want {
			t.Errorf("backoffDelay(100, 1000, %d) = %v, want %v", n, got, want)
		}
	}
	if got := backoffDelay(time.Second, time.Minute, 200); got != time.Minute {
		t.Errorf("large n: %v", got)
	}
}

// TestWriterEmbeddedOutage runs the writer against the real engine through an
// outage with ambiguous failures and a restart: ClickHouse ends up with every
// row exactly once.
func TestWriterEmbeddedOutage(t *testing.T) {
	e := needEngine(t)
	truncate(t, e)
	var isDown atomic.Bool
	var calls atomic.Int64
	conn := &fakeConn{InsertRowBinaryFunc: func(ctx context.Context, table string, cols []string, token string, rows int, data []byte) error {
		if isDown.Load() {
			return errDown
		}
		err := e.InsertRowBinary(ctx, table, cols, token, rows, data)
		if calls.Add(1)%2 == 1 && err == nil {
			return context.DeadlineExceeded // committed, but the answer is lost
		}
		return err
	}}
	cfg := testConfig()
	cfg.BatchRows = 25
	cfg.SpoolDir = t.TempDir()

	isDown.Store(true)
	a := startWriter(t, cfg, conn)
	write(t, a, testFlows(0, 100))
	flush(t, a)
	write(t, a, testFlows(100, 10)) // in memory at shutdown: spooled
	if err := a.stop(t); err != nil {
		t.Fatal(err)
	}

	isDown.Store(false)
	b := startWriter(t, cfg, conn)
	write(t, b, testFlows(110, 90))
	flush(t, b)
	eventually(t, "spool drained", func() bool { return b.Stats().SpoolBatches == 0 })
	got := queryString(t, e, "SELECT count(), uniqExact(flow_start), countIf(ip_version = 6), countIf(src_ip LIKE 'fd00:%') FROM dualflow.flows")
	if want := "200\t200\t100\t100"; got != want {
		t.Fatalf("count, distinct, v6 rows = %q, want %q", got, want)
	}
}

// TestWriterInsertersOverlap checks that Inserters batches are inserted at
// once (the second insert starts while the first is still running) and that
// every row is still written exactly once.
func TestWriterInsertersOverlap(t *testing.T) {
	tbl := newFakeTable(t)
	var running, peak atomic.Int32
	both := make(chan struct{})
	var once sync.Once
	conn := &fakeConn{InsertRowBinaryFunc: func(ctx context.Context, table string, columns []string, token string, rows int, data []byte) error {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if n == 2 {
			once.Do(func() { close(both) })
		}
		select { // hold the first insert until a second one runs
		case <-both:
		case <-time.After(5 * time.Second):
		}
		return tbl.insert(ctx, table, columns, token, rows, data)
	}}
	cfg := testConfig()
	cfg.Inserters, cfg.MaxPending = 2, 2
	w := startWriter(t, cfg, conn)
	for i := 0; i < 200; i += 10 {
		write(t, w, testFlows(i, 10))
	}
	flush(t, w)
	if p := peak.Load(); p != 2 {
		t.Errorf("at most %d inserts ran at once, want 2", p)
	}
	wantIDSet(t, tbl, seq(0, 200))
}

// TestWriterColumnar runs the writer tests against a Conn that takes
// columnar batches (the embedded engine's way): batching, back-pressure,
// outages and the spool (a columnar batch is spooled as RowBinary rows and
// replayed as such), shutdown, both families.
func TestWriterColumnar(t *testing.T) {
	fakeColumnar = true
	defer func() { fakeColumnar = false }()
	for _, tc := range []struct {
		name string
		fn   func(*testing.T)
	}{
		{"BatchesBySize", TestWriterBatchesBySize},
		{"BatchesByInterval", TestWriterBatchesByInterval},
		{"Flush", TestWriterFlush},
		{"BackPressure", TestWriterBackPressure},
		{"Outage", TestWriterOutage},
		{"AmbiguousFailure", TestWriterAmbiguousFailure},
		{"RestartReplaysSpool", TestWriterRestartReplaysSpool},
		{"SpoolFull", TestWriterSpoolFull},
		{"NoSpool", TestWriterNoSpool},
		{"NonRetryable", TestWriterNonRetryable},
		{"ShutdownTimeout", TestWriterShutdownTimeout},
		{"IPFamilies", TestWriterIPFamilies},
		{"ConcurrentWrites", TestWriterConcurrentWrites},
		{"InsertersOverlap", TestWriterInsertersOverlap},
	} {
		t.Run(tc.name, tc.fn)
	}

	// The batches did go the columnar way, and the buffered byte count
	// returns to zero once they are written.
	tbl := newFakeTable(t)
	w := startWriter(t, testConfig(), tbl.conn())
	write(t, w, testFlows(0, 10))
	if st := w.Stats(); st.BufferedRows != 10 || st.BufferedBytes <= 0 {
		t.Errorf("buffered %d rows, %d bytes; want 10 rows and their bytes", st.BufferedRows, st.BufferedBytes)
	}
	flush(t, w)
	if st := w.Stats(); st.BufferedRows != 0 || st.BufferedBytes != 0 {
		t.Errorf("after flush: buffered %d rows, %d bytes", st.BufferedRows, st.BufferedBytes)
	}
	wantIDs(t, tbl, seq(0, 10))
	tbl.mu.Lock()
	n := tbl.columnarInserts
	tbl.mu.Unlock()
	if n == 0 {
		t.Error("no batch came as columns")
	}
	if err := w.stop(t); err != nil {
		t.Fatal(err)
	}
}
