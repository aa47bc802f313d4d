// Package sqlguard decides whether a SQL statement is one a read-only
// ClickHouse user could run, from the engine's own parse of it (the text
// of `EXPLAIN AST <query>`), not from the query text, so comments, case,
// quoting and whitespace cannot hide anything.
//
// The embedded engine (chDB, clickhouse-local) runs as the process's user
// with every grant: `readonly=1` still lets a SELECT write files (INTO
// OUTFILE), read them (the file table function and the file() function),
// reach the network (url, s3, remote) or run programs (executable), and
// lets KILL QUERY cancel the collector's own inserts. Check refuses all of
// that and says why:
//
//	if err := sqlguard.Vet(ctx, run, q); err != nil { ... refused, or not one statement: err says why ... }
//	out, err := run(ctx, q, format) // with readonly=1 and the limits
//
// The engine runs every statement of a text with several (clickhouse-local
// does), so Vet first has the engine parse the text as one statement
// inside a string literal (formatQuery: nothing runs), and only then
// explains it. Check and Vet are safe for concurrent use.
package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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

// Vet checks query on the engine through run: it must parse as exactly
// one statement, and Check must accept its parse. It returns a
// *NotAcceptedError (the engine's error) or a *RefusedError.
func Vet(ctx context.Context, run Runner, query string) error {
	if _, err := run(ctx, "SELECT formatQuery("+literal(query)+")", "TabSeparatedRaw"); err != nil {
		return &NotAcceptedError{err}
	}
	ast, err := run(ctx, Explain(query), "TabSeparatedRaw")
	if err != nil {
		return &NotAcceptedError{err}
	}
	return Check(string(ast))
}

// literal quotes s as a ClickHouse string literal.
func literal(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\', '\'':
			b.WriteByte('\\')
			b.WriteByte(c)
		case 0:
			b.WriteString("\\0")
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// Explain returns the statement whose output Check reads. Run it only on
// a text Vet's first step proved to be one statement.
func Explain(query string) string { return "EXPLAIN AST " + query }

// RefusedError says why a statement is refused; Reason is a short
// label for metrics (statement, outfile, table_function, function).
type RefusedError struct {
	Reason string
	Detail string
}

func (e *RefusedError) Error() string { return "refused: " + e.Detail }

// ErrRefused matches every RefusedError with errors.Is.
var ErrRefused = errors.New("refused")

// Is makes errors.Is(err, ErrRefused) true for a RefusedError.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// readOnlyRoots are the statements (the AST's root node) a read-only user
// may run: queries, SHOW, DESCRIBE, EXISTS (and EXPLAIN of those).
var readOnlyRoots = []string{"Select", "Show", "Describe", "Exists"}

// TableFunctions are the table functions a query may use: they read
// nothing but their arguments and the store's own tables. Every other one
// (file, url, s3, remote, cluster, executable, input, mysql, postgresql,
// jdbc, odbc, hdfs, azureBlobStorage, iceberg, ...) reaches the host or the
// network.
var TableFunctions = []string{"numbers", "numbers_mt", "zeros", "zeros_mt", "generaterandom", "values", "format",
	"view", "merge", "null", "generate_series", "generateseries"}

// hostFunctions are ordinary functions that reach the host.
var hostFunctions = []string{"file"}

// node is one line of EXPLAIN AST: its depth and text.
type node struct {
	depth int
	text  string
}

func parse(ast string) []node {
	var out []node
	for line := range strings.SplitSeq(ast, "\n") {
		t := strings.TrimLeft(line, " ")
		if t == "" {
			continue
		}
		out = append(out, node{depth: len(line) - len(t), text: strings.TrimRight(t, " \r")})
	}
	return out
}

// kind is a node's first word (SelectQuery, Function, Literal, ...).
func (n node) kind() string {
	k, _, _ := strings.Cut(n.text, " ")
	return k
}

// Check returns nil when the statement parsed into ast is read-only and
// stays inside the store, else a *RefusedError.
func Check(ast string) error {
	nodes := parse(ast)
	// EXPLAIN runs nothing itself: what it explains is checked (it is the
	// first child).
	for len(nodes) > 1 && nodes[0].kind() == "Explain" && nodes[1].depth > nodes[0].depth {
		nodes = nodes[1:]
	}
	if len(nodes) == 0 {
		return &RefusedError{"statement", "the engine returned no parse of the statement"}
	}
	root := nodes[0]
	if !slices.ContainsFunc(readOnlyRoots, func(p string) bool { return strings.HasPrefix(root.kind(), p) }) {
		return &RefusedError{"statement", fmt.Sprintf("%s is not a read-only statement (only SELECT, SHOW, DESCRIBE, EXISTS and EXPLAIN of them are)", statementName(root.kind()))}
	}
	for i, n := range nodes {
		// INTO OUTFILE is a literal child of the top-level query.
		if n.depth == root.depth+1 && n.kind() == "Literal" && strings.HasPrefix(root.kind(), "Select") {
			return &RefusedError{"outfile", "INTO OUTFILE writes a file on the server"}
		}
		if n.kind() != "Function" {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(n.text, "Function "), " ")
		lower := strings.ToLower(name)
		if p, ok := parent(nodes, i); ok && p.kind() == "TableExpression" {
			if !slices.Contains(TableFunctions, lower) {
				return &RefusedError{"table_function", fmt.Sprintf("table function %s reaches outside the store (allowed: %s)", name, strings.Join(TableFunctions, ", "))}
			}
			continue
		}
		if slices.Contains(hostFunctions, lower) {
			return &RefusedError{"function", fmt.Sprintf("function %s reads files of the server", name)}
		}
	}
	return nil
}

// parent returns the nearest line above i that is one level shallower.
func parent(nodes []node, i int) (node, bool) {
	for j := i - 1; j >= 0; j-- {
		if nodes[j].depth < nodes[i].depth {
			return nodes[j], true
		}
	}
	return node{}, false
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
