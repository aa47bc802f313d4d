package app

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/web/api"
)

// TestServiceSpec: a Service's families are those it has a ClusterIP of
// (headless: its ipFamilies); its ports keep numbered, named and unset
// target ports apart.
func TestServiceSpec(t *testing.T) {
	v4, v6 := corev1.IPv4Protocol, corev1.IPv6Protocol
	ports := []enrich.ServicePort{
		{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http")},
		{Name: "metrics", Protocol: corev1.ProtocolTCP, Port: 9090, TargetPort: intstr.FromInt32(9091)},
		{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53},
	}
	for _, tc := range []struct {
		name string
		svc  enrich.Service
		want []int
	}{
		{"IPv4 single-stack", enrich.Service{ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.12")}, IPFamilies: []corev1.IPFamily{v4}}, []int{4}},
		{"IPv6 single-stack", enrich.Service{ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00:10:ff::12")}, IPFamilies: []corev1.IPFamily{v6}}, []int{6}},
		{"dual, IPv6 primary", enrich.Service{ClusterIPs: []netip.Addr{netip.MustParseAddr("fd00:10:ff::12"), netip.MustParseAddr("198.19.0.12")}, IPFamilies: []corev1.IPFamily{v6, v4}}, []int{4, 6}},
		{"dual families, one ClusterIP", enrich.Service{ClusterIPs: []netip.Addr{netip.MustParseAddr("198.19.0.12")}, IPFamilies: []corev1.IPFamily{v4, v6}}, []int{4}},
		{"headless IPv6", enrich.Service{Headless: true, IPFamilies: []corev1.IPFamily{v6}}, []int{6}},
		{"ExternalName", enrich.Service{Type: corev1.ServiceTypeExternalName}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.svc.Ports = ports
			got := serviceSpec(&tc.svc)
			if !slices.Equal(got.Families, tc.want) {
				t.Errorf("families %v, want %v", got.Families, tc.want)
			}
			want := []audit.ServicePort{{Name: "http", Proto: 6, Port: 80, TargetPortName: "http"}, {Name: "metrics", Proto: 6, Port: 9090, TargetPort: 9091}, {Name: "dns", Proto: 17, Port: 53}}
			if !slices.Equal(got.Ports, want) {
				t.Errorf("ports %+v, want %+v", got.Ports, want)
			}
		})
	}
}

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
