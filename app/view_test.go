package app

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/web/api"
)

// TestReachabilityFromTheClusterView asks the product, running on an
// inventory file of each lab mode, the reachability cases of issue 19:
// the Service's families and ports come from the live view.
func TestReachabilityFromTheClusterView(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: 2})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "cluster.yaml")
			writeManifest(t, path, m)
			_, base := startApp(t, path, nil)
			web := audit.Endpoint{Kind: "workload", Namespace: manifest.NSFrontend, Name: "web"}
			single := audit.Endpoint{Kind: "service", Namespace: manifest.NSBackend, Name: manifest.ServiceAPISingle}
			svc := audit.Endpoint{Kind: "service", Namespace: manifest.NSBackend, Name: manifest.ServiceAPI}
			first := "4"
			if mode == manifest.ModeIPv6 {
				first = "6"
			}
			ask := func(port uint16) []api.Cell {
				var res api.Reachability
				req := api.ReachabilityRequest{Sources: []audit.Endpoint{web}, Destinations: []audit.Endpoint{single, svc}, Protocol: "tcp", Port: port}
				if code := call(t, "POST", base+"/api/v1/reachability", req, &res); code != 200 {
					t.Fatalf("reachability: %d", code)
				}
				return res.Cells[0]
			}
			eventually(t, "the Services evaluated from the view", func() (bool, string) {
				c := ask(manifest.PortHTTP)
				var state []string
				ok := true
				for _, fam := range []string{"4", "6"} {
					f := c[0].Families[fam]
					state = append(state, fmt.Sprintf("IPv%s %s %d/%d %s", fam, f.Outcome, f.PairsAllowed, f.PairsTotal, f.Reason))
					if fam == first {
						ok = ok && f.Outcome == audit.OutcomeAllow && f.PairsTotal == 4
					} else {
						ok = ok && f.Outcome == audit.OutcomeNoFamily && f.Reason == "no IPv"+fam+" ClusterIP"
					}
				}
				return ok, strings.Join(state, "; ")
			})
			c := ask(manifest.PortMetrics)
			if f := c[0].Families[first]; f.Outcome != audit.OutcomeNoPort {
				t.Errorf("web → api-single:9090: %s (%s), want no_port", f.Outcome, f.Reason)
			}
			// Service api on 9090 (target 9090) reaches every backend:
			// IPv4 2 of 4 pairs (the metrics policy), IPv6 none.
			for _, fam := range []string{"4", "6"} {
				f := c[1].Families[fam]
				switch {
				case !mode.Has(map[string]corev1.IPFamily{"4": corev1.IPv4Protocol, "6": corev1.IPv6Protocol}[fam]):
					if f.Outcome != audit.OutcomeNoFamily {
						t.Errorf("web → svc api:9090 IPv%s in %s mode: %s", fam, mode, f.Outcome)
					}
				case fam == "4":
					if f.Outcome != audit.OutcomePartial || f.PairsAllowed != 2 || f.PairsTotal != 4 || f.Pairs[0].ServicePort != 9090 {
						t.Errorf("web → svc api:9090 IPv4: %s %d/%d", f.Outcome, f.PairsAllowed, f.PairsTotal)
					}
				default:
					if f.Outcome != audit.OutcomeDeny || f.PairsTotal != 4 {
						t.Errorf("web → svc api:9090 IPv6: %s %d/%d", f.Outcome, f.PairsAllowed, f.PairsTotal)
					}
				}
			}
			// Port 80 of Service api: named target port http (8080).
			c = ask(manifest.ServicePortHTTP)
			if f := c[1].Families[first]; f.Outcome != audit.OutcomeAllow || f.PairsTotal != 4 || f.Pairs[0].Port != manifest.PortHTTP {
				t.Errorf("web → svc api:80 IPv%s: %s %d/%d %+v", first, f.Outcome, f.PairsAllowed, f.PairsTotal, f.Pairs)
			}
		})
	}
}
