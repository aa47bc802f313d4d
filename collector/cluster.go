package collector

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dualflow/dualflow/collector/enrich"
)

// clusterRefresh bounds how often the cluster view is taken again while
// the cluster keeps changing: a view is at most this old when asked for,
// and a busy cluster (pods coming and going every second) costs one
// snapshot per interval, not one per request. A snapshot that takes long
// stretches the interval to clusterRebuildShare times its duration, so
// taking them costs at most a tenth of a core (100k pods: ~0.08 s per
// snapshot, so a view up to ~0.8 s old; BenchmarkSnapshot).
const (
	clusterRefresh      = time.Second
	clusterRebuildShare = 10
)

// ErrNoCluster is returned by Cluster when the collector has no
// Kubernetes view (--k8s.source off) or has not listed the cluster yet.
var ErrNoCluster = errors.New("no Kubernetes view")

// clusterView caches the enrichment's snapshot, by generation.
type clusterView struct {
	mu    sync.Mutex
	built time.Time
	took  time.Duration // the last snapshot
	snap  *enrich.Snapshot
}

// Cluster returns the cluster as the policy audit, the reachability
// matrix, the catalog and traceflow read it: the enrichment's snapshot of
// its live Kubernetes view (informers, or the reloaded inventory files),
// with lookups by name and address. It follows the cluster: a change is
// visible within clusterRefresh (longer for very large clusters, see
// there). The snapshot is shared and read-only. It wraps ErrNoCluster
// when the enrichment is off or not synced yet.
func (c *Collector) Cluster() (*enrich.Snapshot, error) {
	if c.k8s == nil {
		return nil, fmt.Errorf("cluster view: %w (the Kubernetes enrichment is off: --k8s.source)", ErrNoCluster)
	}
	if !c.k8s.Synced() {
		return nil, fmt.Errorf("cluster view: %w yet (the Kubernetes caches are not synced)", ErrNoCluster)
	}
	v := &c.cluster
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.snap != nil && (v.snap.Generation == c.k8s.Generation() || time.Since(v.built) < max(clusterRefresh, clusterRebuildShare*v.took)) {
		return v.snap, nil
	}
	start := time.Now()
	v.snap = c.k8s.Snapshot()
	v.built = time.Now()
	v.took = v.built.Sub(start)
	return v.snap, nil
}
