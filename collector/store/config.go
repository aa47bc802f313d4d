package store

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/migrations"
	"github.com/dualflow/dualflow/netaddr"
)

// DefaultDataDir is the embedded store's data directory by default,
// relative to the working directory.
const DefaultDataDir = "var/data"

// Config selects and configures the ClickHouse backend. Bind it to a flag
// set with BindFlags; flags are named --clickhouse.*.
type Config struct {
	// DSN of a ClickHouse server (clickhouse://host:9000 native,
	// http(s)://host:8123 HTTP). Empty selects the embedded engine.
	DSN          string
	Username     string
	PasswordFile string
	CAFile       string
	CertFile     string
	KeyFile      string

	// Embedded engine.
	DataDir   string
	LibPath   string
	MaxMemory ByteSize
	// HTTPAddr is where the embedded engine serves the ClickHouse HTTP
	// interface ("" disables it). Loopback only: it has no TLS.
	HTTPAddr string
	// HTTPUsersFile holds the HTTP interface's users (see
	// chhttp.LoadOrCreateUsers); empty means <DataDir>/http-users.json,
	// created at first start with an admin and a reader user.
	HTTPUsersFile string
	// HTTPAnonymous is what a request without credentials may do: "none"
	// (default) or "readonly".
	HTTPAnonymous string

	// Schema.
	Database string
	Cluster  string
	TTLDays  int
}

// BindFlags registers the --clickhouse.* flags on fs.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.DSN, "clickhouse.dsn", c.DSN, "ClickHouse server DSN (clickhouse://host:9000/ native, http://host:8123/ HTTP; ?secure=true for TLS). Empty: embedded chDB engine. Never put the password here: use DUALFLOW_CLICKHOUSE_PASSWORD or --clickhouse.password-file")
	fs.StringVar(&c.Username, "clickhouse.user", c.Username, "ClickHouse user (or env DUALFLOW_CLICKHOUSE_USER)")
	fs.StringVar(&c.PasswordFile, "clickhouse.password-file", c.PasswordFile, "file holding the ClickHouse password (or env DUALFLOW_CLICKHOUSE_PASSWORD)")
	fs.StringVar(&c.CAFile, "clickhouse.ca-file", c.CAFile, "PEM CA bundle to verify the ClickHouse server")
	fs.StringVar(&c.CertFile, "clickhouse.cert-file", c.CertFile, "PEM client certificate for ClickHouse mutual TLS")
	fs.StringVar(&c.KeyFile, "clickhouse.key-file", c.KeyFile, "PEM client key for ClickHouse mutual TLS")
	fs.StringVar(&c.DataDir, "clickhouse.data-dir", c.DataDir, "data directory of the embedded engine (one process owns it)")
	fs.StringVar(&c.LibPath, "clickhouse.chdb-lib", c.LibPath, "path of libchdb.so (default: $CHDB_LIB_PATH, then .cache/chdb/current/libchdb.so; fetched by make deps)")
	fs.Var(&c.MaxMemory, "clickhouse.max-memory", "memory cap of the embedded engine, e.g. 2GiB (0: ClickHouse default)")
	fs.StringVar(&c.HTTPAddr, "clickhouse.http-addr", c.HTTPAddr, "serve the ClickHouse HTTP interface of the embedded engine here, loopback only (empty disables); users authenticate as with a ClickHouse server")
	fs.StringVar(&c.HTTPUsersFile, "clickhouse.http-users-file", c.HTTPUsersFile, "users of the embedded HTTP interface, JSON {\"users\":[{\"name\",\"password\" or \"password_sha256_hex\",\"readonly\"}]}, mode 0600 (default <data-dir>/http-users.json, created at first start with users admin and reader)")
	fs.StringVar(&c.HTTPAnonymous, "clickhouse.http-anonymous", c.HTTPAnonymous, "what requests without credentials may do on the embedded HTTP interface: none or readonly (default none)")
	fs.StringVar(&c.Database, "clickhouse.database", c.Database, "database holding the dualflow tables")
	fs.StringVar(&c.Cluster, "clickhouse.cluster", c.Cluster, "render the schema for this ClickHouse cluster (ON CLUSTER, Replicated*MergeTree + Distributed); empty: single node")
	fs.IntVar(&c.TTLDays, "clickhouse.ttl-days", c.TTLDays, "keep flows and rollups this many days (0: forever); applied to existing tables at start")
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	c.Database = cmp.Or(c.Database, "dualflow")
	if c.DataDir == "" && c.DSN == "" {
		c.DataDir = DefaultDataDir
	}
	if c.HTTPUsersFile == "" && c.DataDir != "" {
		c.HTTPUsersFile = filepath.Join(c.DataDir, "http-users.json")
	}
	c.HTTPAnonymous = cmp.Or(c.HTTPAnonymous, "none")
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.HTTPAddr != "" {
		host, _, err := net.SplitHostPort(c.HTTPAddr)
		if err != nil {
			return fmt.Errorf("--clickhouse.http-addr %q: %w", c.HTTPAddr, err)
		}
		if !netaddr.Loopback(host) {
			return fmt.Errorf("--clickhouse.http-addr %q: the embedded ClickHouse HTTP interface has no TLS, so passwords would cross the network in clear: it must listen on loopback (127.0.0.1 or [::1])", c.HTTPAddr)
		}
		if a, err := chhttp.ParseAccess(c.HTTPAnonymous); err != nil || a == chhttp.AccessFull {
			return fmt.Errorf("--clickhouse.http-anonymous %q: want none or readonly", c.HTTPAnonymous)
		}
	}
	if c.DSN != "" && strings.Contains(c.DSN, "password=") {
		return errors.New("--clickhouse.dsn must not contain a password: use DUALFLOW_CLICKHOUSE_PASSWORD or --clickhouse.password-file")
	}
	return c.Migrations().Validate()
}

// DefaultHTTPAddr is the default address of the embedded HTTP interface.
const DefaultHTTPAddr = "127.0.0.1:8123"

// Embedded reports whether the configuration selects the embedded engine.
func (c Config) Embedded() bool { return c.DSN == "" }

// Migrations returns the schema options.
func (c Config) Migrations() migrations.Options {
	return migrations.Options{Database: c.Database, Cluster: c.Cluster, TTLDays: c.TTLDays}
}

// Open opens the configured backend.
func Open(c Config) (Conn, error) {
	if c.Embedded() {
		return NewEmbedded(EmbeddedConfig{LibPath: c.LibPath, DataDir: c.DataDir, MaxMemoryBytes: uint64(c.MaxMemory), Database: c.Database})
	}
	return NewServer(ServerConfig{DSN: c.DSN, Username: c.Username, PasswordFile: c.PasswordFile,
		CAFile: c.CAFile, CertFile: c.CertFile, KeyFile: c.KeyFile, Database: c.Database})
}

// ByteSize is a flag value in bytes that accepts KiB/MiB/GiB/KB/MB/GB suffixes.
type ByteSize uint64

func (b *ByteSize) String() string { return strconv.FormatUint(uint64(*b), 10) }

// Set implements flag.Value.
func (b *ByteSize) Set(s string) error {
	v, err := ParseByteSize(s)
	if err != nil {
		return err
	}
	*b = ByteSize(v)
	return nil
}

// ParseByteSize parses "512MiB", "2GB", "1048576".
func ParseByteSize(s string) (uint64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   uint64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}}
	mult := uint64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 {
		return 0, fmt.Errorf("bad size %q: want a number with an optional KiB/MiB/GiB/KB/MB/GB suffix", s)
	}
	return uint64(f * float64(mult)), nil
}
