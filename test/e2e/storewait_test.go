package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/test/kubeapi"
)

// TestCollectorWaitsForStore starts a collector before its store (as a
// Deployment whose ClickHouse starts at the same time does): the collector
// logs that ClickHouse is not reachable yet and retries instead of
// exiting; once `dualflow store` listens on the DSN's address, the
// collector applies the schema and serves. The DSN's host is loopback of
// each mode's family.
func TestCollectorWaitsForStore(t *testing.T) {
	requireCHDB(t)
	t.Parallel() // each mode its own store and collector processes and directories
	bin := buildBinary(t)
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			record(t, mode)
			host, bracketed := "::1", "[::1]"
			if mode == manifest.ModeIPv4 {
				host, bracketed = "127.0.0.1", "127.0.0.1"
			}
			addr := net.JoinHostPort(host, fmt.Sprint(freePort(t, bracketed)))
			st := newStoreProcess(t, bin, addr)
			dir := t.TempDir()
			cmd := exec.Command(bin, "collector",
				"--clickhouse.dsn", "http://"+addr+"/", "--clickhouse.user", chhttp.InserterUser, "--clickhouse.password-file", st.passwordFile,
				"--collector.wal.dir", filepath.Join(dir, "wal"), "--clickhouse.spool-dir", filepath.Join(dir, "spool"),
				"--k8s.source", "off", "--metrics-addr", "127.0.0.1:0", "--web.addr", "",
				"--collector.ipfix.tcp-addr", net.JoinHostPort(host, "0"), "--collector.ipfix.udp-addr", "")
			logPath := filepath.Join(dir, "collector.log")
			lf, err := os.Create(logPath)
			if err != nil {
				t.Fatal(err)
			}
			pr, pw := io.Pipe()
			cmd.Stdout, cmd.Stderr = lf, io.MultiWriter(lf, pw)
			if err := kubeapi.StartTied(cmd); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { err := cmd.Wait(); pw.Close(); lf.Close(); exited <- err }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				if t.Failed() {
					b, _ := os.ReadFile(logPath)
					t.Logf("collector log:\n%s", b)
				}
			})
			waiting, serving := make(chan struct{}), make(chan string, 1)
			go func() {
				sc := bufio.NewScanner(pr)
				w := false
				for sc.Scan() {
					line := sc.Text()
					if !w && strings.Contains(line, "clickhouse not reachable yet") {
						w = true
						close(waiting)
					}
					if m := logMetrics.FindStringSubmatch(line); m != nil {
						serving <- m[1]
					}
				}
				io.Copy(io.Discard, pr)
			}()
			select {
			case <-waiting:
			case err := <-exited:
				t.Fatalf("collector exited without a store: %v", err)
			case <-time.After(2 * time.Minute):
				t.Fatal("collector did not say it waits for ClickHouse")
			}
			st.run()
			var metrics string
			select {
			case metrics = <-serving:
			case err := <-exited:
				t.Fatalf("collector exited once the store came: %v", err)
			case <-time.After(3 * time.Minute):
				t.Fatal("collector did not serve within 3 minutes of the store")
			}
			rows, err := st.query("SELECT count() FROM dualflow.schema_migrations")
			if err != nil || len(rows) != 1 || rows[0][0] == "0" {
				t.Fatalf("schema_migrations after the collector started: %v %v", rows, err)
			}
			resp, err := http.Get(metrics + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Errorf("collector /readyz = %d", resp.StatusCode)
			}
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-exited:
				if err != nil {
					t.Errorf("collector exited with %v after SIGTERM", err)
				}
			case <-time.After(90 * time.Second):
				t.Error("collector did not stop within 90 s of SIGTERM")
			}
		})
	}
}
