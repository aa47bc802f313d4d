// Package sqlguard decides whether a SQL statement may run for a user,
// from the engine's own parse of it, not from the query text, so
// comments, case, quoting and whitespace cannot hide anything.
//
// Users' SQL reaches the embedded engine (chDB, clickhouse-local) through
// POST /api/v1/sql, the ClickHouse HTTP interface and `dualflow sql`. The
// engine runs every statement of a text, writes INTO OUTFILE itself (the
// client side of clickhouse-local, where no grant is checked), and lets
// KILL QUERY cancel the collector's own inserts. Two checks:
//
//   - Vet, for read-only users (the reader, GET requests, /sql): the text
//     must be one statement whose parse is a read-only query, by an
//     allowlist: SELECT (WITH, UNION, INTERSECT, subqueries, joins,
//     windows), DESCRIBE, SHOW TABLES/COLUMNS/CREATE TABLE, EXISTS, and
//     EXPLAIN of those; only the AST nodes such queries have; no INTO
//     OUTFILE; no SETTINGS (a setting could loosen a bound); table
//     functions only from a list that reads nothing but its arguments; no
//     file() function; and of the system database only the tables that
//     describe the schema and the server (not system.processes or the
//     logs, which show other users' queries). Everything else is refused,
//     with the reason.
//   - VetStatement, for users who may write (INSERT, DDL): one statement,
//     and no INTO OUTFILE, as a ClickHouse server's HTTP interface.
//
// Both first have the engine format the text as one statement inside a
// string literal (formatQuery: nothing runs), so a second statement never
// reaches it. The engine refuses on its own what reaches outside its data
// directory whoever asks (chdb's grants); this package is the first layer,
// and the only one for INTO OUTFILE.
//
//	if err := sqlguard.Vet(ctx, run, "dualflow", q); err != nil { ... refused, or not one statement: err says why ... }
//	out, err := run(ctx, q, format) // with readonly=1 and the limits
//
// Vet, VetStatement and Check are safe for concurrent use.
package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/internal/chsql"
)

// Runner runs one statement on the engine and returns its output in
// format. Vet's callers pass the runner that will run the query, with the
// same read-only settings.
type Runner func(ctx context.Context, query, format string) ([]byte, error)

// ErrNotAccepted matches (errors.Is) a NotAcceptedError.
var ErrNotAccepted = errors.New("not one statement the engine accepts")

// NotAcceptedError carries the engine's error for a text it does not
// accept as one statement under the caller's settings: a syntax error,
// several statements, a setting readonly=1 forbids.
type NotAcceptedError struct{ Err error }

func (e *NotAcceptedError) Error() string        { return ErrNotAccepted.Error() + ": " + e.Err.Error() }
func (e *NotAcceptedError) Unwrap() error        { return e.Err }
func (e *NotAcceptedError) Is(target error) bool { return target == ErrNotAccepted }

// Vet checks a read-only user's query on the engine through run, database
// being the statement's current database: it must parse as exactly one
// statement, hold no INTO OUTFILE, and Check must accept its parse. It
// returns a *NotAcceptedError (the engine's error) or a *RefusedError.
func Vet(ctx context.Context, run Runner, database, query string) error {
	if err := VetStatement(ctx, run, query); err != nil {
		return err
	}
	ast, err := run(ctx, Explain(query), "TabSeparatedRaw")
	if err != nil {
		return &NotAcceptedError{err}
	}
	return Check(string(ast), database)
}

// VetStatement checks the query of a user who may write: it must parse as
// exactly one statement, and hold no INTO OUTFILE (read in the engine's
// own formatting of the statement, where comments are gone and strings
// and identifiers are quoted one way, and in the text as sent).
func VetStatement(ctx context.Context, run Runner, query string) error {
	formatted, err := run(ctx, "SELECT formatQuery("+chsql.String(query)+")", "TabSeparatedRaw")
	if err != nil {
		return &NotAcceptedError{err}
	}
	if chdb.IntoOutfile(string(formatted)) || chdb.IntoOutfile(query) {
		return errOutfile
	}
	return nil
}

var errOutfile = &RefusedError{"outfile", "INTO OUTFILE writes a file on the server (query the HTTP interface and save its answer instead)"}

// Explain returns the statement whose output Check reads. Run it only on
// a text Vet's first step proved to be one statement.
func Explain(query string) string { return "EXPLAIN AST " + query }

// RefusedError says why a statement is refused; Reason is a short label
// for metrics (statement, outfile, settings, construct, table_function,
// function, table).
type RefusedError struct {
	Reason string
	Detail string
}

func (e *RefusedError) Error() string { return "refused: " + e.Detail }

// ErrRefused matches every RefusedError with errors.Is.
var ErrRefused = errors.New("refused")

// Is makes errors.Is(err, ErrRefused) true for a RefusedError.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// roots are the statements (the AST's root node, below EXPLAIN) a
// read-only user may run.
var roots = []string{"SelectWithUnionQuery", "DescribeQuery", "ShowTables", "ShowColumns",
	"ShowCreateTableQuery", "ExistsTableQuery", "ExistsDatabaseQuery"}

// nodes are the AST nodes a read-only query may hold; anything else (a
// construct of a newer engine included) is refused. Set (SETTINGS) is
// handled apart: it is refused, but for EXPLAIN's own options.
var nodes = []string{
	"SelectWithUnionQuery", "SelectIntersectExceptQuery", "SelectQuery", "Subquery", "WithElement",
	"ExpressionList", "Identifier", "Literal", "Function", "QueryParameter",
	"Asterisk", "QualifiedAsterisk", "ColumnsRegexpMatcher", "ColumnsListMatcher",
	"QualifiedColumnsRegexpMatcher", "QualifiedColumnsListMatcher", "ColumnsTransformerList",
	"ColumnsApplyTransformer", "ColumnsExceptTransformer", "ColumnsReplaceTransformer",
	"ColumnsReplaceTransformer::Replacement",
	"TablesInSelectQuery", "TablesInSelectQueryElement", "TableExpression", "TableIdentifier",
	"TableJoin", "ArrayJoin", "SampleRatio",
	"OrderByElement", "InterpolateElement", "WindowDefinition", "WindowListElement",
	"DescribeQuery", "ShowTables", "ShowColumns", "ShowCreateTableQuery", "ExistsTableQuery", "ExistsDatabaseQuery",
}

// TableFunctions are the table functions a query may use: they read
// nothing but their arguments. Every other one (file, url, s3, remote,
// cluster, executable, input, mysql, postgresql, jdbc, odbc, hdfs,
// azureBlobStorage, iceberg, and merge and dictionary, which reach any
// table by name or pattern, the system database's included) is refused.
var TableFunctions = []string{"numbers", "numbers_mt", "zeros", "zeros_mt", "generaterandom", "values", "format",
	"view", "null", "generate_series", "generateseries"}

// hostFunctions are ordinary functions that reach the host.
var hostFunctions = []string{"file"}

// SystemTables are the tables of the system database a read-only user may
// read: they describe the schema, the data's parts and the server. The
// others are refused, system.processes, query_log, text_log, errors and the
// other logs first: they show other users' query text, the collector's
// included.
var SystemTables = []string{"one", "numbers", "numbers_mt", "zeros", "zeros_mt",
	"databases", "tables", "columns", "functions", "table_functions", "table_engines", "formats",
	"data_type_families", "settings", "merge_tree_settings", "time_zones", "collations",
	"aggregate_function_combinators", "build_options", "licenses", "contributors",
	"parts", "parts_columns", "projection_parts", "projections", "data_skipping_indices",
	"detached_parts", "merges", "mutations", "disks", "storage_policies",
	"metrics", "events", "asynchronous_metrics", "keywords"}

// systemDatabases name the system database; INFORMATION_SCHEMA describes
// the schema only and may be read.
var systemDatabases = []string{"system"}

// node is one line of EXPLAIN AST: its depth, text and children.
type node struct {
	depth    int
	text     string
	children []int
	parent   int // -1 for a root
}

// kind is a node's first word (SelectQuery, Function, Literal, ...).
func (n node) kind() string {
	k, _, _ := strings.Cut(n.text, " ")
	return k
}

// name is a node's second word: the function or identifier name.
func (n node) name() string {
	_, rest, _ := strings.Cut(n.text, " ")
	name, _, _ := strings.Cut(rest, " ")
	return name
}

func parse(ast string) []node {
	var out []node
	var stack []int // indexes of the open ancestors, by depth
	for line := range strings.SplitSeq(ast, "\n") {
		t := strings.TrimLeft(line, " ")
		if strings.TrimSpace(t) == "" {
			continue
		}
		n := node{depth: len(line) - len(t), text: strings.TrimRight(t, " \r"), parent: -1}
		for len(stack) > 0 && out[stack[len(stack)-1]].depth >= n.depth {
			stack = stack[:len(stack)-1]
		}
		i := len(out)
		if len(stack) > 0 {
			n.parent = stack[len(stack)-1]
			out[n.parent].children = append(out[n.parent].children, i)
		}
		out = append(out, n)
		stack = append(stack, i)
	}
	return out
}

// Check returns nil when the statement parsed into ast (EXPLAIN AST's
// output) is a read-only query that stays inside the store, else a
// *RefusedError. database is the statement's current database (for the
// tables it names without one); "" stands for a database of the store's.
func Check(ast, database string) error {
	ns := parse(ast)
	if len(ns) == 0 {
		return &RefusedError{"statement", "the engine returned no parse of the statement"}
	}
	for i := 1; i < len(ns); i++ {
		if ns[i].parent == -1 {
			return &RefusedError{"statement", "the parse holds more than one statement"}
		}
	}
	root := 0
	// EXPLAIN runs nothing itself: what it explains is checked. Its
	// children are its options (Set, before the query), the query, and
	// its own output options.
	for ns[root].kind() == "Explain" {
		q := -1
		for _, c := range ns[root].children {
			switch k := ns[c].kind(); {
			case k == "Set" && q == -1:
			case k == "Literal":
				return errOutfile
			case k == "Set":
				return errSettings
			case k == "Identifier" && q != -1: // FORMAT
			case q != -1:
				return &RefusedError{"statement", "EXPLAIN of more than one statement"}
			default:
				q = c
			}
		}
		if q == -1 {
			return &RefusedError{"statement", "EXPLAIN of nothing"}
		}
		root = q
	}
	if k := ns[root].kind(); !slices.Contains(roots, k) {
		return &RefusedError{"statement", fmt.Sprintf("%s is not a read-only statement (only SELECT, DESCRIBE, SHOW TABLES, SHOW COLUMNS, SHOW CREATE TABLE, EXISTS and EXPLAIN of them are)", statementName(k))}
	}
	return walk(ns, root, database)
}

var errSettings = &RefusedError{"settings", "SETTINGS in the query: the server's bounds may not change (send output settings as URL parameters)"}

// walk checks node i and everything below it.
func walk(ns []node, i int, database string) error {
	n := ns[i]
	k := n.kind()
	switch {
	case k == "Set":
		return errSettings
	case !slices.Contains(nodes, k):
		return &RefusedError{"construct", fmt.Sprintf("%s is not part of a read-only query", k)}
	case k == "Literal" && n.parent >= 0 && isStatement(ns[n.parent].kind()):
		// A statement's output options: INTO OUTFILE 'file' [COMPRESSION 'x'].
		return errOutfile
	case k == "Function":
		name := strings.ToLower(n.name())
		if n.parent >= 0 && ns[n.parent].kind() == "TableExpression" {
			if !slices.Contains(TableFunctions, name) {
				return &RefusedError{"table_function", fmt.Sprintf("table function %s reaches outside the store (allowed: %s)", n.name(), strings.Join(TableFunctions, ", "))}
			}
		} else if slices.Contains(hostFunctions, name) {
			return &RefusedError{"function", fmt.Sprintf("function %s reads files of the server", n.name())}
		}
	case k == "TableIdentifier" || k == "Identifier":
		if err := checkTable(n.name(), database, k == "TableIdentifier"); err != nil {
			return err
		}
	}
	for _, c := range n.children {
		if err := walk(ns, c, database); err != nil {
			return err
		}
	}
	return nil
}

// isStatement: the node kinds that carry output options (INTO OUTFILE,
// FORMAT, SETTINGS) as children.
func isStatement(kind string) bool {
	return kind == "Explain" || slices.Contains(roots, kind)
}

// checkTable refuses a table of the system database outside SystemTables.
// name is db.table, or table in database (a TableIdentifier), or for a
// plain Identifier a column, alias or db.table (only the last is a table,
// as the right side of IN).
func checkTable(name, database string, isTable bool) error {
	name = strings.Trim(name, "`\"")
	db, table, qualified := strings.Cut(name, ".")
	if !qualified {
		if !isTable {
			return nil
		}
		db, table = database, name
	}
	if !slices.ContainsFunc(systemDatabases, func(s string) bool { return strings.EqualFold(s, db) }) {
		return nil
	}
	if !slices.Contains(SystemTables, strings.ToLower(table)) {
		return &RefusedError{"table", fmt.Sprintf("system.%s is not readable here: it may show other users' queries (readable system tables: %s)", table, strings.Join(SystemTables, ", "))}
	}
	return nil
}

// statementName turns an AST kind into words: KillQueryQuery → KILL QUERY.
func statementName(kind string) string {
	k := strings.TrimSuffix(kind, "Query")
	var b strings.Builder
	for i, r := range k {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte(' ')
		}
		b.WriteRune(r)
	}
	if b.Len() == 0 {
		return kind
	}
	return strings.ToUpper(b.String())
}
