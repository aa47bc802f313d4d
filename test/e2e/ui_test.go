package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/web/api"
)

// TestUIOnLab drives the web UI in headless Chromium against the real
// product (collector, embedded store, evaluator, traceflow agents) on a
// traffic lab of each mode, and checks what the pages render:
//   - Flows: live rows arrive, of the mode's families only;
//   - Reachability: frontend/web → svc backend/api-single and workload
//     backend/api on 8080 and 9090 render exactly what POST
//     /api/v1/reachability answers, with the lab's per-family truths
//     (the single-family Service's other family "no IPv6 ClusterIP", no
//     port 9090; web → api on 9090 partial 2/4 over IPv4, denied over
//     IPv6), and a cell's drawer lists its pod pairs;
//   - Service map: edges and nodes of the mode's families only;
//   - Traceflow: web pod → svc backend/api:80 delivered in each family.
//   - Audit what-if: allow-web-to-api replaced by one admitting the web
//     pods' IPv4 addresses only newly denies web → api over IPv6 and
//     changes nothing over IPv4.
//
// The web browser tests (web/browsertest) cover the pages on seeded data
// with fakes; this one checks they tell the truth about a live cluster.
// Screenshots go to test/artifacts/e2e-<mode>-<page>.png.
func TestUIOnLab(t *testing.T) {
	requirePrereqs(t)
	requireCHDB(t)
	chrome := requireChromium(t)
	// Each mode its own lab, product (its own database) and browser; the
	// modes one after the other, as each runs a Chromium.
	t.Parallel()
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			u := newUIEnv(t, chrome, mode)
			for _, page := range []struct {
				name  string
				check func(*testing.T)
			}{
				{"flows", u.checkFlows},
				{"reach", u.checkReach},
				{"map", u.checkMap},
				{"trace", u.checkTrace},
				{"drop", u.checkDrop},
				{"whatif", u.checkWhatIf},
			} {
				t.Run(page.name, func(t *testing.T) {
					recordAs(t, string(mode)+"/ui")
					page.check(t)
				})
			}
			u.noConsoleErrors(t)
		})
	}
}

// requireChromium returns Chromium's path; it skips without it unless
// DUALFLOW_E2E=1, then it fails (as web/browsertest does).
func requireChromium(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("chromium")
	if err != nil {
		if os.Getenv("DUALFLOW_E2E") == "1" {
			t.Fatalf("DUALFLOW_E2E=1 but no chromium: %v (scripts/deps.sh installs it)", err)
		}
		t.Skip("no chromium (scripts/deps.sh installs it; DUALFLOW_E2E=1 makes this a failure)")
	}
	return p
}

// uiEnv is one mode's traffic lab, the product on it and a browser tab.
type uiEnv struct {
	mode manifest.Mode
	l    *lab.Lab
	base string // the web's URL
	fams []string
	ctx  context.Context // the tab
	// errs are the console errors seen so far.
	mu   sync.Mutex
	errs []string
}

func newUIEnv(t *testing.T, chrome string, mode manifest.Mode) *uiEnv {
	t.Helper()
	start := time.Now()
	l := startTrafficLab(t, mode)
	// The product's database is its own: every flow a page shows is
	// this lab's.
	_, base := startProduct(t, l)
	u := &uiEnv{mode: mode, l: l, base: base}
	for _, f := range mode.Families() {
		u.fams = append(u.fams, strconv.Itoa(famVersion(f)))
	}
	// The operator's token in the page's local storage, as an operator
	// who pasted it: without it the pages are a viewer's.
	tok, err := os.ReadFile(operatorTokenFile(u.base))
	if err != nil {
		t.Fatalf("the collector's local operator token: %v", err)
	}
	u.startBrowser(t, chrome, strings.TrimSpace(string(tok)))
	t.Logf("%s: lab, product and browser up in %v", mode, time.Since(start).Round(time.Millisecond))
	return u
}

// startBrowser starts a fresh headless Chromium for the mode, whose pages
// send token (as a user who pasted it in the token dialog); its tab is
// closed when t ends.
func (u *uiEnv) startBrowser(t *testing.T, chrome, token string, extra ...chromedp.ExecAllocatorOption) {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chrome),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1400, 900),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), append(opts, extra...)...)
	ctx, cancelC := chromedp.NewContext(actx)
	// A bound on the whole mode, should a step hang past its own wait.
	ctx, cancelT := context.WithTimeout(ctx, 4*time.Minute)
	t.Cleanup(func() { cancelT(); cancelC(); cancelA() })
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	setToken := chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
			Source: "try { localStorage.setItem('dualflow.token', '" + token + "') } catch (e) {}",
		})
		return err
	})
	if err := chromedp.Do(ctx, setToken); err != nil {
		t.Fatal(err)
	}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				u.mu.Lock()
				u.errs = append(u.errs, string(m.Type)+": "+m.Text+" "+m.URL)
				u.mu.Unlock()
			}
		}
	}()
	u.ctx = ctx
}

func (u *uiEnv) noConsoleErrors(t *testing.T) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, e := range u.errs {
		t.Errorf("console error: %s", e)
	}
}

func (u *uiEnv) has(fam string) bool { return slices.Contains(u.fams, fam) }

// do runs browser steps, failing t on an error.
func (u *uiEnv) do(t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(u.ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

// uiEval evaluates js in the page and decodes its value into a T.
func uiEval[T any](t *testing.T, u *uiEnv, js string) T {
	t.Helper()
	v, err := chromedp.Run(u.ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	return v
}

// wait evaluates cond (a JS expression) until it is true, for up to d (a
// loaded 2-core machine runs the lab, the product and Chromium); past d it
// fails with what state (a JS expression) says then. It polls from here
// with Runtime.evaluate rather than chromedp.Poll, whose in-page predicate
// is built with new Function, which a CSP without 'unsafe-eval' (the
// UI's) may refuse.
func (u *uiEnv) wait(t *testing.T, what string, d time.Duration, cond, state string) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	var last error
	for {
		ok, err := chromedp.Run(u.ctx, chromedp.Evaluate[bool](cond))
		if err == nil && ok {
			return time.Since(start)
		}
		last = err
		if time.Now().After(deadline) || u.ctx.Err() != nil {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	u.screenshot(t, "failed-"+strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			return r
		}
		return '-'
	}, strings.ToLower(what)))
	got, err := chromedp.Run(u.ctx, chromedp.Evaluate[any](state))
	t.Fatalf("%s: not within %v (last error %v); state: %v %v", what, d, last, got, err)
	return 0
}

// screenshot writes the page to test/artifacts/e2e-<mode>-<name>.png.
func (u *uiEnv) screenshot(t *testing.T, name string) {
	t.Helper()
	buf, err := chromedp.Run(u.ctx, chromedp.FullScreenshot(100)) // 100: PNG
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	dir := filepath.Join("..", "artifacts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "e2e-"+string(u.mode)+"-"+name+".png"), buf, 0o644); err != nil {
		t.Error(err)
	}
}

const rowsJS = `[...document.querySelectorAll('#flow-table tbody tr')]`

// checkFlows follows the live flows until rows of every family of the
// mode arrived, then checks no row is of another family, and that the
// page's own query (follow off) shows them too.
func (u *uiEnv) checkFlows(t *testing.T) {
	u.do(t, chromedp.Navigate(u.base+"/#/flows"), chromedp.WaitVisible(chromedp.CSS(`#page-flows`)))
	u.wait(t, "the flow table loaded", 30*time.Second, `document.querySelector('#flow-count').textContent !== ''`, `document.querySelector('#banner').textContent`)
	u.do(t, chromedp.Click(chromedp.CSS(`#f-follow`)))
	want := `['` + strings.Join(u.fams, `','`) + `']`
	// The exporters send a flow when it ends or every active timeout
	// (10 s): the first rows take a few rounds of traffic.
	u.wait(t, "live rows of each family", 90*time.Second,
		`(() => { const f = new Set(`+rowsJS+`.filter(r => r.classList.contains('fresh')).map(r => r.dataset.family)); return `+want+`.every(x => f.has(x)); })()`,
		`({banner: document.querySelector('#banner').textContent, count: document.querySelector('#flow-count').textContent, fresh: `+rowsJS+`.filter(r => r.classList.contains('fresh')).map(r => r.dataset.family)})`)
	u.screenshot(t, "flows")
	fams := uiEval[[]string](t, u, rowsJS+`.map(r => r.dataset.family)`)
	for _, f := range fams {
		if !u.has(f) {
			t.Errorf("an IPv%s row in %s mode", f, u.mode)
		}
	}
	// The rows name the lab's pods (enriched from its Kubernetes objects).
	if n := uiEval[int](t, u, rowsJS+`.filter(r => r.cells[2].textContent.startsWith('frontend/web-')).length`); n == 0 {
		t.Errorf("no row from a frontend/web pod among %d rows", len(fams))
	}
	// Follow off, the page's query of the last hour shows the same families.
	u.do(t, chromedp.Click(chromedp.CSS(`#f-follow`)), chromedp.Click(chromedp.CSS(`#flow-filter button[type=submit]`)))
	u.wait(t, "the stored rows", 30*time.Second,
		`!document.querySelector('#flow-count').textContent.includes('live') && `+rowsJS+`.length > 0 && !`+rowsJS+`.some(r => r.classList.contains('fresh'))`,
		`document.querySelector('#flow-count').textContent`)
	stored := map[string]int{}
	for _, f := range uiEval[[]string](t, u, rowsJS+`.map(r => r.dataset.family)`) {
		stored[f]++
	}
	for f, n := range stored {
		if !u.has(f) {
			t.Errorf("%d stored IPv%s rows in %s mode", n, f, u.mode)
		}
	}
}

// renderedCell is what the matrix shows of one cell in one family.
type renderedCell struct {
	Fam            string
	Si, Di         int
	Outcome        string // data-outcome
	Verdict, Text  string
	Class, Title   string
	Warn, HasError bool
}

// checkReach fills the Reachability form, runs it on 8080 then 9090, and
// checks each matrix against the API's answer and the lab's truths.
func (u *uiEnv) checkReach(t *testing.T) {
	web := audit.Endpoint{Kind: "workload", Namespace: manifest.NSFrontend, Name: "web"}
	single := audit.Endpoint{Kind: "service", Namespace: manifest.NSBackend, Name: manifest.ServiceAPISingle}
	apiW := audit.Endpoint{Kind: "workload", Namespace: manifest.NSBackend, Name: "api"}
	u.do(t, chromedp.Navigate(u.base+"/#/reach?sources=workload:frontend/web&destinations=service:backend/api-single,workload:backend/api&protocol=TCP"),
		chromedp.WaitVisible(chromedp.CSS(`#reach-form`)))
	// Keep the answer the page itself receives, to compare what it draws.
	u.do(t, chromedp.Evaluate[chromedp.Void](`(() => {
		window.reachAnswers = [];
		const real = window.fetch;
		window.fetch = async (url, init) => {
			const r = await real(url, init);
			if (String(url).endsWith('/api/v1/reachability')) r.clone().json().then(j => window.reachAnswers.push(j));
			return r;
		};
	})(); undefined`))
	// The product lists the cluster after it starts: a cell evaluated
	// before it has the view is an error about it.
	first := "4"
	if u.mode == manifest.ModeIPv6 {
		first = "6"
	}
	var runs int
	run := func(port uint16) *api.Reachability {
		t.Helper()
		u.do(t, chromedp.SetValue(chromedp.CSS(`#reach-form [name=port]`), strconv.Itoa(int(port))),
			chromedp.Click(chromedp.CSS(`#reach-form button[type=submit]`)))
		runs++
		u.wait(t, fmt.Sprintf("the matrix on %d", port), 60*time.Second,
			`window.reachAnswers.length >= `+strconv.Itoa(runs)+` && !document.querySelector('#reach-form button[type=submit]').disabled && document.querySelectorAll('.matrix table td.cell').length === 4`,
			`({banner: document.querySelector('#banner').textContent, summary: document.querySelector('#reach-summary').textContent, answers: window.reachAnswers.length})`)
		return uiEval[*api.Reachability](t, u, `window.reachAnswers[window.reachAnswers.length - 1]`)
	}
	var shown *api.Reachability
	var cells []renderedCell
	for _, port := range []uint16{manifest.PortHTTP, manifest.PortMetrics} {
		deadline := time.Now().Add(30 * time.Second)
		for {
			shown = run(port)
			if f := shown.Cells[0][0].Families[first]; f == nil || f.Outcome != audit.OutcomeError || !strings.Contains(f.PolicyError, "Kubernetes view") || time.Now().After(deadline) {
				break
			}
		}
		u.screenshot(t, "reach-"+strconv.Itoa(int(port)))
		cells = uiEval[[]renderedCell](t, u, `[...document.querySelectorAll('.matrix table')].flatMap(tb => [...tb.querySelectorAll('td.cell')].map(td => ({
			Fam: tb.dataset.family, Si: Number(td.dataset.si), Di: Number(td.dataset.di), Outcome: td.dataset.outcome,
			Verdict: td.querySelector('span.verdict').textContent, Text: td.textContent, Class: td.className, Title: td.title,
			Warn: !!td.querySelector('.warn'), HasError: td.classList.contains('error')})))`)
		// The request the page sent, asked again.
		req := api.ReachabilityRequest{Sources: []audit.Endpoint{web}, Destinations: []audit.Endpoint{single, apiW}, Protocol: "TCP", Port: port, Since: "1h"}
		var asked api.Reachability
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		_, err := restCall(ctx, http.MethodPost, u.base+"/api/v1/reachability", req, &asked)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		checkDrawn(t, shown, cells)
		sameEvaluation(t, port, shown, &asked)
		u.checkReachTruths(t, port, first, cells)
	}
	// The 9090 cell web → api opens its pairs: every pod pair of each
	// family of the mode, with the verdict the API gave it.
	u.do(t, chromedp.Click(chromedp.CSS(`.matrix table[data-family="`+first+`"] td.cell[data-si="0"][data-di="1"]`)))
	for _, fam := range u.fams {
		u.wait(t, "the IPv"+fam+" pairs in the drawer", 20*time.Second,
			`document.querySelectorAll('#drawer .celldetail .famdetail[data-family="`+fam+`"] ul.pairs li').length > 0`,
			`document.querySelector('#drawer').innerText`)
		type li struct{ Verdict, Text string }
		got := uiEval[[]li](t, u, `[...document.querySelectorAll('#drawer .celldetail .famdetail[data-family="`+fam+`"] ul.pairs li')].map(l => ({Verdict: l.dataset.verdict, Text: l.textContent}))`)
		want := shown.Cells[0][1].Families[fam].Pairs
		if len(got) != len(want) || len(want) != 4 {
			t.Errorf("IPv%s drawer lists %d pairs, the API %d (want the 4 web × api pod pairs)", fam, len(got), len(want))
			continue
		}
		for i, p := range want {
			if got[i].Verdict != p.Verdict || !strings.Contains(got[i].Text, p.Src+" → "+p.Dst) || !strings.Contains(got[i].Text, p.DstIP) {
				t.Errorf("IPv%s pair %d drawn %+v, the API says %s → %s (%s) %s", fam, i, got[i], p.Src, p.Dst, p.DstIP, p.Verdict)
			}
		}
	}
	// The drawer runs a dual trace of the cell: let it end before the next
	// page traces.
	u.wait(t, "the cell's dual trace", 60*time.Second,
		`!document.querySelector('#cell-trace-status').textContent.startsWith('Running')`, `document.querySelector('#drawer').innerText`)
	u.screenshot(t, "reach-cell")
}

// checkDrawn checks the matrix drew exactly the answer the page received.
func checkDrawn(t *testing.T, m *api.Reachability, cells []renderedCell) {
	t.Helper()
	if len(cells) != 2*len(m.Sources)*len(m.Destinations) {
		t.Fatalf("%d cells drawn for a %d×%d matrix in two families", len(cells), len(m.Sources), len(m.Destinations))
	}
	for _, c := range cells {
		cell := m.Cells[c.Si][c.Di]
		f := cell.Families[c.Fam]
		at := fmt.Sprintf("cell %d,%d IPv%s", c.Si, c.Di, c.Fam)
		if f == nil {
			t.Errorf("%s drawn %q, absent from the answer", at, c.Text)
			continue
		}
		label := strings.ReplaceAll(f.Outcome, "_", " ")
		if f.Outcome == audit.OutcomePartial {
			label += fmt.Sprintf(" %d/%d", f.PairsAllowed, f.PairsTotal)
		}
		flows := "no flows"
		if f.Observed.Flows > 0 {
			flows = fmt.Sprintf("%d flows", f.Observed.Flows)
			if d := f.Observed.Verdicts["dropped"]; d > 0 {
				flows += fmt.Sprintf(", %d dropped", d)
			}
		}
		var errs []string
		if c.Outcome != f.Outcome || c.Verdict != label {
			errs = append(errs, fmt.Sprintf("outcome %s %q, want %s %q", c.Outcome, c.Verdict, f.Outcome, label))
		}
		if c.HasError != (f.PolicyError != "") || f.PolicyError != "" && !strings.Contains(c.Text, f.PolicyError) {
			errs = append(errs, fmt.Sprintf("policy error %q drawn as %v", f.PolicyError, c.HasError))
		}
		if f.Reason != "" && f.PolicyError == "" && !(f.Outcome == audit.OutcomePartial && strings.Contains(f.Reason, "allowed")) && !strings.Contains(c.Text, f.Reason) {
			errs = append(errs, fmt.Sprintf("reason %q not shown", f.Reason))
		}
		if f.Policy != nil && !strings.Contains(c.Text, "policy "+f.Policy.Verdict) {
			errs = append(errs, fmt.Sprintf("policy %q not shown", f.Policy.Verdict))
		}
		if !strings.HasSuffix(c.Text, flows) {
			errs = append(errs, fmt.Sprintf("observed %+v not shown as %q", f.Observed, flows))
		}
		if c.Warn != (f.Mismatch != "") {
			errs = append(errs, fmt.Sprintf("⚠ drawn %v, the answer's mismatch %q", c.Warn, f.Mismatch))
		}
		if strings.Contains(c.Class, "asym") != cell.Asymmetric {
			errs = append(errs, fmt.Sprintf("asymmetric drawn %v, answered %v (%v)", strings.Contains(c.Class, "asym"), cell.Asymmetric, cell.Reasons))
		}
		if len(errs) > 0 {
			t.Errorf("%s drawn %q (class %q): %s", at, c.Text, c.Class, strings.Join(errs, "; "))
		}
	}
}

// sameEvaluation checks the page's answer is the API's: the evaluation of
// every cell. What was observed (and so the mismatch and asymmetry, which
// weigh the observed flows too) changes with the live traffic between the
// two requests; checkDrawn compares those with the page's own answer.
func sameEvaluation(t *testing.T, port uint16, shown, asked *api.Reachability) {
	t.Helper()
	if len(shown.Cells) != len(asked.Cells) {
		t.Fatalf("port %d: the page got %d rows, the API answers %d", port, len(shown.Cells), len(asked.Cells))
	}
	for i := range asked.Cells {
		for j := range asked.Cells[i] {
			if j >= len(shown.Cells[i]) {
				t.Fatalf("port %d: the page got %d columns, the API answers %d", port, len(shown.Cells[i]), len(asked.Cells[i]))
			}
			a, s := asked.Cells[i][j], shown.Cells[i][j]
			for fam, af := range a.Families {
				sf := s.Families[fam]
				if sf == nil {
					t.Errorf("port %d cell %d,%d: the page got no IPv%s", port, i, j, fam)
					continue
				}
				type eval struct {
					Outcome, Reason, PolicyError string
					Policy                       *audit.PolicyVerdict
					Allowed, Total               int
					Pairs                        []audit.PairVerdict
				}
				ae := eval{af.Outcome, af.Reason, af.PolicyError, af.Policy, af.PairsAllowed, af.PairsTotal, af.Pairs}
				se := eval{sf.Outcome, sf.Reason, sf.PolicyError, sf.Policy, sf.PairsAllowed, sf.PairsTotal, sf.Pairs}
				if !reflect.DeepEqual(ae, se) {
					t.Errorf("port %d cell %d,%d IPv%s: the page got %+v, the API says %+v", port, i, j, fam, se, ae)
				}
			}
		}
	}
}

// checkReachTruths checks the drawn cells say what the lab's Services
// and policies make true (see TestReachabilityMatrix, which dials them):
// api-single is a single-family Service (the mode's first family), and
// the metrics policy admits web → api on 9090 over IPv4 from node 1's
// pods only (2 of 4 pairs), over IPv6 from none.
func (u *uiEnv) checkReachTruths(t *testing.T, port uint16, first string, cells []renderedCell) {
	t.Helper()
	at := func(fam string, di int) renderedCell {
		for _, c := range cells {
			if c.Fam == fam && c.Si == 0 && c.Di == di {
				return c
			}
		}
		t.Fatalf("no IPv%s cell 0,%d drawn", fam, di)
		return renderedCell{}
	}
	for _, fam := range []string{"4", "6"} {
		c := at(fam, 0) // → svc backend/api-single
		switch {
		case fam != first:
			if c.Outcome != audit.OutcomeNoFamily || !strings.Contains(c.Text, "no IPv"+fam+" ClusterIP") {
				t.Errorf("web → svc api-single:%d IPv%s drawn %q, want no IPv%s ClusterIP", port, fam, c.Text, fam)
			}
		case port == manifest.PortMetrics:
			if c.Outcome != audit.OutcomeNoPort || !strings.Contains(c.Text, "no port 9090/TCP") {
				t.Errorf("web → svc api-single:9090 IPv%s drawn %q, want no such port", fam, c.Text)
			}
		default:
			if c.Outcome != audit.OutcomeAllow || !strings.Contains(c.Text, "4 pairs") {
				t.Errorf("web → svc api-single:8080 IPv%s drawn %q, want allow over 4 pairs", fam, c.Text)
			}
		}
		c = at(fam, 1) // → workload backend/api
		switch {
		case !u.has(fam):
			if c.Outcome != audit.OutcomeUnavailable {
				t.Errorf("web → api:%d IPv%s in %s mode drawn %q, want unavailable", port, fam, u.mode, c.Text)
			}
		case port == manifest.PortHTTP:
			if c.Outcome != audit.OutcomeAllow || !strings.Contains(c.Text, "4 pairs") {
				t.Errorf("web → api:8080 IPv%s drawn %q, want allow over 4 pairs", fam, c.Text)
			}
		case fam == "4":
			if c.Outcome != audit.OutcomePartial || c.Verdict != "partial 2/4" {
				t.Errorf("web → api:9090 IPv4 drawn %q, want partial 2/4", c.Text)
			}
		default:
			if c.Outcome != audit.OutcomeDeny || !strings.Contains(c.Text, "4 pairs") {
				t.Errorf("web → api:9090 IPv6 drawn %q, want deny over 4 pairs", c.Text)
			}
		}
	}
}

// checkMap waits for the map to draw web → svc backend/api in each family
// of the mode, and checks no edge or node is of another family.
func (u *uiEnv) checkMap(t *testing.T) {
	u.do(t, chromedp.Navigate(u.base+"/#/map"), chromedp.WaitVisible(chromedp.CSS(`#page-map`)))
	want := `['` + strings.Join(u.fams, `','`) + `']`
	// The map draws once per visit: submit its form again until it has,
	// in every family of the mode, web → svc backend/api and the dropped
	// web@2 → api@1 on 9090 (the metrics policy admits no IPv6 source and
	// excepts node 2's IPv4 pod CIDR; the source node exports the
	// connection its conntrack saw, the drop correlated).
	took := u.wait(t, "web → svc backend/api and dropped web → api in each family", 60*time.Second,
		`(() => {
			const cy = window.dualflowMap;
			const ok = cy && `+want+`.every(f => cy.edges().some(e => e.data('source') === 'frontend/web' && e.data('target') === 'svc:backend/api' && String(e.data('ip_version')) === f) &&
				cy.edges('.dropped.v' + f).some(e => e.data('source') === 'frontend/web' && e.data('target') === 'backend/api'));
			// Nothing in flight and the last draw 2 s ago: ask again.
			if (!ok && document.querySelector('#progress').hidden && Date.now() - (window.mapAsked || 0) > 2000) {
				window.mapAsked = Date.now();
				document.querySelector('#map-form').requestSubmit();
			}
			return ok;
		})()`,
		`window.dualflowMap ? window.dualflowMap.edges().map(e => e.id() + ' ' + e.data('source') + ' → ' + e.data('target') + ' ' + e.data('label')) : document.querySelector('#map').textContent`)
	t.Logf("map complete after %v", took.Round(time.Millisecond))
	u.do(t, chromedp.Sleep(300*time.Millisecond)) // cytoscape paints on its next frame
	u.screenshot(t, "map")
	type edge struct {
		Source, Target, Label, Class string
		Family                       int
	}
	type node struct{ ID, Label, Families string }
	edges := uiEval[[]edge](t, u, `window.dualflowMap.edges().filter(e => e.data('kind') !== 'backend').map(e => ({Source: e.data('source'), Target: e.data('target'), Label: e.data('label'), Class: e.classes().join(' '), Family: e.data('ip_version')}))`)
	for _, e := range edges {
		v := "v" + strconv.Itoa(e.Family)
		if !u.has(strconv.Itoa(e.Family)) || !strings.HasPrefix(e.Label, v+" ") || !strings.Contains(" "+e.Class+" ", " "+v+" ") {
			t.Errorf("%s mode: edge %s → %s IPv%d labelled %q (classes %q)", u.mode, e.Source, e.Target, e.Family, e.Label, e.Class)
		}
	}
	nodes := uiEval[[]node](t, u, `window.dualflowMap.nodes().filter(n => n.data('families')).map(n => ({ID: n.id(), Label: n.data('label'), Families: n.data('families')}))`)
	if len(nodes) == 0 {
		t.Fatal("no node with families drawn")
	}
	for _, n := range nodes {
		for _, f := range strings.Split(n.Families, ",") {
			if !u.has(f) || !strings.Contains(n.Label, "v"+f) {
				t.Errorf("%s mode: node %s of families %s labelled %q", u.mode, n.ID, n.Families, n.Label)
			}
		}
	}
}

// checkTrace traces web@1 → svc backend/api:80 from the Traceflow form in
// the mode's families: each is delivered, with its path drawn.
func (u *uiEnv) checkTrace(t *testing.T) {
	web1, err := u.l.PodOn(manifest.NSFrontend, "web", 1)
	if err != nil {
		t.Fatal(err)
	}
	u.trace(t, "pod:"+web1.Namespace+"/"+web1.Name, "service:backend/api", 80)
	u.screenshot(t, "trace")
	type trace struct {
		Family, Outcome, Verdict, Head string
		Hops                           int
	}
	got := uiEval[[]trace](t, u, `[...document.querySelectorAll('#trace-out .trace')].map(d => ({Family: d.dataset.family, Outcome: d.dataset.outcome,
		Verdict: (d.querySelector('p .verdict') || {}).textContent || '', Head: d.querySelector('h2').textContent, Hops: d.querySelectorAll('.path li').length}))`)
	var fams []string
	for _, tr := range got {
		fams = append(fams, tr.Family)
		if tr.Outcome != "delivered" || tr.Verdict != "delivered" || tr.Hops == 0 {
			t.Errorf("IPv%s trace web → svc backend/api:80 drawn %+v, want delivered with its hops", tr.Family, tr)
		}
		// The probe goes to the Service's ClusterIP of the family.
		svc, ok := u.l.Manifest.Service(manifest.NSBackend, manifest.ServiceAPI)
		if !ok {
			t.Fatal("no Service backend/api in the manifest")
		}
		fam := corev1.IPv4Protocol
		if tr.Family == "6" {
			fam = corev1.IPv6Protocol
		}
		// The header names the pod and the Service with their addresses.
		if a, ok := manifest.ServiceAddr(svc, fam); !ok || !strings.Contains(tr.Head, web1.Namespace+"/"+web1.Name+" (") ||
			!strings.HasSuffix(tr.Head, "→ service backend/api ("+a.String()+")") {
			t.Errorf("IPv%s trace headed %q, want from %s to the Service's ClusterIP %v", tr.Family, tr.Head, web1.Name, a)
		}
	}
	if !slices.Equal(fams, u.fams) {
		t.Errorf("traces of families %v drawn, want %v", fams, u.fams)
	}
	if b := uiEval[string](t, u, `document.querySelector('#banner').textContent`); b != "" {
		t.Errorf("banner %q", b)
	}
}

// trace runs a TCP trace from src to dst on port in the mode's families
// through the Traceflow page's form, and waits for its result.
func (u *uiEnv) trace(t *testing.T, src, dst string, port int) {
	t.Helper()
	family := map[manifest.Mode]string{manifest.ModeIPv4: "ipv4", manifest.ModeIPv6: "ipv6", manifest.ModeDual: "dual"}[u.mode]
	u.do(t, chromedp.Navigate(u.base+"/#/trace?source="+src+"&destination="+dst+"&protocol=TCP&port="+strconv.Itoa(port)),
		chromedp.WaitVisible(chromedp.CSS(`#trace-form`)),
		chromedp.SetValue(chromedp.CSS(`#trace-form [name=family]`), family),
		chromedp.Click(chromedp.CSS(`#trace-form button[type=submit]`)))
	u.wait(t, "the traces", 60*time.Second,
		`!document.querySelector('#trace-form button[type=submit]').disabled && document.querySelectorAll('#trace-out .trace').length > 0`,
		`({banner: document.querySelector('#banner').textContent, out: document.querySelector('#trace-out').innerText})`)
}

// checkDrop: a denied connection (tools/probe-1 → backend/api@1:8080, the
// default deny) reads the one explanation of a drop in a trace, whose
// reason it is (the datapath's rule a detail, not the policy), and in the
// flow drawer of its stored flows, in each family of the mode.
func (u *uiEnv) checkDrop(t *testing.T) {
	probe1, err := u.l.PodOn(manifest.NSTools, "probe", 1)
	if err != nil {
		t.Fatal(err)
	}
	api1, err := u.l.PodOn(manifest.NSBackend, "api", 1)
	if err != nil {
		t.Fatal(err)
	}
	want := "ingress denied by backend/" + manifest.PolicyDefaultDeny + ", which isolates backend/" + api1.Name + ": no ingress rule of "
	u.trace(t, "pod:"+probe1.Namespace+"/"+probe1.Name, "pod:backend/"+api1.Name, 8080)
	u.screenshot(t, "trace-drop")
	type trace struct {
		Family, Outcome, Reason string
		Pols                    []string
	}
	got := uiEval[[]trace](t, u, `[...document.querySelectorAll('#trace-out .trace')].map(d => ({Family: d.dataset.family, Outcome: d.dataset.outcome,
		Reason: (d.querySelector('p.note') || {}).textContent || '', Pols: [...d.querySelectorAll('.path li .pol')].map(x => x.textContent)}))`)
	if len(got) != len(u.fams) {
		t.Errorf("%d traces drawn, want %d", len(got), len(u.fams))
	}
	for _, tr := range got {
		if tr.Outcome != "dropped" || !strings.Contains(tr.Reason, want) || !slices.Equal(tr.Pols, []string{" · policy backend/" + manifest.PolicyDefaultDeny}) {
			t.Errorf("IPv%s trace probe-1 → api@1:8080 drawn %+v, want dropped, the reason %q…, the policy alone on the drop", tr.Family, tr, want)
		}
	}
	// A stored dropped flow is explained the same way in its drawer, with
	// the policy its row names (the exporters report drops within a few
	// rounds of traffic).
	u.do(t, chromedp.Navigate(u.base+"/#/flows?verdict=dropped"), chromedp.WaitVisible(chromedp.CSS(`#page-flows`)))
	u.wait(t, "dropped rows", 90*time.Second,
		// Only dropped rows: the table may still hold an earlier page's.
		`(() => { const r = `+rowsJS+`; if (r.length === 0) document.querySelector('#flow-filter button[type=submit]').click();
			return r.length > 0 && r.every(x => /^(denied|rejected)$/.test(x.querySelector('td.verdict').textContent)); })()`,
		`({banner: document.querySelector('#banner').textContent, count: document.querySelector('#flow-count').textContent})`)
	pol := uiEval[string](t, u, rowsJS+`[0].querySelector('td.policy').textContent`)
	u.do(t, chromedp.Evaluate[chromedp.Void](rowsJS+`[0].click()`))
	u.wait(t, "the drawer's explanation", 30*time.Second,
		`(document.querySelector('#flow-why') || {}).textContent.startsWith('With the policies in force now:')`,
		`(document.querySelector('#drawer') || {}).innerText`)
	u.screenshot(t, "flow-drawer-drop")
	if why := uiEval[string](t, u, `document.querySelector('#flow-why').textContent`); pol == "" || !strings.Contains(why, " is denied: ") || !strings.Contains(why, " denied by "+pol+", which isolates ") {
		t.Errorf("the drawer of a flow dropped by %q explains %q", pol, why)
	}
}

// checkWhatIf pastes, on the Audit page, a proposal that replaces
// backend/allow-web-to-api with the same rule over the web pods' IPv4
// addresses (ipBlock /32s) instead of their selectors: replayed over the
// recorded flows, web → api becomes denied over IPv6 and nothing changes
// over IPv4 (the same web pods are admitted, and no other); so do the
// Reachability cells from web to api and its Services. It asks again
// until the store holds web → api flows of the mode's families.
func (u *uiEnv) checkWhatIf(t *testing.T) {
	var blocks []string
	for _, p := range u.l.Manifest.Pods {
		if p.Namespace != manifest.NSFrontend || p.Labels["app"] != "web" {
			continue
		}
		for _, ip := range p.Status.PodIPs {
			if a, err := netip.ParseAddr(ip.IP); err == nil && a.Is4() {
				blocks = append(blocks, "{ipBlock: {cidr: "+a.String()+"/32}}")
			}
		}
	}
	if len(blocks) == 0 {
		// IPv6-only: no IPv4 address to admit; an empty from would admit
		// every source, so the rule names an address of no pod.
		blocks = []string{"{ipBlock: {cidr: 198.19.255.254/32}}"}
	}
	proposal := `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: ` + manifest.NSBackend + `, name: ` + manifest.PolicyAllowWeb + `}
spec:
  podSelector: {matchLabels: {app: api}}
  policyTypes: [Ingress]
  ingress:
  - from: [` + strings.Join(blocks, ", ") + `]
    ports: [{protocol: TCP, port: http}, {protocol: UDP, port: udp-echo}]
`
	q, _ := json.Marshal(proposal)
	u.do(t, chromedp.Navigate(u.base+"/#/audit"), chromedp.WaitVisible(chromedp.CSS(`#whatif-form textarea`)),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#whatif-form [name=policy]').value = `+string(q)+`; undefined`))
	// Done when the answer replayed web → api flows: over IPv6 they
	// change; an IPv4-only lab has none to change, so any replayed flow
	// of its will do (its web → api traffic is the lab's most frequent).
	done := `document.querySelector('#whatif-out .wisummary') && Number(document.querySelector('#whatif-out .wisummary').dataset.flows) > 0`
	if u.has("6") {
		done = `document.querySelectorAll('#whatif-out .wifam[data-family="6"] tbody tr').length > 0`
	}
	u.wait(t, "the what-if's answer", 90*time.Second,
		`(() => {
			const ok = `+done+`;
			// Nothing in flight and the last answer 3 s ago: ask again.
			if (!ok && document.querySelector('#progress').hidden && Date.now() - (window.whatifAsked || 0) > 3000) {
				window.whatifAsked = Date.now();
				document.querySelector('#whatif-form').requestSubmit();
			}
			return ok;
		})()`,
		`({status: document.querySelector('#whatif-status').textContent, out: document.querySelector('#whatif-out').innerText})`)
	u.screenshot(t, "whatif")
	type change struct{ Family, Change, Src, Dst string }
	got := uiEval[[]change](t, u, `[...document.querySelectorAll('#whatif-out .wifam')].flatMap(f => [...f.querySelectorAll('.wichange')].flatMap(c =>
		[...c.querySelectorAll('tbody tr')].map(tr => ({Family: f.dataset.family, Change: c.dataset.change, Src: tr.dataset.src, Dst: tr.dataset.dst}))))`)
	for _, c := range got {
		if c.Family != "6" || c.Change != "newly-denied" || c.Src != manifest.NSFrontend+"/web" || c.Dst != manifest.NSBackend+"/api" {
			t.Errorf("the what-if changes %+v; want only web → api, newly denied, over IPv6", c)
		}
	}
	if u.has("6") && len(got) == 0 {
		t.Error("no IPv6 change drawn")
	}
	// The cells of the Reachability matrix change the same way, whatever
	// was recorded: web → api (and the Services in front of api) over
	// IPv6 only.
	type cell struct{ Src, Dst, Changed string }
	cells := uiEval[[]cell](t, u, `[...document.querySelectorAll('#whatif-out .wicells tbody tr')].map(tr => ({Src: tr.dataset.src, Dst: tr.dataset.dst, Changed: tr.dataset.changed}))`)
	webAPI := false
	for _, c := range cells {
		if c.Changed != "6" || c.Src != "workload:"+manifest.NSFrontend+"/web" || !strings.HasPrefix(c.Dst, "workload:"+manifest.NSBackend+"/api") && !strings.HasPrefix(c.Dst, "service:"+manifest.NSBackend+"/api") {
			t.Errorf("the what-if changes cell %+v; want only web → api over IPv6", c)
		}
		webAPI = webAPI || c.Dst == "workload:"+manifest.NSBackend+"/api"
	}
	if u.has("6") != webAPI {
		t.Errorf("cells %+v: want web → api changed over IPv6 iff the lab has IPv6", cells)
	}
	if s := uiEval[string](t, u, `document.querySelector('#whatif-status').textContent`); s != "" {
		t.Errorf("what-if status %q", s)
	}
}
