package cluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// ImageArchives builds dualflow's images with scripts/image.sh (make
// image) under tag and writes them to dir as docker-archives named
// localhost/dualflow:tag and localhost/dualflow-chdb:tag, for
// Config.Images.
func ImageArchives(ctx context.Context, tag, dir string) ([]string, error) {
	script := filepath.Join(RepoRoot(), "scripts", "image.sh")
	cmd := exec.CommandContext(ctx, script)
	cmd.Env = append(os.Environ(), "IMAGE_TAG="+tag, "IMAGE_ARCHIVE=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("scripts/image.sh: %w\n%s", err, out)
	}
	var out []string
	for _, img := range []string{"dualflow", "dualflow-chdb"} {
		name := "localhost/" + img + ":" + tag
		f := filepath.Join(dir, img+"-"+tag+".tar")
		os.Remove(f)
		if b, err := exec.CommandContext(ctx, script, "buildah", "push", "-q", name, "docker-archive:"+f+":"+name).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("export %s: %w\n%s", name, err, b)
		}
		out = append(out, f)
	}
	return out, nil
}

// Install is dualflow installed in the cluster.
type Install struct {
	c *Cluster
	// Namespace is dualflow's namespace.
	Namespace string
	// Token is an operator token of the web API.
	Token string
}

// Installer is a way to install dualflow, as docs/deploy.md gives it.
type Installer string

const (
	// Kustomize: `kubectl apply -k` of an operator's overlay on
	// deploy/kubernetes/overlays/embedded.
	Kustomize Installer = "kustomize"
	// Helm: `helm install` of deploy/helm/dualflow (embedded store).
	Helm Installer = "helm"
)

// Install installs dualflow the way docs/deploy.md tells an operator: the
// labelled namespace (deploy/kubernetes/base/namespace.yaml), a web tokens
// Secret, a PersistentVolume for the collector's claim (a directory on the
// host, as a local volume provisioner would give), the TLS Secrets from
// `dualflow certs` and a traceflow token, then the chart (tls.enabled,
// traceflow.enabled) or the embedded overlay with components tls and
// traceflow, with the images built under tag and the collector
// NetworkPolicy's IPFIX sources narrowed to the nodes' networks. It waits
// until the collector and every exporter are ready.
func (c *Cluster) Install(ctx context.Context, how Installer, tag string) (*Install, error) {
	in := &Install{c: c, Namespace: "dualflow"}
	b := make([]byte, 24)
	rand.Read(b)
	in.Token = hex.EncodeToString(b)
	dir := filepath.Join(c.cfg.Dir, "install")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "tokens"), []byte(in.Token+" operator admin\n"), 0o600); err != nil {
		return nil, err
	}
	pv := filepath.Join(c.cfg.Dir, "pv", "dualflow-data")
	if err := os.MkdirAll(pv, 0o700); err != nil {
		return nil, err
	}
	// The image's user owns the volume, as a provisioner's would be.
	if err := os.Chown(pv, 65532, 65532); err != nil {
		return nil, err
	}
	pvYAML := fmt.Sprintf(`apiVersion: v1
kind: PersistentVolume
metadata: {name: dualflow-data}
spec:
  capacity: {storage: 20Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  hostPath: {path: %s, type: Directory}
`, pv)
	repo := RepoRoot()
	steps := []struct {
		stdin string
		args  []string
	}{
		{pvYAML, []string{"apply", "-f", "-"}},
		{"", []string{"apply", "-f", filepath.Join(repo, "deploy", "kubernetes", "base", "namespace.yaml")}},
		{"", []string{"-n", in.Namespace, "create", "secret", "generic", "dualflow-web-tokens", "--from-file=tokens=" + filepath.Join(dir, "tokens")}},
	}
	// The TLS Secrets: `dualflow certs` prints the kubectl commands that
	// store them; run them as printed.
	os.RemoveAll(filepath.Join(dir, "certs"))
	out, err := exec.CommandContext(ctx, DualflowBin(), "certs", "--out", filepath.Join(dir, "certs"), "--namespace", in.Namespace).CombinedOutput()
	certs := string(out)
	if err != nil {
		return nil, fmt.Errorf("dualflow certs: %w\n%s", err, certs)
	}
	for _, line := range strings.Split(certs, "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[0] == "kubectl" && slices.Contains(f, "secret") {
			steps = append(steps, struct {
				stdin string
				args  []string
			}{"", f[1:]})
		}
	}
	if len(steps) != 3+4 {
		return nil, fmt.Errorf("dualflow certs printed %d kubectl commands, want 4:\n%s", len(steps)-3, certs)
	}
	rand.Read(b)
	steps = append(steps, struct {
		stdin string
		args  []string
	}{"", []string{"-n", in.Namespace, "create", "secret", "generic", "dualflow-traceflow-token", "--from-literal=token=" + hex.EncodeToString(b)}})
	for _, s := range steps {
		if _, err := c.Kubectl(ctx, strings.NewReader(s.stdin), s.args...); err != nil {
			return nil, err
		}
	}
	// docs/deploy.md: narrow the collector NetworkPolicy's IPFIX sources
	// to the nodes' networks. The exporters use the host network, so
	// their IPFIX comes from node addresses; the default private ranges
	// miss nodes that have other addresses (these, or public and global
	// IPv6 ones), and an enforcing implementation drops their IPFIX.
	nets := make([]string, 0, 2)
	for _, n := range c.plan.nodeNets() {
		nets = append(nets, n.String())
	}
	// The exporters' state directory (hostPath): this cluster's own, as
	// its nodes share this machine's filesystem with other clusters'
	// nodes of the same names.
	state := filepath.Join(c.cfg.Dir, "exporter-state")
	switch how {
	case Helm:
		if _, err := c.Exec(ctx, nil, c.cfg.Bins.Helm, "install", "dualflow", filepath.Join(repo, "deploy", "helm", "dualflow"),
			"-n", in.Namespace, "--set", "image.repository=localhost/dualflow,image.chdbRepository=localhost/dualflow-chdb,image.tag="+tag,
			"--set", "tls.enabled=true,traceflow.enabled=true",
			"--set", "exporter.stateHostPath="+state,
			"--set", "networkPolicy.ipfixFrom={"+strings.Join(nets, ",")+"}"); err != nil {
			return nil, err
		}
	case Kustomize:
		// kustomize takes resources relative to the kustomization only.
		base, err := filepath.Rel(dir, filepath.Join(repo, "deploy", "kubernetes", "overlays", "embedded"))
		if err != nil {
			return nil, err
		}
		var from []string
		for _, n := range nets {
			from = append(from, fmt.Sprintf("{ipBlock: {cidr: %s}}", n))
		}
		kustomization := fmt.Sprintf(`apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - %s
components:
  - %s
  - %s
images:
  - {name: dualflow, newName: localhost/dualflow, newTag: %q}
  - {name: dualflow-chdb, newName: localhost/dualflow-chdb, newTag: %q}
patches:
  - target: {kind: NetworkPolicy, name: dualflow-collector}
    patch: |-
      - op: replace
        path: /spec/ingress/0/from
        value: [%s]
  - target: {kind: DaemonSet, name: dualflow-exporter}
    patch: |-
      - op: test
        path: /spec/template/spec/volumes/1/name
        value: state
      - op: replace
        path: /spec/template/spec/volumes/1/hostPath/path
        value: %s
`, base, filepath.Join(base, "..", "..", "components", "tls"), filepath.Join(base, "..", "..", "components", "traceflow"),
			tag, tag, strings.Join(from, ", "), state)
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(kustomization), 0o600); err != nil {
			return nil, err
		}
		if _, err := c.Kubectl(ctx, nil, "apply", "-k", dir); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("install: unknown way %q", how)
	}
	return in, in.WaitReady(ctx)
}

// WaitReady waits until the collector and every exporter are ready.
func (in *Install) WaitReady(ctx context.Context) error {
	for _, w := range []string{"deployment/dualflow-collector", "daemonset/dualflow-exporter"} {
		if _, err := in.c.Kubectl(ctx, nil, "-n", in.Namespace, "rollout", "status", w, "--timeout=5m"); err != nil {
			out, _ := in.c.Kubectl(ctx, nil, "-n", in.Namespace, "get", "pods,events", "-o", "wide")
			return fmt.Errorf("%w\n%s", err, out)
		}
	}
	return nil
}

// DualflowBin is the dualflow CLI of this tree: $DUALFLOW_BIN (make
// test-cluster sets it), else bin/dualflow (make build).
func DualflowBin() string {
	if p := os.Getenv("DUALFLOW_BIN"); p != "" {
		return p
	}
	return filepath.Join(RepoRoot(), "bin", "dualflow")
}

type tokenTransport struct {
	token string
	base  http.RoundTripper
}

func (t *tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+t.token)
	return t.base.RoundTrip(r)
}
