package api

import (
	"cmp"
	"context"
	"errors"
	"net/netip"
	"slices"

	"github.com/gin-gonic/gin"
)

// Catalog lists what the live Kubernetes view holds, for the UI's
// autocomplete and default forms (GET /api/v1/catalog). It answers an
// error wrapping ErrUnavailable while there is no synced view.
type Catalog interface {
	Catalog(ctx context.Context) (CatalogResponse, error)
}

// ErrUnavailable is answered as 503: the service exists but cannot answer
// yet (e.g. the Kubernetes caches are not synced).
var ErrUnavailable = errors.New("not available yet")

// CatalogMaxEntries caps each list of a catalog answer: 5000 names is
// about 300 KB of JSON, beyond what a datalist is useful for.
const CatalogMaxEntries = 5000

// CatalogResponse is the answer of GET /api/v1/catalog. Every list is
// sorted (by namespace, then name) and holds at most CatalogMaxEntries.
type CatalogResponse struct {
	Namespaces []string          `json:"namespaces"`
	Nodes      []string          `json:"nodes"`
	Pods       []CatalogPod      `json:"pods"`
	Workloads  []CatalogWorkload `json:"workloads"`
	Services   []CatalogService  `json:"services"`
	// Truncated is true when a list was cut at CatalogMaxEntries.
	Truncated bool `json:"truncated"`
}

// CatalogPod is a live (not terminated) pod.
type CatalogPod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Node      string `json:"node,omitempty"`
	// IPv4 and IPv6 are status.podIPs of each family.
	IPv4        []netip.Addr `json:"ipv4,omitempty"`
	IPv6        []netip.Addr `json:"ipv6,omitempty"`
	HostNetwork bool         `json:"host_network,omitempty"`
	// WorkloadKind and Workload name the pod's top-level controller
	// (empty for a bare pod).
	WorkloadKind string `json:"workload_kind,omitempty"`
	Workload     string `json:"workload,omitempty"`
}

// CatalogWorkload is a controller with live pods.
type CatalogWorkload struct {
	Kind      string `json:"kind"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Pods      int    `json:"pods"`
}

// CatalogService is a Service.
type CatalogService struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Type      string `json:"type,omitempty"`
	Headless  bool   `json:"headless,omitempty"`
	// Families are the IP families (4, 6) the Service has a ClusterIP of
	// (a headless Service: those of spec.ipFamilies).
	Families []int         `json:"families"`
	Ports    []CatalogPort `json:"ports"`
}

// CatalogPort is a Service port.
type CatalogPort struct {
	Name     string `json:"name,omitempty"`
	Protocol string `json:"protocol"` // TCP, UDP or SCTP
	Port     uint16 `json:"port"`
}

func (a *API) catalog(c *gin.Context) (any, error) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.cfg.QueryTimeout)
	defer cancel()
	cat, err := a.cfg.Catalog.Catalog(ctx)
	if scope := principalOf(c).scope; scope != nil {
		scopeCatalog(&cat, scope)
	}
	cat.normalize(CatalogMaxEntries)
	return cat, err
}

// normalize sorts every list, cuts it at max entries (setting Truncated)
// and makes nil lists empty, so the answer has [] rather than null.
func (r *CatalogResponse) normalize(max int) {
	byName := func(ans, an, bns, bn string) int {
		return cmp.Or(cmp.Compare(ans, bns), cmp.Compare(an, bn))
	}
	slices.Sort(r.Namespaces)
	slices.Sort(r.Nodes)
	slices.SortFunc(r.Pods, func(a, b CatalogPod) int { return byName(a.Namespace, a.Name, b.Namespace, b.Name) })
	slices.SortFunc(r.Workloads, func(a, b CatalogWorkload) int {
		return cmp.Or(byName(a.Namespace, a.Name, b.Namespace, b.Name), cmp.Compare(a.Kind, b.Kind))
	})
	slices.SortFunc(r.Services, func(a, b CatalogService) int { return byName(a.Namespace, a.Name, b.Namespace, b.Name) })
	r.Namespaces = capList(r.Namespaces, max, &r.Truncated)
	r.Nodes = capList(r.Nodes, max, &r.Truncated)
	r.Pods = capList(r.Pods, max, &r.Truncated)
	r.Workloads = capList(r.Workloads, max, &r.Truncated)
	r.Services = capList(r.Services, max, &r.Truncated)
	for i := range r.Services {
		if r.Services[i].Families == nil {
			r.Services[i].Families = []int{}
		}
		if r.Services[i].Ports == nil {
			r.Services[i].Ports = []CatalogPort{}
		}
	}
}

// capList returns s cut at max entries (non-nil), setting *cut if it was.
func capList[T any](s []T, max int, cut *bool) []T {
	if len(s) > max {
		*cut = true
		s = s[:max:max]
	}
	if s == nil {
		s = []T{}
	}
	return s
}
