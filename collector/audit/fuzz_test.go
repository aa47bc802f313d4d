package audit

import (
	"bytes"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/enrich/inventory"
	"github.com/dualflow/dualflow/lab/manifest"
)

// FuzzDecode feeds arbitrary manifests to the manifest decoder, the
// cluster view and the static analysis: errors are fine, panics are not.
func FuzzDecode(f *testing.F) {
	m, err := manifest.Generate(manifest.Spec{Mode: manifest.ModeDual, Nodes: 1})
	if err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if err := m.Encode(&buf); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte("apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: Pod\n  metadata: {name: p}\n  status: {podIPs: [{ip: \"fd00:10::1\"}]}\n"))
	f.Add([]byte("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: n, namespace: x}\nspec:\n  podSelector: {}\n  egress: [{to: [{ipBlock: {cidr: \"::/0\", except: [\"fd00:10::/32\"]}}], ports: [{port: 80, endPort: 90}]}]\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		res, err := inventory.Decode("fuzz", bytes.NewReader(data))
		if err != nil {
			return
		}
		var objs []runtime.Object
		for _, o := range res.Objects {
			objs = append(objs, o.Object)
		}
		inv := enrich.NewSnapshot(objs...)
		Findings(inv, Options{MaxPairs: 1000})
		set, _ := policy.Compile(inv.NetworkPolicies)
		for _, p := range inv.Pods {
			for _, q := range inv.Pods {
				for _, a := range p.Addrs {
					for _, b := range q.Addrs {
						fl := podFlow(inv, p, a, q, b, 6, 80)
						set.Evaluate(&fl)
					}
				}
			}
		}
	})
}
