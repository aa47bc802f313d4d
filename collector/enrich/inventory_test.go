package enrich

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/enrich/inventory"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// runInventory starts an Enricher on inventory files and waits for sync.
func runInventory(t *testing.T, cfg Config, files ...string) *Enricher {
	t.Helper()
	cfg.Source = SourceInventory
	cfg.Inventory = files
	e, err := New(cfg, nil, discard())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	if err := e.WaitForSync(wctx); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestInventoryLabManifest loads the lab's manifest of each mode and
// checks every pod, Service and node the lab defines, per family.
func TestInventoryLabManifest(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: 2})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "manifest.yaml")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Encode(f); err != nil {
				t.Fatal(err)
			}
			f.Close()
			e := runInventory(t, NewConfig(), path)

			for i := range m.Pods {
				p := &m.Pods[i]
				want := Workload{KindPod, p.Name}
				if len(p.OwnerReferences) > 0 {
					want = Workload{KindDeployment, p.Labels["app"]}
				}
				node, _ := m.Node(p.Spec.NodeName)
				for _, a := range manifest.PodAddrs(p) {
					r := flow.Record{SrcAddr: a, DstAddr: a, Proto: flow.ProtoTCP}
					e.Enrich(&r)
					if r.Src.PodNamespace != p.Namespace || r.Src.PodName != p.Name || r.Src.WorkloadKind != want.Kind ||
						r.Src.WorkloadName != want.Name || r.Src.NodeName != p.Spec.NodeName || r.Src.Zone != node.Labels[manifest.LabelZone] ||
						r.Src.Labels["app"] != p.Labels["app"] || r.Type != flow.FlowTypeIntraNode {
						t.Errorf("%s %s: %+v %v", p.Name, a, r.Src, r.Type)
					}
				}
			}
			for i := range m.Services {
				s := &m.Services[i]
				for _, f := range mode.Families() {
					vip, ok := manifest.ServiceAddr(s, f)
					if !ok {
						continue
					}
					got, ok := e.LookupService(vip, time.Time{})
					if !ok || got.Name != s.Name || got.Namespace != s.Namespace || len(got.ClusterIPs) != len(s.Spec.ClusterIPs) {
						t.Errorf("%s/%s %s: %+v", s.Namespace, s.Name, vip, got)
					}
				}
				if got := e.EndpointSlices(s.Namespace, s.Name); len(got) != len(s.Spec.IPFamilies) {
					t.Errorf("%s/%s: %d slices for %d families", s.Namespace, s.Name, len(got), len(s.Spec.IPFamilies))
				}
			}
			for i := range m.Nodes {
				n := &m.Nodes[i]
				for _, f := range mode.Families() {
					a, _ := manifest.NodeAddr(n, f)
					if got, ok := e.NodeForIP(a); !ok || got != n.Name {
						t.Errorf("NodeForIP(%s) = %q", a, got)
					}
				}
			}
			if pols := e.NetworkPolicies(manifest.NSBackend); len(pols) != 3 {
				t.Errorf("backend policies: %d", len(pols))
			}
			if ns, ok := e.Namespace(manifest.NSFrontend); !ok || ns.Labels["team"] != "web" {
				t.Errorf("namespace frontend: %+v", ns)
			}
			// PreferAddr on the dual-stack Service: IPv6 in dual mode.
			web, _ := e.Service(manifest.NSFrontend, manifest.ServiceWeb)
			want := corev1.IPv4Protocol
			if mode != manifest.ModeIPv4 {
				want = corev1.IPv6Protocol
			}
			if a, ok := e.PreferAddr(web.ClusterIPs); !ok || manifest.FamilyOf(a) != want {
				t.Errorf("preferred ClusterIP of web: %v", a)
			}
		})
	}
}

func TestInventoryMalformed(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n"), 0o644)
	os.WriteFile(bad, []byte("apiVersion: v1\nkind: Namespace\nmetadata: {name: b}\n---\n\napiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: a}\nstatus: {podIPs: [{ip: 'fd00:10::1::2'}]}\n"), 0o644)
	cfg := NewConfig()
	cfg.Source = SourceInventory
	cfg.Inventory = []string{good, bad}
	_, err := New(cfg, nil, discard())
	var ie *inventory.Error
	if !errors.As(err, &ie) || ie.File != bad || ie.Line != 6 || ie.Doc != 2 || ie.Kind != "Pod" || ie.Name != "p" ||
		!strings.Contains(err.Error(), bad+`:6 (document 2) Pod a/p: status.podIPs[0].ip: invalid IP "fd00:10::1::2"`) {
		t.Errorf("error %v", err)
	}
	cfg.Inventory = []string{filepath.Join(dir, "nope.yaml")}
	if _, err := New(cfg, nil, discard()); err == nil || !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("missing file: %v", err)
	}
}
