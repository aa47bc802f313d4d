package labcmd

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/app"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/ipfix"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/exporter"
	"github.com/dualflow/dualflow/internal/chsql"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/web"
)

// demoIPFIXPort is the loopback port the demo's exporters send to, unless
// --collector.ipfix.tcp-addr or udp-addr say otherwise.
const demoIPFIXPort = "4739"

// Demo runs `dualflow demo [flags]`: the product (package app) next to a
// lab, with one exporter per lab node (each serving its node's traceflow
// agent).
func (lc *Commands) Demo(ctx context.Context, args []string) error {
	fs := lc.NewFlagSet("demo", "[flags]", `Start the whole product on one machine (what 'make run' does): a dual-stack
lab of network namespaces with live traffic (allowed and denied connections,
and a dual-stack policy gap), one exporter per lab node, and the product of
'dualflow collector' (embedded ClickHouse, web UI and REST API) with the lab's
Kubernetes objects as its inventory; traces go through the exporters' node
agents, as on a cluster.
It prints the URLs and runs until Ctrl-C, then stops everything and removes
the lab. Needs root for the lab. Every collector and web flag applies.

IPFIX listens on TCP 127.0.0.1:4739 and [::1]:4739 only, unless
--collector.ipfix.tcp-addr or --collector.ipfix.udp-addr are given: then
they are used as given, and the lab's exporters send to the first TCP
listener (UDP if there is none), over IPv6 when the lab has IPv6 and a
listener takes it.`)
	started := time.Now()
	var acfg app.Config
	cfg := &acfg.Collector
	cfg.Store.HTTPAddr = store.DefaultHTTPAddr
	cfg.Store.TTLDays = 7
	acfg.BindFlags(fs)
	dataDir := fs.String("data-dir", "var/data", "embedded store data directory (same as --clickhouse.data-dir)")
	var labCfg lab.Config
	bindLab(fs, &labCfg)
	fs.StringVar(&labCfg.Datapath, "datapath", lab.DatapathKernel, "lab node datapath: kernel (nftables) or ovs (Open vSwitch userspace)")
	activeTimeout := fs.Duration("demo.active-timeout", 10*time.Second, "exporters' active timeout: how often long connections are exported")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := demoListeners(fs, &cfg.IPFIX); err != nil {
		return err
	}
	cfg.Store.DataDir = cmp.Or(cfg.Store.DataDir, *dataDir)
	labCfg.SetDefaults()
	// A second demo on the same lab or data directory refuses before it
	// touches either: Down below would otherwise remove the running
	// demo's lab.
	lock, err := lockDemo(labCfg.StateDir)
	if err != nil {
		if errors.Is(err, os.ErrPermission) && os.Geteuid() != 0 {
			return errors.New("demo: the lab needs root (network namespaces); run it as root")
		}
		return err
	}
	defer lock.Unlock()
	// Down removes namespaces by prefix: another state directory with the
	// same prefix is the same lab.
	plock, err := lockPrefix(labCfg.Prefix)
	if err != nil {
		return err
	}
	defer plock.Unlock()
	if held, holder := chdb.DirHolder(cfg.Store.DataDir); held {
		return &refusal{
			msg:    fmt.Sprintf("%v: the data directory %s is in use (%s); it was left as it is: stop that process first, or pass another --data-dir", ErrDemoRunning, cfg.Store.DataDir, cmp.Or(holder, "holder unknown")),
			causes: []error{ErrDemoRunning, chdb.ErrLocked},
		}
	}
	if os.Geteuid() != 0 {
		return errors.New("demo: the lab needs root (network namespaces); run it as root")
	}
	cfg.Version = lc.Version
	log := slog.Default()

	exe, err := os.Executable()
	if err != nil {
		return err
	}
	labCfg.AgentBinary, labCfg.Traffic = exe, true
	// A previous demo killed hard may have left a lab behind.
	if err := lab.Down(labCfg.StateDir, labCfg.Prefix); err != nil {
		log.Warn("removing a previous lab", "err", err)
	}
	l, err := lab.Up(ctx, labCfg)
	if err != nil {
		return fmt.Errorf("lab up: %w", err)
	}
	defer func() {
		if err := l.Down(); err != nil {
			log.Error("lab down", "err", err)
		} else {
			log.Info("lab removed")
		}
	}()

	// The product runs as on a cluster (see StartProduct).
	p, err := StartProduct(ctx, l, acfg, ProductOptions{ActiveTimeout: *activeTimeout, Logger: log})
	if err != nil {
		return err
	}
	a := p.App
	mode := l.Mode()
	// `dualflow trace` without --server finds the REST API here.
	urlFile := filepath.Join(labCfg.StateDir, webURLFile)
	if err := os.WriteFile(urlFile, []byte(a.WebURL()+"\n"), 0o644); err != nil {
		log.Warn("writing the web URL for dualflow trace", "err", err)
	}
	defer os.Remove(urlFile)
	abs, _ := filepath.Abs(cfg.Store.DataDir)
	tokenFile := filepath.Join(abs, web.LocalTokenFileName)
	if err := os.WriteFile(filepath.Join(labCfg.StateDir, webTokenFile), []byte(tokenFile+"\n"), 0o644); err != nil {
		log.Warn("writing the token file's name for dualflow trace", "err", err)
	}
	defer os.Remove(filepath.Join(labCfg.StateDir, webTokenFile))
	collectorAddr, transport := p.IPFIXTarget, p.IPFIXTransport

	st := cfg.Store
	st.SetDefaults()
	usersFile, _ := filepath.Abs(st.HTTPUsersFile)
	fmt.Printf(`
dualflow is running: lab mode %[4]s (%[5]s datapath), %[6]d nodes, exporters on every node.
  Web UI and API   %[10]s   (REST under /api/v1, OpenAPI at /api/v1/openapi.json)
      a local browser or client without a token is a viewer; SQL and traces need the
      operator token in %[14]s (mode 0600; bin/dualflow reads it, the UI asks for it)
  ClickHouse HTTP  http://%[1]s/   (embedded store in %[2]s)
      users reader (read-only), admin (read-write) and inserter; passwords in %[11]s
      curl -u reader:PASSWORD 'http://%[1]s/?query=SELECT+ip_version,count()+FROM+dualflow.flows+GROUP+BY+ip_version'
      bin/dualflow sql "SELECT src_pod_name, dst_pod_name, ip_version, ingress_verdict FROM dualflow.flows ORDER BY flow_end DESC LIMIT 10"
  Metrics          http://%[3]s/metrics
  IPFIX            the lab's exporters send to %[12]s
  Lab              bin/dualflow lab status
  Audit            bin/dualflow audit findings --server %[10]s
  Traceflow        bin/dualflow trace --server %[10]s -s frontend/%[8]s -d svc:backend/api:80 --family dual
                   (through the exporters' node agents: %[13]s)
Flows appear within about %[9]s. Press Ctrl-C to stop and remove the lab.

`, a.Collector().HTTPAddr(), abs, a.Collector().MetricsAddr(), mode, labCfg.Datapath, len(l.Manifest.Nodes), l.ManifestPath(), webPod(l), *activeTimeout+5*time.Second, a.WebURL(), usersFile, transport+" "+collectorAddr, agentList(p.Agents), tokenFile)

	go reportFirstFlows(ctx, a.Collector().Conn(), a.Collector().Database(), started, a.WebURL(), os.Stdout, log)
	return p.Run(ctx)
}

// reportFirstFlows prints, once, how long after started the first flows
// that ended after it were stored, per family (the time to first flow of make run's demo), by
// asking the store every second until it has some. An error is logged at
// debug level and asked again: the store may still be starting.
func reportFirstFlows(ctx context.Context, conn store.Conn, db string, started time.Time, webURL string, out io.Writer, log *slog.Logger) {
	// Only this demo's flows: the data directory may hold a previous run's.
	q := "SELECT ip_version, count() AS n FROM " + chsql.Ident(db) + ".flows WHERE " + chsql.FlowEndCol + " >= " + chsql.Time(started) +
		" GROUP BY ip_version ORDER BY ip_version" + chsql.JSONSettings(64<<20)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		raw, err := conn.Query(ctx, q, "JSONEachRow")
		if err != nil {
			log.Debug("first flows: asking the store", "err", err)
			continue
		}
		rows, err := chsql.Decode[struct {
			Family uint8  `json:"ip_version"`
			N      uint64 `json:"n"`
		}](raw)
		if err != nil || len(rows) == 0 {
			continue
		}
		var per []string
		for _, r := range rows {
			per = append(per, fmt.Sprintf("IPv%d %d", r.Family, r.N))
		}
		fmt.Fprintf(out, "First flows stored %s after the demo started (%s): %s#/flows\n",
			time.Since(started).Round(100*time.Millisecond), strings.Join(per, ", "), webURL)
		return
	}
}

// agentList is "node-1 URL, node-2 URL".
func agentList(m map[string]string) string {
	var out []string
	for n, u := range m {
		out = append(out, n+" "+u)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// webPod names the first web pod of the lab, for the trace example.
func webPod(l *lab.Lab) string {
	if p, err := l.PodOn(manifest.NSFrontend, "web", 1); err == nil {
		return p.Name
	}
	return "web"
}

// demoListeners sets the IPFIX listeners of the demo: TCP on loopback
// only, in both families, unless --collector.ipfix.tcp-addr or udp-addr
// were given, which are then kept as given (the other transport keeps the
// demo's choice). The lab's exporters need a TCP or UDP listener: they
// have no client certificate for TLS.
func demoListeners(fs *flag.FlagSet, ic *ipfix.Config) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["collector.ipfix.tcp-addr"] {
		ic.TCPAddrs = []string{"127.0.0.1:" + demoIPFIXPort, "[::1]:" + demoIPFIXPort}
	}
	if !set["collector.ipfix.udp-addr"] {
		ic.UDPAddrs = nil
	}
	if len(ic.TCPAddrs)+len(ic.UDPAddrs) == 0 {
		return errors.New("demo: --collector.ipfix.tcp-addr and --collector.ipfix.udp-addr are both empty: the lab's exporters send over TCP or UDP")
	}
	return nil
}

// demoTarget picks where the lab's exporters send, among the bound IPFIX
// listeners (by transport, as Collector.IPFIXAddrs gives them): the first
// TCP one, else the first UDP one, in IPv6 when ipv6 and a listener of
// that transport takes it. A listener on every address is reached on
// loopback.
func demoTarget(bound map[string][]net.Addr, ipv6 bool) (addr, transport string, err error) {
	for _, tr := range []string{"tcp", "udp"} {
		var first netip.AddrPort
		for _, a := range bound[tr] {
			ap, err := netip.ParseAddrPort(a.String())
			if err != nil {
				continue
			}
			ip := ap.Addr().Unmap()
			v6 := ip.Is6() // "[::]" takes both families
			switch {
			case ip.IsUnspecified() && (ip.Is6() && ipv6):
				ip = netip.IPv6Loopback()
			case ip.IsUnspecified():
				ip, v6 = netip.AddrFrom4([4]byte{127, 0, 0, 1}), false
			}
			ap = netip.AddrPortFrom(ip, ap.Port())
			if v6 == ipv6 {
				return ap.String(), tr, nil
			}
			if !first.IsValid() {
				first = ap
			}
		}
		if first.IsValid() {
			return first.String(), tr, nil
		}
	}
	return "", "", errors.New("demo: no TCP or UDP IPFIX listener for the lab's exporters")
}

// ProductOptions tune StartProduct.
type ProductOptions struct {
	// ActiveTimeout is the exporters' active timeout (default 10s).
	ActiveTimeout time.Duration
	Logger        *slog.Logger
	// AgentURLs override the controller's URL of some nodes' agents, and
	// ControllerTokenFile its token file (tests of an agent that is down,
	// or that refuses the controller's token).
	AgentURLs           map[string]string
	ControllerTokenFile string
	// ExporterMetrics serves each exporter's /metrics (and /healthz,
	// /readyz) on a loopback port of its own, Product.ExporterMetrics,
	// which RestartExporter keeps: a scrape target for a Prometheus beside
	// the lab. Without it the exporters serve none.
	ExporterMetrics bool
}

// Product is the product running on a lab: the app (collector, store, web
// and REST API, traceflow controller) and one exporter per lab node, each
// serving its node's traceflow agent.
type Product struct {
	App *app.App
	// IPFIXTarget and IPFIXTransport are where the exporters send.
	IPFIXTarget, IPFIXTransport string
	// Agents are the traceflow agents' URLs by node.
	Agents map[string]string
	// ExporterMetrics are the exporters' metrics addresses (host:port) by
	// node, with ProductOptions.ExporterMetrics.
	ExporterMetrics map[string]string

	stop      context.CancelFunc // the app
	done      chan error         // the app's Run
	expCtx    context.Context    // the exporters' parent: Stop cancels it
	stopExp   context.CancelFunc
	mu        sync.Mutex // guards nodes
	nodes     map[string]*labNode
	log       *slog.Logger
	tokenFile string // the agents' token, in the lab's state directory
}

// labNode is the exporter (and traceflow agent) of one lab node.
type labNode struct {
	cfg    app.NodeConfig // validated; Agent.Listener is set per run
	cancel context.CancelFunc
	done   chan error // its Run's result; nil when stopped
}

// StartProduct runs the product as on a cluster next to lab l: the app
// configured by cfg with the lab's Kubernetes objects as its inventory
// (reloaded when the lab changes them), and one exporter per lab node
// reading the node's conntrack (or OVS) and sending IPFIX to the app,
// each serving the node's traceflow agent (on loopback, with a token) that
// the app's traceflow controller reaches through --traceflow.agents.
// Nothing lab-specific is added to the product: the same flags drive it
// on a cluster. Stop stops it all.
func StartProduct(ctx context.Context, l *lab.Lab, cfg app.Config, opts ProductOptions) (*Product, error) {
	log := cmp.Or(opts.Logger, slog.Default())
	opts.ActiveTimeout = cmp.Or(opts.ActiveTimeout, 10*time.Second)
	cfg.Collector.K8s = enrich.NewConfig()
	cfg.Collector.K8s.Source = enrich.SourceInventory
	cfg.Collector.K8s.Inventory = []string{l.ManifestPath()}

	// The traceflow agents: a token shared with the controller, and one
	// loopback listener per node, bound now so the app knows the URLs.
	tokenFile, err := writeToken(l)
	if err != nil {
		return nil, err
	}
	p := &Product{Agents: map[string]string{}, log: log, tokenFile: tokenFile}
	listeners := map[string]net.Listener{}
	closeAll := func() {
		for _, ln := range listeners {
			ln.Close()
		}
	}
	for _, n := range l.Manifest.Nodes {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("traceflow agent of %s: %w", n.Name, err)
		}
		listeners[n.Name] = ln
		p.Agents[n.Name] = "http://" + ln.Addr().String()
	}
	cfg.TraceAgents.TokenFile, cfg.TraceAgents.Static = tokenFile, maps.Clone(p.Agents)
	maps.Copy(cfg.TraceAgents.Static, opts.AgentURLs)
	if opts.ControllerTokenFile != "" {
		cfg.TraceAgents.TokenFile = opts.ControllerTokenFile
	}
	a, err := app.New(ctx, cfg, log, app.Options{})
	if err != nil {
		closeAll()
		return nil, err
	}
	p.App = a
	// The product outlives the signal until the exporters have flushed.
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	p.stop, p.done = stop, make(chan error, 1)
	go func() { p.done <- a.Run(runCtx) }()
	select {
	case <-a.Ready():
	case err := <-p.done:
		closeAll()
		return nil, err
	case <-ctx.Done():
		closeAll()
		stop()
		return nil, errors.Join(ctx.Err(), <-p.done)
	}

	// One exporter per node, sending over IPv6 when the lab has IPv6 (as
	// a dual-stack node would).
	mode := l.Mode()
	p.IPFIXTarget, p.IPFIXTransport, err = demoTarget(a.Collector().IPFIXAddrs(), mode.Has(corev1.IPv6Protocol))
	if err != nil {
		closeAll()
		stop()
		return nil, errors.Join(err, <-p.done)
	}
	nftBin, _ := lab.NFTPath() // the OVS datapath does without
	// ctx bounds the start only: Stop ends them.
	p.expCtx, p.stopExp = context.WithCancel(context.WithoutCancel(ctx))
	p.nodes = map[string]*labNode{}
	if opts.ExporterMetrics {
		p.ExporterMetrics = map[string]string{}
	}
	for _, n := range l.Manifest.Nodes {
		ncfg := app.NodeConfig{Exporter: exporter.NewConfig()}
		ecfg := &ncfg.Exporter
		ecfg.NodeName, ecfg.MetricsAddr, ecfg.Logger = n.Name, "", log.With("exporter", n.Name)
		if opts.ExporterMetrics {
			// A port of its own that a restart binds again (the exporter
			// binds its metrics address itself).
			if ecfg.MetricsAddr, err = freeLoopbackAddr(); err != nil {
				closeAll()
				return nil, errors.Join(fmt.Errorf("exporter %s metrics: %w", n.Name, err), p.Stop())
			}
			p.ExporterMetrics[n.Name] = ecfg.MetricsAddr
		}
		ecfg.IPv4, ecfg.IPv6 = mode.Has(corev1.IPv4Protocol), mode.Has(corev1.IPv6Protocol)
		ecfg.NetNS = l.NodeNetNSPath(n.Name)
		if l.State().Datapath == lab.DatapathOVS {
			ecfg.Source = exporter.SourceOVS
			ecfg.OVS.RunDir, ecfg.OVS.RulesFile = l.OVSDir(n.Name), l.OVSRulesPath()
		}
		ecfg.PollInterval = 2 * time.Second
		ecfg.Store.ActiveTimeout, ecfg.Store.IdleTimeout = opts.ActiveTimeout, 5*time.Second
		ecfg.IPFIX.Address, ecfg.IPFIX.Transport = p.IPFIXTarget, p.IPFIXTransport
		ncfg.Agent.TokenFile, ncfg.Agent.NFT = tokenFile, nftBin
		ncfg.Exporter.SetDefaults()
		ln := listeners[n.Name]
		delete(listeners, n.Name) // the node owns it now
		if err := p.startNode(n.Name, ncfg, ln); err != nil {
			closeAll()
			return nil, errors.Join(err, p.Stop())
		}
	}
	return p, nil
}

// freeLoopbackAddr returns an address on 127.0.0.1 whose port was free a
// moment ago.
func freeLoopbackAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// startNode validates cfg and runs node's exporter, its traceflow agent
// serving on ln (which it then owns).
func (p *Product) startNode(node string, cfg app.NodeConfig, ln net.Listener) error {
	cfg.Agent.Listener = ln
	if err := cfg.Validate(); err != nil {
		ln.Close()
		return fmt.Errorf("exporter %s: %w", node, err)
	}
	n, err := app.NewNode(cfg)
	if err != nil {
		ln.Close()
		return fmt.Errorf("exporter %s: %w", node, err)
	}
	ctx, cancel := context.WithCancel(p.expCtx)
	done := make(chan error, 1)
	p.mu.Lock()
	p.nodes[node] = &labNode{cfg: cfg, cancel: cancel, done: done}
	p.mu.Unlock()
	go func() { done <- n.Run(ctx) }()
	return nil
}

// StopExporter stops the exporter (and traceflow agent) of node as a
// deleted pod stops: it flushes what it tracks to the collector and
// closes its listeners. It returns once it has stopped.
func (p *Product) StopExporter(node string) error {
	p.mu.Lock()
	n := p.nodes[node]
	var done chan error
	if n != nil {
		done, n.done = n.done, nil
	}
	p.mu.Unlock()
	if done == nil {
		return fmt.Errorf("exporter %s: not running", node)
	}
	n.cancel()
	err := <-done
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return err
}

// RestartExporter starts again the exporter of node that StopExporter
// stopped, with the same configuration and addresses (metrics, traceflow
// agent). Like a new pod it does not take over from its predecessor
// (the lab's exporters keep no state directory).
func (p *Product) RestartExporter(node string) error {
	p.mu.Lock()
	n := p.nodes[node]
	p.mu.Unlock()
	if n == nil || n.done != nil {
		return fmt.Errorf("exporter %s: not stopped", node)
	}
	ln, err := net.Listen("tcp", strings.TrimPrefix(p.Agents[node], "http://"))
	if err != nil {
		return fmt.Errorf("traceflow agent of %s: %w", node, err)
	}
	return p.startNode(node, n.cfg, ln)
}

// writeToken writes a fresh random traceflow token to the lab's state
// directory (mode 0600) and returns its path.
func writeToken(l *lab.Lab) (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	f := filepath.Join(filepath.Dir(l.ManifestPath()), "traceflow-token")
	if err := os.WriteFile(f, []byte(hex.EncodeToString(b)+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("traceflow token: %w", err)
	}
	return f, nil
}

// Run waits until ctx ends or the app stops by itself, then stops
// everything.
func (p *Product) Run(ctx context.Context) error {
	select {
	case err := <-p.done:
		p.done <- err // for Stop
	case <-ctx.Done():
	}
	return p.Stop()
}

// Stop stops the exporters (they flush their last records to the
// collector, still running), then the app, and removes the agents' token
// file (so lab down leaves an empty state directory behind it).
func (p *Product) Stop() error {
	if p.stopExp != nil {
		p.stopExp()
	}
	var errs []error
	p.mu.Lock()
	for name, n := range p.nodes {
		if n.done == nil {
			continue
		}
		if err := <-n.done; err != nil && !errors.Is(err, context.Canceled) {
			p.log.Error("exporter", "node", name, "err", err)
			errs = append(errs, err)
		}
		n.done = nil
	}
	p.mu.Unlock()
	if p.stop != nil {
		p.stop()
		errs = append(errs, <-p.done)
		p.stop = nil
	}
	if p.tokenFile != "" {
		if err := os.Remove(p.tokenFile); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
