package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dualflow/dualflow/app"
	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/labcmd"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/web"
)

var (
	dataDirOnce sync.Once
	dataDirPath string
	databaseSeq atomic.Int32
)

// sharedDataDir is the embedded store's directory of every in-process
// store of this test process: chDB opens one directory per process at a
// time, so the in-process products and collectors share one engine, each
// with its own database (useSharedStore), and can run at the same time.
// It is removed when the tests end.
func sharedDataDir(t testing.TB) string {
	dataDirOnce.Do(func() {
		d, err := os.MkdirTemp("", "dualflow-e2e-data-")
		if err != nil {
			t.Fatal(err)
		}
		dataDirPath = d
	})
	return filepath.Join(dataDirPath, "data")
}

// useSharedStore sets c, an in-process collector's configuration, to store
// on sharedDataDir in a database of its own, with its own write-ahead log
// and spool directories (by default beside the data directory, which one
// collector at a time may hold): the labs of every mode have the same
// addresses, so collectors that shared a database would see each other's
// flows.
func useSharedStore(t testing.TB, c *collector.Config) {
	c.Store.DataDir = sharedDataDir(t)
	c.Store.Database = fmt.Sprintf("e2e_%d", databaseSeq.Add(1))
	dir := t.TempDir()
	c.WAL.Dir, c.Writer.SpoolDir = filepath.Join(dir, "wal"), filepath.Join(dir, "spool")
}

func removeSharedDataDir() {
	if dataDirPath != "" {
		os.RemoveAll(dataDirPath)
	}
}

// requireCHDB skips (fails under make test) without libchdb.
func requireCHDB(t testing.TB) {
	t.Helper()
	if _, err := chdb.FindLibrary(""); err != nil {
		if os.Getenv("DUALFLOW_E2E") == "1" {
			t.Fatalf("libchdb: %v (run make deps)", err)
		}
		t.Skip("libchdb not available (make deps)")
	}
}

// startProduct runs the product on l as the demo does (labcmd.StartProduct:
// the app with its web and REST API, one exporter per node serving the
// node's traceflow agent) and returns the web's base URL.
func startProduct(t testing.TB, l *lab.Lab) (*labcmd.Product, string) {
	t.Helper()
	return startProductWith(t, l, labcmd.ProductOptions{})
}

// startProductWith is startProduct with options.
func startProductWith(t testing.TB, l *lab.Lab, opts labcmd.ProductOptions) (*labcmd.Product, string) {
	t.Helper()
	return startProductEdited(t, l, opts, nil)
}

// startProductEdited is startProductWith with the app's configuration
// edited by edit (if not nil) before it starts.
func startProductEdited(t testing.TB, l *lab.Lab, opts labcmd.ProductOptions, edit func(*app.Config)) (*labcmd.Product, string) {
	t.Helper()
	requireCHDB(t)
	var cfg app.Config
	useSharedStore(t, &cfg.Collector)
	cfg.Collector.Store.HTTPAddr = ""
	// Each product its own operator token: products started at once would
	// race to create a shared one.
	cfg.Web.LocalTokenFile = filepath.Join(t.TempDir(), web.LocalTokenFileName)
	cfg.Collector.IPFIX.TCPAddrs, cfg.Collector.IPFIX.UDPAddrs = []string{"127.0.0.1:0", "[::1]:0"}, nil
	cfg.Collector.MetricsAddr = ""
	cfg.Web.Addr = "127.0.0.1:0"
	// A delivered or dropped probe ends as soon as it is seen; the timeout
	// only bounds what never arrives, so it is generous: a dozen traces at
	// once on a loaded 2-core machine take seconds to set up.
	cfg.Traceflow.Timeout = 10 * time.Second
	if edit != nil {
		edit(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() && os.Getenv("DUALFLOW_E2E_LOG") != "" {
		log = slog.Default()
	}
	opts.Logger = log
	p, err := labcmd.StartProduct(ctx, l, cfg, opts)
	if err != nil {
		t.Fatalf("product: %v", err)
	}
	t.Cleanup(func() {
		if err := p.Stop(); err != nil {
			t.Errorf("product stop: %v", err)
		}
	})
	base := strings.TrimSuffix(p.App.WebURL(), "/")
	registerOperator(t, base, cfg.Web.LocalTokenFile)
	return p, base
}

// restTrace posts req to the REST API and waits for its result (?wait=true).
func restTrace(ctx context.Context, base string, req traceflow.Request) (traceflow.Result, int, error) {
	var res traceflow.Result
	code, err := restCall(ctx, http.MethodPost, base+"/api/v1/traceflows?wait=true", req, &res)
	return res, code, err
}

// restStart posts req without waiting and returns the trace id.
func restStart(ctx context.Context, base string, req traceflow.Request) (string, error) {
	var res traceflow.Result
	code, err := restCall(ctx, http.MethodPost, base+"/api/v1/traceflows", req, &res)
	if err == nil && res.ID == "" {
		err = fmt.Errorf("POST /api/v1/traceflows: %d without an id", code)
	}
	return res.ID, err
}

// restWait polls GET /api/v1/traceflows/{id} until the trace ends.
func restWait(ctx context.Context, base, id string) (traceflow.Result, error) {
	for {
		var res traceflow.Result
		if _, err := restCall(ctx, http.MethodGet, base+"/api/v1/traceflows/"+id, nil, &res); err != nil {
			return res, err
		}
		if res.Phase != traceflow.Running {
			return res, nil
		}
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func restCall(ctx context.Context, method, url string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	authorize(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		return resp.StatusCode, fmt.Errorf("%s %s: %s: %s", method, url, resp.Status, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp.StatusCode, fmt.Errorf("%s %s: %w: %s", method, url, err, b)
		}
	}
	return resp.StatusCode, nil
}
