package migrations

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/dualflow/dualflow/collector/store/chdb"
)

// db is the real ClickHouse engine (chDB) shared by the runner tests: one
// data directory per process.
var db *chdb.DB

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dualflow-migrations-test-")
	if err != nil {
		panic(err)
	}
	d, err := openWithCluster(dir)
	switch {
	case errors.Is(err, chdb.ErrLibraryNotFound) && os.Getenv("DUALFLOW_REQUIRE_CHDB") != "1":
		fmt.Fprintln(os.Stderr, "libchdb not found: runner tests will skip (run make deps)")
	case err != nil:
		fmt.Fprintln(os.Stderr, "open chdb:", err)
		os.Exit(1)
	default:
		db = d
	}
	code := m.Run()
	if db != nil {
		db.Close()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// clusterConfig defines the cluster "flows" as one shard on this engine
// (tcp_port makes localhost:9000 the local replica; nothing listens), so
// the cluster form's Distributed tables can be created and written
// through in-process (TestClusterFormOnLocalShard).
const clusterConfig = `
  <tcp_port>9000</tcp_port>
  <remote_servers>
    <flows>
      <shard>
        <internal_replication>true</internal_replication>
        <replica><host>localhost</host><port>9000</port></replica>
      </shard>
    </flows>
  </remote_servers>
`

// openWithCluster boots the engine with the cluster "flows" in its
// configuration.
func openWithCluster(dataDir string) (*chdb.DB, error) {
	return chdb.Open(chdb.Config{DataDir: dataDir, ExtraConfig: clusterConfig})
}

func newRunner(t *testing.T, database string, all ...Migration) *Runner {
	t.Helper()
	if db == nil {
		t.Skip("libchdb not available (make deps)")
	}
	r, err := NewRunner(db, Options{Database: database, TTLDays: 3})
	if err != nil {
		t.Fatal(err)
	}
	if all != nil {
		r.all = all
	}
	return r
}

func mig(v int, name, src string) Migration {
	m, err := load(fstest.MapFS{name: {Data: []byte(src)}})
	if err != nil {
		panic(err)
	}
	if m[0].Version != v {
		panic("version mismatch")
	}
	return m[0]
}

func TestRunnerAppliesEmbeddedOnce(t *testing.T) {
	r := newRunner(t, "df_embedded")
	ctx := context.Background()
	done, err := r.Up(ctx)
	if err != nil {
		t.Fatal(err)
	}
	all, _ := All()
	if len(done) != len(all) {
		t.Fatalf("applied %d migrations, want %d", len(done), len(all))
	}
	done, err = r.Up(ctx)
	if err != nil || len(done) != 0 {
		t.Fatalf("second Up applied %d (err %v), want a no-op", len(done), err)
	}
	st, err := r.Status(ctx)
	if err != nil || len(st) != len(all) {
		t.Fatalf("status = %v, %v", st, err)
	}
	// TTL follows the option, and can change after creation.
	out, err := db.Query(ctx, "SELECT engine_full FROM system.tables WHERE database = 'df_embedded' AND name = 'flows'", "TabSeparatedRaw")
	if err != nil || !strings.Contains(string(out), "toIntervalDay(3)") {
		t.Fatalf("flows TTL: %s %v", out, err)
	}
	if !strings.Contains(string(out), "merge_selector_base = 20") {
		t.Fatalf("flows settings (0005): %s", out)
	}
	r.opt.TTLDays = 9
	if _, err := r.Up(ctx); err != nil {
		t.Fatal(err)
	}
	out, _ = db.Query(ctx, "SELECT engine_full FROM system.tables WHERE database = 'df_embedded' AND name = 'rollup_policy_1m'", "TabSeparatedRaw")
	if !strings.Contains(string(out), "toIntervalDay(9)") {
		t.Fatalf("rollup TTL after change: %s", out)
	}
}

func TestRunnerStopsAtFailingStatement(t *testing.T) {
	ok := mig(1, "0001_ok.sql", "CREATE TABLE IF NOT EXISTS {{.Database}}.a (x UInt8) ENGINE = MergeTree ORDER BY x;")
	bad := mig(2, "0002_bad.sql", "CREATE TABLE IF NOT EXISTS {{.Database}}.b (x UInt8) ENGINE = MergeTree ORDER BY x;\nCREATE TABLE {{.Database}}.c (x NoSuchType) ENGINE = MergeTree ORDER BY x;")
	r := newRunner(t, "df_fail", ok, bad)
	done, err := r.Up(context.Background())
	if err == nil {
		t.Fatal("Up succeeded with a bad migration")
	}
	if len(done) != 1 || done[0].Version != 1 {
		t.Errorf("applied %v, want only 0001", done)
	}
	for _, want := range []string{"0002_bad.sql", "statement 2 of 2", "NoSuchType"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	st, _ := r.Status(context.Background())
	if len(st) != 1 {
		t.Errorf("recorded %d migrations, want 1 (the failed one must not be recorded)", len(st))
	}
}

func TestRunnerRefusesChangedMigration(t *testing.T) {
	v1 := mig(1, "0001_t.sql", "CREATE TABLE IF NOT EXISTS {{.Database}}.t (x UInt8) ENGINE = MergeTree ORDER BY x;")
	r := newRunner(t, "df_changed", v1)
	if _, err := r.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	edited := mig(1, "0001_t.sql", "CREATE TABLE IF NOT EXISTS {{.Database}}.t (x UInt16) ENGINE = MergeTree ORDER BY x;")
	r.all = []Migration{edited}
	_, err := r.Up(context.Background())
	if !errors.Is(err, ErrChanged) {
		t.Fatalf("err = %v, want ErrChanged", err)
	}
}
