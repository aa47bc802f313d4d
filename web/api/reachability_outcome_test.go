package api

import (
	"strings"
	"testing"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/traceflow"
)

// TestCellMismatchAndAsymmetry: a cell says when the evaluated policy and
// the flows or the trace disagree, and when its families disagree,
// partial ones included.
func TestCellMismatchAndAsymmetry(t *testing.T) {
	fam := func(outcome string, allowed, total int, obs map[string]uint64, trace string) *CellFamily {
		f := &CellFamily{Outcome: outcome, PairsAllowed: allowed, PairsTotal: total, Observed: Observed{Verdicts: obs}}
		for _, n := range obs {
			f.Observed.Flows += n
		}
		if trace != "" {
			f.Trace = &traceflow.FamilyResult{Outcome: traceflow.Outcome(trace)}
		}
		return f
	}
	for _, tc := range []struct {
		name string
		f    *CellFamily
		want string
	}{
		{"allow, flows dropped", fam(audit.OutcomeAllow, 4, 4, map[string]uint64{"allowed": 138, "dropped": 133}, ""), "policy allows every pair, but 133 of 271 observed flows were dropped"},
		{"allow, trace dropped", fam(audit.OutcomeAllow, 1, 1, nil, "dropped"), "policy allows every pair, but the trace was dropped"},
		{"allow, trace rejected", fam(audit.OutcomeAllow, 1, 1, nil, "rejected"), "policy allows every pair, but the trace was rejected"},
		{"allow, trace without an address", fam(audit.OutcomeAllow, 1, 1, nil, "no-address"), ""},
		{"deny, flows passed", fam(audit.OutcomeDeny, 0, 2, map[string]uint64{"not_isolated": 3, "dropped": 1}, ""), "policy denies every pair, but 3 of 4 observed flows passed"},
		{"deny, trace delivered", fam(audit.OutcomeDeny, 0, 2, nil, "delivered"), "policy denies every pair, but the trace was delivered"},
		{"deny, flows dropped", fam(audit.OutcomeDeny, 0, 2, map[string]uint64{"dropped": 5}, "dropped"), ""},
		{"partial, both kinds", fam(audit.OutcomePartial, 2, 4, map[string]uint64{"allowed": 3, "dropped": 5}, ""), ""},
		{"no pair evaluated", fam(audit.OutcomeNoFamily, 0, 0, map[string]uint64{"dropped": 5}, ""), ""},
		{"legacy allow without pairs", fam(audit.OutcomeAllow, 0, 0, map[string]uint64{"dropped": 5}, ""), ""},
	} {
		if got := mismatch(tc.f); got != tc.want {
			t.Errorf("%s: mismatch %q, want %q", tc.name, got, tc.want)
		}
	}
	for trace, want := range map[string]string{"delivered": "allow", "dropped": "deny", "rejected": "deny", "no-address": "unknown"} {
		if got := outcome(fam("", 0, 0, nil, trace)); got != want {
			t.Errorf("trace %s: outcome %q, want %q", trace, got, want)
		}
	}
	for _, tc := range []struct {
		name   string
		v4, v6 *CellFamily
		want   string
	}{
		{"same share", fam(audit.OutcomePartial, 2, 4, nil, ""), fam(audit.OutcomePartial, 1, 2, nil, ""), ""},
		{"different share", fam(audit.OutcomePartial, 2, 4, nil, ""), fam(audit.OutcomePartial, 1, 4, nil, ""), "IPv4 2 of 4 pairs allowed, IPv6 1 of 4"},
		{"no IPv6 ClusterIP", fam(audit.OutcomeAllow, 4, 4, nil, ""), fam(audit.OutcomeNoFamily, 0, 0, nil, ""), "IPv4 allow, IPv6 no_family"},
		{"both errors", fam(audit.OutcomeError, 0, 0, nil, ""), fam(audit.OutcomeError, 0, 0, nil, ""), ""},
		{"traffic over one family, other has no pair", fam(audit.OutcomeAllow, 4, 4, map[string]uint64{"allowed": 3}, ""), fam(audit.OutcomeNoFamily, 0, 0, nil, ""), "IPv4 allow, IPv6 no_family"},
	} {
		if got := strings.Join(asymmetry(tc.v4, tc.v6), "; "); got != tc.want {
			t.Errorf("%s: asymmetry %q, want %q", tc.name, got, tc.want)
		}
	}
}
