package audit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/lab/manifest"
)

func get(t *testing.T, h http.Handler, method, target, body string, wantCode int, v any) {
	t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != wantCode {
		t.Fatalf("%s %s: status %d, want %d: %s", method, target, rec.Code, wantCode, rec.Body.String())
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("content type %q", ct)
	}
	if v != nil {
		if err := json.Unmarshal(rec.Body.Bytes(), v); err != nil {
			t.Fatalf("%s: %v: %s", target, err, rec.Body.String())
		}
	}
}

func TestAPIStatic(t *testing.T) {
	m, inv := labInventory(t, manifest.ModeDual, 2)
	h := (&API{Inventory: func() (*Inventory, error) { return inv, nil }}).Handler()
	var fr FindingsResponse
	get(t, h, "GET", "/api/v1/audit/findings", "", 200, &fr)
	if fr.Observed || len(findingsOf(fr.Findings, KindVerdictGap)) == 0 {
		t.Errorf("findings: %+v", fr)
	}
	// The dual-stack gaps first, counted.
	gaps := 0
	for i, f := range fr.Findings {
		if f.DualStack() {
			gaps++
			if i >= fr.DualStack {
				t.Errorf("dual-stack finding %d (%s) after another kind", i, f.Kind)
			}
		}
	}
	if gaps == 0 || gaps == len(fr.Findings) || fr.DualStack != gaps {
		t.Errorf("dual_stack %d, want %d of %d findings, some of other kinds", fr.DualStack, gaps, len(fr.Findings))
	}
	var un []UnprotectedWorkload
	get(t, h, "GET", "/api/v1/audit/unprotected", "", 200, &un)
	if len(un) != 4 {
		t.Errorf("unprotected: %+v", un)
	}
	web1, api2 := labPod(t, m, "frontend", "web", 1), labPod(t, m, "backend", "api", 2)
	var pr []ProbeResult
	get(t, h, "GET", "/api/v1/audit/evaluate?from="+url.QueryEscape("frontend/"+web1.Name)+"&to=backend/"+api2.Name+"&port=9090", "", 200, &pr)
	if len(pr) != 2 || !pr[0].Allowed || pr[1].Allowed || pr[1].Ingress.Name != manifest.PolicyDefaultDeny {
		t.Errorf("evaluate: %+v", pr)
	}
	t.Log(pr[0].Message)
	t.Log(pr[1].Message)
	var out []ProbeResult
	get(t, h, "GET", "/api/v1/audit/evaluate?from=frontend/"+web1.Name+"&to=fd00:10:ffff::1&port=443&family=6", "", 200, &out)
	if len(out) != 1 || !out[0].Allowed || out[0].Dst.Pod != "" || out[0].Ingress.Verdict != "unknown" {
		t.Errorf("evaluate to an outside address: %+v", out)
	}
	var e map[string]string
	get(t, h, "GET", "/api/v1/audit/evaluate?from=nope&to=x/y", "", 400, &e)
	get(t, h, "GET", "/api/v1/audit/evaluate?from=a/b&to=x/y&proto=gre", "", 400, &e)
	get(t, h, "GET", "/api/v1/audit/denied", "", 503, &e)
	if !strings.Contains(e["message"], "not available") {
		t.Errorf("503 body %v", e)
	}
	get(t, h, "GET", "/api/v1/audit/findings?since=-1h", "", 400, &e)
	if e["field"] != "since" || e["message"] == "" {
		t.Errorf("400 body %v, want {message, field: since}", e)
	}
	get(t, (&API{}).Handler(), "GET", "/api/v1/audit/unprotected", "", 503, &e)
}

func TestAPIStore(t *testing.T) {
	inv, now := labFlows(t)
	rep, _ := NewReports(engine, "")
	h := (&API{Reports: rep, Inventory: func() (*Inventory, error) { return inv, nil }, Now: func() time.Time { return now.Add(time.Second) }}).Handler()
	var fr FindingsResponse
	get(t, h, "GET", "/api/v1/audit/findings?since=1h", "", 200, &fr)
	if !fr.Observed || fr.ObservedError != "" || len(findingsOf(fr.Findings, KindObservedVerdictGap)) != 1 {
		t.Errorf("findings with the store: %+v", fr)
	}
	var dg []DeniedGroup
	get(t, h, "GET", "/api/v1/audit/denied?since=1h&family=6", "", 200, &dg)
	if len(dg) != 2 {
		t.Errorf("denied over IPv6: %+v", dg)
	}
	get(t, h, "GET", "/api/v1/audit/denied?since="+url.QueryEscape(now.Add(-time.Hour).Format(time.RFC3339))+"&until="+url.QueryEscape(now.Add(time.Minute).Format(time.RFC3339)), "", 200, &dg)
	if len(dg) != 4 {
		t.Errorf("denied in an absolute window: %+v", dg)
	}
	var ur UnusedReport
	get(t, h, "GET", "/api/v1/audit/unused", "", 200, &ur)
	if len(ur.Rules) != 1 {
		t.Errorf("unused: %+v", ur)
	}
	const proposed = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: frontend}
spec: {podSelector: {}, policyTypes: [Ingress]}
`
	var wr WhatIfReport
	get(t, h, "POST", "/api/v1/audit/whatif?since=1h", proposed, 200, &wr)
	if len(wr.Changes) != 1 || wr.Changes[0].Change != ChangeNewlyDenied {
		t.Errorf("what-if: %+v", wr)
	}
	var e map[string]string
	get(t, h, "POST", "/api/v1/audit/whatif", "kind: Nothing\n", 400, &e)
	get(t, h, "POST", "/api/v1/audit/whatif", strings.Replace(proposed, "spec: {", "spec: {ingress: [{from: [{}]}], ", 1), 400, &e)
	if !strings.Contains(e["message"], "empty peer") {
		t.Errorf("invalid proposed policy: %v", e)
	}
	get(t, h, "GET", "/api/v1/audit/denied?family=5", "", 400, &e)
	get(t, h, "GET", "/api/v1/audit/denied?limit=x", "", 400, &e)
}
