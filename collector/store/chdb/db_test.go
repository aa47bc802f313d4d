package chdb

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestVersion(t *testing.T) {
	db := testDB(t)
	v, err := db.Version(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(v, "26.") {
		t.Errorf("version() = %q, want 26.x", v)
	}
}

func TestModernTypesDDL(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	d := newDatabase(t, db)
	ddl := `CREATE TABLE ` + d + `.flows (
		ts DateTime64(3, 'UTC'), src IPv6, dst IPv4, proto LowCardinality(String),
		attrs Map(String, String), bytes UInt64
	) ENGINE = MergeTree PARTITION BY toYYYYMMDD(ts) ORDER BY (proto, ts)
	TTL toDateTime(ts) + INTERVAL 50 YEAR` // long: the fixed 2024 rows must not expire under the test
	if err := db.Exec(ctx, ddl); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(ctx, `INSERT INTO `+d+`.flows VALUES
		('2024-05-01 10:00:00.123', 'fd00:10:db8::1', '198.18.0.1', 'tcp', {'k':'v'}, 100),
		('2024-05-01 10:00:01.456', '::ffff:198.18.2.7', '198.18.2.8', 'udp', {}, 200)`); err != nil {
		t.Fatal(err)
	}
	out, err := db.Query(ctx, `SELECT toString(ts), toString(src), toString(dst), proto, attrs['k'], bytes FROM `+d+`.flows ORDER BY ts`, "TSV")
	if err != nil {
		t.Fatal(err)
	}
	want := "2024-05-01 10:00:00.123\tfd00:10:db8::1\t198.18.0.1\ttcp\tv\t100\n" +
		"2024-05-01 10:00:01.456\t::ffff:198.18.2.7\t198.18.2.8\tudp\t\t200\n"
	if string(out) != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
}

// encodeFlows encodes n rows of (ts DateTime64(3), src IPv6, proto
// LowCardinality(String), bytes UInt64) as RowBinary, alternating IPv4
// (mapped) and IPv6 sources.
func encodeFlows(n int) []byte {
	var buf bytes.Buffer
	base := time.Date(2024, 5, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
	v4 := netip.MustParseAddr("198.18.2.1")
	v6 := netip.MustParseAddr("fd00:10:db8::1")
	var b8 [8]byte
	for i := range n {
		binary.LittleEndian.PutUint64(b8[:], uint64(base+int64(i)))
		buf.Write(b8[:])
		a := v6
		if i%2 == 0 {
			a = netip.AddrFrom16(v4.As16())
		}
		a16 := a.As16()
		buf.Write(a16[:])
		proto := "tcp"
		if i%3 == 0 {
			proto = "udp"
		}
		buf.WriteByte(byte(len(proto)))
		buf.WriteString(proto)
		binary.LittleEndian.PutUint64(b8[:], uint64(i))
		buf.Write(b8[:])
	}
	return buf.Bytes()
}

// newFlowsTable creates table f, the shape encodeFlows writes, in a new
// database, and returns the database.
func newFlowsTable(t *testing.T, db *DB) string {
	t.Helper()
	d := newDatabase(t, db)
	if err := db.Exec(context.Background(), `CREATE TABLE `+d+`.f (ts DateTime64(3,'UTC'), src IPv6, proto LowCardinality(String), bytes UInt64)
		ENGINE = MergeTree ORDER BY ts`); err != nil {
		t.Fatal(err)
	}
	return d
}

func TestInsertRowBinary(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	d := newFlowsTable(t, db)
	const rows = 100_000
	data := encodeFlows(rows)
	n, err := db.Insert(ctx, "INSERT INTO "+d+".f (ts, src, proto, bytes) SETTINGS insert_deduplication_token='batch-1' FORMAT RowBinary", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if n != rows {
		t.Errorf("rows written = %d, want %d", n, rows)
	}
	out, err := db.Query(ctx, "SELECT count(), sum(bytes), countIf(isIPv4String(replaceOne(toString(src), '::ffff:', ''))) FROM "+d+".f", "TSV")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), "100000\t4999950000\t50000\n"; got != want {
		t.Errorf("count/sum/v4 = %q, want %q", got, want)
	}
}

func TestInsertForms(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	d := newDatabase(t, db)
	if err := db.Exec(ctx, "CREATE TABLE "+d+".t (a UInt32, s String) ENGINE = Memory"); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		query string
		data  string
		rows  uint64
	}{
		{"tsv", "INSERT INTO " + d + ".t FORMAT TSV", "1\ta\n2\tb\n", 2},
		{"inline data", "INSERT INTO " + d + ".t FORMAT CSV\n3,c\n", "4,d\n", 2},
		{"values", "INSERT INTO " + d + ".t VALUES (5, 'e'), (6, 'f')", "", 2},
		{"json columns", "INSERT INTO " + d + ".t (s, a) FORMAT JSONEachRow", `{"a":7,"s":"g"}` + "\n", 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n, err := db.Insert(ctx, tt.query, strings.NewReader(tt.data))
			if err != nil {
				t.Fatal(err)
			}
			if n != tt.rows {
				t.Errorf("rows = %d, want %d", n, tt.rows)
			}
		})
	}
	if _, err := db.Insert(ctx, "SELECT 1", nil); err == nil {
		t.Error("Insert(SELECT) succeeded")
	}
	_, err := db.Insert(ctx, "INSERT INTO "+d+".t FORMAT TSV", strings.NewReader("x\ty\n"))
	var ce *Error
	if !errors.As(err, &ce) || ce.Code != 27 {
		t.Errorf("bad data: err = %v, want code 27", err)
	}
}

func TestQueryWithParams(t *testing.T) {
	db := testDB(t)
	tests := []struct {
		name   string
		query  string
		params map[string]string
		want   string
	}{
		{"string", "SELECT {s:String}", map[string]string{"s": "it's"}, "it\\'s\n"},
		{"ipv4", "SELECT toString({a:IPv4})", map[string]string{"a": "198.18.2.1"}, "198.18.2.1\n"},
		{"ipv6", "SELECT toString({a:IPv6})", map[string]string{"a": "fd00:10:db8::1"}, "fd00:10:db8::1\n"},
		{"in range", "SELECT isIPAddressInRange({a:String}, {n:String})", map[string]string{"a": "fd00:10:db8::5", "n": "fd00:10:db8::/64"}, "1\n"},
		{"several", "SELECT {x:UInt8} + {y:UInt8}", map[string]string{"x": "40", "y": "2"}, "42\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := db.QueryWithParams(context.Background(), tt.query, "TSV", tt.params)
			if err != nil {
				t.Fatal(err)
			}
			if string(out) != tt.want {
				t.Errorf("got %q, want %q", out, tt.want)
			}
		})
	}
	_, err := db.QueryWithParams(context.Background(), "SELECT {x:UInt8}", "TSV", map[string]string{"x": "nope"})
	var ce *Error
	if !errors.As(err, &ce) {
		t.Errorf("bad param: err = %v, want *Error", err)
	}
}

func TestErrors(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	tests := []struct {
		query string
		code  int
		name  string
	}{
		{"SELEC 1", CodeSyntaxError, "SYNTAX_ERROR"},
		{"SELECT * FROM no_such_table", CodeUnknownTable, "UNKNOWN_TABLE"},
		{"SELECT nosuchfunction(1)", 46, "UNKNOWN_FUNCTION"},
	}
	for _, tt := range tests {
		_, err := db.Query(ctx, tt.query, "")
		var ce *Error
		if !errors.As(err, &ce) {
			t.Fatalf("%q: err = %v (%T), want *Error", tt.query, err, err)
		}
		if ce.Code != tt.code || ce.Name != tt.name {
			t.Errorf("%q: code %d %s, want %d %s", tt.query, ce.Code, ce.Name, tt.code, tt.name)
		}
		if !strings.HasPrefix(ce.Error(), "Code: "+strconv.Itoa(tt.code)+". DB::Exception: ") || strings.Contains(ce.Message, "dualflow-q") {
			t.Errorf("%q: Error() = %q", tt.query, ce.Error())
		}
	}
	for _, q := range []string{"SELECT 1;", "SELECT 1 -- trailing comment", "SELECT 1 FORMAT TSV"} {
		if out, err := db.Query(ctx, q, ""); err != nil || string(out) != "1\n" {
			t.Errorf("%q: %q %v", q, out, err)
		}
	}
	if _, err := db.Query(ctx, "SELECT 1\x00; DROP DATABASE x", ""); err == nil {
		t.Error("NUL in query text accepted")
	}
}

func TestParseError(t *testing.T) {
	tests := []struct {
		text, msg, name string
		code            int
	}{
		{"Code: 62. DB::Exception: Syntax error: x. (SYNTAX_ERROR) (version 26.7.2.1)", "Syntax error: x. (SYNTAX_ERROR) (version 26.7.2.1)", "SYNTAX_ERROR", 62},
		{"Code: 60. DB::Exception: Unknown table 'a'. (UNKNOWN_TABLE)\n", "Unknown table 'a'. (UNKNOWN_TABLE)", "UNKNOWN_TABLE", 60},
		{"Unexpected null connection", "Unexpected null connection", "", 0},
	}
	for _, tt := range tests {
		e := parseError(tt.text)
		if e.Code != tt.code || e.Message != tt.msg || e.Name != tt.name {
			t.Errorf("parseError(%q) = %+v", tt.text, *e)
		}
	}
}

func TestSettings(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	d := newDatabase(t, db)
	if err := db.Exec(ctx, "CREATE TABLE "+d+".t (a UInt32) ENGINE = Memory"); err != nil {
		t.Fatal(err)
	}
	ro := map[string]string{"readonly": "1", "max_result_rows": "5"}
	res, err := db.Run(ctx, Statement{Query: "SELECT getSetting('readonly'), getSetting('max_result_rows')", Settings: ro})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Data) != "1\t5\n" {
		t.Errorf("settings seen by the engine: %q", res.Data)
	}
	var ce *Error
	for _, q := range []string{
		"INSERT INTO " + d + ".t VALUES (1)",
		"CREATE TABLE " + d + ".u (a UInt8) ENGINE = Memory",
		"SELECT * FROM numbers(1) SETTINGS max_threads = 1",
		"SELECT 1 SETTINGS max_threads = 1",
	} {
		_, err := db.Run(ctx, Statement{Query: q, Settings: ro})
		if !errors.As(err, &ce) || ce.Code != CodeReadonly {
			t.Errorf("readonly %q: err = %v, want code 164", q, err)
		}
	}
	_, err = db.InsertStatement(ctx, Statement{Query: "INSERT INTO " + d + ".t FORMAT TSV", Settings: ro}, strings.NewReader("1\n"))
	if !errors.As(err, &ce) || ce.Code != CodeReadonly {
		t.Errorf("readonly insert: err = %v, want code 164", err)
	}
	_, err = db.Run(ctx, Statement{Query: "SELECT 1", Settings: map[string]string{"no_such_setting": "1"}})
	if !errors.As(err, &ce) || ce.Code != CodeUnknownSetting {
		t.Errorf("unknown setting: err = %v, want code 115", err)
	}
	_, err = db.Run(ctx, Statement{Query: "SELECT 1", Settings: map[string]string{"max_threads": "lots"}})
	if !errors.As(err, &ce) {
		t.Errorf("bad setting value: err = %v, want *Error", err)
	}
	_, err = db.Run(ctx, Statement{Query: "SELECT number FROM numbers(100)", Settings: map[string]string{"max_result_rows": "10", "result_overflow_mode": "throw"}})
	if !errors.As(err, &ce) || ce.Code != 396 {
		t.Errorf("max_result_rows: err = %v, want code 396", err)
	}
	// Database and session isolation: USE on one statement does not leak.
	res, err = db.Run(ctx, Statement{Query: "SELECT currentDatabase()", Database: d})
	if err != nil || string(res.Data) != d+"\n" {
		t.Errorf("database option: %q %v", res.Data, err)
	}
	if err := db.Exec(ctx, "USE "+d); err != nil {
		t.Fatal(err)
	}
	out, err := db.Query(ctx, "SELECT currentDatabase()", "")
	if err != nil || string(out) != "default\n" {
		t.Errorf("after USE: current database %q %v, want default", out, err)
	}
}

func TestCancel(t *testing.T) {
	db := testDB(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := db.Query(ctx, "SELECT sleepEachRow(0.2) FROM numbers(50) SETTINGS function_sleep_max_microseconds_per_block = 0", "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want deadline exceeded", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("cancel took %v", el)
	}
	cancelled, stop := context.WithCancel(context.Background())
	stop()
	if _, err := db.Query(cancelled, "SELECT 1", ""); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled ctx: err = %v", err)
	}
}

func TestConcurrent(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	d := newDatabase(t, db)
	if err := db.Exec(ctx, "CREATE TABLE "+d+".t (a UInt64) ENGINE = MergeTree ORDER BY a"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				var data strings.Builder
				for r := range 1000 {
					data.WriteString(strconv.Itoa(w*100000+i*1000+r) + "\n")
				}
				if _, err := db.Insert(ctx, "INSERT INTO "+d+".t FORMAT TSV", strings.NewReader(data.String())); err != nil {
					errs <- err
					return
				}
				if _, err := db.Query(ctx, "SELECT count() FROM "+d+".t", ""); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	out, err := db.Query(ctx, "SELECT count() FROM "+d+".t", "")
	if err != nil || string(out) != "40000\n" {
		t.Errorf("count = %q %v, want 40000", out, err)
	}
}

// TestResultsFreed runs many queries with 1 MiB results; if results leaked,
// RSS would grow by the total (256 MiB).
func TestResultsFreed(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	q := "SELECT repeat('x', 1024) FROM numbers(1024)"
	for range 8 { // warm up pools and caches
		if _, err := db.Query(ctx, q, "RowBinary"); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	before := rss(t)
	for range 256 {
		if _, err := db.Query(ctx, q, "RowBinary"); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	if grew := rss(t) - before; grew > 96<<20 {
		t.Errorf("RSS grew by %d MiB over 256 MiB of results", grew>>20)
	}
}

func rss(t *testing.T) int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		t.Skip("no /proc/self/statm")
	}
	f := strings.Fields(string(b))
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// TestGoPanicRecovered proves Go keeps its signal handlers after Open: a nil
// dereference is an ordinary recoverable panic, not a hang in chDB's handler.
func TestGoPanicRecovered(t *testing.T) {
	testDB(t)
	done := make(chan any, 1)
	go func() {
		defer func() { done <- recover() }()
		var p *int
		_ = *p //nolint:govet // deliberate nil dereference
	}()
	select {
	case r := <-done:
		if r == nil {
			t.Fatal("no panic")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nil dereference did not panic within 10s: chDB's signal handlers are installed")
	}
}

func TestMissingLibrary(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libchdb.so")
	_, err := Open(Config{LibPath: missing, DataDir: t.TempDir()})
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Fatalf("err = %v, want ErrLibraryNotFound", err)
	}
	for _, want := range []string{missing, "make deps"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	t.Setenv(EnvLibPath, missing)
	if _, err := FindLibrary(""); !errors.Is(err, ErrLibraryNotFound) || !strings.Contains(err.Error(), EnvLibPath) {
		t.Errorf("FindLibrary with bad $%s: %v", EnvLibPath, err)
	}
}

func TestOpenOtherDir(t *testing.T) {
	testDB(t)
	_, err := Open(Config{DataDir: t.TempDir()})
	if !errors.Is(err, ErrOtherDir) {
		t.Errorf("second directory: err = %v, want ErrOtherDir", err)
	}
	db2, err := Open(Config{DataDir: filepath.Join(shared.dir, "data")})
	if err != nil {
		t.Fatalf("same directory again: %v", err)
	}
	if err := db2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := db2.Query(context.Background(), "SELECT 1", ""); !errors.Is(err, ErrClosed) {
		t.Errorf("query after close: %v", err)
	}
}

// TestOpenLockedByOtherProcess re-executes the test binary against the
// shared data directory, which this process holds.
func TestOpenLockedByOtherProcess(t *testing.T) {
	testDB(t)
	if testing.Short() {
		t.Skip("starts a second engine process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envLockChild+"="+filepath.Join(shared.dir, "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "8123") {
		t.Errorf("ErrLocked text does not point at the HTTP endpoint:\n%s", out)
	}
}

func BenchmarkInsertRowBinary(b *testing.B) {
	db := testDB(b)
	ctx := context.Background()
	d := newDatabase(b, db)
	if err := db.Exec(ctx, "CREATE TABLE "+d+".n (ts DateTime, k UInt32, v UInt64) ENGINE = MergeTree ORDER BY (k, ts)"); err != nil {
		b.Fatal(err)
	}
	const rows = 100_000
	data := make([]byte, 0, rows*16)
	for i := range rows {
		data = binary.LittleEndian.AppendUint32(data, uint32(1714521600+i))
		data = binary.LittleEndian.AppendUint32(data, uint32(i%100))
		data = binary.LittleEndian.AppendUint64(data, uint64(i))
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		if _, err := db.Insert(ctx, "INSERT INTO "+d+".n (ts, k, v) FORMAT RowBinary", bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rows*b.N)/b.Elapsed().Seconds(), "rows/s")
}

// TestFailedStatementLeavesNoResult: a statement that fails while writing
// its output must not hand its result to the next statement that reuses the
// pooled connection (same settings).
func TestFailedStatementLeavesNoResult(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	settings := map[string]string{"readonly": "1", "max_result_rows": "10", "result_overflow_mode": "throw",
		"max_execution_time": "10", "max_memory_usage": "1000000000"}
	for i := 0; i < 3; i++ {
		if _, err := db.Run(ctx, Statement{Query: "SELECT number FROM system.numbers LIMIT 100000", Format: "JSONEachRow", Settings: settings}); err == nil {
			t.Fatal("overflowing statement succeeded")
		}
		res, err := db.Run(ctx, Statement{Query: "SELECT count() FROM numbers(5)", Format: "TSV", Settings: settings})
		if err != nil {
			t.Fatal(err)
		}
		if got := string(res.Data); got != "5\n" {
			t.Fatalf("next statement got %q, want \"5\\n\" (a stale result from the failed one?)", got)
		}
	}
}

// TestInsertBuffers sends the same RowBinary data as pieces that split rows
// anywhere, some larger than one append chunk, and checks the table has
// exactly what a single reader gives.
func TestInsertBuffers(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	d := newFlowsTable(t, db)
	const rows = 100_000
	data := encodeFlows(rows)
	cuts := []int{0, 1, 7, 1000, 1000, insertChunk + 3, len(data)}
	var bufs Buffers
	for i := 1; i < len(cuts); i++ {
		bufs = append(bufs, data[cuts[i-1]:cuts[i]])
	}
	n, err := db.Insert(ctx, "INSERT INTO "+d+".f (ts, src, proto, bytes) FORMAT RowBinary", &bufs)
	if err != nil {
		t.Fatal(err)
	}
	if n != rows {
		t.Errorf("rows written = %d, want %d", n, rows)
	}
	out, err := db.Query(ctx, "SELECT count(), sum(bytes) FROM "+d+".f", "TSV")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(out), "100000\t4999950000\n"; got != want {
		t.Errorf("count/sum = %q, want %q", got, want)
	}
	// A truncated row in the last piece is the engine's error, not a hang
	// or a silent short insert.
	short := Buffers{data[:1000], data[1000 : len(data)-3]}
	if _, err := db.Insert(ctx, "INSERT INTO "+d+".f (ts, src, proto, bytes) FORMAT RowBinary", &short); err == nil {
		t.Error("insert of a truncated row: no error")
	}
}

func TestBuffersRead(t *testing.T) {
	b := Buffers{[]byte("ab"), nil, []byte("cde"), []byte("f")}
	got, err := io.ReadAll(&b)
	if err != nil || string(got) != "abcdef" {
		t.Fatalf("ReadAll = %q, %v", got, err)
	}
	if n, err := b.Read(make([]byte, 4)); n != 0 || err != io.EOF {
		t.Fatalf("Read after end = %d, %v", n, err)
	}
}

// TestCancelInsertInEngine: an insert whose data is all sent but that the
// engine is still working on (a slow materialized view here) ends soon
// after ctx does, as a cancellation; the connection stays usable.
func TestCancelInsertInEngine(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	d := newDatabase(t, db)
	for _, q := range []string{
		"CREATE TABLE " + d + ".t (a UInt64) ENGINE = MergeTree ORDER BY a",
		"CREATE TABLE " + d + ".slow (s UInt8) ENGINE = Null",
		"CREATE MATERIALIZED VIEW " + d + ".mv TO " + d + ".slow AS SELECT sleepEachRow(0.1) AS s FROM " + d + ".t",
	} {
		if err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	var data strings.Builder
	for r := range 100 { // 10 s of view work
		data.WriteString(strconv.Itoa(r) + "\n")
	}
	cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	st := Statement{Query: "INSERT INTO " + d + ".t FORMAT TSV", Settings: map[string]string{"function_sleep_max_microseconds_per_block": "0"}}
	_, err := db.InsertStatement(cctx, st, strings.NewReader(data.String()))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want deadline exceeded", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("cancelled insert took %v", el)
	}
	if out, err := db.Query(ctx, "SELECT 1", "TSV"); err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Errorf("after the cancel: %q, %v", out, err)
	}
}

// TestDataDirPrivate: the data directory is its owner's only (it was 0755
// with 0644 files: any local user could read every flow).
func TestDataDirPrivate(t *testing.T) {
	testDB(t)
	fi, err := os.Stat(filepath.Join(shared.dir, "data"))
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		t.Errorf("data dir mode %#o, want no group or other access", perm)
	}
	loose := filepath.Join(t.TempDir(), "loose")
	if err := os.Mkdir(loose, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(loose, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := privateDir(loose); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(loose); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("existing 0755 dir: %v %v, want 0700", fi.Mode().Perm(), err)
	}
}

// TestThrowawayEngineLeavesNothing: an engine without a data directory
// used to take --path=:memory: for a directory of that name in the working
// directory, which tests then left (and committed) in the source tree.
func TestThrowawayEngineLeavesNothing(t *testing.T) {
	testDB(t)
	if testing.Short() {
		t.Skip("starts a second engine process")
	}
	wd := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Dir = wd
	lib, err := FindLibrary("")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Env = append(os.Environ(), envThrowawayChild+"=1", EnvLibPath+"="+lib)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	entries, err := os.ReadDir(wd)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		t.Errorf("the throwaway engine left %s in its working directory", e.Name())
	}
	_, path, ok := strings.Cut(string(out), "path: ")
	if !ok {
		t.Fatalf("child did not say its path:\n%s", out)
	}
	path = strings.TrimSpace(strings.SplitN(path, "\n", 2)[0])
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("the throwaway engine's directory %s is still there after Close: %v", path, err)
	}
}

// TestEngineConfined: the engine refuses, whoever asks, what reaches
// outside its data directory: files through table functions and table
// engines, the network, backups. Before the grants every one of these ran
// (the embedded engine's user had every grant), so any statement that got
// past a guard upstream could read or write any file the process may.
func TestEngineConfined(t *testing.T) {
	db := testDB(t)
	ctx := context.Background()
	d := newDatabase(t, db)
	dir := t.TempDir()
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("not for the engine\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	written := filepath.Join(dir, "written")
	if err := db.Exec(ctx, "CREATE TABLE "+d+".t (a String) ENGINE = MergeTree ORDER BY a"); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"SELECT * FROM file('" + secret + "', 'RawBLOB')",
		"INSERT INTO FUNCTION file('" + written + "', 'RawBLOB') SELECT 'x'",
		"SELECT * FROM url('http://127.0.0.1:1/', 'RawBLOB')",
		"SELECT * FROM url('http://[::1]:1/', 'RawBLOB')",
		"SELECT * FROM s3('http://198.18.0.1:1/bucket/key', 'RawBLOB')",
		"SELECT * FROM remote('127.0.0.1:1', system.one)",
		"SELECT * FROM mysql('127.0.0.1:1', 'a', 'b', 'c', 'd')",
		"SELECT * FROM postgresql('[fd00:10::1]:1', 'a', 'b', 'c', 'd')",
		"SELECT * FROM executable('id', 'TSV', 'a String')",
		"CREATE TABLE " + d + ".f (a String) ENGINE = File(RawBLOB, '" + written + "')",
		"CREATE TABLE " + d + ".u (a String) ENGINE = URL('http://127.0.0.1:1/', RawBLOB)",
		"BACKUP TABLE " + d + ".t TO File('" + written + "')",
	} {
		t.Run(q, func(t *testing.T) {
			out, err := db.Query(ctx, q, "TSV")
			if err == nil {
				t.Fatalf("ran: %q", out)
			}
			var ce *Error
			if !errors.As(err, &ce) || (ce.Code != 497 && ce.Code != 1) {
				t.Errorf("%v, want ACCESS_DENIED (497), or for executable() no script in the empty scripts directory", err)
			}
		})
	}
	if _, err := os.Stat(written); err == nil {
		t.Errorf("%s was written", written)
	}
	// What the product does still runs.
	for _, q := range []string{
		"INSERT INTO " + d + ".t VALUES ('a')",
		"CREATE MATERIALIZED VIEW " + d + ".mv ENGINE = SummingMergeTree ORDER BY a AS SELECT a, count() AS c FROM " + d + ".t GROUP BY a",
		"ALTER TABLE " + d + ".t ADD PROJECTION p (SELECT a ORDER BY a)",
		"OPTIMIZE TABLE " + d + ".t FINAL",
		"SELECT * FROM numbers(2)",
		"SYSTEM FLUSH LOGS",
		"KILL QUERY WHERE query_id = 'none' ASYNC",
	} {
		if err := db.Exec(ctx, q); err != nil {
			t.Errorf("%s: %v", q, err)
		}
	}
}
