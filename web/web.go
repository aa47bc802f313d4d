// Package web serves dualflow's REST API (web/api) and browser UI (web/ui)
// from one HTTP server. Mount it in the collector or demo process:
//
//	srv, err := web.New(web.Config{Addr: "127.0.0.1:8080", Store: conn, ...})
//	g.Go(func() error { return srv.Run(ctx) })
package web

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/internal/reload"
	"github.com/dualflow/dualflow/netaddr"
	"github.com/dualflow/dualflow/web/api"
	"github.com/dualflow/dualflow/web/ui"
)

// Dependencies, declared by web/api where they are used.
type (
	Store     = api.Store
	SQLRunner = api.SQLRunner
	Evaluator = api.Evaluator
	Tracer    = api.Tracer
)

// DefaultAddr is where the server listens by default.
const DefaultAddr = "127.0.0.1:8080"

// LocalTokenFileName is the local operator token's file in the embedded
// store's data directory (Config.LocalTokenFile), where the CLI looks for
// it.
const LocalTokenFileName = "web-operator-token"

// Config configures a Server.
type Config struct {
	// Addr is the listen address, IPv4 or IPv6 ("[::1]:8080"). Without
	// tokens the host is forced to loopback.
	Addr string
	// Store reads the flows (store.Conn). Required.
	Store Store
	// Database holds the flows table (default "dualflow").
	Database string
	// SQL runs POST /api/v1/sql. nil: the Store, when it is a SQLRunner
	// (store.Embedded, store.Server), else 501.
	SQL SQLRunner
	// Evaluator and Tracer are optional.
	Evaluator Evaluator
	Tracer    Tracer
	// AuditAPI and Traceflows are mounted under /api/v1 (see api.Config).
	AuditAPI   http.Handler
	Traceflows http.Handler
	// Catalog serves GET /api/v1/catalog; optional (nil: 501).
	Catalog api.Catalog
	// Status serves GET /api/v1/status; optional (nil: 501).
	Status api.Status
	// AllowedHosts are the names (besides IP literals and localhost) the
	// server answers to in the Host header; other requests get 403, so a
	// page of a name rebound to this server's address (DNS rebinding)
	// cannot use it. Set it to the names operators browse it by.
	AllowedHosts []string
	// TokensFile holds "token role [name]" lines; Tokens, when set, is
	// used instead. Neither: loopback only, where a request without a
	// token is a viewer and operator actions need the token of
	// LocalTokenFile.
	TokensFile string
	Tokens     *api.Tokens
	// LocalTokenFile holds the operator token of a server without
	// TokensFile or Tokens (created, mode 0600, when missing); empty: no
	// operator at all then.
	LocalTokenFile string
	// SQL limits (0: api defaults).
	SQLMaxRows   int
	SQLMaxTime   time.Duration
	SQLMaxMemory int64
	// Limits cap the heavy requests in flight (0: api defaults).
	Limits Limits
	// Registerer receives the server's metrics and Gatherer is served at
	// /metrics (e.g. the collector's registry for both); nil: a private
	// registry.
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	Logger     *slog.Logger
	// ShutdownTimeout bounds Run's wait for requests in flight (default 5s).
	ShutdownTimeout time.Duration
	// Ready is /readyz (see api.Config.Ready); nil: the store answers.
	Ready func(context.Context) error
}

// Limits cap the requests that load the store or the CPU: POST
// /api/v1/sql queries, follow streams, what-ifs and reachability
// matrices, per token, per role and (follow streams) in all. A request
// past a cap is answered 429 with Retry-After and counted in
// dualflow_web_concurrency_refused_total; a what-if or a matrix past its
// bound of work is answered 422 and counted in
// dualflow_web_too_large_total.
type Limits struct {
	// SQLConcurrency is the /sql queries running at once per role (only
	// operators run SQL, so it is also the cap over all roles).
	SQLConcurrency int
	// SQLMaxThreads is the engine threads of one /sql query.
	SQLMaxThreads int
	// FollowStreams is the follow streams open at once, all roles
	// together; FollowStreamsPerRole those of one role.
	FollowStreams        int
	FollowStreamsPerRole int
	// SQLConcurrencyPerToken and FollowStreamsPerToken cap those of one
	// token (one principal; without tokens, the one local user).
	SQLConcurrencyPerToken int
	FollowStreamsPerToken  int
	// WhatIfConcurrency is the what-ifs running at once per role,
	// WhatIfConcurrencyPerToken per token; WhatIfMaxChecks and
	// WhatIfMaxFlowGroups bound one what-if (audit.WhatIfLimits).
	WhatIfConcurrency         int
	WhatIfConcurrencyPerToken int
	WhatIfMaxChecks           int64
	WhatIfMaxFlowGroups       int
	// ReachabilityConcurrency is the reachability matrices computed at
	// once per role, ReachabilityConcurrencyPerToken per token;
	// ReachabilityMaxChecks bounds one matrix
	// (api.PolicyEvaluator.MaxChecks).
	ReachabilityConcurrency         int
	ReachabilityConcurrencyPerToken int
	ReachabilityMaxChecks           int64
}

// BindFlags registers the --web.sql.*, --web.follow.*, --web.whatif.* and
// --web.reachability.* limit flags on fs.
func (l *Limits) BindFlags(fs *flag.FlagSet) {
	fs.IntVar(&l.SQLConcurrency, "web.sql.max-concurrent", api.DefaultSQLConcurrency, "POST /api/v1/sql queries running at once per role; more are answered 429 (the embedded engine runs 4 statements at once: keep room for the collector's inserts)")
	fs.IntVar(&l.SQLMaxThreads, "web.sql.max-threads", api.DefaultSQLMaxThreads, "engine threads (max_threads) of one /sql query")
	fs.IntVar(&l.FollowStreams, "web.follow.max-streams", api.DefaultFollowStreams, "follow streams (GET /api/v1/flows?follow=true) open at once, all roles together; more are answered 429 (each polls the store every second)")
	fs.IntVar(&l.FollowStreamsPerRole, "web.follow.max-streams-per-role", api.DefaultFollowStreamsPerRole, "follow streams open at once per role (viewer, operator), so viewers cannot take them all")
	fs.IntVar(&l.SQLConcurrencyPerToken, "web.sql.max-concurrent-per-token", api.DefaultSQLConcurrencyPerToken, "POST /api/v1/sql queries running at once per token (without tokens: for the local user), so one token cannot take its role's every place")
	fs.IntVar(&l.FollowStreamsPerToken, "web.follow.max-streams-per-token", api.DefaultFollowStreamsPerToken, "follow streams open at once per token (without tokens: for the local user), so one token cannot take its role's every stream")
	fs.IntVar(&l.WhatIfConcurrency, "web.whatif.max-concurrent", api.DefaultWhatIfConcurrency, "what-ifs (POST /api/v1/audit/whatif) running at once per role; more are answered 429 (each holds up to --web.whatif.max-flow-groups flow groups in memory)")
	fs.IntVar(&l.WhatIfConcurrencyPerToken, "web.whatif.max-concurrent-per-token", api.DefaultWhatIfConcurrencyPerToken, "what-ifs running at once per token (without tokens: for the local user)")
	fs.Int64Var(&l.WhatIfMaxChecks, "web.whatif.max-checks", audit.DefaultWhatIfMaxChecks, "policy checks of one what-if: its flow groups, each against the policies that may select its ends, before and after the proposal; a larger what-if is answered 422 before it reads any flow (10 to 60 ns a check)")
	fs.IntVar(&l.WhatIfMaxFlowGroups, "web.whatif.max-flow-groups", audit.DefaultWhatIfMaxFlowGroups, "flow groups one what-if reads, its largest limit (about 2 KiB of memory each)")
	fs.IntVar(&l.ReachabilityConcurrency, "web.reachability.max-concurrent", api.DefaultReachabilityConcurrency, "reachability matrices (POST /api/v1/reachability) computed at once per role; more are answered 429")
	fs.IntVar(&l.ReachabilityConcurrencyPerToken, "web.reachability.max-concurrent-per-token", api.DefaultReachabilityConcurrencyPerToken, "reachability matrices computed at once per token (without tokens: for the local user)")
	fs.Int64Var(&l.ReachabilityMaxChecks, "web.reachability.max-checks", api.DefaultReachabilityMaxChecks, "policy checks of one reachability matrix: its pod pairs, each against the policies that may select its ends; a larger matrix is answered 422 before any pair is evaluated (10 to 60 ns a check)")
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
	if cfg.Addr == "" {
		cfg.Addr = DefaultAddr
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 5 * time.Second
	}
	tokens := cfg.Tokens
	if tokens == nil && cfg.TokensFile != "" {
		t, err := api.LoadTokens(cfg.TokensFile, reload.Options{Name: "web-tokens", Logger: cfg.Logger})
		if err != nil {
			return nil, err
		}
		tokens = t
	}
	authenticated := tokens.Enabled()
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
	a, err := api.New(api.Config{
		Store: cfg.Store, Database: cfg.Database, SQL: cfg.SQL,
		Evaluator: cfg.Evaluator, Tracer: cfg.Tracer,
		AuditAPI: cfg.AuditAPI, Traceflows: cfg.Traceflows, Catalog: cfg.Catalog, Status: cfg.Status,
		Tokens: tokens, Anonymous: anonymous, LocalTokenFile: localTokenFile, SQLMaxRows: cfg.SQLMaxRows, SQLMaxTime: cfg.SQLMaxTime, SQLMaxMemory: cfg.SQLMaxMemory,
		SQLConcurrency: cfg.Limits.SQLConcurrency, SQLMaxThreads: cfg.Limits.SQLMaxThreads,
		FollowStreams: cfg.Limits.FollowStreams, FollowStreamsPerRole: cfg.Limits.FollowStreamsPerRole,
		SQLConcurrencyPerToken: cfg.Limits.SQLConcurrencyPerToken, FollowStreamsPerToken: cfg.Limits.FollowStreamsPerToken,
		WhatIfConcurrency: cfg.Limits.WhatIfConcurrency, WhatIfConcurrencyPerToken: cfg.Limits.WhatIfConcurrencyPerToken,
		ReachabilityConcurrency: cfg.Limits.ReachabilityConcurrency, ReachabilityConcurrencyPerToken: cfg.Limits.ReachabilityConcurrencyPerToken,
		Registerer: cfg.Registerer, Gatherer: cfg.Gatherer, Logger: cfg.Logger, Ready: cfg.Ready,
	})
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger, addr: cfg.Addr, auth: authenticated}
	if !s.auth {
		host, port, err := net.SplitHostPort(cfg.Addr)
		if err != nil {
			return nil, fmt.Errorf("web: addr %q: %w", cfg.Addr, err)
		}
		if ip := net.ParseIP(strings.Trim(host, "[]")); ip == nil || !ip.IsLoopback() {
			s.addr = net.JoinHostPort("127.0.0.1", port)
		}
	}
	mux := http.NewServeMux()
	apiH := a.Handler()
	mux.Handle("/api/", apiH)
	mux.Handle("/healthz", apiH)
	mux.Handle("/readyz", apiH)
	mux.Handle("/metrics", apiH)
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

// Handler returns the server's handler (API and UI), for tests.
func (s *Server) Handler() http.Handler { return s.handler }

// Addr is the address Run listens on (loopback when no tokens are set).
func (s *Server) Addr() string { return s.addr }

// Run listens and serves until ctx is cancelled, then shuts down
// gracefully. It returns early on a listen error.
func (s *Server) Run(ctx context.Context) error {
	ln, err := listen(s)
	if err != nil {
		return fmt.Errorf("web: listen %s: %w", s.addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve is Run on an existing listener, which it closes.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.auth {
		s.log.Info("serving the web UI and API", "url", "http://"+ln.Addr().String()+"/", "auth", "bearer tokens")
	} else {
		msg := "serving the web UI and API without authentication, on loopback only (set tokens to listen elsewhere)"
		if s.addr != s.cfg.Addr {
			msg = "no tokens configured: listening on loopback only instead of " + s.cfg.Addr
		}
		s.log.Warn(msg, "url", "http://"+ln.Addr().String()+"/")
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
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("web: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	err := srv.Shutdown(sctx)
	<-errc
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("web: shutdown: %w", err)
	}
	_ = srv.Close() // follow streams outlive Shutdown
	return nil
}

// listen opens the server's listener.
func listen(s *Server) (net.Listener, error) { return net.Listen("tcp", s.addr) }
