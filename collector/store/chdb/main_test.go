package chdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// envRequire makes a missing libchdb.so a test failure instead of a skip
// (`make test` sets it).
const envRequire = "DUALFLOW_REQUIRE_CHDB"

// envLockChild tells the re-executed test binary which directory to try
// to open (see TestOpenLockedByOtherProcess).
const envLockChild = "DUALFLOW_CHDB_LOCK_CHILD_DIR"

// envThrowawayChild tells the re-executed test binary to open a throwaway
// engine (see TestThrowawayEngineLeavesNothing).
const envThrowawayChild = "DUALFLOW_CHDB_THROWAWAY_CHILD"

// shared is the one engine of this test binary: chDB runs one data
// directory per process, so every test uses the same DB.
var shared struct {
	once sync.Once
	db   *DB
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	if dir := os.Getenv(envLockChild); dir != "" {
		os.Exit(lockChild(dir))
	}
	if os.Getenv(envThrowawayChild) == "1" {
		os.Exit(throwawayChild())
	}
	code := m.Run()
	if shared.db != nil {
		_ = shared.db.Close()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
	os.Exit(code)
}

// testDB returns the shared DB, skipping (or failing, under
// DUALFLOW_REQUIRE_CHDB=1) when libchdb.so is missing.
func testDB(t testing.TB) *DB {
	t.Helper()
	if _, err := FindLibrary(""); err != nil {
		if os.Getenv(envRequire) == "1" {
			t.Fatalf("%s=1 but: %v", envRequire, err)
		}
		t.Skipf("skipping: %v", err)
	}
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "chdb-test-")
		if shared.err != nil {
			return
		}
		shared.db, shared.err = Open(Config{DataDir: filepath.Join(shared.dir, "data"), MaxMemoryBytes: 4 << 30})
	})
	if shared.err != nil {
		t.Fatalf("open shared chdb: %v", shared.err)
	}
	return shared.db
}

// newDatabase creates a fresh database for one test and returns its name.
func newDatabase(t testing.TB, db *DB) string {
	t.Helper()
	name := fmt.Sprintf("t_%s", sanitize(t.Name()))
	ctx := context.Background()
	if err := db.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" SYNC"); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" SYNC") })
	return name
}

func sanitize(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !isIdentPart(c) || c >= 0x80 {
			b[i] = '_'
		}
	}
	return string(b)
}

// lockChild runs in the re-executed test binary: it opens dir, which the
// parent holds, and reports through its exit code whether it got ErrLocked.
func lockChild(dir string) int {
	db, err := Open(Config{DataDir: dir})
	if err == nil {
		db.Close()
		fmt.Println("child: open succeeded, want ErrLocked")
		return 3
	}
	fmt.Println("child error:", err)
	if errors.Is(err, ErrLocked) {
		return 0
	}
	return 4
}

// throwawayChild runs in the re-executed test binary: it opens a throwaway
// engine, writes a table, prints the engine's directory and closes it.
func throwawayChild() int {
	db, err := Open(Config{})
	if err != nil {
		fmt.Println("child: open:", err)
		return 3
	}
	ctx := context.Background()
	if err := db.Exec(ctx, "CREATE TABLE default.t (a UInt8) ENGINE = MergeTree ORDER BY a"); err != nil {
		fmt.Println("child: create:", err)
		return 4
	}
	fmt.Println("path:", db.path)
	if err := db.Close(); err != nil {
		fmt.Println("child: close:", err)
		return 5
	}
	return 0
}
