package main

import (
	"context"

	"github.com/dualflow/dualflow/app"
	"github.com/dualflow/dualflow/exporter"
)

func runExporter(ctx context.Context, args []string) error {
	fs := newFlagSet("exporter", "[flags]", `Export the kernel's conntrack connections (IPv4 and IPv6) of this node as
IPFIX to the collector. Run one per node, with CAP_NET_ADMIN (root), in the
host network namespace or pointed at another one with --exporter.netns.
Counters and start times need net.netfilter.nf_conntrack_acct=1 and
nf_conntrack_timestamp=1 in the target namespace.

  dualflow exporter --node-name node-1 --exporter.ipfix.collector collector:4739
  dualflow exporter --exporter.netns df-node-1 --exporter.ipv4=false --exporter.ipfix.collector '[::1]:4739'
  dualflow exporter --exporter.ipfix.transport tls --exporter.ipfix.ca-file ca.pem \
      --exporter.ipfix.cert-file node.pem --exporter.ipfix.key-file node-key.pem

Several collectors: --exporter.collectors (a list) or --exporter.collectors-dns
(a headless Service, resolved again every --exporter.collectors-dns-interval)
replaces --exporter.ipfix.collector. The collector pairs the records of both
nodes of a cross-node connection, so both halves must reach the same
collector: each record goes to the collector chosen by rendezvous hashing of
its post-NAT connection tuple, and every exporter must be given the same
collector set. Each collector has its own connection and a buffer of
--exporter.ipfix.buffer-bytes; one disconnected for
--exporter.collector-failover-timeout has its share of new records sent to the
others until it is back.

  dualflow exporter --exporter.collectors-dns dualflow-collector.dualflow.svc:4739
  dualflow exporter --exporter.collectors 198.18.0.10:4739,'[fd00:10::11]:4739'

On SIGTERM it flushes every tracked connection with flow end reason
"forced end", sends what is buffered and exits.`)
	cfg := app.NodeConfig{Exporter: exporter.NewConfig()}
	cfg.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Exporter.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return err
	}
	n, err := app.NewNode(cfg)
	if err != nil {
		return err
	}
	return n.Run(ctx)
}
