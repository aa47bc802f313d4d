package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cdpbrowser "github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dualflow/dualflow/collector/audit/recommend"
	"github.com/dualflow/dualflow/test/support/fakes"
	"github.com/dualflow/dualflow/test/support/webtest"
)

// The links the UI's entry points give to the Recommend page: the
// workload at a flow's or an audit finding's end, over the last 6 hours.
const (
	recommendDB   = "#/recommend?namespace=shop&workload=StatefulSet%2Fdb&mode=least-privilege&window=6h&run=1"
	recommendCart = "#/recommend?namespace=shop&workload=Deployment%2Fcart&mode=least-privilege&window=6h&run=1"
)

// labObjects are the objects of fakes.NewAudit's view (the lab's pods
// with addresses of families fams, and its policy) and the lab's
// namespaces, labelled as the API server labels them: a
// recommendation's scope must name one.
func labObjects(fams ...int) []runtime.Object {
	objs := []runtime.Object{fakes.DBPolicy()}
	seen := map[string]bool{}
	for _, w := range webtest.Lab {
		if !seen[w.Namespace] {
			seen[w.Namespace] = true
			objs = append(objs, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: w.Namespace, Labels: map[string]string{corev1.LabelMetadataName: w.Namespace}}})
		}
	}
	for _, p := range fakes.LabPods(fams...) {
		objs = append(objs, p)
	}
	return objs
}

// askRecommend asks base's API for the recommendation of the page's
// URL hash (its scope, mode and fixed window).
func askRecommend(t *testing.T, base, hash string) (*recommend.Report, int, map[string]string) {
	t.Helper()
	_, query, _ := strings.Cut(hash, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"window", "run"} {
		q.Del(k)
	}
	req, err := http.NewRequest("GET", base+"/api/v1/policy/recommend?"+q.Encode(), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+operatorToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		var e map[string]string
		if err := json.NewDecoder(res.Body).Decode(&e); err != nil {
			t.Fatal(err)
		}
		return nil, res.StatusCode, e
	}
	var rep recommend.Report
	if err := json.NewDecoder(res.Body).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	return &rep, res.StatusCode, nil
}

// checkDiff compares the diff drawn with the API's: each policy with
// its change and summary, a changed one's unified diff with its added
// and removed lines marked, an added one's YAML folded; it returns the
// number of added and removed lines marked.
func checkDiff(t *testing.T, ctx context.Context, rep *recommend.Report) (adds, dels int) {
	t.Helper()
	type entry struct {
		Policy, Change, Summary, Text string
		Adds, Dels                    int
	}
	got := eval[[]entry](t, ctx, `[...document.querySelectorAll('#rec-out .recdiff')].map(d => ({Policy: d.dataset.policy, Change: d.dataset.change,
		Summary: [...d.querySelectorAll('.recsummary li')].map(li => li.textContent).join('\n'), Text: d.querySelector('pre.diff').textContent,
		Adds: d.querySelectorAll('pre.diff span.add').length, Dels: d.querySelectorAll('pre.diff span.del').length}))`)
	var want []entry
	for _, d := range rep.Diff {
		e := entry{Policy: d.Namespace + "/" + d.Name, Change: string(d.Change), Summary: strings.Join(d.Summary, "\n"), Text: d.Proposed}
		if d.Unified != "" {
			e.Text = strings.TrimSuffix(d.Unified, "\n") + "\n"
			for _, l := range strings.Split(d.Unified, "\n") {
				switch {
				case strings.HasPrefix(l, "+") && !strings.HasPrefix(l, "+++ "):
					e.Adds++
				case strings.HasPrefix(l, "-") && !strings.HasPrefix(l, "--- "):
					e.Dels++
				}
			}
		}
		adds, dels = adds+e.Adds, dels+e.Dels
		want = append(want, e)
	}
	if !slices.Equal(got, want) {
		t.Errorf("diff drawn %+v\nwant the API's %+v", got, want)
	}
	if none := eval[bool](t, ctx, `!!document.querySelector('#rec-out .recdiffnone')`); none != (len(rep.Diff) == 0) {
		t.Errorf("%d policies in the diff, and the page says none changes: %v", len(rep.Diff), none)
	}
	return adds, dels
}

// download clicks the link sel and returns what the browser saved.
func download(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	dir := t.TempDir()
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	progress := chromedp.Events(dctx, cdpbrowser.DownloadProgress)
	events := true
	do(t, ctx, chromedp.Func(func(ctx context.Context, _ *chromedp.Target) error {
		// The tab's browser context, not the browser's default one.
		_, err := chromedp.Call(ctx, cdpbrowser.SetDownloadBehavior, cdpbrowser.SetDownloadBehaviorParams{
			Behavior: cdpbrowser.SetDownloadBehaviorBehaviorAllowAndName, DownloadPath: dir, EventsEnabled: &events,
			BrowserContextID: chromedp.FromContext(ctx).BrowserContextID,
		})
		return err
	}), chromedp.Click(css(sel)))
	for ev, err := range progress {
		if err != nil {
			t.Fatalf("download %s: %v", sel, err)
		}
		if ev.State == cdpbrowser.DownloadProgressStateCompleted {
			b, err := os.ReadFile(filepath.Join(dir, ev.GUID))
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
	}
	t.Fatalf("download %s: not completed", sel)
	return ""
}

// TestRecommendUI opens the Recommend page from a workload (a flow's
// destination in the Flows drawer) and from an audit finding (an
// unprotected workload), in each IP mode, over the seeded flows and the
// real recommender (recommend.Queries over the store and the lab's
// view): the form has the scope, the YAML names the workload's
// policies and is the API's answer for the window the URL fixes (the
// download too), the replay shows each family of the mode with nothing
// newly denied (least privilege over the flows it was built from), the
// URL asks for the same YAML again (a spinner while it waits), the
// YAML opens in the what-if, at 1000 px only the YAML and diff
// boxes scroll sideways, and a scope naming nothing shows the API's
// message with its field.
func TestRecommendUI(t *testing.T) {
	for _, tc := range []struct {
		mode string
		fams []string
	}{
		{"dual", []string{"4", "6"}},
		{"v4", []string{"4"}},
		{"v6", []string{"6"}},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			ctx, errs := browser(t)
			u := baseURL
			if tc.mode != "dual" {
				u = modeURL[strings.TrimPrefix(tc.mode, "v")]
			}
			// check reads the answer drawn for workload (of kind) and
			// compares it with the API's for the same URL; it returns
			// the URL and the YAML.
			check := func(kind, workload string) (string, string) {
				t.Helper()
				do(t, ctx, chromedp.WaitVisible(css(`#rec-out .recyaml`)))
				hash := eval[string](t, ctx, `location.hash`)
				if !strings.Contains(hash, "&since=") || !strings.Contains(hash, "&until=") {
					t.Errorf("the URL %q does not fix the window", hash)
				}
				if got := eval[string](t, ctx, `(f => f.namespace.value + ' ' + f.workload.value + ' ' + f.mode.value)(document.querySelector('#rec-form'))`); got != "shop "+kind+"/"+workload+" least-privilege" {
					t.Errorf("form %q", got)
				}
				rep, code, e := askRecommend(t, u, hash)
				if rep == nil {
					t.Fatalf("API %d %v", code, e)
				}
				yaml := eval[string](t, ctx, `document.querySelector('#rec-out .recyaml').textContent`)
				if yaml != rep.YAML {
					t.Errorf("the YAML drawn differs from the API's:\n%s\n---\n%s", yaml, rep.YAML)
				}
				for _, p := range []string{workload + "-ingress", workload + "-egress"} {
					if !strings.Contains(yaml, "name: "+p+"\n") || !slices.Contains(rep.Policies, "shop/"+p) {
						t.Errorf("no policy %s in %v:\n%s", p, rep.Policies, yaml)
					}
				}
				// The download is the API's YAML, named after the scope.
				dl := eval[string](t, ctx, `document.querySelector('#rec-download').getAttribute('download')`)
				if want := "shop-" + workload + "-networkpolicies.yaml"; dl != want {
					t.Errorf("download named %q, want %q", dl, want)
				}
				if body := download(t, ctx, `#rec-download`); body != rep.YAML {
					t.Errorf("the download differs from the API's YAML:\n%s", body)
				}
				// The replay: each family of the mode, every observed
				// allowed flow group kept, none newly denied.
				type fam struct{ Family, Allowed, Kept, Denied string }
				fs := eval[[]fam](t, ctx, `[...document.querySelectorAll('#rec-out .wifam')].map(f => ({Family: f.dataset.family, Allowed: f.dataset.allowed, Kept: f.dataset.kept, Denied: f.dataset.newlyDenied}))`)
				var got []string
				for _, f := range fs {
					got = append(got, f.Family)
					if f.Denied != "0" || f.Kept != f.Allowed {
						t.Errorf("IPv%s replay %+v: want every allowed group kept, none newly denied", f.Family, f)
					}
				}
				if !slices.Equal(got, tc.fams) {
					t.Errorf("replay families %v, want %v", got, tc.fams)
				}
				if len(rep.Replay) != len(tc.fams) {
					t.Errorf("the API replays %d families", len(rep.Replay))
				}
				// Least privilege adds the workload's two policies: none
				// of their names is in force.
				checkDiff(t, ctx, rep)
				for _, d := range rep.Diff {
					if d.Change != recommend.Added || len(d.Summary) == 0 {
						t.Errorf("%s/%s: %s, %q", d.Namespace, d.Name, d.Change, d.Summary)
					}
				}
				if len(rep.Diff) != 2 {
					t.Errorf("diff of %d policies, want 2", len(rep.Diff))
				}
				return hash, yaml
			}

			// From a workload: the destination of a flow to shop/db.
			do(t, ctx, chromedp.Navigate(u+"/#/flows?since=1h&dst_workload=shop/db"), openFirstRow(),
				poll(`[...document.querySelectorAll('#drawer a')].some(a => a.textContent === 'Recommend a policy for destination db')`))
			href := eval[string](t, ctx, `[...document.querySelectorAll('#drawer a')].find(a => a.textContent === 'Recommend a policy for destination db').getAttribute('href')`)
			if href != recommendDB {
				t.Errorf("the drawer links %q, want %q", href, recommendDB)
			}
			do(t, ctx, js(`[...document.querySelectorAll('#drawer a')].find(a => a.textContent === 'Recommend a policy for destination db').click()`))
			hash, yaml := check("StatefulSet", "db")
			screenshot(t, ctx, tc.mode+"-1400-recommend")
			// At 1000 px nothing but the YAML and diff boxes scrolls
			// sideways, and the page does not.
			do(t, ctx, chromedp.EmulateViewport(1000, 900))
			wide := eval[[]string](t, ctx, `[...document.querySelectorAll('#page-recommend *')].filter(e => !e.closest('.codebox') && e.scrollWidth > e.clientWidth + 1 && /auto|scroll/.test(getComputedStyle(e).overflowX)).map(e => e.className + ': ' + e.scrollWidth + ' > ' + e.clientWidth)`)
			if len(wide) > 0 {
				t.Errorf("at 1000 px these scroll sideways: %q", wide)
			}
			if w := eval[int](t, ctx, `document.documentElement.scrollWidth`); w > 1000 {
				t.Errorf("the page is %d px wide at 1000 px", w)
			}
			screenshot(t, ctx, tc.mode+"-1000-recommend")
			do(t, ctx, chromedp.EmulateViewport(1400, 900))

			// The YAML goes to the what-if's editor on the Audit page.
			do(t, ctx, js(`[...document.querySelectorAll('#rec-out .actions a')].find(a => a.textContent === 'Open in the what-if').click()`),
				poll(`location.hash === '#/audit' && !document.querySelector('#page-audit').hidden`))
			if got := eval[string](t, ctx, `document.querySelector('#whatif-form [name=policy]').value`); got != yaml {
				t.Errorf("the what-if's editor holds %q", got)
			}

			// The URL asks for the same window: the same YAML. While the
			// answer is awaited (held here) the form says so, with a
			// spinner, and cannot be sent again.
			do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(u+"/#/recommend"), chromedp.WaitVisible(css(`#rec-form`)),
				js(`window.held = []; const fetch0 = window.fetch;
					window.fetch = (url, init) => String(url).includes('/policy/recommend') ? new Promise(ok => window.held.push(() => ok(fetch0(url, init)))) : fetch0(url, init);
					location.hash = `+jsString(hash)),
				poll(`window.held.length === 1`))
			if got := eval[string](t, ctx, `(s => s.querySelector('.spinner') ? s.textContent : '')(document.querySelector('#rec-status')) + ' ' + document.querySelector('#rec-form button[type=submit]').disabled`); !strings.HasPrefix(got, "Recommending") || !strings.HasSuffix(got, " true") {
				t.Errorf("while waiting: %q", got)
			}
			do(t, ctx, js(`window.held.forEach(release => release())`))
			if again, y := check("StatefulSet", "db"); again != hash || y != yaml {
				t.Errorf("the link %q gave %q and another YAML:\n%s", hash, again, y)
			}
			if eval[bool](t, ctx, `document.querySelector('#rec-form button[type=submit]').disabled || !!document.querySelector('#rec-status .spinner')`) {
				t.Error("still waiting after the answer")
			}

			// From a finding: the unprotected workload shop/cart.
			do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(u+"/#/audit"),
				chromedp.WaitVisible(css(`#audit-list li[data-kind="unprotected-egress"] .actions a`)))
			href = eval[string](t, ctx, `[...document.querySelectorAll('#audit-list li[data-kind="unprotected-egress"] .actions a')].find(a => a.textContent === 'Recommend a policy').getAttribute('href')`)
			if href != recommendCart {
				t.Errorf("the finding links %q, want %q", href, recommendCart)
			}
			do(t, ctx, js(`[...document.querySelectorAll('#audit-list li[data-kind="unprotected-egress"] .actions a')].find(a => a.textContent === 'Recommend a policy').click()`))
			check("Deployment", "cart")
			screenshot(t, ctx, "recommend-finding-"+tc.mode)

			// From the one-family ipBlock finding: close-gaps of its
			// policy's namespace. In the dual-stack lab it changes
			// shop/db-policy: the unified diff only adds the IPv6 blocks;
			// a single-stack lab has no gap to close, and says nothing
			// changes.
			do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(u+"/#/audit"),
				chromedp.WaitVisible(css(`#audit-list li[data-kind="dual-stack-ipblock-one-family"] .actions a`)),
				js(`[...document.querySelectorAll('#audit-list li[data-kind="dual-stack-ipblock-one-family"] .actions a')].find(a => a.textContent === 'Recommend a policy').click()`),
				chromedp.WaitVisible(css(`#rec-out .recyaml`)))
			if got := eval[string](t, ctx, `(f => f.namespace.value + ' ' + f.workload.value + ' ' + f.mode.value)(document.querySelector('#rec-form'))`); got != "shop  close-gaps" {
				t.Errorf("close-gaps form %q", got)
			}
			rep, _, e := askRecommend(t, u, eval[string](t, ctx, `location.hash`))
			if rep == nil {
				t.Fatalf("close-gaps: %v", e)
			}
			adds, dels := checkDiff(t, ctx, rep)
			if changed := len(rep.Diff) == 1 && rep.Diff[0].Change == recommend.Changed && rep.Diff[0].Name == "db-policy"; changed != (tc.mode == "dual") || tc.mode == "dual" && (adds == 0 || dels != 0) {
				t.Errorf("close-gaps diff %+v: %d lines added, %d removed", rep.Diff, adds, dels)
			}
			screenshot(t, ctx, "recommend-close-gaps-"+tc.mode)

			// A scope naming nothing: the API's message, with its field,
			// under the form, and nothing drawn.
			for _, bad := range []struct{ field, hash string }{
				{"workload", "#/recommend?namespace=shop&workload=nope&run=1"},
				{"namespace", "#/recommend?namespace=nope&run=1"},
			} {
				do(t, ctx, chromedp.Navigate("about:blank"), chromedp.Navigate(u+"/"+bad.hash), poll(`document.querySelector('#rec-status').classList.contains('err')`))
				_, code, e := askRecommend(t, u, eval[string](t, ctx, `location.hash`))
				if code != http.StatusBadRequest || e["field"] != bad.field {
					t.Fatalf("%s: API %d %v", bad.hash, code, e)
				}
				if msg := eval[string](t, ctx, `document.querySelector('#rec-status').textContent`); !strings.Contains(msg, e["message"]) || !strings.HasPrefix(msg, bad.field) {
					t.Errorf("%s: status %q, want the API's %q", bad.hash, msg, e["message"])
				}
				if v := eval[string](t, ctx, fmt.Sprintf(`document.querySelector('#rec-form [name=%s]').getAttribute('aria-invalid')`, bad.field)); v != "true" {
					t.Errorf("%s: the %s input is not marked invalid", bad.hash, bad.field)
				}
				if n := eval[int](t, ctx, `document.querySelector('#rec-out').childElementCount`); n != 0 {
					t.Errorf("%s: %d elements drawn after the error", bad.hash, n)
				}
			}
			screenshot(t, ctx, "recommend-error-"+tc.mode)
			noConsoleErrors(t, errs, "400", "/api/v1/catalog")
		})
	}
}
