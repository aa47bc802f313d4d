package app

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/exporter"
	"github.com/dualflow/dualflow/internal/httpserve"
	"github.com/dualflow/dualflow/internal/reload"
	"github.com/dualflow/dualflow/netaddr"
	"github.com/dualflow/dualflow/nsrun"
	"github.com/dualflow/dualflow/traceflow/agent"
	"github.com/dualflow/dualflow/traceflow/node"
)

// NodeConfig configures what runs on every node (`dualflow exporter`).
// Bind it to a flag set with BindFlags, then Exporter.SetDefaults and
// Validate.
type NodeConfig struct {
	Exporter exporter.Config
	Agent    AgentConfig // the traceflow agent: off unless Addr or Listener is set
}

// BindFlags registers the exporter's flags and the agent's (--traceflow.*);
// start from exporter.NewConfig.
func (c *NodeConfig) BindFlags(fs *flag.FlagSet) {
	c.Exporter.BindFlags(fs)
	c.Agent.bindFlags(fs)
}

// Validate checks the configuration and loads the agent's token and TLS
// files.
func (c *NodeConfig) Validate() error {
	return errors.Join(c.Agent.validate(c.Exporter.Logger), c.Exporter.Validate())
}

// AgentConfig configures the node's traceflow agent: the API the
// collector's traceflow controller calls to watch for probes on this node
// and to inject them from this node's pods (package traceflow/agent).
type AgentConfig struct {
	// Addr is where the agent listens; empty disables it (the default).
	Addr string
	// TokenFile holds the bearer token every call must carry, unless
	// $DUALFLOW_TRACEFLOW_TOKEN is set. The agent never runs without one.
	TokenFile string
	// CertFile and KeyFile serve TLS; required on a non-loopback address.
	// They and ClientCAFile are read again when they change, for the
	// connections made after (package reload).
	CertFile, KeyFile string
	// ClientCAFile, when set, requires client certificates signed by it
	// (mutual TLS with the collector).
	ClientCAFile string
	// NFT is the nft binary the kernel datapath traces with (default: nft
	// on PATH).
	NFT string
	// OVSUplink is the OVS port packets from other nodes enter the bridge
	// by (default eth0; e.g. a tunnel port such as antrea-tun0).
	OVSUplink string
	// Limits bound the probes the agent sends, per caller and for the
	// node (agent.DefaultLimits unless the flags say otherwise).
	Limits agent.Limits
	// Listener, when set, is used instead of listening on Addr (tests, the
	// demo).
	Listener net.Listener

	token string      // loaded by Validate
	tls   *reload.TLS // loaded by Validate, reloaded when the files change
}

func (c *AgentConfig) bindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Addr, "traceflow.addr", c.Addr, "serve the traceflow node agent here (empty: off); needs a token (--traceflow.token-file or $"+agent.TokenEnv+"), and TLS on a non-loopback address")
	fs.StringVar(&c.TokenFile, "traceflow.token-file", c.TokenFile, "file holding the bearer token the collector must send (or $"+agent.TokenEnv+")")
	fs.StringVar(&c.CertFile, "traceflow.tls-cert", c.CertFile, "PEM certificate the agent serves TLS with")
	fs.StringVar(&c.KeyFile, "traceflow.tls-key", c.KeyFile, "PEM key of --traceflow.tls-cert")
	fs.StringVar(&c.ClientCAFile, "traceflow.client-ca", c.ClientCAFile, "PEM CA: require collector client certificates signed by it (mutual TLS)")
	fs.StringVar(&c.NFT, "traceflow.nft", c.NFT, "nft binary for the kernel datapath's traces (empty: nft on PATH)")
	fs.StringVar(&c.OVSUplink, "traceflow.ovs-uplink", c.OVSUplink, "OVS datapath: the bridge port packets from other nodes enter by (default eth0; a tunnel port such as antrea-tun0)")
	c.Limits = agent.DefaultLimits
	fs.Float64Var(&c.Limits.Caller.Rate, "traceflow.inject-rate", c.Limits.Caller.Rate, "probes each caller (client certificate subject, else address) may inject per second after its burst; more answer 429 with Retry-After (negative: no limit)")
	fs.IntVar(&c.Limits.Caller.Burst, "traceflow.inject-burst", c.Limits.Caller.Burst, "probes a caller may inject at once after a quiet while")
	fs.Float64Var(&c.Limits.Node.Rate, "traceflow.node-inject-rate", c.Limits.Node.Rate, "probes the node injects per second, all callers together, after its burst (negative: no limit)")
	fs.IntVar(&c.Limits.Node.Burst, "traceflow.node-inject-burst", c.Limits.Node.Burst, "probes the node injects at once after a quiet while, all callers together")
}

func (c *AgentConfig) enabled() bool { return c.Addr != "" || c.Listener != nil }

// validate loads the token and the TLS files, and refuses an agent that
// would listen beyond loopback without TLS.
func (c *AgentConfig) validate(log *slog.Logger) error {
	if !c.enabled() {
		return nil
	}
	tok, err := agent.LoadToken(c.TokenFile)
	if err != nil {
		return fmt.Errorf("--traceflow.addr: the agent injects packets, so it needs a token: %w", err)
	}
	c.token = tok
	if (c.CertFile == "") != (c.KeyFile == "") {
		return errors.New("--traceflow.tls-cert and --traceflow.tls-key go together")
	}
	if c.ClientCAFile != "" && c.CertFile == "" {
		return errors.New("--traceflow.client-ca needs --traceflow.tls-cert and --traceflow.tls-key")
	}
	if c.CertFile != "" {
		c.tls, err = reload.LoadTLS(reload.TLSFiles{Cert: c.CertFile, Key: c.KeyFile, CA: c.ClientCAFile},
			reload.Options{Name: "traceflow-agent", Logger: log})
		if err != nil {
			return fmt.Errorf("traceflow agent TLS: %w", err)
		}
	}
	if c.Listener == nil && c.tls == nil {
		host, _, err := net.SplitHostPort(c.Addr)
		if err != nil {
			return fmt.Errorf("--traceflow.addr %q: %w", c.Addr, err)
		}
		if !netaddr.Loopback(host) {
			return fmt.Errorf("--traceflow.addr %q is not loopback: serve it with TLS (--traceflow.tls-cert, --traceflow.tls-key), the token must not cross the network in clear", c.Addr)
		}
	}
	return nil
}

// Node is what runs on every node: the exporter, and beside it the
// traceflow agent when NodeConfig.Agent is enabled. Create it with
// NewNode, then call Run once.
type Node struct {
	cfg NodeConfig
	run func(context.Context) error // the exporter's Run
	reg prometheus.Registerer       // the exporter's metrics, which the agent's join
}

// agentShutdownGrace bounds the agent's open calls at shutdown.
const agentShutdownGrace = 2 * time.Second

// NewNode builds the exporter from cfg, which must have been through
// Exporter.SetDefaults and Validate.
func NewNode(cfg NodeConfig) (*Node, error) {
	e, err := exporter.New(cfg.Exporter)
	if err != nil {
		return nil, err
	}
	return &Node{cfg: cfg, run: e.Run, reg: e.Registerer()}, nil
}

// tracer returns the node tracer of the exporter's node and datapath.
func (n *Node) tracer(log *slog.Logger) (*node.Tracer, string) {
	ec := &n.cfg.Exporter
	t := &node.Tracer{Name: ec.NodeName, Logger: log.With("stage", "traceflow")}
	if ns := ec.NetNS; ns != "" {
		if !filepath.IsAbs(ns) {
			ns = nsrun.Path(ns)
		}
		t.NetNS = ns
	}
	if ec.Source == exporter.SourceOVS {
		t.OVS = &node.OVS{RunDir: ec.OVS.RunDir, Bridge: ec.OVS.Bridge, RulesFile: ec.OVS.RulesFile, Uplink: n.cfg.Agent.OVSUplink}
		return t, "ovs"
	}
	t.NFT = n.cfg.Agent.NFT
	if t.NFT == "" {
		p, err := exec.LookPath("nft")
		if err != nil {
			// Injection and OVS-less captures still work; kernel watches
			// answer "not supported" until nft is installed.
			log.Warn("traceflow agent: nft not found: kernel datapath traces will fail", "err", err)
		}
		t.NFT = p
	}
	return t, "kernel"
}

// Run serves the agent, its metrics joining the exporter's, then runs the
// exporter until ctx is done (see exporter.Exporter.Run). Once the
// exporter has flushed and stopped, it stops the agent. It returns an
// error only when either cannot start.
func (n *Node) Run(ctx context.Context) error {
	c := &n.cfg.Agent
	if !c.enabled() {
		return n.run(ctx)
	}
	log := cmp.Or(n.cfg.Exporter.Logger, slog.Default())
	t, dp := n.tracer(log)
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := t.RemoveStaleTables(rctx); err != nil {
		log.Warn("traceflow agent", "err", err)
	}
	cancel()
	ln := c.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", c.Addr); err != nil {
			return fmt.Errorf("traceflow agent listener: %w", err)
		}
	}
	var opts []agent.HandlerOption
	if c.Limits != (agent.Limits{}) {
		opts = append(opts, agent.WithLimits(c.Limits))
	}
	n.reg.MustRegister(reload.Metrics(c.tls))
	h := agent.Handler(t, agent.Info{Node: n.cfg.Exporter.NodeName, Datapath: dp}, c.token, agent.NewMetrics(n.reg), opts...)
	// No write timeout: a watch streams for as long as its own timeout
	// (at most agent.MaxTimeout), which the handler enforces.
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		IdleTimeout: 2 * time.Minute, ErrorLog: nil}
	if c.tls != nil {
		srv.TLSConfig = c.tls.ServerConfig()
	}
	sctx, stop := context.WithCancel(ctx) // ends when run returns, whatever the reason
	served := make(chan struct{})
	go func() {
		defer close(served)
		if err := httpserve.Serve(sctx, srv, ln, agentShutdownGrace); err != nil {
			log.Error("traceflow agent stopped", "err", err)
		}
	}()
	log.Info("traceflow agent listening", "addr", ln.Addr().String(), "datapath", dp, "tls", c.tls != nil, "mtls", c.ClientCAFile != "")
	defer func() {
		stop()
		<-served
		t.Close()
	}()
	return n.run(ctx)
}
