package enrich

import (
	"bytes"
	"os"
	"slices"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// TestRBACCoversInformers checks rbac.yaml: list and watch (nothing else)
// on exactly the resources the informers use.
func TestRBACCoversInformers(t *testing.T) {
	b, err := os.ReadFile("rbac.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var granted []string
	var role, binding bool
	for _, doc := range bytes.Split(b, []byte("\n---\n")) {
		var head struct{ Kind string }
		if err := yaml.Unmarshal(doc, &head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "ClusterRole":
			var r rbacv1.ClusterRole
			if err := yaml.UnmarshalStrict(doc, &r); err != nil {
				t.Fatal(err)
			}
			role = true
			for _, rule := range r.Rules {
				if !slices.Equal(rule.Verbs, []string{"list", "watch"}) {
					t.Errorf("rule %v: verbs %v, want list and watch only", rule.Resources, rule.Verbs)
				}
				for _, g := range rule.APIGroups {
					for _, res := range rule.Resources {
						granted = append(granted, g+"/"+res)
					}
				}
			}
		case "ClusterRoleBinding":
			var rb rbacv1.ClusterRoleBinding
			if err := yaml.UnmarshalStrict(doc, &rb); err != nil {
				t.Fatal(err)
			}
			binding = rb.RoleRef.Name == "dualflow-collector-enrich" && len(rb.Subjects) == 1
		}
	}
	slices.Sort(granted)
	want := slices.Sorted(slices.Values(Resources))
	if !role || !binding || !slices.Equal(granted, want) {
		t.Errorf("rbac.yaml grants %v (role %v, binding %v), informers need %v", granted, role, binding, want)
	}
}
