package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/test/kubeapi"
)

// The real-API-server tier: a kube-apiserver built from k8s.io/kubernetes
// (scripts/kube-apiserver.sh, cached) on Debian's etcd, on loopback.

// rbacPath is the collector's RBAC, as an operator applies it.
const rbacPath = "../../collector/enrich/rbac.yaml"

// collectorNS and collectorSA are rbac.yaml's ServiceAccount.
const collectorNS, collectorSA = "dualflow", "dualflow-collector"

// requireKubeAPI skips (or with DUALFLOW_E2E=1 fails) when the
// kube-apiserver is not built or etcd is missing.
func requireKubeAPI(t *testing.T) {
	t.Helper()
	var missing []string
	if _, err := kubeapi.Binary(); err != nil {
		missing = append(missing, err.Error())
	}
	if _, err := os.Stat("/usr/bin/etcd"); err != nil {
		missing = append(missing, "etcd (apt-get install etcd-server)")
	}
	if len(missing) == 0 {
		return
	}
	msg := "real API server prerequisites missing: " + strings.Join(missing, "; ")
	if os.Getenv("DUALFLOW_E2E") == "1" {
		t.Fatal(msg + " (DUALFLOW_E2E=1 requires them)")
	}
	t.Skip(msg)
}

// startKubeAPI starts an API server for the test and stops it at the end.
func startKubeAPI(t *testing.T) *kubeapi.Server {
	t.Helper()
	requireKubeAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	start := time.Now()
	s, err := kubeapi.Start(ctx, kubeapi.Options{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	t.Logf("kube-apiserver ready in %v (etcd and API server started in %v)", s.Started.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	return s
}

// collectorKubeconfig applies rbac.yaml and returns a kubeconfig with a
// token of its ServiceAccount (TokenRequest API).
func collectorKubeconfig(t *testing.T, s *kubeapi.Server) string {
	t.Helper()
	rbac, err := os.ReadFile(rbacPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kc, err := s.ServiceAccountKubeconfig(ctx, rbac, collectorNS, collectorSA)
	if err != nil {
		t.Fatal(err)
	}
	return kc
}

// publish writes the lab manifest m into the API server in order.
func publish(t *testing.T, s *kubeapi.Server, m *manifest.Manifest, order lab.PublishOrder, seed uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now()
	if err := lab.Publish(ctx, s.Admin, m, lab.PublishOptions{Order: order, Seed: seed}); err != nil {
		t.Fatal(err)
	}
	t.Logf("published the lab's objects (%s order, seed %d) in %v", order, seed, time.Since(start).Round(time.Millisecond))
}

// startKubeEnricher runs the enrichment against the API server with the
// collector's ServiceAccount, in-process.
func startKubeEnricher(t *testing.T, kubeconfig string) *enrich.Enricher {
	t.Helper()
	cfg := enrich.NewConfig()
	cfg.Source = enrich.SourceKubeconfig
	cfg.Kubeconfig = kubeconfig
	cfg.SyncTimeout = 2 * time.Minute
	return runEnricher(t, cfg)
}

// TestKubePublishOrders publishes each mode's lab objects into a real API
// server in forward, reverse (EndpointSlices before their Services, pods
// before their nodes) and random orders, watches them with the
// collector's enrichment under exactly rbac.yaml, and compares the whole
// view and the enrichment of every pod-to-pod and pod-to-Service flow
// with inventory mode on the same manifest: they must be the same.
func TestKubePublishOrders(t *testing.T) {
	requireKubeAPI(t)
	t.Parallel() // each order its own API server
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			m, err := manifest.Generate(manifest.Spec{Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(t.TempDir(), "manifest.yaml")
			writeLabManifest(t, path, m)
			want := enrichedView(startEnricher(t, path), m)
			for i, order := range lab.PublishOrders {
				t.Run(string(order), func(t *testing.T) {
					record(t, mode)
					s := startKubeAPI(t)
					publish(t, s, m, order, uint64(time.Now().UnixNano())+uint64(i))
					checkStoredPodLabels(t, s, m)
					e := startKubeEnricher(t, collectorKubeconfig(t, s))
					var got string
					// The initial lists are in; events of the last writes may
					// still be on their way.
					deadline := time.Now().Add(30 * time.Second)
					for got = enrichedView(e, m); got != want && time.Now().Before(deadline); got = enrichedView(e, m) {
						time.Sleep(200 * time.Millisecond)
					}
					if got != want {
						t.Errorf("kubeconfig view differs from inventory view:\n%s", lineDiff(want, got))
					}
				})
			}
		})
	}
}

// checkStoredPodLabels checks that the API server holds every pod with
// exactly the manifest's labels: its admission (PodTopologyLabels, 1.35+)
// adds the node's zone and region, so a lab manifest without them differs
// from what a real cluster holds (issue 24).
func checkStoredPodLabels(t *testing.T, s *kubeapi.Server, m *manifest.Manifest) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pods, err := s.Admin.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(pods.Items) != len(m.Pods) {
		t.Errorf("the API server holds %d pods, the manifest %d", len(pods.Items), len(m.Pods))
	}
	for _, got := range pods.Items {
		i := slices.IndexFunc(m.Pods, func(p corev1.Pod) bool { return p.Namespace == got.Namespace && p.Name == got.Name })
		if i < 0 {
			t.Errorf("pod %s/%s not in the manifest", got.Namespace, got.Name)
			continue
		}
		if want := m.Pods[i].Labels; !maps.Equal(got.Labels, want) {
			t.Errorf("pod %s/%s: the API server holds labels %v, the manifest %v", got.Namespace, got.Name, got.Labels, want)
		}
	}
}

// writeLabManifest writes m as the lab does.
func writeLabManifest(t *testing.T, path string, m *manifest.Manifest) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := m.Encode(f); err != nil {
		t.Fatal(err)
	}
}

// enrichedView renders what the enrichment knows, without what the API
// server assigns (UIDs, creation times, resource versions): every object
// of the snapshot, and the enrichment of a flow between every pair of pod
// addresses of a family and from every pod to every Service address and
// port.
func enrichedView(e *enrich.Enricher, m *manifest.Manifest) string {
	s := e.Snapshot()
	var b strings.Builder
	for _, ns := range s.Namespaces {
		if ns.Name == collectorNS || ns.Name == "default" || strings.HasPrefix(ns.Name, "kube-") {
			continue // the API server's own and the collector's
		}
		fmt.Fprintf(&b, "namespace %s %v\n", ns.Name, ns.Labels)
	}
	for _, n := range s.Nodes {
		fmt.Fprintf(&b, "node %s zone=%s internal=%v external=%v cidrs=%v\n", n.Name, n.Zone, n.InternalIPs, n.ExternalIPs, n.PodCIDRs)
	}
	for i, p := range s.Pods {
		fmt.Fprintf(&b, "pod %s/%s node=%s labels=%v addrs=%v host=%v terminated=%v ports=%v workload=%v\n",
			p.Namespace, p.Name, p.NodeName, p.Labels, p.Addrs, p.HostNetwork, p.Terminated, p.Ports, s.Workloads[i])
	}
	for _, v := range s.Services {
		if v.Namespace == "default" && v.Name == "kubernetes" {
			continue
		}
		fmt.Fprintf(&b, "service %s/%s type=%s ips=%v families=%v policy=%s selector=%v ports=%v\n",
			v.Namespace, v.Name, v.Type, v.ClusterIPs, v.IPFamilies, v.IPFamilyPolicy, v.Selector, v.Ports)
	}
	for _, sl := range s.EndpointSlices {
		fmt.Fprintf(&b, "slice %s/%s service=%s type=%s ports=%v\n", sl.Namespace, sl.Name, sl.Service, sl.AddressType, sl.Ports)
		for _, ep := range sl.Endpoints {
			fmt.Fprintf(&b, "  endpoint %v node=%s zone=%s ready=%v pod=%v\n", ep.Addrs, ep.NodeName, ep.Zone, ep.Ready, ep.Pod)
		}
	}
	for _, p := range s.NetworkPolicies {
		spec, _ := json.Marshal(p.Spec)
		fmt.Fprintf(&b, "policy %s/%s %s\n", p.Namespace, p.Name, spec)
	}
	var addrs []netip.Addr
	for i := range m.Pods {
		addrs = append(addrs, manifest.PodAddrs(&m.Pods[i])...)
	}
	at := time.Now()
	for _, src := range addrs {
		for _, dst := range addrs {
			if src.Is4() != dst.Is4() {
				continue
			}
			r := flow.Record{FlowStart: at, FlowEnd: at, SrcAddr: src, DstAddr: dst, SrcPort: 40000, DstPort: manifest.PortHTTP, Proto: flow.ProtoTCP}
			r.Normalize()
			e.Enrich(unsafe.Slice(&r, 1))
			fmt.Fprintf(&b, "flow %v->%v: %s\n", src, dst, endpoints(&r))
		}
		for i := range m.Services {
			svc := &m.Services[i]
			for _, ip := range svc.Spec.ClusterIPs {
				vip := netip.MustParseAddr(ip)
				if vip.Is4() != src.Is4() {
					continue
				}
				for _, sp := range svc.Spec.Ports {
					r := flow.Record{FlowStart: at, FlowEnd: at, SrcAddr: src, DstAddr: vip, SrcPort: 40000, DstPort: uint16(sp.Port), Proto: flow.ProtoTCP}
					if sp.Protocol == "UDP" {
						r.Proto = flow.ProtoUDP
					}
					r.Normalize()
					e.Enrich(unsafe.Slice(&r, 1))
					fmt.Fprintf(&b, "flow %v->%v:%d: %s\n", src, vip, sp.Port, endpoints(&r))
				}
			}
		}
	}
	return b.String()
}

func endpoints(r *flow.Record) string {
	side := func(e flow.Endpoint) string {
		return fmt.Sprintf("%s/%s %s:%s node=%s zone=%s labels=%v", e.PodNamespace, e.PodName, e.WorkloadKind, e.WorkloadName, e.NodeName, e.Zone, e.Labels)
	}
	return fmt.Sprintf("[%s] -> [%s] svc=%+v type=%v", side(r.Src), side(r.Dst), r.Service, r.Type)
}

// lineDiff lists the lines only in want (-) or only in got (+).
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for _, l := range w {
		if !slices.Contains(g, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			out = append(out, "+ "+l)
		}
	}
	if len(out) > 40 {
		out = append(out[:40], fmt.Sprintf("... %d more", len(out)-40))
	}
	return strings.Join(out, "\n")
}
