package enrich

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/kubernetes"
)

// NewForClient builds an Enricher that watches through client (a fake
// clientset, or nil); cfg's Source, Kubeconfig, Context and Inventory are
// not used. Only tests build one so.
func NewForClient(cfg Config, client kubernetes.Interface, reg prometheus.Registerer, log *slog.Logger) (*Enricher, error) {
	return newEnricher(cfg, client, reg, log, nil)
}
