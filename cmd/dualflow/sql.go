package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/collector/store/sqlguard"
	"github.com/dualflow/dualflow/netaddr"
)

func runSQL(ctx context.Context, args []string) error {
	fs := newFlagSet("sql", `[flags] "SELECT ..." | -`, `Run one SQL statement against the flow store and print the result.

It goes through the ClickHouse HTTP interface of a running collector (the
embedded store serves it on 127.0.0.1:8123), or of a ClickHouse server with
--url. When nothing answers there and the store is embedded, it opens the data
directory directly (only one process may own it, so stop the collector first
or let it answer over HTTP).

It reads: it runs as the embedded store's reader user, and what it runs must
pass the same check as the REST API's SQL (one read-only statement; see
docs/security.md). --write runs it as the admin user instead (INSERT, DDL,
DROP: it can destroy the store; it says so on stderr). The users come from the
store's users file (<data-dir>/http-users.json, readable by the collector's
user only), and their passwords go only to the collector that holds the data
directory, on loopback: never to another process listening on --url. For a
ClickHouse server, give --clickhouse.user (or $DUALFLOW_CLICKHOUSE_USER) and
--clickhouse.password-file (or $DUALFLOW_CLICKHOUSE_PASSWORD); a password is
never sent in clear beyond loopback (use https).

  dualflow sql "SELECT ip_version, count() FROM dualflow.flows GROUP BY ip_version"
  dualflow sql --format JSONEachRow "SELECT * FROM dualflow.flows LIMIT 3"
  echo "SHOW TABLES FROM dualflow" | dualflow sql -
  dualflow sql --write "OPTIMIZE TABLE dualflow.flows FINAL"`)
	var cfg store.Config
	cfg.BindFlags(fs)
	endpoint := fs.String("url", "http://"+store.DefaultHTTPAddr+"/", "ClickHouse HTTP interface to query")
	format := fs.String("format", "PrettyCompactMonoBlock", "ClickHouse output format, passed through (TSV, CSV, JSONEachRow, Vertical, …)")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	direct := fs.Bool("direct", false, "open the embedded data directory directly, without trying HTTP")
	write := fs.Bool("write", false, "run as the embedded store's admin user, who may write (INSERT, DDL, DROP); default the reader")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("sql: exactly one statement argument (or - for stdin) is required")
	}
	query := fs.Arg(0)
	if query == "-" {
		b, err := io.ReadAll(io.LimitReader(os.Stdin, 16<<20))
		if err != nil {
			return fmt.Errorf("read query from stdin: %w", err)
		}
		query = string(b)
	}
	query = strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(query), ";"))
	if query == "" {
		return errors.New("sql: empty statement")
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	c := &cliQuerier{endpoint: *endpoint, cfg: cfg, direct: *direct, write: *write, guarded: true}
	defer c.close()
	out, err := c.Query(ctx, query, *format)
	if err == nil {
		_, err = os.Stdout.Write(out)
	}
	return err
}

// cliQuerier runs SQL for the CLI (`dualflow sql`, `dualflow audit`): on
// the ClickHouse HTTP interface of --url, falling back to opening the
// embedded data directory when nothing answers there, or on the server of
// an http(s) --clickhouse.dsn. The audit reports read JSONEachRow, which
// the native protocol driver does not return: a clickhouse:// DSN gets the
// store's error saying so.
type cliQuerier struct {
	endpoint string
	cfg      store.Config
	direct   bool
	// write picks the users file's admin rather than its reader.
	write bool
	// guarded: the text is a user's, vetted as the REST API's SQL is when
	// it runs on the data directory directly (the HTTP interface vets what
	// its users send itself).
	guarded bool
	conn    store.Conn
}

// Query runs query and returns its output in format.
func (c *cliQuerier) Query(ctx context.Context, query, format string) ([]byte, error) {
	endpoint := c.endpoint
	if dsn := c.cfg.DSN; strings.HasPrefix(dsn, "http://") || strings.HasPrefix(dsn, "https://") {
		endpoint, c.direct = dsn, false
	}
	if c.conn == nil && !c.direct && (c.cfg.DSN == "" || endpoint == c.cfg.DSN) {
		user, password, err := c.credentials(endpoint)
		if err != nil {
			return nil, err
		}
		out, err := c.queryHTTP(ctx, endpoint, user, password, query, format)
		if err == nil || !isConnRefused(err) || c.cfg.DSN != "" {
			return out, err
		}
		c.direct = true // nothing listens: open the data directory
	}
	if c.conn == nil {
		c.cfg.SetDefaults()
		conn, err := store.Open(c.cfg)
		if err != nil {
			return nil, err
		}
		c.conn = conn
	}
	e, ok := c.conn.(*store.Embedded)
	if !ok || !c.guarded {
		return c.conn.Query(ctx, query, format)
	}
	// The data directory opened here: the same check as the HTTP
	// interface's users get.
	var settings map[string]string
	if !c.write {
		settings = map[string]string{"readonly": "1"}
	}
	run := func(ctx context.Context, q, f string) ([]byte, error) { return e.RunSQL(ctx, q, f, settings) }
	var err error
	if c.write {
		err = sqlguard.VetStatement(ctx, run, query)
	} else {
		err = sqlguard.Vet(ctx, run, c.cfg.Database, query)
	}
	if err != nil {
		return nil, fmt.Errorf("%w (dualflow sql reads; --write runs as the admin, who may write)", err)
	}
	if c.write {
		fmt.Fprintf(os.Stderr, "dualflow sql: running as the data directory's owner, read-write (--write)\n")
	}
	return run(ctx, query, format)
}

func (c *cliQuerier) close() {
	if c.conn != nil {
		c.conn.Close()
	}
}

// queryHTTP runs query on the ClickHouse HTTP interface at endpoint
// through the store's client, as the collector's POST /api/v1/sql does,
// with the DSN's TLS files, and returns its output in format.
func (c *cliQuerier) queryHTTP(ctx context.Context, endpoint, user, password, query, format string) ([]byte, error) {
	s, err := store.NewServer(store.ServerConfig{DSN: endpoint, Username: user, Password: password,
		CAFile: c.cfg.CAFile, CertFile: c.cfg.CertFile, KeyFile: c.cfg.KeyFile, Database: c.cfg.Database})
	if err != nil {
		return nil, fmt.Errorf("--url: %w", err)
	}
	defer s.Close()
	return s.RunSQL(ctx, query, format, nil)
}

// credentials picks the user for endpoint: the flags and the environment
// as for a ClickHouse server (store.Credentials), else the reader (admin
// with write) of the embedded store's users file, when this user may read
// it. A password goes in clear over http only to loopback; the users
// file's only to the collector that holds the data directory, so that a
// process that took the port while the collector was down gets none.
func (c *cliQuerier) credentials(endpoint string) (user, password string, err error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Host == "" {
		return "", "", fmt.Errorf("--url %q: want http(s)://host:port/", endpoint)
	}
	clearBeyondLoopback := u.Scheme == "http" && !netaddr.Loopback(u.Hostname())
	if user, password, err = store.Credentials(c.cfg.Username, c.cfg.PasswordFile); err != nil || user != "" {
		if err == nil && password != "" && clearBeyondLoopback {
			return "", "", fmt.Errorf("not sending the password of %s in clear to %s: use https (ClickHouse serves it on 8443), or a loopback address", user, u.Host)
		}
		if c.write && c.guarded && err == nil {
			fmt.Fprintf(os.Stderr, "dualflow sql: running as %s, who may write (--write)\n", user)
		}
		return user, password, err
	}
	cfg := c.cfg
	cfg.SetDefaults()
	if cfg.HTTPUsersFile == "" {
		return "", "", nil
	}
	users, err := chhttp.LoadUsers(cfg.HTTPUsersFile)
	if err != nil {
		return "", "", nil // the server's 401 says what to do
	}
	name := chhttp.ReaderUser
	if c.write {
		name = chhttp.AdminUser
	}
	fu, ok := chhttp.Find(users, name)
	if !ok || fu.Password == "" {
		return "", "", nil
	}
	if !netaddr.Loopback(u.Hostname()) {
		return "", "", fmt.Errorf("not sending the password of %s from %s to %s: the embedded store's interface listens on loopback only (for a server, give --clickhouse.user and a password)", name, cfg.HTTPUsersFile, u.Host)
	}
	if err := heldByStore(u, cfg.DataDir); errors.Is(err, errNotListening) {
		return "", "", nil // nothing to send to: the data directory is opened directly
	} else if err != nil {
		return "", "", fmt.Errorf("not sending the password of %s from %s to %s: %w", name, cfg.HTTPUsersFile, u.Host, err)
	}
	if c.write && c.guarded {
		fmt.Fprintf(os.Stderr, "dualflow sql: running as %s, who may write (--write)\n", name)
	}
	return fu.Name, fu.Password, nil
}

// heldByStore checks that what listens on u's address is the process that
// holds the embedded engine on dataDir (its lock file names it): nil, a
// refusal, or errNotListening.
func heldByStore(u *url.URL, dataDir string) error {
	port := cmp.Or(u.Port(), "80")
	ap, err := netip.ParseAddrPort(net.JoinHostPort(u.Hostname(), port))
	if err != nil { // localhost
		ap, err = netip.ParseAddrPort(net.JoinHostPort("127.0.0.1", port))
		if err != nil {
			return err
		}
	}
	held, holder := chdb.DirHolder(dataDir)
	pid := 0
	if held {
		if _, err := fmt.Sscanf(holder, "PID: %d", &pid); err != nil || pid <= 0 {
			return fmt.Errorf("the data directory's lock names no process (%q)", holder)
		}
	}
	return listenerOf(ap, pid)
}

func isConnRefused(err error) bool {
	var oe *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &oe) && oe.Op == "dial")
}
