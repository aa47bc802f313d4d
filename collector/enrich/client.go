package enrich

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dualflow/dualflow/collector/enrich/inventory"
	"github.com/dualflow/dualflow/internal/reload"
)

// userAgent identifies the collector to the API server.
const userAgent = "dualflow-collector"

// newClient returns the clientset for cfg's (resolved) source.
func newClient(cfg Config, log *slog.Logger, h *apiHealth) (kubernetes.Interface, *inventorySource, error) {
	var rc *rest.Config
	var err error
	switch cfg.Source {
	case SourceInventory:
		src, err := loadInventory(cfg.Inventory, log)
		return nil, src, err
	case SourceInCluster:
		if rc, err = rest.InClusterConfig(); err != nil {
			return nil, nil, fmt.Errorf("kubernetes in-cluster config: %w", err)
		}
	case SourceKubeconfig:
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = cfg.Kubeconfig
		cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: cfg.Context})
		if rc, err = cc.ClientConfig(); err != nil {
			return nil, nil, fmt.Errorf("kubeconfig: %w", err)
		}
	default:
		return nil, nil, fmt.Errorf("kubernetes source %q has no client", cfg.Source)
	}
	rc.UserAgent = userAgent
	if h != nil {
		rc.Wrap(h.wrap)
	}
	// Protobuf lists and watches cost the API server and us less than
	// JSON (every kind watched here supports it).
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return cs, nil, nil
}

// loadInventory loads the manifest files into the store that inventory
// mode's informers list and watch, so that it runs the same informers,
// transforms and handlers as a cluster. The source reloads the files when
// they change.
func loadInventory(files []string, log *slog.Logger) (*inventorySource, error) {
	stamps := reload.Stamps(files) // before reading: a change during the load shows at the next check
	res, err := inventory.Load(files...)
	if err != nil {
		return nil, err
	}
	src, err := newInventorySource(files, stamps, res)
	if err != nil {
		return nil, err
	}
	if len(res.Skipped) > 0 {
		log.Info("inventory: skipped objects of kinds enrichment does not use", "kinds", slices.Sorted(maps.Keys(res.Skipped)))
	}
	log.Info("inventory loaded", "files", files, "objects", len(res.Objects))
	return src, nil
}
