package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/test/kubeapi"
)

// The deployment tier. deploy/kubernetes (kustomize overlays) and
// deploy/helm/dualflow (the chart with several value sets) are
//   - rendered in-process by test/deploy/render (kustomize's krusty and
//     Helm's engine, a module of its own) and checked object by object
//     (TestDeployManifests), and
//   - installed with the real tools, `kubectl apply -k` and `helm install`,
//     exactly as docs/deploy.md tells an operator, into a real
//     kube-apiserver whose admission is a hardened cluster's (Pod Security
//     baseline by default, the system priority classes quota-limited);
//     installed again as an upgrade, which must change nothing; the
//     objects read back and checked; each pod template admitted (dry run);
//     and the collector's and exporter's ServiceAccounts, as deployed,
//     given exactly the permissions they need (TestDeployKubeAPI). Moving
//     from one tool to the other keeps every object (TestDeployMove).

const deployNS = "dualflow"

// chartDir is the Helm chart, from the repository's root (where the
// operator's commands run) and from this package.
const chartDir = "deploy/helm/dualflow"

// deployCase is one way to install dualflow.
type deployCase struct {
	name string
	// overlay is the kustomize overlay (kubectl apply -k); empty: the Helm
	// chart, with sets (helm install --set, one flag each).
	overlay string
	sets    []string
	// nsBefore is how the namespace was there before docs/deploy.md's
	// steps: "" missing, "kubectl" (kubectl create namespace, the README's
	// old first step) or "helm" (helm install --create-namespace).
	nsBefore            string
	embedded            bool   // the collector runs chDB (image dualflow-chdb, a PVC)
	tls                 bool   // IPFIX over mutual TLS
	traceflow           bool   // the traceflow node agents (and their privileges)
	certManager         bool   // cert-manager issues the TLS Secrets
	serverPVC           bool   // store.mode=server with its WAL and spool on a PVC
	exporterPri         string // the exporter's priority class ("-": none)
	collectorPri        string
	collectorArch       string // the collector's kubernetes.io/arch selector ("-": none; default amd64)
	imageRepo, imageTag string // default: dualflow, the chart's appVersion
	pullSecrets         []string
	ipfixPods           bool // networkPolicy.ipfixFrom empty: IPFIX from the exporter pods only
	noPolicy            bool // networkPolicy.enabled=false
	kubeAuth            bool // Kubernetes identities for the web (components/kubernetes-auth, web.kubernetesAuth)
}

var deployCases = []deployCase{
	{name: "kustomize/embedded", overlay: "deploy/kubernetes/overlays/embedded", embedded: true},
	{name: "kustomize/clickhouse-server", overlay: "deploy/kubernetes/overlays/clickhouse-server", nsBefore: "kubectl"},
	{name: "kustomize/cert-manager", overlay: "deploy/kubernetes/overlays/cert-manager", nsBefore: "helm", embedded: true, tls: true, traceflow: true, certManager: true, kubeAuth: true},
	{name: "helm/defaults", embedded: true},
	{name: "helm/server", nsBefore: "kubectl", sets: []string{
		"store.mode=server,store.server.persistence.enabled=true",
		"collector.allowedSources={10.0.0.0/8,fd00::/8}",
		"collector.priorityClassName=system-cluster-critical",
		`collector.nodeSelector.kubernetes\.io/arch=null`,
		"exporter.clusterCIDRs={10.244.0.0/16,fd00:10:244::/56}",
		"collector.resources.requests.memory=300Mi,collector.resources.limits.memory=600Mi",
		"web.allowedHosts={dualflow.example.com}",
		"networkPolicy.ipfixFrom=null",
		"imagePullSecrets={regcred}",
		"image.repository=registry.example.com/dualflow,image.tag=v1.2.3"},
		serverPVC: true, collectorPri: "system-cluster-critical", collectorArch: "-", ipfixPods: true,
		imageRepo: "registry.example.com/", imageTag: "v1.2.3", pullSecrets: []string{"regcred"}},
	{name: "helm/tls-secrets", nsBefore: "helm", sets: []string{"tls.enabled=true,traceflow.enabled=true,exporter.source=ovs,networkPolicy.enabled=false,web.kubernetesAuth.enabled=true"},
		embedded: true, tls: true, traceflow: true, noPolicy: true, kubeAuth: true},
	{name: "helm/cert-manager", nsBefore: "kubectl", sets: []string{"tls.enabled=true,tls.certManager.enabled=true,traceflow.enabled=true,store.mode=server"},
		tls: true, traceflow: true, certManager: true},
	{name: "helm/no-priority-class", sets: []string{"exporter.priorityClassName="}, embedded: true, exporterPri: "-"},
}

// helm reports whether c installs the chart.
func (c deployCase) helm() bool { return c.overlay == "" }

// renderArgs are test/deploy/render's arguments for c (paths from this
// package's directory).
func (c deployCase) renderArgs() []string {
	if !c.helm() {
		return []string{"kustomize", "../../" + c.overlay}
	}
	args := []string{"helm", "../../" + chartDir}
	for _, s := range c.sets {
		args = append(args, "--set", s)
	}
	return args
}

// helmArgs are `helm VERB dualflow CHART -n dualflow --set ...` for c.
func (c deployCase) helmArgs(verb string, extra ...string) []string {
	args := []string{verb, "dualflow", chartDir, "-n", deployNS}
	for _, s := range c.sets {
		args = append(args, "--set", s)
	}
	return append(args, extra...)
}

var (
	renderOnce sync.Once
	renderBin  string
	renderErr  error
)

// renderTool builds test/deploy/render once per test process.
func renderTool(t *testing.T) string {
	t.Helper()
	renderOnce.Do(func() {
		dir, err := os.MkdirTemp("", "dualflow-render-")
		if err != nil {
			renderErr = err
			return
		}
		renderBin = filepath.Join(dir, "render")
		cmd := exec.Command("go", "build", "-mod=readonly", "-o", renderBin, ".")
		cmd.Dir = "../deploy/render"
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			renderErr = fmt.Errorf("build test/deploy/render: %v\n%s", err, out)
		}
	})
	if renderErr != nil {
		t.Fatal(renderErr)
	}
	return renderBin
}

// render renders c and decodes its objects.
func render(t *testing.T, c deployCase) []*unstructured.Unstructured {
	t.Helper()
	cmd := exec.Command(renderTool(t), c.renderArgs()...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("render %v: %v\n%s", c.renderArgs(), err, stderr.String())
	}
	return decodeObjects(t, out)
}

func decodeObjects(t *testing.T, stream []byte) []*unstructured.Unstructured {
	t.Helper()
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(stream), 4096)
	var objs []*unstructured.Unstructured
	for {
		var m map[string]any
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("decode: %v", err)
		}
		if len(m) == 0 {
			continue
		}
		objs = append(objs, &unstructured.Unstructured{Object: m})
	}
}

// find returns the object of kind and name, converted into out.
func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string, out any) bool {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, out, true); err != nil {
				t.Fatalf("%s %s: %v", kind, name, err)
			}
			return true
		}
	}
	return false
}

// TestDeployManifests renders every overlay and value set and checks what
// the API server cannot: the collector's rules are rbac.yaml's, the
// exporter has none, capabilities, probes, images, TLS wiring.
func TestDeployManifests(t *testing.T) {
	t.Parallel() // renders only
	rbacObjs := decodeObjects(t, mustRead(t, rbacPath))
	var want rbacv1.ClusterRole
	if !find(t, rbacObjs, "ClusterRole", "dualflow-collector-enrich", &want) {
		t.Fatal("rbac.yaml has no ClusterRole")
	}
	for _, c := range deployCases {
		t.Run(c.name, func(t *testing.T) {
			objs := render(t, c)
			checkDeployObjects(t, c, objs, want.Rules)
		})
	}
	// The tag the manifests pin (checked above) is one `make image` gives.
	cmd := exec.Command("../../scripts/image.sh", "tags")
	cmd.Env = append(os.Environ(), "IMAGE_TAG=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("scripts/image.sh tags: %v", err)
	}
	if tags := strings.Fields(string(out)); !slices.Contains(tags, chartAppVersion(t)) {
		t.Errorf("make image tags %v, not the chart's appVersion %s that the manifests pin", tags, chartAppVersion(t))
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func checkDeployObjects(t *testing.T, c deployCase, objs []*unstructured.Unstructured, wantRules []rbacv1.PolicyRule) {
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.GetKind()]++
		switch o.GetKind() {
		case "Namespace", "ClusterRole", "ClusterRoleBinding":
		default:
			if o.GetNamespace() != deployNS {
				t.Errorf("%s %s in namespace %q, want %q", o.GetKind(), o.GetName(), o.GetNamespace(), deployNS)
			}
		}
		if o.GetKind() == "Role" || o.GetKind() == "RoleBinding" {
			t.Errorf("unexpected %s %s: the collector's rights are cluster-wide list/watch, the exporter has none", o.GetKind(), o.GetName())
		}
	}
	// kustomize carries the namespace (base/namespace.yaml, which Helm
	// installs apply first); the chart never does: Helm writes its release
	// into the namespace before it creates anything.
	if got := kinds["Namespace"] == 1; got == c.helm() {
		t.Errorf("Namespace among the objects: %v (helm %v)", got, c.helm())
	}
	if !c.helm() {
		var ns corev1.Namespace
		find(t, objs, "Namespace", deployNS, &ns)
		if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
			t.Errorf("namespace labels %v: the exporter needs enforce=privileged", ns.Labels)
		}
	}

	// RBAC: rbac.yaml's rules, bound to the collector only; with
	// Kubernetes identities, the users' two roles on dualflow.io (not
	// bound: the operator binds them) and the collector bound to
	// system:auth-delegator.
	var roles []rbacv1.ClusterRole
	userRoles := map[string]rbacv1.ClusterRole{}
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" {
			var r rbacv1.ClusterRole
			find(t, objs, "ClusterRole", o.GetName(), &r)
			switch o.GetName() {
			case "dualflow-operator", "dualflow-sql":
				userRoles[o.GetName()] = r
			default:
				roles = append(roles, r)
			}
		}
	}
	if len(roles) != 1 || !reflect.DeepEqual(roles[0].Rules, wantRules) {
		t.Errorf("ClusterRoles %+v, want one with rbac.yaml's rules %+v", roles, wantRules)
	}
	if c.kubeAuth {
		for name, res := range map[string]string{"dualflow-operator": "traceflows", "dualflow-sql": "sql"} {
			want := []rbacv1.PolicyRule{{APIGroups: []string{"dualflow.io"}, Resources: []string{res}, Verbs: []string{"create"}}}
			if r := userRoles[name]; !reflect.DeepEqual(r.Rules, want) {
				t.Errorf("ClusterRole %s rules %+v, want %+v", name, r.Rules, want)
			}
		}
		if l := userRoles["dualflow-operator"].Labels; l["rbac.authorization.k8s.io/aggregate-to-edit"] != "true" || l["rbac.authorization.k8s.io/aggregate-to-admin"] != "true" {
			t.Errorf("dualflow-operator labels %v: want it aggregated to edit and admin", l)
		}
		if len(userRoles["dualflow-sql"].Labels) > 0 && userRoles["dualflow-sql"].Labels["rbac.authorization.k8s.io/aggregate-to-edit"] != "" {
			t.Errorf("dualflow-sql is aggregated: %v", userRoles["dualflow-sql"].Labels)
		}
	} else if len(userRoles) > 0 {
		t.Errorf("ClusterRoles %v without Kubernetes identities", slices.Collect(maps.Keys(userRoles)))
	}
	delegated := false
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		var b rbacv1.ClusterRoleBinding
		find(t, objs, "ClusterRoleBinding", o.GetName(), &b)
		switch {
		case b.RoleRef.Name == "system:auth-delegator":
			delegated = true
		case len(roles) == 1 && b.RoleRef.Name != roles[0].Name:
			t.Errorf("binding %s refers to %s", b.Name, b.RoleRef.Name)
		}
		if want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "dualflow-collector", Namespace: deployNS}}; !reflect.DeepEqual(b.Subjects, want) {
			t.Errorf("binding %s subjects %+v, want %+v", b.Name, b.Subjects, want)
		}
	}
	if delegated != c.kubeAuth {
		t.Errorf("the collector bound to system:auth-delegator: %v, want %v (Kubernetes identities)", delegated, c.kubeAuth)
	}
	var esa corev1.ServiceAccount
	if !find(t, objs, "ServiceAccount", "dualflow-exporter", &esa) || esa.AutomountServiceAccountToken == nil || *esa.AutomountServiceAccountToken {
		t.Errorf("exporter ServiceAccount %+v: want one with automountServiceAccountToken false", esa)
	}

	// Both tools select the pods alike (name, instance, component), so
	// that either can take the other's objects over (TestDeployMove).
	selector := func(component string) map[string]string {
		return map[string]string{"app.kubernetes.io/name": "dualflow", "app.kubernetes.io/instance": "dualflow", "app.kubernetes.io/component": component}
	}

	// The exporter: the host network and NET_ADMIN; traceflow's
	// privileges (host PIDs, NET_RAW, SYS_ADMIN, SYS_PTRACE, /run/netns)
	// only with traceflow.
	var ds appsv1.DaemonSet
	if !find(t, objs, "DaemonSet", "dualflow-exporter", &ds) {
		t.Fatal("no exporter DaemonSet")
	}
	if ds.Spec.Selector == nil || !reflect.DeepEqual(ds.Spec.Selector.MatchLabels, selector("exporter")) {
		t.Errorf("exporter selector %+v, want %v", ds.Spec.Selector, selector("exporter"))
	}
	ps := ds.Spec.Template.Spec
	if !ps.HostNetwork || ps.HostPID != c.traceflow || ps.DNSPolicy != corev1.DNSClusterFirstWithHostNet || ps.ServiceAccountName != "dualflow-exporter" ||
		ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("exporter pod: hostNetwork %v hostPID %v (traceflow %v) dns %s sa %s", ps.HostNetwork, ps.HostPID, c.traceflow, ps.DNSPolicy, ps.ServiceAccountName)
	}
	if !slices.ContainsFunc(ps.Tolerations, func(t corev1.Toleration) bool { return t.Operator == corev1.TolerationOpExists && t.Key == "" }) {
		t.Errorf("exporter tolerations %+v: want one that tolerates every taint", ps.Tolerations)
	}
	wantPri := map[string]string{"": "system-node-critical", "-": ""}[c.exporterPri]
	if ps.PriorityClassName != wantPri {
		t.Errorf("exporter priorityClassName %q, want %q", ps.PriorityClassName, wantPri)
	}
	ec := ps.Containers[0]
	sc := ec.SecurityContext
	wantCaps := []corev1.Capability{"NET_ADMIN"}
	if c.traceflow {
		wantCaps = []corev1.Capability{"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE"}
	}
	if sc == nil || sc.Capabilities == nil || sc.Privileged == nil || *sc.Privileged ||
		!reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || !reflect.DeepEqual(sc.Capabilities.Add, wantCaps) {
		t.Errorf("exporter securityContext %+v: want unprivileged, drop ALL, add %v", sc, wantCaps)
	}
	if ec.ReadinessProbe == nil || ec.ReadinessProbe.HTTPGet == nil || ec.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		ec.LivenessProbe == nil || ec.LivenessProbe.HTTPGet == nil || ec.LivenessProbe.HTTPGet.Path != "/healthz" ||
		ec.Resources.Requests.Memory().IsZero() || ec.Resources.Limits.Memory().IsZero() {
		t.Errorf("exporter probe %+v resources %+v", ec.ReadinessProbe, ec.Resources)
	}
	netns := slices.ContainsFunc(ec.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/run/netns" }) ||
		slices.ContainsFunc(ps.Volumes, func(v corev1.Volume) bool { return v.HostPath != nil && v.HostPath.Path == "/run/netns" })
	if netns != c.traceflow {
		t.Errorf("exporter mounts the host's /run/netns: %v, want %v (traceflow)", netns, c.traceflow)
	}
	for _, v := range ps.Volumes {
		if v.HostPath != nil && v.HostPath.Path != "/run/netns" && v.HostPath.Path != "/var/run/openvswitch" && v.HostPath.Path != "/var/lib/dualflow/exporter" {
			t.Errorf("exporter mounts the host's %s", v.HostPath.Path)
		}
	}
	// The state directory: the handover between runs on the node, so that
	// a roll exports no connection twice.
	state := slices.ContainsFunc(ps.Volumes, func(v corev1.Volume) bool {
		return v.HostPath != nil && v.HostPath.Path == "/var/lib/dualflow/exporter"
	}) && slices.Contains(ec.Args, "--exporter.state-dir=/var/lib/dualflow-exporter") &&
		slices.ContainsFunc(ec.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/var/lib/dualflow-exporter" && !m.ReadOnly })
	if !state {
		t.Errorf("exporter has no state directory (hostPath /var/lib/dualflow/exporter at /var/lib/dualflow-exporter, --exporter.state-dir): args %v", ec.Args)
	}

	// The collector.
	var dep appsv1.Deployment
	if !find(t, objs, "Deployment", "dualflow-collector", &dep) {
		t.Fatal("no collector Deployment")
	}
	if dep.Spec.Selector == nil || !reflect.DeepEqual(dep.Spec.Selector.MatchLabels, selector("collector")) {
		t.Errorf("collector selector %+v, want %v", dep.Spec.Selector, selector("collector"))
	}
	cp := dep.Spec.Template.Spec
	cc := cp.Containers[0]
	if cp.ServiceAccountName != "dualflow-collector" || dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("collector sa %s strategy %s", cp.ServiceAccountName, dep.Spec.Strategy.Type)
	}
	if cp.PriorityClassName != c.collectorPri {
		t.Errorf("collector priorityClassName %q, want %q", cp.PriorityClassName, c.collectorPri)
	}
	// The images are linux/amd64 only; each key can be overridden.
	for who, sel := range map[string]map[string]string{"exporter": ps.NodeSelector, "collector": cp.NodeSelector} {
		want := map[string]string{"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
		if who == "collector" && c.collectorArch == "-" {
			delete(want, "kubernetes.io/arch")
		}
		if !reflect.DeepEqual(sel, want) {
			t.Errorf("%s nodeSelector %v, want %v", who, sel, want)
		}
	}
	// Images: pinned to the release `make image` tags, pulled with the
	// Secrets given.
	repo, tag := c.imageRepo, c.imageTag
	if tag == "" {
		tag = chartAppVersion(t)
	}
	for who, pod := range map[string]corev1.PodSpec{"exporter": ps, "collector": cp} {
		img := map[string]string{"exporter": "dualflow", "collector": map[bool]string{true: "dualflow-chdb", false: "dualflow"}[c.embedded]}[who]
		if want := repo + img + ":" + tag; pod.Containers[0].Image != want || pod.Containers[0].ImagePullPolicy != corev1.PullIfNotPresent {
			t.Errorf("%s image %s (%s), want %s (IfNotPresent)", who, pod.Containers[0].Image, pod.Containers[0].ImagePullPolicy, want)
		}
		var secrets []string
		for _, s := range pod.ImagePullSecrets {
			secrets = append(secrets, s.Name)
		}
		if !slices.Equal(secrets, c.pullSecrets) {
			t.Errorf("%s imagePullSecrets %v, want %v", who, secrets, c.pullSecrets)
		}
	}
	if psc := cp.SecurityContext; psc == nil || psc.RunAsUser == nil || *psc.RunAsUser != 65532 || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot ||
		psc.FSGroup == nil || *psc.FSGroup != 65532 {
		t.Errorf("collector pod security context %+v: want the image's non-root user 65532 with fsGroup 65532", psc)
	}
	for _, v := range cp.Volumes {
		if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode != 0o440) {
			t.Errorf("collector Secret volume %s: mode %v, want 0440 (owner and the fsGroup)", v.Name, v.Secret.DefaultMode)
		}
	}
	if cc.ReadinessProbe == nil || cc.ReadinessProbe.HTTPGet == nil || cc.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		cc.LivenessProbe == nil || cc.LivenessProbe.HTTPGet == nil || cc.LivenessProbe.HTTPGet.Path != "/healthz" {
		t.Errorf("collector probes: readiness %+v liveness %+v", cc.ReadinessProbe, cc.LivenessProbe)
	}
	if csc := cc.SecurityContext; csc == nil || csc.Capabilities == nil || !reflect.DeepEqual(csc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		len(csc.Capabilities.Add) != 0 || csc.AllowPrivilegeEscalation == nil || *csc.AllowPrivilegeEscalation {
		t.Errorf("collector securityContext %+v: want no capability, no privilege escalation", csc)
	}
	args := strings.Join(cc.Args, " ")
	hasPVC := slices.ContainsFunc(cp.Volumes, func(v corev1.Volume) bool { return v.PersistentVolumeClaim != nil })
	if c.embedded != (strings.Contains(args, "--clickhouse.data-dir=") && hasPVC && kinds["PersistentVolumeClaim"] == 1) {
		t.Errorf("embedded %v but args %q, PVC volume %v, PVCs %d", c.embedded, args, hasPVC, kinds["PersistentVolumeClaim"])
	}
	if !c.embedded && (!strings.Contains(args, "--clickhouse.dsn=$(CLICKHOUSE_DSN)") ||
		!slices.ContainsFunc(cc.Env, func(e corev1.EnvVar) bool { return e.Name == "DUALFLOW_CLICKHOUSE_PASSWORD" && e.ValueFrom != nil })) {
		t.Errorf("server store: args %q env %+v: want the DSN and password from a Secret", args, cc.Env)
	}
	for _, a := range []string{"--web.addr=:8080", "--web.tokens-file=", "--metrics-addr=:9464", "--k8s.source=in-cluster"} {
		if !strings.Contains(args, a) {
			t.Errorf("collector args %q lack %s", args, a)
		}
	}
	// The write-ahead log, on a volume: a crash loses nothing it held. The
	// embedded store keeps it beside its data directory by default; with a
	// DSN it is off unless --collector.wal.dir is set.
	walDir := ""
	for _, a := range cc.Args {
		if v, ok := strings.CutPrefix(a, "--clickhouse.data-dir="); ok && walDir == "" {
			walDir = filepath.Join(filepath.Dir(v), "wal")
		}
		if v, ok := strings.CutPrefix(a, "--collector.wal.dir="); ok {
			walDir = v
		}
	}
	var walVol *corev1.Volume
	for _, m := range cc.VolumeMounts {
		if walDir != "" && strings.HasPrefix(walDir, strings.TrimSuffix(m.MountPath, "/")+"/") && !m.ReadOnly {
			for i := range cp.Volumes {
				if cp.Volumes[i].Name == m.Name {
					walVol = &cp.Volumes[i]
				}
			}
		}
	}
	switch {
	case walVol == nil || walDir == "off":
		t.Errorf("collector write-ahead log %q is on no writable volume (args %q)", walDir, args)
	case (c.embedded || c.serverPVC) != (walVol.PersistentVolumeClaim != nil) || (walVol.PersistentVolumeClaim == nil && walVol.EmptyDir == nil):
		t.Errorf("collector write-ahead log %s on volume %+v, want a PersistentVolumeClaim: %v, else an emptyDir", walDir, walVol.VolumeSource, c.embedded || c.serverPVC)
	}

	// TLS: the listener, the exporters' transport, and the Secrets `dualflow
	// certs` prints (or cert-manager issues); the traceflow agents.
	eargs := strings.Join(ec.Args, " ")
	tlsArgs := strings.Contains(args, "--collector.ipfix.tls-client-ca=") && strings.Contains(eargs, "--exporter.ipfix.transport=tls")
	if tlsArgs != c.tls {
		t.Errorf("tls %v, but collector args %q exporter args %q", c.tls, args, eargs)
	}
	agentArgs := strings.Contains(eargs, "--traceflow.addr=") && strings.Contains(eargs, "--traceflow.client-ca=") &&
		strings.Contains(args, "--traceflow.server-name=dualflow-agent") && strings.Contains(args, "--traceflow.token-file=")
	if agentArgs != c.traceflow || strings.Contains(eargs+args, "--traceflow.") != c.traceflow {
		t.Errorf("traceflow %v, but collector args %q exporter args %q", c.traceflow, args, eargs)
	}
	secrets := map[string]bool{}
	for _, v := range append(slices.Clone(cp.Volumes), ps.Volumes...) {
		if v.Secret != nil {
			secrets[v.Secret.SecretName] = true
		}
	}
	var wantSecrets []string
	if c.tls {
		wantSecrets = append(wantSecrets, "dualflow-collector-tls", "dualflow-exporter-tls")
	}
	if c.traceflow {
		wantSecrets = append(wantSecrets, "dualflow-agent-tls", "dualflow-controller-tls", "dualflow-traceflow-token")
	}
	for _, s := range wantSecrets {
		if !secrets[s] {
			t.Errorf("Secret %s not mounted (mounted: %v)", s, secrets)
		}
	}
	if c.certManager {
		issued := map[string]bool{}
		for _, o := range objs {
			if o.GetKind() == "Certificate" {
				n, _, _ := unstructured.NestedString(o.Object, "spec", "secretName")
				issued[n] = true
			}
		}
		for s := range secrets {
			if strings.HasSuffix(s, "-tls") && !issued[s] {
				t.Errorf("Secret %s is mounted but no Certificate issues it (issued: %v)", s, issued)
			}
		}
	}

	// The pods' priority classes are covered by a ResourceQuota (clusters
	// that keep them from other namespaces admit them so).
	var classes []string
	for _, p := range []string{ps.PriorityClassName, cp.PriorityClassName} {
		if p != "" && !slices.Contains(classes, p) {
			classes = append(classes, p)
		}
	}
	var quota corev1.ResourceQuota
	hasQuota := find(t, objs, "ResourceQuota", "dualflow-critical-pods", &quota)
	switch {
	case hasQuota != (len(classes) > 0):
		t.Errorf("ResourceQuota dualflow-critical-pods: %v, priority classes %v", hasQuota, classes)
	case hasQuota:
		var scoped []string
		if quota.Spec.ScopeSelector != nil {
			for _, e := range quota.Spec.ScopeSelector.MatchExpressions {
				if e.ScopeName == corev1.ResourceQuotaScopePriorityClass && e.Operator == corev1.ScopeSelectorOpIn {
					scoped = append(scoped, e.Values...)
				}
			}
		}
		if !slices.Equal(scoped, classes) || quota.Spec.Hard.Pods().Value() < 1000 {
			t.Errorf("ResourceQuota scoped to %v with %v pods, want the classes %v and room for every node", scoped, quota.Spec.Hard.Pods(), classes)
		}
	}

	// Services: IPFIX on both transports (and TLS), the web; the
	// collector's pods, selected as the Deployment does.
	var svc corev1.Service
	if !find(t, objs, "Service", "dualflow-collector", &svc) {
		t.Fatal("no collector Service")
	}
	var ports []string
	for _, p := range svc.Spec.Ports {
		ports = append(ports, fmt.Sprintf("%s/%d", p.Protocol, p.Port))
	}
	want := []string{"TCP/4739", "UDP/4739"}
	if c.tls {
		want = append(want, "TCP/4740")
	}
	if !reflect.DeepEqual(ports, want) {
		t.Errorf("collector Service ports %v, want %v", ports, want)
	}
	var web corev1.Service
	if !find(t, objs, "Service", "dualflow-web", &web) || web.Spec.Ports[0].Port != 8080 {
		t.Errorf("web Service %+v", web.Spec.Ports)
	}
	for _, s := range []corev1.Service{svc, web} {
		if !reflect.DeepEqual(s.Spec.Selector, selector("collector")) {
			t.Errorf("Service %s selects %v, want %v", s.Name, s.Spec.Selector, selector("collector"))
		}
	}

	// The NetworkPolicy: every rule names its sources (a rule without any
	// admits every source); IPFIX from the exporter pods when no network
	// is given.
	var np networkingv1.NetworkPolicy
	if !find(t, objs, "NetworkPolicy", "dualflow-collector", &np) {
		if !c.noPolicy {
			t.Error("no NetworkPolicy dualflow-collector")
		}
		return
	}
	if !reflect.DeepEqual(np.Spec.PodSelector.MatchLabels, selector("collector")) {
		t.Errorf("NetworkPolicy selects %v, want %v", np.Spec.PodSelector.MatchLabels, selector("collector"))
	}
	for i, r := range np.Spec.Ingress {
		if len(r.From) == 0 {
			t.Errorf("NetworkPolicy rule %d (ports %+v) has no source: it admits every one", i, r.Ports)
		}
	}
	if len(np.Spec.Ingress) > 0 {
		from := np.Spec.Ingress[0].From
		pods := len(from) == 1 && from[0].PodSelector != nil && from[0].NamespaceSelector == nil && from[0].IPBlock == nil &&
			reflect.DeepEqual(from[0].PodSelector.MatchLabels, selector("exporter"))
		if pods != c.ipfixPods {
			t.Errorf("IPFIX from %+v: the exporter pods only %v, want %v", from, pods, c.ipfixPods)
		}
	}
}

// chartAppVersion is deploy/helm/dualflow's appVersion: the images' tag.
func chartAppVersion(t *testing.T) string {
	t.Helper()
	for line := range strings.SplitSeq(string(mustRead(t, "../../"+chartDir+"/Chart.yaml")), "\n") {
		if v, ok := strings.CutPrefix(line, "appVersion:"); ok {
			return strings.Trim(strings.TrimSpace(v), `"`)
		}
	}
	t.Fatal("no appVersion in Chart.yaml")
	return ""
}

// TestDeployKubeAPI installs each case with the real tool, as
// docs/deploy.md says, into a real API server whose admission is a
// hardened cluster's (startDeployKubeAPI), then checks what the server
// holds, what it admits and the deployed ServiceAccounts' permissions.
func TestDeployKubeAPI(t *testing.T) {
	requireKubeAPI(t)
	t.Parallel() // each case its own API server and operator HOME
	rbacObjs := decodeObjects(t, mustRead(t, rbacPath))
	var want rbacv1.ClusterRole
	if !find(t, rbacObjs, "ClusterRole", "dualflow-collector-enrich", &want) {
		t.Fatal("rbac.yaml has no ClusterRole")
	}
	helmBin(t) // built once, before the parallel cases
	kubectlBin(t)
	for _, c := range deployCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := startDeployKubeAPI(t)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			op := newOperator(t, s)
			objs := installDeploy(t, ctx, op, c)
			checkDeployObjects(t, c, objs, want.Rules)
			if n := settleQuotas(t, ctx, s, deployNS); n > 0 {
				t.Logf("%d ResourceQuota's status filled in, as the quota controller would", n)
			}
			checkPodSecurity(t, ctx, s, objs)
			checkCollectorRights(t, ctx, s, c.kubeAuth)
			checkExporterRights(t, ctx, s)
		})
	}
}

// certManagerCRDs are stand-ins for cert-manager's CRDs (Issuer and
// Certificate, cert-manager.io/v1, namespaced) so that the API server
// accepts the objects: their kinds, versions and scope are checked, their
// fields are not (the schema is cert-manager's).
const certManagerCRDs = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: issuers.cert-manager.io}
spec:
  group: cert-manager.io
  scope: Namespaced
  names: {plural: issuers, singular: issuer, kind: Issuer, listKind: IssuerList}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: certificates.cert-manager.io}
spec:
  group: cert-manager.io
  scope: Namespaced
  names: {plural: certificates, singular: certificate, kind: Certificate, listKind: CertificateList}
  versions:
    - name: v1
      served: true
      storage: true
      schema: {openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}}
`

// installDeploy installs c with its tool and returns the objects the
// server holds for it, read back:
//   - the namespace is first as c.nsBefore says; Helm must refuse to
//     install into it (missing, or without the Pod Security label) with
//     the command that fixes it;
//   - docs/deploy.md's steps: the namespace manifest, the web tokens
//     Secret, then `kubectl apply -k` (a server-side dry run first) or
//     `helm install`;
//   - the same again (`kubectl apply -k`, `helm upgrade` with the same
//     values), twice, changes no object.
func installDeploy(t *testing.T, ctx context.Context, op *operator, c deployCase) []*unstructured.Unstructured {
	t.Helper()
	if c.certManager {
		if _, err := op.run(certManagerCRDs, "kubectl", "apply", "-f", "-"); err != nil {
			t.Fatal(err)
		}
		op.must("kubectl", "wait", "--for=condition=Established", "--timeout=2m", "crd/issuers.cert-manager.io", "crd/certificates.cert-manager.io")
	}
	switch c.nsBefore {
	case "kubectl":
		op.must("kubectl", "create", "namespace", deployNS)
	case "helm":
		// What `helm install --create-namespace` leaves: the namespace,
		// labelled name=dualflow only (made here with the check off, then
		// uninstalled).
		op.must("helm", "install", "dualflow", chartDir, "-n", deployNS, "--create-namespace", "--set", "namespace.requirePrivileged=false")
		op.must("helm", "uninstall", "dualflow", "-n", deployNS)
	}
	if c.helm() {
		// Any install into a namespace that would refuse the exporter, and
		// the old docs' first command, stop with what to do.
		want := `is admitted only at "privileged"`
		if c.nsBefore == "" {
			want = "does not exist"
		}
		op.refused(want, "helm", c.helmArgs("install", "--create-namespace")...)
		if c.name == "helm/defaults" {
			op.refused("kubectl apply -f deploy/kubernetes/base/namespace.yaml", "helm", c.helmArgs("install")...)
			op.refused("namespace.create is gone", "helm", c.helmArgs("install", "--set", "namespace.create=true")...)
		}
	}
	op.prepare()
	var manifest string
	if c.helm() {
		op.must("helm", c.helmArgs("install")...)
		manifest = op.must("helm", "get", "manifest", "dualflow", "-n", deployNS)
	} else {
		op.must("kubectl", "apply", "-k", c.overlay, "--dry-run=server")
		op.must("kubectl", "apply", "-k", c.overlay)
		manifest = op.must("kubectl", "kustomize", c.overlay)
	}
	objs := readBack(t, ctx, op.s, decodeObjects(t, []byte(manifest)))
	versions := map[string]string{}
	for _, o := range objs {
		versions[o.GetKind()+"/"+o.GetName()] = o.GetResourceVersion()
	}
	// An upgrade to the same manifests converges at once: installed again,
	// nothing changes, so nothing the server defaults fights what the
	// manifests say. (Helm's first server-side upgrade writes the
	// PersistentVolumeClaim once more, unchanged but for its
	// resourceVersion; logged.)
	for round := 1; round <= 2; round++ {
		if c.helm() {
			op.must("helm", c.helmArgs("upgrade")...)
		} else {
			op.must("kubectl", "apply", "-k", c.overlay)
		}
		objs = readBack(t, ctx, op.s, decodeObjects(t, []byte(manifest)))
		for _, o := range objs {
			k := o.GetKind() + "/" + o.GetName()
			if v := o.GetResourceVersion(); v != versions[k] {
				if round == 1 && o.GetKind() == "PersistentVolumeClaim" {
					t.Logf("installing %s again wrote it once more", k)
				} else {
					t.Errorf("installing %s again (round %d) changed it (resourceVersion %s -> %s)", k, round, versions[k], v)
				}
				versions[k] = v
			}
		}
	}
	t.Logf("installed %d objects, and again without a change", len(objs))
	return objs
}

// readBack gets each object of a manifest from the server.
func readBack(t *testing.T, ctx context.Context, s *kubeapi.Server, objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	t.Helper()
	cfg, err := s.RESTConfig()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	var out []*unstructured.Unstructured
	for _, o := range objs {
		m, err := mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			t.Fatalf("%s %s: %v", o.GetKind(), o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := o.GetNamespace()
			if ns == "" {
				ns = deployNS
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		got, err := ri.Get(ctx, o.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("installed %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		out = append(out, got)
	}
	return out
}

// checkPodSecurity creates (dry run) a pod from each pod template. Both
// are admitted in the dualflow namespace (Pod Security "privileged", the
// exporter's priority class covered by its quota). Elsewhere the API
// server does enforce: in a namespace at the cluster's default (baseline)
// or enforcing baseline the exporter is refused, the collector meets even
// restricted; and in a privileged namespace without the quota an exporter
// of a system priority class is refused.
func checkPodSecurity(t *testing.T, ctx context.Context, s *kubeapi.Server, objs []*unstructured.Unstructured) {
	t.Helper()
	var ds appsv1.DaemonSet
	var dep appsv1.Deployment
	find(t, objs, "DaemonSet", "dualflow-exporter", &ds)
	find(t, objs, "Deployment", "dualflow-collector", &dep)
	const defaultNS, baselineNS, restrictedNS, noQuotaNS = "pss-default", "pss-baseline", "pss-restricted", "no-quota"
	for name, level := range map[string]string{defaultNS: "", baselineNS: "baseline", restrictedNS: "restricted", noQuotaNS: "privileged"} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if level != "" {
			ns.Labels = map[string]string{"pod-security.kubernetes.io/enforce": level}
		}
		if _, err := s.Admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		for _, sa := range []string{"dualflow-collector", "dualflow-exporter"} {
			if _, err := s.Admin.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatal(err)
			}
		}
	}
	pod := func(name, ns string, tpl corev1.PodTemplateSpec) error {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: tpl.Labels}, Spec: tpl.Spec}
		p.Spec.NodeName = "node-1"
		_, err := s.Admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	// quotaRefusal is what a namespace without the quota answers a pod of
	// tpl's priority class.
	quotaRefusal := func(tpl corev1.PodTemplateSpec) string {
		if slices.Contains([]string{"system-node-critical", "system-cluster-critical"}, tpl.Spec.PriorityClassName) {
			return "insufficient quota to match these scopes"
		}
		return ""
	}
	// unprioritized is tpl without its priority class: Pod Security alone
	// decides.
	unprioritized := func(tpl corev1.PodTemplateSpec) corev1.PodTemplateSpec {
		tpl = *tpl.DeepCopy()
		tpl.Spec.PriorityClassName = ""
		return tpl
	}
	for _, tc := range []struct {
		name, ns string
		tpl      corev1.PodTemplateSpec
		refusal  string // "" admitted
	}{
		{"exporter", deployNS, ds.Spec.Template, ""},
		{"collector", deployNS, dep.Spec.Template, ""},
		{"collector", defaultNS, unprioritized(dep.Spec.Template), ""},
		// Non-root, no capability, no escalation, RuntimeDefault seccomp.
		{"collector", restrictedNS, unprioritized(dep.Spec.Template), ""},
		{"exporter", defaultNS, unprioritized(ds.Spec.Template), `violates PodSecurity "baseline:latest"`},
		{"exporter", baselineNS, unprioritized(ds.Spec.Template), `violates PodSecurity "baseline:latest"`},
		{"exporter", noQuotaNS, ds.Spec.Template, quotaRefusal(ds.Spec.Template)},
		{"collector", noQuotaNS, dep.Spec.Template, quotaRefusal(dep.Spec.Template)},
	} {
		err := pod("dualflow-"+tc.name+"-probe", tc.ns, tc.tpl)
		switch {
		case tc.refusal == "" && err != nil:
			t.Errorf("%s pod in %s: %v", tc.name, tc.ns, err)
		case tc.refusal != "" && (err == nil || !strings.Contains(err.Error(), tc.refusal)):
			t.Errorf("%s pod in %s: got %v, want refused: %s", tc.name, tc.ns, err, tc.refusal)
		}
	}
}

// saClient returns a clientset and kubeconfig authenticated as the
// deployed ServiceAccount (a TokenRequest token).
func saClient(t *testing.T, ctx context.Context, s *kubeapi.Server, name string) (kubernetes.Interface, string) {
	t.Helper()
	kc, err := s.ServiceAccountKubeconfig(ctx, nil, deployNS, name)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kc)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs, kc
}

// access is one SelfSubjectAccessReview question.
type access struct{ verb, group, resource string }

func (a access) String() string {
	return fmt.Sprintf("%s %s", a.verb, schema.GroupResource{Group: a.group, Resource: a.resource})
}

// checkAccess asks the API server what the client may do.
func checkAccess(t *testing.T, ctx context.Context, cs kubernetes.Interface, who string, allowed bool, list []access) {
	t.Helper()
	for _, a := range list {
		r, err := cs.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.verb, Group: a.group, Resource: a.resource}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("%s: access review %s: %v", who, a, err)
		}
		if r.Status.Allowed != allowed {
			t.Errorf("%s may %s: %v, want %v (%s)", who, a, r.Status.Allowed, allowed, r.Status.Reason)
		}
	}
}

// denied lists what neither ServiceAccount may do.
var denied = []access{
	{"get", "", "pods"}, {"create", "", "pods"}, {"delete", "", "pods"}, {"patch", "", "nodes"},
	{"list", "", "secrets"}, {"get", "", "secrets"}, {"watch", "", "secrets"}, {"list", "", "configmaps"},
	{"create", "", "pods/exec"}, {"create", "", "serviceaccounts/token"}, {"update", "networking.k8s.io", "networkpolicies"},
	{"list", "apps", "deployments"}, {"list", "apps", "daemonsets"}, {"list", "rbac.authorization.k8s.io", "clusterroles"},
	{"impersonate", "", "users"}, {"create", "apps", "deployments"},
}

// checkCollectorRights: list and watch on exactly rbac.yaml's kinds, and
// the real enrichment syncs with the deployed ServiceAccount's token.
func checkCollectorRights(t *testing.T, ctx context.Context, s *kubeapi.Server, kubeAuth bool) {
	t.Helper()
	cs, kc := saClient(t, ctx, s, "dualflow-collector")
	var allowed []access
	for _, r := range []struct{ group, resource string }{
		{"", "pods"}, {"", "services"}, {"", "nodes"}, {"", "namespaces"}, {"discovery.k8s.io", "endpointslices"},
		{"apps", "replicasets"}, {"batch", "jobs"}, {"networking.k8s.io", "networkpolicies"},
	} {
		allowed = append(allowed, access{"list", r.group, r.resource}, access{"watch", r.group, r.resource})
	}
	checkAccess(t, ctx, cs, "collector", true, allowed)
	// Kubernetes identities: ask who a token is and what its user may
	// do, and nothing else.
	reviews := []access{{"create", "authentication.k8s.io", "tokenreviews"}, {"create", "authorization.k8s.io", "subjectaccessreviews"}}
	checkAccess(t, ctx, cs, "collector", kubeAuth, reviews)
	checkAccess(t, ctx, cs, "collector", false, denied)
	if _, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); err != nil {
		t.Errorf("collector: list pods: %v", err)
	}
	if _, err := cs.CoreV1().Secrets(deployNS).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("collector: list secrets: got %v, want 403", err)
	}
	_, err := cs.CoreV1().Pods(deployNS).Patch(ctx, "x", types.MergePatchType, []byte(`{}`), metav1.PatchOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("collector: patch pod: got %v, want 403", err)
	}
	// The collector's own enrichment, as in the pod, with this token.
	e := startKubeEnricher(t, kc)
	snap := e.Snapshot()
	if !slices.ContainsFunc(snap.Namespaces, func(n *enrich.Namespace) bool { return n.Name == deployNS }) {
		t.Errorf("the enrichment synced but does not see namespace %s", deployNS)
	}
}

// checkExporterRights: the exporter's ServiceAccount may do nothing of
// the API beyond what every authenticated client may (discovery, access
// reviews).
func checkExporterRights(t *testing.T, ctx context.Context, s *kubeapi.Server) {
	t.Helper()
	cs, _ := saClient(t, ctx, s, "dualflow-exporter")
	var none []access
	for _, r := range []struct{ group, resource string }{
		{"", "pods"}, {"", "services"}, {"", "nodes"}, {"", "namespaces"}, {"discovery.k8s.io", "endpointslices"}, {"networking.k8s.io", "networkpolicies"},
	} {
		none = append(none, access{"list", r.group, r.resource}, access{"watch", r.group, r.resource})
	}
	checkAccess(t, ctx, cs, "exporter", false, append(none, denied...))
	if _, err := cs.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("exporter: list pods: got %v, want 403", err)
	}
}
