package sqlguard

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/collector/store/chdb"
)

// engine opens the real engine in memory: the parse Check reads is the
// engine's own.
func engine(t *testing.T) *chdb.DB {
	t.Helper()
	if _, err := chdb.FindLibrary(""); err != nil {
		if os.Getenv("DUALFLOW_REQUIRE_CHDB") == "1" {
			t.Fatalf("DUALFLOW_REQUIRE_CHDB=1 but: %v", err)
		}
		t.Skip("libchdb not available (make deps)")
	}
	db, err := chdb.Open(chdb.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

// TestCheckOnTheEngine runs each statement's EXPLAIN AST on the real
// engine and checks the verdict; the refused ones are what let a
// "read-only" user write or read files, reach the network, run programs
// or cancel the collector's inserts.
func TestCheckOnTheEngine(t *testing.T) {
	db := engine(t)
	ctx := context.Background()
	if err := db.Exec(ctx, "CREATE DATABASE IF NOT EXISTS g"); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(ctx, "CREATE TABLE IF NOT EXISTS g.t (ip IPv6, n UInt64) ENGINE = MergeTree ORDER BY n"); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "out")
	// As /api/v1/sql runs them: readonly=1.
	run := func(ctx context.Context, q, format string) ([]byte, error) {
		res, err := db.Run(ctx, chdb.Statement{Query: q, Format: format, Settings: map[string]string{"readonly": "1"}})
		if err != nil {
			return nil, err
		}
		return res.Data, nil
	}
	for _, tc := range []struct {
		query  string
		reason string // "" allowed
	}{
		{"SELECT 1", ""},
		{"select count() from g.t where ip = toIPv6('fd00:10::1') or ip = toIPv6('198.18.0.1')", ""},
		{"WITH x AS (SELECT number FROM numbers(3)) SELECT * FROM x", ""},
		{"SELECT * FROM g.t AS a JOIN (SELECT * FROM numbers(2)) AS b ON a.n = b.number FORMAT JSON", ""},
		{"SELECT 'INTO OUTFILE ''x''', 'file(''/etc/passwd'')' AS `file`", ""},
		{"SELECT * FROM merge('g', '^t$')", ""},
		{"SHOW TABLES FROM g", ""},
		{"DESCRIBE TABLE g.t", ""},
		{"EXISTS TABLE g.t", ""},
		{"EXPLAIN SELECT count() FROM g.t", ""},
		{"EXPLAIN AST SELECT 1", ""},
		{"EXPLAIN AST SELECT * FROM file('/etc/passwd', 'LineAsString')", "table_function"},
		{"EXPLAIN AST KILL QUERY WHERE 1", "statement"},
		{"EXPLAIN PIPELINE INSERT INTO g.t SELECT * FROM g.t", "statement"},
		{"SELECT '\\'; DROP TABLE g.t; SELECT '", ""}, // one string literal
		{"SELECT 1 INTO OUTFILE '" + out + "' FORMAT RawBLOB", "outfile"},
		{"select 1 /* hidden */ into   outfile '" + out + "' APPEND", "outfile"},
		{"SELECT 1 INTO OUTFILE '" + out + "' TRUNCATE FORMAT CSV", "outfile"},
		{"SELECT * FROM file('/etc/passwd', 'LineAsString')", "table_function"},
		{"SELECT * FROM FILE('/etc/passwd', 'LineAsString')", "table_function"},
		{"SELECT * FROM (SELECT * FROM url('http://127.0.0.1:1/', 'CSV', 'a String'))", "table_function"},
		{"SELECT * FROM numbers(1) WHERE number IN (SELECT number FROM remote('127.0.0.1', numbers(1)))", "table_function"},
		{"SELECT * FROM executable('id', 'TSV', 'a String')", "table_function"},
		{"SELECT * FROM s3('http://127.0.0.1:1/b/k', 'CSV', 'a String')", "table_function"},
		{"SELECT file('passwd')", "function"},
		{"KILL QUERY WHERE 1", "statement"},
		{"KILL QUERY WHERE query_id = 'x' SYNC", "statement"},
		{"SYSTEM STOP MERGES", "statement"},
		{"INSERT INTO g.t VALUES ('::1', 1)", "statement"},
		{"INSERT INTO FUNCTION file('" + out + "') SELECT 1", "statement"},
		{"DROP TABLE g.t", "statement"},
		{"ALTER TABLE g.t DELETE WHERE 1", "statement"},
		{"SET readonly = 0", "statement"},
		{"OPTIMIZE TABLE g.t", "statement"},
	} {
		t.Run(tc.query, func(t *testing.T) {
			err := Vet(ctx, run, tc.query)
			var re *RefusedError
			switch {
			case tc.reason == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.reason != "" && !errors.As(err, &re):
				t.Errorf("%v, want refused (%s)", err, tc.reason)
			case tc.reason != "" && re.Reason != tc.reason:
				t.Errorf("refused as %s (%v), want %s", re.Reason, err, tc.reason)
			case err != nil && !errors.Is(err, ErrRefused):
				t.Errorf("%v is not ErrRefused", err)
			}
		})
	}
	// The engine runs every statement of a text: a second statement must
	// never reach it, not even behind EXPLAIN. What the engine refuses
	// under readonly=1 is refused too.
	for _, q := range []string{
		"SELECT 1; DROP TABLE g.t",
		"SELECT 1; SELECT 1 INTO OUTFILE '" + out + "'",
		"SELECT 1 /* ; */; KILL QUERY WHERE 1",
		"SELECT ';'; DROP TABLE g.t",
		"SELECT 1 -- comment\n; DROP TABLE g.t",
		"SELECT FROM WHERE",
		"SELECT 1 SETTINGS max_threads = 1", // readonly=1: settings are fixed
		"SELECT 1\x00; DROP TABLE g.t",
	} {
		if err := Vet(ctx, run, q); !errors.Is(err, ErrNotAccepted) {
			t.Errorf("%q: %v, want ErrNotAccepted", q, err)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Errorf("a vetted statement wrote %s", out)
	}
	if got, err := db.Query(ctx, "EXISTS TABLE g.t", "TabSeparatedRaw"); err != nil || strings.TrimSpace(string(got)) != "1" {
		t.Errorf("table g.t gone after the vetting: %q %v", got, err)
	}
	// One statement with a trailing semicolon is one statement.
	if err := Vet(ctx, run, "SELECT 1;"); err != nil {
		t.Errorf("SELECT 1;: %v", err)
	}
}

// TestLiteral: the quoting of Vet's first step, on the engine.
func TestLiteral(t *testing.T) {
	db := engine(t)
	for _, s := range []string{"", "a'b", `a\b`, `\'`, "x\x00y", "ünï", "'); DROP TABLE x; --"} {
		got, err := db.Query(context.Background(), "SELECT "+literal(s), "TabSeparatedRaw")
		if err != nil {
			t.Errorf("%q: %v", s, err)
			continue
		}
		back, err := db.Query(context.Background(), "SELECT "+literal(s)+" = unhex('"+hexOf(s)+"')", "TabSeparatedRaw")
		if err != nil || strings.TrimSpace(string(back)) != "1" {
			t.Errorf("%q round trip: %q %v (%q)", s, back, err, got)
		}
	}
}

func hexOf(s string) string {
	const digits = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteByte(digits[s[i]>>4])
		b.WriteByte(digits[s[i]&15])
	}
	return b.String()
}

// FuzzCheck: Check never panics and refuses what is not a query.
func FuzzCheck(f *testing.F) {
	f.Add("SelectWithUnionQuery (children 1)\n ExpressionList (children 1)\n  Literal UInt64_1\n")
	f.Add("KillQueryQuery (children 1)\n Literal UInt64_1\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, ast string) {
		err := Check(ast)
		if err == nil && !strings.HasPrefix(strings.TrimLeft(ast, " \n"), "S") && !strings.HasPrefix(strings.TrimLeft(ast, " \n"), "D") && !strings.HasPrefix(strings.TrimLeft(ast, " \n"), "E") {
			t.Errorf("allowed %q", ast)
		}
	})
}
