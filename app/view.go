package app

import (
	"errors"
	"fmt"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
)

// view answers the web's questions about the cluster from the collector's
// live Kubernetes view (collector.Cluster), so every answer follows the
// cluster as it changes.
type view struct{ c *collector.Collector }

// cluster is the live cluster view; ErrUnavailable (503) while there is
// none.
func (v *view) cluster() (*enrich.Snapshot, error) {
	s, err := v.c.Cluster()
	if errors.Is(err, collector.ErrNoCluster) {
		return nil, fmt.Errorf("%w: %w", audit.ErrUnavailable, err)
	}
	return s, err
}
