package audit

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// TestDecodeLabManifest: the lab's manifest file decodes into the same
// inventory as its objects, with unknown kinds skipped.
func TestDecodeLabManifest(t *testing.T) {
	m, want := labInventory(t, manifest.ModeDual, 2)
	var buf bytes.Buffer
	if err := m.Encode(&buf); err != nil {
		t.Fatal(err)
	}
	buf.WriteString("---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\n")
	inv := NewInventory()
	if err := inv.Decode("manifest.yaml", &buf); err != nil {
		t.Fatal(err)
	}
	if len(inv.Pods()) != 6 || len(inv.Services()) != 3 || len(inv.NetworkPolicies()) != 4 || len(inv.Namespaces()) != 3 {
		t.Fatalf("decoded %d pods, %d services, %d policies, %d namespaces", len(inv.Pods()), len(inv.Services()), len(inv.NetworkPolicies()), len(inv.Namespaces()))
	}
	if inv.Skipped["Widget"] != 1 || inv.Skipped["Node"] != 2 || inv.Skipped["EndpointSlice"] == 0 {
		t.Errorf("skipped %v", inv.Skipped)
	}
	for _, p := range want.Pods() {
		got, ok := inv.Pod(p.Namespace, p.Name)
		if !ok || !got.DualStack() || inv.Workload(got) != want.Workload(p) {
			t.Fatalf("pod %s/%s: %+v", p.Namespace, p.Name, got)
		}
		a, _ := p.Addr(6)
		if byAddr, ok := inv.PodByAddr(a); !ok || byAddr != got {
			t.Errorf("PodByAddr(%s) = %v", a, byAddr)
		}
	}
	api := inv.Pods()[1]
	if inv.Workload(api) != (Workload{Kind: "Deployment", Name: "api"}) {
		t.Errorf("workload of %s: %v", api.Name, inv.Workload(api))
	}
	if got := inv.PortName(PortQuery{Namespace: api.Namespace, Pod: api.Name, Port: manifest.PortUDPEcho, Proto: flow.ProtoUDP}); got != "udp-echo" {
		t.Errorf("PortName(udp 5353) = %q", got)
	}
	if got := inv.PortName(PortQuery{Namespace: api.Namespace, Pod: api.Name, Port: manifest.PortUDPEcho, Proto: flow.ProtoTCP}); got != "" {
		t.Errorf("PortName(tcp 5353) = %q, want none", got)
	}
	a4, _ := api.Addr(4)
	if got := inv.PortName(PortQuery{Namespace: "backend", Pod: "gone", Addr: a4, Port: manifest.PortHTTP, Proto: flow.ProtoTCP}); got != "http" {
		t.Errorf("PortName by address = %q, want http", got)
	}
	if l, ok := inv.NamespaceLabels("backend"); !ok || l["team"] != "api" {
		t.Errorf("namespace labels %v", l)
	}
}

func TestDecodeList(t *testing.T) {
	const list = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Pod
  metadata: {name: p, namespace: ns, labels: {app: a}}
  spec:
    containers: [{name: c, ports: [{name: http, containerPort: 80}]}]
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
	inv := NewInventory()
	if err := inv.Decode("list.yaml", strings.NewReader(list)); err != nil {
		t.Fatal(err)
	}
	p, ok := inv.Pod("ns", "p")
	if !ok || p.Addrs[0] != netip.MustParseAddr("198.18.0.1") || p.PortName(80, flow.ProtoTCP) != "http" || inv.Workload(p).Kind != "Pod" {
		t.Fatalf("pod %+v", p)
	}
	if err := inv.Decode("bad.yaml", strings.NewReader("apiVersion: v1\nkind: Pod\nmetadata: [\n")); err == nil {
		t.Fatal("malformed document: want an error")
	}
	if _, err := DecodePolicies("empty.yaml", strings.NewReader("# nothing\n"), "default"); err == nil {
		t.Fatal("no policy: want an error")
	}
}
