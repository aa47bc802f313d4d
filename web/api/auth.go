package api

import (
	"bufio"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"net/http"
	"os"
	"strings"
	"syscall"

	"github.com/gin-gonic/gin"
)

// Role is what a token may do. Operator includes viewer.
type Role int

// Roles.
const (
	RoleViewer Role = iota + 1
	RoleOperator
)

func (r Role) String() string {
	switch r {
	case RoleViewer:
		return "viewer"
	case RoleOperator:
		return "operator"
	}
	return "none"
}

// Principal is who made a request.
type Principal struct {
	Name string
	Role Role
}

// Tokens maps bearer tokens to principals. Tokens are compared by their
// SHA-256 in constant time.
type Tokens struct {
	byHash map[[32]byte]Principal
}

// Enabled reports whether any token is configured.
func (t *Tokens) Enabled() bool { return t != nil && len(t.byHash) > 0 }

// LoadTokens reads a token file: one "token role [name]" per line, role
// viewer or operator; blank lines and # comments are skipped. Like ssh
// with a private key, it refuses a file others may read or write, or its
// group may write (the tokens are secrets). Group read is accepted only for
// a group the process belongs to: Kubernetes mounts a Secret root-owned,
// readable by the pod's fsGroup (defaultMode 0440), so that a non-root
// collector can read it and nobody else.
func LoadTokens(path string) (*Tokens, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("tokens: %w", err)
	}
	if err := secretFileMode(path, fi); err != nil {
		return nil, err
	}
	t := &Tokens{byHash: map[[32]byte]Principal{}}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			return nil, fmt.Errorf("tokens %s:%d: want \"token role [name]\"", path, n)
		}
		var role Role
		switch fields[1] {
		case "viewer":
			role = RoleViewer
		case "operator":
			role = RoleOperator
		default:
			return nil, fmt.Errorf("tokens %s:%d: role %q is not viewer or operator", path, n, fields[1])
		}
		name := fmt.Sprintf("%s-%d", fields[1], n)
		if len(fields) > 2 {
			name = fields[2]
		}
		t.Add(fields[0], Principal{Name: name, Role: role})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("tokens %s: %w", path, err)
	}
	return t, nil
}

// Add registers a token (for tests and programmatic setups).
func (t *Tokens) Add(token string, p Principal) {
	if t.byHash == nil {
		t.byHash = map[[32]byte]Principal{}
	}
	t.byHash[sha256.Sum256([]byte(token))] = p
}

func (t *Tokens) lookup(token string) (Principal, bool) {
	h := sha256.Sum256([]byte(token))
	var found Principal
	ok := false
	for k, p := range t.byHash {
		if subtle.ConstantTimeCompare(k[:], h[:]) == 1 {
			found, ok = p, true
		}
	}
	return found, ok
}

const principalKey = "dualflow.principal"

// auth requires a token with at least role min. Without tokens everyone
// is an operator (the server then listens on loopback only).
func (a *API) auth(min Role) gin.HandlerFunc {
	return func(c *gin.Context) {
		if !a.cfg.Tokens.Enabled() {
			c.Set(principalKey, Principal{Name: "local", Role: RoleOperator})
			return
		}
		tok, ok := bearerToken(c.GetHeader("Authorization"))
		if !ok {
			c.Header("WWW-Authenticate", `Bearer realm="dualflow"`)
			c.AbortWithStatusJSON(http.StatusUnauthorized, errorBody{Message: "a bearer token is required", Field: "Authorization"})
			return
		}
		p, ok := a.cfg.Tokens.lookup(tok)
		if !ok {
			c.AbortWithStatusJSON(http.StatusUnauthorized, errorBody{Message: "unknown token", Field: "Authorization"})
			return
		}
		if p.Role < min {
			c.AbortWithStatusJSON(http.StatusForbidden, errorBody{Message: "role " + p.Role.String() + " may not do this; " + min.String() + " required"})
			return
		}
		c.Set(principalKey, p)
	}
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

// secretFileMode refuses a secret file that others may access or its group
// may write, and group read by a group the process is not in.
func secretFileMode(path string, fi os.FileInfo) error {
	perm := fi.Mode().Perm()
	if perm&0o027 != 0 {
		return fmt.Errorf("tokens file %s has mode %#o: it holds secrets, so others must have no access and the group no write (chmod 600 %s)", path, perm, path)
	}
	if perm&0o040 == 0 {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fmt.Errorf("tokens file %s has mode %#o: group read is accepted only for the process's own group (chmod 600 %s)", path, perm, path)
	}
	groups, _ := os.Getgroups()
	groups = append(groups, os.Getegid())
	for _, g := range groups {
		if uint32(g) == st.Gid {
			return nil
		}
	}
	return fmt.Errorf("tokens file %s has mode %#o and group %d, which this process is not in: group and others must have no access (chmod 600 %s)", path, perm, st.Gid, path)
}
