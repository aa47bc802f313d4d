package app

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"slices"
	"testing"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/web/api"
)

// TestCatalogFromTheClusterView: GET /api/v1/catalog lists the inventory's
// objects although no flow was recorded, pods with their addresses per
// family and Services with their families (a dual-stack and a
// single-stack one).
func TestCatalogFromTheClusterView(t *testing.T) {
	m, err := manifest.Generate(manifest.Spec{Mode: manifest.ModeDual, Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	writeManifest(t, path, m)
	_, base := startApp(t, path, nil)

	var cat api.CatalogResponse
	if code := call(t, "GET", base+"/api/v1/catalog", nil, &cat); code != http.StatusOK {
		t.Fatalf("GET /catalog: %d", code)
	}
	if cat.Truncated {
		t.Error("truncated")
	}
	for _, ns := range []string{manifest.NSFrontend, manifest.NSBackend, manifest.NSTools} {
		if !slices.Contains(cat.Namespaces, ns) {
			t.Errorf("namespace %s missing: %v", ns, cat.Namespaces)
		}
	}
	if len(cat.Nodes) != 2 {
		t.Errorf("nodes: %v", cat.Nodes)
	}
	// No flow was recorded: every pod comes from the view.
	web1 := pod(t, m, manifest.NSFrontend, "web", 1)
	i := slices.IndexFunc(cat.Pods, func(p api.CatalogPod) bool { return p.Namespace == web1.Namespace && p.Name == web1.Name })
	if i < 0 {
		t.Fatalf("pod %s/%s (no flows) not listed: %+v", web1.Namespace, web1.Name, cat.Pods)
	}
	if p := cat.Pods[i]; len(p.IPv4) != 1 || len(p.IPv6) != 1 || p.Node != web1.Spec.NodeName || p.Workload == "" {
		t.Errorf("pod %s/%s: %+v", web1.Namespace, web1.Name, p)
	}
	if !slices.ContainsFunc(cat.Workloads, func(w api.CatalogWorkload) bool {
		return w.Namespace == web1.Namespace && w.Name == cat.Pods[i].Workload && w.Pods >= 2
	}) {
		t.Errorf("workload of %s missing or without its pods: %+v", web1.Name, cat.Workloads)
	}
	for _, tc := range []struct {
		name     string
		families []int
	}{
		{manifest.ServiceAPI, []int{4, 6}},
		{manifest.ServiceAPISingle, []int{4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := slices.IndexFunc(cat.Services, func(s api.CatalogService) bool {
				return s.Namespace == manifest.NSBackend && s.Name == tc.name
			})
			if i < 0 {
				t.Fatalf("Service %s/%s not listed", manifest.NSBackend, tc.name)
			}
			s := cat.Services[i]
			if !slices.Equal(s.Families, tc.families) {
				t.Errorf("families %v, want %v", s.Families, tc.families)
			}
			if len(s.Ports) == 0 || s.Ports[0].Protocol == "" || s.Ports[0].Port == 0 {
				t.Errorf("ports %+v", s.Ports)
			}
		})
	}
}

// TestCatalogWithoutClusterView: without a Kubernetes view the catalog is
// unavailable (503), not an error.
func TestCatalogWithoutClusterView(t *testing.T) {
	if _, err := (&view{c: &collector.Collector{}}).Catalog(context.Background()); !errors.Is(err, api.ErrUnavailable) {
		t.Fatalf("err %v, want api.ErrUnavailable", err)
	}
}
