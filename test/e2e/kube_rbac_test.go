package e2e

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dualflow/dualflow/internal/certs"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/test/kubeapi"
	"github.com/dualflow/dualflow/web/api"
)

// kubeAuthRBACPath is the shipped RBAC of Kubernetes identities: the
// collector's auth-delegator binding and the users' ClusterRoles.
const kubeAuthRBACPath = "../../deploy/kubernetes/components/kubernetes-auth/rbac.yaml"

// rbacTTL is the collector's review cache in TestKubeRBAC: a revoked
// RoleBinding must stop access within it (plus a request's time).
const rbacTTL = 2 * time.Second

// rbacUsers are TestKubeRBAC's bindings, beside the shipped roles:
// alice reads every namespace and may trace (dualflow-operator); bob
// may list pods in frontend only; the ServiceAccount dashboards/grafana
// reads every namespace and may run SQL (dualflow-sql).
const rbacUsers = `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pod-reader}
rules: [{apiGroups: [""], resources: [pods], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: alice-pod-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: alice-dualflow-operator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: dualflow-operator}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bob-pod-reader, namespace: frontend}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: bob}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: grafana, namespace: dashboards}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: grafana-pod-reader}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-reader}
subjects: [{kind: ServiceAccount, name: grafana, namespace: dashboards}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: grafana-dualflow-sql}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: dualflow-sql}
subjects: [{kind: ServiceAccount, name: grafana, namespace: dashboards}]
`

// TestKubeRBAC runs the collector binary with --web.kubernetes-auth
// against a real kube-apiserver, in each lab mode (the web on the mode's
// loopback), with the shipped RBAC (the collector's auth-delegator
// binding, dualflow-operator, dualflow-sql) and two users and a
// ServiceAccount bound differently. Over HTTPS, through REST:
//   - a user's permissions are RBAC's: reading needs list pods in every
//     namespace, a trace create on traceflows.dualflow.io, SQL create on
//     sql.dualflow.io; each 403 names what is missing;
//   - a ServiceAccount token with the collector's audience works, one
//     with a foreign audience and an expired one (signed by the API
//     server's key, otherwise valid) are refused;
//   - X-Remote-User is trusted only from a client certificate of the
//     request-header CA with an allowed name;
//   - a deleted ClusterRoleBinding stops access within the cache TTL;
//   - the UI's polling makes at most one review per TTL and permission;
//   - the API server down fails closed: 503.
func TestKubeRBAC(t *testing.T) {
	requireKubeAPI(t)
	t.Parallel()
	bin := buildBinary(t)
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			r := newRBACEnv(t, mode, bin)
			alice, bob := r.kube.Token("alice"), r.kube.Token("bob")
			grafana := r.saToken(t, "dashboards", "grafana", "dualflow")

			t.Run("no credential", func(t *testing.T) {
				r.expect(t, r.client, "GET", "/api/v1/flows?limit=1", nil, nil, 401, "bearer token is required")
			})
			t.Run("alice reads and traces, no SQL", func(t *testing.T) {
				var who map[string]any
				r.call(t, r.client, "GET", "/api/v1/whoami", bearer(alice), nil, 200, &who)
				if who["name"] != "alice" || who["role"] != "kubernetes" {
					t.Errorf("whoami %v", who)
				}
				r.expect(t, r.client, "GET", "/api/v1/flows?limit=1", bearer(alice), nil, 200, "")
				r.expect(t, r.client, "POST", "/api/v1/sql", bearer(alice), api.SQLRequest{Query: "SELECT 1"}, 403, "create on sql.dualflow.io")
				r.expectAllowed(t, "POST", "/api/v1/traceflows", bearer(alice), map[string]any{})
			})
			t.Run("bob may list pods in one namespace only", func(t *testing.T) {
				// He reads frontend's flows (TestNamespaceScope in web/api
				// checks the rows), not the views of every namespace.
				var who map[string]any
				r.call(t, r.client, "GET", "/api/v1/whoami", bearer(bob), nil, 200, &who)
				if ns, _ := who["namespaces"].([]any); len(ns) != 1 || ns[0] != manifest.NSFrontend {
					t.Errorf("bob's whoami %v: want namespaces [%s]", who, manifest.NSFrontend)
				}
				r.expect(t, r.client, "GET", "/api/v1/flows?limit=1", bearer(bob), nil, 200, "")
				r.expect(t, r.client, "GET", "/api/v1/audit/findings", bearer(bob), nil, 200, "")
				r.expect(t, r.client, "GET", "/api/v1/audit/unprotected", bearer(bob), nil, 200, "")
				r.expect(t, r.client, "GET", "/api/v1/status", bearer(bob), nil, 403, "list on pods in all namespaces")
				// A matrix of frontend's ends is his; one with an end in
				// backend is not.
				web := map[string]any{"kind": "workload", "namespace": manifest.NSFrontend, "name": "web"}
				backend := map[string]any{"kind": "workload", "namespace": manifest.NSBackend, "name": "api"}
				r.expect(t, r.client, "POST", "/api/v1/reachability", bearer(bob), map[string]any{"sources": []any{web}, "destinations": []any{web}}, 200, "")
				r.expect(t, r.client, "POST", "/api/v1/reachability", bearer(bob), map[string]any{"sources": []any{web}, "destinations": []any{backend}}, 403,
					`destinations[0] is in namespace \"`+manifest.NSBackend+`\", where you may not list pods`)
				r.expect(t, r.client, "POST", "/api/v1/traceflows", bearer(bob), map[string]any{}, 403, "create on traceflows.dualflow.io")
				r.expect(t, r.client, "POST", "/api/v1/sql", bearer(bob), api.SQLRequest{Query: "SELECT 1"}, 403, "sql.dualflow.io")
			})
			t.Run("bob's pages say what his namespace leaves him", func(t *testing.T) {
				// The UI with bob's token, as he would paste it: the
				// header names him and his namespace, a note under it
				// says what he sees, and the SQL page why he may not run
				// SQL. (The web's certificate is the test CA's.)
				u := &uiEnv{mode: mode, base: r.web}
				u.startBrowser(t, requireChromium(t), bob, chromedp.Flag("ignore-certificate-errors", true))
				u.do(t, chromedp.Navigate(u.base+"/#/flows"))
				u.wait(t, "bob's header and note", time.Minute,
					`document.querySelector('#whoami').textContent === 'bob (Kubernetes: `+manifest.NSFrontend+`)' && !document.querySelector('#scope-note').hidden &&
					 document.querySelector('#scope-note').textContent.includes('list pods in the namespace `+manifest.NSFrontend+` only')`,
					`[document.querySelector('#whoami').textContent, document.querySelector('#scope-note').textContent]`)
				u.do(t, chromedp.Navigate(u.base+"/#/sql"))
				u.wait(t, "the SQL page's refusal", time.Minute,
					`!document.querySelector('#sql-denied').hidden && document.querySelector('#sql-denied').textContent.includes('create on sql.dualflow.io') &&
					 document.querySelector('#sql-form button[type=submit]').disabled`,
					`[document.querySelector('#sql-denied').textContent, document.querySelector('#sql-form button[type=submit]').disabled]`)
				u.screenshot(t, "kube-rbac-bob-sql")
				u.noConsoleErrors(t)
			})
			t.Run("ServiceAccount tokens and audiences", func(t *testing.T) {
				var res api.SQLResult
				r.call(t, r.client, "POST", "/api/v1/sql", bearer(grafana), api.SQLRequest{Query: "SELECT 1"}, 200, &res)
				if len(res.Rows) != 1 {
					t.Errorf("SELECT 1: %v", res.Rows)
				}
				foreign := r.saToken(t, "dashboards", "grafana", "some-other-service")
				r.expect(t, r.client, "GET", "/api/v1/flows?limit=1", bearer(foreign), nil, 401, "refused by Kubernetes")
				// The same claims signed by the API server's key: valid
				// until its expiry, refused after.
				r.expect(t, r.client, "GET", "/api/v1/flows?limit=1", bearer(r.signedSAToken(t, "dashboards", "grafana", time.Hour)), nil, 200, "")
				r.expect(t, r.client, "GET", "/api/v1/flows?limit=1", bearer(r.signedSAToken(t, "dashboards", "grafana", -time.Minute)), nil, 401, "refused by Kubernetes")
			})
			t.Run("proxy headers need the proxy's certificate", func(t *testing.T) {
				forged := map[string]string{"X-Remote-User": "alice", "X-Remote-Group": "system:masters"}
				r.expect(t, r.client, "GET", "/api/v1/flows?limit=1", forged, nil, 401, "")
				r.expect(t, r.clientWith(t, r.rogueDir, certs.ControllerFile, certs.ControllerKeyFile), "GET", "/api/v1/flows?limit=1", forged, nil, 401, "")
				// Signed by the right CA, but not a name allowed.
				r.expect(t, r.clientWith(t, r.certDir, certs.ExporterFile, certs.ExporterKeyFile), "GET", "/api/v1/flows?limit=1", forged, nil, 401, "")
				proxy := r.clientWith(t, r.certDir, certs.ControllerFile, certs.ControllerKeyFile)
				var who map[string]any
				r.call(t, proxy, "GET", "/api/v1/whoami", map[string]string{"X-Remote-User": "alice"}, nil, 200, &who)
				if who["name"] != "alice" {
					t.Errorf("whoami through the proxy %v", who)
				}
				r.expect(t, proxy, "GET", "/api/v1/status", map[string]string{"X-Remote-User": "bob"}, nil, 403, "list on pods in all namespaces")
				// The proxy is trusted for the groups too, as the
				// kube-apiserver trusts it: RBAC judges what it says.
				r.expect(t, proxy, "GET", "/api/v1/status", map[string]string{"X-Remote-User": "bob", "X-Remote-Group": "system:masters"}, nil, 200, "")
			})
			t.Run("CLI with a Kubernetes token", func(t *testing.T) {
				cli := func(token string, args ...string) (string, error) {
					cmd := exec.Command(bin, append(args, "--server", r.web, "--ca-file", filepath.Join(r.certDir, certs.CAFile))...)
					cmd.Env = append(os.Environ(), "DUALFLOW_TOKEN="+token)
					out, err := cmd.CombinedOutput()
					return string(out), err
				}
				if out, err := cli(alice, "audit", "unprotected"); err != nil || !strings.Contains(out, manifest.NSBackend) {
					t.Errorf("dualflow audit as alice: %v\n%s", err, out)
				}
				// bob's namespace only.
				if out, err := cli(bob, "audit", "unprotected"); err != nil || !strings.Contains(out, manifest.NSFrontend) || strings.Contains(out, manifest.NSBackend) {
					t.Errorf("dualflow audit as bob: %v, want frontend's workloads only:\n%s", err, out)
				}
				if out, err := cli(bob, "policy", "recommend", "--namespace", manifest.NSFrontend); err == nil || !strings.Contains(out, "list on pods in all namespaces") {
					t.Errorf("dualflow policy recommend as bob: %v, want the missing permission named:\n%s", err, out)
				}
			})
			t.Run("the web's certificate and the proxy CA are reloaded files", func(t *testing.T) {
				resp, err := http.Get(r.metrics)
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				for _, name := range []string{"web-tls", "web-requestheader-ca"} {
					if !strings.Contains(string(b), `dualflow_file_reloads_total{name="`+name+`"}`) {
						t.Errorf("no reload metrics of %s", name)
					}
				}
			})
			t.Run("UI polling makes one review per TTL", func(t *testing.T) {
				before := r.reviews(t)
				start := time.Now()
				n := 0
				for time.Since(start) < 3*rbacTTL {
					r.expect(t, r.client, "GET", "/api/v1/flows?limit=1", bearer(alice), nil, 200, "")
					n++
					time.Sleep(100 * time.Millisecond) // the pace of a polling page, not a wait for a condition
				}
				el := time.Since(start)
				after := r.reviews(t)
				tr, sar := after["tokenreview"]-before["tokenreview"], after["subjectaccessreview"]-before["subjectaccessreview"]
				most := int(el/rbacTTL) + 2
				t.Logf("%s: %d requests of one user in %v: %d TokenReviews, %d SubjectAccessReviews (TTL %v)", mode, n, el.Round(time.Millisecond), tr, sar, rbacTTL)
				if tr > most || sar > most {
					t.Errorf("%d TokenReviews and %d SubjectAccessReviews for %d requests in %v: want at most %d each", tr, sar, n, el, most)
				}
			})
			t.Run("a deleted binding stops access within the TTL", func(t *testing.T) {
				r.expectAllowed(t, "POST", "/api/v1/traceflows", bearer(alice), map[string]any{})
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				defer cancel()
				if err := r.kube.Admin.RbacV1().ClusterRoleBindings().Delete(ctx, "alice-dualflow-operator", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				deleted := time.Now()
				for {
					code, body := r.do(t, r.client, "POST", "/api/v1/traceflows", bearer(alice), map[string]any{})
					if code == 403 {
						if !strings.Contains(body, "traceflows.dualflow.io") {
							t.Errorf("403 %s does not name the permission", body)
						}
						break
					}
					if time.Since(deleted) > rbacTTL+20*time.Second {
						t.Fatalf("still %d %s %v after the binding was deleted (TTL %v)", code, body, time.Since(deleted), rbacTTL)
					}
					time.Sleep(100 * time.Millisecond)
				}
				took := time.Since(deleted)
				t.Logf("%s: trace refused %v after its ClusterRoleBinding was deleted (TTL %v)", mode, took.Round(time.Millisecond), rbacTTL)
				if took > rbacTTL+5*time.Second {
					t.Errorf("revocation took %v, more than the TTL %v and 5 s", took, rbacTTL)
				}
			})
			t.Run("API server down fails closed", func(t *testing.T) {
				fresh := r.saToken(t, "dashboards", "grafana", "dualflow") // never reviewed: not cached
				r.kube.Kill()
				t.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
					defer cancel()
					if err := r.kube.Restart(ctx); err != nil {
						t.Errorf("restart: %v", err)
					}
				})
				r.expect(t, r.client, "GET", "/api/v1/flows?limit=1", bearer(fresh), nil, 503, "Kubernetes API did not answer")
				// A user reviewed before: 503 once the cached answers expire.
				deadline := time.Now().Add(rbacTTL + 30*time.Second)
				for {
					code, body := r.do(t, r.client, "GET", "/api/v1/flows?limit=1", bearer(alice), nil)
					if code == 503 {
						break
					}
					if code != 200 || time.Now().After(deadline) {
						t.Fatalf("alice with the API server down: %d %s", code, body)
					}
					time.Sleep(200 * time.Millisecond)
				}
			})
		})
	}
}

// rbacEnv is one mode's API server and collector with Kubernetes
// identities.
type rbacEnv struct {
	kube         *kubeapi.Server
	web, metrics string
	certDir      string // the CA of the web's certificate and of the proxy's
	rogueDir     string // another CA's certificates
	client       *http.Client
	roots        *x509.CertPool
}

func newRBACEnv(t *testing.T, mode manifest.Mode, bin string) *rbacEnv {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	kube, err := kubeapi.Start(ctx, kubeapi.Options{Dir: t.TempDir(), Users: []kubeapi.User{{Name: "alice"}, {Name: "bob"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kube.Stop)
	r := &rbacEnv{kube: kube, certDir: t.TempDir(), rogueDir: t.TempDir()}
	m, err := manifest.Generate(manifest.Spec{Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	publish(t, kube, m, lab.OrderForward, 1)
	kc := collectorKubeconfig(t, kube)
	for _, f := range []string{kubeAuthRBACPath} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := kube.Apply(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	if err := kube.Apply(ctx, []byte(rbacUsers)); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.Issue(certs.Options{Dir: r.certDir, CollectorIPs: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}}); err != nil {
		t.Fatal(err)
	}
	if _, err := certs.Issue(certs.Options{Dir: r.rogueDir}); err != nil {
		t.Fatal(err)
	}
	r.roots = x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(r.certDir, certs.CAFile))
	if err != nil || !r.roots.AppendCertsFromPEM(ca) {
		t.Fatalf("CA: %v", err)
	}
	r.client = &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.roots}}}
	addr := "[::1]:0"
	if mode == manifest.ModeIPv4 {
		addr = "127.0.0.1:0"
	}
	p := startCollectorProcess(t, bin, mode, kc,
		"--web.addr", addr,
		"--web.kubernetes-auth",
		"--web.kubernetes-auth.audiences", "dualflow,"+kubeapi.Issuer,
		"--web.kubernetes-auth.cache-ttl", rbacTTL.String(),
		"--web.tls-cert", filepath.Join(r.certDir, certs.CollectorFile),
		"--web.tls-key", filepath.Join(r.certDir, certs.CollectorKeyFile),
		"--web.requestheader-client-ca", filepath.Join(r.certDir, certs.CAFile),
		"--web.requestheader-allowed-names", "dualflow-collector-traceflow")
	if !strings.HasPrefix(p.web, "https://") {
		t.Fatalf("web %s: want https", p.web)
	}
	r.web, r.metrics = p.web, p.metrics
	return r
}

func bearer(tok string) map[string]string { return map[string]string{"Authorization": "Bearer " + tok} }

// clientWith is a client presenting the certificate of dir's files.
func (r *rbacEnv) clientWith(t *testing.T, dir, cert, key string) *http.Client {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, cert), filepath.Join(dir, key))
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: r.roots, Certificates: []tls.Certificate{pair}}}}
}

// do makes a request and returns its status and body.
func (r *rbacEnv) do(t *testing.T, c *http.Client, method, path string, headers map[string]string, body any) (int, string) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, r.web+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// expect checks a request's status and that its body holds want.
func (r *rbacEnv) expect(t *testing.T, c *http.Client, method, path string, headers map[string]string, body any, code int, want string) {
	t.Helper()
	got, b := r.do(t, c, method, path, headers, body)
	if got != code || !strings.Contains(b, want) {
		t.Errorf("%s %s: %d %s; want %d with %q", method, path, got, b, code, want)
	}
}

// call expects code and decodes the answer into out.
func (r *rbacEnv) call(t *testing.T, c *http.Client, method, path string, headers map[string]string, body any, code int, out any) {
	t.Helper()
	got, b := r.do(t, c, method, path, headers, body)
	if got != code {
		t.Fatalf("%s %s: %d %s; want %d", method, path, got, b, code)
	}
	if err := json.Unmarshal([]byte(b), out); err != nil {
		t.Fatalf("%s %s: %v: %s", method, path, err, b)
	}
}

// expectAllowed checks that a request passes authorization: whatever it
// answers (a trace with no agents is 501, a bad one 400), not 401 or 403.
func (r *rbacEnv) expectAllowed(t *testing.T, method, path string, headers map[string]string, body any) {
	t.Helper()
	if code, b := r.do(t, r.client, method, path, headers, body); code == 401 || code == 403 || code == 503 {
		t.Errorf("%s %s: %d %s; want it authorized", method, path, code, b)
	}
}

// saToken is a TokenRequest token of a ServiceAccount for audience.
func (r *rbacEnv) saToken(t *testing.T, ns, name, audience string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tr, err := r.kube.Admin.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{Audiences: []string{audience}, ExpirationSeconds: new(int64(3600))},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return tr.Status.Token
}

// signedSAToken signs a ServiceAccount token with the API server's key,
// as the TokenRequest API does, for the collector's audience, expiring
// in ttl (negative: expired already). The TokenRequest API refuses
// expirations under 10 minutes, so an expired token is made this way.
func (r *rbacEnv) signedSAToken(t *testing.T, ns, name string, ttl time.Duration) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sa, err := r.kube.Admin.CoreV1().ServiceAccounts(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(r.kube.ServiceAccountKey())
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	key := k.(*rsa.PrivateKey)
	now := time.Now()
	claims := map[string]any{
		"iss": kubeapi.Issuer, "aud": []string{"dualflow"}, "sub": "system:serviceaccount:" + ns + ":" + name,
		"iat": now.Add(-2 * time.Hour).Unix(), "nbf": now.Add(-2 * time.Hour).Unix(), "exp": now.Add(ttl).Unix(),
		"kubernetes.io": map[string]any{"namespace": ns, "serviceaccount": map[string]any{"name": name, "uid": string(sa.UID)}},
	}
	enc := func(v any) string {
		j, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return base64.RawURLEncoding.EncodeToString(j)
	}
	signing := enc(map[string]string{"alg": "RS256", "typ": "JWT"}) + "." + enc(claims)
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(nil, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + base64.RawURLEncoding.EncodeToString(sig)
}

var reviewsRe = regexp.MustCompile(`(?m)^dualflow_web_kubernetes_reviews_total\{code="[^"]*",kind="([a-z]+)"\} (\d+)`)

// reviews sums the collector's review calls by kind.
func (r *rbacEnv) reviews(t *testing.T) map[string]int {
	t.Helper()
	resp, err := http.Get(r.metrics)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	out := map[string]int{}
	for _, m := range reviewsRe.FindAllStringSubmatch(string(b), -1) {
		n, _ := strconv.Atoi(m[2])
		out[m[1]] += n
	}
	return out
}
