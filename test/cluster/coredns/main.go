// Command coredns is CoreDNS with the plugins a cluster's DNS needs
// (kubernetes, cache, errors, health, ready, loadbalance) and no others,
// for the real-cluster tier: built from the pinned CoreDNS module by
// scripts/k8s-cluster.sh (the full build links every cloud provider's
// SDK). Plugins run in the order of CoreDNS's plugin.cfg.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/ready"
)

func init() {
	dnsserver.Directives = []string{"ready", "health", "errors", "loadbalance", "cache", "kubernetes"}
}

func main() { coremain.Run() }
