package store

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/migrations"
)

// The tests below are several collectors sharing one embedded store (the
// `dualflow store` command): each collector's backend is a Server over the
// store's ClickHouse HTTP interface.

// TestSharedStoreConcurrentWriters: three collectors' writers insert
// disjoint rows at once through the HTTP interface; every row lands exactly
// once, IPv4 and IPv6 alike.
func TestSharedStoreConcurrentWriters(t *testing.T) {
	h := newHTTPStore(t)
	truncate(t, engine)
	const writers, perWriter = 3, 6000
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for i := range writers {
		w, err := NewWriter(testWriterConfig(t.TempDir()), h.server(), nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- w.Run(ctx) }()
			base := i * perWriter
			for off := 0; off < perWriter; off += 500 {
				if err := w.Write(ctx, idRecords(base+off, 500)); err != nil {
					errs <- err
					break
				}
			}
			if err := w.Flush(ctx); err != nil {
				errs <- fmt.Errorf("writer %d flush: %w", i, err)
			}
			cancel()
			if err := <-done; err != nil {
				errs <- fmt.Errorf("writer %d: %w", i, err)
			}
			if st := w.Stats(); st.DroppedRows != 0 || st.SpooledRows != 0 {
				errs <- fmt.Errorf("writer %d dropped or spooled rows: %+v", i, st)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if rows, unique := countRows(t, engine); rows != writers*perWriter || unique != writers*perWriter {
		t.Fatalf("%d rows, %d unique ct_mark, want %d of each", rows, unique, writers*perWriter)
	}
	// idRecords alternates the families.
	got := queryString(t, engine, "SELECT ip_version, count(), countIf(src_ip = '') FROM dualflow.flows GROUP BY ip_version ORDER BY ip_version")
	want := fmt.Sprintf("4\t%d\t0\n6\t%d\t0", writers*perWriter/2, writers*perWriter/2)
	if got != want {
		t.Errorf("rows per family:\n%s\nwant\n%s", got, want)
	}
}

// TestSharedStoreDeduplication: a collector replaying a batch with its token
// (after an ambiguous failure) through the store's HTTP interface writes
// it once, in flows and in the rollups; another token writes again. The
// batch holds IPv4 and IPv6 rows.
func TestSharedStoreDeduplication(t *testing.T) {
	h := newHTTPStore(t)
	truncate(t, engine)
	a, b := h.server(), h.server()
	v4 := sampleRecord(1, false)
	v6 := sampleRecord(2, true)
	v4.SrcAddr, v4.DstAddr = netip.MustParseAddr("198.18.7.1"), netip.MustParseAddr("198.19.0.9")
	v6.SrcAddr, v6.DstAddr = netip.MustParseAddr("fd00:10::7:1"), netip.MustParseAddr("fd00:10:1::9")
	recs := []flow.Record{v4, v6}
	insertRecords(t, a, "shared-batch-1", recs...)
	insertRecords(t, a, "shared-batch-1", recs...) // the same collector retries
	insertRecords(t, b, "shared-batch-1", recs...) // the token is the batch's, whoever sends it
	if got := queryString(t, engine, "SELECT count() FROM dualflow.flows"); got != "2" {
		t.Fatalf("after a replayed batch: %s rows, want 2", got)
	}
	insertRecords(t, b, "shared-batch-2", recs...)
	if got := queryString(t, engine, "SELECT count() FROM dualflow.flows"); got != "4" {
		t.Errorf("after a second batch: %s rows, want 4", got)
	}
	if got := queryString(t, engine, "SELECT sum(records) FROM dualflow.rollup_node_to_node_1m"); got != "4" {
		t.Errorf("rollup records = %s, want 4 (the replay deduplicated in the views too)", got)
	}
	got := queryString(t, engine, "SELECT ip_version, src_ip, dst_ip, count() FROM dualflow.flows GROUP BY ALL ORDER BY ip_version")
	want := "4\t198.18.7.1\t198.19.0.9\t2\n6\tfd00:10::7:1\tfd00:10:1::9\t2"
	if got != want {
		t.Errorf("rows:\n%s\nwant\n%s", got, want)
	}
}

// TestSharedStoreConcurrentMigrations: collectors starting at once against
// a store whose schema is not applied yet (the `dualflow store` command
// applies it before serving, so this is the worst case, e.g. an older
// store) all run the migrations concurrently. Every statement is
// idempotent (IF NOT EXISTS, MODIFY SETTING) and schema_migrations is read
// grouped by version, so all succeed and each migration is recorded as
// applied once.
func TestSharedStoreConcurrentMigrations(t *testing.T) {
	h := newHTTPStore(t)
	const db = "dualflow_race"
	t.Cleanup(func() { _ = engine.Exec(context.Background(), "DROP DATABASE IF EXISTS "+db+" SYNC") })
	opt := migrations.Options{Database: db, TTLDays: 7}
	var wg sync.WaitGroup
	errs := make(chan error, 3)
	start := make(chan struct{})
	for range 3 {
		s := h.server()
		wg.Go(func() {
			r, err := migrations.NewRunner(s, opt)
			if err != nil {
				errs <- err
				return
			}
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			if _, err := r.Up(ctx); err != nil {
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	r, err := migrations.NewRunner(engine, opt)
	if err != nil {
		t.Fatal(err)
	}
	pending, err := r.Pending(context.Background())
	if err != nil || len(pending) != 0 {
		t.Fatalf("pending after concurrent migrations: %v, %v", pending, err)
	}
	all, _ := migrations.All()
	if got := queryString(t, engine, "SELECT count(DISTINCT version) FROM "+db+".schema_migrations"); got != fmt.Sprint(len(all)) {
		t.Errorf("%s versions recorded, want %d", got, len(all))
	}
	// The schema works: a batch goes in through a collector's backend.
	s := h.server()
	var data []byte
	rec := sampleRecord(3, true)
	data = AppendFlowRow(data, &rec)
	if err := s.InsertRowBinary(context.Background(), db+"."+FlowsTable, FlowColumns, "race-1", 1, data); err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, engine, "SELECT count() FROM "+db+".flows"); got != "1" {
		t.Errorf("%s rows in %s.flows, want 1", got, db)
	}
	if ttl := queryString(t, engine, "SELECT engine_full FROM system.tables WHERE database = '"+db+"' AND name = 'flows'"); !strings.Contains(ttl, "toIntervalDay(7)") {
		t.Errorf("flows engine lacks the 7-day TTL: %s", ttl)
	}
}

// BenchmarkSharedStoreWriters measures the rows/s that collectors sharing
// one embedded store (`dualflow store`) insert through its ClickHouse HTTP
// interface: one writer, or three at once, each a Writer with the
// collector's default configuration over a Server backend (clickhouse-go,
// HTTP), the code path of `dualflow collector --clickhouse.dsn http://…`.
// The same 600k realistic IPv4/IPv6 rows are written in both cases (split
// evenly), and the clock stops when every row is visible to a query.
func BenchmarkSharedStoreWriters(b *testing.B) {
	for _, writers := range []int{1, 3} {
		b.Run(fmt.Sprintf("writers=%d", writers), func(b *testing.B) { benchSharedStore(b, writers) })
	}
}

func benchSharedStore(b *testing.B, writers int) {
	h := newHTTPStore(b)
	const total = 600_000
	const chunk = 1000
	recs := benchFlows(64 * 1024)
	now := time.Now().UTC()
	for i := range recs {
		recs[i].FlowEnd = now
	}
	servers := make([]*Server, writers)
	for i := range servers {
		servers[i] = h.server()
	}
	cfg := WriterConfig{}
	cfg.SetDefaults()
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		b.StopTimer()
		truncate(b, engine)
		ws := make([]*Writer, writers)
		dones := make([]chan error, writers)
		ctx, cancel := context.WithCancel(context.Background())
		for i := range ws {
			c := cfg
			c.SpoolDir = b.TempDir()
			w, err := NewWriter(c, servers[i], nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			ws[i], dones[i] = w, make(chan error, 1)
			go func() { dones[i] <- w.Run(ctx) }()
		}
		b.StartTimer()
		var wg sync.WaitGroup
		errs := make(chan error, writers)
		per := total / writers
		for i, w := range ws {
			wg.Go(func() {
				batch := make([]flow.Record, chunk)
				for off := 0; off < per; off += chunk {
					id := i*per + off
					for j := range batch {
						batch[j] = recs[(id+j)%len(recs)]
						batch[j].Mark = uint32(id + j)
					}
					if err := w.Write(ctx, batch); err != nil {
						errs <- err
						return
					}
				}
				if err := w.Flush(ctx); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		if rows, unique := countRows(b, engine); rows != total || unique != total {
			b.Fatalf("%d rows, %d unique, want %d", rows, unique, total)
		}
		b.StopTimer()
		cancel()
		for i, w := range ws {
			if err := <-dones[i]; err != nil {
				b.Fatal(err)
			}
			if st := w.Stats(); st.DroppedRows != 0 || st.SpooledRows != 0 {
				b.Fatalf("writer %d dropped or spooled rows: %+v", i, st)
			}
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds(), "rows/s")
}
