package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/dualflow/dualflow/internal/certs"
	"github.com/dualflow/dualflow/test/support/reloadtest"
)

// reviewServer answers TokenReviews and SubjectAccessReviews as an API
// server would, for unit tests (TestKubeRBAC in test/e2e runs against a
// real kube-apiserver): tokens name users, grants are "verb
// resource.group" (or "verb /path") per user.
type reviewServer struct {
	*httptest.Server
	tokens      map[string]string
	grants      map[string][]string
	tr, sar     atomic.Int64
	unavailable atomic.Bool
}

func newReviewServer(t testing.TB) *reviewServer {
	s := &reviewServer{tokens: map[string]string{}, grants: map[string][]string{}}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.unavailable.Load() {
			http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":503}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/apis/authentication.k8s.io/v1/tokenreviews":
			s.tr.Add(1)
			var tr authenticationv1.TokenReview
			if err := json.NewDecoder(r.Body).Decode(&tr); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			if u, ok := s.tokens[tr.Spec.Token]; ok {
				tr.Status = authenticationv1.TokenReviewStatus{Authenticated: true, User: authenticationv1.UserInfo{Username: u}}
			} else {
				tr.Status = authenticationv1.TokenReviewStatus{Error: "invalid bearer token"}
			}
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(tr)
		case "/apis/authorization.k8s.io/v1/subjectaccessreviews":
			s.sar.Add(1)
			var sar authorizationv1.SubjectAccessReview
			if err := json.NewDecoder(r.Body).Decode(&sar); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			want := ""
			if ra := sar.Spec.ResourceAttributes; ra != nil {
				want = ra.Verb + " " + ra.Resource + "." + ra.Group
				if ra.Namespace != "" {
					want += " in " + ra.Namespace
				}
			} else if nra := sar.Spec.NonResourceAttributes; nra != nil {
				want = nra.Verb + " " + nra.Path
			}
			sar.Status.Allowed = slices.Contains(s.grants[sar.Spec.User], want)
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(sar)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *reviewServer) client(t testing.TB) kubernetes.Interface {
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: s.URL})
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestKubeAuth: a Kubernetes user's permissions are its reviews' (each
// 403 naming what is missing), the tokens file keeps working beside
// them, answers are cached for the TTL, and an API server that does not
// answer fails the request closed (503) once nothing is cached.
func TestKubeAuth(t *testing.T) {
	rs := newReviewServer(t)
	rs.tokens["alice-token"] = "alice"
	rs.tokens["bob-token"] = "bob"
	rs.tokens["carol-token"] = "carol"
	rs.tokens["frank-token"] = "frank"
	rs.grants["frank"] = []string{"list pods. in shop", "create traceflows.dualflow.io"}
	rs.grants["alice"] = []string{"list pods.", "create traceflows.dualflow.io"}
	rs.grants["carol"] = []string{"list pods.", "create sql.dualflow.io", "get /metrics"}
	tok := &Tokens{}
	tok.Add("file-token", Principal{Name: "ops", Role: RoleOperator})
	h := testAPI(t, Config{Store: &fakeStore{}, Tokens: tok, SQL: fakeEngineNil{},
		Kube: &KubeAuth{Client: rs.client(t), TokenTTL: time.Hour, AllowTTL: time.Hour, DenyTTL: time.Hour}})
	for _, tc := range []struct {
		token, method, path, body string
		code                      int
		want                      string
	}{
		{"", "GET", "/api/v1/whoami", "", 401, "bearer token is required"},
		{"nobody", "GET", "/api/v1/whoami", "", 401, "refused by Kubernetes: invalid bearer token"},
		{"file-token", "GET", "/api/v1/whoami", "", 200, `"name":"ops"`},
		{"alice-token", "GET", "/api/v1/whoami", "", 200, `"role":"kubernetes"`},
		{"alice-token", "POST", "/api/v1/sql", `{"query":"SELECT 1"}`, 403, `needs create on sql.dualflow.io`},
		{"alice-token", "GET", "/metrics", "", 403, `get on the non-resource URL /metrics`},
		{"bob-token", "GET", "/api/v1/flows", "", 403, `Kubernetes user \"bob\" may not do this: it needs list on pods in all namespaces`},
		{"bob-token", "POST", "/api/v1/traceflows", `{}`, 403, `create on traceflows.dualflow.io`},
		{"carol-token", "POST", "/api/v1/reachability", `{"trace":true}`, 403, `live traces: Kubernetes user \"carol\"`},
		{"carol-token", "GET", "/metrics", "", 200, ""},
		// A trace crosses namespaces: one namespace's reader may not.
		{"frank-token", "POST", "/api/v1/traceflows", `{}`, 403, `needs list on pods in all namespaces`},
	} {
		hdr := []string{}
		if tc.token != "" {
			hdr = []string{"Authorization", "Bearer " + tc.token}
		}
		r := do(t, h, tc.method, tc.path, tc.body, hdr...)
		if r.code != tc.code || !strings.Contains(r.body, tc.want) {
			t.Errorf("%s %s %s: %v, want %d with %q", tc.token, tc.method, tc.path, r, tc.code, tc.want)
		}
	}
	// Cached: the same requests again make no review.
	tr, sar := rs.tr.Load(), rs.sar.Load()
	for range 20 {
		do(t, h, "GET", "/api/v1/whoami", "", "Authorization", "Bearer alice-token")
		do(t, h, "GET", "/api/v1/flows", "", "Authorization", "Bearer bob-token")
	}
	if rs.tr.Load() != tr || rs.sar.Load() != sar {
		t.Errorf("cached requests made %d TokenReviews and %d SubjectAccessReviews", rs.tr.Load()-tr, rs.sar.Load()-sar)
	}
	// The API server failing: a user reviewed before goes on from the
	// cache; a new token fails closed.
	rs.tokens["dave-token"] = "dave"
	rs.unavailable.Store(true)
	if r := do(t, h, "GET", "/api/v1/whoami", "", "Authorization", "Bearer alice-token"); r.code != 200 {
		t.Errorf("alice from the cache: %v", r)
	}
	if r := do(t, h, "GET", "/api/v1/whoami", "", "Authorization", "Bearer dave-token"); r.code != 503 || !strings.Contains(r.body, "the Kubernetes API did not answer") {
		t.Errorf("a new token with the API down: %v, want 503", r)
	}
	if r := do(t, h, "GET", "/api/v1/whoami", "", "Authorization", "Bearer file-token"); r.code != 200 {
		t.Errorf("the tokens file with the API down: %v", r)
	}
}

// TestKubeAuthUnavailableAuthorization: a user authenticated from the
// cache whose permission is not cached fails closed too.
func TestKubeAuthUnavailableAuthorization(t *testing.T) {
	rs := newReviewServer(t)
	rs.tokens["alice-token"] = "alice"
	rs.grants["alice"] = []string{"list pods."}
	h := testAPI(t, Config{Store: &fakeStore{}, Kube: &KubeAuth{Client: rs.client(t), TokenTTL: time.Hour, AllowTTL: time.Hour}})
	if r := do(t, h, "GET", "/api/v1/whoami", "", "Authorization", "Bearer alice-token"); r.code != 200 {
		t.Fatalf("whoami: %v", r)
	}
	rs.unavailable.Store(true)
	if r := do(t, h, "POST", "/api/v1/traceflows", "{}", "Authorization", "Bearer alice-token"); r.code != 503 || !strings.Contains(r.body, "cannot check the permission") {
		t.Errorf("trace with the API down: %v, want 503", r)
	}
}

// BenchmarkKubeAuthCached is what Kubernetes identities add to a request
// once the reviews are cached: GET /api/v1/whoami with a tokens file's
// token and with a Kubernetes user's, the per-request latency's p50 and
// p95 reported for each (µs).
func BenchmarkKubeAuthCached(b *testing.B) {
	rs := newReviewServer(b)
	rs.tokens["alice-token"] = "alice"
	rs.grants["alice"] = []string{"list pods."}
	// bob lists pods in one namespace of 50: a request asks each (cached).
	rs.tokens["bob-token"] = "bob"
	rs.grants["bob"] = []string{"list pods. in ns-7"}
	var nss []string
	for i := range 50 {
		nss = append(nss, fmt.Sprintf("ns-%d", i))
	}
	cat := fakeCatalog{fn: func(context.Context) (CatalogResponse, error) { return CatalogResponse{Namespaces: nss}, nil }}
	tok := &Tokens{}
	tok.Add("file-token", Principal{Name: "ops", Role: RoleViewer})
	h := testAPI(b, Config{Store: &fakeStore{}, Tokens: tok, Catalog: cat, Kube: &KubeAuth{Client: rs.client(b)}})
	for _, c := range []struct{ name, token string }{{"tokens-file", "file-token"}, {"kubernetes", "alice-token"}, {"kubernetes-one-namespace-of-50", "bob-token"}} {
		b.Run(c.name, func(b *testing.B) {
			req := httptest.NewRequest("GET", "/api/v1/whoami", nil)
			req.Header.Set("Authorization", "Bearer "+c.token)
			var lat []time.Duration
			for b.Loop() {
				w := httptest.NewRecorder()
				r := req.Clone(req.Context())
				start := time.Now()
				h.ServeHTTP(w, r)
				lat = append(lat, time.Since(start))
				if w.Code != 200 {
					b.Fatalf("%d %s", w.Code, w.Body)
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*95/100].Nanoseconds())/1e3, "p95-µs")
		})
	}
}

// TestRequestHeaderCAReload: the proxy's client CA is read again when its
// file changes (a Secret volume's update): a proxy certificate of the new
// CA is trusted from then on, one of the old CA no longer.
func TestRequestHeaderCAReload(t *testing.T) {
	rs := newReviewServer(t)
	rs.grants["alice"] = []string{"list pods."}
	dirA, dirB := t.TempDir(), t.TempDir()
	for _, d := range []string{dirA, dirB} {
		if _, err := certs.Issue(certs.Options{Dir: d}); err != nil {
			t.Fatal(err)
		}
	}
	read := func(dir, name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	leaf := func(dir string) *x509.Certificate {
		blk, _ := pem.Decode(read(dir, certs.ControllerFile))
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	proxyA, proxyB := leaf(dirA), leaf(dirB)
	vol := reloadtest.NewVolume(t, 0o644, map[string][]byte{"ca.crt": read(dirA, certs.CAFile)})
	h := testAPI(t, Config{Store: &fakeStore{}, Kube: &KubeAuth{Client: rs.client(t),
		RequestHeader: &RequestHeader{ClientCAFile: vol.Path("ca.crt"), ReloadInterval: 10 * time.Millisecond}}})
	as := func(cert *x509.Certificate) int {
		r := httptest.NewRequest("GET", "/api/v1/whoami", nil)
		r.Header.Set("X-Remote-User", "alice")
		r.TLS = &tls.ConnectionState{PeerCertificates: []*x509.Certificate{cert}}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	if a, b := as(proxyA), as(proxyB); a != 200 || b != 401 {
		t.Fatalf("before the change: CA A's proxy %d, CA B's %d; want 200 and 401", a, b)
	}
	vol.Update(map[string][]byte{"ca.crt": read(dirB, certs.CAFile)})
	for deadline := time.Now().Add(30 * time.Second); as(proxyB) != 200; {
		if time.Now().After(deadline) {
			t.Fatal("CA B's proxy still refused 30 s after the CA file changed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if a := as(proxyA); a != 401 {
		t.Errorf("after the change: CA A's proxy %d, want 401", a)
	}
}
