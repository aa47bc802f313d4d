package audit

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// labInventory returns the default lab of mode and its cluster view.
func labInventory(t testing.TB, mode manifest.Mode, nodes int) (*manifest.Manifest, *enrich.Snapshot) {
	t.Helper()
	m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: nodes})
	if err != nil {
		t.Fatal(err)
	}
	return m, enrich.NewSnapshot(m.Objects()...)
}

// pod is a running pod of a hand-built view.
func pod(ns, name string, labels map[string]string, addrs []string, ports ...corev1.ContainerPort) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	p.Spec.Containers = []corev1.Container{{Name: "c", Ports: ports}}
	p.Status.Phase = corev1.PodRunning
	for _, a := range addrs {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: a})
	}
	return p
}

func namespace(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{corev1.LabelMetadataName: name}}}
}

// objects returns l's items as objects.
func objects[T runtime.Object](l ...T) []runtime.Object {
	out := make([]runtime.Object, len(l))
	for i, o := range l {
		out[i] = o
	}
	return out
}

// TestLoadLabManifest: the lab's manifest file, read as `dualflow audit
// --inventory` reads it, is the same view as its objects, and answers the
// Auditor's lookups.
func TestLoadLabManifest(t *testing.T) {
	m, want := labInventory(t, manifest.ModeDual, 2)
	var buf bytes.Buffer
	if err := m.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	buf.WriteString("---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n")
	file := filepath.Join(t.TempDir(), "manifest.yaml")
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	view, err := enrich.LoadSnapshot(file)
	if err != nil {
		t.Fatal(err)
	}
	if len(view.Pods) != 6 || len(view.Services) != 3 || len(view.NetworkPolicies) != 4 || len(view.Namespaces) != 3 {
		t.Fatalf("loaded %d pods, %d services, %d policies, %d namespaces", len(view.Pods), len(view.Services), len(view.NetworkPolicies), len(view.Namespaces))
	}
	for _, p := range want.Pods {
		got, ok := view.Pod(p.Namespace, p.Name)
		if !ok || !dualStack(got) || view.Workload(got) != want.Workload(p) {
			t.Fatalf("pod %s/%s: %+v", p.Namespace, p.Name, got)
		}
		a, _ := enrich.AddrOfFamily(p.Addrs, 6)
		if byAddr, ok := view.LookupPod(a, time.Time{}); !ok || byAddr != got {
			t.Errorf("LookupPod(%s) = %v", a, byAddr)
		}
	}
	api, _ := view.Pod(m.Pods[1].Namespace, m.Pods[1].Name)
	if api == nil || view.Workload(api) != (enrich.Workload{Kind: "Deployment", Name: "api"}) {
		t.Fatalf("%s: %+v", m.Pods[1].Name, api)
	}
	if got := portName(view, PortQuery{Namespace: api.Namespace, Pod: api.Name, Port: manifest.PortUDPEcho, Proto: flow.ProtoUDP}); got != "udp-echo" {
		t.Errorf("portName(udp 5353) = %q", got)
	}
	if got := portName(view, PortQuery{Namespace: api.Namespace, Pod: api.Name, Port: manifest.PortUDPEcho, Proto: flow.ProtoTCP}); got != "" {
		t.Errorf("portName(tcp 5353) = %q, want none", got)
	}
	a4, _ := enrich.AddrOfFamily(api.Addrs, 4)
	if got := portName(view, PortQuery{Namespace: "backend", Pod: "gone", Addr: a4, Port: manifest.PortHTTP, Proto: flow.ProtoTCP}); got != "http" {
		t.Errorf("portName by address = %q, want http", got)
	}
	if l, ok := namespaceLabels(view, "backend"); !ok || l["team"] != "api" {
		t.Errorf("namespace labels %v", l)
	}
}

func TestDecodePolicies(t *testing.T) {
	const list = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: p, namespace: ns, labels: {app: a}}
  status: {podIPs: [{ip: "::ffff:198.18.0.1"}, {ip: "fd00:10::1"}]}
- apiVersion: networking.k8s.io/v1
  kind: NetworkPolicy
  metadata: {name: deny}
  spec: {podSelector: {}}
`
	pols, err := DecodePolicies("list.yaml", strings.NewReader(list), "default")
	if err != nil || len(pols) != 1 || pols[0].Namespace != "default" {
		t.Fatalf("DecodePolicies: %v %v", pols, err)
	}
	if _, err := DecodePolicies("bad.yaml", strings.NewReader("apiVersion: v1\nkind: Pod\nmetadata: [\n"), "default"); err == nil {
		t.Fatal("malformed document: want an error")
	}
	if _, err := DecodePolicies("empty.yaml", strings.NewReader("# nothing\n"), "default"); err == nil {
		t.Fatal("no policy: want an error")
	}
	// An IPv4-mapped pod address is the IPv4 one, and a pod without an
	// owner is its own workload.
	view := enrich.NewSnapshot(pod("ns", "p", nil, []string{"::ffff:198.18.0.1"}, corev1.ContainerPort{Name: "http", ContainerPort: 80}))
	p, ok := view.Pod("ns", "p")
	if !ok || p.Addrs[0] != netip.MustParseAddr("198.18.0.1") || p.PortName(80, flow.ProtoTCP) != "http" || view.Workload(p).Kind != "Pod" {
		t.Fatalf("pod %+v", p)
	}
}

func ptr[T any](v T) *T { return &v }
