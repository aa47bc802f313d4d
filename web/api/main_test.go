package api

import (
	"context"
	"flag"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/test/support/webtest"
)

// engine is the embedded store shared by this package's tests (chDB allows
// one data directory per process), seeded with seedRows rows over the hour
// before seedNow.
var engine *store.Embedded

const seedRows = 20000

var seedNow = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	flag.Parse()
	if listOrFuzzWorker() {
		return m.Run()
	}
	dir, err := os.MkdirTemp("", "dualflow-web-api-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	e, err := webtest.OpenStore(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "open store:", err)
		return 1
	}
	if e == nil {
		fmt.Fprintln(os.Stderr, "libchdb not found: engine tests will skip (run make deps)")
		return m.Run()
	}
	defer e.Close()
	if err := e.Exec(context.Background(), webtest.SeedSQL("dualflow", seedRows, seedNow, time.Hour)); err != nil {
		fmt.Fprintln(os.Stderr, "seed:", err)
		return 1
	}
	engine = e
	return m.Run()
}

// listOrFuzzWorker reports a run that needs no store: listing the tests
// (scripts/fuzz.sh finds the fuzz targets so), or a fuzzing worker, which
// runs only the fuzz target (FuzzFilterSQL builds SQL without running
// it); an engine seeded in each worker would slow the fuzzing down.
func listOrFuzzWorker() bool {
	if f := flag.Lookup("test.list"); f != nil && f.Value.String() != "" {
		return true
	}
	f := flag.Lookup("test.fuzzworker")
	return f != nil && f.Value.String() == "true"
}

func needEngine(t testing.TB) *store.Embedded {
	t.Helper()
	if engine == nil {
		t.Skip("libchdb not available (make deps)")
	}
	return engine
}
