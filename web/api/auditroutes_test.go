package api

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/traceflow"
)

// fakeTraces answers the trace routes: POST starts trace "tf-1" (or fails
// with startErr), GET reads it (unknown ids are ErrNotFound).
type fakeTraces struct {
	startErr error
	started  []traceflow.Request
	callers  []string
}

func (f *fakeTraces) Start(ctx context.Context, req traceflow.Request) (string, error) {
	f.started = append(f.started, req)
	f.callers = append(f.callers, traceflow.CallerFrom(ctx))
	return "tf-1", f.startErr
}

func (f *fakeTraces) Get(_ context.Context, id string) (traceflow.Result, error) {
	if id != "tf-1" {
		return traceflow.Result{}, traceflow.ErrNotFound
	}
	return traceflow.Result{ID: id, Phase: traceflow.Succeeded}, nil
}

func (f *fakeTraces) Wait(ctx context.Context, id string) (traceflow.Result, error) {
	return f.Get(ctx, id)
}

func (f *fakeTraces) Trace(ctx context.Context, req traceflow.Request) (traceflow.Result, error) {
	id, err := f.Start(ctx, req)
	if err != nil {
		return traceflow.Result{}, err
	}
	return f.Wait(ctx, id)
}

// TestAuditTraceRoutes: the audit and trace routes are served with the
// API's roles (viewers read, operators start traces), answer 501 when the
// process has none, and map their errors as the rest of /api/v1 does.
func TestAuditTraceRoutes(t *testing.T) {
	tok := &Tokens{}
	tok.Add("view-secret", Principal{Name: "v", Role: RoleViewer})
	tok.Add("op-secret", Principal{Name: "o", Role: RoleOperator})
	m, err := manifest.Generate(manifest.Spec{Mode: manifest.ModeDual, Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	inv := enrich.NewSnapshot(m.Objects()...)
	tf := &fakeTraces{}
	q := &audit.Queries{Cluster: func() (*enrich.Snapshot, error) { return inv, nil }}
	h := testAPI(t, Config{Store: &fakeStore{}, Tokens: tok, Audit: q, Traces: tf})
	none := testAPI(t, Config{Store: &fakeStore{}, Tokens: tok})
	for _, tc := range []struct {
		method, url, body, token string
		code                     int
		field                    string
	}{
		{"GET", "/api/v1/audit/findings", "", "", 401, ""},
		{"GET", "/api/v1/audit/findings", "", "view-secret", 200, ""},
		{"GET", "/api/v1/audit/findings?since=1h&until=" + time.Now().Add(time.Minute).Format(time.RFC3339), "", "view-secret", 200, ""},
		{"GET", "/api/v1/audit/findings?since=yesterday", "", "view-secret", 400, "since"},
		{"GET", "/api/v1/audit/findings?since=1h&until=2h", "", "view-secret", 400, "since"},
		{"GET", "/api/v1/audit/unprotected", "", "view-secret", 200, ""},
		{"GET", "/api/v1/audit/denied", "", "view-secret", 503, ""}, // no store
		{"GET", "/api/v1/audit/denied?family=5", "", "view-secret", 400, "family"},
		{"GET", "/api/v1/audit/denied?limit=x", "", "view-secret", 400, "limit"},
		{"GET", "/api/v1/audit/unused", "", "view-secret", 503, ""},
		{"POST", "/api/v1/audit/whatif", "kind: NetworkPolicy\n", "view-secret", 503, ""},
		{"GET", "/api/v1/audit/evaluate?from=frontend/nope&to=backend/nope", "", "view-secret", 400, ""},
		{"GET", "/api/v1/audit/evaluate?from=a/b&to=x/y&proto=gre", "", "view-secret", 400, "proto"},
		{"GET", "/api/v1/audit/evaluate?from=a/b&to=x/y&port=70000", "", "view-secret", 400, "port"},
		{"POST", "/api/v1/audit/findings", "", "view-secret", 405, ""},
		{"GET", "/api/v1/audit/nope", "", "view-secret", 404, ""},
		{"POST", "/api/v1/traceflows", `{"source":"frontend/web-1","destination":{"pod":"backend/api-1","port":80}}`, "view-secret", 403, ""},
		{"POST", "/api/v1/traceflows", `{"source":"frontend/web-1","destination":{"pod":"backend/api-1","port":80}}`, "op-secret", 202, ""},
		{"POST", "/api/v1/traceflows?wait=true", `{"source":"frontend/web-1","destination":{"pod":"backend/api-1","port":80}}`, "op-secret", 200, ""},
		{"POST", "/api/v1/traceflows", `{"source":"frontend/web-1","bogus":1}`, "op-secret", 400, "bogus"},
		{"POST", "/api/v1/traceflows", `not json`, "op-secret", 400, "body"},
		{"GET", "/api/v1/traceflows/tf-1", "", "view-secret", 200, ""},
		{"GET", "/api/v1/traceflows/tf-2", "", "view-secret", 404, ""},
		{"GET", "/api/v1/traceflows/tf-1", "", "", 401, ""},
	} {
		r := do(t, h, tc.method, tc.url, tc.body, "Authorization", "Bearer "+tc.token)
		if r.code != tc.code {
			t.Errorf("%s %s as %q: %d %s, want %d", tc.method, tc.url, tc.token, r.code, r.body, tc.code)
			continue
		}
		if r.code >= 400 && r.code != 401 && r.code != 403 && r.code != 404 && r.code != 405 {
			e := decode[errorBody](t, r)
			if e.Message == "" || e.Field != tc.field {
				t.Errorf("%s %s: %+v, want a message and field %q", tc.method, tc.url, e, tc.field)
			}
		}
	}
	if len(tf.callers) == 0 || tf.callers[0] != "o" {
		t.Errorf("traces started by %q, want the principal o", tf.callers)
	}
	if r := do(t, h, "GET", "/api/v1/audit/evaluate?from=frontend/"+m.Pods[0].Name+"&to=fd00:10:ffff::1&port=443&family=6", "", "Authorization", "Bearer view-secret"); r.code != 200 ||
		!strings.Contains(r.body, `"ip_version": 6`) && !strings.Contains(r.body, `"ip_version":6`) {
		t.Errorf("evaluate: %d %s", r.code, r.body)
	}
	for _, u := range []string{"/api/v1/audit/findings", "/api/v1/traceflows/abc"} {
		if r := do(t, none, "GET", u, "", "Authorization", "Bearer view-secret"); r.code != http.StatusNotImplemented {
			t.Errorf("GET %s with nothing configured: %d %s, want 501", u, r.code, r.body)
		}
	}
	// Their 400s are counted with the API's.
	if m, want := do(t, h, "GET", "/metrics", "", "Authorization", "Bearer view-secret"), `dualflow_web_bad_requests_total{reason="invalid",route="/api/v1/audit/denied"} 2`; !strings.Contains(m.body, want) {
		t.Errorf("metrics lack %q", want)
	}
}

// TestTraceErrors: the controller's errors are answered with their
// status, and a refusal by rate with Retry-After.
func TestTraceErrors(t *testing.T) {
	for _, tc := range []struct {
		err        error
		code       int
		field      string
		retryAfter string
	}{
		{&traceflow.RateLimitError{Scope: "caller o", RetryAfter: 1500 * time.Millisecond}, 429, "", "2"},
		{traceflow.ErrBusy, 429, "", "1"},
		{traceflow.Invalid("destination.port", "service has no port 81/TCP"), 400, "destination.port", ""},
		{errors.New("pod gone: " + traceflow.ErrInvalid.Error()), 500, "", ""},
		{traceflow.ErrNotSupported, 501, "", ""},
		{context.DeadlineExceeded, 504, "", ""},
	} {
		h := testAPI(t, Config{Store: &fakeStore{}, Anonymous: RoleOperator, Traces: &fakeTraces{startErr: tc.err}})
		r := do(t, h, "POST", "/api/v1/traceflows", `{"source":"a/b","destination":{"pod":"c/d","port":80}}`)
		if r.code != tc.code || r.hdr.Get("Retry-After") != tc.retryAfter {
			t.Errorf("%v: %d Retry-After %q %s, want %d %q", tc.err, r.code, r.hdr.Get("Retry-After"), r.body, tc.code, tc.retryAfter)
			continue
		}
		if e := decode[errorBody](t, r); e.Message == "" || e.Field != tc.field {
			t.Errorf("%v: %+v, want field %q", tc.err, e, tc.field)
		}
	}
}

// TestAuditDeniedPorts: /audit/denied over the seeded flows (frontend →
// db denied over IPv6 only, on 5432/TCP) names the protocol and
// destination port of each group, as the rollup keeps them (migration
// 0013), and a family filter keeps its own.
func TestAuditDeniedPorts(t *testing.T) {
	r, err := audit.NewReports(needEngine(t), "")
	if err != nil {
		t.Fatal(err)
	}
	h := testAPI(t, Config{Audit: &audit.Queries{Reports: r}})
	window := "since=" + seedNow.Add(-2*time.Hour).Format(time.RFC3339) + "&until=" + seedNow.Add(time.Minute).Format(time.RFC3339)
	for _, tc := range []struct {
		family string
		want   int // groups
	}{{"", 1}, {"6", 1}, {"4", 0}} {
		res := do(t, h, "GET", "/api/v1/audit/denied?"+window+"&family="+tc.family, "")
		gs := decode[[]map[string]any](t, res)
		if res.code != http.StatusOK || len(gs) != tc.want {
			t.Fatalf("family %q: %d %s, want %d groups", tc.family, res.code, res.body, tc.want)
		}
		for _, g := range gs {
			if g["protocol"] != "TCP" || g["dst_port"] != 5432.0 || g["ip_version"] != 6.0 || g["dst_workload"] == "" {
				t.Errorf("family %q: group %v, want IPv6 5432/TCP", tc.family, g)
			}
		}
	}
}
