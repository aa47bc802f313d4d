package inventory

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
)

const goodMultiDoc = `# a comment before the first document
---
apiVersion: v1
kind: Namespace
metadata:
  name: backend
---
# a Pod without a namespace gets "default"
apiVersion: v1
kind: Pod
metadata:
  name: api-1
status:
  podIPs:
  - ip: 198.18.1.11
  - ip: fd00:10:1::11
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: api, namespace: backend}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: api-v6, namespace: backend, labels: {kubernetes.io/service-name: api}}
addressType: IPv6
endpoints:
- addresses: ["fd00:10:1::11"]
---
`

const goodList = `apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Service
  metadata: {name: api, namespace: backend}
  spec:
    clusterIPs: ["198.19.0.10", "fd00:10:96::10"]
    ipFamilies: [IPv4, IPv6]
- apiVersion: v1
  kind: ConfigMap
  metadata: {name: cm, namespace: backend}
- apiVersion: v1
  kind: Node
  metadata: {name: node-1}
  spec: {podCIDRs: ["198.18.1.0/24", "fd00:10:1::/64"]}
`

// TestDecodeAll: DecodeAll keeps the kinds Decode skips (the
// Deployment), and a kind outside the scheme is an error, not skipped.
func TestDecodeAll(t *testing.T) {
	res, err := DecodeAll("multi.yaml", strings.NewReader(goodMultiDoc))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, o := range res.Objects {
		kinds = append(kinds, o.Kind)
	}
	if got := strings.Join(kinds, " "); got != "Namespace Pod Deployment EndpointSlice" || len(res.Skipped) != 0 {
		t.Errorf("kinds %s, skipped %v", got, res.Skipped)
	}
	if _, err := DecodeAll("w.yaml", strings.NewReader("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n")); err == nil {
		t.Error("DecodeAll kept a kind outside its scheme")
	}
}

func TestDecode(t *testing.T) {
	res, err := Decode("multi.yaml", strings.NewReader(goodMultiDoc))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range res.Objects {
		got = append(got, o.Where())
	}
	want := []string{
		"multi.yaml:3 (document 1) Namespace backend",
		"multi.yaml:9 (document 2) Pod default/api-1",
		"multi.yaml:22 (document 4) EndpointSlice backend/api-v6",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("objects:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if res.Skipped["apps/v1 Deployment"] != 1 {
		t.Errorf("skipped %v", res.Skipped)
	}
	p := res.Objects[1].Object.(*corev1.Pod)
	if p.Namespace != "default" || len(p.Status.PodIPs) != 2 || p.Status.PodIPs[1].IP != "fd00:10:1::11" {
		t.Errorf("pod %+v", p)
	}
	if s := res.Objects[2].Object.(*discoveryv1.EndpointSlice); s.AddressType != discoveryv1.AddressTypeIPv6 {
		t.Errorf("slice %+v", s)
	}

	res, err = Decode("dump.yaml", strings.NewReader(goodList))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Objects) != 2 || res.Objects[0].Where() != "dump.yaml:1 (document 1, list item 1) Service backend/api" ||
		res.Objects[1].Kind != "Node" || res.Skipped["v1 ConfigMap"] != 1 {
		t.Errorf("list: %v skipped %v", res.Objects, res.Skipped)
	}

	// JSON, as kubectl get -o json writes it.
	res, err = Decode("dump.json", strings.NewReader(`{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"a"},"status":{"podIPs":[{"ip":"fd00:10::1"}]}}]}`))
	if err != nil || len(res.Objects) != 1 || res.Objects[0].Name != "p" {
		t.Errorf("json: %v %v", res, err)
	}
}

func TestMalformed(t *testing.T) {
	pod := func(ips string) string {
		return "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: frontend}\nstatus:\n  podIPs: " + ips + "\n"
	}
	for _, tc := range []struct {
		name, doc string
		want      string // substring of the error
	}{
		{"not yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: [\n", "t.yaml:1 (document 1) object: not YAML"},
		{"not an object", "- a\n- b\n", "t.yaml:1 (document 1) object: not a Kubernetes object"},
		{"no kind", "apiVersion: v1\nmetadata: {name: x}\n", "t.yaml:1 (document 1) object: missing apiVersion or kind"},
		{"bad ipv4 pod IP", pod(`[{ip: 198.18.1.300}]`), `Pod frontend/web: status.podIPs[0].ip: invalid IP "198.18.1.300"`},
		{"bad ipv6 pod IP", pod(`[{ip: 198.18.1.3}, {ip: "fd00:10::zz"}]`), `Pod frontend/web: status.podIPs[1].ip: invalid IP "fd00:10::zz"`},
		{"wrong type", "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: frontend}\nspec: {containers: 5}\n", "Pod frontend/web: decode:"},
		{"no name", "apiVersion: v1\nkind: Service\nmetadata: {namespace: a}\n", "Service (no name): metadata.name is empty"},
		{"namespaced node", "apiVersion: v1\nkind: Node\nmetadata: {name: n1, namespace: a}\n", `Node a/n1: metadata.namespace "a" on a cluster-scoped Node`},
		{"bad clusterIP", "apiVersion: v1\nkind: Service\nmetadata: {name: s, namespace: a}\nspec: {clusterIPs: [198.19.0.1, 'fd00:10:96::x']}\n", `Service a/s: spec.clusterIPs[1]: invalid IP "fd00:10:96::x"`},
		{"ipv6 in an ipv4 slice", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, namespace: a}\naddressType: IPv4\nendpoints: [{addresses: ['fd00:10::1']}]\n",
			"EndpointSlice a/s: endpoints[0].addresses[0]: fd00:10::1 in a slice of addressType IPv4"},
		{"bad address type", "apiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata: {name: s, namespace: a}\naddressType: IPv5\n", `addressType "IPv5"`},
		{"bad ipv6 pod CIDR", "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nspec: {podCIDRs: [198.18.0.0/24, 'fd00:10::/129']}\n", `Node n1: spec.podCIDRs[1]: invalid CIDR "fd00:10::/129"`},
		{"bad node address", "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nstatus: {addresses: [{type: InternalIP, address: 'node-1'}]}\n", `status.addresses[0].address: invalid IP "node-1"`},
		{"bad ipBlock", "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: p, namespace: a}\nspec:\n  egress: [{to: [{ipBlock: {cidr: 'fd00:10::/56', except: ['fd00:10:0:1::/640']}}]}]\n",
			`NetworkPolicy a/p: spec.egress[0].to[0].ipBlock.except[0]: invalid CIDR "fd00:10:0:1::/640"`},
		{"bad list item", "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: ok}}\n- {apiVersion: v1, kind: Pod, metadata: {name: p, namespace: a}, status: {podIP: nope}}\n",
			`t.yaml:1 (document 1, list item 2) Pod a/p: status.podIP: invalid IP "nope"`},
		{"duplicate", "apiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Namespace\nmetadata: {name: a}\n",
			"t.yaml:5 (document 2) Namespace a: given twice, first at t.yaml:1 (document 1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode("t.yaml", strings.NewReader(tc.doc))
			var ie *Error
			if !errors.As(err, &ie) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want an *Error containing %q", err, tc.want)
			}
		})
	}
}

func TestLoadFiles(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.yaml"), filepath.Join(dir, "b.yaml")
	os.WriteFile(a, []byte(goodMultiDoc), 0o644)
	os.WriteFile(b, []byte(goodList), 0o644)
	res, err := Load(a, b)
	if err != nil || len(res.Objects) != 5 || res.Objects[3].File != b {
		t.Fatalf("Load: %v, %v", res, err)
	}
	// The same object in two files.
	_, err = Load(a, a)
	if err == nil || !strings.Contains(err.Error(), "given twice, first at "+a+":3") {
		t.Errorf("duplicate across files: %v", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("missing file: %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(goodMultiDoc)
	f.Add(goodList)
	f.Add("---\n---\n")
	f.Fuzz(func(t *testing.T, s string) {
		res, err := Decode("fuzz.yaml", strings.NewReader(s))
		if err == nil && res == nil {
			t.Fatal("nil result without an error")
		}
	})
}
