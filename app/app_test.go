package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/web"
	"github.com/dualflow/dualflow/web/api"
)

// dataDir is the embedded engine's directory, shared by the tests of this
// package one after the other (chDB serves one directory per process at
// a time).
var dataDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "dualflow-app-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dataDir = filepath.Join(dir, "data")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func needCHDB(t *testing.T) {
	t.Helper()
	if _, err := chdb.FindLibrary(""); err != nil {
		if os.Getenv("DUALFLOW_REQUIRE_CHDB") == "1" {
			t.Fatalf("DUALFLOW_REQUIRE_CHDB=1 but: %v", err)
		}
		t.Skip("libchdb not available (make deps)")
	}
}

// fakeTracer records the probes it is asked to trace and delivers them.
type fakeTracer struct {
	mu     sync.Mutex
	probes []traceflow.Probe
}

func (f *fakeTracer) Trace(_ context.Context, p traceflow.Probe) (traceflow.Path, error) {
	f.mu.Lock()
	f.probes = append(f.probes, p)
	f.mu.Unlock()
	return traceflow.Path{Outcome: traceflow.Delivered, Observations: []traceflow.Observation{
		{Node: p.SourceNode, Component: traceflow.Delivery, Action: traceflow.ActionDelivered, Pod: p.DstPod},
	}}, nil
}

// writeManifest writes m to path.
func writeManifest(t *testing.T, path string, m *manifest.Manifest) {
	t.Helper()
	var b bytes.Buffer
	if err := m.Encode(&b); err != nil {
		t.Fatal(err)
	}
	// Write and rename: the collector reloads the file while it changes.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// startApp runs the product on the manifest file with the web on a free
// loopback port, and returns the web's base URL.
func startApp(t *testing.T, manifestPath string, tracer NodeTracer) (*App, string) {
	t.Helper()
	needCHDB(t)
	var cfg Config
	cfg.Collector.Store.DataDir = dataDir
	cfg.Collector.IPFIX.TCPAddrs, cfg.Collector.IPFIX.UDPAddrs = nil, nil
	cfg.Collector.K8s = enrich.NewConfig()
	cfg.Collector.K8s.Source = enrich.SourceInventory
	cfg.Collector.K8s.Inventory = []string{manifestPath}
	cfg.Collector.K8s.InventoryReload = 50 * time.Millisecond
	cfg.Collector.Audit.Refresh = 100 * time.Millisecond
	cfg.Web.Addr = "127.0.0.1:0"
	a, err := New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), Options{NodeTracer: tracer})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("app run: %v", err)
		}
	})
	select {
	case <-a.Ready():
	case err := <-done:
		t.Fatalf("app stopped: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("app not ready within a minute")
	}
	return a, strings.TrimSuffix(a.WebURL(), "/")
}

func call(t *testing.T, method, url string, body, out any) int {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	// The local operator token, as the CLI reads it: without it a local
	// request is a viewer.
	if tok, err := os.ReadFile(filepath.Join(dataDir, web.LocalTokenFileName)); err == nil {
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, url, err, b)
		}
	}
	if resp.StatusCode != http.StatusOK && out != nil {
		t.Logf("%s %s: %d %s", method, url, resp.StatusCode, b)
	}
	return resp.StatusCode
}

// eventually polls cond every 50 ms for up to 30 s.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30 s (%s)", what, state)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func pod(t *testing.T, m *manifest.Manifest, ns, app string, node int) *corev1.Pod {
	t.Helper()
	for i := range m.Pods {
		p := &m.Pods[i]
		if p.Namespace == ns && p.Labels["app"] == app && p.Spec.NodeName == manifest.NodeName(node) {
			return p
		}
	}
	t.Fatalf("no %s/%s pod on node %d", ns, app, node)
	return nil
}

func hasKind(fs []audit.Finding, kind string) bool {
	return slices.ContainsFunc(fs, func(f audit.Finding) bool { return f.Kind == kind })
}

// TestAppAnswersFromTheClusterView runs the product on an inventory file in
// each mode and checks that every answer about the cluster (audit
// findings, reachability per family, traceflow resolution) comes from the
// collector's live view, and follows a change of the cluster.
func TestAppAnswersFromTheClusterView(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: 2})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "cluster.yaml")
			writeManifest(t, path, m)
			tr := &fakeTracer{}
			_, base := startApp(t, path, tr)
			web1, api2 := pod(t, m, manifest.NSFrontend, "web", 1), pod(t, m, manifest.NSBackend, "api", 2)

			// Findings: the dual-stack gap of the metrics policy in dual
			// mode only; workloads without policies in every mode.
			var fr audit.FindingsResponse
			if code := call(t, "GET", base+"/api/v1/audit/findings", nil, &fr); code != 200 {
				t.Fatalf("findings: %d", code)
			}
			if got := hasKind(fr.Findings, audit.KindVerdictGap); got != (mode == manifest.ModeDual) {
				t.Errorf("verdict gap finding %v in %s mode: %v", got, mode, fr.Findings)
			}
			if !hasKind(fr.Findings, audit.KindUnprotectedIngress) || !fr.Observed {
				t.Errorf("findings %+v: want unprotected workloads and observed analysis", fr)
			}
			var un []audit.UnprotectedWorkload
			if code := call(t, "GET", base+"/api/v1/audit/unprotected", nil, &un); code != 200 || len(un) == 0 {
				t.Errorf("unprotected: %d %v", code, un)
			}

			// Reachability web@1 -> api@2 on the metrics port, per family.
			reach := func() api.Cell {
				var res api.Reachability
				req := api.ReachabilityRequest{
					Sources:      []audit.Endpoint{{Kind: "pod", Namespace: web1.Namespace, Name: web1.Name}},
					Destinations: []audit.Endpoint{{Kind: "pod", Namespace: api2.Namespace, Name: api2.Name}},
					Protocol:     "tcp", Port: manifest.PortMetrics,
				}
				if code := call(t, "POST", base+"/api/v1/reachability", req, &res); code != 200 {
					t.Fatalf("reachability: %d", code)
				}
				return res.Cells[0][0]
			}
			want := map[string]string{"4": "unavailable", "6": "unavailable"}
			for _, f := range mode.Families() {
				if f == corev1.IPv4Protocol {
					want["4"] = "allow"
				} else {
					want["6"] = "deny"
				}
			}
			eventually(t, "reachability per family", func() (bool, string) {
				c := reach()
				return c.Families["4"].Outcome == want["4"] && c.Families["6"].Outcome == want["6"],
					fmt.Sprintf("IPv4 %s IPv6 %s, want %v", c.Families["4"].Outcome, c.Families["6"].Outcome, want)
			})

			// Traceflow through the Service: each family resolved from the
			// view (the pod's address, the Service's ClusterIP of the family).
			var res traceflow.Result
			req := traceflow.Request{Source: web1.Namespace + "/" + web1.Name, Family: traceflow.Dual,
				Destination: traceflow.Destination{Service: "backend/api", Port: manifest.ServicePortHTTP}}
			if code := call(t, "POST", base+"/api/v1/traceflows?wait=true", req, &res); code != 200 {
				t.Fatalf("traceflow: %d", code)
			}
			svc, _ := m.Service(manifest.NSBackend, manifest.ServiceAPI)
			for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
				fam := traceflow.IPv4
				if f == corev1.IPv6Protocol {
					fam = traceflow.IPv6
				}
				got, ok := res.Family(fam)
				if !ok {
					t.Fatalf("no %s result: %+v", fam, res)
				}
				src, hasSrc := manifest.PodAddr(web1, f)
				vip, hasVIP := manifest.ServiceAddr(svc, f)
				if !hasSrc || !hasVIP {
					if got.Outcome != traceflow.NoAddress {
						t.Errorf("%s: outcome %s, want no-address", fam, got.Outcome)
					}
					continue
				}
				if got.Outcome != traceflow.Delivered || got.Src != src || got.Dst != vip {
					t.Errorf("%s: %s %v -> %v, want delivered %v -> %v", fam, got.Outcome, got.Src, got.Dst, src, vip)
				}
			}
			// A TCP port the Service does not have is refused, naming the field.
			bad := req
			bad.Destination.Port = manifest.ServicePortHTTP + 1
			if code := call(t, "POST", base+"/api/v1/traceflows?wait=true", bad, nil); code != http.StatusBadRequest {
				t.Errorf("traceflow to a port the Service lacks: %d, want 400", code)
			}
			// In dual mode the single-stack Service has no IPv6 ClusterIP.
			if mode == manifest.ModeDual {
				req.Destination = traceflow.Destination{Service: "backend/" + manifest.ServiceAPISingle, Port: manifest.PortHTTP}
				req.Family = traceflow.IPv6
				res = traceflow.Result{}
				if code := call(t, "POST", base+"/api/v1/traceflows?wait=true", req, &res); code != 200 {
					t.Fatalf("traceflow: %d", code)
				}
				if got, ok := res.Family(traceflow.IPv6); !ok || got.Outcome != traceflow.NoAddress || !strings.Contains(got.Reason, "no IPv6 ClusterIP") {
					t.Errorf("IPv6 trace to the single-stack Service: %+v", res)
				}
			}

			// Workload ends: the families leave from one pod of the
			// workload, its first by name, and go to one pod of the other.
			var first string
			for _, p := range m.Pods {
				if p.Namespace == manifest.NSFrontend && p.Labels["app"] == "web" && (first == "" || p.Name < first) {
					first = p.Name
				}
			}
			wreq := traceflow.Request{SourceWorkload: manifest.NSFrontend + "/web", Family: traceflow.Dual,
				Destination: traceflow.Destination{Workload: manifest.NSBackend + "/api", Port: manifest.PortHTTP}}
			res = traceflow.Result{}
			if code := call(t, "POST", base+"/api/v1/traceflows?wait=true", wreq, &res); code != 200 {
				t.Fatalf("workload traceflow: %d", code)
			}
			if res.Request.Source != manifest.NSFrontend+"/"+first || !strings.HasPrefix(res.Request.Destination.Pod, manifest.NSBackend+"/api-") || res.Phase != traceflow.Succeeded {
				t.Errorf("workload trace, want from %s to a pod of api: %+v", first, res)
			}
			wreq.SourceWorkload = manifest.NSFrontend + "/nope"
			if code := call(t, "POST", base+"/api/v1/traceflows?wait=true", wreq, nil); code != http.StatusBadRequest {
				t.Errorf("trace from an unknown workload: %d, want 400", code)
			}

			// The cluster changes: the metrics policy gets an IPv6 block.
			// The gap closes in the findings and the matrix.
			for i := range m.NetworkPolicies {
				if np := &m.NetworkPolicies[i]; np.Name == manifest.PolicyMetricsIPv4 {
					np.Spec.Ingress[0].From = append(np.Spec.Ingress[0].From, networkingv1.NetworkPolicyPeer{
						IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10::/56", Except: []string{manifest.PodCIDRFor(2, corev1.IPv6Protocol).String()}}})
				}
			}
			writeManifest(t, path, m)
			if want["6"] == "deny" {
				want["6"] = "allow"
			}
			eventually(t, "reachability after the policy change", func() (bool, string) {
				c := reach()
				return c.Families["4"].Outcome == want["4"] && c.Families["6"].Outcome == want["6"],
					fmt.Sprintf("IPv4 %s IPv6 %s, want %v", c.Families["4"].Outcome, c.Families["6"].Outcome, want)
			})
			eventually(t, "findings after the policy change", func() (bool, string) {
				var fr audit.FindingsResponse
				call(t, "GET", base+"/api/v1/audit/findings", nil, &fr)
				return !hasKind(fr.Findings, audit.KindVerdictGap), fmt.Sprint(len(fr.Findings), " findings")
			})
		})
	}
}

// TestAppWithoutTracer: a collector with no node tracer answers the
// traceflow routes 501, not a fake result.
func TestAppWithoutTracer(t *testing.T) {
	m, err := manifest.Generate(manifest.Spec{Mode: manifest.ModeDual, Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "cluster.yaml")
	writeManifest(t, path, m)
	_, base := startApp(t, path, nil)
	if code := call(t, "POST", base+"/api/v1/traceflows", traceflow.Request{Source: "a/b"}, nil); code != http.StatusNotImplemented {
		t.Errorf("POST /traceflows: %d, want 501", code)
	}
}
