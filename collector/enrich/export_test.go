package enrich

import (
	"log/slog"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"

	"github.com/dualflow/dualflow/flow"
)

// NewForClient builds an Enricher that watches through client (a fake
// clientset, or nil); cfg's Source, Kubeconfig, Context and Inventory are
// not used. Only tests build one so.
func NewForClient(cfg Config, client kubernetes.Interface, reg prometheus.Registerer, log *slog.Logger) (*Enricher, error) {
	return newEnricher(cfg, client, reg, log, nil)
}

// enrichOne enriches one record, as the pipeline's batches are.
func (e *Enricher) enrichOne(r *flow.Record) { e.Enrich(unsafe.Slice(r, 1)) }
