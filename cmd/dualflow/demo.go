package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/lab"
)

func runDemo(ctx context.Context, args []string) error {
	fs := newFlagSet("demo", "[flags]", `Start the whole product on one machine (what 'make run' does): a dual-stack
lab of network namespaces with live traffic (needs root), and the collector on
the embedded ClickHouse with its HTTP interface. It prints the URLs and runs
until Ctrl-C, then stops everything and removes the lab.`)
	var cfg collector.Config
	cfg.Store.HTTPAddr = store.DefaultHTTPAddr
	cfg.Store.TTLDays = 7
	cfg.BindFlags(fs)
	dataDir := fs.String("data-dir", "var/data", "embedded store data directory (same as --clickhouse.data-dir)")
	var labCfg lab.Config
	bindLab(fs, &labCfg)
	noLab := fs.Bool("no-lab", false, "do not build the lab (no root needed; the store stays empty)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if cfg.Store.DataDir == "" {
		cfg.Store.DataDir = *dataDir
	}
	cfg.Version = version
	log := slog.Default()

	if !*noLab {
		if os.Geteuid() != 0 {
			return errors.New("demo: the lab needs root (network namespaces); run as root or pass --no-lab")
		}
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
		log.Info("lab manifest (Kubernetes objects of the lab)", "path", l.ManifestPath())
	}

	c, err := collector.New(ctx, cfg, log)
	if err != nil {
		return err
	}
	abs, _ := filepath.Abs(cfg.Store.DataDir)
	fmt.Printf(`
dualflow is running.
  ClickHouse HTTP  http://%[1]s/   (embedded store in %[2]s)
      curl 'http://%[1]s/?query=SELECT+ip_version,count()+FROM+dualflow.flows+GROUP+BY+ip_version'
      bin/dualflow sql "SELECT * FROM dualflow.flows ORDER BY flow_end DESC LIMIT 5"
  Metrics          http://%[3]s/metrics
  Lab              bin/dualflow lab status
Press Ctrl-C to stop and remove the lab.

`, cfg.Store.HTTPAddr, abs, cfg.MetricsAddr)
	return c.Run(ctx)
}
