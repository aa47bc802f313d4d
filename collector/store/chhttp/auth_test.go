package chhttp

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/collector/store/chdb"
)

var authUsers = []User{
	{Name: "admin", Password: "a-secret"},
	{Name: "reader", PasswordSHA256Hex: sha256hex("r-secret"), ReadOnly: true},
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func q(base, query string, extra ...string) string {
	v := url.Values{"query": {query}}
	for i := 0; i+1 < len(extra); i += 2 {
		v.Set(extra[i], extra[i+1])
	}
	return base + "/?" + v.Encode()
}

// TestAuthRequired: a local user without the password gets nothing,
// neither reads nor writes (the issue: uid 65534 read a root 0600 file and
// wrote a root-owned one through the unauthenticated interface).
func TestAuthRequired(t *testing.T) {
	reg := prometheus.NewRegistry()
	ts, _ := testServer(t, Config{Users: authUsers, Registerer: reg})
	d := newDatabase(t)
	for _, c := range []struct {
		name, method, body string
		header             map[string]string
		status             int
		code               string
	}{
		{"no credentials GET", "GET", "", nil, 401, "194"},
		{"no credentials POST", "POST", "CREATE TABLE " + d + ".x (a UInt8) ENGINE = Memory", nil, 401, "194"},
		{"wrong password", "POST", "SELECT 1", map[string]string{"X-ClickHouse-User": "admin", "X-ClickHouse-Key": "nope"}, 403, "516"},
		{"unknown user", "POST", "SELECT 1", map[string]string{"X-ClickHouse-User": "root", "X-ClickHouse-Key": "a-secret"}, 403, "516"},
		{"password without user is default's", "POST", "SELECT 1", map[string]string{"X-ClickHouse-Key": "a-secret"}, 403, "516"},
	} {
		u := ts.URL + "/"
		if c.method == "GET" {
			u = q(ts.URL, "SELECT 1")
		}
		r := do(t, c.method, u, strings.NewReader(c.body), c.header)
		if r.status != c.status || r.header.Get("X-ClickHouse-Exception-Code") != c.code {
			t.Errorf("%s: %d %s %s, want %d code %s", c.name, r.status, r.header.Get("X-ClickHouse-Exception-Code"), r.body, c.status, c.code)
		}
		if c.status == 401 && !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Basic") {
			t.Errorf("%s: no Basic challenge", c.name)
		}
	}
	if got := counterValue(t, reg, "dualflow_chhttp_auth_failures_total", nil); got != 5 {
		t.Errorf("auth_failures_total = %v, want 5", got)
	}
	// Nothing was created.
	r := do(t, "POST", ts.URL+"/", strings.NewReader("EXISTS TABLE "+d+".x"), map[string]string{"X-ClickHouse-User": "admin", "X-ClickHouse-Key": "a-secret"})
	if r.status != 200 || strings.TrimSpace(r.body) != "0" {
		t.Errorf("exists: %d %q", r.status, r.body)
	}
}

// TestAuthRoles: the admin writes; the reader reads and cannot write or
// escape read-only with readonly=0; every way ClickHouse clients send
// credentials works.
func TestAuthRoles(t *testing.T) {
	ts, _ := testServer(t, Config{Users: authUsers})
	d := newDatabase(t)
	admin := map[string]string{"X-ClickHouse-User": "admin", "X-ClickHouse-Key": "a-secret"}
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("CREATE TABLE "+d+".t (a UInt32) ENGINE = MergeTree ORDER BY a"), admin); r.status != 200 {
		t.Fatalf("admin create: %d %s", r.status, r.body)
	}
	// Basic auth, as curl -u and clickhouse-go send it.
	basic := "http://admin:a-secret@" + strings.TrimPrefix(ts.URL, "http://")
	if r := do(t, "POST", basic+"/?query="+url.QueryEscape("INSERT INTO "+d+".t FORMAT TSV"), strings.NewReader("1\n2\n"), nil); r.status != 200 {
		t.Fatalf("admin insert (basic): %d %s", r.status, r.body)
	}
	// URL parameters.
	if r := do(t, "GET", q(ts.URL, "SELECT sum(a) FROM "+d+".t", "user", "reader", "password", "r-secret"), nil, nil); r.status != 200 || strings.TrimSpace(r.body) != "3" {
		t.Fatalf("reader select (params): %d %q", r.status, r.body)
	}
	reader := map[string]string{"X-ClickHouse-User": "reader", "X-ClickHouse-Key": "r-secret"}
	for _, c := range []struct{ name, u, body string }{
		{"insert", ts.URL + "/?query=" + url.QueryEscape("INSERT INTO "+d+".t FORMAT TSV"), "3\n"},
		{"insert readonly=0", ts.URL + "/?readonly=0&query=" + url.QueryEscape("INSERT INTO "+d+".t FORMAT TSV"), "3\n"},
		{"drop", ts.URL + "/", "DROP TABLE " + d + ".t"},
		{"drop readonly=0", ts.URL + "/?readonly=0", "DROP TABLE " + d + ".t"},
		{"outfile", ts.URL + "/", "SELECT 1 INTO OUTFILE '" + filepath.Join(t.TempDir(), "x") + "' FORMAT RawBLOB"},
		{"file()", ts.URL + "/", "SELECT * FROM file('/etc/hostname', 'RawBLOB')"},
		{"kill", ts.URL + "/", "KILL QUERY WHERE 1 SYNC"},
	} {
		r := do(t, "POST", c.u, strings.NewReader(c.body), reader)
		if r.status == 200 {
			t.Errorf("reader %s: allowed: %s", c.name, r.body)
		}
	}
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("SELECT count() FROM "+d+".t"), admin); strings.TrimSpace(r.body) != "2" {
		t.Errorf("after the reader's attempts: %d %q, want 2 rows", r.status, r.body)
	}
}

// TestAnonymousReadOnly: anonymous access, when enabled, reads only.
func TestAnonymousReadOnly(t *testing.T) {
	ts, _ := testServer(t, Config{Users: authUsers, Anonymous: AccessReadOnly})
	d := newDatabase(t)
	if r := do(t, "POST", ts.URL+"/", strings.NewReader("SELECT 41+1"), nil); r.status != 200 || strings.TrimSpace(r.body) != "42" {
		t.Errorf("anonymous select: %d %q", r.status, r.body)
	}
	if r := do(t, "POST", ts.URL+"/?readonly=0", strings.NewReader("CREATE TABLE "+d+".x (a UInt8) ENGINE = Memory"), nil); r.status == 200 {
		t.Errorf("anonymous create allowed")
	}
}

// TestLoadOrCreateUsersAddsInserter: a users file written before the
// inserter user existed gets it added, the file replaced whole at 0600.
func TestLoadOrCreateUsersAddsInserter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "http-users.json")
	old := `{"users":[{"name":"admin","password":"a"},{"name":"reader","password":"r","readonly":true}]}`
	if err := os.WriteFile(path, []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	users, created, err := LoadOrCreateUsers(path)
	if err != nil || !created {
		t.Fatalf("upgrade: %v %v", created, err)
	}
	in, ok := Find(users, InserterUser)
	if !ok || !in.InsertOnly || len(users) != 3 {
		t.Fatalf("users: %+v", users)
	}
	again, err := LoadUsers(path)
	if err != nil || fmt.Sprint(again) != fmt.Sprint(users) {
		t.Fatalf("reload: %v %+v", err, again)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v, want 0600", fi.Mode().Perm(), err)
	}
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Fatalf("files left beside the users file: %v", ents)
	}
}

func TestLoadOrCreateUsers(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	path := filepath.Join(dir, "http-users.json")
	users, created, err := LoadOrCreateUsers(path)
	if err != nil || !created {
		t.Fatalf("create: %v %v", created, err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v %v, want 0600", fi.Mode().Perm(), err)
	}
	a, ok1 := Find(users, AdminUser)
	r, ok2 := Find(users, ReaderUser)
	if !ok1 || !ok2 || a.ReadOnly || !r.ReadOnly || len(a.Password) < 24 || a.Password == r.Password {
		t.Fatalf("users: %+v", users)
	}
	again, created, err := LoadOrCreateUsers(path)
	if err != nil || created || fmt.Sprint(again) != fmt.Sprint(users) {
		t.Fatalf("reload: %v %v %+v", created, err, again)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadOrCreateUsers(path); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("0644 file accepted: %v", err)
	}
	if err := os.WriteFile(path, []byte(`{"users":[{"name":"a"}]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadUsers(path); err == nil {
		t.Fatal("user without a password accepted")
	}
}

// TestSlowSendersHoldNoSlot: requests still sending their query text do
// not hold engine slots (32 slow POSTs locked every client out), and a
// sender that stalls is cut off after BodyTimeout.
func TestSlowSendersHoldNoSlot(t *testing.T) {
	eng := &fakeEngine{run: func(ctx context.Context, st chdb.Statement) (*chdb.Result, error) {
		return &chdb.Result{Data: []byte("1\n")}, nil
	}}
	ts, _ := testServer(t, Config{Engine: eng, MaxConcurrent: 2, BodyTimeout: 2 * time.Second})
	host := strings.TrimPrefix(ts.URL, "http://")
	var slow []net.Conn
	for range 2 * 2 { // as many as the old code's slots, and more
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		slow = append(slow, c)
		fmt.Fprintf(c, "POST / HTTP/1.1\r\nHost: %s\r\nContent-Length: 1000\r\n\r\nSELECT ", host)
	}
	defer func() {
		for _, c := range slow {
			c.Close()
		}
	}()
	// A well-behaved client is served while they dawdle. (Their requests
	// may not have reached the handler yet; either way none holds a slot.)
	for i := range 3 {
		if r := do(t, "POST", ts.URL+"/", strings.NewReader("SELECT 1"), nil); r.status != 200 {
			t.Fatalf("query %d while slow senders wait: %d %s", i, r.status, r.body)
		}
	}
	// The stalled senders are answered and cut off within BodyTimeout.
	for i, c := range slow {
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Minute))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && !strings.Contains(line, " 400 ") && !strings.Contains(line, " 408 ") {
			t.Errorf("slow sender %d got %q", i, line)
		}
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatalf("slow sender %d still held after 2 minutes", i)
		}
	}
}
