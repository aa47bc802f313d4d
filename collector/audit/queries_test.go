package audit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/lab/manifest"
)

func TestQueriesStatic(t *testing.T) {
	m, inv := labInventory(t, manifest.ModeDual, 2)
	q := &Queries{Cluster: func() (*enrich.Snapshot, error) { return inv, nil }}
	ctx := context.Background()
	fr, err := q.Findings(ctx, Window{Since: time.Now().Add(-time.Hour)})
	if err != nil || fr.Observed || len(findingsOf(fr.Findings, KindVerdictGap)) == 0 {
		t.Errorf("findings: %+v %v", fr, err)
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
	if un, err := q.Unprotected(ctx); err != nil || len(un) != 4 {
		t.Errorf("unprotected: %+v %v", un, err)
	}
	web1, api2 := labPod(t, m, "frontend", "web", 1), labPod(t, m, "backend", "api", 2)
	pr, err := q.Evaluate(ctx, Probe{From: "frontend/" + web1.Name, To: "backend/" + api2.Name, Port: 9090})
	if err != nil || len(pr) != 2 || !pr[0].Allowed || pr[1].Allowed || pr[1].Ingress.Name != manifest.PolicyDefaultDeny {
		t.Fatalf("evaluate: %+v %v", pr, err)
	}
	// The IPv6 denial gives the one explanation of a drop.
	if want := "over IPv6 is denied: ingress denied by backend/" + manifest.PolicyDefaultDeny; !strings.Contains(pr[1].Message, want) ||
		!strings.HasSuffix(pr[1].Message, "has no IPv6 ipBlock.") || !strings.Contains(pr[0].Message, "over IPv4 is allowed (") {
		t.Errorf("evaluate messages:\n%s\n%s", pr[0].Message, pr[1].Message)
	}
	out, err := q.Evaluate(ctx, Probe{From: "frontend/" + web1.Name, To: "fd00:10:ffff::1", Port: 443, Family: 6})
	if err != nil || len(out) != 1 || !out[0].Allowed || out[0].Dst.Pod != "" || out[0].Ingress.Verdict != "unknown" {
		t.Errorf("evaluate to an outside address: %+v %v", out, err)
	}
	if _, err := q.Evaluate(ctx, Probe{From: "nope", To: "x/y"}); !errors.Is(err, ErrBadProbe) {
		t.Errorf("evaluate from nowhere: %v, want ErrBadProbe", err)
	}
	if _, err := q.Denied(ctx, DeniedOptions{}); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "not available") {
		t.Errorf("denied without a store: %v", err)
	}
	if _, err := (&Queries{}).Unprotected(ctx); !errors.Is(err, ErrUnavailable) {
		t.Errorf("unprotected without an inventory: %v", err)
	}
}

func TestQueriesStore(t *testing.T) {
	inv, now := labFlows(t)
	rep, _ := NewReports(engine, "")
	q := &Queries{Reports: rep, Cluster: func() (*enrich.Snapshot, error) { return inv, nil }}
	ctx := context.Background()
	hour := Window{Since: now.Add(-time.Hour), Until: now.Add(time.Second)}
	fr, err := q.Findings(ctx, hour)
	if err != nil || !fr.Observed || fr.ObservedError != "" || len(findingsOf(fr.Findings, KindObservedVerdictGap)) != 1 {
		t.Errorf("findings with the store: %+v %v", fr, err)
	}
	if dg, err := q.Denied(ctx, DeniedOptions{Window: hour, Family: 6}); err != nil || len(dg) != 2 {
		t.Errorf("denied over IPv6: %+v %v", dg, err)
	}
	if dg, err := q.Denied(ctx, DeniedOptions{Window: Window{Since: now.Add(-time.Hour), Until: now.Add(time.Minute)}}); err != nil || len(dg) != 4 {
		t.Errorf("denied in an absolute window: %+v %v", dg, err)
	}
	if ur, err := q.Unused(ctx, Window{Since: now.Add(-24 * time.Hour), Until: now.Add(time.Second)}); err != nil || len(ur.Rules) != 1 {
		t.Errorf("unused: %+v %v", ur, err)
	}
	const proposed = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny, namespace: frontend}
spec: {podSelector: {}, policyTypes: [Ingress]}
`
	wr, err := q.WhatIf(ctx, strings.NewReader(proposed), hour, 0)
	if err != nil || len(wr.Changes) != 1 || wr.Changes[0].Change != ChangeNewlyDenied {
		t.Errorf("what-if: %+v %v", wr, err)
	}
	if _, err := q.WhatIf(ctx, strings.NewReader("kind: Nothing\n"), hour, 0); !errors.Is(err, ErrInvalidPolicy) {
		t.Errorf("what-if of no policy: %v, want ErrInvalidPolicy", err)
	}
	_, err = q.WhatIf(ctx, strings.NewReader(strings.Replace(proposed, "spec: {", "spec: {ingress: [{from: [{}]}], ", 1)), hour, 0)
	if !errors.Is(err, ErrInvalidPolicy) || !strings.Contains(err.Error(), "empty peer") {
		t.Errorf("invalid proposed policy: %v", err)
	}
}
