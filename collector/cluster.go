package collector

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
)

// clusterRefresh bounds how often the cluster view is rebuilt while the
// cluster keeps changing: a view is at most this old when asked for, and a
// busy cluster (pods coming and going every second) costs one rebuild per
// interval, not one per request. A rebuild that takes long stretches the
// interval to clusterRebuildShare times its duration, so rebuilding takes
// at most a tenth of a core (100k pods: ~0.26 s per rebuild, so a view up
// to ~2.6 s old; BenchmarkSnapshot, BenchmarkInventoryFromSnapshot).
const (
	clusterRefresh      = time.Second
	clusterRebuildShare = 10
)

// ErrNoCluster is returned by Inventory when the collector has no
// Kubernetes view (--k8s.source off) or has not listed the cluster yet.
var ErrNoCluster = errors.New("no Kubernetes view")

// clusterView caches the audit inventory built from the enrichment's
// snapshot, by generation.
type clusterView struct {
	mu    sync.Mutex
	gen   uint64
	built time.Time
	took  time.Duration // the last rebuild
	inv   *audit.Inventory
}

// Inventory returns the cluster as the policy audit, the reachability
// matrix and traceflow read it: namespaces, running pods (labels,
// addresses of both families, container ports, workload), Services
// (selector, families, ClusterIPs) and NetworkPolicies, taken from the
// collector's live Kubernetes view (informers, or the reloaded inventory
// files). It follows the cluster: a change is visible within
// clusterRefresh (longer for very large clusters, see there). The
// inventory is shared and read-only. It wraps
// ErrNoCluster when the enrichment is off or not synced yet.
func (c *Collector) Inventory() (*audit.Inventory, error) {
	if c.k8s == nil {
		return nil, fmt.Errorf("cluster view: %w (the Kubernetes enrichment is off: --k8s.source)", ErrNoCluster)
	}
	if !c.k8s.Synced() {
		return nil, fmt.Errorf("cluster view: %w yet (the Kubernetes caches are not synced)", ErrNoCluster)
	}
	v := &c.cluster
	v.mu.Lock()
	defer v.mu.Unlock()
	gen := c.k8s.Generation()
	if v.inv != nil && (v.gen == gen || time.Since(v.built) < max(clusterRefresh, clusterRebuildShare*v.took)) {
		return v.inv, nil
	}
	start := time.Now()
	snap := c.k8s.Snapshot()
	v.inv, v.gen = InventoryFromSnapshot(snap), snap.Generation
	v.built = time.Now()
	v.took = v.built.Sub(start)
	return v.inv, nil
}

// InventoryFromSnapshot converts the enrichment's snapshot into the
// audit's inventory. Terminated pods are left out (they hold no address);
// each pod's Owner is its resolved workload (Deployment, not ReplicaSet).
func InventoryFromSnapshot(s *enrich.Snapshot) *audit.Inventory {
	inv := audit.NewInventory()
	for _, ns := range s.Namespaces {
		inv.AddNamespace(audit.Namespace{Name: ns.Name, Labels: ns.Labels})
	}
	for i, p := range s.Pods {
		if p.Terminated {
			continue
		}
		ap := audit.Pod{Namespace: p.Namespace, Name: p.Name, Labels: p.Labels, HostNetwork: p.HostNetwork,
			Addrs: append([]netip.Addr(nil), p.Addrs...)}
		if w := s.Workloads[i]; w.Kind != enrich.KindPod {
			ap.Owner = audit.Workload{Kind: w.Kind, Name: w.Name}
		}
		for _, cp := range p.Ports {
			ap.Ports = append(ap.Ports, audit.Port{Name: cp.Name, Port: cp.Port, Proto: policy.ProtoNumber(&cp.Protocol)})
		}
		inv.AddPod(ap)
	}
	for _, svc := range s.Services {
		inv.AddService(audit.Service{Namespace: svc.Namespace, Name: svc.Name, Selector: svc.Selector,
			IPFamilies: svc.IPFamilies, IPFamilyPolicy: svc.IPFamilyPolicy, ClusterIPs: svc.ClusterIPs})
	}
	for _, p := range s.NetworkPolicies {
		inv.AddPolicy(p)
	}
	return inv
}
