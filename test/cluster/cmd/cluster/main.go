// Command cluster runs a real Kubernetes cluster on this machine (package
// test/cluster) with dualflow installed and traffic flowing, until
// interrupted, then tears it down: `make cluster` and `make cluster-down`.
//
//	cluster up [--mode dual] [--prefix dfk-] [--index 0] [--dir var/cluster] [--api 127.0.0.1:16443]
//	cluster down [--dir var/cluster]
package main

import (
	"context"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/dualflow/dualflow/lab/agent"
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
		return fmt.Errorf("usage: cluster up|down [flags] (-h for the flags)")
	}
	fs := flag.NewFlagSet("cluster "+os.Args[1], flag.ExitOnError)
	mode := fs.String("mode", "dual", "IP families: dual, ipv4 or ipv6")
	prefix := fs.String("prefix", "dfk-", "name prefix of the cluster's network namespaces and cgroups")
	index := fs.Int("index", 0, "address block, 0..7 (clusters running at once need different ones)")
	dir := fs.String("dir", filepath.Join(cluster.RepoRoot(), "var", "cluster"), "the cluster's directory (state, logs, containerd's and kubelet's data)")
	apiAddr := fs.String("api", "127.0.0.1:16443", "where this machine reaches the API server (a relay into the cluster)")
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
	// A new cluster each time: the last one's etcd data and install files
	// would make the install's objects exist already.
	if err := os.RemoveAll(filepath.Join(*dir, "cluster")); err != nil {
		return err
	}
	began := time.Now()
	bins, err := cluster.Build(ctx, os.Stderr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*dir, 0o700); err != nil {
		return err
	}
	const tag = "cluster"
	fmt.Fprintln(os.Stderr, "[cluster] building dualflow's images (scripts/image.sh)")
	archives, err := cluster.ImageArchives(ctx, tag, *dir)
	if err != nil {
		return err
	}
	c, err := cluster.Up(ctx, cluster.Config{Prefix: *prefix, Index: *index, Mode: m, Dir: filepath.Join(*dir, "cluster"),
		Bins: bins, Images: archives, Progress: os.Stderr})
	if err != nil {
		return err
	}
	defer c.Down()
	in, err := c.Install(ctx, cluster.Helm, tag)
	if err != nil {
		return err
	}
	if err := c.DeployWorkloads(ctx, tag); err != nil {
		return err
	}
	kc, err := c.ServeAPI(ctx, *apiAddr)
	if err != nil {
		return err
	}
	go traffic(ctx, c)
	fmt.Printf(`
A real %s Kubernetes cluster is up (2 nodes: kubelet, containerd, CNI bridge, kube-proxy
in nftables mode, kube-router for NetworkPolicy), with dualflow installed by
helm install of deploy/helm/dualflow (embedded store) and traffic from shop/web to
backend/api. Ready in %s.

  kubectl --kubeconfig %s get pods -A
  kubectl --kubeconfig %s -n dualflow port-forward svc/dualflow-web 8080
  then http://127.0.0.1:8080/ with the operator token %s

(kubectl: %s). Ctrl-C tears it all down.
`, m, time.Since(began).Round(time.Second), kc, kc, in.Token, bins.Kubectl)
	<-ctx.Done()
	return nil
}

// traffic keeps connections going from every web pod to every api pod and
// Service address, every two seconds.
func traffic(ctx context.Context, c *cluster.Cluster) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		clients, _ := c.Pods(ctx, cluster.NSClient, "web")
		servers, _ := c.Pods(ctx, cluster.NSServer, "api")
		var targets []netip.AddrPort
		for _, s := range servers {
			for _, ip := range s.Status.PodIPs {
				if a, err := netip.ParseAddr(ip.IP); err == nil {
					targets = append(targets, netip.AddrPortFrom(a, cluster.ServerPort))
				}
			}
		}
		for _, name := range []string{cluster.SvcDual, cluster.SvcV4, cluster.SvcV6} {
			if ips, err := c.ServiceIPs(ctx, cluster.NSServer, name); err == nil {
				for _, a := range ips {
					targets = append(targets, netip.AddrPortFrom(a, 80))
				}
			}
		}
		for i := range clients {
			netns, err := cluster.PodNetNS(&clients[i])
			if err != nil {
				continue
			}
			for _, to := range targets {
				agent.Dial(ctx, netns, agent.TCP, to, time.Second)
			}
		}
	}
}
