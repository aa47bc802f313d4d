// Package web serves dualflow's REST API (web/api) and browser UI (web/ui)
// from one HTTP server. Mount it in the collector or demo process:
//
//	srv, err := web.New(web.Config{Addr: "127.0.0.1:8080", Store: conn, ...})
//	ln, err := net.Listen("tcp", srv.Addr())
//	g.Go(func() error { return srv.Serve(ctx, ln) })
package web

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"time"

	"github.com/dualflow/dualflow/internal/defaults"
	"github.com/dualflow/dualflow/internal/httpserve"
	"github.com/dualflow/dualflow/internal/reload"
	"github.com/dualflow/dualflow/netaddr"
	"github.com/dualflow/dualflow/web/api"
	"github.com/dualflow/dualflow/web/ui"
)

// DefaultAddr is where the server listens by default.
const DefaultAddr = "127.0.0.1:8080"

// LocalTokenFileName is the local operator token's file in the embedded
// store's data directory (Config.LocalTokenFile), where the CLI looks for
// it.
const LocalTokenFileName = "web-operator-token"

// Config configures a Server: the API's configuration (api.Config: the
// store, the services mounted, the limits) and what the server adds.
type Config struct {
	api.Config
	// Addr is the listen address, IPv4 or IPv6 ("[::1]:8080"). Without
	// tokens the host is forced to loopback.
	Addr string
	// AllowedHosts are the names (besides IP literals and localhost) the
	// server answers to in the Host header; other requests get 403, so a
	// page of a name rebound to this server's address (DNS rebinding)
	// cannot use it. Set it to the names operators browse it by.
	AllowedHosts []string
	// TokensFile holds "token role [name]" lines; Config.Tokens, when
	// set, is used instead. Neither: loopback only, where a request
	// without a token is a viewer and operator actions need the token of
	// Config.LocalTokenFile, which New creates (mode 0600) when missing
	// (empty: no operator at all then).
	TokensFile string
	// ShutdownTimeout bounds Run's wait for requests in flight (default 5s).
	ShutdownTimeout time.Duration
	// TLS, when set, serves HTTPS with its certificate, and asks clients
	// for theirs (not required: an authenticating proxy's is checked by
	// KubeAuth.RequestHeader).
	TLS *reload.TLS
}

// Server serves the API and the UI.
type Server struct {
	cfg     Config
	log     *slog.Logger
	handler http.Handler
	addr    string
	auth    bool
}

// New checks cfg, loads the tokens and builds the handlers. It does not
// listen; see Run.
func New(cfg Config) (*Server, error) {
	cfg.Addr = cmp.Or(cfg.Addr, DefaultAddr)
	cfg.Logger = cmp.Or(cfg.Logger, slog.Default())
	cfg.ShutdownTimeout = defaults.Positive(cfg.ShutdownTimeout, 5*time.Second)
	tokens := cfg.Tokens
	if tokens == nil && cfg.TokensFile != "" {
		t, err := api.LoadTokens(cfg.TokensFile, reload.Options{Name: "web-tokens", Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		tokens = t
	}
	authenticated := tokens.Enabled() || cfg.Kube != nil
	anonymous, localTokenFile := api.Role(0), ""
	if !authenticated {
		// Loopback only: a local request is a viewer; operator actions
		// (SQL, traces) need the local token, which only the collector's
		// user (and root) can read.
		anonymous, tokens = api.RoleViewer, &api.Tokens{}
		if cfg.LocalTokenFile != "" {
			tok, err := api.LoadOrCreateLocalToken(cfg.LocalTokenFile)
			if err != nil {
				return nil, fmt.Errorf("web: %w", err)
			}
			tokens.Add(tok, api.Principal{Name: api.LocalOperator, Role: api.RoleOperator})
			localTokenFile, _ = filepath.Abs(cfg.LocalTokenFile)
		}
	}
	acfg := cfg.Config
	acfg.Tokens, acfg.Anonymous, acfg.LocalTokenFile = tokens, anonymous, localTokenFile
	a, err := api.New(acfg)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, addr: cfg.Addr, auth: authenticated}
	if !s.auth {
		host, port, err := net.SplitHostPort(cfg.Addr)
		if err != nil {
			return nil, fmt.Errorf("web: addr %q: %w", cfg.Addr, err)
		}
		if !netaddr.Loopback(host) {
			s.addr = net.JoinHostPort("127.0.0.1", port)
		}
	}
	mux := http.NewServeMux()
	for _, p := range []string{"/api/", "/healthz", "/readyz", "/metrics"} {
		mux.Handle(p, a.Handler())
	}
	mux.Handle("/", ui.Handler())
	s.handler = hostCheck(mux, cfg.AllowedHosts)
	return s, nil
}

// hostCheck refuses requests whose Host is not an IP literal, localhost
// or an allowed name (DNS rebinding protection).
func hostCheck(next http.Handler, names []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !netaddr.HostAllowed(r.Host, names) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_ = json.NewEncoder(w).Encode(map[string]string{"message": "Host " + r.Host + " refused: use an IP address or localhost, or add the name to --web.allowed-hosts (DNS rebinding protection)"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// Addr is the address to listen on (loopback when no tokens are set).
func (s *Server) Addr() string { return s.addr }

// Serve serves on ln until ctx is cancelled, then shuts down gracefully;
// it closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	scheme, auth := "http", "bearer tokens"
	if s.cfg.TLS != nil {
		scheme = "https"
		tc := s.cfg.TLS.ServerConfig()
		tc.ClientAuth = tls.RequestClientCert
		tc.NextProtos = []string{"h2", "http/1.1"}
		ln = tls.NewListener(ln, tc)
	}
	if s.cfg.Kube != nil {
		auth = "kubernetes"
		if s.cfg.Tokens.Enabled() || s.cfg.TokensFile != "" {
			auth = "bearer tokens and kubernetes"
		}
	}
	if s.auth {
		s.log.Info("serving the web UI and API", "url", scheme+"://"+ln.Addr().String()+"/", "auth", auth)
	} else {
		msg := "serving the web UI and API without authentication, on loopback only (set tokens to listen elsewhere)"
		if s.addr != s.cfg.Addr {
			msg = "no tokens configured: listening on loopback only instead of " + s.cfg.Addr
		}
		s.log.Warn(msg, "url", scheme+"://"+ln.Addr().String()+"/")
	}
	// Requests run under a context cancelled at shutdown, so follow
	// streams end instead of holding Shutdown for its whole timeout.
	reqCtx, cancelReqs := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelReqs()
	srv := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return reqCtx },
	}
	srv.RegisterOnShutdown(cancelReqs)
	if err := httpserve.Serve(ctx, srv, ln, s.cfg.ShutdownTimeout); err != nil {
		return fmt.Errorf("web: serve: %w", err)
	}
	return nil
}
