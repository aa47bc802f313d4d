package sqlguard

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/dualflow/dualflow/collector/store/chdb"
)

// shared is the one engine of this test binary (chDB runs one data
// directory per process), with the database g the statements read.
var shared struct {
	once   sync.Once
	db     *chdb.DB
	err    error
	canary string // the directory OUTFILE targets point into
	secret string // a file no statement may read
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.db != nil {
		shared.db.Close()
	}
	if shared.canary != "" {
		os.RemoveAll(shared.canary)
	}
	os.Exit(code)
}

// engine opens the real engine: the parse Check reads is the engine's
// own, and what Vet accepts runs on it.
func engine(t testing.TB) *chdb.DB {
	t.Helper()
	if _, err := chdb.FindLibrary(""); err != nil {
		if os.Getenv("DUALFLOW_REQUIRE_CHDB") == "1" {
			t.Fatalf("DUALFLOW_REQUIRE_CHDB=1 but: %v", err)
		}
		t.Skip("libchdb not available (make deps)")
	}
	shared.once.Do(func() {
		if shared.canary, shared.err = os.MkdirTemp("", "sqlguard-canary-"); shared.err != nil {
			return
		}
		shared.secret = filepath.Join(shared.canary, "secret")
		if shared.err = os.WriteFile(shared.secret, []byte("not for the engine\n"), 0o600); shared.err != nil {
			return
		}
		if shared.db, shared.err = chdb.Open(chdb.Config{}); shared.err != nil {
			return
		}
		ctx := context.Background()
		for _, q := range []string{
			"CREATE DATABASE IF NOT EXISTS g",
			"CREATE TABLE IF NOT EXISTS g.t (ip IPv6, n UInt64) ENGINE = MergeTree ORDER BY (n, intHash64(n)) SAMPLE BY intHash64(n)",
			"INSERT INTO g.t VALUES ('fd00:10::1', 1), ('::ffff:198.18.0.1', 2)",
		} {
			if shared.err = shared.db.Exec(ctx, q); shared.err != nil {
				return
			}
		}
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.db
}

// readOnly runs statements as /api/v1/sql does: readonly=1, bounded in
// time and rows (a generated statement may read generateRandom forever).
func readOnly(db *chdb.DB) Runner {
	return func(ctx context.Context, q, format string) ([]byte, error) {
		settings := map[string]string{"readonly": "1", "max_execution_time": "10", "max_rows_to_read": "1000000", "max_result_rows": "1000"}
		res, err := db.Run(ctx, chdb.Statement{Query: q, Format: format, Settings: settings, Database: "g"})
		if err != nil {
			return nil, err
		}
		return res.Data, nil
	}
}

// state is what no vetted statement may change: the files of the canary
// and working directories, the tables, and g.t's rows.
func state(t testing.TB, db *chdb.DB) string {
	t.Helper()
	var b strings.Builder
	for _, dir := range []string{shared.canary, "."} {
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil {
				b.WriteString(p + "\n")
			}
			return nil
		})
	}
	out, err := db.Query(context.Background(), "SELECT (SELECT groupArray(database || '.' || name) FROM (SELECT database, name FROM system.tables WHERE database NOT IN ('system', 'INFORMATION_SCHEMA', 'information_schema') ORDER BY ALL)), (SELECT (count(), groupBitXor(cityHash64(ip, n))) FROM g.t)", "TSV")
	if err != nil {
		t.Fatal(err)
	}
	b.Write(out)
	return b.String()
}

// corpus reads a testdata file of statements: blocks end with a ";;"
// line; lines of -- comments before a block's first statement are skipped
// (the first block's header).
func corpus(t testing.TB, name string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i, q := range strings.Split(string(b), "\n;;\n") {
		if i == 0 {
			var keep []string
			for _, l := range strings.Split(q, "\n") {
				if len(keep) > 0 || !strings.HasPrefix(l, "--") {
					keep = append(keep, l)
				}
			}
			q = strings.Join(keep, "\n")
		}
		q = strings.ReplaceAll(q, "'OUTFILE'", "'"+filepath.Join(shared.canary, "out")+"'")
		q = strings.ReplaceAll(q, "'RELATIVE'", "'relative-out'")
		q = strings.ReplaceAll(q, "'SECRET'", "'"+shared.secret+"'")
		out = append(out, strings.TrimSpace(q))
	}
	return out
}

// TestCorpus: every statement of testdata/readonly.sql passes Vet and runs
// read-only; every one of testdata/refused.sql is refused before it runs
// (refused.sql holds the attacks: INTO OUTFILE behind DESCRIBE, SHOW,
// EXISTS and EXPLAIN, which the denylist before this allowlist let
// through and which wrote files of the caller's choosing; table functions;
// system.processes; SETTINGS that lift the bounds; writes). Nothing
// changes on disk or in the tables either way.
func TestCorpus(t *testing.T) {
	db := engine(t)
	ctx := context.Background()
	run := readOnly(db)
	before := state(t, db)
	for _, q := range corpus(t, "readonly.sql") {
		t.Run("allowed/"+q, func(t *testing.T) {
			if err := Vet(ctx, run, "g", q); err != nil {
				t.Fatalf("refused: %v", err)
			}
			if _, err := run(ctx, q, "TSV"); err != nil {
				t.Errorf("vetted, then failed: %v", err)
			}
		})
	}
	for _, q := range corpus(t, "refused.sql") {
		t.Run("refused/"+q, func(t *testing.T) {
			err := Vet(ctx, run, "g", q)
			switch {
			case err == nil:
				t.Fatal("allowed")
			case !errors.Is(err, ErrRefused) && !errors.Is(err, ErrNotAccepted):
				t.Errorf("%v is neither ErrRefused nor ErrNotAccepted", err)
			}
		})
	}
	if after := state(t, db); after != before {
		t.Errorf("the corpus changed the files or the tables:\nbefore %s\nafter  %s", before, after)
	}
}

// TestRefusalReasons: the reason each kind of refusal is counted under.
func TestRefusalReasons(t *testing.T) {
	db := engine(t)
	ctx := context.Background()
	out := filepath.Join(shared.canary, "out")
	for _, tc := range []struct{ query, database, reason string }{
		{"DESCRIBE (SELECT 1) INTO OUTFILE '" + out + "'", "g", "outfile"},
		{"EXISTS TABLE g.t INTO OUTFILE '" + out + "'", "g", "outfile"},
		{"SELECT * FROM file('x')", "g", "table_function"},
		{"SELECT file('x')", "g", "function"},
		{"SELECT query FROM system.processes", "g", "table"},
		{"SELECT query FROM processes", "system", "table"},
		{"SELECT * FROM tables", "system", ""},
		{"SHOW PROCESSLIST", "g", "statement"},
		{"KILL QUERY WHERE 1", "g", "statement"},
		{"EXPLAIN AST SELECT 1", "g", ""},
		{"EXPLAIN PLAN header = 1 SELECT 1", "g", ""},
		{"SELECT * FROM numbers(1) INTERSECT SELECT 0", "g", ""},
	} {
		t.Run(tc.query, func(t *testing.T) {
			// readonly=2: the engine itself lets SETTINGS through, the
			// guard must not.
			run := func(ctx context.Context, q, format string) ([]byte, error) {
				res, err := db.Run(ctx, chdb.Statement{Query: q, Format: format, Settings: map[string]string{"readonly": "2"}, Database: tc.database})
				if err != nil {
					return nil, err
				}
				return res.Data, nil
			}
			err := Vet(ctx, run, tc.database, tc.query)
			var re *RefusedError
			switch {
			case tc.reason == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.reason != "" && !errors.As(err, &re):
				t.Errorf("%v, want refused (%s)", err, tc.reason)
			case tc.reason != "" && re.Reason != tc.reason:
				t.Errorf("refused as %s (%v), want %s", re.Reason, err, tc.reason)
			}
		})
	}
	runRW := func(ctx context.Context, q, format string) ([]byte, error) {
		res, err := db.Run(ctx, chdb.Statement{Query: q, Format: format, Settings: map[string]string{"readonly": "2"}})
		if err != nil {
			return nil, err
		}
		return res.Data, nil
	}
	if err := Vet(ctx, runRW, "g", "SELECT 1 SETTINGS max_execution_time = 0"); !errors.As(err, new(*RefusedError)) {
		t.Errorf("SETTINGS under readonly=2: %v, want refused", err)
	}
}

// TestVetStatement: a user who may write may run any one statement but
// INTO OUTFILE, as through a ClickHouse server's HTTP interface.
func TestVetStatement(t *testing.T) {
	db := engine(t)
	ctx := context.Background()
	run := func(ctx context.Context, q, format string) ([]byte, error) {
		return db.Query(ctx, q, format)
	}
	out := filepath.Join(shared.canary, "out")
	for _, q := range []string{"CREATE TABLE g.w (a UInt8) ENGINE = Memory", "ALTER TABLE g.t DELETE WHERE 0", "SELECT 'INTO OUTFILE'", "SELECT 1 AS `INTO OUTFILE`"} {
		if err := VetStatement(ctx, run, q); err != nil {
			t.Errorf("%s: %v", q, err)
		}
	}
	for _, q := range []string{
		"SELECT 1 INTO OUTFILE '" + out + "'",
		"SELECT 1 INTO /* x */ OUTFILE '" + out + "'",
		"DESCRIBE (SELECT 1) INTO OUTFILE '" + out + "'",
		"SHOW TABLES INTO OUTFILE '" + out + "'",
	} {
		if err := VetStatement(ctx, run, q); !errors.As(err, new(*RefusedError)) {
			t.Errorf("%s: %v, want refused", q, err)
		}
	}
	if err := VetStatement(ctx, run, "CREATE TABLE g.w2 (a UInt8) ENGINE = Memory; DROP TABLE g.t"); !errors.Is(err, ErrNotAccepted) {
		t.Errorf("two statements: %v, want ErrNotAccepted", err)
	}
}

// TestSchemaDocExamples: the queries docs/schema.md teaches pass the guard.
func TestSchemaDocExamples(t *testing.T) {
	db := engine(t)
	doc, err := os.ReadFile("../../../docs/schema.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	if len(blocks) < 8 {
		t.Fatalf("found %d sql examples in docs/schema.md", len(blocks))
	}
	run := readOnly(db)
	for _, b := range blocks {
		q := strings.TrimSuffix(strings.TrimSpace(b[1]), ";")
		if err := Vet(context.Background(), run, "dualflow", q); err != nil {
			t.Errorf("docs/schema.md example refused: %v\n%s", err, q)
		}
	}
}

// FuzzCheck: Check never panics, and accepts only a parse whose root is a
// read-only statement.
func FuzzCheck(f *testing.F) {
	f.Add("SelectWithUnionQuery (children 1)\n ExpressionList (children 1)\n  Literal UInt64_1\n")
	f.Add("KillQueryQuery (children 1)\n Literal UInt64_1\n")
	f.Add("Explain EXPLAIN (children 2)\n Set\n SelectWithUnionQuery\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, ast string) {
		if Check(ast, "g") != nil {
			return
		}
		ns := parse(ast)
		r := 0
		for ns[r].kind() == "Explain" {
			r = slices.IndexFunc(ns, func(n node) bool { return n.parent == r && n.kind() != "Set" })
		}
		if !slices.Contains(roots, ns[r].kind()) {
			t.Errorf("allowed %q", ast)
		}
	})
}

// FuzzGrammar is the differential test of the guard: statements built
// from a grammar of ClickHouse SQL (reads, writes, table functions,
// system tables, output options, settings, several statements, comments)
// by the fuzzer's bytes go through Vet as a read-only user's; each one Vet
// accepts runs on the real engine, and afterwards no file has appeared
// and no table has changed. `make test` runs the seeds, `make fuzz`
// explores.
func FuzzGrammar(f *testing.F) {
	for _, seed := range grammarSeeds() {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		db := engine(t)
		ctx := context.Background()
		q := (&grammar{data: data}).statement()
		before := state(t, db)
		if err := Vet(ctx, readOnly(db), "g", q); err != nil {
			if !errors.Is(err, ErrRefused) && !errors.Is(err, ErrNotAccepted) {
				t.Fatalf("%q: %v is neither refused nor not accepted", q, err)
			}
			return
		}
		_, _ = readOnly(db)(ctx, q, "TSV")
		if after := state(t, db); after != before {
			t.Fatalf("%q passed the guard and changed the files or tables:\nbefore %s\nafter  %s", q, before, after)
		}
	})
}

// grammarSeeds are FuzzGrammar's seeds: 200 pseudo-random byte strings.
func grammarSeeds() [][]byte {
	var out [][]byte
	for i := range 200 {
		seed := make([]byte, 48)
		x := uint32(i*2654435761 + 1)
		for j := range seed {
			x ^= x << 13
			x ^= x >> 17
			x ^= x << 5
			seed[j] = byte(x)
		}
		out = append(out, seed)
	}
	return out
}

// TestGrammarSeeds: the seeds exercise both sides of the guard, so the
// differential test is not vacuous.
func TestGrammarSeeds(t *testing.T) {
	db := engine(t)
	accepted, refused := 0, 0
	for _, seed := range grammarSeeds() {
		q := (&grammar{data: seed}).statement()
		if Vet(context.Background(), readOnly(db), "g", q) == nil {
			accepted++
		} else {
			refused++
		}
	}
	t.Logf("%d accepted, %d refused", accepted, refused)
	if accepted < 20 || refused < 20 {
		t.Errorf("%d accepted, %d refused of the seeds: want at least 20 each", accepted, refused)
	}
}

// grammar builds a statement from bytes: each choice takes the next byte
// (0 once they run out).
type grammar struct {
	data  []byte
	depth int
}

func (g *grammar) pick(n int) int {
	if len(g.data) == 0 {
		return 0
	}
	b := g.data[0]
	g.data = g.data[1:]
	return int(b) % n
}

func (g *grammar) one(options ...string) string { return options[g.pick(len(options))] }

func (g *grammar) statement() string {
	var s string
	switch g.pick(12) {
	case 0, 1, 2, 3, 4:
		s = g.query()
	case 5:
		s = g.one("DESCRIBE ", "DESC ", "DESCRIBE TABLE ") + g.one("g.t", "("+g.query()+")", g.source())
	case 6:
		s = g.one("SHOW TABLES", "SHOW TABLES FROM g", "SHOW TABLES FROM system LIKE '%'", "SHOW DATABASES", "SHOW PROCESSLIST", "SHOW CREATE TABLE g.t", "SHOW COLUMNS FROM g.t", "SHOW GRANTS", "SHOW SETTINGS LIKE 'max%'")
	case 7:
		s = g.one("EXISTS TABLE g.t", "EXISTS DATABASE g", "EXISTS g.nope")
	case 8:
		s = "EXPLAIN " + g.one("", "AST ", "SYNTAX ", "PLAN ", "PIPELINE ", "ESTIMATE ", "QUERY TREE ", "PLAN header = 1 ") + g.statement()
	case 9:
		s = g.one("INSERT INTO g.t SELECT * FROM g.t", "INSERT INTO FUNCTION file('"+filepath.Join(shared.canary, "ins")+"', 'RawBLOB') SELECT 'x'",
			"INSERT INTO g.t VALUES ('::1', 9)", "DROP TABLE g.t", "TRUNCATE g.t", "ALTER TABLE g.t DELETE WHERE 1", "DELETE FROM g.t WHERE 1",
			"CREATE TABLE g.x (a UInt8) ENGINE = Memory", "RENAME TABLE g.t TO g.t2", "OPTIMIZE TABLE g.t FINAL")
	case 10:
		s = g.one("KILL QUERY WHERE 1", "SYSTEM STOP MERGES", "SYSTEM FLUSH LOGS", "SET readonly = 0", "USE system", "BACKUP TABLE g.t TO File('"+filepath.Join(shared.canary, "bk")+"')", "CHECK TABLE g.t")
	default:
		s = g.query() + "; " + g.statement()
	}
	return s + g.output()
}

// output is the statement's output options.
func (g *grammar) output() string {
	var s string
	if g.pick(3) == 0 {
		s += " INTO OUTFILE '" + g.one(filepath.Join(shared.canary, "o"), "rel-out", filepath.Join(shared.canary, "p")) + "'" +
			g.one("", " APPEND", " TRUNCATE", " AND STDOUT", " COMPRESSION 'gzip'")
	}
	if g.pick(3) == 0 {
		s += " FORMAT " + g.one("TSV", "JSON", "RawBLOB", "CSVWithNames", "Null")
	}
	if g.pick(4) == 0 {
		s += " SETTINGS " + g.one("max_execution_time = 0", "max_memory_usage = 0", "readonly = 0", "max_threads = 1", "output_format_schema = '"+filepath.Join(shared.canary, "schema")+"'")
	}
	return s + g.one("", "", ";", " -- c", " /* c */")
}

func (g *grammar) query() string {
	g.depth++
	defer func() { g.depth-- }()
	s := "SELECT " + g.expr() + g.one("", ", "+g.expr()) + " FROM " + g.source()
	if g.pick(3) == 0 {
		s += " WHERE " + g.expr() + g.one(" > 0", " IN ("+g.subquery()+")", " IN system.processes", " = 1")
	}
	if g.pick(4) == 0 {
		s += " ORDER BY 1 LIMIT " + g.one("1", "10")
	}
	if g.pick(5) == 0 {
		s += g.one(" UNION ALL ", " UNION DISTINCT ", " INTERSECT ", " EXCEPT ") + "SELECT " + g.expr() + " FROM " + g.source()
	}
	if g.pick(6) == 0 {
		s = "WITH (" + g.subquery() + ") AS w " + s
	}
	return s
}

func (g *grammar) subquery() string {
	if g.depth > 3 {
		return "SELECT 1"
	}
	return g.query()
}

func (g *grammar) expr() string {
	switch g.pick(8) {
	case 0:
		return "n"
	case 1:
		return g.one("1", "'x'", "'INTO OUTFILE ''y'''", "toIPv6('fd00:10::1')", "toIPv4('198.18.0.1')")
	case 2:
		return g.one("count()", "sum(n)", "toString(ip)", "length(toString(n))", "sleep(0)")
	case 3:
		return "file('" + g.one(shared.secret, "relative") + "')"
	case 4:
		if g.depth > 3 {
			return "2"
		}
		return "(" + g.subquery() + ")"
	case 5:
		return g.one("getSetting('readonly')", "currentUser()", "version()")
	default:
		return "*"
	}
}

func (g *grammar) source() string {
	switch g.pick(7) {
	case 0, 1:
		return "g.t"
	case 2:
		return g.one("numbers(3)", "zeros(1)", "generateRandom('a UInt8', 1) LIMIT 1", "values('a UInt8', 1)", "null('a UInt8')")
	case 3:
		return g.one("file('"+shared.secret+"', 'RawBLOB')", "url('http://127.0.0.1:1/', 'RawBLOB')", "url('http://[::1]:1/', 'RawBLOB')",
			"remote('127.0.0.1', system.one)", "executable('id', 'TSV', 'a String')", "merge('g', '.*')", "merge(REGEXP('sys'), 'proc')",
			"s3('http://198.18.0.1:1/bucket/k', 'RawBLOB')", "input('a UInt8')")
	case 4:
		return "system." + g.one("one", "tables", "processes", "query_log", "errors", "parts", "text_log", "numbers")
	case 5:
		if g.depth > 3 {
			return "g.t"
		}
		return "(" + g.subquery() + ")"
	default:
		return "view(" + g.subquery() + ")"
	}
}

func ExampleVet() {
	// A read-only user's statement on the engine (run would be the real
	// runner, with readonly=1 and the limits).
	run := func(ctx context.Context, q, format string) ([]byte, error) { return nil, errors.New("no engine here") }
	err := Vet(context.Background(), run, "dualflow", "SELECT 1")
	fmt.Println(errors.Is(err, ErrNotAccepted))
	// Output: true
}
