package labcmd

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/app"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/ipfix"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/exporter"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/tracer"
)

// demoIPFIXPort is the loopback port the demo's exporters send to, unless
// --collector.ipfix.tcp-addr or udp-addr say otherwise.
const demoIPFIXPort = "4739"

// Demo runs `dualflow demo [flags]`: the product (package app) next to a
// lab, its exporters and its node tracer.
func (lc *Commands) Demo(ctx context.Context, args []string) error {
	fs := lc.NewFlagSet("demo", "[flags]", `Start the whole product on one machine (what 'make run' does): a dual-stack
lab of network namespaces with live traffic (allowed and denied connections,
and a dual-stack policy gap), one exporter per lab node, and the product of
'dualflow collector' (embedded ClickHouse, web UI and REST API) with the lab's
Kubernetes objects as its inventory and the lab's node tracer for traceflow.
It prints the URLs and runs until Ctrl-C, then stops everything and removes
the lab. Needs root for the lab. Every collector and web flag applies.

IPFIX listens on TCP 127.0.0.1:4739 and [::1]:4739 only, unless
--collector.ipfix.tcp-addr or --collector.ipfix.udp-addr are given: then
they are used as given, and the lab's exporters send to the first TCP
listener (UDP if there is none), over IPv6 when the lab has IPv6 and a
listener takes it.`)
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
	if cfg.Store.DataDir == "" {
		cfg.Store.DataDir = *dataDir
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
	labCfg.SetDefaults()
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

	// The product runs as on a cluster, with the lab's Kubernetes objects
	// as its inventory (reloaded if the lab changes them), IPFIX from the
	// exporters (see demoListeners), and the lab's node tracer to inject
	// traceflow probes.
	cfg.K8s = enrich.NewConfig()
	cfg.K8s.Source = enrich.SourceInventory
	cfg.K8s.Inventory = []string{l.ManifestPath()}
	tr, err := tracer.NewTracer(l, tracer.Inventory{M: l.Manifest})
	if err != nil {
		return err
	}
	a, err := app.New(ctx, acfg, log, app.Options{NodeTracer: tr})
	if err != nil {
		return err
	}
	// The product outlives the signal until the exporters have flushed.
	runCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	done := make(chan error, 1)
	go func() { done <- a.Run(runCtx) }()
	select {
	case <-a.Ready():
	case err := <-done:
		return err
	case <-ctx.Done():
		stop()
		return <-done
	}

	// One exporter per node, reading the node's conntrack (or OVS), sending
	// over IPv6 when the lab has IPv6 (as a dual-stack node would).
	mode := l.Mode()
	collectorAddr, transport, err := demoTarget(a.Collector().IPFIXAddrs(), mode.Has(corev1.IPv6Protocol))
	if err != nil {
		stop()
		return errors.Join(err, <-done)
	}
	// Exporters stop first at shutdown and flush their last records to the
	// collector, which is still running then.
	expCtx, stopExporters := context.WithCancel(ctx)
	defer stopExporters()
	exporters := make(chan error, len(l.Manifest.Nodes))
	started := 0
	// abort stops what runs after a failed start: the exporters started,
	// then the product (which flushes the store).
	abort := func(err error) error {
		stopExporters()
		for range started {
			<-exporters
		}
		stop()
		return errors.Join(err, <-done)
	}
	for _, n := range l.Manifest.Nodes {
		ecfg := exporter.NewConfig()
		ecfg.NodeName, ecfg.MetricsAddr, ecfg.Logger = n.Name, "", log.With("exporter", n.Name)
		ecfg.IPv4, ecfg.IPv6 = mode.Has(corev1.IPv4Protocol), mode.Has(corev1.IPv6Protocol)
		ecfg.NetNS = l.NodeNetNSPath(n.Name)
		if labCfg.Datapath == lab.DatapathOVS {
			ecfg.Source = exporter.SourceOVS
			ecfg.OVS.RunDir, ecfg.OVS.RulesFile = l.OVSDir(n.Name), l.OVSRulesPath()
		}
		ecfg.PollInterval = 2 * time.Second
		ecfg.Store.ActiveTimeout, ecfg.Store.IdleTimeout = *activeTimeout, 5*time.Second
		ecfg.IPFIX.Address, ecfg.IPFIX.Transport = collectorAddr, transport
		ecfg.SetDefaults()
		if err := ecfg.Validate(); err != nil {
			return abort(fmt.Errorf("exporter %s: %w", n.Name, err))
		}
		e, err := exporter.New(ecfg)
		if err != nil {
			return abort(fmt.Errorf("exporter %s: %w", n.Name, err))
		}
		started++
		go func() { exporters <- e.Run(expCtx) }()
	}

	abs, _ := filepath.Abs(cfg.Store.DataDir)
	st := cfg.Store
	st.SetDefaults()
	usersFile, _ := filepath.Abs(st.HTTPUsersFile)
	fmt.Printf(`
dualflow is running: lab mode %[4]s (%[5]s datapath), %[6]d nodes, exporters on every node.
  Web UI and API   %[10]s   (REST under /api/v1, OpenAPI at /api/v1/openapi.json)
  ClickHouse HTTP  http://%[1]s/   (embedded store in %[2]s)
      users admin (read-write) and reader (read-only); passwords in %[11]s
      curl -u reader:PASSWORD 'http://%[1]s/?query=SELECT+ip_version,count()+FROM+dualflow.flows+GROUP+BY+ip_version'
      bin/dualflow sql "SELECT src_pod_name, dst_pod_name, ip_version, ingress_verdict FROM dualflow.flows ORDER BY flow_end DESC LIMIT 10"
  Metrics          http://%[3]s/metrics
  IPFIX            the lab's exporters send to %[12]s
  Lab              bin/dualflow lab status
  Audit            bin/dualflow audit findings --server %[10]s
  Traceflow        bin/dualflow trace --server %[10]s -s frontend/%[8]s -d svc:backend/api:80 --family dual
Flows appear within about %[9]s. Press Ctrl-C to stop and remove the lab.

`, a.Collector().HTTPAddr(), abs, a.Collector().MetricsAddr(), mode, labCfg.Datapath, len(l.Manifest.Nodes), l.ManifestPath(), webPod(l), *activeTimeout+5*time.Second, a.WebURL(), usersFile, transport+" "+collectorAddr)

	var runErr error
	productDone := false
	select {
	case runErr = <-done:
		productDone = true
	case <-ctx.Done():
	}
	stopExporters()
	for range l.Manifest.Nodes {
		if err := <-exporters; err != nil && !errors.Is(err, context.Canceled) {
			log.Error("exporter", "err", err)
		}
	}
	stop()
	if !productDone {
		runErr = <-done
	}
	return runErr
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
