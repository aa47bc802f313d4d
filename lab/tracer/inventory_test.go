package tracer

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/traceflow"
)

func inventory(t *testing.T, mode manifest.Mode) Inventory {
	t.Helper()
	m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: 2, Prefix: "dft-"})
	if err != nil {
		t.Fatal(err)
	}
	return Inventory{M: m}
}

func podRef(t *testing.T, inv Inventory, ns, app string, node int) string {
	t.Helper()
	for _, p := range inv.M.Pods {
		if p.Namespace == ns && p.Labels["app"] == app && p.Spec.NodeName == manifest.NodeName(node) {
			return p.Namespace + "/" + p.Name
		}
	}
	t.Fatalf("no %s/%s on node %d", ns, app, node)
	return ""
}

func TestResolve(t *testing.T) {
	dual := inventory(t, manifest.ModeDual)
	v4 := inventory(t, manifest.ModeIPv4)
	web1 := podRef(t, dual, manifest.NSFrontend, "web", 1)
	api2 := podRef(t, dual, manifest.NSBackend, "api", 2)
	tests := []struct {
		name    string
		inv     Inventory
		dst     traceflow.Destination
		fam     traceflow.Family
		wantDst string
		wantErr error
		errText string
	}{
		{"pod ipv4", dual, traceflow.Destination{Pod: api2, Port: 8080}, traceflow.IPv4, "198.18.2.11", nil, ""},
		{"pod ipv6", dual, traceflow.Destination{Pod: api2, Port: 8080}, traceflow.IPv6, "fd00:10:0:2::11", nil, ""},
		{"service ipv4", dual, traceflow.Destination{Service: "backend/api", Port: 80}, traceflow.IPv4, "198.19.0.11", nil, ""},
		{"service ipv6", dual, traceflow.Destination{Service: "backend/api", Port: 80}, traceflow.IPv6, "fd00:10:ff::11", nil, ""},
		{"single-stack service ipv6", dual, traceflow.Destination{Service: "backend/api-single", Port: 8080}, traceflow.IPv6, "", traceflow.ErrNoAddress, "service backend/api-single has no IPv6 ClusterIP"},
		{"service without the port", dual, traceflow.Destination{Service: "backend/api", Port: 81}, traceflow.IPv4, "", traceflow.ErrInvalid, "no port 81/TCP"},
		{"unknown service", dual, traceflow.Destination{Service: "backend/nope", Port: 80}, traceflow.IPv4, "", traceflow.ErrInvalid, "not found"},
		{"ip of the other family", dual, traceflow.Destination{IP: mustAddr("fd00:10:0:2::11"), Port: 8080}, traceflow.IPv4, "", traceflow.ErrNoAddress, "not an IPv4 address"},
		{"ipv6 ip", dual, traceflow.Destination{IP: mustAddr("fd00:10:0:2::11"), Port: 8080}, traceflow.IPv6, "fd00:10:0:2::11", nil, ""},
		{"ipv4-only lab, ipv6 family", v4, traceflow.Destination{Pod: api2, Port: 8080}, traceflow.IPv6, "", traceflow.ErrNoAddress, "has no IPv6 address"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := traceflow.Request{Source: web1, Destination: tt.dst, Protocol: traceflow.TCP}
			p, err := tt.inv.Resolve(req, tt.fam)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) || !strings.Contains(err.Error(), tt.errText) {
					t.Fatalf("err %v, want %v containing %q", err, tt.wantErr, tt.errText)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Dst.String() != tt.wantDst || p.SourceNode != "node-1" || p.Src.Is4() != (tt.fam == traceflow.IPv4) {
				t.Errorf("probe %+v", p)
			}
		})
	}
}

func TestEndpointsAndPolicies(t *testing.T) {
	inv := inventory(t, manifest.ModeDual)
	for _, fam := range []traceflow.Family{traceflow.IPv4, traceflow.IPv6} {
		eps := inv.Endpoints(traceflow.Probe{Family: fam, Service: "backend/api"})
		if len(eps) != 2 {
			t.Errorf("%s: %d endpoints of backend/api, want 2", fam, len(eps))
		}
	}
	if eps := inv.Endpoints(traceflow.Probe{Family: traceflow.IPv6, Service: "backend/api-single"}); len(eps) != 0 {
		t.Errorf("api-single has %d IPv6 endpoints, want 0", len(eps))
	}
	api1 := podRef(t, inv, manifest.NSBackend, "api", 1)
	_, name, _ := strings.Cut(api1, "/")
	pols := inv.IsolatingPolicies(manifest.NSBackend, name, nft.Ingress)
	if !slices.Contains(pols, "backend/default-deny-ingress") {
		t.Errorf("isolating policies %v lack backend/default-deny-ingress", pols)
	}
	if pols := inv.IsolatingPolicies(manifest.NSBackend, name, nft.Egress); len(pols) != 0 {
		t.Errorf("egress isolation %v, want none", pols)
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
