// Package chdb embeds the ClickHouse engine (chDB's libchdb.so) in the
// process through purego, so it builds and vets with CGO_ENABLED=0 and needs
// the library only at run time.
//
// Nothing happens at import: the library is loaded on the first Open, found
// by FindLibrary. chDB runs one data directory per process, and one process
// per data directory: Open fails with ErrOtherDir or ErrLocked otherwise.
//
// A DB keeps a small pool of engine connections. Each statement takes one
// connection for itself (chDB runs one statement per connection at a time),
// so up to Config.MaxConns statements run in parallel. Per-statement
// settings (Statement.Settings) are applied as connection-level settings of
// a pooled connection dedicated to that set of settings, which is how
// readonly=1 and friends get exactly ClickHouse's semantics.
package chdb

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dualflow/dualflow/internal/defaults"
)

// Config configures Open.
type Config struct {
	// LibPath is the path of libchdb.so; empty searches as FindLibrary does.
	LibPath string
	// DataDir is the engine's data directory, created if missing. Empty
	// means a throwaway engine in a new temporary directory, removed when
	// the process's last DB closes: its tables vanish on Close.
	DataDir string
	// MaxMemoryBytes caps the engine's total memory
	// (max_server_memory_usage); 0 leaves the engine's default (90% of RAM).
	// It only takes effect when this Open boots the engine.
	MaxMemoryBytes uint64
	// MaxConns caps statements running at once; further calls wait for a
	// free connection or for their context. 0 means DefaultMaxConns.
	MaxConns int
	// ExtraConfig is XML added inside the engine's configuration file (for
	// example a remote_servers cluster definition, in tests). It only
	// takes effect when this Open boots the engine. The engine reads no
	// other configuration: not a config.xml in the working directory.
	ExtraConfig string
}

// DefaultMaxConns is the default Config.MaxConns: enough to overlap an
// insert stream with a few queries on a small machine.
const DefaultMaxConns = 4

// maxIdlePerKey caps idle connections kept per distinct settings set;
// beyond it a released connection is closed.
const maxIdlePerKey = 2

// insertChunk is the size of the pieces Insert hands to chdb_stream_append
// (which copies them): big enough to amortize the call, small enough to
// keep the extra copy cheap.
const insertChunk = 1 << 20

// Buffers is insert data held in several buffers, sent in order. Insert
// passes them to the engine without copying them first; as an io.Reader
// it reads them in order, consuming them.
type Buffers [][]byte

// Read implements io.Reader.
func (b *Buffers) Read(p []byte) (int, error) {
	n := 0
	for len(*b) > 0 && n < len(p) {
		c := copy(p[n:], (*b)[0])
		n += c
		if (*b)[0] = (*b)[0][c:]; len((*b)[0]) == 0 {
			*b = (*b)[1:]
		}
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	return n, nil
}

// Statement is one SQL statement with its per-statement options.
type Statement struct {
	// Query is the SQL text. A FORMAT clause in it overrides Format.
	Query string
	// Format is the output format ("TabSeparated", "JSONEachRow", "Native",
	// ...); empty means TabSeparated, like ClickHouse's HTTP interface.
	Format string
	// Params binds server-side {name:Type} placeholders.
	Params map[string]string
	// Settings are ClickHouse settings for this statement only (name → value
	// as in SET), e.g. readonly=1, max_result_rows=1000,
	// max_execution_time=10. An unknown name fails with code 115.
	Settings map[string]string
	// Database is the current database for the statement; empty means
	// "default".
	Database string
}

// Stats are the engine's counters for one statement.
type Stats struct {
	RowsRead, BytesRead       uint64 // rows/bytes in the result (storage counters for inserts are 0)
	RowsWritten, BytesWritten uint64 // rows/bytes written (includes materialized views)
	Elapsed                   time.Duration
}

// Result is a statement's output.
type Result struct {
	Data []byte // in the requested format; owned by the caller
	Stats
}

// DB is an open embedded ClickHouse engine. It is safe for concurrent use.
type DB struct {
	l      *lib
	dir    string // data directory, or "" for a throwaway engine
	path   string // the engine's --path: dir, or the throwaway engine's temporary directory
	anchor *uintptr
	slots  chan struct{} // one token per connection in use

	mu       sync.Mutex
	idle     map[string][]*uintptr // settings key → idle connections
	closed   bool
	known    map[string]bool // setting names the engine knows; nil until needed
	knownErr error
}

// engine is the process-wide state of libchdb: which data directory it
// runs and how many DBs use it.
var engine struct {
	sync.Mutex
	dir  string
	path string // dir, or the temporary directory of a throwaway engine
	dbs  int
}

// privateDir creates dir for its owner only, and takes group and other
// access away from an existing one: the engine writes its files 0644, and
// the flows (and the HTTP interface's users file) are nobody else's to read.
func privateDir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	fi, err := os.Stat(dir)
	if err != nil {
		return err
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return os.Chmod(dir, perm&^0o077)
	}
	return nil
}

// Open loads libchdb.so if needed and connects to the engine on
// cfg.DataDir. It fails with ErrLocked (wrapped) when another process owns
// the directory, with ErrOtherDir when this process has another directory
// open, and with ErrLibraryNotFound when libchdb.so is missing.
func Open(cfg Config) (*DB, error) {
	dir := ""
	if cfg.DataDir != "" {
		abs, err := filepath.Abs(cfg.DataDir)
		if err != nil {
			return nil, fmt.Errorf("chdb: data dir: %w", err)
		}
		if err := privateDir(abs); err != nil {
			return nil, fmt.Errorf("chdb: data dir: %w", err)
		}
		dir = abs
	}
	l, err := loadLibrary(cfg.LibPath)
	if err != nil {
		return nil, err
	}
	maxConns := defaults.Positive(cfg.MaxConns, DefaultMaxConns)

	engine.Lock()
	defer engine.Unlock()
	if engine.dbs > 0 && engine.dir != dir {
		return nil, fmt.Errorf("open %s (open: %s): %w", displayDir(dir), displayDir(engine.dir), ErrOtherDir)
	}
	path := dir
	if engine.dbs > 0 {
		path = engine.path
	} else if dir == "" {
		// A throwaway engine: the engine takes --path=:memory: for a
		// directory of that name in the working directory, so give it a
		// temporary one.
		tmp, err := os.MkdirTemp("", "dualflow-chdb-")
		if err != nil {
			return nil, fmt.Errorf("chdb: temporary data dir: %w", err)
		}
		path = tmp
	}
	removeTemp := func() {
		if dir == "" && engine.dbs == 0 {
			_ = os.RemoveAll(path)
		}
	}
	confine, err := writeConfinement(path, cfg.ExtraConfig)
	if err != nil {
		removeTemp()
		return nil, err
	}
	args := []string{"--path=" + path, confine}
	if cfg.MaxMemoryBytes > 0 {
		args = append(args, fmt.Sprintf("--max_server_memory_usage=%d", cfg.MaxMemoryBytes))
	}
	anchor := l.connectArgs(args)
	if anchor == nil {
		removeTemp()
		if engine.dbs == 0 && dir != "" {
			if locked, holder := lockedBy(dir); locked {
				if holder != "" {
					return nil, fmt.Errorf("open %s (held by %s): %w", dir, holder, ErrLocked)
				}
				return nil, fmt.Errorf("open %s: %w", dir, ErrLocked)
			}
		}
		return nil, fmt.Errorf("chdb: connect to %s failed (see stderr for the engine's message)", displayDir(dir))
	}
	engine.dir, engine.path = dir, path
	engine.dbs++
	return &DB{
		l:      l,
		dir:    dir,
		path:   path,
		anchor: anchor,
		slots:  make(chan struct{}, maxConns),
		idle:   make(map[string][]*uintptr),
	}, nil
}

// DirHolder reports whether another process holds the engine on dir, and
// its description from the engine's lock file ("PID: 123 Started at:
// ..."), so that a caller can refuse before it starts anything else (Open
// fails with ErrLocked then). Call it only when this process has no
// engine open on dir.
func DirHolder(dir string) (held bool, holder string) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return false, ""
	}
	return lockedBy(abs)
}

func displayDir(dir string) string {
	if dir == "" {
		return ":memory:"
	}
	return dir
}

// Version returns the engine's version() string, e.g. "26.7.2.1".
func (db *DB) Version(ctx context.Context) (string, error) {
	out, err := db.Query(ctx, "SELECT version()", "TabSeparated")
	return strings.TrimSpace(string(out)), err
}

// Query runs query and returns its output in format (empty: TabSeparated).
func (db *DB) Query(ctx context.Context, query, format string) ([]byte, error) {
	res, err := db.Run(ctx, Statement{Query: query, Format: format})
	if err != nil {
		return nil, err
	}
	return res.Data, nil
}

// QueryWithParams is Query with server-side {name:Type} parameters: the
// engine parses the values as the placeholder types, nothing is spliced
// into the SQL text.
func (db *DB) QueryWithParams(ctx context.Context, query, format string, params map[string]string) ([]byte, error) {
	res, err := db.Run(ctx, Statement{Query: query, Format: format, Params: params})
	if err != nil {
		return nil, err
	}
	return res.Data, nil
}

// Exec runs a statement that returns no rows (DDL, INSERT ... SELECT).
func (db *DB) Exec(ctx context.Context, query string) error {
	_, err := db.Run(ctx, Statement{Query: query, Format: "Null"})
	return err
}

// Run runs one statement with its options. It blocks until the engine
// finishes the statement or, once ctx ends, until the engine has killed it
// (killOnDone); Settings["max_execution_time"] bounds a statement without
// a deadline on ctx.
func (db *DB) Run(ctx context.Context, st Statement) (res *Result, err error) {
	if ins, ok := SplitInsert(st.Query); ok && ins.DataOffset < len(st.Query) && len(st.Params) == 0 {
		// INSERT ... VALUES (...) or FORMAT x with inline data: stream the
		// data rather than parse it as query text.
		stats, err := db.InsertStatement(ctx, st, nil)
		if err != nil {
			return nil, err
		}
		return &Result{Stats: stats}, nil
	}
	if strings.IndexByte(st.Query, 0) >= 0 {
		// The engine would stop reading the text at the NUL and run a prefix.
		return nil, &Error{Code: CodeSyntaxError, Name: "SYNTAX_ERROR", Message: "Syntax error: null character in query text. (SYNTAX_ERROR)"}
	}
	c, err := db.acquire(ctx, st)
	if err != nil {
		return nil, err
	}
	var over func(error) error
	st.Query, over = db.killOnDone(ctx, st.Query)
	res, err = db.l.run(*c.h, st)
	err = over(err)
	db.release(c, st.Query, err != nil)
	return res, err
}

var queryTag atomic.Uint64

// killOnDone tags query so that the end of ctx KILLs the statement in the
// engine, and returns the tagged query and the function to call with the
// statement's error once it is over. That function stops the watch; when
// the kill fired it waits for it (so a kill never outlives the DB) and
// reports a failure as the cancellation, not as the kill; a statement that
// finished first keeps its result. The tag goes last, in a comment, so
// error positions in the text stay right, and is dropped from engine
// messages.
func (db *DB) killOnDone(ctx context.Context, query string) (string, func(error) error) {
	if ctx.Done() == nil {
		return query, func(err error) error { return err }
	}
	tag := fmt.Sprintf("dualflow-q:%x", queryTag.Add(1))
	suffix := "\n/* " + tag + " */"
	killed := make(chan struct{}) // closed when a started kill is done
	stop := context.AfterFunc(ctx, func() {
		defer close(killed)
		db.kill(tag)
	})
	return query + suffix, func(err error) error {
		var ce *Error
		if errors.As(err, &ce) {
			ce.Message = strings.ReplaceAll(ce.Message, suffix, "")
		}
		if !stop() {
			<-killed
			if err != nil && !errors.Is(err, ctx.Err()) {
				err = fmt.Errorf("chdb: statement cancelled: %w (engine: %v)", ctx.Err(), err)
			}
		}
		return err
	}
}

// kill asks the engine to cancel the statement carrying tag. The pattern is
// split so the KILL statement does not match itself.
func (db *DB) kill(tag string) {
	prefix, rest, _ := strings.Cut(tag, ":")
	h := db.l.connectArgs([]string{"--path=" + db.path})
	if h == nil {
		return
	}
	defer db.l.closeConn(h)
	q := fmt.Sprintf("KILL QUERY WHERE query LIKE concat('%%', '%s', ':', '%s', '%%') ASYNC", prefix, rest)
	_, _ = db.l.run(*h, Statement{Query: q, Format: "Null"})
}

// Insert streams data, encoded in the format named by insertQuery's FORMAT
// clause (e.g. "INSERT INTO db.t (a, b) SETTINGS insert_deduplication_token='x'
// FORMAT RowBinary"), into the engine in chunks, and returns the rows
// written (including rows written by materialized views). INSERT ... VALUES
// works too, with the tuples as data. Inline data after the FORMAT clause
// is sent before data. ctx is checked between chunks, and once the data is
// sent the engine's work is killed when ctx ends: a cancelled insert
// returns soon, with ctx's error. Like any interrupted insert, it may have
// committed to some of the tables it writes (the target, each view's) and
// not others: retry it with the same insert_deduplication_token.
func (db *DB) Insert(ctx context.Context, insertQuery string, data io.Reader) (uint64, error) {
	stats, err := db.InsertStatement(ctx, Statement{Query: insertQuery}, data)
	return stats.RowsWritten, err
}

// InsertStatement is Insert with per-statement options (st.Format and
// st.Params are ignored).
func (db *DB) InsertStatement(ctx context.Context, st Statement, data io.Reader) (Stats, error) {
	ins, ok := SplitInsert(st.Query)
	if !ok {
		return Stats{}, fmt.Errorf("chdb: insert: not an INSERT ... FORMAT/VALUES statement: %.80q", st.Query)
	}
	if data == nil {
		data = strings.NewReader("")
	}
	if ins.DataOffset < len(st.Query) {
		data = io.MultiReader(strings.NewReader(st.Query[ins.DataOffset:]), data)
	}
	c, err := db.acquire(ctx, st)
	if err != nil {
		return Stats{}, err
	}
	// ctx is checked between chunks of data; once they are all sent the
	// engine finishes the insert (parts, materialized views) in one call,
	// which the kill interrupts.
	query, over := db.killOnDone(ctx, ins.Query)
	stats, err := db.l.insert(ctx, *c.h, query, ins.Format, data)
	err = over(err)
	db.release(c, "", err != nil)
	return stats, err
}

// Close closes every connection of db. Statements still running finish
// first. Closing the last DB of the process shuts the engine down and
// releases the data directory.
func (db *DB) Close() error {
	// Take every slot so no statement is running.
	for range cap(db.slots) {
		db.slots <- struct{}{}
	}
	db.mu.Lock()
	if db.closed {
		db.mu.Unlock()
		return nil
	}
	db.closed = true
	for k, conns := range db.idle {
		for _, c := range conns {
			db.l.closeConn(c)
		}
		delete(db.idle, k)
	}
	db.mu.Unlock()
	for range cap(db.slots) {
		<-db.slots
	}

	engine.Lock()
	defer engine.Unlock()
	db.l.closeConn(db.anchor)
	engine.dbs--
	if engine.dbs == 0 {
		if engine.dir == "" {
			_ = os.RemoveAll(engine.path)
		}
		engine.dir, engine.path = "", ""
	}
	return nil
}
