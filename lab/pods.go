package lab

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/nsrun"
)

// PodOn returns the pod of namespace with label app=<app> on node i
// (1-based), e.g. PodOn("backend", "api", 2).
func (l *Lab) PodOn(namespace, app string, node int) (*corev1.Pod, error) {
	nn := manifest.NodeName(node)
	for i := range l.Manifest.Pods {
		p := &l.Manifest.Pods[i]
		if p.Namespace == namespace && p.Labels["app"] == app && p.Spec.NodeName == nn {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no %s/app=%s pod on %s", namespace, app, nn)
}

// PodNetNSPath returns the namespace path of p (/run/netns/...).
func (l *Lab) PodNetNSPath(p *corev1.Pod) string {
	return nsrun.Path(p.Annotations[manifest.AnnotationNetNS])
}

// NodeNetNSPath returns the namespace path of the node called name.
func (l *Lab) NodeNetNSPath(node string) string {
	if n, ok := l.Manifest.Node(node); ok && n.Annotations[manifest.AnnotationNetNS] != "" {
		return nsrun.Path(n.Annotations[manifest.AnnotationNetNS])
	}
	return nsrun.Path(manifest.NodeNetNS(l.cfg.Prefix, node))
}
