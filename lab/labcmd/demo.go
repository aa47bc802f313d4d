package labcmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/app"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/exporter"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/tracer"
)

// demoIPFIXPort is the loopback port the demo's exporters send to.
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
the lab. Needs root for the lab. Every collector and web flag applies.`)
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
	// exporters on loopback only, in every family of the lab, and the lab's
	// node tracer to inject traceflow probes.
	cfg.K8s = enrich.NewConfig()
	cfg.K8s.Source = enrich.SourceInventory
	cfg.K8s.Inventory = []string{l.ManifestPath()}
	cfg.IPFIX.TCPAddrs = []string{"127.0.0.1:" + demoIPFIXPort, "[::1]:" + demoIPFIXPort}
	cfg.IPFIX.UDPAddrs = nil
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
	collectorAddr := "[::1]:" + demoIPFIXPort
	if !mode.Has(corev1.IPv6Protocol) {
		collectorAddr = "127.0.0.1:" + demoIPFIXPort
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
		ecfg.IPFIX.Address = collectorAddr
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
  Lab              bin/dualflow lab status
  Audit            bin/dualflow audit findings --server %[10]s
  Traceflow        bin/dualflow trace --server %[10]s -s frontend/%[8]s -d svc:backend/api:80 --family dual
Flows appear within about %[9]s. Press Ctrl-C to stop and remove the lab.

`, a.Collector().HTTPAddr(), abs, a.Collector().MetricsAddr(), mode, labCfg.Datapath, len(l.Manifest.Nodes), l.ManifestPath(), webPod(l), *activeTimeout+5*time.Second, a.WebURL(), usersFile)

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
