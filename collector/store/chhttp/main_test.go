package chhttp

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/dualflow/dualflow/collector/store/chdb"
)

// envRequire makes a missing libchdb.so a test failure instead of a skip
// (`make test` sets it).
const envRequire = "DUALFLOW_REQUIRE_CHDB"

// shared is the one engine of this test binary: chDB runs one data
// directory per process.
var shared struct {
	once sync.Once
	db   *chdb.DB
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.db != nil {
		_ = shared.db.Close()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// testDB returns the shared engine, skipping (or failing, under
// DUALFLOW_REQUIRE_CHDB=1) when libchdb.so is missing.
func testDB(t testing.TB) *chdb.DB {
	t.Helper()
	if _, err := chdb.FindLibrary(""); err != nil {
		if os.Getenv(envRequire) == "1" {
			t.Fatalf("%s=1 but: %v", envRequire, err)
		}
		t.Skipf("skipping: %v", err)
	}
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "chhttp-test-")
		if shared.err != nil {
			return
		}
		shared.db, shared.err = chdb.Open(chdb.Config{DataDir: filepath.Join(shared.dir, "data"), MaxMemoryBytes: 4 << 30})
	})
	if shared.err != nil {
		t.Fatalf("open shared chdb: %v", shared.err)
	}
	return shared.db
}

// testServer starts an httptest server over the shared engine.
func testServer(t testing.TB, cfg Config) (*httptest.Server, *Server) {
	t.Helper()
	if cfg.Engine == nil {
		cfg.Engine = testDB(t)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if len(cfg.Users) == 0 && cfg.Anonymous == AccessNone {
		// Tests of the interface itself; auth_test.go tests authentication.
		cfg.Anonymous = AccessFull
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts, s
}

// newDatabase creates a fresh database for one test and returns its name.
func newDatabase(t testing.TB) string {
	t.Helper()
	db := testDB(t)
	name := "h_" + sanitize(t.Name())
	ctx := context.Background()
	for _, q := range []string{"DROP DATABASE IF EXISTS " + name + " SYNC", "CREATE DATABASE " + name} {
		if err := db.Exec(ctx, q); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = db.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" SYNC") })
	return name
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// fakeEngine is an Engine with function fields, for tests of the HTTP layer
// alone.
type fakeEngine struct {
	run    func(ctx context.Context, st chdb.Statement) (*chdb.Result, error)
	insert func(ctx context.Context, st chdb.Statement, data io.Reader) (chdb.Stats, error)
}

func (f *fakeEngine) Run(ctx context.Context, st chdb.Statement) (*chdb.Result, error) {
	if f.run == nil {
		return nil, fmt.Errorf("fake: no run")
	}
	return f.run(ctx, st)
}

func (f *fakeEngine) InsertStatement(ctx context.Context, st chdb.Statement, data io.Reader) (chdb.Stats, error) {
	if f.insert == nil {
		return chdb.Stats{}, fmt.Errorf("fake: no insert")
	}
	return f.insert(ctx, st, data)
}
