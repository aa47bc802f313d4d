package cluster

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// dns runs CoreDNS as the cluster's DNS, as kubeadm deploys it: the
// kube-dns Service on the kubelets' clusterDNS addresses (one per family
// of the mode), answering for cluster.local and the reverse zones, with
// nothing to forward to (no resolver outside the cluster).
func (c *Cluster) dns(ctx context.Context) error {
	var ips []string
	for _, a := range c.plan.clusterDNS() {
		ips = append(ips, fmt.Sprintf("%q", a.String()))
	}
	policy := "SingleStack"
	if len(ips) == 2 {
		policy = "RequireDualStack"
	}
	manifest := fmt.Sprintf(dnsManifest, c.cfg.Bins.CoreDNSImage, ips[0], strings.Join(ips, ", "), policy)
	if _, err := c.Kubectl(ctx, strings.NewReader(manifest), "apply", "-f", "-"); err != nil {
		return err
	}
	_, err := c.Kubectl(ctx, nil, "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout="+(3*time.Minute).String())
	return err
}

const dnsManifest = `apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: system:coredns}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system:coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:coredns}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  Corefile: |
    .:1053 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
        loadbalance
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      priorityClassName: system-cluster-critical
      containers:
      - name: coredns
        image: %s
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 1053, protocol: UDP}
        - {name: dns-tcp, containerPort: 1053, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 2}
        livenessProbe: {httpGet: {path: /health, port: 8080}, initialDelaySeconds: 10}
        securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, runAsNonRoot: true, capabilities: {drop: [ALL]}}
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  selector: {k8s-app: kube-dns}
  clusterIP: %s
  clusterIPs: [%s]
  ipFamilyPolicy: %s
  ports:
  - {name: dns, port: 53, targetPort: 1053, protocol: UDP}
  - {name: dns-tcp, port: 53, targetPort: 1053, protocol: TCP}
`
