package chhttp

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"reflect"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/google/uuid"
)

// openClickHouseGo connects unmodified clickhouse-go/v2 over HTTP to a shim
// server.
func openClickHouseGo(t testing.TB, serverURL string, comp *clickhouse.Compression) driver.Conn {
	t.Helper()
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := clickhouse.Open(&clickhouse.Options{
		Addr:        []string{u.Host},
		Protocol:    clickhouse.HTTP,
		Auth:        clickhouse.Auth{Username: "writer", Password: "w-secret"},
		Compression: comp,
		DialTimeout: 10 * time.Second,
		ReadTimeout: 60 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// goUsers are the accounts of the clickhouse-go tests: the driver sends
// its credentials as ClickHouse servers expect them.
var goUsers = []User{{Name: "writer", Password: "w-secret"}}

// flowRow holds one row of every modern type the project uses.
type flowRow struct {
	TS    time.Time
	Src4  netip.Addr // IPv4 column
	Src6  netip.Addr // IPv6 column, v6 or v4-mapped
	Proto string     // LowCardinality(String)
	Attrs map[string]string
	ID    uuid.UUID
	Note  *string // Nullable(String)
	Ports []uint16
	Dir   string // Enum8
	Bytes uint64
}

const flowsDDL = `CREATE TABLE %s.flows (
	ts DateTime64(3, 'UTC'), src4 IPv4, src6 IPv6, proto LowCardinality(String),
	attrs Map(String, String), id UUID, note Nullable(String), ports Array(UInt16),
	dir Enum8('in' = 1, 'out' = 2), bytes UInt64
) ENGINE = MergeTree ORDER BY (proto, ts)`

func testRows() []flowRow {
	note := "hello"
	base := time.Date(2024, 5, 1, 10, 0, 0, 123e6, time.UTC)
	return []flowRow{
		{base, netip.MustParseAddr("198.18.2.1"), netip.MustParseAddr("fd00:10:db8::1"), "tcp",
			map[string]string{"pod": "a", "ns": "default"}, uuid.MustParse("6ba7b810-9dad-11d1-80b4-00c04fd430c8"), &note, []uint16{80, 443}, "in", 1500},
		{base.Add(time.Second), netip.MustParseAddr("198.18.2.3"), netip.MustParseAddr("::ffff:198.19.100.7"), "udp",
			map[string]string{}, uuid.MustParse("00000000-0000-4000-8000-000000000001"), nil, nil, "out", 64},
		{base.Add(2 * time.Second), netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("fd00:10::1"), "icmpv6",
			map[string]string{"k": "v"}, uuid.Nil, nil, []uint16{}, "in", 0},
	}
}

func TestClickHouseGoRoundTrip(t *testing.T) {
	ts, _ := testServer(t, Config{Users: goUsers})
	compressions := []struct {
		name string
		comp *clickhouse.Compression
	}{
		{"none", nil},
		{"gzip", &clickhouse.Compression{Method: clickhouse.CompressionGZIP}},
		{"lz4", &clickhouse.Compression{Method: clickhouse.CompressionLZ4}},
		{"zstd", &clickhouse.Compression{Method: clickhouse.CompressionZSTD}},
		{"deflate", &clickhouse.Compression{Method: clickhouse.CompressionDeflate}},
		{"brotli", &clickhouse.Compression{Method: clickhouse.CompressionBrotli}},
	}
	for _, c := range compressions {
		t.Run(c.name, func(t *testing.T) {
			d := newDatabase(t)
			ctx := context.Background()
			conn := openClickHouseGo(t, ts.URL, c.comp)
			if err := conn.Ping(ctx); err != nil {
				t.Fatalf("ping: %v", err)
			}
			v, err := conn.ServerVersion()
			if err != nil || v.Version.Major < 25 || v.Revision == 0 {
				t.Fatalf("server version %+v: %v", v, err)
			}
			if err := conn.Exec(ctx, fmt.Sprintf(flowsDDL, d)); err != nil {
				t.Fatalf("create: %v", err)
			}
			rows := testRows()
			for _, insert := range []string{
				"INSERT INTO " + d + ".flows",
				"INSERT INTO " + d + ".flows (ts, src4, src6, proto, attrs, id, note, ports, dir, bytes)",
			} {
				batch, err := conn.PrepareBatch(ctx, insert)
				if err != nil {
					t.Fatalf("prepare %q: %v", insert, err)
				}
				for _, r := range rows {
					if err := batch.Append(r.TS, r.Src4, r.Src6, r.Proto, r.Attrs, r.ID, r.Note, r.Ports, r.Dir, r.Bytes); err != nil {
						t.Fatalf("append: %v", err)
					}
				}
				if err := batch.Send(); err != nil {
					t.Fatalf("send %q: %v", insert, err)
				}
			}
			res, err := conn.Query(clickhouse.Context(ctx, clickhouse.WithParameters(clickhouse.Parameters{"min": "0"})),
				"SELECT ts, src4, src6, proto, attrs, id, note, ports, dir, bytes FROM "+d+".flows WHERE bytes >= {min:UInt64} ORDER BY ts, bytes")
			if err != nil {
				t.Fatalf("query: %v", err)
			}
			var got []flowRow
			for res.Next() {
				var r flowRow
				if err := res.Scan(&r.TS, &r.Src4, &r.Src6, &r.Proto, &r.Attrs, &r.ID, &r.Note, &r.Ports, &r.Dir, &r.Bytes); err != nil {
					t.Fatalf("scan: %v", err)
				}
				got = append(got, r)
			}
			if err := res.Err(); err != nil {
				t.Fatal(err)
			}
			res.Close()
			if len(got) != 2*len(rows) {
				t.Fatalf("got %d rows, want %d", len(got), 2*len(rows))
			}
			for i, g := range got {
				w := rows[i/2]
				g.TS = g.TS.UTC()
				if g.Ports == nil {
					g.Ports = []uint16{}
				}
				if w.Ports == nil {
					w.Ports = []uint16{}
				}
				if !w.Src6.Is4In6() {
					g.Src6 = g.Src6.Unmap()
				}
				if !reflect.DeepEqual(g, w) {
					t.Errorf("row %d:\n got %+v\nwant %+v", i, g, w)
				}
			}

			// Named parameters for IPv4 and IPv6 values, server side.
			var n uint64
			if err := conn.QueryRow(clickhouse.Context(ctx, clickhouse.WithParameters(clickhouse.Parameters{"a": "198.18.2.1", "b": "fd00:10:db8::1"})),
				"SELECT count() FROM "+d+".flows WHERE src4 = {a:IPv4} OR src6 = {b:IPv6}").Scan(&n); err != nil || n != 2 {
				t.Errorf("params count = %d, %v", n, err)
			}
			var s4, s6 string
			if err := conn.QueryRow(ctx, "SELECT toString(src4), toString(src6) FROM "+d+".flows WHERE proto = 'udp' LIMIT 1").Scan(&s4, &s6); err != nil || s4 != "198.18.2.3" || s6 != "::ffff:198.19.100.7" {
				t.Errorf("udp row: %q %q %v", s4, s6, err)
			}

			// Errors come back typed, with ClickHouse's code.
			err = conn.Exec(ctx, "SELEC 1")
			var ex *clickhouse.Exception
			if !errors.As(err, &ex) || ex.Code != 62 {
				t.Errorf("bad SQL: %v, want code 62", err)
			}
			_, err = conn.Query(ctx, "SELECT * FROM "+d+".nope")
			if !errors.As(err, &ex) || ex.Code != 60 {
				t.Errorf("unknown table: %v, want code 60", err)
			}
		})
	}
}

func TestClickHouseGoBatch100k(t *testing.T) {
	ts, _ := testServer(t, Config{Users: goUsers})
	d := newDatabase(t)
	ctx := context.Background()
	conn := openClickHouseGo(t, ts.URL, nil)
	if err := conn.Exec(ctx, fmt.Sprintf(flowsDDL, d)); err != nil {
		t.Fatal(err)
	}
	const n = 100_000
	insertFlows(t, ctx, conn, d, n)
	var count, v4 uint64
	if err := conn.QueryRow(ctx, "SELECT count(), countIf(startsWith(toString(src6), '::ffff:')) FROM "+d+".flows").Scan(&count, &v4); err != nil {
		t.Fatal(err)
	}
	if count != n || v4 != n/2 {
		t.Errorf("count %d (v4-mapped %d), want %d (%d)", count, v4, n, n/2)
	}
}

func insertFlows(t testing.TB, ctx context.Context, conn driver.Conn, d string, n int) {
	t.Helper()
	batch, err := conn.PrepareBatch(ctx, "INSERT INTO "+d+".flows")
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC)
	v4 := netip.MustParseAddr("198.18.2.1")
	v6 := netip.MustParseAddr("fd00:10:db8::1")
	attrs := map[string]string{"pod": "web-1"}
	id := uuid.MustParse("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
	for i := range n {
		src6 := v6
		if i%2 == 0 {
			src6 = netip.AddrFrom16(v4.As16())
		}
		proto := "tcp"
		if i%3 == 0 {
			proto = "udp"
		}
		if err := batch.Append(base.Add(time.Duration(i)*time.Millisecond), v4, src6, proto, attrs, id, nil, []uint16{443}, "out", uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := batch.Send(); err != nil {
		t.Fatal(err)
	}
}

func BenchmarkClickHouseGoBatchInsert(b *testing.B) {
	ts, _ := testServer(b, Config{Users: goUsers})
	d := newDatabase(b)
	ctx := context.Background()
	conn := openClickHouseGo(b, ts.URL, nil)
	if err := conn.Exec(ctx, fmt.Sprintf(flowsDDL, d)); err != nil {
		b.Fatal(err)
	}
	const rows = 100_000
	b.ReportAllocs()
	for b.Loop() {
		insertFlows(b, ctx, conn, d, rows)
	}
	b.ReportMetric(float64(rows*b.N)/b.Elapsed().Seconds(), "rows/s")
}
