package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/dualflow/dualflow/app"
	"github.com/dualflow/dualflow/collector/store"
)

func runCollector(ctx context.Context, args []string) error {
	fs := newFlagSet("collector", "[flags]", `Receive flow records, enrich them with Kubernetes metadata, write them to
ClickHouse, and serve the web UI and REST API over them.

IPFIX arrives from exporters (ours, Open vSwitch, Antrea, any RFC 7011
exporter) over TCP and UDP on 4739 and optionally TLS on 4740. The
Kubernetes view comes from --k8s.source: informers in the cluster
(in-cluster), through --k8s.kubeconfig, or manifest files
(--k8s.inventory, reloaded when they change); the RBAC it needs is
collector/enrich/rbac.yaml (list and watch only). The same view names
the pods, workloads, Services and nodes of every flow, merges the two node
halves of a cross-node connection, evaluates the NetworkPolicies, and
answers the web's reachability matrix, audit findings and traceflow
names.

By default the store is the embedded chDB engine in --clickhouse.data-dir,
served over the ClickHouse HTTP interface on 127.0.0.1:8123 so that users
and 'dualflow sql' can query it while the collector owns the directory.
Pending schema migrations are applied at start.

The web UI and REST API (/api/v1, OpenAPI at /api/v1/openapi.json) listen
on --web.addr (127.0.0.1:8080). Without --web.tokens-file they stay on
loopback; with it they may listen anywhere and ask for bearer tokens.
Traces need node agents and answer 501 here (the demo traces in its lab).

SIGINT/SIGTERM stop the web, flush buffered rows (or spool them), then exit.`)
	var cfg app.Config
	cfg.Collector.Store.HTTPAddr = store.DefaultHTTPAddr
	cfg.Collector.Store.TTLDays = 30
	cfg.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("collector: unexpected arguments %v", fs.Args())
	}
	cfg.Collector.Version = version
	a, err := app.New(ctx, cfg, slog.Default(), app.Options{})
	if err != nil {
		return err
	}
	return a.Run(ctx)
}
