package main

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dualflow/dualflow/collector/store/chhttp"
)

// squatter listens where a collector's interface would, as a local user
// who took the port while the collector was down, and counts the requests
// that carried credentials.
func squatter(t *testing.T, addr string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var creds atomic.Int32
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, _, ok := r.BasicAuth(); ok || r.Header.Get("X-ClickHouse-Key") != "" {
			creds.Add(1)
		}
		w.Write([]byte("1\n"))
	}))
	ts.Listener.Close()
	ts.Listener = ln
	ts.Start()
	t.Cleanup(ts.Close)
	return ts, &creds
}

// usersFile writes a users file into dataDir, as a collector does at its
// first start.
func usersFile(t *testing.T, dataDir string) {
	t.Helper()
	if _, _, err := chhttp.LoadOrCreateUsers(filepath.Join(dataDir, "http-users.json")); err != nil {
		t.Fatal(err)
	}
}

// TestSQLCredentialsOnlyToTheStore: `dualflow sql` sent the admin password
// from the users file to whatever answered on --url, in clear, to any
// host; a local user who bound the port while the collector was down
// captured it. Now the users file's passwords go only to the collector
// that holds the data directory, on loopback.
func TestSQLCredentialsOnlyToTheStore(t *testing.T) {
	for _, host := range []string{"127.0.0.1", "[::1]"} {
		t.Run(host, func(t *testing.T) {
			dataDir := filepath.Join(t.TempDir(), "data")
			usersFile(t, dataDir)
			ts, creds := squatter(t, host+":0")
			for _, write := range []bool{false, true} {
				args := []string{"--clickhouse.data-dir", dataDir, "--url", ts.URL + "/"}
				if write {
					args = append(args, "--write")
				}
				err := runSQL(context.Background(), append(args, "SELECT 1"))
				if err == nil || !strings.Contains(err.Error(), "not sending the password") {
					t.Errorf("write=%v: %v, want a refusal to send the password", write, err)
				}
			}
			if n := creds.Load(); n != 0 {
				t.Errorf("the squatter received credentials %d times", n)
			}
		})
	}
	// Beyond loopback, never the users file's; and no password in clear.
	dataDir := filepath.Join(t.TempDir(), "data")
	usersFile(t, dataDir)
	err := runSQL(context.Background(), []string{"--clickhouse.data-dir", dataDir, "--url", "http://198.18.0.1:8123/", "SELECT 1"})
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Errorf("users file to 198.18.0.1: %v", err)
	}
	pw := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(pw, []byte("secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err = runSQL(context.Background(), []string{"--clickhouse.user", "u", "--clickhouse.password-file", pw, "--url", "http://[fd00:10::1]:8123/", "SELECT 1"})
	if err == nil || !strings.Contains(err.Error(), "in clear") {
		t.Errorf("password in clear to fd00:10::1: %v", err)
	}
}

// TestSQLReadsUnlessWrite: against the store that holds the data
// directory, `dualflow sql` runs as the reader with the REST API's check
// (DROP TABLE dualflow.flows exited 0 and printed nothing: the CLI logged
// in as the admin), and as the admin with --write.
func TestSQLReadsUnlessWrite(t *testing.T) {
	needChDB(t)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, "data")
	httpAddr, metAddr := freeAddr(t), freeAddr(t)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runStore(ctx, []string{"--clickhouse.data-dir", dataDir, "--clickhouse.http-addr", httpAddr, "--metrics-addr", metAddr})
	}()
	t.Cleanup(func() { stop(); <-done })
	waitReady(t, metAddr, done)
	sql := func(args ...string) error {
		return runSQL(context.Background(), append([]string{"--clickhouse.data-dir", dataDir, "--url", "http://" + httpAddr + "/", "--format", "TSV"}, args...))
	}
	if err := sql("SELECT count() FROM dualflow.flows"); err != nil {
		t.Errorf("a read: %v", err)
	}
	for _, q := range []string{"DROP TABLE dualflow.flows", "SELECT 1; DROP TABLE dualflow.flows", "SELECT query FROM system.processes"} {
		if err := sql(q); err == nil {
			t.Errorf("%q ran without --write", q)
		}
	}
	if err := sql("--write", "CREATE TABLE dualflow.sql_test (a UInt8) ENGINE = Memory"); err != nil {
		t.Errorf("--write: %v", err)
	}
	if err := sql("--write", "SELECT 1; DROP TABLE dualflow.flows"); err == nil {
		t.Errorf("--write ran two statements")
	}
	if err := sql("EXISTS TABLE dualflow.flows"); err != nil {
		t.Errorf("flows after the attempts: %v", err)
	}
	_ = json.Marshal
}
