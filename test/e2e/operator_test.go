package e2e

import (
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
)

// operatorTokens maps the web base URL (scheme://host:port) of each
// collector a test started to the file of its local operator token: a
// collector without a tokens file serves local requests as viewers, and
// its SQL and traces need that token (as an operator's CLI reads it).
var operatorTokens sync.Map

// registerOperator records tokenFile as the local operator token of the
// collector serving base.
func registerOperator(t testing.TB, base, tokenFile string) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil || u.Host == "" {
		t.Fatalf("web URL %q: %v", base, err)
	}
	operatorTokens.Store(u.Scheme+"://"+u.Host, tokenFile)
}

// operatorTokenFile is the token file of the collector serving target
// (any URL of it), or "".
func operatorTokenFile(target string) string {
	u, err := url.Parse(target)
	if err != nil {
		return ""
	}
	if f, ok := operatorTokens.Load(u.Scheme + "://" + u.Host); ok {
		return f.(string)
	}
	return ""
}

// authorize adds the operator token of req's collector, when a test
// started it.
func authorize(req *http.Request) {
	if f := operatorTokenFile(req.URL.String()); f != "" {
		if b, err := os.ReadFile(f); err == nil {
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(b)))
		}
	}
}
