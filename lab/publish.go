package lab

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/dualflow/dualflow/lab/manifest"
)

// PublishOrder is the order in which Publish writes a lab's objects.
// Namespaces always come first (the API server refuses objects in a
// namespace that does not exist); the order of everything else varies.
type PublishOrder string

// Publish orders.
const (
	// OrderForward: nodes, Deployments, ReplicaSets, pods, Services,
	// EndpointSlices, NetworkPolicies (the order a cluster's objects
	// usually appear in).
	OrderForward PublishOrder = "forward"
	// OrderReverse: NetworkPolicies, EndpointSlices before their
	// Services, pods before their nodes and ReplicaSets.
	OrderReverse PublishOrder = "reverse"
	// OrderRandom: every object after the namespaces in a random order
	// (PublishOptions.Seed).
	OrderRandom PublishOrder = "random"
)

// PublishOrders are the orders Publish knows.
var PublishOrders = []PublishOrder{OrderForward, OrderReverse, OrderRandom}

// PublishOptions configure Publish.
type PublishOptions struct {
	Order PublishOrder // default OrderForward
	Seed  uint64       // of OrderRandom
}

// publishStep writes one object.
type publishStep struct {
	what string
	do   func(ctx context.Context) error
}

// Publish writes a lab's Kubernetes objects into an API server through c,
// as the controllers and kubelets of a cluster would leave them:
// namespaces with their default ServiceAccount, nodes with their status
// (addresses), Deployments and ReplicaSets, pods with their status
// (status.podIPs of every family, written through the status subresource
// after the create, as a kubelet does), Services with their exact
// spec.clusterIPs, one EndpointSlice per Service and family, and the
// NetworkPolicies. Objects that exist are left as they are. The API
// server assigns UIDs and creation times.
func Publish(ctx context.Context, c kubernetes.Interface, m *manifest.Manifest, o PublishOptions) error {
	for i := range m.Namespaces {
		ns := clean(m.Namespaces[i].DeepCopy())
		if err := ensureNamespace(ctx, c, ns); err != nil {
			return err
		}
	}
	var nodes, deps, rss, pods, svcs, epSlices, pols []publishStep
	for i := range m.Nodes {
		n := m.Nodes[i].DeepCopy()
		nodes = append(nodes, publishStep{"node " + n.Name, func(ctx context.Context) error {
			status := n.Status
			got, err := c.CoreV1().Nodes().Create(ctx, clean(n), metav1.CreateOptions{})
			if err != nil {
				return err
			}
			got.Status = status
			_, err = c.CoreV1().Nodes().UpdateStatus(ctx, got, metav1.UpdateOptions{})
			return err
		}})
	}
	for i := range m.Deployments {
		d := m.Deployments[i].DeepCopy()
		deps = append(deps, publishStep{"deployment " + d.Namespace + "/" + d.Name, func(ctx context.Context) error {
			_, err := c.AppsV1().Deployments(d.Namespace).Create(ctx, clean(d), metav1.CreateOptions{})
			return err
		}})
	}
	for i := range m.ReplicaSets {
		r := m.ReplicaSets[i].DeepCopy()
		rss = append(rss, publishStep{"replicaset " + r.Namespace + "/" + r.Name, func(ctx context.Context) error {
			_, err := c.AppsV1().ReplicaSets(r.Namespace).Create(ctx, clean(r), metav1.CreateOptions{})
			return err
		}})
	}
	for i := range m.Pods {
		p := m.Pods[i].DeepCopy()
		pods = append(pods, publishStep{"pod " + p.Namespace + "/" + p.Name, func(ctx context.Context) error {
			return CreatePod(ctx, c, p)
		}})
	}
	for i := range m.Services {
		s := m.Services[i].DeepCopy()
		svcs = append(svcs, publishStep{"service " + s.Namespace + "/" + s.Name, func(ctx context.Context) error {
			_, err := c.CoreV1().Services(s.Namespace).Create(ctx, clean(s), metav1.CreateOptions{})
			return err
		}})
	}
	for i := range m.EndpointSlices {
		s := m.EndpointSlices[i].DeepCopy()
		epSlices = append(epSlices, publishStep{"endpointslice " + s.Namespace + "/" + s.Name, func(ctx context.Context) error {
			_, err := c.DiscoveryV1().EndpointSlices(s.Namespace).Create(ctx, clean(s), metav1.CreateOptions{})
			return err
		}})
	}
	for i := range m.NetworkPolicies {
		p := m.NetworkPolicies[i].DeepCopy()
		pols = append(pols, publishStep{"networkpolicy " + p.Namespace + "/" + p.Name, func(ctx context.Context) error {
			_, err := c.NetworkingV1().NetworkPolicies(p.Namespace).Create(ctx, clean(p), metav1.CreateOptions{})
			return err
		}})
	}
	steps := [][]publishStep{nodes, deps, rss, pods, svcs, epSlices, pols} // per kind, in forward order
	var all []publishStep
	switch o.Order {
	case "", OrderForward:
		all = slices.Concat(steps...)
	case OrderReverse:
		slices.Reverse(steps)
		all = slices.Concat(steps...)
	case OrderRandom:
		all = slices.Concat(steps...)
		r := rand.New(rand.NewPCG(o.Seed, o.Seed^0x9e3779b97f4a7c15))
		r.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
	default:
		return fmt.Errorf("lab publish: unknown order %q (want forward, reverse or random)", o.Order)
	}
	for _, s := range all {
		if err := s.do(ctx); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("lab publish %s: %w", s.what, err)
		}
	}
	return nil
}

// CreatePod creates pod p (spec) and then writes its status (addresses,
// phase), as the kubelet would once the pod runs.
func CreatePod(ctx context.Context, c kubernetes.Interface, p *corev1.Pod) error {
	status := *p.Status.DeepCopy()
	got, err := c.CoreV1().Pods(p.Namespace).Create(ctx, clean(p.DeepCopy()), metav1.CreateOptions{})
	if err != nil {
		return err
	}
	got.Status = status
	_, err = c.CoreV1().Pods(p.Namespace).UpdateStatus(ctx, got, metav1.UpdateOptions{})
	return err
}

// ensureNamespace creates ns and its "default" ServiceAccount (pod
// admission needs it; a controller-manager would create it).
func ensureNamespace(ctx context.Context, c kubernetes.Interface, ns *corev1.Namespace) error {
	if _, err := c.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("lab publish namespace %s: %w", ns.Name, err)
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: ns.Name}}
	if _, err := c.CoreV1().ServiceAccounts(ns.Name).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("lab publish namespace %s default ServiceAccount: %w", ns.Name, err)
	}
	return nil
}

// objectMeta is what clean needs of an object.
type objectMeta interface {
	GetObjectMeta() metav1.Object
}

// clean drops the fields the API server sets itself (UID, resource
// version, creation time) from an object about to be created.
func clean[T objectMeta](o T) T {
	m := o.GetObjectMeta()
	m.SetUID("")
	m.SetResourceVersion("")
	m.SetCreationTimestamp(metav1.Time{})
	m.SetGenerateName("")
	return o
}
