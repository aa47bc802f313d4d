package manifest

import (
	"bufio"
	"fmt"
	"io"
	"os"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/dualflow/dualflow/collector/enrich/inventory"
)

// Objects returns every object of m in apply order (namespaces first).
func (m *Manifest) Objects() []runtime.Object {
	var out []runtime.Object
	out = appendObjects(out, m.Nodes)
	out = appendObjects(out, m.Namespaces)
	out = appendObjects(out, m.Deployments)
	out = appendObjects(out, m.ReplicaSets)
	out = appendObjects(out, m.Pods)
	out = appendObjects(out, m.Services)
	out = appendObjects(out, m.EndpointSlices)
	return appendObjects(out, m.NetworkPolicies)
}

// appendObjects appends a pointer to every element of objs.
func appendObjects[T any, P interface {
	*T
	runtime.Object
}](out []runtime.Object, objs []T) []runtime.Object {
	for i := range objs {
		out = append(out, P(&objs[i]))
	}
	return out
}

// Encode writes m as multi-document YAML ("---" separated), one object per
// document, each with apiVersion and kind.
func (m *Manifest) Encode(w io.Writer) error {
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "# dualflow lab manifest (mode %s). Generated; load with kubectl or client-go.\n", m.Mode())
	for i, o := range m.Objects() {
		b, err := yaml.Marshal(o)
		if err != nil {
			return fmt.Errorf("encode object %d: %w", i, err)
		}
		if i > 0 {
			bw.WriteString("---\n")
		}
		bw.Write(b)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

// Load decodes the manifest file at path (see Decode).
func Load(path string) (*Manifest, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	defer f.Close()
	return Decode(f)
}

// Decode reads a multi-document YAML (or JSON) manifest, including v1 List
// documents, with the product's manifest reader (collector/enrich/inventory:
// objects checked, errors naming the document and object). Unknown kinds
// are an error: the lab cannot build them.
func Decode(r io.Reader) (*Manifest, error) {
	name := "manifest"
	if f, ok := r.(interface{ Name() string }); ok {
		name = f.Name()
	}
	res, err := inventory.DecodeAll(name, r)
	if err != nil {
		return nil, err
	}
	m := &Manifest{}
	for _, o := range res.Objects {
		if err := m.add(o.Object); err != nil {
			return nil, fmt.Errorf("%s: %w", o.Where(), err)
		}
	}
	return m, nil
}

func (m *Manifest) add(obj runtime.Object) error {
	switch o := obj.(type) {
	case *corev1.Node:
		m.Nodes = append(m.Nodes, *o)
	case *corev1.Namespace:
		m.Namespaces = append(m.Namespaces, *o)
	case *appsv1.Deployment:
		m.Deployments = append(m.Deployments, *o)
	case *appsv1.ReplicaSet:
		m.ReplicaSets = append(m.ReplicaSets, *o)
	case *corev1.Pod:
		m.Pods = append(m.Pods, *o)
	case *corev1.Service:
		m.Services = append(m.Services, *o)
	case *discoveryv1.EndpointSlice:
		m.EndpointSlices = append(m.EndpointSlices, *o)
	case *networkingv1.NetworkPolicy:
		m.NetworkPolicies = append(m.NetworkPolicies, *o)
	default:
		return fmt.Errorf("unsupported kind %s", obj.GetObjectKind().GroupVersionKind())
	}
	return nil
}
