package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dualflow/dualflow/test/kubeapi"
)

// The deployment tier's real tools: the helm CLI (scripts/helm.sh, the
// helm.sh/helm/v4 pinned in test/deploy/render) and kubectl
// (scripts/k8s-cluster.sh kubectl, the pinned k8s.io/kubernetes), run as
// an operator runs them against the real kube-apiserver.

// deployAdmission is the API server's admission configuration in the
// deployment tier, as on a hardened cluster: Pod Security enforces
// "baseline" where a namespace says nothing, and pods of the system
// priority classes are admitted only in namespaces whose ResourceQuota
// covers the class (what GKE does outside kube-system).
const deployAdmission = `apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
  - name: PodSecurity
    configuration:
      apiVersion: pod-security.admission.config.k8s.io/v1
      kind: PodSecurityConfiguration
      defaults: {enforce: baseline, enforce-version: latest, audit: baseline, audit-version: latest, warn: baseline, warn-version: latest}
      exemptions: {usernames: [], runtimeClasses: [], namespaces: []}
  - name: ResourceQuota
    configuration:
      apiVersion: apiserver.config.k8s.io/v1
      kind: ResourceQuotaConfiguration
      limitedResources:
        - resource: pods
          matchScopes:
            - {scopeName: PriorityClass, operator: In, values: [system-node-critical, system-cluster-critical]}
`

// startDeployKubeAPI starts an API server with deployAdmission.
func startDeployKubeAPI(t *testing.T) *kubeapi.Server {
	t.Helper()
	requireKubeAPI(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "admission.yaml")
	if err := os.WriteFile(cfg, []byte(deployAdmission), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	start := time.Now()
	s, err := kubeapi.Start(ctx, kubeapi.Options{Dir: dir, ExtraArgs: []string{"--admission-control-config-file", cfg}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	t.Logf("kube-apiserver (default Pod Security baseline, system priority classes quota-limited) ready in %v (started in %v)",
		s.Started.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
	return s
}

// toolPath runs a build script that prints the tool's path (building it
// the first time), once per test process.
type toolPath struct {
	once sync.Once
	path string
	err  error
}

var helmTool, kubectlTool toolPath

func (tp *toolPath) get(t *testing.T, name string, build func() (string, error)) string {
	t.Helper()
	tp.once.Do(func() { tp.path, tp.err = build() })
	if tp.err != nil {
		if os.Getenv("DUALFLOW_E2E") == "1" {
			t.Fatalf("%s: %v (DUALFLOW_E2E=1 requires it)", name, tp.err)
		}
		t.Skipf("%s: %v", name, tp.err)
	}
	return tp.path
}

// helmBin is the pinned helm CLI (scripts/helm.sh builds it once).
func helmBin(t *testing.T) string {
	return helmTool.get(t, "helm", func() (string, error) {
		out, err := exec.Command("../../scripts/helm.sh").Output()
		if err != nil {
			return "", fmt.Errorf("scripts/helm.sh: %w", err)
		}
		return strings.TrimSpace(string(out)), nil
	})
}

// kubectlBin is the pinned kubectl (scripts/k8s-cluster.sh kubectl).
func kubectlBin(t *testing.T) string {
	return kubectlTool.get(t, "kubectl", func() (string, error) {
		out, err := exec.Command("../../scripts/k8s-cluster.sh", "kubectl").Output()
		if err != nil {
			return "", fmt.Errorf("scripts/k8s-cluster.sh kubectl: %w", err)
		}
		for line := range strings.SplitSeq(string(out), "\n") {
			if p, ok := strings.CutPrefix(line, "KUBECTL="); ok {
				return p, nil
			}
		}
		return "", fmt.Errorf("scripts/k8s-cluster.sh kubectl printed no KUBECTL=: %q", out)
	})
}

// operator runs helm and kubectl from the repository's root, as
// docs/deploy.md has an operator do, against one API server with the
// admin's kubeconfig; HOME is its own (kubectl's discovery cache, helm's
// configuration), so that nothing of the machine's is read or written.
type operator struct {
	t             *testing.T
	s             *kubeapi.Server
	helm, kubectl string
	home          string
}

func newOperator(t *testing.T, s *kubeapi.Server) *operator {
	t.Helper()
	return &operator{t: t, s: s, helm: helmBin(t), kubectl: kubectlBin(t), home: t.TempDir()}
}

// run runs the tool with args and stdin, and returns its combined output.
func (o *operator) run(stdin string, tool string, args ...string) (string, error) {
	o.t.Helper()
	bin := map[string]string{"helm": o.helm, "kubectl": o.kubectl}[tool]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = "../.."
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+o.s.AdminKubeconfig, "HOME="+o.home,
		"HELM_CONFIG_HOME="+filepath.Join(o.home, "helm", "config"), "HELM_CACHE_HOME="+filepath.Join(o.home, "helm", "cache"),
		"HELM_DATA_HOME="+filepath.Join(o.home, "helm", "data"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	o.t.Logf("$ %s %s (%v)\n%s", tool, strings.Join(args, " "), time.Since(start).Round(time.Millisecond), strings.TrimRight(out.String(), "\n"))
	if err != nil {
		return out.String(), fmt.Errorf("%s %s: %w\n%s", tool, strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// must runs the tool and fails the test on an error.
func (o *operator) must(tool string, args ...string) string {
	o.t.Helper()
	out, err := o.run("", tool, args...)
	if err != nil {
		o.t.Fatal(err)
	}
	return out
}

// refused runs the tool, which must fail saying want.
func (o *operator) refused(want string, tool string, args ...string) {
	o.t.Helper()
	out, err := o.run("", tool, args...)
	if err == nil {
		o.t.Fatalf("%s %v succeeded, want it refused with %q", tool, args, want)
	}
	if !strings.Contains(out, want) {
		o.t.Fatalf("%s %v failed without saying %q:\n%s", tool, args, want, out)
	}
}

// prepare is docs/deploy.md's Install, up to the manifests: the
// namespace, labelled for Pod Security (whatever made it before), and the
// web tokens Secret.
func (o *operator) prepare() {
	o.t.Helper()
	o.must("kubectl", "apply", "-f", "deploy/kubernetes/base/namespace.yaml")
	tokens := filepath.Join(o.home, "tokens")
	if err := os.WriteFile(tokens, []byte("0123456789abcdef0123456789abcdef operator admin\n"), 0o600); err != nil {
		o.t.Fatal(err)
	}
	o.must("kubectl", "-n", deployNS, "create", "secret", "generic", "dualflow-web-tokens", "--from-file=tokens="+tokens)
}

// settleQuotas does what kube-controller-manager's quota controller does
// first (this tier runs none): it fills in each ResourceQuota's status,
// without which the API server refuses the pods the quota covers ("status
// unknown for quota").
func settleQuotas(t *testing.T, ctx context.Context, s *kubeapi.Server, ns string) int {
	t.Helper()
	qs, err := s.Admin.CoreV1().ResourceQuotas(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range qs.Items {
		q := &qs.Items[i]
		q.Status.Hard = q.Spec.Hard
		q.Status.Used = corev1.ResourceList{}
		for r := range q.Spec.Hard {
			q.Status.Used[r] = resource.MustParse("0")
		}
		if _, err := s.Admin.CoreV1().ResourceQuotas(ns).UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return len(qs.Items)
}
