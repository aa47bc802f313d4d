//go:build tools

// Package tools pins the kube-apiserver that the real-API-server test tier
// builds (scripts/kube-apiserver.sh): k8s.io/kubernetes at an exact version,
// with its staging modules at the matching v0.x release. It is a module of
// its own so that the product's go.mod never requires k8s.io/kubernetes.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
