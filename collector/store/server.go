package store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"
	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/reload"
)

// ServerConfig configures a connection to a ClickHouse server.
type ServerConfig struct {
	// DSN is a clickhouse-go DSN: clickhouse://host:9000/db for the native
	// protocol (default), http://host:8123/db or https://… for HTTP.
	// Parameters such as ?secure=true&skip_verify=false select TLS.
	// Several hosts (http://h1:8123,h2:8123/db) are tried in turn, first
	// to last unless connection_open_strategy says otherwise. compress
	// (lz4, lz4hc, zstd, gzip, deflate, br) compresses inserts; a value
	// the driver does not know is refused.
	// Never put a password in it: use PasswordFile or the
	// DUALFLOW_CLICKHOUSE_PASSWORD environment variable.
	DSN string
	// Username overrides the DSN user (env DUALFLOW_CLICKHOUSE_USER).
	Username string
	// PasswordFile is read for the password (trailing newline trimmed).
	PasswordFile string
	// Password is used when neither PasswordFile nor the environment
	// gives one: for a caller that holds it (the CLI, from the embedded
	// store's users file).
	Password string
	// CAFile, CertFile and KeyFile configure TLS (server CA and client
	// certificate), read again when they change, for the connections made
	// after (package reload).
	CAFile, CertFile, KeyFile string
	// Database qualifies unqualified table names. Default "dualflow".
	Database string
	// DialTimeout bounds connection attempts. Default 5s.
	DialTimeout time.Duration
	// MaxQueryAnswer bounds the answer of a query over the HTTP protocol,
	// which is held in memory; a larger one fails with ErrAnswerTooLarge.
	// Default DefaultMaxQueryAnswer.
	MaxQueryAnswer int64
}

// Server is a Conn to a ClickHouse server through clickhouse-go/v2.
type Server struct {
	conn    driver.Conn
	db      string
	http    *httpQuerier // nil for the native protocol
	natives sync.Pool    // *nativeBuilder, reused between HTTP inserts of flows batches
	rows    sync.Pool    // *[]byte, RowBinary of the writer's batches over the native protocol
	// syncInserts adds insert_distributed_sync = 1 to inserts, unless the
	// DSN sets it (see NewServer).
	syncInserts bool
	tls         *reload.TLS // the TLS files, nil without
}

var _ Conn = (*Server)(nil)

// Credentials returns the ClickHouse user and password given by flags or
// the environment: username (--clickhouse.user) over DUALFLOW_CLICKHOUSE_USER,
// the password file (trailing newline trimmed) over
// DUALFLOW_CLICKHOUSE_PASSWORD. Empty means not given.
func Credentials(username, passwordFile string) (user, password string, err error) {
	user = cmp.Or(username, os.Getenv("DUALFLOW_CLICKHOUSE_USER"))
	password = os.Getenv("DUALFLOW_CLICKHOUSE_PASSWORD")
	if passwordFile != "" {
		b, err := os.ReadFile(passwordFile)
		if err != nil {
			return "", "", fmt.Errorf("clickhouse password file: %w", err)
		}
		password = strings.TrimRight(string(b), "\r\n")
	}
	return user, password, nil
}

// NewServer opens a connection pool to a ClickHouse server. It does not fail
// when the server is down: the first operation does, with ErrUnavailable.
func NewServer(cfg ServerConfig) (*Server, error) {
	opt, err := clickhouse.ParseDSN(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("clickhouse dsn: %w", err)
	}
	if err := checkCompress(cfg.DSN); err != nil {
		return nil, err
	}
	if opt.Auth.Password != "" {
		return nil, errors.New("clickhouse dsn: contains a password; use --clickhouse.password-file or DUALFLOW_CLICKHOUSE_PASSWORD")
	}
	user, password, err := Credentials(cfg.Username, cfg.PasswordFile)
	if err != nil {
		return nil, err
	}
	opt.Auth.Username = cmp.Or(user, opt.Auth.Username)
	opt.Auth.Password = cmp.Or(password, cfg.Password)
	var files *reload.TLS
	if cfg.CAFile != "" || cfg.CertFile != "" {
		if files, err = clickhouseTLS(cfg, opt); err != nil {
			return nil, err
		}
	}
	opt.DialTimeout = cmp.Or(cfg.DialTimeout, 5*time.Second)
	db := cmp.Or(cfg.Database, "dualflow")
	// The dualflow database may not exist before `migrate`; connect to default.
	opt.Auth.Database = ""
	// In a cluster the collector inserts through the Distributed tables:
	// synchronously, so that a failed shard is the writer's error (and a
	// retry under the same dedup token reaches every shard) rather than a
	// line in one server's log (docs/cluster.md). Only inserts carry it: a
	// user whose profile is readonly = 1 may not change any setting, and
	// would be refused every query. A DSN that sets it (either name) wins.
	// The old name is an alias of distributed_foreground_insert in new
	// servers and the only name in old ones; other tables ignore it.
	_, set := opt.Settings[distributedSyncSetting]
	_, setNew := opt.Settings["distributed_foreground_insert"]
	c, err := clickhouse.Open(opt)
	if err != nil {
		return nil, fmt.Errorf("clickhouse open: %w", err)
	}
	return &Server{conn: c, db: db, http: newHTTPQuerier(opt, cfg.MaxQueryAnswer), syncInserts: !set && !setNew, tls: files}, nil
}

// checkCompress refuses a DSN whose compress parameter clickhouse-go
// would silently ignore (compress=xz, compress=snappy, a typo): the
// batches would go uncompressed while the operator believes otherwise.
func checkCompress(dsn string) error {
	_, query, _ := strings.Cut(dsn, "?")
	query, _, _ = strings.Cut(query, "#")
	params, err := url.ParseQuery(query)
	if err != nil || !params.Has("compress") {
		return nil // clickhouse-go parsed it; nothing to say about compress
	}
	v := params.Get("compress")
	if _, err := strconv.ParseBool(v); err == nil {
		return nil
	}
	switch v {
	case "none", "lz4", "lz4hc", "zstd", "gzip", "deflate", "br":
		return nil
	}
	return fmt.Errorf("clickhouse dsn: compress=%q is not supported (true, false, lz4, lz4hc, zstd, gzip, deflate, br or none)", v)
}

// insertSettings are the settings of an insert over the native protocol.
func (s *Server) insertSettings(dedupToken string) clickhouse.Settings {
	settings := clickhouse.Settings{}
	if dedupToken != "" {
		settings["insert_deduplication_token"] = dedupToken
		settings["deduplicate_blocks_in_dependent_materialized_views"] = 1
	}
	if s.syncInserts {
		settings[distributedSyncSetting] = 1
	}
	return settings
}

// distributedSyncSetting makes inserts through a Distributed table
// synchronous.
const distributedSyncSetting = "insert_distributed_sync"

// classify wraps connection-level failures with ErrUnavailable so the
// writer retries and spools them; server-side exceptions pass unchanged.
func classify(err error) error {
	if err == nil {
		return nil
	}
	var ex *clickhouse.Exception
	if errors.As(err, &ex) {
		return markTemporary(int(ex.Code), err)
	}
	var ne net.Error
	var oe *net.OpError
	if errors.As(err, &ne) || errors.As(err, &oe) ||
		strings.Contains(err.Error(), "connection refused") || strings.Contains(err.Error(), "EOF") ||
		strings.Contains(err.Error(), "acquire conn timeout") || strings.Contains(err.Error(), "[HTTP 5") {
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	return err
}

// ErrSQLNeedsHTTP is the error of RunSQL on the native protocol.
var ErrSQLNeedsHTTP = fmt.Errorf("operator SQL (POST /api/v1/sql) needs the server's HTTP interface, an http(s):// DSN: the native protocol returns only TabSeparated rows: %w", errors.ErrUnsupported)

// RunSQL runs one statement of an operator's (POST /api/v1/sql) on the
// server's HTTP interface, as Embedded.RunSQL does on the engine: in the
// DSN's database, with settings as URL settings, its output in format. An
// exception the server answers with is an *Exception.
func (s *Server) RunSQL(ctx context.Context, query, format string, settings map[string]string) ([]byte, error) {
	if s.http == nil {
		return nil, ErrSQLNeedsHTTP
	}
	params := url.Values{}
	for k, v := range settings {
		params.Set(k, v)
	}
	params.Set("log_comment", sqlComment())
	params.Set("default_format", format)
	if s.db != "" {
		params.Set("database", s.db)
	}
	return s.http.do(ctx, params, [][]byte{[]byte(query)}, "", s.http.maxAnswer)
}

// Exec implements Conn.
func (s *Server) Exec(ctx context.Context, query string) error {
	return classify(s.conn.Exec(ctx, query))
}

// Query implements Conn. Over the HTTP protocol (an http(s) DSN) any
// output format works: the server renders it. Over the native protocol only
// the TabSeparated family (TSV, TabSeparated, TabSeparatedRaw, TSVRaw)
// does: rows are scanned through the driver and printed as tab-separated
// text.
func (s *Server) Query(ctx context.Context, query, format string) ([]byte, error) {
	switch format {
	case "", "TSV", "TabSeparated", "TSVRaw", "TabSeparatedRaw":
	default:
		if s.http != nil {
			return s.http.query(ctx, query, format)
		}
		return nil, fmt.Errorf("format %s: only TabSeparated output is available through the native driver; use an http(s):// DSN", format)
	}
	rows, err := s.conn.Query(ctx, query)
	if err != nil {
		return nil, classify(err)
	}
	defer rows.Close()
	types := rows.ColumnTypes()
	vals := make([]any, len(types))
	for i, t := range types {
		vals[i] = reflect.New(t.ScanType()).Interface()
	}
	var buf bytes.Buffer
	for rows.Next() {
		if err := rows.Scan(vals...); err != nil {
			return nil, classify(err)
		}
		for i, v := range vals {
			if i > 0 {
				buf.WriteByte('\t')
			}
			fmt.Fprint(&buf, reflect.ValueOf(v).Elem().Interface())
		}
		buf.WriteByte('\n')
	}
	return buf.Bytes(), classify(rows.Err())
}

// InsertRowBinary implements Conn. Over the HTTP protocol the rows are
// sent without the driver (see insertHTTP), for any table. Over the native
// protocol the rows (rowBinary's) are decoded and appended to
// a driver batch; only the flows table layout is supported.
func (s *Server) InsertRowBinary(ctx context.Context, table string, columns []string, dedupToken string, rows int, data []byte) error {
	if s.http != nil {
		return s.insertHTTP(ctx, table, columns, dedupToken, rows, data)
	}
	if !flowLayout(columns) {
		return fmt.Errorf("insert %s: server backend only encodes the flows layout", table)
	}
	if settings := s.insertSettings(dedupToken); len(settings) > 0 {
		ctx = clickhouse.Context(ctx, clickhouse.WithSettings(settings))
	}
	batch, err := s.conn.PrepareBatch(ctx, fmt.Sprintf("INSERT INTO %s (%s)", qualify(s.db, table), strings.Join(columns, ", ")))
	if err != nil {
		return classify(err)
	}
	defer batch.Abort()
	var rec flow.Record
	rest := data
	for n := 0; len(rest) > 0; n++ {
		if rest, err = decodeFlowRow(rest, &rec, len(columns)); err != nil {
			return fmt.Errorf("insert %s: decode row %d: %w", table, n, err)
		}
		vals := flowValues(&rec)
		if err := batch.Append(vals[:len(columns)]...); err != nil {
			return fmt.Errorf("insert %s: append row %d: %w", table, n, err)
		}
	}
	if batch.Rows() != rows {
		return fmt.Errorf("insert %s: decoded %d rows, batch says %d", table, batch.Rows(), rows)
	}
	return classify(batch.Send())
}

// flowValues returns r's values in FlowColumns order, typed for clickhouse-go.
func flowValues(r *flow.Record) []any {
	addr := func(a netip.Addr) netip.Addr {
		if !a.IsValid() {
			return netip.IPv6Unspecified()
		}
		return netip.AddrFrom16(a.As16())
	}
	labels := func(m map[string]string) map[string]string {
		if m == nil {
			return map[string]string{}
		}
		return m
	}
	ts := func(t time.Time) time.Time {
		if t.IsZero() {
			return time.UnixMilli(0).UTC()
		}
		return t
	}
	return []any{
		ts(r.FlowStart), ts(r.FlowEnd), ts(r.TimeReceived),
		r.IPVersion, addr(r.SrcAddr), addr(r.DstAddr), r.SrcPort, r.DstPort, r.Proto,
		addr(r.ServiceAddr), r.ServicePort, addr(r.SNATAddr), r.SNATPort,
		r.PacketsDelta, r.BytesDelta, r.ReversePacketsDelta, r.ReverseBytesDelta,
		r.Packets, r.Bytes, r.ReversePackets, r.ReverseBytes,
		int8(r.EndReason), r.TCPState, r.Zone, r.Mark,
		addr(r.ExporterAddr), r.ObservationDomainID, r.ExporterNode, r.Source,
		r.Src.PodNamespace, r.Src.PodName, labels(r.Src.Labels), r.Src.WorkloadKind, r.Src.WorkloadName, r.Src.NodeName, r.Src.Zone,
		r.Dst.PodNamespace, r.Dst.PodName, labels(r.Dst.Labels), r.Dst.WorkloadKind, r.Dst.WorkloadName, r.Dst.NodeName, r.Dst.Zone,
		r.Service.Namespace, r.Service.Name, r.Service.PortName,
		int8(r.Type), int8(r.Correlation),
		r.Ingress.Namespace, r.Ingress.Name, r.Ingress.Rule, int8(r.Ingress.Verdict), int8(r.Ingress.ReportedVerdict), r.Ingress.ReportedName,
		r.Egress.Namespace, r.Egress.Name, r.Egress.Rule, int8(r.Egress.Verdict), int8(r.Egress.ReportedVerdict), r.Egress.ReportedName,
		r.VerdictMismatch(), r.K8sViewStale, r.ProbeTraceID,
	}
}

// Close implements Conn.
func (s *Server) Close() error { return s.conn.Close() }

// qualify prefixes table with db unless it is already qualified.
func qualify(db, table string) string {
	if strings.Contains(table, ".") {
		return table
	}
	return db + "." + table
}

// clickhouseTLS loads the TLS files of cfg into opt.TLS, reloaded when
// they change (package reload). The server's certificate is checked for
// the DSN's tls_server_name, else its host when it has one, else the host
// dialled, which must then be a DNS name: a name the check knows only from
// SNI (reload.TLS.ClientConfig).
func clickhouseTLS(cfg ServerConfig, opt *clickhouse.Options) (*reload.TLS, error) {
	files, err := reload.LoadTLS(reload.TLSFiles{CA: cfg.CAFile, Cert: cfg.CertFile, Key: cfg.KeyFile},
		reload.Options{Name: "clickhouse-client"})
	if err != nil {
		return nil, fmt.Errorf("clickhouse tls: %w", err)
	}
	var name string
	skip := false
	if opt.TLS != nil {
		name, skip = opt.TLS.ServerName, opt.TLS.InsecureSkipVerify // tls_server_name, skip_verify
	}
	host := func(a string) string {
		if h, _, err := net.SplitHostPort(a); err == nil {
			return h
		}
		return strings.Trim(a, "[]")
	}
	if name == "" && len(opt.Addr) == 1 {
		name = host(opt.Addr[0])
	}
	if name == "" && cfg.CAFile != "" && !skip {
		for _, a := range opt.Addr {
			if _, err := netip.ParseAddr(host(a)); err == nil {
				return nil, fmt.Errorf("clickhouse dsn: with --clickhouse.ca-file and several hosts, %s is an IP address: name the servers by DNS name, or set tls_server_name to the name their certificates hold", a)
			}
		}
	}
	tc := files.ClientConfig(name)
	if skip {
		tc.InsecureSkipVerify, tc.VerifyConnection = true, nil
	}
	opt.TLS = tc
	return files, nil
}

// Metrics returns the collector of the TLS files' reloads (none without
// TLS files), for the collector's registry.
func (s *Server) Metrics() prometheus.Collector { return reload.Metrics(s.tls) }
