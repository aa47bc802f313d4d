package main

import (
	"context"
	"log/slog"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/store"
)

func runCollector(ctx context.Context, args []string) error {
	fs := newFlagSet("collector", "[flags]", `Receive flow records, enrich them with Kubernetes metadata and write them
to ClickHouse. IPFIX arrives from exporters (ours, Open vSwitch, Antrea, any
RFC 7011 exporter) over TCP and UDP on 4739 and optionally TLS on 4740. The
two node halves of a cross-node connection are merged into one row when
--collector.inventory names a manifest with the cluster's Node objects.
By default the store is the embedded chDB engine in
--clickhouse.data-dir, served over the ClickHouse HTTP interface on
127.0.0.1:8123 so that users and 'dualflow sql' can query it while the
collector owns the directory. Pending schema migrations are applied at start.
SIGINT/SIGTERM flush buffered rows (or spool them) before exiting.`)
	var cfg collector.Config
	cfg.Store.HTTPAddr = store.DefaultHTTPAddr
	cfg.Store.TTLDays = 30
	cfg.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Version = version
	c, err := collector.New(ctx, cfg, slog.Default())
	if err != nil {
		return err
	}
	return c.Run(ctx)
}
