package api

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
	"k8s.io/apiserver/pkg/authentication/user"

	"github.com/dualflow/dualflow/internal/reload"
	"github.com/dualflow/dualflow/internal/secretfile"
)

// Role is what a token may do. Operator includes viewer.
type Role int

// Roles.
const (
	RoleViewer Role = iota + 1
	RoleOperator
)

// roleNames are the roles' names, in the tokens file and the answers.
var roleNames = map[Role]string{RoleViewer: "viewer", RoleOperator: "operator"}

func (r Role) String() string { return cmp.Or(roleNames[r], "none") }

// Principal is who made a request: a token of the tokens file (its
// name and role), the local user, or a Kubernetes user (kube set; Role
// viewer, for the caps per role).
type Principal struct {
	Name  string
	Role  Role
	kube  user.Info
	local bool // the anonymous loopback user
	// scope, when not nil, is the namespaces a Kubernetes user may list
	// pods in, not all: the flows it reads are theirs (scopedSource).
	scope []string
}

// Tokens maps bearer tokens to principals. Tokens are compared by their
// SHA-256 in constant time. The tokens of LoadTokens follow their file.
type Tokens struct {
	byHash map[[32]byte]Principal               // Add's
	file   *reload.File[map[[32]byte]Principal] // LoadTokens': the file's, reloaded when it changes
}

// Enabled reports whether any token is configured.
func (t *Tokens) Enabled() bool {
	return t != nil && (len(t.byHash) > 0 || t.file != nil && len(t.file.Get()) > 0)
}

// LoadTokens reads a token file: one "token role [name]" per line, role
// viewer or operator; blank lines and # comments are skipped. Like ssh
// with a private key, it refuses a file others may read or write, or its
// group may write (the tokens are secrets). Group read is accepted only for
// a group the process belongs to: Kubernetes mounts a Secret root-owned,
// readable by the pod's fsGroup (defaultMode 0440), so that a non-root
// collector can read it and nobody else.
//
// The file is read again when it changes (package reload, as o says): a
// token added works from the next request on, a token taken out stops
// working. A changed file refused as above (its mode, a line that does not
// parse) leaves the tokens of the last good one in force.
func LoadTokens(path string, o reload.Options) (*Tokens, error) {
	f, err := reload.NewFile(o, func() (map[[32]byte]Principal, error) { return parseTokens(path) }, path)
	if err != nil {
		return nil, err
	}
	return &Tokens{file: f}, nil
}

func parseTokens(path string) (map[[32]byte]Principal, error) {
	b, err := secretfile.Read("tokens file", path)
	if err != nil {
		return nil, err
	}
	byHash := map[[32]byte]Principal{}
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			return nil, fmt.Errorf("tokens %s:%d: want \"token role [name]\"", path, n)
		}
		role := Role(0)
		for r, rn := range roleNames {
			if rn == fields[1] {
				role = r
			}
		}
		if role == 0 {
			return nil, fmt.Errorf("tokens %s:%d: role %q is not viewer or operator", path, n, fields[1])
		}
		name := fmt.Sprintf("%s-%d", fields[1], n)
		if len(fields) > 2 {
			name = fields[2]
		}
		// A name is one principal: its caps (follow streams, SQL) are per
		// name, so two tokens may not share one.
		if seen[name] {
			return nil, fmt.Errorf("tokens %s:%d: the name %q is given twice (each token needs its own)", path, n, name)
		}
		seen[name] = true
		byHash[sha256.Sum256([]byte(fields[0]))] = Principal{Name: name, Role: role}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("tokens %s: %w", path, err)
	}
	return byHash, nil
}

// Add registers a token (for tests and programmatic setups).
func (t *Tokens) Add(token string, p Principal) {
	if t.byHash == nil {
		t.byHash = map[[32]byte]Principal{}
	}
	t.byHash[sha256.Sum256([]byte(token))] = p
}

func (t *Tokens) lookup(token string) (Principal, bool) {
	if t == nil { // no tokens file: every token is unknown
		return Principal{}, false
	}
	h := sha256.Sum256([]byte(token))
	var found Principal
	ok := false
	for _, m := range [2]map[[32]byte]Principal{t.byHash, t.fromFile()} {
		for k, p := range m {
			if subtle.ConstantTimeCompare(k[:], h[:]) == 1 {
				found, ok = p, true
			}
		}
	}
	return found, ok
}

// fromFile returns the file's tokens (nil without a file).
func (t *Tokens) fromFile() map[[32]byte]Principal {
	if t.file == nil {
		return nil
	}
	return t.file.Get()
}

// reloads returns what the metrics report on (nil: nothing).
func (t *Tokens) reloads() reload.Source {
	if t == nil || t.file == nil {
		return nil
	}
	return t.file
}

const principalKey = "dualflow.principal"

// auth requires a principal with permission p. A bearer token of the
// tokens file has its role's permissions (Permission.role); any other
// credential goes to Kubernetes when Config.Kube is set (KubeAuth: a
// TokenReview, or an authenticating proxy's headers), and p is asked of
// its RBAC. A request without a credential has Config.Anonymous (the
// loopback viewer without a tokens file): enough for what viewers may do,
// a 401 that names the operator token's file for the rest. When the
// Kubernetes API does not answer, the request fails closed: 503.
func (a *API) auth(p Permission) gin.HandlerFunc {
	return func(c *gin.Context) {
		pr, ok := a.authenticate(c)
		if !ok {
			return
		}
		if pr.local && pr.Role < p.role() {
			msg := "this needs an operator token; a local request without one is a viewer"
			if a.cfg.LocalTokenFile != "" {
				msg += " (the collector wrote one to " + a.cfg.LocalTokenFile + ", mode 0600; the CLI reads it)"
			}
			c.Header("WWW-Authenticate", `Bearer realm="dualflow"`)
			c.AbortWithStatusJSON(http.StatusUnauthorized, errorBody{Message: msg, Field: "Authorization"})
			return
		}
		if p == PermViewNamespaces && pr.kube != nil {
			msg, err := a.may(c, pr, PermView)
			if err != nil {
				return
			}
			if msg != "" { // not every namespace: those it may list pods in
				scope, err := a.namespaceScope(c, pr)
				if err != nil {
					return
				}
				if len(scope) == 0 {
					c.AbortWithStatusJSON(http.StatusForbidden, errorBody{Message: msg + ", or in some namespace"})
					return
				}
				pr.scope = scope
			}
			c.Set(principalKey, pr)
			return
		}
		if msg, err := a.may(c, pr, p); err != nil {
			return
		} else if msg != "" {
			c.AbortWithStatusJSON(http.StatusForbidden, errorBody{Message: msg})
			return
		}
		c.Set(principalKey, pr)
	}
}

// authenticate says who made c's request, or answers it (401, or 503
// when the Kubernetes API did not answer) and returns false.
func (a *API) authenticate(c *gin.Context) (Principal, bool) {
	unauthorized := func(msg string) (Principal, bool) {
		c.Header("WWW-Authenticate", `Bearer realm="dualflow"`)
		c.AbortWithStatusJSON(http.StatusUnauthorized, errorBody{Message: msg, Field: "Authorization"})
		return Principal{}, false
	}
	tok, hasToken := bearerToken(c.GetHeader("Authorization"))
	if hasToken {
		if p, ok := a.cfg.Tokens.lookup(tok); ok {
			return p, true
		}
	}
	if a.kube != nil {
		u, err := a.kube.authenticate(c.Request)
		switch {
		case errors.Is(err, errKubeUnavailable):
			a.reviewFailed(c, "credential", "", err)
			return Principal{}, false
		case err != nil:
			return unauthorized("refused by Kubernetes: " + err.Error())
		case u != nil:
			return Principal{Name: u.GetName(), Role: RoleViewer, kube: u}, true
		}
	}
	if hasToken {
		return unauthorized("unknown token")
	}
	if a.cfg.Anonymous > 0 {
		return Principal{Name: "local", Role: a.cfg.Anonymous, local: true}, true
	}
	return unauthorized("a bearer token is required")
}

// may says whether pr has permission p: "" when it does, else why not.
// A Kubernetes review that failed is answered here (503) and returned.
func (a *API) may(c *gin.Context, pr Principal, p Permission) (string, error) {
	if pr.kube == nil {
		if pr.Role >= p.role() {
			return "", nil
		}
		return "role " + pr.Role.String() + " may not do this; " + p.role().String() + " required", nil
	}
	msg, err := a.kube.may(c.Request.Context(), pr.kube, p)
	if err != nil {
		a.reviewFailed(c, "permission", pr.Name, err)
	}
	return msg, err
}

// reviewFailed answers a request whose Kubernetes review (of its
// credential, or of a permission of user) could not be made: 503, the
// request fails closed.
func (a *API) reviewFailed(c *gin.Context, what, user string, err error) {
	a.log.Warn("web: cannot check a request's "+what, "user", user, "err", err)
	c.AbortWithStatusJSON(http.StatusServiceUnavailable, errorBody{Message: "cannot check the " + what + ": " + err.Error()})
}

// LocalOperator is the principal of the local operator token.
const LocalOperator = "local-operator"

// LoadOrCreateLocalToken returns the operator token of a collector that
// has no tokens file: the one in path (a secret file: mode 0600, or 0640
// for the process's own group), or a new random one written there with
// mode 0600 when path does not exist. Without a tokens file, requests
// without a token are loopback viewers, and operator actions (SQL,
// traces) need this token even on loopback: a local user is a viewer
// unless they can read the file.
func LoadOrCreateLocalToken(path string) (string, error) {
	if b, err := secretfile.Read("local token file", path); err == nil {
		if tok := strings.TrimSpace(string(b)); tok != "" {
			return tok, nil
		}
		return "", fmt.Errorf("local token file %s is empty", path)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok := base64.RawURLEncoding.EncodeToString(b[:])
	err := secretfile.Create("local token file", path, []byte(tok+"\n"))
	if errors.Is(err, fs.ErrExist) { // another process won the race
		return LoadOrCreateLocalToken(path)
	}
	if err != nil {
		return "", err
	}
	return tok, nil
}

// bearerToken returns the token of an Authorization header of the Bearer
// scheme, which RFC 7235 makes case-insensitive ("bearer", "BEARER").
func bearerToken(h string) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(h), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	tok = strings.TrimSpace(tok)
	return tok, tok != ""
}

func principalOf(c *gin.Context) Principal {
	if v, ok := c.Get(principalKey); ok {
		return v.(Principal)
	}
	return Principal{}
}
