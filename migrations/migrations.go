// Package migrations holds the versioned ClickHouse schema of dualflow and
// applies it.
//
// Each NNNN_name.sql file is a Go text/template that renders to the same
// schema for a single node or for a cluster:
//
//	{{local "flows"}}          db.flows (single) or db.flows_local (cluster)
//	{{onCluster}}              "" or " ON CLUSTER 'name'"
//	{{engine "MergeTree"}}     MergeTree or ReplicatedMergeTree('/clickhouse/tables/{shard}/db/table', '{replica}')
//	{{distributed "flows" k}}  "" or a Distributed table "flows" over the local tables, sharded by k
//	{{replaceDistributed "flows"}} "" or CREATE OR REPLACE of the Distributed table "flows", sharded by ShardingKeys["flows"]
//	{{ttl "col"}}              "" or "TTL toDateTime(col) + INTERVAL N DAY"
//	{{traceflowTTL "col"}}     the same with the traceflows' retention (Options.TraceflowDays)
//	{{ipText "col"}}           an IPv6 column shown as text ('' / dotted quad / RFC 5952)
//	{{.Database}}              the database name
//
// Statements end with a ';' at the end of a line. Files are immutable once
// released: the runner records a checksum of each applied file and refuses
// to continue if an applied file changed. Change the schema by adding a file.
package migrations

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/template"

	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/internal/chsql"
)

//go:embed *.sql
var files embed.FS

// Options select how the migrations render.
type Options struct {
	// Database holds every dualflow table. Default "dualflow".
	Database string
	// Cluster, when set, renders the cluster form: ON CLUSTER DDL,
	// Replicated*MergeTree local tables (name_local) and Distributed tables
	// under the plain names.
	Cluster string
	// TTLDays is the retention of flows and rollups in days; 0 keeps data
	// forever.
	TTLDays int
	// TraceflowTTLDays is the retention of traceflow results in days; 0
	// is DefaultTraceflowTTLDays, or TTLDays when shorter, and forever
	// when TTLDays is 0 (see TraceflowDays).
	TraceflowTTLDays int
}

// DefaultTraceflowTTLDays is how long traceflow results are kept unless
// Options.TraceflowTTLDays says otherwise: a trace is a diagnosis of the
// moment, and every operator may start them, so they must not pile up
// for the flows' whole retention.
const DefaultTraceflowTTLDays = 7

// TraceflowDays is the retention of the traceflows table (migration
// 0011) in days, 0 for forever: TraceflowTTLDays when set, else
// DefaultTraceflowTTLDays capped by TTLDays (the results never outlive
// the flows), and forever when the flows are kept forever.
func (o Options) TraceflowDays() int {
	switch {
	case o.TraceflowTTLDays > 0:
		return o.TraceflowTTLDays
	case o.TTLDays > 0:
		return min(o.TTLDays, DefaultTraceflowTTLDays)
	}
	return 0
}

// SetDefaults fills unset options.
func (o *Options) SetDefaults() {
	o.Database = cmp.Or(o.Database, "dualflow")
}

// ShardingKeys are the sharding keys of the Distributed tables that rows
// are inserted through, in the cluster form (migration 0007,
// docs/cluster.md). Each is a deterministic function of the row, so a batch
// replayed with the same insert_deduplication_token splits into the same
// per-shard blocks and each shard deduplicates its block (with rand() a
// replay would split differently and a shard would drop rows it never
// stored under that token). The flows key sends every row of one
// namespace/workload pair to one shard: each key of rollup_pod_to_pod_1m
// and rollup_policy_1m (whose keys include both namespaces and workloads)
// is then summed on one shard only, and a connection's records stay
// together, at the price of skew when one workload pair dominates. The
// keys use plain columns the collector always sends (not the DEFAULT
// columns derived from the EPHEMERAL *_in ones). The rollup Distributed
// tables keep rand(): nothing inserts through them, the materialized
// views write each shard's local rollups.
var ShardingKeys = map[string]string{
	"flows":      "cityHash64(src_pod_namespace, src_workload_name, dst_pod_namespace, dst_workload_name)",
	"traceflows": "cityHash64(trace_id)",
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Validate checks the options.
func (o Options) Validate() error {
	if !identRE.MatchString(o.Database) {
		return fmt.Errorf("database %q: must be an identifier ([A-Za-z_][A-Za-z0-9_]*)", o.Database)
	}
	if o.Cluster != "" && !identRE.MatchString(o.Cluster) {
		return fmt.Errorf("cluster %q: must be an identifier", o.Cluster)
	}
	if o.TTLDays < 0 {
		return fmt.Errorf("ttl %d days: must be >= 0", o.TTLDays)
	}
	if o.TraceflowTTLDays < 0 {
		return fmt.Errorf("traceflow ttl %d days: must be >= 0", o.TraceflowTTLDays)
	}
	return nil
}

// Migration is one versioned schema file.
type Migration struct {
	Version  int
	Name     string // file name, e.g. 0001_flows.sql
	Source   string // template text
	Checksum string // sha256 of Source, hex
}

var fileRE = regexp.MustCompile(`^(\d{4})_[a-z0-9_]+\.sql$`)

// All returns the embedded migrations in version order.
func All() ([]Migration, error) { return load(files) }

func load(fsys fs.FS) ([]Migration, error) {
	names, err := fs.Glob(fsys, "*.sql")
	if err != nil {
		return nil, err
	}
	var out []Migration
	seen := map[int]string{}
	for _, n := range names {
		m := fileRE.FindStringSubmatch(n)
		if m == nil {
			return nil, fmt.Errorf("migration file %q: name must be NNNN_lower_snake.sql", n)
		}
		v, _ := strconv.Atoi(m[1])
		if prev, dup := seen[v]; dup {
			return nil, fmt.Errorf("migration version %d used by %s and %s", v, prev, n)
		}
		seen[v] = n
		src, err := fs.ReadFile(fsys, n)
		if err != nil {
			return nil, err
		}
		sum := sha256.Sum256(src)
		out = append(out, Migration{Version: v, Name: n, Source: string(src), Checksum: hex.EncodeToString(sum[:])})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out, nil
}

// Render renders m for opt and splits it into statements. Empty statements
// (such as a Distributed table in the single-node form) are omitted.
func Render(m Migration, opt Options) ([]string, error) {
	opt.SetDefaults()
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	tmpl, err := template.New(m.Name).Option("missingkey=error").Funcs(funcs(opt)).Parse(m.Source)
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", m.Name, err)
	}
	var buf bytes.Buffer
	if err := tmpl.Execute(&buf, opt); err != nil {
		return nil, fmt.Errorf("render %s: %w", m.Name, err)
	}
	return chdb.SplitStatements(buf.String()), nil
}

func funcs(o Options) template.FuncMap {
	q := chsql.String
	// distributed creates the Distributed table over table's local ones
	// (nothing in the single-node form).
	distributed := func(create, table, shardingKey string) string {
		if o.Cluster == "" {
			return ""
		}
		return fmt.Sprintf("%s %s.%s ON CLUSTER %s AS %s.%s_local\nENGINE = Distributed(%s, %s, %s_local, %s);",
			create, o.Database, table, q(o.Cluster), o.Database, table, q(o.Cluster), q(o.Database), table, shardingKey)
	}
	return template.FuncMap{
		"local": func(table string) string {
			if o.Cluster != "" {
				return o.Database + "." + table + "_local"
			}
			return o.Database + "." + table
		},
		"onCluster": func() string {
			if o.Cluster != "" {
				return " ON CLUSTER " + q(o.Cluster)
			}
			return ""
		},
		"engine": func(engine string) string {
			if o.Cluster == "" {
				return engine
			}
			return "Replicated" + engine + "('/clickhouse/tables/{shard}/{database}/{table}', '{replica}')"
		},
		"distributed": func(table, shardingKey string) string {
			return distributed("CREATE TABLE IF NOT EXISTS", table, shardingKey)
		},
		// replaceDistributed recreates a Distributed table in place
		// (CREATE OR REPLACE swaps it atomically in an Atomic database, so
		// inserts never find it missing) with its key from ShardingKeys.
		// A Distributed table holds no rows of its own; pending
		// background sends are flushed by a SYSTEM FLUSH DISTRIBUTED
		// before it.
		"replaceDistributed": func(table string) (string, error) {
			key, ok := ShardingKeys[table]
			if !ok {
				return "", fmt.Errorf("replaceDistributed %q: no sharding key in ShardingKeys", table)
			}
			return distributed("CREATE OR REPLACE TABLE", table, key), nil
		},
		// clustered and dist are for ALTERs that must reach the
		// Distributed table as well as the local one.
		"clustered": func() bool { return o.Cluster != "" },
		"dist":      func(table string) string { return o.Database + "." + table },
		"ipText":    ipText,
		// ingestBatch is flows.ingest_batch's expression (migration 0008).
		"ingestBatch": func() string { return IngestBatchExpr },
		// The label and verdict class columns (migration 0009).
		"srcLabel":     func() string { return SrcLabelExpr },
		"dstLabel":     func() string { return DstLabelExpr },
		"verdictClass": func() string { return VerdictClassExpr },
		"ttl": func(col string) string {
			return ttlClause(col, o.TTLDays)
		},
		"traceflowTTL": func(col string) string {
			return ttlClause(col, o.TraceflowDays())
		},
	}
}

// IngestBatchExpr computes flows.ingest_batch (migration 0008) from the
// insert's own insert_deduplication_token: cityHash64 of it, 0 without one.
// The collector looks a batch up by cityHash64('<token>').
const IngestBatchExpr = "if(getSetting('insert_deduplication_token') = '', 0, cityHash64(getSetting('insert_deduplication_token')))"

// The expressions of flows.src_label, dst_label and verdict_class
// (migration 0009): how the web API names a flow's ends and classes its
// verdicts. A flow is dropped when either direction was denied or rejected.
const (
	SrcLabelExpr     = "multiIf(src_workload_name != '', concat(src_pod_namespace, '/', src_workload_name), src_pod_name != '', concat(src_pod_namespace, '/', src_pod_name), src_ip)"
	DstLabelExpr     = "multiIf(dst_service_name != '', concat('svc:', dst_service_namespace, '/', dst_service_name), dst_workload_name != '', concat(dst_pod_namespace, '/', dst_workload_name), dst_pod_name != '', concat(dst_pod_namespace, '/', dst_pod_name), dst_ip)"
	VerdictClassExpr = "multiIf(ingress_verdict IN ('denied', 'rejected') OR egress_verdict IN ('denied', 'rejected'), 'dropped', ingress_verdict = 'allowed' OR egress_verdict = 'allowed', 'allowed', ingress_verdict = 'not_isolated' OR egress_verdict = 'not_isolated', 'not_isolated', 'unknown')"
)

// ipText renders the SQL expression that shows an IPv6 column as text: ”
// for ::, a dotted quad for an IPv4-mapped address, RFC 5952 text otherwise.
func ipText(col string) string {
	return fmt.Sprintf("if(%[1]s = toIPv6('::'), '', if(%[1]s BETWEEN toIPv6('::ffff:0.0.0.0') AND toIPv6('::ffff:255.255.255.255'), substring(IPv6NumToString(%[1]s), 8), IPv6NumToString(%[1]s)))", col)
}

func ttlClause(col string, days int) string {
	if days <= 0 {
		return ""
	}
	return fmt.Sprintf("TTL toDateTime(%s) + INTERVAL %d DAY", col, days)
}

// conn is what the runner needs from ClickHouse; store.Conn satisfies it.
type conn interface {
	Exec(ctx context.Context, query string) error
	Query(ctx context.Context, query, format string) ([]byte, error)
}

// Applied is one row of the schema_migrations table.
type Applied struct {
	Version  int
	Name     string
	Checksum string
}

// ErrChanged is returned when an applied migration file no longer matches
// the checksum recorded when it was applied.
var ErrChanged = errors.New("applied migration changed")

// Runner applies migrations through a ClickHouse connection.
type Runner struct {
	conn conn
	opt  Options
	all  []Migration
	// Version is recorded beside each applied migration (dualflow version).
	Version string
}

// NewRunner returns a runner for the embedded migrations.
func NewRunner(c conn, opt Options) (*Runner, error) {
	opt.SetDefaults()
	if err := opt.Validate(); err != nil {
		return nil, err
	}
	all, err := All()
	if err != nil {
		return nil, err
	}
	return &Runner{conn: c, opt: opt, all: all}, nil
}

func (r *Runner) bookkeeping() []string {
	db, oc := r.opt.Database, ""
	engine := "ReplacingMergeTree(applied_at)"
	if r.opt.Cluster != "" {
		oc = " ON CLUSTER '" + r.opt.Cluster + "'"
		// One replicated copy shared by every shard: the schema is cluster-wide.
		engine = "ReplicatedReplacingMergeTree('/clickhouse/tables/{database}/schema_migrations', '{replica}', applied_at)"
	}
	return []string{
		fmt.Sprintf("CREATE DATABASE IF NOT EXISTS %s%s", db, oc),
		fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s.schema_migrations%s
(
    version UInt32 COMMENT 'migration number (file prefix)',
    name String COMMENT 'migration file name',
    checksum String COMMENT 'sha256 of the file as released',
    applied_at DateTime64(3, 'UTC') DEFAULT now64(3),
    dualflow_version String
)
ENGINE = %s
ORDER BY version
COMMENT 'dualflow schema migrations applied to this database'`, db, oc, engine),
	}
}

// Status returns the applied migrations, in version order.
func (r *Runner) Status(ctx context.Context) ([]Applied, error) {
	exists, err := r.conn.Query(ctx, fmt.Sprintf("EXISTS TABLE %s.schema_migrations", r.opt.Database), "TabSeparated")
	if err != nil {
		return nil, fmt.Errorf("check %s.schema_migrations: %w", r.opt.Database, err)
	}
	if strings.TrimSpace(string(exists)) != "1" {
		return nil, nil // nothing applied yet
	}
	out, err := r.conn.Query(ctx, fmt.Sprintf(
		"SELECT version, argMax(name, applied_at) AS name, argMax(checksum, applied_at) AS checksum FROM %s.schema_migrations GROUP BY version ORDER BY version",
		r.opt.Database), "JSONEachRow")
	if err != nil {
		return nil, fmt.Errorf("read %s.schema_migrations: %w", r.opt.Database, err)
	}
	applied, err := chsql.Decode[Applied](out)
	if err != nil {
		return nil, fmt.Errorf("read schema_migrations: %w", err)
	}
	return applied, nil
}

// Pending returns the migrations not applied yet, after checking that every
// applied one is unchanged.
func (r *Runner) Pending(ctx context.Context) ([]Migration, error) {
	applied, err := r.Status(ctx)
	if err != nil {
		return nil, err
	}
	done := map[int]Applied{}
	for _, a := range applied {
		done[a.Version] = a
	}
	var pending []Migration
	for _, m := range r.all {
		a, ok := done[m.Version]
		if !ok {
			pending = append(pending, m)
			continue
		}
		if a.Checksum != m.Checksum {
			return nil, fmt.Errorf("%w: %s was applied with checksum %.12s but the file now has %.12s; released migrations are immutable, add a new migration instead",
				ErrChanged, m.Name, a.Checksum, m.Checksum)
		}
	}
	return pending, nil
}

// Up creates the database and bookkeeping table if needed, then applies every
// pending migration in order and records it. It stops at the first failing
// statement with an error naming the file and statement. Running it again is
// a no-op. It returns the migrations it applied.
func (r *Runner) Up(ctx context.Context) ([]Migration, error) {
	for _, s := range r.bookkeeping() {
		if err := r.conn.Exec(ctx, s); err != nil {
			return nil, fmt.Errorf("create schema_migrations: %w", err)
		}
	}
	pending, err := r.Pending(ctx)
	if err != nil {
		return nil, err
	}
	var done []Migration
	for _, m := range pending {
		stmts, err := Render(m, r.opt)
		if err != nil {
			return done, err
		}
		for i, s := range stmts {
			if err := r.conn.Exec(ctx, s); err != nil {
				return done, fmt.Errorf("migration %s statement %d of %d (%s): %w", m.Name, i+1, len(stmts), firstLine(s), err)
			}
		}
		rec := fmt.Sprintf("INSERT INTO %s.schema_migrations (version, name, checksum, dualflow_version) SELECT %d, %s, %s, %s",
			r.opt.Database, m.Version, chsql.String(m.Name), chsql.String(m.Checksum), chsql.String(r.Version))
		if err := r.conn.Exec(ctx, rec); err != nil {
			return done, fmt.Errorf("record migration %s: %w", m.Name, err)
		}
		done = append(done, m)
	}
	if err := r.reconcileTTL(ctx); err != nil {
		return done, err
	}
	return done, nil
}

// ttlTables are the tables whose retention follows Options.TTLDays (the
// traceflows table Options.TraceflowDays), with their time column.
var ttlTables = []struct {
	table, col string
	days       func(Options) int
}{
	{"flows", "flow_end", ttlDays},
	{"rollup_pod_to_pod_1m", "window_start", ttlDays},
	{"rollup_pod_to_service_1m", "window_start", ttlDays},
	{"rollup_node_to_node_1m", "window_start", ttlDays},
	{"rollup_policy_1m", "window_start", ttlDays},
	{"traceflows", "started", Options.TraceflowDays},
}

func ttlDays(o Options) int { return o.TTLDays }

// reconcileTTL makes each table's TTL match the options, so the
// retention flags can change after the tables were created.
func (r *Runner) reconcileTTL(ctx context.Context) error {
	suffix, oc := "", ""
	if r.opt.Cluster != "" {
		suffix, oc = "_local", " ON CLUSTER '"+r.opt.Cluster+"'"
	}
	for _, t := range ttlTables {
		name := t.table + suffix
		out, err := r.conn.Query(ctx, fmt.Sprintf(
			"SELECT engine_full FROM system.tables WHERE database = %s AND name = %s", chsql.String(r.opt.Database), chsql.String(name)), "TabSeparatedRaw")
		if err != nil {
			return fmt.Errorf("read ttl of %s: %w", name, err)
		}
		engine := string(out)
		if engine == "" {
			continue // table not created by the migrations applied so far
		}
		hasTTL := strings.Contains(engine, " TTL ")
		days := t.days(r.opt)
		want := fmt.Sprintf("toIntervalDay(%d)", days)
		var stmt string
		switch {
		case days == 0 && hasTTL:
			stmt = fmt.Sprintf("ALTER TABLE %s.%s%s REMOVE TTL", r.opt.Database, name, oc)
		case days > 0 && !strings.Contains(engine, want):
			stmt = fmt.Sprintf("ALTER TABLE %s.%s%s MODIFY %s", r.opt.Database, name, oc, ttlClause(t.col, days))
		default:
			continue
		}
		if err := r.conn.Exec(ctx, stmt); err != nil {
			return fmt.Errorf("set ttl of %s: %w", name, err)
		}
	}
	return nil
}

// RenderAll renders every migration for opt, for `dualflow migrate --print`.
func RenderAll(opt Options) (string, error) {
	all, err := All()
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, m := range all {
		stmts, err := Render(m, opt)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "-- %s\n", m.Name)
		for _, s := range stmts {
			b.WriteString(s)
			b.WriteString(";\n\n")
		}
	}
	return b.String(), nil
}

func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "--") {
			if len(l) > 80 {
				l = l[:80] + "…"
			}
			return l
		}
	}
	return ""
}
