// Package store writes flow records to ClickHouse and runs queries against it.
//
// Two backends implement Conn: the embedded chDB engine loaded in-process
// (NewEmbedded, the default), and a ClickHouse server reached through
// clickhouse-go/v2 (NewServer). The Writer batches records, encodes each once
// (for the embedded engine straight into the columns of a Native block, for a
// server as RowBinary rows), retries with backoff and spools to disk, as
// RowBinary, while ClickHouse is unreachable.
package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/ClickHouse/ch-go/proto"

	"github.com/dualflow/dualflow/collector/store/chdb"
)

// Conn is the small surface the writer, the migration runner and
// `dualflow sql` need from ClickHouse. Implementations are safe for
// concurrent use, honour ctx (a Conn that ignores it can stall the writer's
// shutdown), and do not keep the data slice after returning (the writer
// reuses its buffers). Errors that mean "try again later" wrap
// ErrUnavailable.
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

// temporaryCode reports whether a ClickHouse exception code clears up by
// itself (overload, memory pressure, a replica catching up): the writer
// retries and spools on those instead of treating the batch as refused.
func temporaryCode(code int) bool {
	switch proto.Error(code) {
	case proto.ErrTimeoutExceeded, proto.ErrTooManySimultaneousQueries, proto.ErrSocketTimeout, proto.ErrNetworkError,
		proto.ErrMemoryLimitExceeded, proto.ErrTooManyParts, proto.ErrTooFewLiveReplicas, proto.ErrUnknownStatusOfInsert,
		proto.ErrKeeperException,
		proto.ErrTableIsReadOnly,   // a replica lost its Keeper session
		proto.ErrQueryWasCancelled: // KILL QUERY, a server stopping: not a refusal of the rows
		return true
	}
	return false
}

// Exception is an exception a ClickHouse server answered with: the
// statement was refused (a user's query, a limit), as chdb.Error is for
// the embedded engine. Errors that wrap it may also wrap ErrUnavailable
// (a temporary code) or ErrForbidden.
type Exception struct {
	Code    int
	Message string
}

func (e *Exception) Error() string { return e.Message }

// ErrForbidden wraps a refusal for lack of rights: the user may not do
// that (READONLY, ACCESS_DENIED), as the inserter of `dualflow store` may
// not apply migrations.
var ErrForbidden = errors.New("clickhouse user may not do this")

// markTemporary wraps err with ErrUnavailable when code is temporary, and
// with ErrForbidden when it refuses for lack of rights.
func markTemporary(code int, err error) error {
	switch {
	case err == nil:
		return nil
	case temporaryCode(code):
		return fmt.Errorf("%w: %w", ErrUnavailable, err)
	case code == int(proto.ErrReadonly) || code == int(proto.ErrAccessDenied):
		return fmt.Errorf("%w: %w", ErrForbidden, err)
	}
	return err
}

// Forbidden reports whether err refuses a statement for lack of rights.
func Forbidden(err error) bool {
	var ce *chdb.Error
	return errors.Is(err, ErrForbidden) || (errors.As(err, &ce) && (ce.Code == 164 || ce.Code == 497))
}
