package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chhttp"
)

func runSQL(ctx context.Context, args []string) error {
	fs := newFlagSet("sql", `[flags] "SELECT ..." | -`, `Run one SQL statement against the flow store and print the result.

It goes through the ClickHouse HTTP interface of a running collector (the
embedded store serves it on 127.0.0.1:8123), or of a ClickHouse server with
--url. When nothing answers there and the store is embedded, it opens the data
directory directly (only one process may own it, so stop the collector first
or let it answer over HTTP). Over HTTP it authenticates as --clickhouse.user
(or $DUALFLOW_CLICKHOUSE_USER) with --clickhouse.password-file (or
$DUALFLOW_CLICKHOUSE_PASSWORD), else as the admin user of the embedded store's
users file (<data-dir>/http-users.json, readable by the collector's user only).

  dualflow sql "SELECT ip_version, count() FROM dualflow.flows GROUP BY ip_version"
  dualflow sql --format JSONEachRow "SELECT * FROM dualflow.flows LIMIT 3"
  echo "SHOW TABLES FROM dualflow" | dualflow sql -`)
	var cfg store.Config
	cfg.BindFlags(fs)
	endpoint := fs.String("url", "http://"+store.DefaultHTTPAddr+"/", "ClickHouse HTTP interface to query")
	format := fs.String("format", "PrettyCompactMonoBlock", "ClickHouse output format, passed through (TSV, CSV, JSONEachRow, Vertical, …)")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this long")
	direct := fs.Bool("direct", false, "open the embedded data directory directly, without trying HTTP")
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
	if !*direct {
		user, password, err := httpCredentials(cfg)
		if err != nil {
			return err
		}
		err = queryHTTP(ctx, *endpoint, user, password, query, *format, os.Stdout)
		if err == nil || !isConnRefused(err) || cfg.DSN != "" {
			return err
		}
	}
	cfg.SetDefaults()
	conn, err := store.NewEmbedded(store.EmbeddedConfig{LibPath: cfg.LibPath, DataDir: cfg.DataDir, MaxMemoryBytes: uint64(cfg.MaxMemory), Database: cfg.Database})
	if err != nil {
		return err
	}
	defer conn.Close()
	out, err := conn.Query(ctx, query, *format)
	if err != nil {
		return err
	}
	_, err = os.Stdout.Write(out)
	return err
}

// queryHTTP posts query to a ClickHouse HTTP interface and copies the
// result to w.
func queryHTTP(ctx context.Context, endpoint, user, password, query, format string, w io.Writer) error {
	u, err := url.Parse(endpoint)
	if err != nil {
		return fmt.Errorf("--url: %w", err)
	}
	q := u.Query()
	q.Set("default_format", format)
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), strings.NewReader(query))
	if err != nil {
		return err
	}
	if user != "" {
		req.SetBasicAuth(user, password)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		return fmt.Errorf("clickhouse: %s", strings.TrimSpace(string(msg)))
	}
	_, err = io.Copy(w, resp.Body)
	return err
}

// httpCredentials picks the user of the HTTP interface: the flags and the
// environment as for a ClickHouse server (store.Credentials), else the
// admin user of the embedded store's users file when this user may read it.
func httpCredentials(cfg store.Config) (user, password string, err error) {
	if user, password, err = store.Credentials(cfg.Username, cfg.PasswordFile); err != nil || user != "" {
		return user, password, err
	}
	cfg.SetDefaults()
	if cfg.HTTPUsersFile == "" {
		return "", "", nil
	}
	users, err := chhttp.LoadUsers(cfg.HTTPUsersFile)
	if err != nil {
		return "", "", nil // the server's 401 says what to do
	}
	if u, ok := chhttp.Find(users, chhttp.AdminUser); ok && u.Password != "" {
		return u.Name, u.Password, nil
	}
	return "", "", nil
}

func isConnRefused(err error) bool {
	var oe *net.OpError
	return errors.Is(err, syscall.ECONNREFUSED) || (errors.As(err, &oe) && oe.Op == "dial")
}
