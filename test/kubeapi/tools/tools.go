//go:build tools

// Package tools pins the Kubernetes binaries of the test tiers, built by
// scripts/kube-apiserver.sh (the real-API-server tier) and
// scripts/k8s-cluster.sh (the real-cluster tier: kubelet, kube-proxy,
// kube-controller-manager, kube-scheduler and kubectl): k8s.io/kubernetes
// at an exact version, with its staging modules at the matching v0.x
// release. It is a module of its own so that the product's go.mod never
// requires k8s.io/kubernetes.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
