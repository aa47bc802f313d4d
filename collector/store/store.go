// Package store writes flow records to ClickHouse and runs queries against it.
//
// Two backends implement Conn: the embedded chDB engine loaded in-process
// (NewEmbedded, the default), and a ClickHouse server reached through
// clickhouse-go/v2 (NewServer). The Writer batches records, encodes them once
// as RowBinary, retries with backoff and spools to disk while ClickHouse is
// unreachable.
package store

import (
	"context"
	"errors"
)

// Conn is the small surface the writer, the migration runner and
// `dualflow sql` need from ClickHouse. Implementations are safe for
// concurrent use.
type Conn interface {
	// Exec runs one statement that returns no rows (DDL, INSERT ... SELECT).
	Exec(ctx context.Context, query string) error
	// Query runs one statement and returns its output in the given
	// ClickHouse output format (TSV, JSONEachRow, PrettyCompact, …).
	Query(ctx context.Context, query, format string) ([]byte, error)
	// InsertRowBinary inserts rows rows encoded as RowBinary into table,
	// with the given column list. dedupToken, when not empty, is passed as
	// insert_deduplication_token so a replayed batch is written once.
	InsertRowBinary(ctx context.Context, table string, columns []string, dedupToken string, rows int, data []byte) error
	// Close releases the connection.
	Close() error
}

// ErrUnavailable wraps errors that mean ClickHouse could not be reached (as
// opposed to a bad query). The writer retries and spools on it.
var ErrUnavailable = errors.New("clickhouse unavailable")
