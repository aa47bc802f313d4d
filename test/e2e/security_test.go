package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/lab/manifest"
)

// TestSecurity is the security tier: the attacks of issue 17, run against
// the collector binary with its own defaults (no web tokens, the embedded
// engine), its real listeners and the real engine. Each must be refused,
// bounded or survived.
func TestSecurity(t *testing.T) {
	t.Parallel() // each mode its own collector process, directory and ports
	bin := buildBinary(t)
	for _, mode := range []manifest.Mode{manifest.ModeIPv4, manifest.ModeIPv6, manifest.ModeDual} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			record(t, mode)
			testSecurity(t, bin, mode)
		})
	}
}

type httpReply struct {
	status int
	body   string
}

func doHTTP(t *testing.T, method, target, host string, body string, header map[string]string) httpReply {
	t.Helper()
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := (&http.Client{Timeout: 2 * time.Minute}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return httpReply{resp.StatusCode, string(b)}
}

func testSecurity(t *testing.T, bin string, mode manifest.Mode) {
	dir := t.TempDir()
	c := startBinaryCollector(t, bin, dir, mode, 1, "--web.addr", "127.0.0.1:0", "--clickhouse.flush-interval", "200ms")
	users, err := chhttp.LoadUsers(filepath.Join(dir, "data", "http-users.json"))
	if err != nil {
		t.Fatal(err)
	}
	admin, _ := chhttp.Find(users, chhttp.AdminUser)
	reader, _ := chhttp.Find(users, chhttp.ReaderUser)
	basic := func(u chhttp.User) map[string]string {
		return map[string]string{"X-ClickHouse-User": u.Name, "X-ClickHouse-Key": u.Password}
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("root only\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(dir, "victim")
	if err := os.WriteFile(victim, []byte("keep me\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	outfile := func(p, how string) string {
		return fmt.Sprintf("SELECT 'pwned' INTO OUTFILE '%s' %s FORMAT RawBLOB", p, how)
	}
	// SQL needs the operator token even on loopback (a request without
	// one is a viewer); the attacks below are an operator's.
	tokenFile := operatorTokenFile(c.web)
	tok, err := os.ReadFile(tokenFile)
	if err != nil {
		t.Fatalf("the collector's local operator token: %v", err)
	}
	if fi, err := os.Stat(tokenFile); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("local operator token file: %v %v, want mode 0600", err, fi)
	}
	sqlAPI := func(q string) httpReply {
		b, _ := json.Marshal(map[string]string{"query": q})
		return doHTTP(t, "POST", c.web+"/api/v1/sql", "", string(b), map[string]string{"Content-Type": "application/json",
			"Authorization": "Bearer " + strings.TrimSpace(string(tok))})
	}
	t.Run("a local request without a token is a viewer", func(t *testing.T) {
		r := doHTTP(t, "POST", c.web+"/api/v1/sql", "", `{"query":"SELECT 1"}`, map[string]string{"Content-Type": "application/json"})
		if r.status != http.StatusUnauthorized || !strings.Contains(r.body, tokenFile) {
			t.Errorf("SQL without a token: %d %s, want 401 naming %s", r.status, r.body, tokenFile)
		}
		if r := doHTTP(t, "GET", c.web+"/api/v1/whoami", "", "", nil); r.status != 200 || !strings.Contains(r.body, `"viewer"`) {
			t.Errorf("whoami without a token: %d %s", r.status, r.body)
		}
	})
	created := filepath.Join(dir, "created")

	t.Run("read-only SQL writes no file", func(t *testing.T) {
		for _, how := range []string{"", "APPEND", "TRUNCATE"} {
			for _, target := range []string{created, victim} {
				if r := sqlAPI(outfile(target, how)); r.status != http.StatusBadRequest {
					t.Errorf("/api/v1/sql OUTFILE %s %s: %d %s", target, how, r.status, r.body)
				}
				for _, u := range []chhttp.User{reader, admin} {
					// The reader by POST, anyone by GET: read-only requests.
					method, target2 := "POST", c.ch+"/"
					if u == admin {
						method, target2 = "GET", c.ch+"/?query="+url.QueryEscape(outfile(target, how))
					}
					body := outfile(target, how)
					if method == "GET" {
						body = ""
					}
					if r := doHTTP(t, method, target2, "", body, basic(u)); r.status == 200 {
						t.Errorf("ClickHouse HTTP %s as %s: OUTFILE %s allowed", method, u.Name, how)
					}
				}
			}
		}
		if _, err := os.Stat(created); err == nil {
			t.Error("a file was created")
		}
		if b, _ := os.ReadFile(victim); string(b) != "keep me\n" {
			t.Errorf("victim file is now %q", b)
		}
	})

	t.Run("no SQL path writes a file", func(t *testing.T) {
		// Issue 33: INTO OUTFILE behind DESCRIBE, SHOW, EXISTS and EXPLAIN
		// (the guard looked under SELECT only), and the reader's INSERT INTO
		// FUNCTION file(), wrote files of the caller's choosing as the
		// collector's user: a cron line, an authorized_keys.
		cron := filepath.Join(dir, "cron-x")
		for _, q := range []string{
			"DESCRIBE (SELECT 1 AS `* * * * * root touch /tmp/x`) INTO OUTFILE '" + cron + "' FORMAT TSVRaw",
			"SHOW TABLES INTO OUTFILE '" + cron + "'",
			"EXISTS TABLE dualflow.flows INTO OUTFILE '" + cron + "' APPEND",
			"EXPLAIN SELECT 1 INTO OUTFILE '" + cron + "' TRUNCATE",
		} {
			if r := sqlAPI(q); r.status != http.StatusBadRequest {
				t.Errorf("/api/v1/sql %q: %d %s", q, r.status, r.body)
			}
			for _, u := range []chhttp.User{reader, admin} {
				for _, method := range []string{"POST", "GET"} {
					target, body := c.ch+"/", q
					if method == "GET" {
						target, body = c.ch+"/?query="+url.QueryEscape(q), ""
					}
					if r := doHTTP(t, method, target, "", body, basic(u)); r.status == 200 {
						t.Errorf("ClickHouse HTTP %s as %s %q: allowed", method, u.Name, q)
					}
				}
			}
		}
		insert := c.ch + "/?query=" + url.QueryEscape("INSERT INTO FUNCTION file('"+cron+"', 'RawBLOB') FORMAT RawBLOB")
		for _, u := range []chhttp.User{reader, admin} {
			if r := doHTTP(t, "POST", insert, "", "* * * * * root touch /tmp/x\n", basic(u)); r.status == 200 {
				t.Errorf("INSERT INTO FUNCTION file() as %s: allowed", u.Name)
			}
		}
		if _, err := os.Stat(cron); err == nil {
			t.Errorf("%s was written", cron)
		}
	})

	t.Run("readers see no other query and lift no limit", func(t *testing.T) {
		for _, q := range []string{"SELECT query FROM system.processes", "SHOW PROCESSLIST", "SELECT query FROM system.query_log"} {
			if r := doHTTP(t, "GET", c.ch+"/?query="+url.QueryEscape(q), "", "", basic(reader)); r.status == 200 {
				t.Errorf("reader %q: %s", q, r.body)
			}
			if r := sqlAPI(q); r.status != http.StatusBadRequest {
				t.Errorf("/api/v1/sql %q: %d %s", q, r.status, r.body)
			}
		}
		for _, p := range []string{"max_execution_time=0", "max_memory_usage=0", "readonly=0"} {
			r := doHTTP(t, "GET", c.ch+"/?"+p+"&query="+url.QueryEscape("SELECT getSetting('max_execution_time'), getSetting('readonly')"), "", "", basic(reader))
			if r.status == 200 && r.body != "60\t1\n" {
				t.Errorf("reader with %s: %s", p, r.body)
			}
		}
	})

	t.Run("read-only SQL reads no host file and kills no query", func(t *testing.T) {
		for _, q := range []string{
			"SELECT * FROM file('" + secret + "', 'RawBLOB')",
			"SELECT * FROM url('http://127.0.0.1:1/', 'RawBLOB')",
			"SELECT * FROM executable('cat " + secret + "', 'RawBLOB', 'x String')",
			"KILL QUERY WHERE 1 SYNC",
			"SELECT 1; DROP DATABASE dualflow",
		} {
			if r := sqlAPI(q); r.status != http.StatusBadRequest || strings.Contains(r.body, "root only") {
				t.Errorf("/api/v1/sql %q: %d %s", q, r.status, r.body)
			}
			if r := doHTTP(t, "POST", c.ch+"/", "", q, basic(reader)); r.status == 200 || strings.Contains(r.body, "root only") {
				t.Errorf("ClickHouse HTTP as reader %q: %d %s", q, r.status, r.body)
			}
		}
	})

	t.Run("the ClickHouse HTTP interface authenticates", func(t *testing.T) {
		if r := doHTTP(t, "POST", c.ch+"/", "", "DROP DATABASE dualflow", nil); r.status != http.StatusUnauthorized {
			t.Errorf("anonymous DROP DATABASE: %d %s", r.status, r.body)
		}
		if r := doHTTP(t, "POST", c.ch+"/", "", "SELECT 1", map[string]string{"X-ClickHouse-User": "admin", "X-ClickHouse-Key": "guess"}); r.status != http.StatusForbidden {
			t.Errorf("wrong password: %d %s", r.status, r.body)
		}
		if r := doHTTP(t, "POST", c.ch+"/", "", "SELECT count() FROM dualflow.flows", basic(admin)); r.status != 200 {
			t.Errorf("admin: %d %s", r.status, r.body)
		}
		// What a local user other than the collector's would need: the
		// users file and the data directory are the owner's only.
		for p, want := range map[string]os.FileMode{filepath.Join(dir, "data", "http-users.json"): 0o600, filepath.Join(dir, "data"): 0o700} {
			if fi, err := os.Stat(p); err != nil || fi.Mode().Perm()&0o077 != 0 {
				t.Errorf("%s: mode %v (%v), want %#o", p, fi.Mode().Perm(), err, want)
			}
		}
		if _, err := exec.LookPath("setpriv"); err == nil && os.Geteuid() == 0 {
			out, err := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat", filepath.Join(dir, "data", "http-users.json")).CombinedOutput()
			if err == nil {
				t.Errorf("uid 65534 read the users file: %s", out)
			}
		}
	})

	t.Run("DNS rebinding", func(t *testing.T) {
		_, webPort, _ := net.SplitHostPort(strings.TrimPrefix(c.web, "http://"))
		_, chPort, _ := net.SplitHostPort(strings.TrimPrefix(c.ch, "http://"))
		if r := doHTTP(t, "POST", c.web+"/api/v1/sql", "rebind.attacker.example:"+webPort, `{"query":"SELECT 1"}`,
			map[string]string{"Content-Type": "application/json", "Origin": "http://rebind.attacker.example:" + webPort}); r.status != http.StatusForbidden {
			t.Errorf("web with a rebound Host: %d %s", r.status, r.body)
		}
		if r := doHTTP(t, "POST", c.ch+"/", "rebind.attacker.example:"+chPort, "SELECT 1", basic(admin)); r.status != http.StatusForbidden {
			t.Errorf("ClickHouse HTTP with a rebound Host: %d %s", r.status, r.body)
		}
		if r := doHTTP(t, "GET", c.web+"/api/v1/whoami", "localhost:"+webPort, "", nil); r.status != 200 {
			t.Errorf("web by localhost: %d %s", r.status, r.body)
		}
	})

	t.Run("slow senders do not lock the ClickHouse HTTP interface", func(t *testing.T) {
		host := strings.TrimPrefix(c.ch, "http://")
		var slow []net.Conn
		defer func() {
			for _, s := range slow {
				s.Close()
			}
		}()
		for range 40 { // more than its 32 slots
			s, err := net.Dial("tcp", host)
			if err != nil {
				t.Fatal(err)
			}
			slow = append(slow, s)
			fmt.Fprintf(s, "POST / HTTP/1.1\r\nHost: %s\r\nX-ClickHouse-User: admin\r\nX-ClickHouse-Key: %s\r\nContent-Length: 100000\r\n\r\nSELECT ", host, admin.Password)
		}
		if r := doHTTP(t, "POST", c.ch+"/", "", "SELECT 42", basic(reader)); r.status != 200 || strings.TrimSpace(r.body) != "42" {
			t.Errorf("a client among 40 slow senders: %d %s", r.status, r.body)
		}
	})

	t.Run("idle IPFIX sockets do not lock exporters out", func(t *testing.T) {
		// One attacker address opens 200 idle sockets; the per-source cap
		// keeps 16 of them. On IPv6 loopback the attacker and the exporter
		// share ::1, so there only the cap is checked; in dual-stack the
		// attacker uses IPv4 and the exporter sends over IPv6.
		attacker, target := "127.0.0.2", c.ipfixAll[0]
		if mode == manifest.ModeIPv6 {
			attacker = "::1"
		}
		var idle []net.Conn
		defer func() {
			for _, s := range idle {
				s.Close()
			}
		}()
		before := c.metricWith(t, "dualflow_ipfix_sessions_closed_total", `reason="source_limit"`)
		for range 200 {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(attacker)}, Timeout: 10 * time.Second}
			s, err := d.Dial("tcp", target)
			if err != nil {
				t.Fatalf("attacker dial: %v", err)
			}
			idle = append(idle, s)
		}
		waitFor(t, "184 attacker sockets refused", 2*time.Minute, func() bool {
			return c.metricWith(t, "dualflow_ipfix_sessions_closed_total", `reason="source_limit"`)-before >= 184
		})
		if n := c.metricWith(t, "dualflow_ipfix_sessions_closed_total", `reason="source_limit"`) - before; n != 184 {
			t.Errorf("%v sockets refused, want 184 (16 kept)", n)
		}
		if mode == manifest.ModeIPv6 {
			return
		}
		exporter := c.ipfixAll[len(c.ipfixAll)-1]
		sendIPFIX(t, exporter, crashRecords(mode, 1_000_001, 1000))
		waitFor(t, "the exporter's records", 3*time.Minute, func() bool {
			return c.query(t, dir, "SELECT count() FROM dualflow.flows WHERE ct_mark BETWEEN 1000001 AND 1001000") == "1000"
		})
	})
}
