// Package browsertest drives the web UI in headless Debian Chromium with
// chromedp against a real embedded store seeded with IPv4 and IPv6 flows,
// the fake evaluator and auditor, and the real traceflow controller over a
// fake node tracer and resolver of the lab. The tests skip without
// /usr/bin/chromium (or libchdb) unless DUALFLOW_E2E=1, then they fail.
// Screenshots of every page, in each IP mode at 1000 and 1400 px wide
// (TestPagesLoadWithoutConsoleErrors), and of the states the other tests
// reach go to test/artifacts/web-*.png.
package browsertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto"
	"github.com/chromedp/cdproto/cdp"
	cdpfetch "github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/recommend"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/test/support/fakes"
	"github.com/dualflow/dualflow/test/support/webtest"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/web"
	"github.com/dualflow/dualflow/web/api"
)

const chromium = "/usr/bin/chromium"

var (
	engine  *store.Embedded
	baseURL string
	// modeURL serves the same lab restricted to one family: "4" (an
	// IPv4-only cluster), "6" (IPv6-only); baseURL is the dual-stack one.
	modeURL = map[string]string{}
	// operatorToken is the servers' local operator token: without a
	// tokens file a page is a viewer, and SQL and traces need it. Every
	// tab has it in its local storage, as an operator who pasted it.
	operatorToken string
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
	tokenFile := filepath.Join(dir, web.LocalTokenFileName)
	if operatorToken, err = api.LoadOrCreateLocalToken(tokenFile); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var done []chan error
	var tfs []*traceflow.Controller
	// serve runs a server on database db; catalog (the main lab only)
	// serves /api/v1/catalog, so the single-family labs use the UI's
	// fallback, names from the flows.
	serve := func(db string, catalog api.Catalog, fams ...int) (string, error) {
		// The audit's store reports (the what-if) run over the same flows.
		reports, err := audit.NewReports(e, db)
		if err != nil {
			return "", err
		}
		// The audit's questions and the recommendations ask the same
		// view: the lab's pods and policy with their namespaces (a
		// recommendation's scope names one, which must exist).
		aud := fakes.NewAudit(reports, fams...)
		view := enrich.NewSnapshot(labObjects(fams...)...)
		aud.Cluster = func() (*enrich.Snapshot, error) { return view, nil }
		// The UI traces through the product's controller and REST API.
		tf := traceflow.New(traceflow.Config{}, fakes.NodeTracer{Delay: 200 * time.Millisecond}, fakes.Resolver{}, nil)
		tfs = append(tfs, tf)
		srv, err := web.New(web.Config{Addr: "127.0.0.1:0", Config: api.Config{
			Store: e, Database: db, LocalTokenFile: tokenFile,
			Evaluator: fakes.Evaluator{}, Traces: tf, Audit: aud,
			Recommend: &recommend.Queries{Queries: aud.Queries},
			Catalog:   catalog, Status: fakes.Status{Stale: &kubeStale},
		}})
		if err != nil {
			return "", err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		ch := make(chan error, 1)
		done = append(done, ch)
		go func() { ch <- srv.Serve(ctx, ln) }()
		return "http://" + ln.Addr().String(), nil
	}
	if baseURL, err = serve("dualflow", fakes.Catalog{}, 4, 6); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// Single-family labs: copies of the seeded flows of one family.
	for _, fam := range []string{"4", "6"} {
		db := "dualflow_v" + fam
		for _, sql := range []string{
			"CREATE DATABASE IF NOT EXISTS " + db,
			"CREATE TABLE " + db + ".flows AS dualflow.flows",
			"INSERT INTO " + db + ".flows SELECT * FROM dualflow.flows WHERE ip_version = " + fam,
		} {
			if err := e.Exec(context.Background(), sql); err != nil {
				fmt.Fprintln(os.Stderr, "seed", db+":", err)
				return 1
			}
		}
		v, _ := strconv.Atoi(fam)
		if modeURL[fam], err = serve(db, nil, v); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	browserDir = filepath.Join(dir, "chromium")
	code := m.Run()
	closeBrowser()
	cancel()
	for _, ch := range done {
		<-ch
	}
	for _, tf := range tfs {
		tf.Close()
	}
	return code
}

// The package's tests share one headless Chromium, started by the first
// browser call and stopped by runMain. A browser for each of the 35 tabs
// cost about 1.4 s of CPU each, more than many tests' own work: the
// package took 636 s on a loaded machine, against 262 s so.
var (
	browserOnce sync.Once
	browserCtx  context.Context // the browser's first tab; its children are the tests' tabs
	browserErr  error
	// browserDir is the browser's profile directory (set by runMain).
	browserDir   string
	closeBrowser = func() {}
)

func startBrowser() {
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(browserDir),
		chromedp.WindowSize(1400, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelC := chromedp.NewContext(actx)
	closeBrowser = func() { cancelC(); cancelA() }
	browserCtx, browserErr = ctx, chromedp.Do(ctx)
}

// browser opens a tab for t in the package's Chromium, in a browser
// context of its own (a fresh profile: no cookies, storage or cache of
// another test) and a window of its own, and returns the tab's context
// and a function reporting the console errors seen so far. The tab
// closes when t ends.
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
	browserOnce.Do(startBrowser)
	if browserErr != nil {
		t.Fatalf("start %s: %v", chromium, browserErr)
	}
	ctx, cancelC := chromedp.NewContext(browserCtx, chromedp.WithNewBrowserContext())
	ctx, cancelT := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancelT(); cancelC() })
	// Open the tab, then subscribe before any page loads.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatal(err)
	}
	setToken := chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := cdp.Call(ctx, t, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
			Source: "try { localStorage.setItem('dualflow.token', '" + operatorToken + "') } catch (e) {}",
		})
		return err
	})
	if err := chromedp.Do(ctx, setToken); err != nil {
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

// poll waits until js is true, 15 s at most. chromedp's Poll runs js in
// the page's execution context it last heard of, and just after a
// navigation that can be the old page's, which the browser no longer has
// (seen on a loaded machine): poll then waits in the new page's context.
func poll(js string) chromedp.Action[chromedp.Void] {
	p := chromedp.Poll[chromedp.Void](js, chromedp.WithPollingTimeout(15*time.Second))
	return func(ctx context.Context, t *chromedp.Target) (chromedp.Void, error) {
		for {
			v, err := p(ctx, t)
			var e *cdproto.Error
			if !errors.As(err, &e) || e.Message != "Cannot find context with specified id" && e.Message != "Execution context was destroyed." {
				return v, err
			}
			select {
			case <-ctx.Done():
				return v, fmt.Errorf("%w (after %w)", ctx.Err(), err)
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

// openFirstRow opens the drawer of the first row of the flow table. It
// clicks again until the drawer shows: a page the table is still loading
// replaces the rows, and a click on a row it replaced is lost.
func openFirstRow() chromedp.Action[chromedp.Void] {
	return poll(`(() => {
		if (!document.querySelector('#drawer').hidden && document.querySelector('#drawer dl.kv')) return true;
		document.querySelector('#flow-table tbody tr')?.click();
		return false;
	})()`)
}

func noConsoleErrors(t *testing.T, errs func() []string, allow ...string) {
	t.Helper()
	for _, e := range errs() {
		if !slices.ContainsFunc(allow, func(a string) bool { return a != "" && strings.Contains(e, a) }) {
			t.Errorf("console error: %s", e)
		}
	}
}

// TestPagesLoadWithoutConsoleErrors loads every page in each IP mode the
// labs have (dual-stack, IPv4-only, IPv6-only) at 1000 and 1400 px wide,
// and keeps a screenshot of each (test/artifacts/web-<mode>-<width>-<page>.png).
func TestPagesLoadWithoutConsoleErrors(t *testing.T) {
	pages := []struct{ name, path, ready string }{
		{"flows", "/#/flows", `#flow-table tbody tr`},
		{"charts", "/#/charts", `#chart-drops .uplot`},
		{"map", "/#/map", `#map canvas`},
		{"reach", reachURL, `.matrix table`},
		{"trace", "/#/trace", `#trace-form`},
		{"audit", "/#/audit", `#audit-list li.dual`},
		{"recommend", "/" + recommendDB, `#rec-out .recyaml`},
		{"sql", "/#/sql", `#sql-schema .examples a`},
	}
	for _, mode := range []struct{ name, base, allow string }{
		{"dual", baseURL, ""},
		// The single-family labs have no live view: /catalog answers 501
		// (the browser logs it) and the UI names what the flows name.
		{"v4", modeURL["4"], "/api/v1/catalog"},
		{"v6", modeURL["6"], "/api/v1/catalog"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			ctx, errs := browser(t)
			for _, width := range []int64{1000, 1400} {
				for _, p := range pages {
					do(t, ctx,
						chromedp.EmulateViewport(width, 900),
						chromedp.Navigate(mode.base+p.path),
						chromedp.WaitVisible(css(`#page-`+strings.SplitN(strings.TrimPrefix(p.path, "/#/"), "?", 2)[0])),
						chromedp.WaitVisible(css(p.ready)),
						poll(`!document.querySelector('#progress') || document.querySelector('#progress').hidden`),
					)
					// Nothing is wider than the window: no horizontal scroll.
					if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); w > int(width) {
						t.Errorf("%s at %d px is %d px wide", p.name, width, w)
					}
					screenshot(t, ctx, fmt.Sprintf("%s-%d-%s", mode.name, width, p.name))
				}
			}
			// The audit page lists dual-stack gaps first.
			if first := eval[string](t, ctx, `document.querySelector('#audit-list li').className`); first != "dual" {
				t.Errorf("first finding class %q", first)
			}
			noConsoleErrors(t, errs, mode.allow)
		})
	}
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
	do(t, ctx, chromedp.Navigate(baseURL+"/#/flows"), chromedp.WaitVisible(css(`#flow-table tbody tr`)), chromedp.WaitVisible(css(`#flow-chart .uplot`)))
	before := rowFamilies(t, ctx)
	if before["4"] == 0 || before["6"] == 0 {
		t.Fatalf("unfiltered rows: %v", before)
	}
	// Local time with the zone in the header; policy and drop-reason columns.
	if th := eval[string](t, ctx, `document.querySelector('#flow-time-h').textContent`); !strings.HasPrefix(th, "Time (") || th == "Time ()" {
		t.Errorf("time header %q", th)
	}
	heads := eval[[]string](t, ctx, `[...document.querySelectorAll('#flow-table thead th')].map(th => th.textContent)`)
	if !slices.Contains(heads, "Policy") || !slices.Contains(heads, "Drop reason") {
		t.Errorf("columns %v", heads)
	}
	// Family select: only IPv6 rows, and the URL keeps the filter.
	do(t, ctx,
		js(`const s = document.querySelector('#f-family'); s.value = '6'; s.dispatchEvent(new Event('change'))`),
		poll(`document.querySelectorAll('#flow-table tbody tr').length > 0 && [...document.querySelectorAll('#flow-table tbody tr')].every(r => r.dataset.family === '6')`),
	)
	if got := rowFamilies(t, ctx); got["4"] != 0 || got["6"] == 0 {
		t.Errorf("IPv6 filter rows: %v", got)
	}
	if h := eval[string](t, ctx, `location.hash`); !strings.Contains(h, "ip_version=6") {
		t.Errorf("URL %q does not keep the family", h)
	}
	// Expression filter: every row is denied, and dropped rows name a reason.
	do(t, ctx,
		chromedp.SendKeys(css(`#f-expr`), "verdict=denied\r"),
		poll(`document.querySelectorAll('#flow-table tbody tr').length > 0 && [...document.querySelectorAll('#flow-table tbody td.verdict')].every(td => td.textContent === 'denied')`),
	)
	if n := eval[int](t, ctx, `[...document.querySelectorAll('#flow-table tbody td.reason')].filter(td => td.textContent.includes('denied')).length`); n == 0 {
		t.Error("denied rows without a drop reason")
	}
	// Reloading the URL restores the page state.
	do(t, ctx,
		chromedp.Reload(),
		poll(`document.querySelector('#f-family').value === '6' && document.querySelector('#f-verdict').value === 'denied' && document.querySelectorAll('#flow-table tbody tr').length > 0 && [...document.querySelectorAll('#flow-table tbody tr')].every(r => r.dataset.family === '6')`),
		js(`const v = document.querySelector('#f-verdict'); v.value = ''`),
	)
	// A bad filter shows the API's field error, once.
	do(t, ctx,
		js(`document.querySelector('#f-expr').value = ''`),
		chromedp.SendKeys(css(`#f-expr`), "dst_ip=not-an-ip\r"),
		chromedp.WaitVisible(css(`#banner`)),
	)
	msg := eval[string](t, ctx, `document.querySelector('#banner').textContent`)
	if !strings.Contains(msg, "dst_ip") || strings.Count(msg, "dst_ip:") > 1 {
		t.Errorf("banner %q", msg)
	}
	if n := eval[int](t, ctx, `document.body.innerText.split('not-an-ip').length - 1 - (document.querySelector('#f-expr').value.includes('not-an-ip') ? 0 : 0)`); n > 1 {
		t.Errorf("the error shows %d times", n)
	}
	// Detail drawer with actions.
	do(t, ctx,
		js(`document.querySelector('#f-expr').value = ''`),
		chromedp.SendKeys(css(`#f-expr`), "\r"),
		poll(`!document.querySelector('#banner').textContent.includes('dst_ip') && document.querySelectorAll('#flow-table tbody tr').length > 0`),
		openFirstRow(),
		chromedp.WaitVisible(css(`#drawer #trace-this`)),
	)
	screenshot(t, ctx, "flows-drawer")
	href := eval[string](t, ctx, `document.querySelector('#trace-this').getAttribute('href')`)
	if !strings.HasPrefix(href, "#/trace?") || !strings.Contains(href, "family=dual") || !strings.Contains(href, "run=1") {
		t.Errorf("trace action %q", href)
	}
	// "Filter by source pod" opens Flows of that pod.
	do(t, ctx,
		chromedp.Click(css(`#drawer .actions a.act`)),
		poll(`location.hash.includes('pod=') && document.querySelectorAll('#flow-table tbody tr').length > 0 && document.querySelector('#f-expr').value.includes('pod=')`),
	)
	// "Trace this flow" runs a prefilled dual trace.
	do(t, ctx,
		openFirstRow(),
		chromedp.WaitVisible(css(`#drawer #trace-this`)),
		chromedp.Click(css(`#drawer #trace-this`)),
		chromedp.WaitVisible(css(`#trace-out .trace[data-family="4"]`)),
		chromedp.WaitVisible(css(`#trace-out .trace[data-family="6"]`)),
	)
	screenshot(t, ctx, "flows-trace-this")
	// The bad filter's 400 is logged by Chromium as a failed resource.
	noConsoleErrors(t, errs, "400")
}

// TestFlowDrawerWithoutService opens the drawer of a flow that went to
// no Service: the parts it lacks are left out, not printed as "null".
func TestFlowDrawerWithoutService(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/flows"),
		chromedp.WaitVisible(css(`#flow-table tbody tr`)),
		js(`api('/flows?since=1h&limit=1000').then(r => flowDrawer(r.flows.find(f => !f.service_name)))`),
		chromedp.WaitVisible(css(`#drawer dl.kv`)),
	)
	txt := eval[string](t, ctx, `document.querySelector('#drawer-body').innerText`)
	if strings.Contains(txt, "null") || strings.Contains(txt, "undefined") {
		t.Errorf("drawer of a flow without a Service:\n%s", txt)
	}
	if n := eval[int](t, ctx, `[...document.querySelectorAll('#drawer h3')].filter(e => e.textContent === 'Service').length`); n != 0 {
		t.Errorf("%d Service sections for a flow without one", n)
	}
	// A flow through a Service has the section.
	do(t, ctx,
		js(`api('/flows?since=1h&limit=1000').then(r => flowDrawer(r.flows.find(f => f.service_name)))`),
		poll(`[...document.querySelectorAll('#drawer h3')].some(e => e.textContent === 'Service')`),
	)
	noConsoleErrors(t, errs, "")
}

// TestFlowColumnsFit1000px: at 1000 px the default columns, source port
// and Verdict among them, show without horizontal scroll; the chooser
// shows and hides a column and the choice outlives a reload.
func TestFlowColumnsFit1000px(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx,
		chromedp.EmulateViewport(1000, 800),
		chromedp.Navigate(baseURL+"/#/flows"),
		chromedp.WaitVisible(css(`#flow-table tbody tr`)),
	)
	type fit struct {
		Scroll, Client int
		VerdictRight   float64
		WrapRight      float64
		Shown          []string
	}
	measure := func() fit {
		return eval[fit](t, ctx, `(() => { const w = document.querySelector('#flow-table').parentElement;
			return { Scroll: w.scrollWidth, Client: w.clientWidth,
				VerdictRight: document.querySelector('#flow-table th[data-col=verdict]').getBoundingClientRect().right,
				WrapRight: w.getBoundingClientRect().right,
				Shown: [...document.querySelectorAll('#flow-table thead th')].filter(th => !th.hidden).map(th => th.dataset.col) }; })()`)
	}
	m := measure()
	if m.Scroll > m.Client || m.VerdictRight > m.WrapRight {
		t.Errorf("at 1000 px the table scrolls: %+v", m)
	}
	for _, c := range []string{"src_port", "verdict", "dst_port"} {
		if !slices.Contains(m.Shown, c) {
			t.Errorf("default columns %v lack %s", m.Shown, c)
		}
	}
	screenshot(t, ctx, "flows-1000")
	// Show the drop reason, hide the source port: header and rows follow.
	do(t, ctx,
		chromedp.Click(css(`#flow-cols summary`)),
		chromedp.Click(css(`#flow-cols-list input[value=reason]`)),
		chromedp.Click(css(`#flow-cols-list input[value=src_port]`)),
	)
	visible := func(col string) [2]int {
		return eval[[2]int](t, ctx, `(() => { const cs = [...document.querySelectorAll('#flow-table [data-col=`+col+`]')];
			return [cs.filter(c => c.offsetWidth > 0).length, cs.length]; })()`)
	}
	if v := visible("reason"); v[0] != v[1] || v[0] < 2 {
		t.Errorf("drop reason shown in %d of %d cells", v[0], v[1])
	}
	if v := visible("src_port"); v[0] != 0 {
		t.Errorf("hidden source port shown in %d of %d cells", v[0], v[1])
	}
	// The choice is kept (localStorage): new rows and a reload follow it.
	do(t, ctx, chromedp.Reload(), chromedp.WaitVisible(css(`#flow-table tbody tr`)))
	if v := visible("reason"); v[0] != v[1] || v[0] < 2 {
		t.Errorf("after a reload drop reason shown in %d of %d cells", v[0], v[1])
	}
	if v := visible("src_port"); v[0] != 0 {
		t.Errorf("after a reload source port shown in %d of %d cells", v[0], v[1])
	}
	if on := eval[bool](t, ctx, `document.querySelector('#flow-cols-list input[value=src_port]').checked`); on {
		t.Error("the chooser does not show the kept choice")
	}
	noConsoleErrors(t, errs, "")
}

func TestICMPTypeNames(t *testing.T) {
	ctx, errs := browser(t)
	// The lab has no ICMP flows: check the names the column would show.
	do(t, ctx, chromedp.Navigate(baseURL+"/#/flows"), chromedp.WaitVisible(css(`#flow-table tbody tr`)))
	got := eval[[]string](t, ctx, `[icmpName({protocol_name: 'ICMP', ip_version: 4, dst_port: 2048}), icmpName({protocol_name: 'ICMPv6', ip_version: 6, dst_port: 32768}), icmpName({protocol_name: 'ICMP', ip_version: 4, dst_port: 0x0303})]`)
	want := []string{"echo request", "echo request", "destination unreachable code 3"}
	if !slices.Equal(got, want) {
		t.Errorf("ICMP names %v, want %v", got, want)
	}
	noConsoleErrors(t, errs, "")
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
	// Rows stay in time order, newest first, live or not.
	if !eval[bool](t, ctx, `[...document.querySelectorAll('#flow-table tbody tr')].map(r => Number(r.dataset.end)).every((t, i, a) => i === 0 || a[i-1] >= t)`) {
		t.Error("rows out of time order")
	}
	screenshot(t, ctx, "flows-follow")
	do(t, ctx, chromedp.Click(css(`#f-follow`)))
	noConsoleErrors(t, errs, "")
}

// TestLiveFollowResumes ends the first follow stream after one event and
// checks the reconnect sends that event's id as Last-Event-ID.
func TestLiveFollowResumes(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx, chromedp.Navigate(baseURL+"/#/flows"), chromedp.WaitVisible(css(`#flow-table tbody tr`)))
	do(t, ctx, js(`(() => {
		const real = window.fetch, enc = new TextEncoder();
		window.followCalls = [];
		const flow = { flow_end_ms: Date.now() + 60000, flow_start_ms: Date.now(), ip_version: 6, src_ip: 'fd00::1', dst_ip: 'fd00::2', src_port: 1, dst_port: 80, protocol_name: 'TCP', bytes: 1, reverse_bytes: 1, ingress_verdict: 'allowed', egress_verdict: 'allowed' };
		window.fetch = (url, init) => {
			if (!String(url).includes('follow=true')) return real(url, init);
			window.followCalls.push((init.headers || {})['Last-Event-ID'] || '');
			const first = window.followCalls.length === 1;
			const body = new ReadableStream({ start(c) {
				if (first) { c.enqueue(enc.encode('id:1700000000000-abcd\nevent:flow\ndata:' + JSON.stringify(flow) + '\n\n')); c.close(); }
			} });
			return Promise.resolve(new Response(body, { status: 200, headers: { 'Content-Type': 'text/event-stream' } }));
		};
	})()`))
	do(t, ctx,
		chromedp.Click(css(`#f-follow`)),
		poll(`window.followCalls.length >= 2`),
	)
	calls := eval[[]string](t, ctx, `window.followCalls`)
	if calls[0] != "" || calls[1] != "1700000000000-abcd" {
		t.Errorf("follow requests sent Last-Event-ID %q", calls)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('#flow-table tbody tr.fresh').length`); n != 1 {
		t.Errorf("%d live rows", n)
	}
	do(t, ctx, chromedp.Click(css(`#f-follow`)))
	noConsoleErrors(t, errs, "")
}

func TestCharts(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/charts?since=1h"),
		chromedp.WaitVisible(css(`#chart-bytes .uplot`)),
		chromedp.WaitVisible(css(`#chart-flows .uplot`)),
		chromedp.WaitVisible(css(`#chart-drops .uplot`)),
		chromedp.WaitVisible(css(`#talkers tbody tr`)),
		chromedp.WaitVisible(css(`#drops tbody tr`)),
	)
	// One hour in one-minute buckets, the last one partial; series for
	// both families, and the dropped flows of each in a panel and y-scale
	// of their own, each family in its colour.
	if n := eval[string](t, ctx, `document.querySelector('#chart-flows').dataset.buckets`); n != "60" {
		t.Errorf("%s buckets", n)
	}
	type legendRow struct{ Label, Value, Colour string }
	legend := func(chart string) []legendRow {
		return eval[[]legendRow](t, ctx, `[...document.querySelectorAll('`+chart+` .u-legend .u-series')].map(r => ({
			Label: r.querySelector('.u-label').textContent, Value: r.querySelector('.u-value').textContent,
			Colour: getComputedStyle(r.querySelector('.u-marker')).borderTopColor }))`)
	}
	want := map[string]map[string]string{
		"#chart-flows": {"IPv4": "rgb(37, 99, 235)", "IPv6": "rgb(147, 51, 234)"},
		"#chart-drops": {"IPv4 dropped": "rgb(37, 99, 235)", "IPv6 dropped": "rgb(147, 51, 234)"},
	}
	for chart, series := range want {
		rows := legend(chart)
		for label, colour := range series {
			i := slices.IndexFunc(rows, func(r legendRow) bool { return r.Label == label })
			if i < 0 {
				t.Errorf("%s legend %+v lacks %s", chart, rows, label)
				continue
			}
			// Without hover the legend shows the window's total.
			if r := rows[i]; r.Colour != colour || !strings.HasPrefix(r.Value, "Σ ") || r.Value == "Σ 0" && label != "IPv4 dropped" {
				t.Errorf("%s legend %s: %+v, want colour %s and the window's total", chart, label, r, colour)
			}
		}
	}
	if drops := eval[string](t, ctx, `document.querySelector('#chart-drops').uplot.series[2].stroke()`); drops != "#9333ea" {
		t.Errorf("IPv6 dropped drawn in %s", drops)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('#chart-bytes .u-axis').length`); n < 2 {
		t.Errorf("%d axes", n)
	}
	fams := eval[[]string](t, ctx, `[...new Set([...document.querySelectorAll('#talkers tbody tr')].map(r => r.dataset.family))].sort()`)
	if !slices.Equal(fams, []string{"4", "6"}) {
		t.Errorf("top talkers of families %v", fams)
	}
	// Drops by policy count every dropped flow of the window (the lab's
	// IPv6 frontend → db flows, denied by shop/db-policy).
	drops := eval[[]string](t, ctx, `[...document.querySelectorAll('#drops tbody tr')].map(r => [...r.cells].slice(0, 3).map(c => c.textContent).join(' '))`)
	total := eval[string](t, ctx, `document.querySelector('#charts-out .totals [data-family="6"] .verdict').textContent`)
	if len(drops) != 1 || !strings.HasPrefix(drops[0], "shop/db-policy 0 ") || !strings.HasSuffix(total, " dropped") || strings.TrimSuffix(total, " dropped") != strings.TrimPrefix(drops[0], "shop/db-policy 0 ") {
		t.Errorf("drops by policy %v, IPv6 total %q", drops, total)
	}
	screenshot(t, ctx, "charts")
	// The previous period (the hour before) is a dashed total on bytes
	// and flows, of as many buckets.
	for _, chart := range []string{"#chart-bytes", "#chart-flows"} {
		prev := eval[struct {
			Dashed bool
			N      int
		}](t, ctx, `(u => { const i = u.series.findIndex(s => s.label === 'previous period'); return i < 0 ? {} : { Dashed: !!u.series[i].dash, N: u.data[i].length }; })(document.querySelector('`+chart+`').uplot)`)
		if !prev.Dashed || prev.N != 60 {
			t.Errorf("%s previous period %+v, want a dashed series of 60 buckets", chart, prev)
		}
	}
	// Group by a dimension: the legends name its groups, computed in the
	// store (the lab's destination namespaces, ports, labels).
	labels := func(chart string) []string {
		return eval[[]string](t, ctx, `document.querySelector('`+chart+`').uplot.series.slice(1).map(s => s.label).filter(l => l !== 'previous period').sort()`)
	}
	choose := func(field, value, title string) {
		t.Helper()
		do(t, ctx,
			js(`{ const s = document.querySelector('#charts-form [name=`+field+`]'); s.value = '`+value+`'; s.dispatchEvent(new Event('change')) }`),
			poll(`(el => el?.uplot && el.dataset.mode === document.querySelector('#charts-form').mode.value && el.uplot.root.querySelector('.u-title').textContent.includes('`+title+`'))(document.querySelector('#chart-flows'))`),
		)
	}
	choose("dimension", "namespace", "per namespace")
	for _, chart := range []string{"#chart-bytes", "#chart-flows"} {
		if got := labels(chart); !slices.Equal(got, []string{"infra", "shop"}) {
			t.Errorf("%s namespaces %v", chart, got)
		}
	}
	// Without hover a group of both families shows each one's total.
	if v := eval[string](t, ctx, `[...document.querySelectorAll('#chart-bytes .u-legend .u-series')].find(r => r.querySelector('.u-label').textContent === 'shop').querySelector('.u-value').textContent`); !strings.HasPrefix(v, "Σ ") || !strings.Contains(v, "(IPv4 ") || !strings.Contains(v, " · IPv6 ") {
		t.Errorf("shop legend %q, want the total and each family's", v)
	}
	if h := eval[string](t, ctx, `location.hash`); !strings.Contains(h, "dimension=namespace") {
		t.Errorf("hash %s lacks the dimension", h)
	}
	choose("top", "5", "per namespace")
	choose("dimension", "port", "per port")
	if got := labels("#chart-bytes"); !slices.Equal(got, []string{"53", "5432", "8080"}) {
		t.Errorf("ports %v", got)
	}
	// 100%: each bucket with traffic sums to 100 (the top of the stack),
	// an empty one to 0; no previous period on a share.
	choose("mode", "percent", "share of each bucket")
	type shares struct {
		Hundred, Zero, Other int
		Prev                 bool
	}
	for _, chart := range []string{"#chart-bytes", "#chart-flows"} {
		sh := eval[shares](t, ctx, `(u => { const r = { Hundred: 0, Zero: 0, Other: 0, Prev: u.series.some(s => s.label === 'previous period') };
			for (const v of u.data[1]) { if (Math.abs(v - 100) < 1e-6) r.Hundred++; else if (v === 0) r.Zero++; else r.Other++; } return r; })(document.querySelector('`+chart+`').uplot)`)
		if sh.Hundred < 50 || sh.Other != 0 || sh.Hundred+sh.Zero != 60 || sh.Prev {
			t.Errorf("%s 100%%: %+v buckets, want each at 100 or 0, no previous period", chart, sh)
		}
	}
	screenshot(t, ctx, "charts-percent")
	// Lines: a line per group, each the group's own value, with the
	// previous period again.
	choose("mode", "lines", "Flows per port")
	if m := eval[string](t, ctx, `document.querySelector('#chart-bytes').dataset.mode`); m != "lines" {
		t.Errorf("mode %s", m)
	}
	if got := eval[[]string](t, ctx, `document.querySelector('#chart-bytes').uplot.series.slice(1).map(s => s.label)`); len(got) != 4 || got[3] != "previous period" {
		t.Errorf("lines %v", got)
	}
	// The view is in the URL: a link opens it (workload: the destinations
	// as the API names them), without the previous period when asked.
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/charts?since=1h&dimension=workload&mode=lines&compare=none"),
		poll(`(u => u && u.root.querySelector('.u-title').textContent.includes('per workload'))(document.querySelector('#chart-bytes')?.uplot)`),
	)
	if got := eval[[]string](t, ctx, `document.querySelector('#chart-bytes').uplot.series.slice(1).map(s => s.label).sort()`); !slices.Equal(got, []string{"shop/db", "svc:infra/dns", "svc:shop/cart", "svc:shop/db"}) {
		t.Errorf("workloads %v", got)
	}
	if f := eval[string](t, ctx, `(f => [f.dimension.value, f.mode.value, f.compare.value].join())(document.querySelector('#charts-form'))`); f != "workload,lines,none" {
		t.Errorf("form %s", f)
	}
	// An empty window's y-axis labels only its zero.
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/charts?since=1h&namespace=none-such"),
		poll(`document.querySelector('#drops tbody td.muted') && document.querySelector('#chart-bytes')?.uplot`),
	)
	for _, chart := range []string{"#chart-bytes", "#chart-flows", "#chart-drops"} {
		ticks := eval[[]string](t, ctx, `document.querySelector('`+chart+`').uplot.axes[1]._values`)
		var labelled []string
		for _, v := range ticks {
			if v != "" {
				labelled = append(labelled, v)
			}
		}
		if len(labelled) != 1 || labelled[0] != "0 B" && labelled[0] != "0" {
			t.Errorf("%s empty y-axis %q", chart, ticks)
		}
	}
	screenshot(t, ctx, "charts-empty")
	// A top talker links to its flows.
	do(t, ctx, chromedp.Navigate(baseURL+"/#/charts?since=1h"), chromedp.WaitVisible(css(`#talkers tbody tr`)))
	do(t, ctx,
		chromedp.Click(css(`#talkers tbody tr a`)),
		poll(`location.hash.startsWith('#/flows') && document.querySelectorAll('#flow-table tbody tr').length > 0`),
	)
	noConsoleErrors(t, errs, "")
}

// sankeyLink is a link of the Charts page's Sankey as drawn.
type sankeyLink struct {
	Src, Dst, Family, Stroke string
	Value, Width             float64
}

// sankeyLinks reads the links of #chart-sankey.
func sankeyLinks(t *testing.T, ctx context.Context) []sankeyLink {
	t.Helper()
	return eval[[]sankeyLink](t, ctx, `[...document.querySelectorAll('#chart-sankey .links path')].map(p => ({ Src: p.dataset.src, Dst: p.dataset.dst,
		Family: p.dataset.family, Stroke: p.getAttribute('stroke'), Value: +p.dataset.value, Width: +p.dataset.width }))`)
}

// sankeyNodes reads the names of #chart-sankey's nodes on one side, top
// to bottom.
func sankeyNodes(t *testing.T, ctx context.Context, side string) []string {
	t.Helper()
	return eval[[]string](t, ctx, `[...document.querySelectorAll('#chart-sankey .nodes g[data-side=`+side+`]')].sort((a, b) => a.querySelector('rect').y.baseVal.value - b.querySelector('rect').y.baseVal.value).map(g => g.dataset.name)`)
}

// checkSankeyWidths: every link is drawn in its family's colour and its
// width is its value on one scale (d3-sankey's), so that a bigger value is
// a wider link.
func checkSankeyWidths(t *testing.T, links []sankeyLink) {
	t.Helper()
	if len(links) == 0 {
		t.Fatal("no Sankey links")
	}
	colour := map[string]string{"4": "#2563eb", "6": "#9333ea"}
	k := links[0].Width / links[0].Value
	for _, l := range links {
		if l.Stroke != colour[l.Family] {
			t.Errorf("link %+v not in its family's colour", l)
		}
		if l.Value <= 0 || math.Abs(l.Width/l.Value-k) > 1e-6*k {
			t.Errorf("link %+v: width not on the scale of %+v", l, links[0])
		}
	}
}

// TestChartsSideAndSankey: the Charts page groups by either side of the
// flows, and draws the window's source → destination pairs as a Sankey
// (computed in the store: /flows/summary?pairs=), in IPv4-only, IPv6-only
// and dual labs; screenshots at 1000 and 1400 px.
func TestChartsSideAndSankey(t *testing.T) {
	ctx, errs := browser(t)
	titled := func(chart, title string) chromedp.Action[chromedp.Void] {
		return poll(`(u => u && u.root.querySelector('.u-title').textContent.includes('` + title + `'))(document.querySelector('` + chart + `')?.uplot)`)
	}
	labels := func() []string {
		return eval[[]string](t, ctx, `document.querySelector('#chart-bytes').uplot.series.slice(1).map(s => s.label).filter(l => l !== 'previous period').sort()`)
	}
	set := func(field, value string) chromedp.Action[chromedp.Void] {
		return js(`{ const s = document.querySelector('#charts-form [name=` + field + `]'); s.value = '` + value + `'; s.dispatchEvent(new Event('change')) }`)
	}
	// Side: where the flows come from (the lab's clients are all in shop),
	// then where they go; the side is in the URL.
	do(t, ctx, chromedp.Navigate(baseURL+"/#/charts?since=1h&dimension=namespace&side=src"), titled("#chart-bytes", "per namespace (source)"))
	if got := labels(); !slices.Equal(got, []string{"shop"}) {
		t.Errorf("source namespaces %v", got)
	}
	do(t, ctx, set("side", "dst"), titled("#chart-bytes", "per namespace (destination)"))
	if got := labels(); !slices.Equal(got, []string{"infra", "shop"}) {
		t.Errorf("destination namespaces %v", got)
	}
	do(t, ctx, set("dimension", "workload"), set("side", "src"), titled("#chart-bytes", "per workload (source)"))
	if got := labels(); !slices.Equal(got, []string{"shop/cart", "shop/frontend"}) {
		t.Errorf("source workloads %v", got)
	}
	if h := eval[string](t, ctx, `location.hash`); !strings.Contains(h, "dimension=workload&side=src") {
		t.Errorf("hash %s lacks the side", h)
	}
	// A port is the destination's: no side to choose (nor a unit, but in
	// a Sankey).
	do(t, ctx, set("dimension", "port"), titled("#chart-bytes", "per port"))
	if d := eval[[]bool](t, ctx, `(f => [f.side.disabled, f.unit.disabled])(document.querySelector('#charts-form'))`); !slices.Equal(d, []bool{true, true}) {
		t.Errorf("side, unit disabled %v for ports, want both", d)
	}
	// Sankey: source namespace → destination namespace, a link per pair
	// and family, the biggest node first in each column.
	do(t, ctx, set("dimension", "namespace"), set("mode", "sankey"), chromedp.WaitVisible(css(`#chart-sankey .links path`)))
	names := func(ls []sankeyLink) []string {
		var out []string
		for _, l := range ls {
			out = append(out, l.Src+">"+l.Dst+"/"+l.Family)
		}
		slices.Sort(out)
		return out
	}
	links := sankeyLinks(t, ctx)
	if got := names(links); !slices.Equal(got, []string{"shop>infra/4", "shop>infra/6", "shop>shop/4", "shop>shop/6"}) {
		t.Errorf("namespace links %v", got)
	}
	if s, d := sankeyNodes(t, ctx, "src"), sankeyNodes(t, ctx, "dst"); !slices.Equal(s, []string{"shop"}) || !slices.Equal(d, []string{"shop", "infra"}) {
		t.Errorf("namespace nodes %v → %v", s, d)
	}
	checkSankeyWidths(t, links)
	if h := eval[string](t, ctx, `location.hash`); !strings.Contains(h, "mode=sankey") || strings.Contains(h, "side=") {
		t.Errorf("hash %s: want the Sankey mode and no side", h)
	}
	// Workloads in flows: each family's links sum to its flows in the
	// totals (what the store counted), and still follow the scale.
	do(t, ctx, set("dimension", "workload"), set("unit", "flows"),
		poll(`document.querySelector('#chart-sankey .u-title')?.textContent.includes('workload, flows')`))
	links = sankeyLinks(t, ctx)
	if got := names(links); !slices.Equal(got, []string{"shop/cart>svc:infra/dns/4", "shop/cart>svc:infra/dns/6", "shop/cart>svc:shop/db/4",
		"shop/frontend>shop/db/4", "shop/frontend>shop/db/6", "shop/frontend>svc:infra/dns/4", "shop/frontend>svc:infra/dns/6", "shop/frontend>svc:shop/cart/4", "shop/frontend>svc:shop/cart/6"}) {
		t.Errorf("workload links %v", got)
	}
	checkSankeyWidths(t, links)
	for _, fam := range []string{"4", "6"} {
		var sum float64
		for _, l := range links {
			if l.Family == fam {
				sum += l.Value
			}
		}
		total := eval[string](t, ctx, `document.querySelector('#charts-out .totals [data-family="`+fam+`"]').textContent`)
		if !strings.Contains(total, fmt.Sprintf(" %d flows ", int(sum))) {
			t.Errorf("IPv%s links sum to %v flows, the totals say %q", fam, sum, total)
		}
	}
	// Top 3: the rest of the 4 destinations folded into (other), last in
	// its column; the 2 sources as they are.
	do(t, ctx, set("top", "3"), poll(`[...document.querySelectorAll('#chart-sankey .nodes g')].some(g => g.dataset.name === '(other)')`))
	if s, d := sankeyNodes(t, ctx, "src"), sankeyNodes(t, ctx, "dst"); len(s) != 2 || slices.Contains(s, "(other)") || len(d) != 4 || d[3] != "(other)" {
		t.Errorf("top 3 nodes %v → %v, want 2 sources, 3 destinations and (other)", s, d)
	}
	checkSankeyWidths(t, sankeyLinks(t, ctx))
	// Screenshots at both widths, none scrolling sideways.
	for _, width := range []int64{1000, 1400} {
		do(t, ctx, chromedp.EmulateViewport(width, 900), chromedp.Navigate("about:blank"),
			chromedp.Navigate(baseURL+"/#/charts?since=1h&dimension=workload&mode=sankey"),
			poll(`(s => s && s.getAttribute('width') > `+fmt.Sprint(width/2)+` && s.getAttribute('width') <= `+fmt.Sprint(width)+`)(document.querySelector('#chart-sankey svg'))`),
			chromedp.WaitVisible(css(`#chart-sankey .links path`)))
		if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); w > int(width) {
			t.Errorf("Sankey at %d px is %d px wide", width, w)
		}
		screenshot(t, ctx, fmt.Sprintf("charts-sankey-%d", width))
	}
	noConsoleErrors(t, errs, "")
	// One family only: its links alone, in its colour. (The single-family
	// labs have no live view: the browser logs /catalog's 501.)
	ctx, errs = browser(t)
	for _, fam := range []string{"4", "6"} {
		do(t, ctx, chromedp.Navigate(modeURL[fam]+"/#/charts?since=1h&dimension=namespace&mode=sankey"), chromedp.WaitVisible(css(`#chart-sankey .links path`)))
		links := sankeyLinks(t, ctx)
		if got := names(links); !slices.Equal(got, []string{"shop>infra/" + fam, "shop>shop/" + fam}) {
			t.Errorf("IPv%s-only links %v", fam, got)
		}
		checkSankeyWidths(t, links)
	}
	// An empty window says so.
	do(t, ctx, chromedp.Navigate(baseURL+"/#/charts?since=1h&namespace=none-such&mode=sankey"),
		poll(`document.querySelector('#chart-sankey svg text.empty')?.textContent === 'no flows in this window'`))
	if n := eval[int](t, ctx, `document.querySelectorAll('#chart-sankey .links path, #chart-sankey .nodes g').length`); n != 0 {
		t.Errorf("empty Sankey draws %d links and nodes", n)
	}
	noConsoleErrors(t, errs, "/api/v1/catalog")
}

func TestServiceMap(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/map"),
		chromedp.WaitVisible(css(`#map canvas`)),
		poll(`window.dualflowMap && window.dualflowMap.edges().length > 0`),
	)
	type stats struct {
		V4, V6, Dropped, Backend, Namespaces, Arrows int
		Labels                                       []string
	}
	st := eval[stats](t, ctx, `(() => { const cy = window.dualflowMap; return {
		V4: cy.edges('.v4').length, V6: cy.edges('.v6').length, Dropped: cy.edges('.dropped').length,
		Backend: cy.edges('.backend').length, Namespaces: cy.nodes('.namespace').length,
		Arrows: cy.edges().filter(e => e.style('target-arrow-shape') !== 'none').length,
		Labels: cy.edges('.v4, .v6').map(e => e.data('label')) }; })()`)
	if st.V4 == 0 || st.V6 == 0 || st.Dropped == 0 || st.Namespaces < 2 || st.Arrows != st.V4+st.V6+st.Backend {
		t.Errorf("map: %+v", st)
	}
	if st.Backend == 0 {
		t.Error("no Service → backend edge")
	}
	for _, l := range st.Labels {
		if !strings.HasPrefix(l, "v4 ") && !strings.HasPrefix(l, "v6 ") || !strings.Contains(l, "/s") && !strings.Contains(l, "dropped") {
			t.Errorf("edge label %q", l)
		}
	}
	// Dropped edges are drawn apart from the allowed ones, in red.
	if c := eval[string](t, ctx, `window.dualflowMap.edges('.dropped')[0].style('line-color')`); c != "rgb(220,38,38)" {
		t.Errorf("dropped edge colour %q", c)
	}
	do(t, ctx, js(`window.dualflowMap.edges('.dropped.v6')[0].emit('mouseover')`))
	if hv := eval[string](t, ctx, `document.querySelector('#map-hover').textContent`); !strings.Contains(hv, "IPv6 dropped") {
		t.Errorf("hover %q", hv)
	}
	screenshot(t, ctx, "map-graph")
	// Edges carry no label until hovered.
	if l := eval[string](t, ctx, `window.dualflowMap.edges('.v4')[0].style('label')`); l != "" {
		t.Errorf("edge label shown without hover: %q", l)
	}
	// Clicking an IPv6 dropped edge opens its drawer: flows per family,
	// the reachability cell and a dual trace of the pair, and a policy
	// recommendation for its destination workload.
	do(t, ctx,
		js(`window.dualflowMap.edges('.dropped.v6')[0].emit('tap')`),
		poll(`!document.querySelector('#drawer').hidden && document.querySelectorAll('#drawer .edge-families li').length > 0 && [...document.querySelectorAll('#drawer a')].some(a => a.textContent === 'Dual trace')`),
	)
	type drawer struct{ Flows6, Dropped6, Reach, Trace, Recommend string }
	dr := eval[drawer](t, ctx, `(() => { const q = s => document.querySelector(s)?.getAttribute('href') || '';
		const as = [...document.querySelectorAll('#drawer a')];
		return { Flows6: q('#drawer .edge-families li[data-family="6"] a'), Dropped6: q('#drawer .edge-families li[data-family="6"] a:nth-of-type(2)'),
			Reach: (as.find(a => a.textContent.startsWith('Reachability cell')) || {}).hash || '', Trace: (as.find(a => a.textContent === 'Dual trace') || {}).hash || '',
			Recommend: (as.find(a => a.textContent.startsWith('Recommend a policy for ')) || {}).hash || '' }; })()`)
	if !strings.Contains(dr.Flows6, "ip_version=6") || !strings.Contains(dr.Flows6, "src_workload=") || !strings.Contains(dr.Dropped6, "verdict=dropped") ||
		!strings.Contains(dr.Reach, "#/reach?sources=workload%3A") || !strings.Contains(dr.Reach, "port=") ||
		!strings.Contains(dr.Trace, "#/trace?source=workload%3A") || !strings.Contains(dr.Trace, "family=dual") ||
		!strings.HasPrefix(dr.Recommend, "#/recommend?namespace=") || !strings.HasSuffix(dr.Recommend, "&mode=least-privilege&window=6h&run=1") {
		t.Errorf("edge drawer: %+v", dr)
	}
	do(t, ctx,
		js(`document.querySelector('#drawer .edge-families li[data-family="6"] a:nth-of-type(2)').click()`),
		poll(`location.hash.startsWith('#/flows') && document.querySelectorAll('#flow-table tbody tr').length > 0`),
	)
	h := eval[string](t, ctx, `location.hash`)
	if !strings.Contains(h, "ip_version=6") || !strings.Contains(h, "verdict=dropped") || !strings.Contains(h, "src_workload=") {
		t.Errorf("edge drawer link opened %q", h)
	}
	if got := rowFamilies(t, ctx); got["4"] != 0 {
		t.Errorf("edge flows: %v", got)
	}
	do(t, ctx, js(`closeDrawer()`))
	// Clicking a node opens the flows of that workload.
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/map"),
		poll(`window.dualflowMap && window.dualflowMap.nodes('.workload').length > 0`),
		js(`window.dualflowMap.getElementById('shop/db').emit('tap')`),
		poll(`location.hash.includes('workload=shop%2Fdb') && document.querySelectorAll('#flow-table tbody tr').length > 0`),
	)
	noConsoleErrors(t, errs, "")
}

// TestServiceMapManyWorkloads draws 200 workloads and checks the layout
// keeps nodes apart (readable) within a bounded time.
func TestServiceMapManyWorkloads(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx, chromedp.Navigate(baseURL+"/#/map"), poll(`window.dualflowMap && window.dualflowMap.edges().length > 0`))
	type res struct {
		Ms                    float64
		Overlap, Nodes, Loops int
		Namespaces            int
	}
	r := eval[res](t, ctx, `(() => {
		const nodes = [], edges = [];
		// 8 namespaces of 25 workloads: a chain in each namespace over both
		// families, calls to the next namespace, and everyone to svc:kube-system/dns.
		for (let i = 0; i < 200; i++) nodes.push({ id: 'team' + Math.floor(i / 25) + '/w' + i, kind: 'workload', families: [4, 6] });
		nodes.push({ id: 'svc:kube-system/dns', kind: 'service', families: [4, 6] });
		const e = (a, b, v, verdict) => edges.push({ src: a, dst: b, ip_version: v, verdict, flows: 10, bytes: 1000 * (edges.length + 1) });
		for (let i = 0; i < 200; i++) {
			if (i % 25 !== 24) { e(nodes[i].id, nodes[i + 1].id, 4, 'allowed'); e(nodes[i].id, nodes[i + 1].id, 6, i % 11 ? 'allowed' : 'dropped'); }
			if (i % 25 === 0) e(nodes[i].id, nodes[(i + 25) % 200].id, 4, 'allowed');
			if (i % 5 === 0) e(nodes[i].id, 'svc:kube-system/dns', i % 10 ? 4 : 6, 'allowed');
		}
		e(nodes[3].id, nodes[3].id, 6, 'allowed'); // a workload calling itself
		const t0 = performance.now();
		drawMap(document.querySelector('#map'), { nodes, edges }, [], new URLSearchParams('since=1h'));
		const ms = performance.now() - t0;
		const ps = window.dualflowMap.nodes('.workload').map(n => n.position());
		let overlap = 0;
		for (let i = 0; i < ps.length; i++) for (let j = i + 1; j < ps.length; j++) if (Math.hypot(ps[i].x - ps[j].x, ps[i].y - ps[j].y) < 15) overlap++;
		const self = window.dualflowMap.edges('.self');
		return { Ms: ms, Overlap: overlap, Nodes: ps.length, Loops: self.filter(x => x.isLoop()).length, Namespaces: window.dualflowMap.nodes('.namespace').length };
	})()`)
	t.Logf("200 workloads laid out in %.0f ms, %d overlapping pairs", r.Ms, r.Overlap)
	if r.Nodes != 200 || r.Overlap > 0 || r.Ms > 20000 || r.Loops != 1 || r.Namespaces != 9 {
		t.Errorf("layout: %+v", r)
	}
	do(t, ctx, chromedp.Sleep(300*time.Millisecond))
	screenshot(t, ctx, "map-200")
	noConsoleErrors(t, errs, "")
}

// TestServiceMapLayout draws the map of issue 37 §2 (frontend → backend
// calls beside an unrelated tools/probe-1, a self loop in frontend) at
// 1400 and 1000 px and checks that no edge's straight segment crosses a
// node box other than its ends and their namespaces, that a self loop
// keeps off the namespace title, and that the seeded map does the same.
func TestServiceMapLayout(t *testing.T) {
	for _, width := range []int64{1400, 1000} {
		t.Run(fmt.Sprint(width), func(t *testing.T) {
			ctx, errs := browser(t)
			do(t, ctx,
				chromedp.EmulateViewport(width, 900),
				chromedp.Navigate(baseURL+"/#/map"),
				poll(`window.dualflowMap && window.dualflowMap.edges().length > 0`),
			)
			if bad := eval[[]string](t, ctx, `mapOverlaps(window.dualflowMap)`); len(bad) > 0 {
				t.Errorf("seeded map: edges over unrelated nodes: %v", bad)
			}
			type res struct {
				Bad       []string
				LoopTitle bool
				Loops     int
			}
			r := eval[res](t, ctx, `(() => {
				const n = (id, fam) => ({ id, kind: 'workload', families: fam || [4, 6] });
				const nodes = [n('frontend/web'), n('frontend/ui'), n('backend/api'), n('backend/db'), n('tools/probe-1'), n('tools/probe-2'), n('tools/debug', [6]),
					n('monitoring/prom'), { id: '198.18.0.9', kind: 'external', families: [4] }, { id: 'svc:backend/api', kind: 'service', families: [4, 6] }];
				const edges = [];
				const e = (a, b, v, verdict) => edges.push({ src: a, dst: b, ip_version: v, verdict: verdict || 'allowed', flows: 5, bytes: 5000 });
				e('frontend/web', 'backend/api', 4); e('frontend/web', 'backend/api', 6, 'dropped'); e('frontend/ui', 'svc:backend/api', 6);
				e('frontend/web', 'frontend/web', 6); e('frontend/ui', 'frontend/web', 4); e('backend/api', 'backend/db', 4); e('backend/api', 'backend/db', 6);
				e('tools/probe-1', 'tools/probe-2', 6); e('tools/debug', 'tools/probe-1', 6); e('monitoring/prom', 'frontend/web', 4); e('monitoring/prom', 'backend/api', 6);
				e('monitoring/prom', 'tools/probe-1', 4); e('backend/db', '198.18.0.9', 4);
				drawMap(document.querySelector('#map'), { nodes, edges }, [{ svc: 'svc:backend/api', backend: 'backend/api' }], new URLSearchParams('since=1h'));
				const cy = window.dualflowMap, loop = cy.edges().filter(x => x.isLoop());
				const title = cy.getElementById('ns:frontend').boundingBox({ includeNodes: false, includeEdges: false, includeLabels: true, includeOverlays: false });
				const lb = loop[0].boundingBox({ includeLabels: false, includeOverlays: false });
				const cross = (a, b) => a.x1 < b.x2 && b.x1 < a.x2 && a.y1 < b.y2 && b.y1 < a.y2;
				return { Bad: mapOverlaps(cy), LoopTitle: cross(title, lb), Loops: loop.length };
			})()`)
			if len(r.Bad) > 0 || r.LoopTitle || r.Loops != 1 {
				t.Errorf("layout: %+v", r)
			}
			screenshot(t, ctx, fmt.Sprintf("map-layout-%d", width))
			noConsoleErrors(t, errs, "")
		})
	}
}

// TestServiceMapScopeAndGrouping: the scope keeps one namespace and its
// peers; grouping by namespace draws one vertex per namespace, by node
// each workload in the boxes of the nodes it ran on (both families), its
// edge drawer filtering by the nodes; at 1400 and 1000 px, none scrolling
// sideways or laying an edge over an unrelated box.
func TestServiceMapScopeAndGrouping(t *testing.T) {
	for _, width := range []int64{1400, 1000} {
		t.Run(fmt.Sprint(width), func(t *testing.T) {
			ctx, errs := browser(t)
			type res struct {
				Edges, Outside, Peers, NsGroups, Workloads, Boxes, Unboxed, V4, V6 int
				Bad                                                                []string
				Fits                                                               bool
			}
			state := func() res {
				return eval[res](t, ctx, `(() => { const cy = window.dualflowMap, ns = id => nodeNamespace(id);
					const ends = e => [e.source().data('ref') || e.source().id(), e.target().data('ref') || e.target().id()];
					return { Edges: cy.edges().length, Outside: cy.edges().filter(e => !e.hasClass('backend') && !ends(e).some(x => ns(x) === 'infra')).length,
						Peers: cy.nodes('.workload, .service').filter(n => ns(n.data('ref') || n.id()) !== 'infra').length,
						NsGroups: cy.nodes('.nsgroup').length, Workloads: cy.nodes('.workload').length, Boxes: cy.nodes('.k8snode').length,
						Unboxed: cy.nodes('.workload').filter(n => !n.parent().hasClass('k8snode') || !n.data('node')).length,
						V4: cy.edges('.v4').length, V6: cy.edges('.v6').length, Bad: mapOverlaps(cy),
						Fits: document.documentElement.scrollWidth <= window.innerWidth }; })()`)
			}
			draw := func(hash, ready string) {
				do(t, ctx, chromedp.Navigate(baseURL+"/#/map?"+hash), poll(`location.hash === '#/map?since=1h&`+hash+`' && window.dualflowMap && !window.dualflowMap.destroyed() && `+ready))
			}
			do(t, ctx, chromedp.EmulateViewport(width, 900))
			draw("namespace=infra", `window.dualflowMap.edges().length > 0 && document.querySelector('#map-form [name=namespace]').value === 'infra'`)
			if r := state(); r.Edges == 0 || r.Outside != 0 || r.Peers == 0 || len(r.Bad) > 0 || !r.Fits {
				t.Errorf("scope infra: %+v", r)
			}
			screenshot(t, ctx, fmt.Sprintf("map-scope-%d", width))
			draw("group=namespace", `window.dualflowMap.nodes('.nsgroup').length > 0`)
			if r := state(); r.NsGroups < 2 || r.Workloads != 0 || r.V4 == 0 || r.V6 == 0 || len(r.Bad) > 0 || !r.Fits {
				t.Errorf("group namespace: %+v", r)
			}
			draw("group=node", `window.dualflowMap.nodes('.k8snode').length > 0`)
			if r := state(); r.Boxes == 0 || r.Workloads == 0 || r.Unboxed != 0 || r.V4 == 0 || r.V6 == 0 || len(r.Bad) > 0 || !r.Fits {
				t.Errorf("group node: %+v", r)
			}
			screenshot(t, ctx, fmt.Sprintf("map-nodes-%d", width))
			do(t, ctx,
				js(`window.dualflowMap.edges('.v6').filter(e => e.source().data('node'))[0].emit('tap')`),
				poll(`!document.querySelector('#drawer').hidden && document.querySelector('#drawer .edge-families li[data-family="6"] a')`),
			)
			if href := eval[string](t, ctx, `document.querySelector('#drawer .edge-families li[data-family="6"] a').getAttribute('href')`); !strings.Contains(href, "src_node=") || !strings.Contains(href, "ip_version=6") {
				t.Errorf("node edge drawer link %q", href)
			}
			noConsoleErrors(t, errs, "")
		})
	}
}

// reachURL asks on a port: a cell's TCP trace needs one.
const reachURL = "/#/reach?sources=workload:shop/frontend,workload:shop/cart&destinations=workload:shop/cart,workload:shop/db,service:infra/dns&protocol=TCP&port=5432&run=1"

func TestReachabilityMatrixAndCellDetails(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx,
		chromedp.Navigate(baseURL+reachURL),
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
		chromedp.WaitVisible(css(`#drawer .celldetail .famdetail[data-family="4"]`)),
		chromedp.WaitVisible(css(`#drawer .celldetail .famdetail[data-family="6"]`)),
		chromedp.WaitVisible(css(`#drawer .trace[data-family="6"][data-outcome="dropped"]`)),
		chromedp.WaitVisible(css(`#drawer .trace[data-family="4"][data-outcome="delivered"]`)),
	)
	links := eval[[]string](t, ctx, `[...document.querySelectorAll('#drawer .celldetail .actions a')].map(a => a.getAttribute('href'))`)
	if len(links) != 4 || !strings.Contains(links[0], "src_workload=shop%2Ffrontend") || !strings.Contains(links[0], "dst_workload=shop%2Fdb") ||
		links[3] != "#/recommend?namespace=shop&workload=db&mode=least-privilege&window=6h&run=1" {
		t.Errorf("cell links %v", links)
	}
	// The dual trace names the pods the server picked for the workloads.
	if h := eval[string](t, ctx, `document.querySelector('#drawer .trace[data-family="6"] h2').textContent`); !strings.Contains(h, "shop/frontend-0 (") || !strings.Contains(h, "→ shop/db-0 (") {
		t.Errorf("dual trace header %q", h)
	}
	screenshot(t, ctx, "reach-cell-trace")
	// Each listed pair traces itself, over its family: frontend-1 → db-1,
	// which the cell's dual trace did not pick.
	do(t, ctx,
		chromedp.Click(css(`#drawer .famdetail[data-family="6"] li.pair:nth-child(2) button.tracepair`)),
		poll(`(h => h && h.textContent.includes('shop/frontend-1 (') && h.textContent.includes('→ shop/db-1 ('))(document.querySelector('#drawer .trace[data-family="6"][data-outcome="dropped"] h2'))`),
	)
	if n := eval[int](t, ctx, `document.querySelectorAll('#drawer .trace').length`); n != 1 {
		t.Errorf("a pair's IPv6 trace drew %d families", n)
	}
	if title := eval[string](t, ctx, `document.querySelector('#cell-trace-title').textContent`); title != "Trace of shop/frontend-1 → shop/db-1 over IPv6" {
		t.Errorf("pair trace title %q", title)
	}
	screenshot(t, ctx, "reach-pair-trace")
	noConsoleErrors(t, errs, "")
}

// TestReachabilityICMP: ICMP is one choice for both families (a link's
// ICMPv6 too), without a port; the form says what NetworkPolicy makes of
// it, and a cell links the flows of each family's protocol.
func TestReachabilityICMP(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/reach?sources=workload:shop/frontend&destinations=workload:shop/db&protocol=ICMPv6&port=5432&run=1"),
		chromedp.WaitVisible(css(`.matrix table[data-family="6"] td.cell`)),
		chromedp.WaitVisible(css(`#reach-icmp-note`)),
	)
	if v := eval[string](t, ctx, `(f => f.protocol.value + ' ' + f.port.disabled + ' ' + JSON.stringify(f.port.value))(document.querySelector('#reach-form'))`); v != `ICMP true ""` {
		t.Errorf("form protocol, port disabled, port: %s", v)
	}
	if txt := eval[string](t, ctx, `document.querySelector('#reach-icmp-note').textContent`); !strings.Contains(txt, "only rules without ports allow it") {
		t.Errorf("ICMP note %q", txt)
	}
	do(t, ctx,
		chromedp.Click(css(`.matrix table[data-family="6"] td.cell`)),
		chromedp.WaitVisible(css(`#drawer .celldetail .actions a`)),
	)
	links := eval[[]string](t, ctx, `[...document.querySelectorAll('#drawer .celldetail .actions a')].map(a => a.getAttribute('href'))`)
	if len(links) != 4 || !strings.Contains(links[0], "protocol=ICMP&") || !strings.HasSuffix(links[0], "ip_version=4") || !strings.Contains(links[1], "protocol=ICMPv6&") || !strings.HasSuffix(links[1], "ip_version=6") || strings.Contains(links[2], "port=") || !strings.Contains(links[2], "protocol=ICMP") {
		t.Errorf("ICMP cell links %v", links)
	}
	noConsoleErrors(t, errs, "")
}

// TestReachabilityMatricesFit: at 1000 px the IPv4 and IPv6 matrices of
// 4 destinations fit without a scrollbar; 14 destinations, wider than the
// page, scroll together in one scroller with their columns aligned, and
// neither matrix scrolls on its own.
func TestReachabilityMatricesFit(t *testing.T) {
	ctx, errs := browser(t)
	type layout struct {
		Own          []int // scrollWidth - clientWidth of each matrix
		Shared, Page int   // of .matrices and of the page
		Misaligned   int   // columns whose left edges differ between the families
		Stacked      bool
	}
	measure := `(() => {
		const ms = [...document.querySelectorAll('#reach-out .matrix')], out = document.querySelector('#reach-out');
		const lefts = fam => [...document.querySelectorAll('.matrix table[data-family="' + fam + '"] tr:nth-child(2) td')].map(td => Math.round(td.getBoundingClientRect().left - td.closest('table').getBoundingClientRect().left));
		const l4 = lefts('4'), l6 = lefts('6');
		return { Own: ms.map(m => m.scrollWidth - m.clientWidth), Shared: out.scrollWidth - out.clientWidth,
			Page: document.documentElement.scrollWidth - document.documentElement.clientWidth,
			Misaligned: l4.filter((x, i) => x !== l6[i]).length + Math.abs(l4.length - l6.length),
			Stacked: ms.length === 2 && ms[1].getBoundingClientRect().top >= ms[0].getBoundingClientRect().bottom };
	})()`
	dsts := "workload:shop/cart,workload:shop/db,service:infra/dns,workload:infra/dns"
	do(t, ctx,
		chromedp.EmulateViewport(1000, 900),
		chromedp.Navigate(baseURL+"/#/reach?sources=workload:shop/frontend,workload:shop/cart&destinations="+dsts+"&protocol=TCP&port=5432&run=1"),
		chromedp.WaitVisible(css(`.matrix table[data-family="6"] td.cell`)),
	)
	got := eval[layout](t, ctx, measure)
	if len(got.Own) != 2 || got.Own[0] > 0 || got.Own[1] > 0 || got.Shared > 0 || got.Page > 0 {
		t.Errorf("4 destinations at 1000 px overflow: %+v", got)
	}
	screenshot(t, ctx, "reach-1000px")
	wide := dsts + "," + dsts + "," + dsts + ",workload:shop/frontend,service:shop/cart"
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/reach?sources=workload:shop/frontend&destinations="+wide+"&protocol=TCP&port=5432&run=1"),
		poll(`document.querySelectorAll('.matrix table[data-family="6"] td.cell').length === 14`),
	)
	got = eval[layout](t, ctx, measure)
	if len(got.Own) != 2 || got.Own[0] > 0 || got.Own[1] > 0 || got.Shared <= 0 || got.Page > 0 || !got.Stacked || got.Misaligned != 0 {
		t.Errorf("14 destinations at 1000 px: %+v, want one shared scroller, stacked and aligned", got)
	}
	noConsoleErrors(t, errs, "")
}

// TestReachabilityCellShapes renders the cell shapes the API may answer:
// partial k/n with its pairs, a family the Service lacks, an evaluation
// error, a policy/flows disagreement and fields this UI does not know.
func TestReachabilityCellShapes(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx, chromedp.Navigate(baseURL+"/#/reach"), chromedp.WaitVisible(css(`#reach-form`)))
	do(t, ctx, js(`(() => {
		const m = { sources: [{kind: 'workload', namespace: 'frontend', name: 'web'}], destinations: [{kind: 'workload', namespace: 'backend', name: 'api'}, {kind: 'service', namespace: 'backend', name: 'api-single'}, {kind: 'workload', namespace: 'shop', name: 'gone'}],
			asymmetric: 1, elapsed_ms: 3, cells: [[
				{ asymmetric: true, families: {
					'4': { outcome: 'partial', reason: '2 of 4 pod pairs allowed', pairs_allowed: 2, pairs_total: 4, policy: {verdict: 'partial'}, observed: {flows: 271, verdicts: {allowed: 138, dropped: 133}},
						mismatch: 'policy allows 2 of 4 pairs, 133 of 271 observed flows were dropped',
						pairs: [{src: 'frontend/web-0', dst: 'backend/api-0', src_ip: '10.0.0.1', dst_ip: '10.0.1.1', port: 9090, verdict: 'allowed'}, {src: 'frontend/web-0', dst: 'backend/api-1', src_ip: '10.0.0.1', dst_ip: '10.0.1.2', port: 9090, verdict: 'denied', ingress: 'backend/deny-web'}] },
					'6': { outcome: 'allow', pairs_allowed: 4, pairs_total: 4, observed: {flows: 0}, new_field: 'shown as is' } } },
				{ asymmetric: true, families: { '4': { outcome: 'allow', pairs_allowed: 2, pairs_total: 2, observed: {flows: 3} }, '6': { outcome: 'no_family', reason: 'no IPv6 ClusterIP', pairs_allowed: 0, pairs_total: 0, observed: {flows: 0} } } },
				{ asymmetric: false, families: { '4': { outcome: 'error', policy_error: 'workload shop/gone not found', observed: {flows: 0} }, '6': { outcome: 'unknown', partial: {k: 1, n: 2}, policy_error: 'workload shop/gone not found', observed: {flows: 0} } } },
			]] };
		const out = document.querySelector('#reach-out'); out.replaceChildren();
		const req = { protocol: 'TCP', port: 8080, since: '1h' };
		for (const fam of ['4', '6']) out.append(matrix(m, fam, req));
	})()`))
	type cellInfo struct{ Text, Class string }
	cells := eval[[]cellInfo](t, ctx, `[...document.querySelectorAll('.matrix table[data-family="4"] td.cell, .matrix table[data-family="6"] td.cell')].map(td => ({Text: td.textContent, Class: td.className}))`)
	if len(cells) != 6 {
		t.Fatalf("cells %v", cells)
	}
	if !strings.Contains(cells[0].Text, "partial 2/4") || !strings.Contains(cells[0].Class, "disagree") {
		t.Errorf("partial cell %+v", cells[0])
	}
	if !strings.Contains(cells[4].Text, "no IPv6 ClusterIP") || !strings.Contains(cells[4].Text, "no family") {
		t.Errorf("IPv6 of an IPv4-only Service %+v", cells[4])
	}
	if !strings.Contains(cells[2].Text, "not found") || !strings.Contains(cells[2].Class, "error") {
		t.Errorf("error cell %+v", cells[2])
	}
	do(t, ctx,
		chromedp.Click(css(`.matrix table[data-family="4"] td.cell`)),
		chromedp.WaitVisible(css(`#drawer .famdetail[data-family="4"] ul.pairs li`)),
	)
	txt := eval[string](t, ctx, `document.querySelector('#drawer .celldetail').innerText`)
	for _, want := range []string{"partial 2/4", "4 pod pairs, 2 allowed", "web-0 → backend/api-1", "ingress backend/deny-web", "133 of 271 observed flows were dropped", "shown as is"} {
		if !strings.Contains(txt, want) {
			t.Errorf("cell details lack %q:\n%s", want, txt)
		}
	}
	screenshot(t, ctx, "reach-cell-details")
	// The dual trace of these made-up workloads is refused (400).
	noConsoleErrors(t, errs, "400")
}

func TestDefaultFormsNameExistingObjects(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/reach"),
		poll(`document.querySelector('#reach-form [name=sources]').value.trim() !== ''`),
	)
	known := []string{"workload:shop/frontend", "workload:shop/cart", "workload:shop/db", "workload:infra/dns", "service:shop/cart", "service:shop/db", "service:infra/dns"}
	for _, field := range []string{"sources", "destinations"} {
		for _, l := range strings.Split(eval[string](t, ctx, `document.querySelector('#reach-form [name=`+field+`]').value`), "\n") {
			if !slices.Contains(known, l) {
				t.Errorf("%s default %q is not in the lab", field, l)
			}
		}
	}
	// The adder puts a suggestion on a new line.
	do(t, ctx, chromedp.SendKeys(css(`#reach-form .adder[data-target=destinations]`), "service:infra/dns\r"))
	if v := eval[string](t, ctx, `document.querySelector('#reach-form [name=destinations]').value`); !strings.HasSuffix(v, "\nservice:infra/dns") {
		t.Errorf("destinations after adding: %q", v)
	}
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/trace"),
		poll(`document.querySelector('#trace-form [name=source]').value.startsWith('pod:')`),
	)
	src := eval[string](t, ctx, `document.querySelector('#trace-form [name=source]').value`)
	port := eval[string](t, ctx, `document.querySelector('#trace-form [name=port]').value`)
	if !strings.HasPrefix(src, "pod:shop/") && !strings.HasPrefix(src, "pod:infra/") || !slices.Contains([]string{"8080", "5432", "53"}, port) {
		t.Errorf("trace defaults %q port %q", src, port)
	}
	// Autocomplete offers the live view's names.
	opts := eval[[]string](t, ctx, `[...document.querySelectorAll('#dl-endpoints option')].map(o => o.value)`)
	for _, want := range []string{"workload:shop/frontend", "service:infra/dns"} {
		if !slices.Contains(opts, want) {
			t.Errorf("autocomplete lacks %s: %v", want, opts)
		}
	}
	if n := eval[int](t, ctx, `[...document.querySelectorAll('#dl-endpoints option')].filter(o => o.value.startsWith('pod:')).length`); n == 0 {
		t.Error("no pods offered")
	}
	// Objects no flow names come from the live view (GET /catalog).
	for _, want := range []string{"pod:" + fakes.IdlePod, "workload:" + fakes.IdleWorkload, "service:" + fakes.IdleService} {
		if !slices.Contains(opts, want) {
			t.Errorf("autocomplete lacks %s of the live view (no flows): %v", want, opts)
		}
	}
	if ports := eval[[]string](t, ctx, `[...document.querySelectorAll('#dl-ports option')].map(o => o.value)`); !slices.Contains(ports, "9090") {
		t.Errorf("ports lack the idle Service's 9090: %v", ports)
	}
	do(t, ctx, chromedp.Click(css(`#trace-form button[type=submit]`)), chromedp.WaitVisible(css(`#trace-out .trace`)))
	screenshot(t, ctx, "trace")
	noConsoleErrors(t, errs, "")
}

func TestTraceflowPage(t *testing.T) {
	ctx, errs := browser(t)
	// A bookmarked link of the older form (family=0: both) still runs a
	// dual trace; the workload destination goes to one of its pods.
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/trace?source=pod:shop/frontend-0&destination=workload:shop/db&protocol=TCP&port=5432&family=0&run=1"),
		chromedp.WaitVisible(css(`#trace-out .trace[data-family="6"][data-outcome="dropped"] li.drop`)),
		chromedp.WaitVisible(css(`#trace-out .trace[data-family="4"][data-outcome="delivered"]`)),
	)
	if n := eval[int](t, ctx, `document.querySelectorAll('#trace-out .path li').length`); n < 5 {
		t.Errorf("%d hops drawn", n)
	}
	if v := eval[string](t, ctx, `document.querySelector('#trace-form [name=family]').value`); v != "dual" {
		t.Errorf("family=0 selected %q", v)
	}
	info := eval[string](t, ctx, `document.querySelector('#trace-out .traceinfo').textContent`)
	href := eval[string](t, ctx, `document.querySelector('#trace-out .traceinfo a').getAttribute('href')`)
	if !strings.Contains(info, "to pod shop/db-0 of workload shop/db") || !strings.HasPrefix(href, "#/flows?probe_trace_id=tf-") || !strings.HasSuffix(href, "&probes=include") {
		t.Errorf("trace info %q, link %q", info, href)
	}
	screenshot(t, ctx, "trace-result")
	// A family without an address says why once, in its block.
	do(t, ctx, js(`renderTraces(document.querySelector('#trace-out'), { id: 'tf-0123456789abcdef', phase: 'succeeded', families: [
		{ family: 'ipv4', outcome: 'delivered', src: '198.18.1.100', dst: '198.19.0.2', observations: [] },
		{ family: 'ipv6', outcome: 'no-address', reason: 'service shop/cart has no IPv6 ClusterIP', observations: [] }] })`))
	if n := eval[int](t, ctx, `document.body.innerText.split('no IPv6 ClusterIP').length - 1`); n != 1 {
		t.Errorf("trace reason shown %d times", n)
	}
	if n := eval[int](t, ctx, `document.querySelectorAll('#trace-out .trace[data-family="6"][data-outcome="no-address"] p.err').length`); n != 1 {
		t.Errorf("no-address family drawn %d times", n)
	}
	// An ICMP link (a flow drawer's "Trace this flow" of an ICMPv6 flow)
	// traces both families without a port: ICMP over IPv4, ICMPv6 over
	// IPv6.
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/trace?source=pod:shop/frontend-0&destination=pod:shop/db-0&protocol=ICMP&family=dual&run=1"),
		chromedp.WaitVisible(css(`#trace-out .trace[data-family="4"]`)),
		chromedp.WaitVisible(css(`#trace-out .trace[data-family="6"]`)),
	)
	if b := eval[string](t, ctx, `document.querySelector('#banner').textContent + [...document.querySelectorAll('#trace-out .trace')].map(e => ' ' + e.dataset.outcome).join('')`); b != " delivered dropped" {
		t.Errorf("ICMP trace: banner and outcomes %q, want delivered over IPv4, dropped over IPv6", b)
	}
	// SCTP is not traced as TCP: the form says it cannot be traced.
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/trace?source=pod:shop/frontend-0&destination=pod:shop/db-0&protocol=SCTP&port=5432&run=1"),
		poll(`document.querySelector('#banner').textContent.includes('SCTP cannot be traced')`),
	)
	if n := eval[int](t, ctx, `document.querySelectorAll('#trace-out .trace').length`); n != 0 {
		t.Errorf("an SCTP link traced %d families", n)
	}
	// Both error shapes read the same.
	msgs := eval[[]string](t, ctx, `[errText(new APIError(400, {message: 'want 1..65535', field: 'port'})), errText(new APIError(400, {errors: {port: 'want 1..65535'}})), errText(new APIError(400, {message: 'port: want 1..65535', field: 'port'}))]`)
	for _, m := range msgs {
		if m != "port: want 1..65535" {
			t.Errorf("error text %q", m)
		}
	}
	// A field of the controller's 400 is named once.
	do(t, ctx,
		chromedp.Navigate(baseURL+"/#/trace?source=workload:shop/gone&destination=pod:shop/db-0&protocol=TCP&port=5432&run=1"),
		poll(`document.querySelector('#banner').textContent.startsWith('source_workload: no pod of workload shop/gone')`),
	)
	noConsoleErrors(t, errs, "400")
}

// TestAuditLinks follows every link of every finding kind: each asks
// about the finding's ends (sources to destinations, a Service only as a
// destination, an unprotected workload from or to a few others, an ipBlock
// rule's covered sources to its policy's pods on the rule's port) and
// answers with rows, a matrix without an error cell, or a trace.
func TestAuditLinks(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx, chromedp.Navigate(baseURL+"/#/audit"), chromedp.WaitVisible(css(`#audit-list li.dual .actions a`)))
	type finding struct {
		Kind  string
		Links []string
	}
	fs := eval[[]finding](t, ctx, `[...document.querySelectorAll('#audit-list li')].map(li => ({Kind: li.dataset.kind, Links: [...li.querySelectorAll('.actions a')].map(a => a.getAttribute('href'))}))`)
	screenshot(t, ctx, "audit-links")
	want := map[string][]string{
		"dual-stack-verdict-gap":          {"#/flows?since=24h&dst_port=5432&verdict=dropped&src_workload=shop%2Ffrontend&dst_workload=shop%2Fdb", "#/reach?sources=workload%3Ashop%2Ffrontend&destinations=workload%3Ashop%2Fdb&protocol=TCP&port=5432&run=1&cell=0%2C0", "#/trace?", recommendDB},
		"dual-stack-observed-verdict-gap": {"#/flows?since=24h&dst_port=5432&verdict=dropped&src_workload=shop%2Ffrontend&dst_workload=shop%2Fdb", "#/reach?sources=workload%3Ashop%2Ffrontend&destinations=workload%3Ashop%2Fdb&protocol=TCP&port=5432&run=1&cell=0%2C0", "#/trace?", recommendDB},
		"dual-stack-ipblock-one-family":   {"#/flows?since=24h&dst_port=5432&src_workload=shop%2Ffrontend&dst_workload=shop%2Fdb", "#/reach?sources=workload%3Ashop%2Ffrontend&destinations=workload%3Ashop%2Fdb&protocol=TCP&port=5432", "#/trace?", "#/flows?since=24h&policy=shop%2Fdb-policy", "#/recommend?namespace=shop&mode=close-gaps&window=6h&run=1"},
		"dual-stack-service-single-stack": {"#/flows?since=24h&dst_port=5432&service=shop%2Fdb", "#/reach?sources=workload%3Ainfra%2Fdns%2Cworkload%3Ashop%2Fcart%2Cworkload%3Ashop%2Ffrontend&destinations=service%3Ashop%2Fdb&", "#/trace?source=workload%3Ainfra%2Fdns&destination=service%3Ashop%2Fdb&"},
		"unprotected-ingress":             {"#/flows?since=24h&dst_workload=infra%2Fdns", "#/reach?sources=workload%3Ashop%2Fcart%2Cworkload%3Ashop%2Fdb%2Cworkload%3Ashop%2Ffrontend&destinations=workload%3Ainfra%2Fdns&", "#/recommend?namespace=infra&workload=Deployment%2Fdns&mode=least-privilege&window=6h&run=1"},
		"unprotected-egress":              {"#/flows?since=24h&src_workload=shop%2Fcart", "#/reach?sources=workload%3Ashop%2Fcart&destinations=workload%3Ainfra%2Fdns%2Cworkload%3Ashop%2Fdb%2Cworkload%3Ashop%2Ffrontend&", recommendCart},
	}
	if len(fs) != len(want) {
		t.Errorf("%d findings listed, want %d: %v", len(fs), len(want), fs)
	}
	// A count says what it counts, a finding how grave it is and what to
	// change.
	heads := eval[[]string](t, ctx, `[...document.querySelectorAll('#audit-list li')].map(li => li.dataset.severity + ' | ' + li.querySelector('.kind').textContent + ' | ' + (li.querySelector('.fix') || {}).textContent)`)
	for _, want := range []string{
		"high | highdual-stack-verdict-gap · TCP 5432 · 3 pod pairs | Fix: ",
		"high | highdual-stack-observed-verdict-gap · TCP 5432 · 1 flow record | Fix: ",
		"medium | mediumdual-stack-service-single-stack · TCP 5432 · 2 pods | Fix: Set spec.ipFamilyPolicy",
		"low | lowunprotected-egress · 3 pods | Fix: ",
	} {
		if !slices.ContainsFunc(heads, func(h string) bool { return strings.HasPrefix(h, want) }) {
			t.Errorf("no finding reads %q: %q", want, heads)
		}
	}
	if slices.ContainsFunc(heads, func(h string) bool { return strings.Contains(h, "flows") }) {
		t.Errorf("a finding counts flows: %q", heads)
	}
	for _, f := range fs {
		w := want[f.Kind]
		if len(f.Links) != len(w) {
			t.Errorf("%s links %v, want %d", f.Kind, f.Links, len(w))
			continue
		}
		for i, l := range f.Links {
			if !strings.HasPrefix(l, w[i]) {
				t.Errorf("%s link %d %q, want %q…", f.Kind, i, l, w[i])
			}
		}
	}
	for _, f := range fs {
		for _, l := range f.Links {
			// A fresh page: nothing of the previous link satisfies the waits.
			do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(baseURL+"/"+l))
			switch {
			case strings.HasPrefix(l, "#/flows?"):
				do(t, ctx, poll(`document.querySelectorAll('#flow-table tbody tr td.verdict').length > 0`))
				if strings.Contains(l, "verdict=dropped") {
					do(t, ctx, poll(`[...document.querySelectorAll('#flow-table tbody td.verdict')].every(td => td.textContent === 'denied')`))
					if got := rowFamilies(t, ctx); got["4"] != 0 {
						t.Errorf("%s: denied flows of the gap %v", f.Kind, got)
					}
				}
			case strings.HasPrefix(l, "#/reach?"):
				do(t, ctx, chromedp.WaitVisible(css(`.matrix table[data-family="6"] td.cell`)))
				if n := eval[int](t, ctx, `document.querySelectorAll('.matrix td.cell.error').length`); n != 0 {
					t.Errorf("%s: %s has %d error cells", f.Kind, l, n)
				}
				if strings.Contains(l, "cell=0%2C0") {
					do(t, ctx, chromedp.WaitVisible(css(`.matrix table[data-family="6"] td.cell.focus`)), chromedp.WaitVisible(css(`#drawer .celldetail .trace`)))
				}
			case strings.HasPrefix(l, "#/recommend?"):
				do(t, ctx, chromedp.WaitVisible(css(`#rec-out .recyaml`)))
				if n := eval[int](t, ctx, `document.querySelectorAll('#rec-out .wifam').length`); n != 2 {
					t.Errorf("%s: %s replays %d families", f.Kind, l, n)
				}
			default:
				do(t, ctx, chromedp.WaitVisible(css(`#trace-out .trace[data-family="4"]`)), chromedp.WaitVisible(css(`#trace-out .trace[data-family="6"]`)))
				if v := eval[string](t, ctx, `document.querySelector('#trace-form [name=port]').value`); v != "5432" {
					t.Errorf("%s: trace port %q", f.Kind, v)
				}
			}
			if b := eval[string](t, ctx, `document.querySelector('#banner').textContent`); b != "" {
				t.Errorf("%s: %s: banner %q", f.Kind, l, b)
			}
		}
	}
	noConsoleErrors(t, errs, "")
}

// TestWhatIf pastes a proposed policy on the Audit page and reads the
// what-if per family: the audit replays the seeded flows with the real
// policy evaluation (fakes.Audit over the store), the lab's db-policy
// admitting IPv4 only (fakes.DBPolicy). The proposal replaces it with one
// admitting shop/frontend on both families: frontend → db becomes
// allowed over IPv6 (it was denied), cart → db denied over IPv4 (its
// only family); frontend → db over IPv4 does not change. In the
// single-family labs only that family's change is left. The cells of
// the Reachability matrix change the same way, with db → db and dns → db
// newly denied over IPv4 too (no flow of theirs is recorded), each with
// its pod pairs per family (3 × 3, or 3 × 2 between db's own pods) and a
// link to the cell on the Reachability page. A policy that does not
// validate shows the API's message with its field.
func TestWhatIf(t *testing.T) {
	const proposal = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: shop, name: db-policy}
spec:
  podSelector: {matchLabels: {app: db}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: frontend}}}]
    ports: [{protocol: TCP, port: 5432}]
`
	type change struct{ Family, Change, Src, Dst, Link string }
	type cell struct{ Src, Dst, Changed string }
	cells := `[...document.querySelectorAll('#whatif-out .wicells tbody tr')].map(tr => ({Src: tr.dataset.src, Dst: tr.dataset.dst, Changed: tr.dataset.changed}))`
	toDB := func(src, fams string) cell { return cell{"workload:shop/" + src, "workload:shop/db", fams} }
	changes := `[...document.querySelectorAll('#whatif-out .wifam')].flatMap(f => [...f.querySelectorAll('.wichange')].flatMap(c =>
		[...c.querySelectorAll('tbody tr')].map(tr => ({Family: f.dataset.family, Change: c.dataset.change, Src: tr.dataset.src, Dst: tr.dataset.dst, Link: tr.querySelector('a').getAttribute('href')}))))`
	paste := func(yaml string) chromedp.Action[chromedp.Void] {
		return js(`document.querySelector('#whatif-out').replaceChildren(); document.querySelector('#whatif-status').textContent = '';
			document.querySelector('#whatif-form [name=policy]').value = ` + jsString(yaml) + `;
			document.querySelector('#whatif-form').requestSubmit()`)
	}
	for _, tc := range []struct {
		mode  string
		want  []change
		cells []cell
		pairs []string // family:pairs
	}{
		{"dual", []change{
			{"4", "newly-denied", "shop/cart", "shop/db", "#/flows?since=6h&ip_version=4&protocol=TCP&dst_port=5432&src_workload=shop%2Fcart&dst_workload=shop%2Fdb"},
			{"6", "newly-allowed", "shop/frontend", "shop/db", "#/flows?since=6h&ip_version=6&protocol=TCP&dst_port=5432&src_workload=shop%2Ffrontend&dst_workload=shop%2Fdb"},
		}, []cell{toDB("cart", "4"), toDB("db", "4"), toDB("frontend", "6"), {"workload:infra/dns", "workload:shop/db", "4"}}, []string{"4:24", "6:9"}},
		{"4", []change{
			{"4", "newly-denied", "shop/cart", "shop/db", "#/flows?since=6h&ip_version=4&protocol=TCP&dst_port=5432&src_workload=shop%2Fcart&dst_workload=shop%2Fdb"},
		}, []cell{toDB("cart", "4"), toDB("db", "4"), {"workload:infra/dns", "workload:shop/db", "4"}}, []string{"4:24", "6:0"}},
		{"6", []change{
			{"6", "newly-allowed", "shop/frontend", "shop/db", "#/flows?since=6h&ip_version=6&protocol=TCP&dst_port=5432&src_workload=shop%2Ffrontend&dst_workload=shop%2Fdb"},
		}, []cell{toDB("frontend", "6")}, []string{"4:0", "6:9"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			ctx, errs := browser(t)
			u := baseURL
			if tc.mode != "dual" {
				u = modeURL[tc.mode]
			}
			do(t, ctx, chromedp.Navigate(u+"/#/audit"), chromedp.WaitVisible(css(`#whatif-form textarea`)),
				paste(proposal), chromedp.WaitVisible(css(`#whatif-out .wifam[data-family="6"]`)))
			screenshot(t, ctx, "whatif-"+tc.mode)
			got := eval[[]change](t, ctx, changes)
			if !slices.Equal(got, tc.want) {
				t.Errorf("changes %v, want %v", got, tc.want)
			}
			sum := eval[string](t, ctx, `document.querySelector('#whatif-out .wisummary').textContent`)
			if !strings.HasPrefix(sum, fmt.Sprintf("If you apply this, %d connection", len(tc.want))) || !strings.Contains(sum, fmt.Sprintf(" %d cell%s of the Reachability matrix", len(tc.cells), map[bool]string{true: "s"}[len(tc.cells) > 1])) {
				t.Errorf("summary %q", sum)
			}
			// The cells section: one row per changed cell, the changed
			// families marked; the pairs section: per family, the pairs
			// behind them.
			if got := eval[[]cell](t, ctx, cells); !slices.Equal(got, tc.cells) {
				t.Errorf("cells %v, want %v", got, tc.cells)
			}
			if got := eval[[]string](t, ctx, `[...document.querySelectorAll('#whatif-out .wipairfam')].map(f => f.dataset.family + ':' + f.dataset.pairs)`); !slices.Equal(got, tc.pairs) {
				t.Errorf("pairs per family %v, want %v", got, tc.pairs)
			}
			// A pair row says its change and links its recorded flows.
			pr := eval[[]string](t, ctx, `[...document.querySelectorAll('#whatif-out .wipairfam tbody tr')].slice(0, 1).flatMap(tr => [tr.dataset.src, tr.dataset.dst, tr.dataset.change, tr.dataset.cell, tr.querySelector('a').getAttribute('href')])`)
			if len(pr) != 5 || !strings.HasPrefix(pr[0], "shop/") && !strings.HasPrefix(pr[0], "infra/") || !strings.HasPrefix(pr[1], "shop/db-") ||
				!strings.Contains(pr[3], "→ workload:shop/db TCP") || !strings.Contains(pr[4], "#/flows?") || !strings.Contains(pr[4], "dst_pod=shop%2Fdb-") {
				t.Errorf("first pair row %q", pr)
			}
			// At 1000 px long pod names wrap: no pairs table scrolls sideways.
			do(t, ctx, chromedp.EmulateViewport(1000, 900))
			if wide := eval[[]string](t, ctx, `[...document.querySelectorAll('#whatif-out .wipairfam .tablewrap')].filter(w => w.scrollWidth > w.clientWidth + 1).map(w => w.closest('.wipairfam').dataset.family + ': ' + w.scrollWidth + ' > ' + w.clientWidth)`); len(wide) > 0 {
				t.Errorf("pairs tables wider than their box at 1000 px: %q", wide)
			}
			do(t, ctx, chromedp.EmulateViewport(1400, 900))
			// A cell's link opens it on the Reachability page.
			reach := eval[string](t, ctx, `document.querySelector('#whatif-out .wicells tbody tr a').getAttribute('href')`)
			if want := "#/reach?sources=" + url.QueryEscape(tc.cells[0].Src) + "&destinations=" + url.QueryEscape(tc.cells[0].Dst) + "&protocol=TCP&run=1&cell=0%2C0"; reach != want {
				t.Errorf("cell link %q, want %q", reach, want)
			}
			// Each family's column says what changes in it; both are drawn.
			heads := eval[[]string](t, ctx, `[...document.querySelectorAll('#whatif-out .wifam h2')].map(x => x.textContent)`)
			if len(heads) != 2 {
				t.Fatalf("family heads %q", heads)
			}
			for i, fam := range []string{"4", "6"} {
				head := "IPv" + fam + " IPv" + fam + ": no change"
				if slices.ContainsFunc(tc.want, func(c change) bool { return c.Family == fam }) {
					head = "IPv" + fam + " IPv" + fam + ": 1 connection ("
				}
				if !strings.HasPrefix(heads[i], head) {
					t.Errorf("IPv%s head %q, want %q…", fam, heads[i], head)
				}
			}
			do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(u+"/"+reach), chromedp.WaitVisible(css(`.matrix table[data-family="4"] td.cell`)))
			// A pair's link opens its recorded flows: that pair, that family.
			l := got[len(got)-1]
			do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(u+"/"+l.Link), poll(`document.querySelectorAll('#flow-table tbody tr').length > 0`))
			if fams := rowFamilies(t, ctx); len(fams) != 1 || fams[l.Family] == 0 {
				t.Errorf("flows of %v: families %v", l, fams)
			}
			// A policy that does not validate: the API's message, with its field.
			do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(u+"/#/audit"), chromedp.WaitVisible(css(`#whatif-form textarea`)),
				paste(strings.Replace(proposal, "{podSelector: {matchLabels: {app: frontend}}}", "{ipBlock: {cidr: 'fd00:10::/300'}}", 1)),
				poll(`document.querySelector('#whatif-status').classList.contains('err')`))
			msg := eval[string](t, ctx, `document.querySelector('#whatif-status').textContent`)
			if !strings.HasPrefix(msg, "body: invalid proposed policy") || !strings.Contains(msg, "cidr") {
				t.Errorf("error %q", msg)
			}
			if eval[string](t, ctx, `document.querySelector('#whatif-form textarea').getAttribute('aria-invalid')`) != "true" {
				t.Error("the editor is not marked invalid")
			}
			if n := eval[int](t, ctx, `document.querySelectorAll('#whatif-out .wifam').length`); n != 0 {
				t.Errorf("%d families drawn after the error", n)
			}
			screenshot(t, ctx, "whatif-error-"+tc.mode)
			// The single-family labs have no catalog (501, the UI's fallback).
			noConsoleErrors(t, errs, "400", "/api/v1/catalog")
		})
	}
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
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
	// Past the row limit the answer keeps its first rows and says so.
	do(t, ctx,
		js(`document.querySelector('#sql-text').value = 'SELECT number FROM numbers(100000)'`),
		chromedp.Click(css(`#sql-form button[type=submit]`)),
		poll(`document.querySelector('#sql-status').textContent.includes('truncated')`),
	)
	if n := eval[int](t, ctx, `document.querySelectorAll('#sql-table tbody tr').length`); n == 0 || n >= 100000 {
		t.Errorf("%d rows of a truncated answer", n)
	}
	screenshot(t, ctx, "sql-truncated")
	// The schema sidebar is docs/schema.md: the tables with their columns,
	// the REST names of the columns, and examples a click puts in the editor.
	do(t, ctx, chromedp.WaitVisible(css(`#sql-schema .examples a`)))
	cols := eval[[]string](t, ctx, `[...document.querySelectorAll('#sql-schema details[data-table=flows] a.col')].map(a => a.textContent)`)
	for _, c := range []string{"ip_version", "src_ip", "dst_pod_name", "ingress_verdict", "k8s_view_stale"} {
		if !slices.Contains(cols, c) {
			t.Errorf("flows columns %v lack %s", cols, c)
		}
	}
	tables := eval[[]string](t, ctx, `[...document.querySelectorAll('#sql-schema [data-table]')].map(e => e.dataset.table)`)
	for _, tb := range []string{"flows", "traceflows", "rollup_policy_1m"} {
		if !slices.Contains(tables, tb) {
			t.Errorf("tables %v lack %s", tables, tb)
		}
	}
	if m := eval[string](t, ctx, `[...document.querySelectorAll('#sql-schema .restmap tr')].map(r => r.textContent).find(t => t.startsWith('src_namespace')) || ''`); !strings.Contains(m, "src_pod_namespace") {
		t.Errorf("REST → SQL row of src_namespace %q", m)
	}
	// A column name goes in at the cursor; an example replaces the query and runs.
	do(t, ctx,
		js(`const ta = document.querySelector('#sql-text'); ta.value = 'SELECT  FROM dualflow.flows'; ta.setSelectionRange(7, 7)`),
		chromedp.Click(css(`#sql-schema details[data-table=flows] a.col`)),
	)
	if v := eval[string](t, ctx, `document.querySelector('#sql-text').value`); v != "SELECT "+cols[0]+" FROM dualflow.flows" {
		t.Errorf("editor after a column click: %q", v)
	}
	do(t, ctx,
		js(`[...document.querySelectorAll('#sql-schema .examples a')].find(a => a.textContent.includes('over IPv6')).click()`),
		poll(`document.querySelector('#sql-text').value.includes('ip_version = 6')`),
		chromedp.Click(css(`#sql-form button[type=submit]`)),
		poll(`document.querySelector('#sql-status').textContent.includes('rows in') && document.querySelectorAll('#sql-table thead th').length === 5`),
	)
	if n := eval[int](t, ctx, `document.querySelectorAll('#sql-table tbody tr').length`); n == 0 {
		t.Error("the IPv6 top-talkers example returned no rows")
	}
	screenshot(t, ctx, "sql-schema")
	noConsoleErrors(t, errs, "")
}

// TestSingleFamilyLabs runs the pages against IPv4-only and IPv6-only labs.
func TestSingleFamilyLabs(t *testing.T) {
	for _, fam := range []string{"4", "6"} {
		t.Run("IPv"+fam, func(t *testing.T) {
			ctx, errs := browser(t)
			base := modeURL[fam]
			do(t, ctx, chromedp.Navigate(base+"/#/flows"), chromedp.WaitVisible(css(`#flow-table tbody tr`)), chromedp.WaitVisible(css(`#flow-chart .uplot`)))
			if got := rowFamilies(t, ctx); len(got) != 1 || got[fam] == 0 {
				t.Errorf("rows %v", got)
			}
			do(t, ctx, chromedp.Navigate(base+"/#/map"), poll(`window.dualflowMap && window.dualflowMap.edges().length > 0`))
			other := map[string]string{"4": "6", "6": "4"}[fam]
			if n := eval[int](t, ctx, `window.dualflowMap.edges('.v`+other+`').length`); n != 0 {
				t.Errorf("%d IPv%s edges", n, other)
			}
			do(t, ctx, chromedp.Navigate(base+"/#/charts"), chromedp.WaitVisible(css(`#chart-flows .uplot`)), chromedp.WaitVisible(css(`#talkers tbody tr`)))
			// Grouped by namespace, as shares: the family's namespaces, each
			// bucket with traffic at 100.
			do(t, ctx, chromedp.Navigate(base+"/#/charts?since=1h&dimension=namespace&mode=percent"),
				poll(`(el => el?.uplot && el.dataset.mode === 'percent' && el.uplot.root.querySelector('.u-title').textContent.includes('per namespace'))(document.querySelector('#chart-bytes'))`))
			if got := eval[[]string](t, ctx, `document.querySelector('#chart-bytes').uplot.series.slice(1).map(s => s.label).sort()`); !slices.Equal(got, []string{"infra", "shop"}) {
				t.Errorf("namespaces %v", got)
			}
			if bad := eval[int](t, ctx, `document.querySelector('#chart-bytes').uplot.data[1].filter(v => v !== 0 && Math.abs(v - 100) > 1e-6).length`); bad != 0 {
				t.Errorf("%d buckets do not sum to 100%%", bad)
			}
			do(t, ctx, chromedp.Navigate(base+reachURL), chromedp.WaitVisible(css(`.matrix table[data-family="`+fam+`"]`)))
			do(t, ctx, chromedp.Navigate(base+"/#/audit"), chromedp.WaitVisible(css(`#audit-list li`)))
			// These labs have no live view: /catalog answers 501 (the
			// browser logs it) and the UI names what the flows name.
			noConsoleErrors(t, errs, "/api/v1/catalog")
		})
	}
}

// kubeStale makes every lab's /api/v1/status say the Kubernetes view is
// stale.
var kubeStale atomic.Bool

// TestKubernetesStaleBadge: while the collector's view of the cluster is
// stale (API server unreachable), the header says so on every page, with
// the unwatched kinds; it goes once the view is current again.
func TestKubernetesStaleBadge(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx, chromedp.Navigate(baseURL+"/#/flows"), chromedp.WaitVisible(css(`#flow-table tbody tr`)))
	if eval[bool](t, ctx, `!document.querySelector('#k8s-status').hidden`) {
		t.Error("stale badge shown with a current view")
	}
	kubeStale.Store(true)
	t.Cleanup(func() { kubeStale.Store(false) })
	do(t, ctx, chromedp.Reload(), poll(`!document.querySelector('#k8s-status').hidden`))
	if got := eval[string](t, ctx, `document.querySelector('#k8s-status').textContent`); got != "Kubernetes view stale 12 s" {
		t.Errorf("badge %q", got)
	}
	if got := eval[string](t, ctx, `document.querySelector('#k8s-status').title`); !strings.Contains(got, "k8s_view_stale") || !strings.Contains(got, "Not watched: pod, service.") {
		t.Errorf("badge title %q", got)
	}
	// The page says so in words too, not only in the badge.
	if got := eval[string](t, ctx, `document.querySelector('#view-note').hidden ? '' : document.querySelector('#view-note').textContent`); !strings.Contains(got, "stale") || !strings.Contains(got, "12 s") || !strings.Contains(got, "pod, service not watched") {
		t.Errorf("page note %q", got)
	}
	screenshot(t, ctx, "k8s-stale")
	do(t, ctx, chromedp.Navigate(baseURL+"/#/map"), poll(`!document.querySelector('#k8s-status').hidden && !document.querySelector('#view-note').hidden`))
	// Another page's errors (the banner) do not hide it.
	do(t, ctx, js(`location.hash = '#/flows?dst_ip=not-an-ip'`), poll(`document.querySelector('#banner').textContent.includes('dst_ip')`))
	if eval[bool](t, ctx, `document.querySelector('#view-note').hidden`) {
		t.Error("the stale note went with a page error")
	}
	kubeStale.Store(false)
	// The page polls every 10 s: the badge and the note go without a reload.
	do(t, ctx, poll(`document.querySelector('#k8s-status').hidden && document.querySelector('#view-note').hidden`))
	noConsoleErrors(t, errs, "400")
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

// TestLateAnswerKeepsBanner holds the service map's answer until the user
// has moved on to the Flows page and its error shows: the map's answer,
// arriving then, must neither clear that error nor draw on the hidden
// map (it did: a slow map cleared another page's banner).
func TestLateAnswerKeepsBanner(t *testing.T) {
	ctx, errs := browser(t)
	do(t, ctx, chromedp.Navigate(baseURL+"/#/flows"), chromedp.WaitVisible(css(`#flow-table tbody tr`)))
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	next, stop := iter.Pull2(chromedp.Events(pctx, cdpfetch.RequestPaused))
	defer stop()
	do(t, ctx, chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, cdpfetch.Enable, cdpfetch.EnableParams{Patterns: []*cdpfetch.RequestPattern{{URLPattern: "*/api/v1/servicemap*"}}})
		return err
	}), js(`document.querySelector('#map').replaceChildren(); location.hash = '#/map'`))
	ev, err, ok := next()
	if !ok || err != nil {
		t.Fatalf("the map's request was not paused: %v", err)
	}
	do(t, ctx, js(`location.hash = '#/flows?dst_ip=not-an-ip'`), poll(`document.querySelector('#banner').textContent.includes('dst_ip')`))
	do(t, ctx, chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		_, err := chromedp.Call(ctx, cdpfetch.ContinueRequest, cdpfetch.ContinueRequestParams{RequestID: ev.RequestID})
		return err
	}), poll(`document.querySelector('#progress').hidden`))
	if got := eval[string](t, ctx, `document.querySelector('#banner').hidden ? '' : document.querySelector('#banner').textContent`); !strings.Contains(got, "dst_ip") {
		t.Errorf("banner %q after the map's late answer", got)
	}
	if n := eval[int](t, ctx, `document.querySelector('#map').childElementCount`); n != 0 {
		t.Errorf("the late answer drew %d elements on the hidden map", n)
	}
	noConsoleErrors(t, errs, "400")
}
