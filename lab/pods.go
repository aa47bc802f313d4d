package lab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/nsrun"
)

// Pod returns the pod "namespace/name".
func (l *Lab) Pod(ref string) (*corev1.Pod, error) {
	ns, name, ok := strings.Cut(ref, "/")
	if !ok {
		return nil, fmt.Errorf("pod %q: want namespace/name", ref)
	}
	p, ok := l.Manifest.Pod(ns, name)
	if !ok {
		return nil, fmt.Errorf("pod %q not in lab", ref)
	}
	return p, nil
}

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

// Dial sends one request from pod "from" to "to" over proto (agent.TCP,
// agent.UDP or agent.ICMP) and waits up to Config.DialTimeout. A policy
// drop returns an error wrapping agent.ErrNoAnswer.
func (l *Lab) Dial(ctx context.Context, from *corev1.Pod, proto string, to netip.AddrPort) (agent.Reply, error) {
	return agent.Dial(ctx, l.PodNetNSPath(from), proto, to, l.cfg.DialTimeout)
}

// Exec runs argv inside pod's network namespace (only the network
// namespace: the file system is the host's) and returns its combined output.
func (l *Lab) Exec(ctx context.Context, p *corev1.Pod, argv ...string) ([]byte, error) {
	return nsrun.Output(ctx, l.PodNetNSPath(p), nil, argv...)
}
