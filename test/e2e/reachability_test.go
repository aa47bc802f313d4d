package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/web/api"
)

// TestReachabilityMatrix asks the product's REST API the cases of issue 19
// on a lab of each mode and checks every answer against the datapath:
//   - workload frontend/web → Service backend/api-single (single-stack)
//     on 8080 is evaluated in the Service's family only, the other family
//     says "no IPv6 ClusterIP" (or IPv4); on 9090 "no such port";
//   - frontend/web → backend/api on 9090 covers the 4 pod pairs: IPv4
//     partial 2/4 (the metrics policy excepts node 2's pod CIDR), IPv6
//     denied;
//   - backend/api → backend/api covers 2 pairs, never a pod to itself;
//   - an endpoint that does not exist is an error naming it;
//   - every pair listed is dialled from its source pod to the address and
//     port evaluated: it answers exactly when the cell says allowed.
func TestReachabilityMatrix(t *testing.T) {
	requirePrereqs(t)
	t.Parallel() // each mode its own lab and product (its own database)
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			recordAs(t, string(mode)+"/reachability")
			l := startLab(t, mode)
			_, base := startProduct(t, l)
			checkReachability(t, l, mode, base)
		})
	}
}

func checkReachability(t *testing.T, l *lab.Lab, mode manifest.Mode, base string) {
	web := audit.Endpoint{Kind: "workload", Namespace: manifest.NSFrontend, Name: "web"}
	apiW := audit.Endpoint{Kind: "workload", Namespace: manifest.NSBackend, Name: "api"}
	single := audit.Endpoint{Kind: "service", Namespace: manifest.NSBackend, Name: manifest.ServiceAPISingle}
	missing := audit.Endpoint{Kind: "workload", Namespace: "shop", Name: "frontend"}
	ask := func(srcs, dsts []audit.Endpoint, port uint16) *api.Reachability {
		t.Helper()
		var res api.Reachability
		req := api.ReachabilityRequest{Sources: srcs, Destinations: dsts, Protocol: "tcp", Port: port, Since: "10m"}
		// The product lists the cluster after it starts: wait until the
		// cells are evaluated (not errors about the missing view).
		deadline := time.Now().Add(30 * time.Second)
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			code, err := restCall(ctx, http.MethodPost, base+"/api/v1/reachability", req, &res)
			cancel()
			if err != nil {
				t.Fatalf("reachability: %d %v", code, err)
			}
			f := res.Cells[0][0].Families["4"]
			if f.Outcome != audit.OutcomeError || !strings.Contains(f.PolicyError, "Kubernetes view") {
				return &res
			}
			if time.Now().After(deadline) {
				t.Fatalf("no Kubernetes view within 30 s: %s", f.PolicyError)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	famOf := map[string]corev1.IPFamily{"4": corev1.IPv4Protocol, "6": corev1.IPv6Protocol}
	first := "4"
	if mode == manifest.ModeIPv6 {
		first = "6"
	}

	m8080 := ask([]audit.Endpoint{web, apiW}, []audit.Endpoint{single, apiW, missing}, manifest.PortHTTP)
	m9090 := ask([]audit.Endpoint{web}, []audit.Endpoint{single, apiW}, manifest.PortMetrics)
	for _, fam := range []string{"4", "6"} {
		has := mode.Has(famOf[fam])
		// web → api-single: its one family evaluated, the other not.
		c := m8080.Cells[0][0].Families[fam]
		if fam == first {
			if c.Outcome != audit.OutcomeAllow || c.PairsTotal != 4 || c.PairsAllowed != 4 {
				t.Errorf("web → svc api-single:8080 IPv%s: %s %d/%d (%s), want allow 4/4", fam, c.Outcome, c.PairsAllowed, c.PairsTotal, c.Reason)
			}
			if c9 := m9090.Cells[0][0].Families[fam]; c9.Outcome != audit.OutcomeNoPort || !strings.Contains(c9.Reason, "no port 9090/TCP") {
				t.Errorf("web → svc api-single:9090 IPv%s: %s (%s), want no such port", fam, c9.Outcome, c9.Reason)
			}
		} else if c.Outcome != audit.OutcomeNoFamily || c.Reason != "no IPv"+fam+" ClusterIP" || c.Policy != nil {
			t.Errorf("web → svc api-single:8080 IPv%s: %s (%s) %+v, want no IPv%s ClusterIP", fam, c.Outcome, c.Reason, c.Policy, fam)
		}
		// web → api on 9090: every pod pair.
		c = m9090.Cells[0][1].Families[fam]
		switch {
		case !has:
			if c.Outcome != audit.OutcomeUnavailable {
				t.Errorf("web → api:9090 IPv%s in %s mode: %s, want unavailable", fam, mode, c.Outcome)
			}
		case fam == "4":
			if c.Outcome != audit.OutcomePartial || c.PairsAllowed != 2 || c.PairsTotal != 4 || len(c.Pairs) != 4 || c.Policy == nil || c.Policy.Verdict != "partial" {
				t.Errorf("web → api:9090 IPv4: %s %d/%d %+v, want partial 2/4", c.Outcome, c.PairsAllowed, c.PairsTotal, c.Policy)
			}
		default:
			if c.Outcome != audit.OutcomeDeny || c.PairsTotal != 4 {
				t.Errorf("web → api:9090 IPv6: %s %d/%d, want deny 0/4", c.Outcome, c.PairsAllowed, c.PairsTotal)
			}
		}
		// api → api: two pairs, no pod to itself.
		c = m8080.Cells[1][1].Families[fam]
		if has {
			if c.PairsTotal != 2 || c.Outcome != audit.OutcomeDeny {
				t.Errorf("api → api:8080 IPv%s: %s %d/%d, want deny 0/2", fam, c.Outcome, c.PairsAllowed, c.PairsTotal)
			}
			for _, p := range c.Pairs {
				if p.Src == p.Dst {
					t.Errorf("api → api evaluates %s to itself", p.Src)
				}
			}
		}
		// An endpoint that does not exist.
		for _, row := range m8080.Cells {
			if c := row[2].Families[fam]; c.Outcome != audit.OutcomeError || !strings.Contains(c.PolicyError, "workload shop/frontend not found") {
				t.Errorf("→ shop/frontend IPv%s: %s %q, want an error naming it", fam, c.Outcome, c.PolicyError)
			}
		}
	}

	// Every pair listed, dialled on the lab's datapath: only flows from
	// now on are these dials.
	dialStart := time.Now().Add(-time.Second).UTC().Format(time.RFC3339)
	dialled := 0
	for _, cell := range []api.Cell{m8080.Cells[0][0], m8080.Cells[1][1], m9090.Cells[0][1]} {
		for fam, f := range cell.Families {
			for _, p := range f.Pairs {
				src, err := labPod(l, p.Src)
				if err != nil {
					t.Fatal(err)
				}
				to := netip.AddrPortFrom(netip.MustParseAddr(p.DstIP), p.Port)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err = labDial(ctx, l, src, agent.TCP, to)
				cancel()
				allowed := p.Verdict != "denied" && p.Verdict != "rejected"
				switch {
				case err != nil && !errors.Is(err, agent.ErrNoAnswer):
					t.Errorf("dial %s → %s: %v", p.Src, to, err)
				case allowed != (err == nil):
					t.Errorf("IPv%s %s → %s (%s): the matrix says %s, the datapath %s", fam, p.Src, p.Dst, to, p.Verdict, answered(err))
				}
				dialled++
			}
		}
	}
	want := map[manifest.Mode]int{manifest.ModeIPv4: 10, manifest.ModeIPv6: 10, manifest.ModeDual: 16}[mode]
	if dialled != want {
		t.Errorf("dialled %d pairs, want %d", dialled, want)
	}

	// The dials, exported and recorded, show beside the evaluation: web →
	// api on 9090 has dropped and passed flows over IPv4 (partial) and
	// dropped ones only over IPv6, and no cell marks a mismatch.
	await(t, 2*time.Minute, "the dials observed beside the evaluation", func() (bool, string) {
		var res api.Reachability
		req := api.ReachabilityRequest{Sources: []audit.Endpoint{web}, Destinations: []audit.Endpoint{apiW}, Protocol: "tcp", Port: manifest.PortMetrics, Since: dialStart}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := restCall(ctx, http.MethodPost, base+"/api/v1/reachability", req, &res); err != nil {
			return false, err.Error()
		}
		var state []string
		ok := true
		for _, fam := range []string{"4", "6"} {
			if !mode.Has(famOf[fam]) {
				continue
			}
			f := res.Cells[0][0].Families[fam]
			v := f.Observed.Verdicts
			passed := v["allowed"] + v["not_isolated"]
			state = append(state, fmt.Sprintf("IPv%s %s %d/%d observed %v mismatch %q", fam, f.Outcome, f.PairsAllowed, f.PairsTotal, v, f.Mismatch))
			switch {
			case f.Mismatch != "":
				ok = false
			case fam == "4":
				ok = ok && v["dropped"] > 0 && passed > 0
			default:
				ok = ok && v["dropped"] > 0 && passed == 0
			}
		}
		return ok, strings.Join(state, "; ")
	})
}

func answered(err error) string {
	if err == nil {
		return "answers"
	}
	return "drops (" + strconv.Quote(err.Error()) + ")"
}
