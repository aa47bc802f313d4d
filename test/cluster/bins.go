package cluster

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// Bins are the cluster's programs, from scripts/k8s-cluster.sh.
type Bins struct {
	APIServer, ControllerManager, Scheduler, Kubelet, Proxy, Kubectl string
	// ContainerdDir is Debian's containerd unpacked (usr/bin/containerd,
	// ctr, containerd-shim-runc-v2).
	ContainerdDir string
	KubeRouter    string
	// PauseArchive is the pod sandbox image localhost/pause:local.
	PauseArchive string
	// CoreDNSArchive holds CoreDNSImage, the cluster's DNS.
	CoreDNSArchive, CoreDNSImage string
	// Helm is the helm CLI (scripts/helm.sh).
	Helm string
}

// RepoRoot is the repository's top directory.
func RepoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// Build runs scripts/k8s-cluster.sh, which builds what is missing (the
// first time: 15-25 minutes; then at once), and returns the programs.
// Its progress goes to progress.
func Build(ctx context.Context, progress *os.File) (Bins, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(RepoRoot(), "scripts", "k8s-cluster.sh"))
	cmd.Stderr = progress
	out, err := cmd.Output()
	if err != nil {
		return Bins{}, fmt.Errorf("scripts/k8s-cluster.sh: %w", err)
	}
	kv := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			kv[k] = v
		}
	}
	b := Bins{
		APIServer: kv["KUBE_APISERVER"], ControllerManager: kv["KUBE_CONTROLLER_MANAGER"],
		Scheduler: kv["KUBE_SCHEDULER"], Kubelet: kv["KUBELET"], Proxy: kv["KUBE_PROXY"],
		Kubectl: kv["KUBECTL"], ContainerdDir: kv["CONTAINERD_DIR"], KubeRouter: kv["KUBE_ROUTER"],
		PauseArchive: kv["PAUSE_ARCHIVE"], CoreDNSArchive: kv["COREDNS_ARCHIVE"], CoreDNSImage: kv["COREDNS_IMAGE"], Helm: kv["HELM"],
	}
	for name, p := range map[string]string{"kube-apiserver": b.APIServer, "kube-controller-manager": b.ControllerManager,
		"kube-scheduler": b.Scheduler, "kubelet": b.Kubelet, "kube-proxy": b.Proxy, "kubectl": b.Kubectl,
		"containerd": b.ContainerdDir, "kube-router": b.KubeRouter, "pause image": b.PauseArchive,
		"CoreDNS image": b.CoreDNSArchive, "helm": b.Helm} {
		if p == "" {
			return Bins{}, fmt.Errorf("scripts/k8s-cluster.sh printed no %s", name)
		}
	}
	return b, nil
}
