// Package browsertest drives the web UI in headless Debian Chromium with
// chromedp against a real embedded store seeded with IPv4 and IPv6 flows,
// and the fake evaluator, tracer and auditor. The tests skip without
// /usr/bin/chromium (or libchdb) unless DUALFLOW_E2E=1, then they fail.
// Screenshots of every page go to test/artifacts/.
package browsertest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/web"
	"github.com/dualflow/dualflow/web/api"
	"github.com/dualflow/dualflow/web/internal/fakes"
	"github.com/dualflow/dualflow/web/internal/webtest"
)

const chromium = "/usr/bin/chromium"

var (
	engine  *store.Embedded
	baseURL string
)

func TestMain(m *testing.M) { os.Exit(runMain(m)) }

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dualflow-browsertest-")
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
		return m.Run() // tests skip (or fail under DUALFLOW_E2E=1)
	}
	defer e.Close()
	if err := e.Exec(context.Background(), webtest.SeedSQL("dualflow", 20000, time.Now(), time.Hour)); err != nil {
		fmt.Fprintln(os.Stderr, "seed:", err)
		return 1
	}
	engine = e
	srv, err := web.New(web.Config{
		Addr: "127.0.0.1:0", Store: e, SQL: api.EngineSQL{Engine: e.DB()},
		Evaluator: fakes.Evaluator{}, Tracer: fakes.Tracer{Delay: 200 * time.Millisecond}, Auditor: fakes.Auditor{},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()
	baseURL = "http://" + ln.Addr().String()
	code := m.Run()
	cancel()
	<-done
	return code
}

// browser starts a fresh headless Chromium and returns a tab context and
// a function reporting the console errors seen so far.
func browser(t *testing.T) (context.Context, func() []string) {
	t.Helper()
	if _, err := os.Stat(chromium); err != nil {
		if os.Getenv("DUALFLOW_E2E") == "1" {
			t.Fatalf("DUALFLOW_E2E=1 but %s: %v", chromium, err)
		}
		t.Skip("no " + chromium + " (scripts/deps.sh installs it; DUALFLOW_E2E=1 makes this a failure)")
	}
	if engine == nil {
		if os.Getenv("DUALFLOW_E2E") == "1" || os.Getenv("DUALFLOW_REQUIRE_CHDB") == "1" {
			t.Fatal("libchdb not available")
		}
		t.Skip("libchdb not available (make deps)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	// Start the browser and the tab, then subscribe before any page loads.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var errs []string
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				mu.Lock()
				errs = append(errs, string(m.Type)+": "+m.Text+" "+m.URL)
				mu.Unlock()
			}
		}
	}()
	return ctx, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), errs...)
	}
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	dir := filepath.Join("..", "..", "test", "artifacts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "web-"+name+".png"), buf, 0o644); err != nil {
		t.Error(err)
	}
}

type css = chromedp.CSS

func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return v
}

func js(code string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](code + "; undefined")
}

func poll(js string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(15*time.Second))
}

func noConsoleErrors(t *testing.T, errs func() []string, allow string) {
	t.Helper()
	for _, e := range errs() {
		if allow == "" || !strings.Contains(e, allow) {
			t.Errorf("console error: %s", e)
		}
	}
}

func TestPagesLoadWithoutConsoleErrors(t *testing.T) {
	ctx, errs := browser(t)
	pages := []struct{ hash, ready string }{
		{"flows", `#flow-table tbody tr`},
		{"map", `#map svg .node`},
		{"reach", `#reach-form`},
		{"trace", `#trace-form`},
		{"audit", `#audit-list li.dual`},
		{"sql", `#sql-form`},
	}
	for _, p := range pages {
		do(t, ctx,
			chromedp.Navigate(baseURL+"/#/"+p.hash),
			chromedp.WaitVisible(css(`#page-`+p.hash)),
			chromedp.WaitVisible(css(p.ready)),
			chromedp.Sleep(300*time.Millisecond),
		)
		screenshot(t, ctx, p.hash)
	}
	// The audit page lists dual-stack gaps first.
	if first := eval[string](t, ctx, `document.querySelector('#audit-list li').className`); first != "dual" {
		t.Errorf("first finding class %q", first)
	}
	noConsoleErrors(t, errs, "")
}

// rowFamilies counts the flow rows per family.
func rowFamilies(t *testing.T, ctx context.Context) map[string]int {
	t.Helper()
	fams := eval[[]string](t, ctx, `[...document.querySelectorAll('#flow-table tbody tr')].map(r => r.dataset.family)`)
	out := map[string]int{}
	for _, f := range fams {
		out[f]++
	}
	return out
}

func TestFlowFiltersChangeRows(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx, chromedp.Navigate(baseURL+"/#/flows"), chromedp.WaitVisible(css(`#flow-table tbody tr`)), chromedp.WaitVisible(css(`#flow-chart svg`)))
	before := rowFamilies(t, ctx)
	if before["4"] == 0 || before["6"] == 0 {
		t.Fatalf("unfiltered rows: %v", before)
	}
	// Family select: only IPv6 rows.
	do(t, ctx,
		js(`const s = document.querySelector('#f-family'); s.value = '6'; s.dispatchEvent(new Event('change'))`),
		poll(`document.querySelectorAll('#flow-table tbody tr').length > 0 && [...document.querySelectorAll('#flow-table tbody tr')].every(r => r.dataset.family === '6')`),
	)
	if got := rowFamilies(t, ctx); got["4"] != 0 || got["6"] == 0 {
		t.Errorf("IPv6 filter rows: %v", got)
	}
	// Expression filter: every row is denied.
	do(t, ctx,
		chromedp.SendKeys(css(`#f-expr`), "verdict=denied\r"),
		poll(`document.querySelectorAll('#flow-table tbody tr').length > 0 && [...document.querySelectorAll('#flow-table tbody td.verdict')].every(td => td.textContent === 'denied')`),
	)
	// A bad filter shows the API's field error.
	do(t, ctx,
		js(`document.querySelector('#f-expr').value = ''`),
		chromedp.SendKeys(css(`#f-expr`), "dst_ip=not-an-ip\r"),
		chromedp.WaitVisible(css(`#banner`)),
	)
	if msg := eval[string](t, ctx, `document.querySelector('#banner').textContent`); !strings.Contains(msg, "dst_ip") {
		t.Errorf("banner %q", msg)
	}
	// Detail drawer.
	do(t, ctx,
		js(`document.querySelector('#f-expr').value = ''`),
		chromedp.SendKeys(css(`#f-expr`), "\r"),
		poll(`!document.querySelector('#banner').textContent.includes('dst_ip') && document.querySelectorAll('#flow-table tbody tr').length > 0`),
		chromedp.Click(css(`#flow-table tbody tr`)),
		chromedp.WaitVisible(css(`#drawer dl.kv`)),
	)
	screenshot(t, ctx, "flows-drawer")
	// The bad filter's 400 is logged by Chromium as a failed resource.
	noConsoleErrors(t, errs, "400")
}

func TestLiveFollowShowsNewFlows(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/flows"),
		chromedp.WaitVisible(css(`#flow-table tbody tr`)),
		chromedp.Click(css(`#f-follow`)),
		chromedp.WaitVisible(css(`#banner.info`)),
	)
	// Flows received from now on arrive as fresh rows at the top.
	time.Sleep(300 * time.Millisecond)
	if err := engine.Exec(context.Background(), webtest.SeedSQL("dualflow", 20, time.Now().Add(2*time.Second), time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := chromedp.Do(ctx, poll(`new Set([...document.querySelectorAll('#flow-table tbody tr.fresh')].map(r => r.dataset.family)).size == 2`)); err != nil {
		t.Logf("live rows: %v", eval[[]string](t, ctx, `[...document.querySelectorAll('#flow-table tbody tr.fresh')].map(r => r.dataset.family + ' ' + r.cells[0].textContent + ' ' + r.cells[2].textContent)`))
	}
	fams := eval[[]string](t, ctx, `[...document.querySelectorAll('#flow-table tbody tr.fresh')].map(r => r.dataset.family)`)
	if !slices.Contains(fams, "4") || !slices.Contains(fams, "6") {
		t.Errorf("live rows of families %v", fams)
	}
	screenshot(t, ctx, "flows-follow")
	do(t, ctx, chromedp.Click(css(`#f-follow`)))
	noConsoleErrors(t, errs, "")
}

func TestReachabilityMatrixAndCellTrace(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/reach"),
		chromedp.WaitVisible(css(`#reach-form`)),
		chromedp.Click(css(`#reach-form button[type=submit]`)),
		chromedp.WaitVisible(css(`.matrix table[data-family="4"]`)),
		chromedp.WaitVisible(css(`.matrix table[data-family="6"]`)),
	)
	if n := eval[int](t, ctx, `document.querySelectorAll('.matrix table[data-family="6"] td.cell.asym').length`); n == 0 {
		t.Error("no asymmetric cell highlighted (frontend→db differs by family)")
	}
	// Row frontend, column db.
	cell := `tr:nth-child(2) td:nth-child(3)`
	v4 := eval[string](t, ctx, `document.querySelector('.matrix table[data-family="4"] `+cell+`').dataset.outcome`)
	v6 := eval[string](t, ctx, `document.querySelector('.matrix table[data-family="6"] `+cell+`').dataset.outcome`)
	if v4 != "allow" || v6 != "deny" {
		t.Errorf("frontend→db: IPv4 %s, IPv6 %s", v4, v6)
	}
	screenshot(t, ctx, "reach-matrix")
	do(t, ctx,
		chromedp.Click(css(`.matrix table[data-family="6"] `+cell)),
		chromedp.WaitVisible(css(`#drawer .trace[data-family="6"][data-outcome="dropped"]`)),
		chromedp.WaitVisible(css(`#drawer .trace[data-family="4"][data-outcome="delivered"]`)),
	)
	screenshot(t, ctx, "reach-cell-trace")
	noConsoleErrors(t, errs, "")
}

func TestTraceflowPage(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/trace"),
		chromedp.WaitVisible(css(`#trace-form`)),
		chromedp.Click(css(`#trace-form button[type=submit]`)),
		chromedp.WaitVisible(css(`#trace-out .trace[data-family="6"][data-outcome="dropped"] li.drop`)),
		chromedp.WaitVisible(css(`#trace-out .trace[data-family="4"][data-outcome="delivered"]`)),
	)
	if n := eval[int](t, ctx, `document.querySelectorAll('#trace-out .path li').length`); n < 5 {
		t.Errorf("%d hops drawn", n)
	}
	screenshot(t, ctx, "trace-result")
	noConsoleErrors(t, errs, "")
}

func TestSQLConsole(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/sql"),
		chromedp.WaitVisible(css(`#sql-text`)),
		chromedp.Click(css(`#sql-form button[type=submit]`)),
		chromedp.WaitVisible(css(`#sql-table tbody tr`)),
	)
	cells := eval[[]string](t, ctx, `[...document.querySelectorAll('#sql-table tbody tr td:first-child')].map(td => td.textContent)`)
	if strings.Join(cells, ",") != "4,6" {
		t.Errorf("families %v", cells)
	}
	screenshot(t, ctx, "sql-result")
	noConsoleErrors(t, errs, "")
}

// TestServerHealth checks the process-level endpoints through the web server.
func TestServerHealth(t *testing.T) {
	if engine == nil {
		t.Skip("libchdb not available")
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics", "/api/v1/openapi.json", "/", "/app.js"} {
		r, err := http.Get(baseURL + p)
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		if r.StatusCode != 200 {
			t.Errorf("%s: %d", p, r.StatusCode)
		}
	}
}
