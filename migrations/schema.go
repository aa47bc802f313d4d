package migrations

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dualflow/dualflow/internal/chsql"
)

// The ledger (schema_migrations) says which migrations ran, not that what
// they created is still there: a user with write access can drop a table,
// and a restart then found the ledger complete and the table gone (every
// insert refused, every page an engine error, until the data directory was
// deleted). Reference and Check compare the database with what the
// migrations create, and Repair recreates what is missing.

// Schema is a database's tables and views, by name.
type Schema map[string]Object

// Object is one table or view and its columns.
type Object struct {
	Name   string
	Engine string // MergeTree, MaterializedView, View, ...
	// Create is the engine's own CREATE statement (SHOW CREATE TABLE),
	// naming the database it was read from.
	Create  string
	Columns []Column
}

// Column is one column of an Object.
type Column struct {
	Name        string `json:"name"`
	Type        string `json:"type"`
	DefaultKind string `json:"default_kind"` // DEFAULT, MATERIALIZED, ALIAS, EPHEMERAL or ""
	DefaultExpr string `json:"default_expression"`
}

// isView reports whether the object is a view: it is created after the
// tables it reads and writes.
func (o Object) isView() bool { return strings.HasSuffix(o.Engine, "View") }

// Problem is one difference between a database and the reference.
type Problem struct {
	Kind   string // missing_table, missing_view, missing_column, column_type
	Object string
	Column string
	Detail string
}

func (p Problem) String() string {
	if p.Column != "" {
		return fmt.Sprintf("%s %s.%s: %s", p.Kind, p.Object, p.Column, p.Detail)
	}
	return fmt.Sprintf("%s %s: %s", p.Kind, p.Object, p.Detail)
}

// refPrefix names the scratch databases Reference builds.
const refPrefix = "_ref_"

// Reference applies every migration to a new scratch database on the same
// server and reads back what they created, then drops it. It needs the
// rights Up needs; the cluster form has no reference (nil, nil): its
// tables live on every shard.
func (r *Runner) Reference(ctx context.Context) (Schema, error) {
	if r.opt.Cluster != "" {
		return nil, nil
	}
	// Scratch databases a crash left behind.
	out, err := r.conn.Query(ctx, fmt.Sprintf("SELECT name FROM system.databases WHERE startsWith(name, %s)", chsql.String(r.opt.Database+refPrefix)), "TabSeparatedRaw")
	if err != nil {
		return nil, fmt.Errorf("schema reference: %w", err)
	}
	for _, old := range strings.Fields(string(out)) {
		if identRE.MatchString(old) {
			_ = r.conn.Exec(ctx, "DROP DATABASE IF EXISTS "+old+" SYNC")
		}
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	opt := r.opt
	opt.Database = r.opt.Database + refPrefix + hex.EncodeToString(b[:])
	defer func() { _ = r.conn.Exec(context.WithoutCancel(ctx), "DROP DATABASE IF EXISTS "+opt.Database+" SYNC") }()
	if err := r.conn.Exec(ctx, "CREATE DATABASE "+opt.Database); err != nil {
		return nil, fmt.Errorf("schema reference: %w", err)
	}
	for _, m := range r.all {
		stmts, err := Render(m, opt)
		if err != nil {
			return nil, err
		}
		for i, s := range stmts {
			if err := r.conn.Exec(ctx, s); err != nil {
				return nil, fmt.Errorf("schema reference: migration %s statement %d: %w", m.Name, i+1, err)
			}
		}
	}
	ref, err := read(ctx, r.conn, opt.Database)
	if err != nil {
		return nil, fmt.Errorf("schema reference: %w", err)
	}
	// The statements name the scratch database: name the real one.
	for name, o := range ref {
		o.Create = strings.ReplaceAll(o.Create, opt.Database+".", r.opt.Database+".")
		o.Create = strings.ReplaceAll(o.Create, "`"+opt.Database+"`.", "`"+r.opt.Database+"`.")
		ref[name] = o
	}
	return ref, nil
}

// read returns the tables and views of database db with their columns and
// CREATE statements.
func read(ctx context.Context, c conn, db string) (Schema, error) {
	out, err := c.Query(ctx, fmt.Sprintf("SELECT name, engine FROM system.tables WHERE database = %s AND NOT is_temporary", chsql.String(db)), "JSONEachRow")
	if err != nil {
		return nil, err
	}
	s := Schema{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var o Object
		var row struct{ Name, Engine string }
		if err := dec.Decode(&row); err != nil {
			return nil, fmt.Errorf("read %s's tables: %w", db, err)
		}
		o.Name, o.Engine = row.Name, row.Engine
		s[o.Name] = o
	}
	out, err = c.Query(ctx, fmt.Sprintf("SELECT table, name, type, default_kind, default_expression FROM system.columns WHERE database = %s ORDER BY table, position", chsql.String(db)), "JSONEachRow")
	if err != nil {
		return nil, err
	}
	dec = json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var row struct {
			Table string `json:"table"`
			Column
		}
		if err := dec.Decode(&row); err != nil {
			return nil, fmt.Errorf("read %s's columns: %w", db, err)
		}
		if o, ok := s[row.Table]; ok {
			o.Columns = append(o.Columns, row.Column)
			s[row.Table] = o
		}
	}
	for name, o := range s {
		create, err := c.Query(ctx, fmt.Sprintf("SHOW CREATE TABLE %s.`%s`", db, name), "TabSeparatedRaw")
		if err != nil {
			return nil, fmt.Errorf("read %s.%s: %w", db, name, err)
		}
		o.Create = strings.TrimSpace(string(create))
		s[name] = o
	}
	return s, nil
}

// Check compares the database with ref (Reference) and returns what it
// lacks: objects, columns, and columns of another type. The bookkeeping
// table is not part of it (Up creates it).
func (r *Runner) Check(ctx context.Context, ref Schema) ([]Problem, error) {
	if ref == nil {
		return nil, nil
	}
	have, err := read(ctx, r.conn, r.opt.Database)
	if err != nil {
		return nil, fmt.Errorf("schema check: %w", err)
	}
	var out []Problem
	for _, name := range slices.Sorted(maps.Keys(ref)) {
		want := ref[name]
		got, ok := have[name]
		if !ok {
			kind := "missing_table"
			if want.isView() {
				kind = "missing_view"
			}
			out = append(out, Problem{Kind: kind, Object: name, Detail: "created by the migrations, not in " + r.opt.Database})
			continue
		}
		for _, wc := range want.Columns {
			i := slices.IndexFunc(got.Columns, func(c Column) bool { return c.Name == wc.Name })
			switch {
			case i < 0:
				out = append(out, Problem{Kind: "missing_column", Object: name, Column: wc.Name, Detail: wc.Type})
			case got.Columns[i].Type != wc.Type:
				out = append(out, Problem{Kind: "column_type", Object: name, Column: wc.Name,
					Detail: fmt.Sprintf("is %s, the migrations make it %s", got.Columns[i].Type, wc.Type)})
			}
		}
	}
	return out, nil
}

// ErrNotRepairable wraps the problems Repair cannot fix: a column of
// another type (converting it could lose data; say which, and let an
// operator decide).
var ErrNotRepairable = errors.New("schema differs from the migrations in a way dualflow does not repair")

// Repair recreates what Check found missing, from the reference's own
// statements: tables first, then views (which read and write them), then
// columns. It returns what it fixed; a problem it cannot fix is an error
// wrapping ErrNotRepairable.
func (r *Runner) Repair(ctx context.Context, ref Schema, problems []Problem) (fixed []Problem, err error) {
	order := slices.Clone(problems)
	rank := map[string]int{"missing_table": 0, "missing_view": 1, "missing_column": 2, "column_type": 3}
	slices.SortStableFunc(order, func(a, b Problem) int { return rank[a.Kind] - rank[b.Kind] })
	var unfixable []string
	for _, p := range order {
		var stmt string
		switch p.Kind {
		case "missing_table", "missing_view":
			stmt = ref[p.Object].Create
		case "missing_column":
			c := ref[p.Object].Columns[slices.IndexFunc(ref[p.Object].Columns, func(c Column) bool { return c.Name == p.Column })]
			stmt = fmt.Sprintf("ALTER TABLE %s.`%s` ADD COLUMN IF NOT EXISTS `%s` %s", r.opt.Database, p.Object, c.Name, c.Type)
			if c.DefaultKind != "" {
				stmt += " " + c.DefaultKind
				if c.DefaultExpr != "" {
					stmt += " " + c.DefaultExpr
				}
			}
		default:
			unfixable = append(unfixable, p.String())
			continue
		}
		if err := r.conn.Exec(ctx, stmt); err != nil {
			return fixed, fmt.Errorf("repair %s: %w", p, err)
		}
		fixed = append(fixed, p)
	}
	if len(unfixable) > 0 {
		return fixed, fmt.Errorf("%w: %s", ErrNotRepairable, strings.Join(unfixable, "; "))
	}
	return fixed, nil
}

// Keeper keeps a database as the migrations make it: Ensure compares it
// with the reference and repairs it, Err is what the last Ensure left
// unrepaired (readiness fails on it), Run ensures periodically. Safe for
// concurrent use.
type Keeper struct {
	r   *Runner
	ref Schema

	mu  sync.Mutex
	err error
}

// Keeper builds the reference (Reference) and returns its keeper; nil for
// the cluster form, which has no reference.
func (r *Runner) Keeper(ctx context.Context) (*Keeper, error) {
	ref, err := r.Reference(ctx)
	if err != nil || ref == nil {
		return nil, err
	}
	return &Keeper{r: r, ref: ref}, nil
}

// Ensure checks the database and repairs what it lacks; it returns what it
// fixed, and an error for what it could not.
func (k *Keeper) Ensure(ctx context.Context) ([]Problem, error) {
	ps, err := k.r.Check(ctx, k.ref)
	var fixed []Problem
	if err == nil && len(ps) > 0 {
		fixed, err = k.r.Repair(ctx, k.ref, ps)
	}
	k.mu.Lock()
	k.err = err
	k.mu.Unlock()
	return fixed, err
}

// Err is what the last Ensure could not repair or check; nil when the
// schema was whole (or a nil Keeper).
func (k *Keeper) Err() error {
	if k == nil {
		return nil
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.err
}

// Run calls Ensure every interval until ctx ends, and report with each
// outcome that fixed something or failed.
func (k *Keeper) Run(ctx context.Context, every time.Duration, report func(fixed []Problem, err error)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fixed, err := k.Ensure(ctx)
			if ctx.Err() == nil && (len(fixed) > 0 || err != nil) {
				report(fixed, err)
			}
		}
	}
}

// Describe lists problems for a log line.
func Describe(ps []Problem) string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return strings.Join(out, "; ")
}
