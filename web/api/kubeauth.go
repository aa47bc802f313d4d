package api

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apiserver/pkg/authentication/authenticator"
	"k8s.io/apiserver/pkg/authentication/request/bearertoken"
	"k8s.io/apiserver/pkg/authentication/request/headerrequest"
	x509request "k8s.io/apiserver/pkg/authentication/request/x509"
	tokencache "k8s.io/apiserver/pkg/authentication/token/cache"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
	tokenwebhook "k8s.io/apiserver/plugin/pkg/authenticator/token/webhook"
	authzwebhook "k8s.io/apiserver/plugin/pkg/authorizer/webhook"
	authzmetrics "k8s.io/apiserver/plugin/pkg/authorizer/webhook/metrics"
	"k8s.io/client-go/kubernetes"

	"github.com/dualflow/dualflow/internal/reload"
)

// KubeAuth makes the cluster's own identities the web's users: a bearer
// token is checked with the TokenReview API, a request from an
// authenticating proxy by its client certificate and X-Remote-User
// headers, and what the user may do is asked of the cluster's RBAC with
// SubjectAccessReview (Permission). Answers are cached, bounded, for the
// TTLs below: a revoked token or RoleBinding stops working within them.
// The tokens file keeps working beside it.
type KubeAuth struct {
	// Client is the collector's clientset (needs tokenreviews and
	// subjectaccessreviews create).
	Client kubernetes.Interface
	// Audiences a token must carry one of (empty: the API server's own,
	// as kubectl's tokens carry).
	Audiences []string
	// TokenTTL caches a token's review (default DefaultKubeTokenTTL);
	// a refused token is cached FailedTokenTTL (default
	// DefaultKubeFailedTokenTTL).
	TokenTTL, FailedTokenTTL time.Duration
	// AllowTTL and DenyTTL cache an access review's answer (default
	// DefaultKubeAccessTTL each).
	AllowTTL, DenyTTL time.Duration
	// RequestHeader, when set, trusts the user of an authenticating
	// proxy's headers, on a connection whose client certificate it
	// verifies (the server must serve TLS).
	RequestHeader *RequestHeader
}

// RequestHeader is the kube-apiserver's request-header authentication:
// the user named by the headers of a client whose certificate ClientCA
// signed (and, with AllowedNames, whose common name is one of them).
type RequestHeader struct {
	ClientCAFile string
	AllowedNames []string
	// Headers naming the user, its groups, and extra fields' prefixes
	// (defaults: X-Remote-User, X-Remote-Group, X-Remote-Extra-).
	UsernameHeaders, GroupHeaders, ExtraHeaderPrefixes []string
	// ReloadInterval is how often the CA file is checked for a change
	// (0: reload.DefaultInterval).
	ReloadInterval time.Duration
}

// Kubernetes identities' defaults: a revoked RoleBinding or token takes
// effect within 10 s (the UI polls every few seconds, so the reviews of
// one user's page come from the cache).
const (
	DefaultKubeTokenTTL       = 10 * time.Second
	DefaultKubeFailedTokenTTL = 5 * time.Second
	DefaultKubeAccessTTL      = 10 * time.Second
	// kubeReviewTimeout bounds one review call (three attempts, 0.2 and
	// 0.4 s apart): an API server that does not answer fails the request
	// closed (503).
	kubeReviewTimeout = 2 * time.Second
)

// Group is the API group of dualflow's virtual resources, which RBAC
// grants: traceflows (create: start a trace) and sql (create: run SQL).
const Group = "dualflow.io"

// Permission is what a route needs.
type Permission int

// Permissions. Each is a Kubernetes access review for a Kubernetes user;
// a token of the tokens file has those of its role.
const (
	// PermView reads flows, the map, reachability, traces and findings:
	// list pods in every namespace.
	PermView Permission = iota + 1
	// PermViewNamespaces reads the flows, charts, map and catalog of the
	// namespaces where the user may list pods (all of them with
	// PermView; some, scoped: Principal.scope).
	PermViewNamespaces
	// PermMetrics reads /metrics: get on the non-resource URL /metrics,
	// as for any component (system:monitoring).
	PermMetrics
	// PermTrace starts a trace: create traceflows.dualflow.io, and
	// PermView (its answer names what the probe meets).
	PermTrace
	// PermSQL runs SQL: create sql.dualflow.io, and PermView (SQL reads
	// every namespace's flows).
	PermSQL
)

// role is the tokens file's role that has p.
func (p Permission) role() Role {
	if p == PermTrace || p == PermSQL {
		return RoleOperator
	}
	return RoleViewer
}

// attributes is the access review of p for u.
func (p Permission) attributes(u user.Info) authorizer.AttributesRecord {
	switch p {
	case PermMetrics:
		return authorizer.AttributesRecord{User: u, Verb: "get", Path: "/metrics"}
	case PermTrace:
		return authorizer.AttributesRecord{User: u, Verb: "create", APIGroup: Group, Resource: "traceflows", ResourceRequest: true}
	case PermSQL:
		return authorizer.AttributesRecord{User: u, Verb: "create", APIGroup: Group, Resource: "sql", ResourceRequest: true}
	default:
		return authorizer.AttributesRecord{User: u, Verb: "list", Resource: "pods", ResourceRequest: true}
	}
}

// describe names the permission p's review asks for, for a 403.
func (p Permission) describe() string {
	switch p {
	case PermMetrics:
		return "get on the non-resource URL /metrics"
	case PermTrace:
		return "create on traceflows." + Group + " (ClusterRole dualflow-operator)"
	case PermSQL:
		return "create on sql." + Group + " (ClusterRole dualflow-sql)"
	default:
		return "list on pods in all namespaces"
	}
}

// kubeAuth is KubeAuth built: the request authenticator and the
// authorizer.
type kubeAuth struct {
	authn     authenticator.Request
	authz     authorizer.Authorizer
	audiences authenticator.Audiences // the request's: the review asks for them
}

// errKubeUnavailable wraps a review that failed: the API server did not
// answer. The request fails closed with 503.
var errKubeUnavailable = errors.New("the Kubernetes API did not answer")

func newKubeAuth(k *KubeAuth, m *metrics, reg prometheus.Registerer, log *slog.Logger) (*kubeAuth, error) {
	if k.Client == nil {
		return nil, errors.New("kubernetes identities need the collector's Kubernetes client (--k8s.source in-cluster or kubeconfig)")
	}
	backoff := wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 3}
	tm := tokenwebhook.AuthenticatorMetrics{
		RecordRequestTotal:   func(_ context.Context, code string) { m.kubeReviews.WithLabelValues("tokenreview", code).Inc() },
		RecordRequestLatency: func(context.Context, string, float64) {},
	}
	tr, err := tokenwebhook.NewFromInterface(k.Client.AuthenticationV1(), authenticator.Audiences(k.Audiences), backoff, kubeReviewTimeout, tm)
	if err != nil {
		return nil, err
	}
	token := tokencache.New(outage{tr}, false, cmp.Or(k.TokenTTL, DefaultKubeTokenTTL), cmp.Or(k.FailedTokenTTL, DefaultKubeFailedTokenTTL))
	authn := []authenticator.Request{}
	if rh := k.RequestHeader; rh != nil {
		if rh.ClientCAFile == "" {
			return nil, errors.New("request-header authentication needs its client CA file")
		}
		// The CA is read again when its file changes (a Secret rotated):
		// the next proxy connection is checked against the new one.
		ca, err := reload.NewFile(reload.Options{Name: "web-requestheader-ca", Logger: log, Interval: rh.ReloadInterval},
			func() (*x509.CertPool, error) { return reload.ReadCAPool(rh.ClientCAFile) }, rh.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("request-header client CA: %w", err)
		}
		reg.MustRegister(reload.Metrics(ca))
		verify := func() (x509.VerifyOptions, bool) {
			o := x509request.DefaultVerifyOptions()
			o.Roots = ca.Get()
			return o, true
		}
		authn = append(authn, headerrequest.NewDynamicVerifyOptionsSecure(verify,
			headerrequest.StaticStringSlice(rh.AllowedNames),
			headerrequest.StaticStringSlice(orDefault(rh.UsernameHeaders, "X-Remote-User")),
			headerrequest.StaticStringSlice(nil),
			headerrequest.StaticStringSlice(orDefault(rh.GroupHeaders, "X-Remote-Group")),
			headerrequest.StaticStringSlice(orDefault(rh.ExtraHeaderPrefixes, "X-Remote-Extra-"))))
	}
	authn = append(authn, bearertoken.New(token))
	authz, err := authzwebhook.NewFromInterface(k.Client.AuthorizationV1(),
		cmp.Or(k.AllowTTL, DefaultKubeAccessTTL), cmp.Or(k.DenyTTL, DefaultKubeAccessTTL),
		backoff, authorizer.DecisionDeny, reviewMetrics{m: m}, nil)
	if err != nil {
		return nil, err
	}
	return &kubeAuth{authn: firstAnswer(authn), authz: authz, audiences: k.Audiences}, nil
}

func orDefault(v []string, d string) []string {
	if len(v) == 0 {
		return []string{d}
	}
	return v
}

// firstAnswer tries each authenticator in turn and stops at the first
// that says who the request is or fails: a proxy's certificate that does
// not verify is refused, not passed on to the bearer token.
type firstAnswer []authenticator.Request

func (f firstAnswer) AuthenticateRequest(r *http.Request) (*authenticator.Response, bool, error) {
	for _, a := range f {
		resp, ok, err := a.AuthenticateRequest(r)
		if ok || err != nil {
			return resp, ok, err
		}
	}
	return nil, false, nil
}

// reviewMetrics counts the SubjectAccessReview calls.
type reviewMetrics struct {
	authzmetrics.NoopAuthorizerMetrics
	m *metrics
}

func (r reviewMetrics) RecordRequestTotal(_ context.Context, code string) {
	r.m.kubeReviews.WithLabelValues("subjectaccessreview", code).Inc()
}

// authenticate says who r is: nil, nil when r carries no credential
// this authenticator knows; an error wrapping errKubeUnavailable when
// the API server did not answer.
func (k *kubeAuth) authenticate(r *http.Request) (user.Info, error) {
	if len(k.audiences) > 0 {
		r = r.WithContext(authenticator.WithAudiences(r.Context(), k.audiences))
	}
	resp, ok, err := k.authn.AuthenticateRequest(r)
	switch {
	case err != nil:
		return nil, err
	case !ok:
		return nil, nil
	}
	return resp.User, nil
}

// outage marks the errors of a TokenReview that could not be made (the
// API server unreachable, timing out or refusing the collector) with
// errKubeUnavailable; a refused token's error is the review's own
// status.error, a plain error.
type outage struct{ authenticator.Token }

func (o outage) AuthenticateToken(ctx context.Context, token string) (*authenticator.Response, bool, error) {
	resp, ok, err := o.Token.AuthenticateToken(ctx, token)
	var se *apierrors.StatusError
	var ue *url.Error
	if err != nil && (errors.As(err, &se) || errors.As(err, &ue) || errors.Is(err, context.DeadlineExceeded)) {
		err = fmt.Errorf("%w: TokenReview: %v", errKubeUnavailable, err)
	}
	return resp, ok, err
}

// may asks whether u has p: "" when it does, else the reason; an error
// wrapping errKubeUnavailable when the API server did not answer.
func (k *kubeAuth) may(ctx context.Context, u user.Info, p Permission) (string, error) {
	perms := []Permission{p}
	if p == PermSQL || p == PermTrace {
		// SQL reads every namespace's rows; a trace's probe crosses
		// namespaces and its answer names what it meets.
		perms = append(perms, PermView)
	}
	for _, q := range perms {
		d, reason, err := k.authz.Authorize(ctx, q.attributes(u))
		if err != nil {
			return "", fmt.Errorf("%w: %v", errKubeUnavailable, err)
		}
		if d != authorizer.DecisionAllow {
			msg := fmt.Sprintf("Kubernetes user %q may not do this: it needs %s", u.GetName(), q.describe())
			if reason != "" {
				msg += " (" + reason + ")"
			}
			return msg, nil
		}
	}
	return "", nil
}
