package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/collector/store/chhttp"
)

// needChDB skips a test without libchdb.so, unless DUALFLOW_REQUIRE_CHDB=1
// (make test) makes that a failure.
func needChDB(t *testing.T) {
	t.Helper()
	if _, err := chdb.FindLibrary(""); errors.Is(err, chdb.ErrLibraryNotFound) && os.Getenv("DUALFLOW_REQUIRE_CHDB") != "1" {
		t.Skip("libchdb not available (make deps)")
	}
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// chQuery posts query to the ClickHouse HTTP interface at addr as user.
func chQuery(ctx context.Context, addr, user, password, query string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/", strings.NewReader(query))
	if err != nil {
		return 0, "", err
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestStoreCommand runs `dualflow store` in-process on a temp data dir:
// /readyz turns ready once the schema is migrated, the HTTP interface
// answers the users file's users (and refuses anonymous requests), and
// SIGTERM stops it cleanly: a query in flight finishes, one running past
// --shutdown-timeout is cancelled, and the engine is closed. A second run
// on the same directory, stopped by its context, finds the schema current.
func TestStoreCommand(t *testing.T) {
	needChDB(t)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	httpAddr, metAddr := freeAddr(t), freeAddr(t)
	args := []string{"--clickhouse.data-dir", dataDir, "--clickhouse.http-addr", httpAddr, "--metrics-addr", metAddr, "--shutdown-timeout", "3s"}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- runStore(ctx, args) }()
	waitReady(t, metAddr, done)

	users, err := chhttp.LoadUsers(filepath.Join(dataDir, "http-users.json"))
	if err != nil {
		t.Fatal(err)
	}
	admin, _ := chhttp.Find(users, chhttp.AdminUser)
	reader, _ := chhttp.Find(users, chhttp.ReaderUser)
	qctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, tc := range []struct {
		name, user, password, query string
		status                      int
		body                        string
	}{
		{"admin", admin.Name, admin.Password, "SELECT 1", http.StatusOK, "1\n"},
		{"reader", reader.Name, reader.Password, "SELECT 1", http.StatusOK, "1\n"},
		{"schema migrated", admin.Name, admin.Password, "EXISTS TABLE dualflow.flows", http.StatusOK, "1\n"},
		{"IPv6 text", reader.Name, reader.Password, "SELECT IPv6NumToString(toIPv6('fd00:10::1'))", http.StatusOK, "fd00:10::1\n"},
		{"anonymous", "", "", "SELECT 1", http.StatusUnauthorized, ""},
		{"wrong password", admin.Name, "nope", "SELECT 1", http.StatusForbidden, ""}, // as ClickHouse: 516 AUTHENTICATION_FAILED
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, body, err := chQuery(qctx, httpAddr, tc.user, tc.password, tc.query)
			if err != nil {
				t.Fatal(err)
			}
			if status != tc.status || (tc.body != "" && body != tc.body) {
				t.Errorf("%s: status %d body %q, want %d %q", tc.query, status, body, tc.status, tc.body)
			}
		})
	}

	// Two queries in flight at SIGTERM: one (1 s) finishes within the
	// 3 s bound, the other (30 s) is cancelled at it.
	sleep := func(seconds string) string {
		return "SELECT max(sleepEachRow(1)) FROM numbers(" + seconds + ") SETTINGS max_block_size = 1, function_sleep_max_microseconds_per_block = 0"
	}
	type result struct {
		status int
		body   string
		err    error
	}
	short, long := make(chan result, 1), make(chan result, 1)
	for _, q := range []struct {
		query string
		out   chan result
	}{{sleep("1"), short}, {sleep("30"), long}} {
		go func() {
			s, b, err := chQuery(qctx, httpAddr, admin.Name, admin.Password, q.query)
			q.out <- result{s, b, err}
		}()
	}
	time.Sleep(300 * time.Millisecond) // both are running
	stopped := time.Now()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("store after SIGTERM: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("store did not stop within 30 s of SIGTERM")
	}
	took := time.Since(stopped)
	t.Logf("stopped %v after SIGTERM", took.Round(time.Millisecond))
	if took > 15*time.Second {
		t.Errorf("shutdown took %v with --shutdown-timeout 3s", took)
	}
	if r := <-short; r.err != nil || r.status != http.StatusOK || r.body != "0\n" {
		t.Errorf("query in flight at SIGTERM: %+v, want it finished with 200", r)
	}
	if r := <-long; r.err == nil && r.status == http.StatusOK {
		t.Errorf("query running past the shutdown timeout finished: %+v, want it cancelled", r)
	}
	if _, _, err := chQuery(qctx, httpAddr, admin.Name, admin.Password, "SELECT 1"); err == nil {
		t.Error("HTTP interface still answers after the store stopped")
	}

	// Restart on the same directory (the engine released it), stopped by
	// its context.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	go func() { done <- runStore(ctx2, args) }()
	waitReady(t, metAddr, done)
	if status, body, err := chQuery(qctx, httpAddr, admin.Name, admin.Password, "SELECT count() > 0 FROM dualflow.schema_migrations"); err != nil || status != http.StatusOK || body != "1\n" {
		t.Errorf("after restart: %d %q %v", status, body, err)
	}
	cancel2()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("store after cancel: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("store did not stop within 30 s of its context's cancel")
	}
}

// waitReady polls /readyz at metAddr until it answers 200, failing if the
// store stops first.
func waitReady(t *testing.T, metAddr string, done <-chan error) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		select {
		case err := <-done:
			t.Fatalf("store stopped before ready: %v", err)
		default:
		}
		resp, err := http.Get("http://" + metAddr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("store not ready within 2 minutes")
}

// TestStoreCommandFlags: what the store refuses before opening anything.
func TestStoreCommandFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"server dsn", []string{"--clickhouse.dsn", "http://127.0.0.1:8123/"}, "--clickhouse.dsn"},
		{"no http", []string{"--clickhouse.http-addr", ""}, "--clickhouse.http-addr"},
		{"non-loopback IPv4", []string{"--clickhouse.http-addr", "198.18.0.1:8123"}, "loopback"},
		{"non-loopback IPv6", []string{"--clickhouse.http-addr", "[fd00:10::1]:8123"}, "loopback"},
		{"arguments", []string{"extra"}, "unexpected arguments"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := runStore(context.Background(), append(tc.args, "--clickhouse.data-dir", t.TempDir()))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}
