package chhttp

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/collector/store/chdb"
)

var securityUsers = []User{
	{Name: "admin", Password: "a-secret"},
	{Name: "reader", Password: "r-secret", ReadOnly: true},
	{Name: "inserter", Password: "i-secret", InsertOnly: true},
}

func as(name string) map[string]string {
	for _, u := range securityUsers {
		if u.Name == name {
			return map[string]string{"X-ClickHouse-User": u.Name, "X-ClickHouse-Key": u.Password}
		}
	}
	panic(name)
}

// TestNoSQLWritesAFile: no user, by any method, writes a file through the
// interface: not the reader by INSERT INTO FUNCTION file() (its INSERTs
// went to the insert path before any check, and readonly=2 does not stop
// the file table function), not anyone by INTO OUTFILE behind DESCRIBE,
// SHOW, EXISTS or EXPLAIN (only SELECT's was checked), not the admin by
// INTO OUTFILE, which a ClickHouse server's HTTP interface refuses too.
func TestNoSQLWritesAFile(t *testing.T) {
	ts, _ := testServer(t, Config{Users: securityUsers})
	dir := t.TempDir()
	target := filepath.Join(dir, "x")
	d := newDatabase(t)
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("CREATE TABLE "+d+".t (a String) ENGINE = Memory"), as("admin")); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	outfiles := []string{
		"SELECT 'pwned' INTO OUTFILE '" + target + "' FORMAT RawBLOB",
		"DESCRIBE (SELECT 1 AS `* * * * * root touch /tmp/x`) INTO OUTFILE '" + target + "' FORMAT TSVRaw",
		"SHOW TABLES INTO OUTFILE '" + target + "' APPEND",
		"EXISTS TABLE " + d + ".t INTO OUTFILE '" + target + "' TRUNCATE",
		"EXPLAIN SELECT 1 INTO OUTFILE '" + target + "'",
	}
	for _, user := range []string{"reader", "admin", "inserter"} {
		for _, sql := range outfiles {
			for _, method := range []string{"POST", "GET"} {
				u, body := ts.URL+"/", sql
				if method == "GET" {
					u, body = q(ts.URL, sql), ""
				}
				if r := do(t, method, u, strings.NewReader(body), as(user)); r.status == 200 {
					t.Errorf("%s %s %q: allowed", user, method, sql)
				}
			}
		}
	}
	inserts := []struct{ u, body string }{
		{ts.URL + "/?query=" + url.QueryEscape("INSERT INTO FUNCTION file('"+target+"', 'RawBLOB') FORMAT RawBLOB"), "* * * * * root touch /tmp/x\n"},
		{ts.URL + "/?readonly=0&query=" + url.QueryEscape("INSERT INTO FUNCTION file('"+target+"', 'RawBLOB') FORMAT RawBLOB"), "x"},
		{ts.URL + "/", "INSERT INTO FUNCTION file('" + target + "', 'RawBLOB') VALUES ('x')"},
		{ts.URL + "/", "INSERT INTO " + d + ".t VALUES ('x')"},
	}
	for _, in := range inserts {
		r := do(t, "POST", in.u, strings.NewReader(in.body), as("reader"))
		if r.status == 200 || r.header.Get("X-ClickHouse-Exception-Code") != "164" {
			t.Errorf("reader insert %s: %d %s, want READONLY", in.u, r.status, r.body)
		}
		r = do(t, "POST", in.u, strings.NewReader(in.body), as("inserter"))
		if strings.Contains(in.u+in.body, "FUNCTION") && (r.status != 403 || r.header.Get("X-ClickHouse-Exception-Code") != "497") {
			t.Errorf("inserter insert into a function %s: %d %s, want ACCESS_DENIED", in.u, r.status, r.body)
		}
	}
	if _, err := os.Stat(target); err == nil {
		t.Errorf("%s was written", target)
	}
	// The admin still runs one statement of any other kind; never two.
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("ALTER TABLE "+d+".t DELETE WHERE 0"), as("admin")); r.status != 200 {
		t.Errorf("admin ALTER: %d %s", r.status, r.body)
	}
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("SELECT 1; DROP TABLE "+d+".t"), as("admin")); r.status == 200 {
		t.Errorf("admin two statements: allowed")
	}
}

// TestInserter: the collectors' user of `dualflow store` inserts into
// tables and reads; it creates and drops nothing.
func TestInserter(t *testing.T) {
	ts, _ := testServer(t, Config{Users: securityUsers})
	d := newDatabase(t)
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("CREATE TABLE "+d+".t (ip IPv6) ENGINE = Memory"), as("admin")); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	ins := ts.URL + "/?query=" + url.QueryEscape("INSERT INTO "+d+".t FORMAT TSV")
	if r := do(t, "POST", ins, strings.NewReader("fd00:10::1\n::ffff:198.18.0.1\n"), as("inserter")); r.status != 200 {
		t.Fatalf("inserter insert: %d %s", r.status, r.body)
	}
	if r := do(t, "GET", q(ts.URL, "SELECT count() FROM "+d+".t"), nil, as("inserter")); r.status != 200 || r.body != "2\n" {
		t.Errorf("inserter select: %d %q", r.status, r.body)
	}
	for _, sql := range []string{"DROP TABLE " + d + ".t", "CREATE TABLE " + d + ".u (a UInt8) ENGINE = Memory", "TRUNCATE TABLE " + d + ".t", "KILL QUERY WHERE 1"} {
		if r := do(t, "POST", ts.URL+"/?readonly=0", strings.NewReader(sql), as("inserter")); r.status == 200 {
			t.Errorf("inserter %q: allowed", sql)
		}
	}
}

// TestReaderCannotLiftLimits: a read-only user's statements run under the
// server's limits, which URL settings may lower and nothing may lift (a
// reader set max_execution_time=0 and max_memory_usage=0 and ran
// unbounded).
func TestReaderCannotLiftLimits(t *testing.T) {
	lim := ReaderLimits{MaxExecutionTime: 30 * time.Second, MaxMemoryBytes: 1 << 29, MaxThreads: 2, MaxResultBytes: 1 << 20}
	ts, _ := testServer(t, Config{Users: securityUsers, ReaderLimits: lim})
	get := func(query string, params ...string) reply {
		return do(t, "GET", q(ts.URL, query, params...), nil, as("reader"))
	}
	settings := "SELECT getSetting('max_execution_time'), getSetting('max_memory_usage'), getSetting('max_threads'), getSetting('readonly')"
	if r := get(settings); r.status != 200 || r.body != "30\t536870912\t2\t1\n" {
		t.Errorf("reader's settings: %d %q", r.status, r.body)
	}
	if r := get(settings, "max_execution_time", "5", "max_threads", "1"); r.status != 200 || r.body != "5\t536870912\t1\t1\n" {
		t.Errorf("reader's lowered settings: %d %q", r.status, r.body)
	}
	for _, p := range [][2]string{
		{"max_execution_time", "0"}, {"max_execution_time", "3600"}, {"max_memory_usage", "0"}, {"max_memory_usage", "1000000000000"},
		{"max_threads", "64"}, {"max_result_bytes", "0"}, {"readonly", "0"}, {"output_format_schema", "/tmp/x"},
		{"input_format_record_errors_file_path", "/tmp/x"}, {"allow_ddl", "1"}, {"max_rows_to_read", "-1"},
	} {
		if r := get("SELECT getSetting('readonly')", p[0], p[1]); r.status == 200 && r.body != "1\n" || (p[0] != "readonly" && r.status == 200) {
			t.Errorf("reader %s=%s: %d %q", p[0], p[1], r.status, r.body)
		}
	}
	for _, sql := range []string{"SELECT 1 SETTINGS max_execution_time = 0", "SELECT * FROM (SELECT 1 SETTINGS max_memory_usage = 0)"} {
		if r := get(sql); r.status == 200 {
			t.Errorf("reader %q: allowed", sql)
		}
	}
	// The limits hold: an answer past max_result_bytes fails.
	if r := get("SELECT repeat(toString(number), 200) FROM numbers(10000)"); r.status == 200 {
		t.Errorf("an answer of about 10 MB under max_result_bytes 1 MiB: %d", r.status)
	}
	// The admin is not a reader: its settings are its own.
	if r := do(t, "GET", q(ts.URL, "SELECT getSetting('max_execution_time')", "max_execution_time", "0"), nil, as("admin")); r.status != 200 || r.body != "0\n" {
		t.Errorf("admin's max_execution_time=0: %d %q", r.status, r.body)
	}
}

// TestSystemProcessesHidden: no user of the interface reads other users'
// query text (system.processes showed it, the collector's included).
func TestSystemProcessesHidden(t *testing.T) {
	ts, _ := testServer(t, Config{Users: securityUsers})
	for _, user := range []string{"reader", "admin", "inserter"} {
		for _, sql := range []string{"SELECT query FROM system.processes", "SHOW PROCESSLIST", "SELECT query FROM system.query_log"} {
			if r := do(t, "GET", q(ts.URL, sql), nil, as(user)); r.status == 200 {
				t.Errorf("%s GET %q: allowed: %s", user, sql, r.body)
			}
		}
		if r := do(t, "GET", q(ts.URL, "SELECT query FROM processes", "database", "system"), nil, as(user)); r.status == 200 {
			t.Errorf("%s: processes in database system allowed", user)
		}
	}
}

// slowInsert starts an INSERT whose data trickles: 1.1 MB at once, then
// two bytes every second, until the server answers; it returns the
// answer's status line.
func slowInsert(t *testing.T, ts string, who map[string]string, table string) <-chan string {
	t.Helper()
	host := strings.TrimPrefix(ts, "http://")
	c, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	path := "/?query=" + url.QueryEscape("INSERT INTO "+table+" FORMAT TSV")
	// As the attack: more than the query text's bound at once (so the
	// request reaches the engine), then a byte now and then.
	first := strings.Repeat("1\n", (DefaultMaxQuerySize+100_000)/2)
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nX-ClickHouse-User: %s\r\nX-ClickHouse-Key: %s\r\nContent-Length: %d\r\n\r\n%s",
		path, host, who["X-ClickHouse-User"], who["X-ClickHouse-Key"], len(first)+100_000, first)
	done := make(chan string, 1)
	stop := make(chan struct{})
	go func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte("2\n")); err != nil {
					return
				}
			}
		}
	}()
	go func() {
		defer close(stop)
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Minute))
		b := make([]byte, 512)
		n, _ := c.Read(b)
		line, _, _ := strings.Cut(string(b[:n]), "\r\n")
		done <- line
	}()
	return done
}

// TestSlowClientsCannotStallInserts: slow INSERTs (4 of them, 1.1 MB at
// once then a byte every 15 s) took every engine slot and held them as
// long as they kept sending, so the collectors' inserts waited. Now every
// request but the inserter's INSERTs shares EngineSlots-1 slots, and data
// below MinDataRate is cut after DataRateGrace.
func TestSlowClientsCannotStallInserts(t *testing.T) {
	old := DataRateGrace
	DataRateGrace = 2 * time.Second
	t.Cleanup(func() { DataRateGrace = old })
	reg := prometheus.NewRegistry()
	ts, _ := testServer(t, Config{Users: securityUsers, EngineSlots: 4, MinDataRate: 1 << 20, Registerer: reg})
	d := newDatabase(t)
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("CREATE TABLE "+d+".t (a UInt32) ENGINE = MergeTree ORDER BY a"), as("admin")); r.status != 200 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var slow []<-chan string
	for range 3 {
		slow = append(slow, slowInsert(t, ts.URL, as("admin"), d+".t"))
	}
	waitFor(t, "three slow inserts in flight", func() bool {
		return gaugeValue(t, reg, "dualflow_chhttp_in_flight_requests") == 3
	})
	start := time.Now()
	if r := do(t, "POST", ts.URL+"/?query="+url.QueryEscape("INSERT INTO "+d+".t FORMAT TSV"), strings.NewReader("7\n"), as("inserter")); r.status != 200 {
		t.Errorf("inserter while three INSERTs trickle: %d %s", r.status, r.body)
	}
	t.Logf("the inserter's INSERT took %s while three slow INSERTs held the other slots", time.Since(start))
	// The trickling inserts are cut: 1 MiB/s after the grace is far above
	// two bytes a second.
	for i, c := range slow {
		select {
		case line := <-c:
			if !strings.Contains(line, " 408 ") {
				t.Errorf("slow insert %d answered %q, want 408", i, line)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("slow insert %d still held after 2 minutes", i)
		}
	}
	if got := counterValue(t, reg, "dualflow_chhttp_refused_total", map[string]string{"reason": "slow"}); got != 3 {
		t.Errorf("refused_total{slow} = %v, want 3", got)
	}
}

// TestEngineSlotsPerUser: a reader holds at most EngineSlots-2 engine
// slots, all users but the inserter's INSERTs EngineSlots-1; past them a
// request waits queueWait, then gets 503.
func TestEngineSlotsPerUser(t *testing.T) {
	oldWait := queueWait
	queueWait = 200 * time.Millisecond
	t.Cleanup(func() { queueWait = oldWait })
	release := make(chan struct{})
	running := make(chan struct{}, 16)
	eng := &fakeEngine{
		run: func(ctx context.Context, st chdb.Statement) (*chdb.Result, error) {
			if strings.HasPrefix(st.Query, "SELECT sleep") {
				running <- struct{}{}
				<-release
			}
			if strings.HasPrefix(st.Query, "EXPLAIN AST") {
				return &chdb.Result{Data: []byte("SelectWithUnionQuery (children 1)\n ExpressionList (children 1)\n  SelectQuery (children 1)\n   ExpressionList (children 1)\n    Function sleep (children 1)\n")}, nil
			}
			return &chdb.Result{Data: []byte("1\n")}, nil
		},
		insert: func(ctx context.Context, st chdb.Statement, data io.Reader) (chdb.Stats, error) {
			_, err := io.Copy(io.Discard, data)
			return chdb.Stats{RowsWritten: 1}, err
		},
	}
	reg := prometheus.NewRegistry()
	ts, _ := testServer(t, Config{Engine: eng, Users: securityUsers, EngineSlots: 4, Registerer: reg})
	var wg sync.WaitGroup
	hold := func(user string) {
		wg.Go(func() { do(t, "POST", ts.URL+"/", strings.NewReader("SELECT sleep(1)"), as(user)) })
		<-running
	}
	hold("reader")
	hold("reader")
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("SELECT sleep(1)"), as("reader")); r.status != 503 {
		t.Errorf("the reader's third statement: %d %s, want 503", r.status, r.body)
	}
	hold("admin")
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("SELECT sleep(1)"), as("admin")); r.status != 503 {
		t.Errorf("a fourth statement on a 4-slot engine: %d %s, want 503", r.status, r.body)
	}
	if r := do(t, "POST", ts.URL+"/?query="+url.QueryEscape("INSERT INTO t FORMAT TSV"), strings.NewReader("1\n"), as("inserter")); r.status != 200 {
		t.Errorf("the inserter's INSERT with every other slot taken: %d %s", r.status, r.body)
	}
	close(release)
	wg.Wait()
	if got := counterValue(t, reg, "dualflow_chhttp_refused_total", map[string]string{"reason": "user_engine"}); got != 1 {
		t.Errorf("refused_total{user_engine} = %v, want 1", got)
	}
}

// TestSlowBodiesPerUser: one user sending many query texts slowly takes
// at most ReadersPerUser reading places (128 slow bodies made every client
// get 503 for 30 s, the collectors' inserts included).
func TestSlowBodiesPerUser(t *testing.T) {
	reg := prometheus.NewRegistry()
	ts, _ := testServer(t, Config{Users: securityUsers, MaxConcurrent: 8, ReadersPerUser: 4, BodyTimeout: 3 * time.Second, Registerer: reg})
	host := strings.TrimPrefix(ts.URL, "http://")
	var mu sync.Mutex
	answers := map[string]int{}
	var wg sync.WaitGroup
	for range 4 * 8 { // every reading place of the server, from one user
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nX-ClickHouse-User: reader\r\nX-ClickHouse-Key: r-secret\r\nContent-Length: 1000\r\n\r\nSELECT ", host)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
			b := make([]byte, 256)
			n, _ := c.Read(b)
			line, _, _ := strings.Cut(string(b[:n]), "\r\n")
			mu.Lock()
			answers[line]++
			mu.Unlock()
		}()
	}
	// The other users are served while the reader's bodies dawdle.
	for _, user := range []string{"admin", "inserter"} {
		if r := do(t, "GET", q(ts.URL, "SELECT 1"), nil, as(user)); r.status != 200 {
			t.Errorf("%s while the reader's bodies dawdle: %d %s", user, r.status, r.body)
		}
	}
	wg.Wait()
	// The refused ones are answered 503 at once; the client may see a
	// reset instead (its unsent body is unread when the server closes).
	if got := counterValue(t, reg, "dualflow_chhttp_refused_total", map[string]string{"reason": "user_readers"}); got != 4*8-4 {
		t.Errorf("refused_total{user_readers} = %v, want %d (answers %v)", got, 4*8-4, answers)
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				return m.GetGauge().GetValue()
			}
		}
	}
	return 0
}

// TestInserterAddedToOldUsersFile: a users file written before the
// inserter existed gets it, keeping the others' passwords.
func TestInserterAddedToOldUsersFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "http-users.json")
	old := UsersFile{Users: []User{{Name: AdminUser, Password: "a"}, {Name: ReaderUser, Password: "r", ReadOnly: true}}}
	b, _ := json.Marshal(old)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	users, added, err := LoadOrCreateUsers(path)
	if err != nil || !added {
		t.Fatalf("load: %v %v", added, err)
	}
	in, ok := Find(users, InserterUser)
	if a, _ := Find(users, AdminUser); !ok || !in.InsertOnly || len(in.Password) < 24 || a.Password != "a" {
		t.Fatalf("users: %+v", users)
	}
	again, err := LoadUsers(path)
	if err != nil || fmt.Sprint(again) != fmt.Sprint(users) {
		t.Fatalf("the file does not hold the inserter: %+v %v", again, err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode after the rewrite: %v %v", fi.Mode().Perm(), err)
	}
}

var _ = io.Discard
var _ = http.StatusOK
var _ = context.Background
var _ chdb.Stats

// TestRefusalsLoggedAsTheUser: a reader's INSERT refused as READONLY was
// logged at ERROR, as the engine's user "default": a refusal is the
// client's business, logged at debug with the user who asked.
func TestRefusalsLoggedAsTheUser(t *testing.T) {
	var buf strings.Builder
	var mu sync.Mutex
	log := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ts, _ := testServer(t, Config{Users: securityUsers, Logger: log})
	d := newDatabase(t)
	if r := do(t, "POST", ts.URL+"/?query="+url.QueryEscape("INSERT INTO "+d+".t FORMAT TSV"), strings.NewReader("1\n"), as("reader")); r.status == 200 {
		t.Fatal("reader insert allowed")
	}
	if r := do(t, "GET", q(ts.URL, "SELECT * FROM file('/x')"), nil, as("reader")); r.status == 200 {
		t.Fatal("reader file() allowed")
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if strings.Contains(out, "level=ERROR") {
		t.Errorf("a refusal logged at ERROR:\n%s", out)
	}
	if !strings.Contains(out, "user=reader") || strings.Contains(out, "user=default") {
		t.Errorf("the refusals' log does not name the reader:\n%s", out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
