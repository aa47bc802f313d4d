package e2e

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestDeployMove moves an install from kustomize to Helm and back with the
// real tools, as docs/deploy.md says: `helm install --take-ownership
// --force-conflicts` over
// the objects of `kubectl apply -k`, then `kubectl apply -k` over Helm's
// and Helm's release record deleted. Both select the pods alike, so
// neither move meets "field is immutable", and every object is the one
// that was there (same UID: updated, never deleted and created again).
func TestDeployMove(t *testing.T) {
	requireKubeAPI(t)
	t.Parallel()
	const overlay = "deploy/kubernetes/overlays/embedded"
	s := startDeployKubeAPI(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	op := newOperator(t, s)
	op.prepare()

	op.must("kubectl", "apply", "-k", overlay)
	kustomized := decodeObjects(t, []byte(op.must("kubectl", "kustomize", overlay)))
	uids := map[string]string{}
	key := func(o *unstructured.Unstructured) string { return o.GetKind() + "/" + o.GetName() }
	for _, o := range readBack(t, ctx, s, kustomized) {
		uids[key(o)] = string(o.GetUID())
	}
	same := func(step string, objs []*unstructured.Unstructured) {
		t.Helper()
		for _, o := range readBack(t, ctx, s, objs) {
			if uid, ok := uids[key(o)]; ok && uid != string(o.GetUID()) {
				t.Errorf("%s: %s was replaced (uid %s -> %s)", step, key(o), uid, o.GetUID())
			}
		}
	}

	// kustomize -> Helm: Helm takes the objects over, and the fields
	// kubectl set (--force-conflicts: Helm applies server-side). Without
	// --take-ownership it refuses them, naming the first.
	op.refused("exists and cannot be imported into the current release", "helm", "install", "dualflow", chartDir, "-n", deployNS)
	op.must("helm", "install", "dualflow", chartDir, "-n", deployNS, "--take-ownership", "--force-conflicts")
	helmed := decodeObjects(t, []byte(op.must("helm", "get", "manifest", "dualflow", "-n", deployNS)))
	same("kustomize -> helm", helmed)
	for _, o := range readBack(t, ctx, s, helmed) {
		if o.GetAnnotations()["meta.helm.sh/release-name"] != "dualflow" {
			t.Errorf("kustomize -> helm: %s is not the release's: annotations %v", key(o), o.GetAnnotations())
		}
	}
	op.must("helm", "upgrade", "dualflow", chartDir, "-n", deployNS)
	same("helm upgrade", helmed)

	// Helm -> kustomize: kubectl applies over Helm's objects; Helm forgets
	// the release without deleting anything.
	op.must("kubectl", "apply", "-k", overlay)
	op.must("kubectl", "-n", deployNS, "delete", "secret", "-l", "owner=helm,name=dualflow")
	if out := op.must("helm", "list", "-n", deployNS, "-q"); out != "" {
		t.Errorf("helm still lists %q", out)
	}
	same("helm -> kustomize", kustomized)
	same("helm -> kustomize", helmed)
}
