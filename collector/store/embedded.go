package store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/internal/chsql"
)

// EmbeddedConfig configures the in-process chDB engine.
type EmbeddedConfig struct {
	// LibPath is libchdb.so; empty searches the usual places (see chdb.FindLibrary).
	LibPath string
	// DataDir holds the data. One process owns a directory at a time.
	DataDir string
	// MaxMemoryBytes caps the engine's memory (0: ClickHouse's default).
	MaxMemoryBytes uint64
	// Database qualifies unqualified table names. Default "dualflow".
	Database string
}

// Embedded is a Conn to the chDB engine loaded in this process.
type Embedded struct {
	db       *chdb.DB
	database string

	mu     sync.Mutex       // guards native
	native []*nativeBuilder // idle builders, reused between inserts of the flows layout
}

var _ Conn = (*Embedded)(nil)

// NewEmbedded loads libchdb (once per process) and opens cfg.DataDir.
func NewEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	if cfg.DataDir == "" {
		return nil, fmt.Errorf("embedded clickhouse: data directory is required")
	}
	db, err := chdb.Open(chdb.Config{LibPath: cfg.LibPath, DataDir: cfg.DataDir, MaxMemoryBytes: cfg.MaxMemoryBytes})
	if err != nil {
		return nil, err
	}
	return &Embedded{db: db, database: cmp.Or(cfg.Database, "dualflow")}, nil
}

// DB returns the engine, for the ClickHouse HTTP interface.
func (e *Embedded) DB() *chdb.DB { return e.db }

// Exec implements Conn.
func (e *Embedded) Exec(ctx context.Context, query string) error { return e.db.Exec(ctx, query) }

// Query implements Conn.
func (e *Embedded) Query(ctx context.Context, query, format string) ([]byte, error) {
	return e.db.Query(ctx, query, format)
}

// InsertRowBinary implements Conn through chDB's streaming insert.
func (e *Embedded) InsertRowBinary(ctx context.Context, table string, columns []string, dedupToken string, rows int, data []byte) error {
	if !slices.Equal(columns, FlowColumns) {
		return e.insert(ctx, table, columns, dedupToken, "RowBinary", bytes.NewReader(data), rows)
	}
	// Columnar input is ~2x cheaper for the engine to parse (see native.go).
	nb := e.builder()
	defer e.release(nb)
	block, err := nb.build(columns, flowWire, rows, data)
	if err != nil {
		return fmt.Errorf("insert into %s: %w", table, err)
	}
	bufs := chdb.Buffers(block)
	return e.insert(ctx, table, flowNativeColumns, dedupToken, "Native", &bufs, rows)
}

// insertColumns inserts a flows batch the writer encoded column by column
// (see columnar.go).
func (e *Embedded) insertColumns(ctx context.Context, table, dedupToken string, nb *nativeBuilder) error {
	bufs := chdb.Buffers(nb.assemble(FlowColumns, flowWire))
	return e.insert(ctx, table, flowNativeColumns, dedupToken, "Native", &bufs, nb.rows)
}

var _ columnarConn = (*Embedded)(nil)

// insert streams body, rows rows in format, into table.
func (e *Embedded) insert(ctx context.Context, table string, columns []string, dedupToken, format string, body io.Reader, rows int) error {
	q := insertQuery(qualify(e.database, table), columns, dedupToken, format, false)
	n, err := e.db.Insert(ctx, q, body)
	if err != nil {
		var ce *chdb.Error
		if errors.As(err, &ce) {
			err = markTemporary(ce.Code, err)
		}
		return fmt.Errorf("insert %d rows into %s: %w", rows, table, err)
	}
	// The engine counts rows written to the table and to every materialized
	// view behind it; a deduplicated replay writes 0 rows, which is success.
	if n != 0 && n < uint64(rows) {
		return fmt.Errorf("insert into %s: engine wrote %d rows of %d", table, n, rows)
	}
	return nil
}

const maxIdleBuilders = 1

// builder returns an idle Native builder; concurrent inserts use their own.
func (e *Embedded) builder() *nativeBuilder {
	e.mu.Lock()
	defer e.mu.Unlock()
	if n := len(e.native); n > 0 {
		nb := e.native[n-1]
		e.native = e.native[:n-1]
		return nb
	}
	return new(nativeBuilder)
}

// release keeps nb for the next RowBinary insert: up to maxIdleBuilders,
// each holding a batch-sized block. The writer's own batches come as columns
// (insertColumns); RowBinary batches are the spool replay's, one at a time.
func (e *Embedded) release(nb *nativeBuilder) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.native) < maxIdleBuilders {
		e.native = append(e.native, nb)
	}
}

// flowNativeColumns are the columns of the flows Native block.
var flowNativeColumns = nativeColumns(FlowColumns, flowWire)

// Close implements Conn.
func (e *Embedded) Close() error { return e.db.Close() }

// insertQuery builds the INSERT with the deduplication settings, and with
// syncDistributed a synchronous insert through a Distributed table.
func insertQuery(table string, columns []string, dedupToken, format string, syncDistributed bool) string {
	var b strings.Builder
	b.WriteString("INSERT INTO ")
	b.WriteString(table)
	b.WriteString(" (")
	b.WriteString(strings.Join(columns, ", "))
	b.WriteString(")")
	// Materialized views (the rollups) run in parallel threads, and their
	// already-aggregated blocks skip the insert-time merge.
	b.WriteString(" SETTINGS parallel_view_processing = 1, optimize_on_insert = 0")
	if dedupToken != "" {
		// The token is generated by the writer (hex); quote defensively anyway.
		b.WriteString(", insert_deduplication_token = " + chsql.String(dedupToken) + ", deduplicate_blocks_in_dependent_materialized_views = 1")
	}
	if syncDistributed {
		b.WriteString(", " + distributedSyncSetting + " = 1")
	}
	b.WriteString(" FORMAT ")
	b.WriteString(format)
	return b.String()
}

// sqlSeq numbers the operator statements of RunSQL.
var sqlSeq atomic.Uint64

// RunSQL runs one statement of an operator's (POST /api/v1/sql, dualflow
// sql) in the store's database, with settings as the statement's
// connection settings (the limits, readonly), and returns its output in
// format.
func (e *Embedded) RunSQL(ctx context.Context, query, format string, settings map[string]string) ([]byte, error) {
	// A unique log_comment gives every statement its own engine
	// connection: the engine's pool hands a connection whose statement
	// failed while writing its output (result_overflow_mode=throw) to the
	// next statement with the same settings, which then gets the failed
	// statement's stale output (see TestSQLReadOnlyAndLimits in web/api).
	// The comment also tags the query in system.query_log.
	st := chdb.Statement{Query: query, Format: format, Settings: maps.Clone(settings), Database: e.database}
	if st.Settings == nil {
		st.Settings = map[string]string{}
	}
	st.Settings["log_comment"] = sqlComment()
	res, err := e.db.Run(ctx, st)
	if err != nil {
		return nil, err
	}
	return res.Data, nil
}

// sqlComment tags an operator statement in the query log.
func sqlComment() string { return fmt.Sprintf("dualflow-sql-%d", sqlSeq.Add(1)) }
