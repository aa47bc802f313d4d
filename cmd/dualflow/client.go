package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/internal/reload"
	"github.com/dualflow/dualflow/lab/labcmd"
	"github.com/dualflow/dualflow/netaddr"
	"github.com/dualflow/dualflow/web"
)

// envToken names the environment variable holding the bearer token of
// --server (a viewer token reads; traces need an operator token).
const envToken = "DUALFLOW_TOKEN"

// serverFlags point a CLI command at a running collector's REST API.
type serverFlags struct {
	url       string
	tokenFile string
	caFile    string
	// stateDir is the state directory of a lab whose running demo's REST
	// API a command asks without --server (useDemo).
	stateDir string
	// localTokenFile is the local operator token of a collector on
	// loopback without a tokens file (the demo's, or the default data
	// directory's), read when no token is given.
	localTokenFile string
}

func (s *serverFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&s.url, "server", "", "ask a running collector's REST API (its --web.addr, e.g. http://127.0.0.1:8080) instead of working locally; token from $"+envToken+" or --token-file")
	fs.StringVar(&s.tokenFile, "token-file", "", "file holding the bearer token for --server (default $"+envToken+"); a Kubernetes token works with a collector run with --web.kubernetes-auth (kubectl create token ...)")
	fs.StringVar(&s.caFile, "ca-file", "", "PEM CA that signed an https --server's certificate (default: the system's roots)")
	fs.StringVar(&s.stateDir, "state-dir", labcmd.DefaultStateDir, "without --server: the state directory of a running demo, whose REST API is used")
}

// useDemo points s at the REST API of the demo running on the lab of
// --state-dir when --server is not set, with the demo's local operator
// token; when --server is the demo's, it reads that token too. Without
// --server and without a demo it returns the error saying so.
func (s *serverFlags) useDemo() error {
	u, err := labcmd.DemoWebURL(s.stateDir)
	switch {
	case s.url != "":
		if err == nil && strings.TrimSuffix(u, "/") == strings.TrimSuffix(s.url, "/") {
			s.localTokenFile = labcmd.DemoTokenFile(s.stateDir)
		}
		return nil
	case err != nil:
		return err
	}
	s.url, s.localTokenFile = u, labcmd.DemoTokenFile(s.stateDir)
	return nil
}

// client returns the API client, nil when --server is not set.
func (s *serverFlags) client() (*apiClient, error) {
	if s.url == "" {
		return nil, nil
	}
	u, err := url.Parse(s.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--server %q: want http(s)://host:port", s.url)
	}
	token := os.Getenv(envToken)
	if s.tokenFile != "" {
		b, err := os.ReadFile(s.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	if token == "" && netaddr.Loopback(u.Hostname()) {
		// A collector without a tokens file serves loopback viewers, and
		// operator actions need its local token: read it if this user may
		// (the collector's user, root). Its 401 says where it is otherwise.
		local := cmp.Or(s.localTokenFile, filepath.Join(store.DefaultDataDir, web.LocalTokenFileName))
		if b, err := os.ReadFile(local); err == nil {
			token = strings.TrimSpace(string(b))
		}
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	hc := &http.Client{}
	if s.caFile != "" {
		roots, err := reload.ReadCAPool(s.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		hc.Transport = &http.Transport{Proxy: http.ProxyFromEnvironment, TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	}
	return &apiClient{base: u, token: token, http: hc}, nil
}

// apiClient calls the REST API under /api/v1.
type apiClient struct {
	base  *url.URL
	token string
	http  *http.Client
}

// maxAPIResponse bounds what the CLI reads of one answer.
const maxAPIResponse = 256 << 20

// do sends method path?q with body and decodes a 2xx JSON answer into
// out; other answers become an error with the server's message.
func (c *apiClient) do(ctx context.Context, method, path string, q url.Values, body io.Reader, out any) error {
	u := *c.base
	u.Path += "/api/v1" + path
	u.RawQuery = q.Encode()
	req, err := http.NewRequestWithContext(ctx, method, u.String(), body)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, u.Redacted(), err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIResponse))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, u.Redacted(), err)
	}
	if resp.StatusCode/100 != 2 {
		// Errors are {message, field}; {error} from older servers.
		var e struct {
			Message string `json:"message"`
			Field   string `json:"field"`
			Error   string `json:"error"`
		}
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Message+e.Error != "" {
			msg = e.Message + e.Error
			if e.Field != "" && !strings.HasPrefix(msg, e.Field) {
				msg = e.Field + ": " + msg
			}
		}
		return fmt.Errorf("%s %s: %s: %s", method, u.Path, resp.Status, msg)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", method, u.Path, err)
	}
	return nil
}
