package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// fakeCatalog answers with a function, for the catalog handler's tests.
type fakeCatalog struct {
	fn func(context.Context) (CatalogResponse, error)
}

func (f fakeCatalog) Catalog(ctx context.Context) (CatalogResponse, error) { return f.fn(ctx) }

var _ Catalog = fakeCatalog{}

func TestCatalog(t *testing.T) {
	tok := &Tokens{}
	tok.Add("view-secret", Principal{Name: "v", Role: RoleViewer})
	cat := fakeCatalog{fn: func(context.Context) (CatalogResponse, error) {
		return CatalogResponse{
			Namespaces: []string{"shop", "infra"},
			Pods: []CatalogPod{
				{Namespace: "shop", Name: "web-1", IPv6: []netip.Addr{netip.MustParseAddr("fd00:10:244:1::5")}},
				{Namespace: "infra", Name: "dns-0", IPv4: []netip.Addr{netip.MustParseAddr("10.244.1.5")}, IPv6: []netip.Addr{netip.MustParseAddr("fd00:10:244:1::6")}},
			},
			Services: []CatalogService{
				{Namespace: "shop", Name: "web", Families: []int{4, 6}, Ports: []CatalogPort{{Name: "http", Protocol: "TCP", Port: 80}}},
				{Namespace: "infra", Name: "dns"},
			},
		}, nil
	}}
	h := testAPI(t, Config{Store: &fakeStore{}, Tokens: tok, Catalog: cat})

	for _, tc := range []struct {
		name, token string
		code        int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"viewer", "view-secret", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := do(t, h, "GET", "/api/v1/catalog", "", "Authorization", "Bearer "+tc.token)
			if r.code != tc.code {
				t.Fatalf("GET /catalog: %s, want %d", r, tc.code)
			}
		})
	}
	r := do(t, h, "GET", "/api/v1/catalog", "", "Authorization", "Bearer view-secret")
	got := decode[CatalogResponse](t, r)
	if strings.Join(got.Namespaces, ",") != "infra,shop" {
		t.Errorf("namespaces not sorted: %v", got.Namespaces)
	}
	if len(got.Pods) != 2 || got.Pods[0].Name != "dns-0" || got.Pods[1].IPv6[0] != netip.MustParseAddr("fd00:10:244:1::5") {
		t.Errorf("pods: %+v", got.Pods)
	}
	if len(got.Services) != 2 || got.Services[0].Name != "dns" || got.Services[1].Ports[0].Port != 80 {
		t.Errorf("services: %+v", got.Services)
	}
	if got.Truncated {
		t.Error("truncated with 2 entries")
	}
	for _, k := range []string{`"nodes":[]`, `"workloads":[]`, `"families":[]`, `"ports":[]`} {
		if !strings.Contains(r.body, k) {
			t.Errorf("answer lacks %s (empty lists are [], not null): %s", k, r.body)
		}
	}
	if r := do(t, h, "POST", "/api/v1/catalog", "{}", "Authorization", "Bearer view-secret"); r.code != http.StatusMethodNotAllowed {
		t.Errorf("POST /catalog: %s, want 405", r)
	}
}

func TestCatalogErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		cat  Catalog
		code int
	}{
		{"not wired", nil, http.StatusNotImplemented},
		{"not synced", fakeCatalog{fn: func(context.Context) (CatalogResponse, error) {
			return CatalogResponse{}, fmt.Errorf("catalog: %w (the Kubernetes caches are not synced)", ErrUnavailable)
		}}, http.StatusServiceUnavailable},
		{"failed", fakeCatalog{fn: func(context.Context) (CatalogResponse, error) {
			return CatalogResponse{}, errors.New("boom")
		}}, http.StatusBadGateway},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := testAPI(t, Config{Store: &fakeStore{}, Catalog: tc.cat})
			r := do(t, h, "GET", "/api/v1/catalog", "")
			if r.code != tc.code {
				t.Fatalf("GET /catalog: %s, want %d", r, tc.code)
			}
			if e := decode[errorBody](t, r); e.Message == "" {
				t.Errorf("error without a message: %s", r)
			}
		})
	}
}

func TestCatalogCapped(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    int
		cut  bool
	}{
		{"at the cap", 3, false},
		{"past the cap", 5, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r CatalogResponse
			for i := tc.n; i > 0; i-- {
				r.Pods = append(r.Pods, CatalogPod{Namespace: "ns", Name: fmt.Sprintf("p%d", i), IPv6: []netip.Addr{netip.MustParseAddr("fd00::1")}})
			}
			r.normalize(3)
			if len(r.Pods) != 3 || r.Pods[0].Name != "p1" || r.Truncated != tc.cut {
				t.Errorf("%d pods capped at 3: %d, first %s, truncated %v", tc.n, len(r.Pods), r.Pods[0].Name, r.Truncated)
			}
		})
	}
}
