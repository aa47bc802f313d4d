// Command cluster runs a real Kubernetes cluster on this machine (package
// test/cluster) until interrupted, then tears it down: `make cluster`.
//
//	cluster up [--mode dual] [--prefix dfk-] [--index 0] [--dir /run/dualflow/cluster]
//	cluster down [--dir /run/dualflow/cluster]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/test/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cluster:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) < 2 || (os.Args[1] != "up" && os.Args[1] != "down") {
		return fmt.Errorf("usage: cluster up|down [flags]")
	}
	fs := flag.NewFlagSet("cluster "+os.Args[1], flag.ExitOnError)
	mode := fs.String("mode", "dual", "IP families: dual, ipv4 or ipv6")
	prefix := fs.String("prefix", "dfk-", "name prefix of the cluster's namespaces and cgroups")
	index := fs.Int("index", 0, "address block, 0..7 (clusters running at once need different ones)")
	dir := fs.String("dir", "/run/dualflow/cluster", "the cluster's directory (state, logs, containerd and kubelet data)")
	fs.Parse(os.Args[2:])
	if os.Args[1] == "down" {
		return cluster.DownDir(*dir)
	}
	m, err := manifest.ParseMode(*mode)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := cluster.DownDir(*dir); err != nil {
		return fmt.Errorf("leftovers of a previous cluster in %s: %w", *dir, err)
	}
	bins, err := cluster.Build(ctx, os.Stderr)
	if err != nil {
		return err
	}
	c, err := cluster.Up(ctx, cluster.Config{Prefix: *prefix, Index: *index, Mode: m, Dir: *dir, Bins: bins, Progress: os.Stderr})
	if err != nil {
		return err
	}
	fmt.Printf("cluster up (%s): kubectl: nsenter --net=%s -- %s --kubeconfig %s get nodes\n", m, c.ControlPlaneNetNS(), bins.Kubectl, c.Kubeconfig)
	<-ctx.Done()
	return c.Down()
}
