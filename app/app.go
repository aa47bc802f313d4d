// Package app assembles the running product from one Config: the
// collector pipeline and its store (package collector), the web UI and
// REST API (package web), the policy audit over REST (collector/audit)
// and the traceflow controller (package traceflow). Everything the web
// answers about the cluster (names, reachability, audit findings,
// traceflow resolution) comes from the collector's live Kubernetes view:
// informers in a cluster or through a kubeconfig, or the reloaded
// inventory files.
//
// `dualflow collector` runs an App; `dualflow demo` runs the same App
// next to a lab, and adds only the lab, its exporters and the lab's node
// tracer (Options.NodeTracer).
//
//	a, err := app.New(ctx, cfg, log, app.Options{})
//	err = a.Run(ctx) // until ctx ends; flushes the store and stops the web
//
// On every node, `dualflow exporter` runs a Node: the exporter and,
// beside it, the traceflow agent (so neither package imports the other).
package app

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/audit/recommend"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/internal/reload"
	"github.com/dualflow/dualflow/netaddr"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/agent"
	"github.com/dualflow/dualflow/traceflow/probes"
	"github.com/dualflow/dualflow/web"
	"github.com/dualflow/dualflow/web/api"
)

// Config configures the product.
type Config struct {
	Collector collector.Config
	Web       WebConfig
	// Traceflow configures the trace controller (timeouts, results kept,
	// rate limits, destinations outside the cluster).
	Traceflow traceflow.Config
	// TraceAgents says where the exporters' traceflow agents are and how
	// to call them; traces go through them when it is enabled (a token).
	TraceAgents agent.DirectoryConfig
}

// WebConfig configures the web UI and REST API.
type WebConfig struct {
	// Addr is the listen address ("" disables the web). Without tokens it
	// is forced to loopback.
	Addr string
	// TokensFile holds "token role [name]" lines (roles viewer, operator).
	TokensFile string
	// LocalTokenFile holds the operator token of a web without TokensFile
	// (loopback, where requests without a token are viewers); empty means
	// <data-dir>/web-operator-token for the embedded store, none for a
	// server.
	LocalTokenFile string
	// AllowedHosts are the host names the web answers to besides IP
	// literals and localhost (DNS rebinding protection).
	AllowedHosts netaddr.HostList
	// Limits bound concurrent /sql queries and follow streams per role.
	Limits api.Limits
	// TLSCert and TLSKey serve the web over HTTPS (both or neither).
	TLSCert, TLSKey string
	// Kubernetes makes the cluster's users the web's: tokens checked
	// with TokenReview, permissions with SubjectAccessReview
	// (api.KubeAuth); it needs the collector's Kubernetes client.
	Kubernetes bool
	// Audiences a Kubernetes token must carry one of (empty: the API
	// server's).
	Audiences netaddr.HostList
	// KubeCacheTTL caches the reviews' answers (0: the defaults).
	KubeCacheTTL time.Duration
	// RequestHeader* trust an authenticating proxy's X-Remote-User and
	// X-Remote-Group on a connection whose client certificate
	// RequestHeaderCA signed (needs TLSCert and Kubernetes).
	RequestHeaderCA           string
	RequestHeaderAllowedNames netaddr.HostList
}

// BindFlags registers the collector's flags and the web's (--web.*).
func (c *Config) BindFlags(fs *flag.FlagSet) {
	c.Collector.BindFlags(fs)
	fs.StringVar(&c.Web.Addr, "web.addr", web.DefaultAddr, "serve the web UI and REST API (/api/v1) here; empty disables. Without --web.tokens-file it is forced to loopback")
	c.Web.Limits.BindFlags(fs)
	fs.Var(&c.Web.AllowedHosts, "web.allowed-hosts", "host names the web answers to besides IP addresses and localhost, comma-separated (the names operators browse it by); other Host headers get 403 (DNS rebinding protection)")
	fs.StringVar(&c.Web.TokensFile, "web.tokens-file", "", "bearer tokens file (\"token role [name]\" lines; roles viewer, operator); required to listen on a non-loopback address")
	fs.StringVar(&c.Web.LocalTokenFile, "web.local-token-file", "", "without --web.tokens-file: the file of the operator token (created, mode 0600) that SQL and traces need even on loopback, where requests without a token are viewers; the CLI reads it (default <data-dir>/"+web.LocalTokenFileName+" for the embedded store; with a ClickHouse server, none: no operator without tokens)")
	fs.StringVar(&c.Web.TLSCert, "web.tls-cert", "", "PEM certificate (chain first) to serve the web over HTTPS; with --web.tls-key. Reloaded when it changes")
	fs.StringVar(&c.Web.TLSKey, "web.tls-key", "", "PEM private key of --web.tls-cert")
	fs.BoolVar(&c.Web.Kubernetes, "web.kubernetes-auth", false, "authenticate Kubernetes users' and ServiceAccounts' bearer tokens with the TokenReview API and authorize them with SubjectAccessReview (list pods in all namespaces to read; create traceflows.dualflow.io to trace; create sql.dualflow.io to run SQL; get /metrics); the collector needs tokenreviews and subjectaccessreviews create. Works beside --web.tokens-file")
	fs.Var(&c.Web.Audiences, "web.kubernetes-auth.audiences", "audiences a Kubernetes token must carry one of, comma-separated (default: the API server's own, as kubectl's and pods' default tokens carry)")
	fs.DurationVar(&c.Web.KubeCacheTTL, "web.kubernetes-auth.cache-ttl", api.DefaultKubeAccessTTL, "how long a TokenReview's or SubjectAccessReview's answer is reused: a revoked token or RoleBinding stops working within it")
	fs.StringVar(&c.Web.RequestHeaderCA, "web.requestheader-client-ca", "", "with --web.kubernetes-auth and --web.tls-cert: trust the X-Remote-User and X-Remote-Group headers of an authenticating proxy (oauth2-proxy, ...) whose client certificate this PEM CA signed; headers from any other client are ignored")
	fs.Var(&c.Web.RequestHeaderAllowedNames, "web.requestheader-allowed-names", "common names the proxy's client certificate may have, comma-separated (empty: any the CA signed)")
	c.TraceAgents.BindFlags(fs)
	c.Traceflow.BindFlags(fs)
}

// NodeTracer sends one traceflow probe and observes it on the nodes it
// crosses: the exporters' agents (traceflow/agent.Cluster).
type NodeTracer interface {
	Trace(ctx context.Context, p traceflow.Probe) (traceflow.Path, error)
}

// Options are the parts an App does not build itself.
type Options struct {
	// NodeTracer runs traces. nil: the node agents of
	// Config.TraceAgents, or, when that is not enabled, the traceflow
	// routes answer 501.
	NodeTracer NodeTracer
}

// App is the running product. Create it with New, then call Run once.
type App struct {
	cfg Config
	log *slog.Logger
	c   *collector.Collector

	web   *web.Server // nil when the web is off
	webLn net.Listener
	tf    *traceflow.Controller // nil without a node tracer
}

// New builds the collector (opening the store and applying migrations)
// and the web server, and binds the web's listener, so that a bad address
// fails here. The caller must call Run, which releases everything.
func New(ctx context.Context, cfg Config, log *slog.Logger, opts Options) (*App, error) {
	log = cmp.Or(log, slog.Default())
	c, err := collector.New(ctx, cfg.Collector, log)
	if err != nil {
		return nil, err
	}
	a := &App{cfg: cfg, log: log, c: c}
	if cfg.Web.Addr == "" {
		return a, nil
	}
	if err := a.buildWeb(opts); err != nil {
		a.close()
		return nil, fmt.Errorf("web: %w", err)
	}
	return a, nil
}

// close releases what New built, for a failed New.
func (a *App) close() {
	if a.webLn != nil {
		a.webLn.Close()
	}
	if a.tf != nil {
		a.tf.Close()
	}
	a.c.Close()
}

// webAuth sets cfg's HTTPS and Kubernetes identities from the flags.
func (a *App) webAuth(cfg *web.Config) error {
	w := a.cfg.Web
	if (w.TLSCert == "") != (w.TLSKey == "") {
		return errors.New("--web.tls-cert and --web.tls-key go together")
	}
	if w.TLSCert != "" {
		t, err := reload.LoadTLS(reload.TLSFiles{Cert: w.TLSCert, Key: w.TLSKey}, reload.Options{Name: "web-tls", Logger: a.log})
		if err != nil {
			return fmt.Errorf("web TLS: %w", err)
		}
		a.c.Registry().MustRegister(reload.Metrics(t))
		cfg.TLS = t
	}
	if w.RequestHeaderCA != "" && (!w.Kubernetes || w.TLSCert == "") {
		return errors.New("--web.requestheader-client-ca needs --web.kubernetes-auth (the proxy's users are Kubernetes users) and --web.tls-cert (the proxy's certificate is checked on the TLS connection)")
	}
	if !w.Kubernetes {
		return nil
	}
	var client kubernetes.Interface
	if e := a.c.Enricher(); e != nil {
		client = e.Client()
	}
	if client == nil {
		return errors.New("--web.kubernetes-auth needs the collector's Kubernetes client (--k8s.source in-cluster or kubeconfig)")
	}
	cfg.Kube = &api.KubeAuth{Client: client, Audiences: w.Audiences,
		TokenTTL: w.KubeCacheTTL, AllowTTL: w.KubeCacheTTL, DenyTTL: w.KubeCacheTTL, FailedTokenTTL: min(w.KubeCacheTTL, api.DefaultKubeFailedTokenTTL)}
	if w.RequestHeaderCA != "" {
		cfg.Kube.RequestHeader = &api.RequestHeader{ClientCAFile: w.RequestHeaderCA, AllowedNames: w.RequestHeaderAllowedNames}
	}
	return nil
}

func (a *App) buildWeb(opts Options) error {
	c := a.c
	db := c.Database()
	reports, err := audit.NewReports(c.Conn(), db)
	if err != nil {
		return err
	}
	lim := a.cfg.Web.Limits
	reports.WhatIfLimits = audit.WhatIfLimits{MaxChecks: lim.WhatIfMaxChecks, MaxFlowGroups: lim.WhatIfMaxFlowGroups}
	v := &view{c: c}
	aq := &audit.Queries{Reports: reports, Cluster: v.cluster}
	cfg := web.Config{
		Addr:         a.cfg.Web.Addr,
		TokensFile:   a.cfg.Web.TokensFile,
		AllowedHosts: a.cfg.Web.AllowedHosts,
		Config: api.Config{
			Store:          c.Conn(),
			Database:       db,
			LocalTokenFile: a.cfg.Web.LocalTokenFile,
			Limits:         a.cfg.Web.Limits,
			Evaluator: audit.PolicyEvaluator{
				Policies: func() *policy.Set {
					if au := c.Auditor(); au != nil {
						return au.Policies()
					}
					return nil
				},
				Resolver:  audit.ClusterResolver{Cluster: v.cluster},
				MaxChecks: lim.ReachabilityMaxChecks,
			},
			Catalog:    v,
			Status:     v,
			Audit:      aq,
			Recommend:  &recommend.Queries{Queries: aq, MaxFlowGroups: lim.RecommendMaxFlowGroups},
			Registerer: c.Registry(),
			Gatherer:   c.Registry(),
			Logger:     a.log.With("stage", "web"),
			Ready:      c.Readiness,
		},
	}
	if err := a.webAuth(&cfg); err != nil {
		return err
	}
	if _, ok := c.Conn().(*store.Embedded); ok {
		if cfg.LocalTokenFile == "" {
			cfg.LocalTokenFile = filepath.Join(a.cfg.Collector.Store.DataDir, web.LocalTokenFileName)
		}
	}
	if opts.NodeTracer == nil && a.cfg.TraceAgents.Enabled() {
		ac := a.cfg.TraceAgents
		ac.DisableIPv6 = !a.cfg.Collector.K8s.EnableIPv6
		ac.Logger = a.log.With("stage", "traceflow")
		dir, err := agent.NewDirectory(ac, nodeView{c})
		if err != nil {
			return fmt.Errorf("traceflow agents: %w", err)
		}
		if err := c.Registry().Register(dir.Metrics()); err != nil {
			return fmt.Errorf("traceflow agents metrics: %w", err)
		}
		opts.NodeTracer = &agent.Cluster{Agents: dir, Policies: resolver{c: c}}
	}
	if opts.NodeTracer != nil {
		tcfg := a.cfg.Traceflow
		tcfg.Logger = a.log.With("stage", "traceflow")
		// The probes the controller sends, so that the enrichment marks
		// their flow records (probe_trace_id) and readers leave them out.
		tcfg.Probes = probes.New(probes.Config{})
		if err := c.Registry().Register(tcfg.Probes); err != nil {
			return fmt.Errorf("traceflow probe metrics: %w", err)
		}
		if e := c.Enricher(); e != nil {
			e.SetProbes(tcfg.Probes)
		}
		a.tf = traceflow.New(tcfg, opts.NodeTracer, resolver{c: c}, traceflow.NewStore(c.Conn(), db))
		cfg.Traces = a.tf
	}
	srv, err := web.New(cfg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", srv.Addr())
	if err != nil {
		return fmt.Errorf("listen %s: %w", srv.Addr(), err)
	}
	a.web, a.webLn = srv, ln
	return nil
}

// Collector returns the collector (its store, registry, IPFIX addresses).
func (a *App) Collector() *collector.Collector { return a.c }

// WebURL returns the web's base URL ("http://127.0.0.1:8080/"), "" when
// the web is off.
func (a *App) WebURL() string {
	if a.webLn == nil {
		return ""
	}
	return "http://" + a.webLn.Addr().String() + "/"
}

// Ready is closed once the collector serves (Kubernetes caches synced,
// IPFIX listeners on).
func (a *App) Ready() <-chan struct{} { return a.c.Ready() }

// Run runs the collector and the web until ctx ends (or either fails),
// then stops both: the web stops taking requests and gives those in flight
// its shutdown timeout, the collector flushes its pipeline and store, and
// traces still in flight are cancelled. It returns the errors of either.
func (a *App) Run(ctx context.Context) error {
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	collectorDone := make(chan error, 1)
	go func() { collectorDone <- a.c.Run(runCtx) }()
	var webErr error
	webDone := make(chan struct{})
	if a.web != nil {
		go func() {
			defer close(webDone)
			webErr = a.web.Serve(runCtx, a.webLn)
			if webErr != nil {
				cancel() // a dead web stops the product: the operator must see it
			}
		}()
	} else {
		close(webDone)
	}
	err := <-collectorDone
	cancel()
	<-webDone
	if a.tf != nil {
		a.tf.Close()
	}
	if webErr != nil && !errors.Is(webErr, context.Canceled) {
		err = errors.Join(err, webErr)
	}
	return err
}
