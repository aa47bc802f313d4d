package enrich

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/enrich/inventory"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// labManifest generates the lab's 2-node manifest of mode and writes it to
// a file, as `dualflow lab` does.
func labManifest(t *testing.T, mode manifest.Mode) (*manifest.Manifest, string) {
	t.Helper()
	m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "manifest.yaml")
	writeManifest(t, path, m)
	return m, path
}

// writeManifest (re)writes the manifest file at path.
func writeManifest(t *testing.T, path string, m *manifest.Manifest) {
	t.Helper()
	var b strings.Builder
	if err := m.Encode(&b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

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
			m, path := labManifest(t, mode)
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
					e.enrichOne(&r)
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
					if got, ok := nodeForIP(e, a); !ok || got != n.Name {
						t.Errorf("NodesForIPs(%s) = %q", a, got)
					}
				}
			}
			if pols := e.NetworkPolicies(manifest.NSBackend); len(pols) != 3 {
				t.Errorf("backend policies: %d", len(pols))
			}
			if ns, ok := e.Namespace(manifest.NSFrontend); !ok || ns.Labels["team"] != "web" {
				t.Errorf("namespace frontend: %+v", ns)
			}
			// The dual-stack Service: an IPv6 ClusterIP in dual mode.
			web, _ := e.Service(manifest.NSFrontend, manifest.ServiceWeb)
			want := corev1.IPv4Protocol
			if mode != manifest.ModeIPv4 {
				want = corev1.IPv6Protocol
			}
			if !slices.ContainsFunc(web.ClusterIPs, func(a netip.Addr) bool { return manifest.FamilyOf(a) == want }) {
				t.Errorf("ClusterIPs of web: %v, want one of %s", web.ClusterIPs, want)
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

// TestInventoryReload: with --k8s.inventory-reload, a changed manifest
// reaches the index as the events a cluster would send (a pod deleted, a
// pod created with new addresses, a namespace's labels changed), in every
// mode; a manifest that does not load is counted and changes nothing.
func TestInventoryReload(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			m, path := labManifest(t, mode)
			cfg := NewConfig()
			cfg.InventoryReload = 20 * time.Millisecond
			e := runInventory(t, cfg, path)

			gone := m.Pods[0]
			if _, ok := e.Pod(gone.Namespace, gone.Name); !ok {
				t.Fatalf("pod %s/%s not loaded", gone.Namespace, gone.Name)
			}
			// The next manifest: the first pod deleted, a new one on new
			// addresses of every family of the mode, frontend relabelled.
			next := *m
			next.Pods = slices.Clone(m.Pods[1:])
			added := *m.Pods[1].DeepCopy()
			added.Name, added.UID = "added", "added-uid"
			added.Status.PodIPs = nil
			var addedAddrs []netip.Addr
			for _, a := range manifest.PodAddrs(&m.Pods[1]) {
				b := a.As16()
				b[15] = 250
				na := netip.AddrFrom16(b)
				if a.Is4() {
					na = na.Unmap()
				}
				addedAddrs = append(addedAddrs, na)
				added.Status.PodIPs = append(added.Status.PodIPs, corev1.PodIP{IP: na.String()})
			}
			added.Status.PodIP = added.Status.PodIPs[0].IP
			next.Pods = append(next.Pods, added)
			next.Namespaces = slices.Clone(m.Namespaces)
			for i := range next.Namespaces {
				if ns := &next.Namespaces[i]; ns.Name == manifest.NSFrontend {
					*ns = *ns.DeepCopy()
					ns.Labels["team"] = "web2"
				}
			}
			writeManifest(t, path, &next)
			eventually(t, "the changed manifest in the index", func() bool {
				if _, ok := e.Pod(gone.Namespace, gone.Name); ok {
					return false
				}
				if ns, ok := e.Namespace(manifest.NSFrontend); !ok || ns.Labels["team"] != "web2" {
					return false
				}
				for _, a := range addedAddrs {
					if p, ok := e.LookupPod(a, time.Time{}); !ok || p.Name != "added" {
						return false
					}
				}
				return true
			})
			if n := testutil.ToFloat64(e.m.reloads.WithLabelValues("ok")); n < 1 {
				t.Errorf("ok reloads %v", n)
			}

			// A manifest that does not load: counted, nothing changes.
			if err := os.WriteFile(path, []byte("apiVersion: v1\nkind: Pod\nmetadata: {name: broken}\nspec: [\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the failed reload counted", func() bool {
				return testutil.ToFloat64(e.m.reloads.WithLabelValues("error")) >= 1
			})
			time.Sleep(100 * time.Millisecond) // more checks: the file is not read again until it changes
			if n := testutil.ToFloat64(e.m.reloads.WithLabelValues("error")); n != 1 {
				t.Errorf("error reloads %v, want 1 (one per change)", n)
			}
			if p, ok := e.LookupPod(addedAddrs[0], time.Time{}); !ok || p.Name != "added" {
				t.Errorf("after a failed reload: %v %v", p, ok)
			}
			if ns, ok := e.Namespace(manifest.NSFrontend); !ok || ns.Labels["team"] != "web2" {
				t.Errorf("after a failed reload: namespace %+v", ns)
			}
		})
	}
}

// eventually polls cond every 10 ms for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestInventoryReloadWaitsForStableFiles: a change is applied only once
// the files have stayed the same for one check, so a file caught empty
// in the middle of a rewrite deletes nothing.
func TestInventoryReloadWaitsForStableFiles(t *testing.T) {
	m, path := labManifest(t, manifest.ModeDual)
	src, err := loadInventory([]string{path}, discard())
	if err != nil {
		t.Fatal(err)
	}
	loaded := len(src.objects)
	if _, err := src.reload(); !errors.Is(err, errUnchanged) {
		t.Fatalf("reload of unchanged files: %v", err)
	}
	// The rewrite: caught empty by one check, complete (one more pod) at
	// the next ones.
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := src.reload(); !errors.Is(err, errUnchanged) {
		t.Fatalf("first sight of a change: %v", err)
	}
	extra := *m.Pods[0].DeepCopy()
	extra.Name, extra.Status.PodIPs, extra.Status.PodIP = "extra", nil, ""
	m.Pods = append(m.Pods, extra)
	writeManifest(t, path, m)
	if _, err := src.reload(); !errors.Is(err, errUnchanged) || len(src.objects) != loaded {
		t.Fatalf("the file changed again: %v, %d objects", err, len(src.objects))
	}
	r, err := src.reload()
	if err != nil || r.created != 1 || r.deleted != 0 || len(src.objects) != loaded+1 {
		t.Fatalf("stable change: %+v %v, %d objects (loaded %d)", r, err, len(src.objects), loaded)
	}
}

// TestInventoryReloadKeepsObjectsOfEmptyFile: a file caught empty for
// longer than a check (kubectl get -A -o yaml > file truncates the file,
// then writes it when the list is done, seconds later) deletes nothing;
// the complete file, when it comes, is applied.
func TestInventoryReloadKeepsObjectsOfEmptyFile(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			m, path := labManifest(t, mode)
			src, err := loadInventory([]string{path}, discard())
			if err != nil {
				t.Fatal(err)
			}
			loaded := len(src.objects)
			for _, empty := range []string{"", "# comments only\n---\n", "apiVersion: v1\nkind: List\nitems: []\n"} {
				if err := os.WriteFile(path, []byte(empty), 0o644); err != nil {
					t.Fatal(err)
				}
				_, _ = src.reload() // first sight of the change
				for range 3 {       // the writer stalls: the file stays the same
					if _, err := src.reload(); !errors.Is(err, ErrEmptyInventoryFile) && !errors.Is(err, errUnchanged) {
						t.Fatalf("file %q: reload: %v", empty, err)
					}
				}
				if len(src.objects) != loaded {
					t.Fatalf("file %q: %d objects after the reloads, want the %d loaded", empty, len(src.objects), loaded)
				}
				// Stamps of equal size and time would hide the next write.
				time.Sleep(10 * time.Millisecond)
			}
			extra := *m.Pods[0].DeepCopy()
			extra.Name, extra.Status.PodIPs, extra.Status.PodIP = "extra", nil, ""
			m.Pods = append(m.Pods, extra)
			writeManifest(t, path, m)
			_, _ = src.reload()
			r, err := src.reload()
			if err != nil || r.created != 1 || r.deleted != 0 || len(src.objects) != loaded+1 {
				t.Fatalf("complete file: %+v %v, %d objects (loaded %d)", r, err, len(src.objects), loaded)
			}
		})
	}
}
