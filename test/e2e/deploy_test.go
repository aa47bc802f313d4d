package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
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

// The deployment tier: deploy/kubernetes (kustomize overlays) and
// deploy/helm/dualflow (the chart with several value sets) are rendered
// in-process by test/deploy/render (kustomize's krusty and Helm's engine,
// a module of its own), checked object by object, applied to the real
// kube-apiserver with server-side apply (dry run, then for real, then once
// more as an upgrade that must change nothing), their pod templates
// admitted by Pod Security, and the collector's and exporter's
// ServiceAccounts, as deployed, given exactly the permissions they need.

const deployNS = "dualflow"

// deployCase is one way to install dualflow.
type deployCase struct {
	name        string
	args        []string // render's arguments
	embedded    bool     // the collector runs chDB (image dualflow-chdb, a PVC)
	tls         bool     // IPFIX over mutual TLS and the traceflow agents
	certManager bool     // cert-manager issues the TLS Secrets
	namespace   bool     // the Namespace is rendered (else created as docs/deploy.md says)
}

var deployCases = []deployCase{
	{name: "kustomize/embedded", args: []string{"kustomize", "../../deploy/kubernetes/overlays/embedded"}, embedded: true, namespace: true},
	{name: "kustomize/clickhouse-server", args: []string{"kustomize", "../../deploy/kubernetes/overlays/clickhouse-server"}, namespace: true},
	{name: "kustomize/cert-manager", args: []string{"kustomize", "../../deploy/kubernetes/overlays/cert-manager"}, embedded: true, tls: true, certManager: true, namespace: true},
	{name: "helm/defaults", args: []string{"helm", "../../deploy/helm/dualflow"}, embedded: true},
	{name: "helm/server", args: []string{"helm", "../../deploy/helm/dualflow",
		"--set", "store.mode=server,namespace.create=true",
		"--set", "collector.allowedSources={10.0.0.0/8,fd00::/8}",
		"--set", "collector.nodeSelector.kubernetes\\.io/os=linux",
		"--set", "exporter.nodeSelector.kubernetes\\.io/os=linux",
		"--set", "exporter.clusterCIDRs={10.244.0.0/16,fd00:10:244::/56}",
		"--set", "collector.resources.requests.memory=300Mi,collector.resources.limits.memory=600Mi",
		"--set", "web.allowedHosts={dualflow.example.com}",
		"--set", "image.repository=registry.example.com/dualflow,image.tag=v1.2.3"}, namespace: true},
	{name: "helm/tls-secrets", args: []string{"helm", "../../deploy/helm/dualflow",
		"--set", "tls.enabled=true,traceflow.enabled=true,exporter.source=ovs,networkPolicy.enabled=false"}, embedded: true, tls: true},
	{name: "helm/cert-manager", args: []string{"helm", "../../deploy/helm/dualflow",
		"--set", "namespace.create=true,tls.enabled=true,tls.certManager.enabled=true,traceflow.enabled=true,store.mode=server"}, tls: true, certManager: true, namespace: true},
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
	cmd := exec.Command(renderTool(t), c.args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("render %v: %v\n%s", c.args, err, stderr.String())
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
	if got := kinds["Namespace"] == 1; got != c.namespace {
		t.Errorf("Namespace rendered: %v, want %v", got, c.namespace)
	}
	if c.namespace {
		var ns corev1.Namespace
		find(t, objs, "Namespace", deployNS, &ns)
		if ns.Labels["pod-security.kubernetes.io/enforce"] != "privileged" {
			t.Errorf("namespace labels %v: the exporter needs enforce=privileged", ns.Labels)
		}
	}

	// RBAC: rbac.yaml's rules, bound to the collector only.
	var roles []rbacv1.ClusterRole
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" {
			var r rbacv1.ClusterRole
			find(t, objs, "ClusterRole", o.GetName(), &r)
			roles = append(roles, r)
		}
	}
	if len(roles) != 1 || !reflect.DeepEqual(roles[0].Rules, wantRules) {
		t.Errorf("ClusterRoles %+v, want one with rbac.yaml's rules %+v", roles, wantRules)
	}
	for _, o := range objs {
		if o.GetKind() != "ClusterRoleBinding" {
			continue
		}
		var b rbacv1.ClusterRoleBinding
		find(t, objs, "ClusterRoleBinding", o.GetName(), &b)
		if len(roles) == 1 && b.RoleRef.Name != roles[0].Name {
			t.Errorf("binding %s refers to %s", b.Name, b.RoleRef.Name)
		}
		if want := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "dualflow-collector", Namespace: deployNS}}; !reflect.DeepEqual(b.Subjects, want) {
			t.Errorf("binding %s subjects %+v, want %+v", b.Name, b.Subjects, want)
		}
	}
	var esa corev1.ServiceAccount
	if !find(t, objs, "ServiceAccount", "dualflow-exporter", &esa) || esa.AutomountServiceAccountToken == nil || *esa.AutomountServiceAccountToken {
		t.Errorf("exporter ServiceAccount %+v: want one with automountServiceAccountToken false", esa)
	}

	// The exporter: host network and PIDs, the four capabilities, every node.
	var ds appsv1.DaemonSet
	if !find(t, objs, "DaemonSet", "dualflow-exporter", &ds) {
		t.Fatal("no exporter DaemonSet")
	}
	ps := ds.Spec.Template.Spec
	if !ps.HostNetwork || !ps.HostPID || ps.DNSPolicy != corev1.DNSClusterFirstWithHostNet || ps.ServiceAccountName != "dualflow-exporter" ||
		ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Errorf("exporter pod: hostNetwork %v hostPID %v dns %s sa %s", ps.HostNetwork, ps.HostPID, ps.DNSPolicy, ps.ServiceAccountName)
	}
	if !slices.ContainsFunc(ps.Tolerations, func(t corev1.Toleration) bool { return t.Operator == corev1.TolerationOpExists && t.Key == "" }) {
		t.Errorf("exporter tolerations %+v: want one that tolerates every taint", ps.Tolerations)
	}
	ec := ps.Containers[0]
	sc := ec.SecurityContext
	if sc == nil || sc.Capabilities == nil || sc.Privileged == nil || *sc.Privileged ||
		!reflect.DeepEqual(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) ||
		!reflect.DeepEqual(sc.Capabilities.Add, []corev1.Capability{"NET_ADMIN", "NET_RAW", "SYS_ADMIN", "SYS_PTRACE"}) {
		t.Errorf("exporter securityContext %+v: want unprivileged, drop ALL, add NET_ADMIN NET_RAW SYS_ADMIN SYS_PTRACE", sc)
	}
	if ec.ReadinessProbe == nil || ec.ReadinessProbe.HTTPGet == nil || ec.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		ec.LivenessProbe == nil || ec.LivenessProbe.HTTPGet == nil || ec.LivenessProbe.HTTPGet.Path != "/healthz" ||
		ec.Resources.Requests.Memory().IsZero() || ec.Resources.Limits.Memory().IsZero() {
		t.Errorf("exporter probe %+v resources %+v", ec.ReadinessProbe, ec.Resources)
	}
	if !slices.ContainsFunc(ec.VolumeMounts, func(m corev1.VolumeMount) bool { return m.MountPath == "/run/netns" }) {
		t.Error("exporter does not mount /run/netns")
	}

	// The collector.
	var dep appsv1.Deployment
	if !find(t, objs, "Deployment", "dualflow-collector", &dep) {
		t.Fatal("no collector Deployment")
	}
	cp := dep.Spec.Template.Spec
	cc := cp.Containers[0]
	if cp.ServiceAccountName != "dualflow-collector" || dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
		t.Errorf("collector sa %s strategy %s", cp.ServiceAccountName, dep.Spec.Strategy.Type)
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
	image, _, _ := strings.Cut(cc.Image[strings.LastIndex(cc.Image, "/")+1:], ":")
	if want := map[bool]string{true: "dualflow-chdb", false: "dualflow"}[c.embedded]; image != want {
		t.Errorf("collector image %s, want %s", cc.Image, want)
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

	// TLS: the listener, the exporters' transport, the agents, and the
	// Secrets `dualflow certs` prints (or cert-manager issues).
	eargs := strings.Join(ec.Args, " ")
	tlsArgs := strings.Contains(args, "--collector.ipfix.tls-client-ca=") && strings.Contains(eargs, "--exporter.ipfix.transport=tls") &&
		strings.Contains(eargs, "--traceflow.addr=") && strings.Contains(eargs, "--traceflow.client-ca=") &&
		strings.Contains(args, "--traceflow.server-name=dualflow-agent") && strings.Contains(args, "--traceflow.token-file=")
	if tlsArgs != c.tls {
		t.Errorf("tls %v, but collector args %q exporter args %q", c.tls, args, eargs)
	}
	secrets := map[string]bool{}
	for _, v := range append(slices.Clone(cp.Volumes), ps.Volumes...) {
		if v.Secret != nil {
			secrets[v.Secret.SecretName] = true
		}
	}
	if c.tls {
		for _, s := range []string{"dualflow-collector-tls", "dualflow-exporter-tls", "dualflow-agent-tls", "dualflow-controller-tls", "dualflow-traceflow-token"} {
			if !secrets[s] {
				t.Errorf("Secret %s not mounted (mounted: %v)", s, secrets)
			}
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

	// Services: IPFIX on both transports (and TLS), the web.
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
}

// TestDeployKubeAPI applies every rendering to a real API server and
// checks the deployed ServiceAccounts' permissions.
func TestDeployKubeAPI(t *testing.T) {
	requireKubeAPI(t)
	for _, c := range deployCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			objs := render(t, c)
			s := startKubeAPI(t)
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			applyDeploy(t, ctx, s, c, objs)
			checkPodSecurity(t, ctx, s, objs)
			checkCollectorRights(t, ctx, s)
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

// applyDeploy applies objs with server-side apply: the Namespace (or the
// one docs/deploy.md has operators create), then every object as a dry
// run, for real, and twice more: the last must change nothing.
func applyDeploy(t *testing.T, ctx context.Context, s *kubeapi.Server, c deployCase, objs []*unstructured.Unstructured) {
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
	apply := func(o *unstructured.Unstructured, dryRun bool) (*unstructured.Unstructured, error) {
		m, err := mapper.RESTMapping(o.GroupVersionKind().GroupKind(), o.GroupVersionKind().Version)
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", o.GetKind(), o.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ri = dyn.Resource(m.Resource).Namespace(o.GetNamespace())
		}
		opts := metav1.ApplyOptions{FieldManager: "dualflow-deploy-test", Force: true}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		got, err := ri.Apply(ctx, o.GetName(), o, opts)
		if err != nil {
			return nil, fmt.Errorf("apply %s %s (dry run %v): %w", o.GetKind(), o.GetName(), dryRun, err)
		}
		return got, nil
	}
	if c.certManager {
		for _, crd := range decodeObjects(t, []byte(certManagerCRDs)) {
			if _, err := apply(crd, false); err != nil {
				t.Fatal(err)
			}
		}
		// wait until the API server serves the new kinds
		deadline := time.Now().Add(time.Minute)
		for {
			mapper.Reset()
			if _, err := mapper.RESTMapping(schema.GroupKind{Group: "cert-manager.io", Kind: "Certificate"}, "v1"); err == nil {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("cert-manager CRDs not served: %v", err)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	var rest []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "Namespace" {
			if _, err := apply(o, true); err != nil {
				t.Fatal(err)
			}
			if _, err := apply(o, false); err != nil {
				t.Fatal(err)
			}
			continue
		}
		rest = append(rest, o)
	}
	if !c.namespace {
		// docs/deploy.md: kubectl create namespace dualflow && kubectl label ...
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: deployNS, Labels: map[string]string{
			"pod-security.kubernetes.io/enforce": "privileged", "pod-security.kubernetes.io/audit": "baseline"}}}
		if _, err := s.Admin.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, o := range rest {
		if _, err := apply(o, true); err != nil {
			t.Fatal(err)
		}
	}
	versions := map[string]string{}
	for _, o := range rest {
		got, err := apply(o, false)
		if err != nil {
			t.Fatal(err)
		}
		versions[o.GetKind()+"/"+o.GetName()] = got.GetResourceVersion()
	}
	// An upgrade to the same manifests converges at once: applied again,
	// nothing changes, so nothing the server defaults fights what the
	// manifests say. (The first re-apply changes the PersistentVolumeClaim
	// once, as the server settles what it set at create; logged.)
	for round := 1; round <= 2; round++ {
		for _, o := range rest {
			got, err := apply(o, false)
			if err != nil {
				t.Fatal(err)
			}
			k := o.GetKind() + "/" + o.GetName()
			if v := got.GetResourceVersion(); v != versions[k] {
				if round == 1 {
					t.Logf("re-applying %s changed it once", k)
				} else {
					t.Errorf("applying %s a third time changed it again (resourceVersion %s -> %s)", k, versions[k], v)
				}
				versions[k] = v
			}
		}
	}
	t.Logf("applied %d objects (dry run, real, again)", len(objs))
}

// checkPodSecurity creates (dry run) a pod from each pod template: both
// are admitted in the dualflow namespace; in a namespace enforcing
// baseline, the collector is and the exporter is not (so the privileged
// label is what admits it, and the API server does enforce).
func checkPodSecurity(t *testing.T, ctx context.Context, s *kubeapi.Server, objs []*unstructured.Unstructured) {
	t.Helper()
	var ds appsv1.DaemonSet
	var dep appsv1.Deployment
	find(t, objs, "DaemonSet", "dualflow-exporter", &ds)
	find(t, objs, "Deployment", "dualflow-collector", &dep)
	const baselineNS, restrictedNS = "pss-baseline", "pss-restricted"
	for level, name := range map[string]string{"baseline": baselineNS, "restricted": restrictedNS} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pod-security.kubernetes.io/enforce": level}}}
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
	for _, tc := range []struct {
		name, ns string
		tpl      corev1.PodTemplateSpec
		admitted bool
	}{
		{"exporter", deployNS, ds.Spec.Template, true},
		{"collector", deployNS, dep.Spec.Template, true},
		{"collector", baselineNS, dep.Spec.Template, true},
		// Non-root, no capability, no escalation, RuntimeDefault seccomp.
		{"collector", restrictedNS, dep.Spec.Template, true},
		{"exporter", baselineNS, ds.Spec.Template, false},
	} {
		err := pod("dualflow-"+tc.name+"-probe", tc.ns, tc.tpl)
		if tc.admitted && err != nil {
			t.Errorf("%s pod in %s: %v", tc.name, tc.ns, err)
		}
		if !tc.admitted && (err == nil || !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), "baseline")) {
			t.Errorf("%s pod in %s: got %v, want refused by Pod Security (baseline)", tc.name, tc.ns, err)
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
func checkCollectorRights(t *testing.T, ctx context.Context, s *kubeapi.Server) {
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
