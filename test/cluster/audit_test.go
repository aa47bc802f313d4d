package cluster

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/audit"
)

// checkAudit reads the audit over REST, from the collector's live view and
// its store, once kube-router enforces policy: the findings name the
// unprotected client workload and not the isolated server; in a
// dual-stack cluster they name the policy's one-family ipBlock and the
// verdict gap it makes, and in a single-stack one no dual-stack finding;
// the denied-flows report has the policy's denials in exactly the families
// kube-router rejected connections in.
func checkAudit(t *testing.T, ctx context.Context, web *webClient, policy string, dual bool, deniedFamilies map[uint8]bool, applied time.Time) {
	var fr audit.FindingsResponse
	if err := web.get(ctx, "/api/v1/audit/findings?since=30m", &fr); err != nil {
		t.Fatalf("audit findings: %v", err)
	}
	has := func(kind string, match func(audit.Ref) bool) bool {
		return slices.ContainsFunc(fr.Findings, func(f audit.Finding) bool {
			return f.Kind == kind && slices.ContainsFunc(f.Objects, match)
		})
	}
	workload := func(ns, name string) func(audit.Ref) bool {
		return func(r audit.Ref) bool { return r.Namespace == ns && r.Name == name }
	}
	var kinds []string
	for _, f := range fr.Findings {
		kinds = append(kinds, fmt.Sprintf("%s %v", f.Kind, f.Objects))
	}
	if !has(audit.KindUnprotectedIngress, workload(NSClient, "web")) {
		t.Errorf("audit: no unprotected-ingress finding for %s/web: %v", NSClient, kinds)
	}
	if has(audit.KindUnprotectedIngress, workload(NSServer, "api")) {
		t.Errorf("audit: %s/api is isolated by %s, yet found unprotected: %v", NSServer, policy, kinds)
	}
	pol := func(r audit.Ref) bool {
		return r.Kind == "NetworkPolicy" && r.Namespace == NSServer && r.Name == policy
	}
	dualStack := slices.ContainsFunc(fr.Findings, audit.Finding.DualStack)
	switch {
	case dual && !has(audit.KindIPBlockOneFamily, pol):
		t.Errorf("audit: %s allows an IPv4 block only to dual-stack pods; no %s finding: %v", policy, audit.KindIPBlockOneFamily, kinds)
	case dual && !has(audit.KindVerdictGap, workload(NSServer, "api")):
		t.Errorf("audit: web → api is allowed over IPv4 and denied over IPv6 from n1; no %s finding: %v", audit.KindVerdictGap, kinds)
	case !dual && dualStack:
		t.Errorf("audit: dual-stack findings in a single-stack cluster: %v", kinds)
	}

	got := map[uint8]bool{}
	err := poll(ctx, 2*time.Minute, func() (bool, error) {
		// The report sums per minute (rollup_policy_1m): from the minute of the policy on.
		q := url.Values{"since": {applied.Truncate(time.Minute).UTC().Format(time.RFC3339)}, "namespace": {NSServer}}
		var groups []audit.DeniedGroup
		if err := web.get(ctx, "/api/v1/audit/denied?"+q.Encode(), &groups); err != nil {
			return false, err
		}
		clear(got)
		for _, g := range groups {
			if g.Direction != "ingress" || g.PolicyNamespace != NSServer || g.PolicyName != policy ||
				g.SrcNamespace != NSClient || g.SrcWorkload != "web" || g.DstNamespace != NSServer || g.DstWorkload != "api" {
				return false, fmt.Errorf("denied group %+v: not %s/%s's ingress denials of %s/web", g, NSServer, policy, NSClient)
			}
			got[g.IPVersion] = true
		}
		return len(got) == len(deniedFamilies), nil
	})
	if err != nil {
		t.Errorf("audit denied: IPv%v denied, kube-router rejected IPv%v: %v", keys(got), keys(deniedFamilies), err)
		return
	}
	for v := range deniedFamilies {
		if !got[v] {
			t.Errorf("audit denied: no IPv%d denials, kube-router rejected IPv%d connections", v, v)
		}
	}
	t.Logf("audit over REST: %d findings (dual-stack ones: %v); denied flows of %s in IPv%v, as kube-router rejected", len(fr.Findings), dualStack, policy, keys(got))
}

func keys(m map[uint8]bool) []uint8 {
	var out []uint8
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
