package api

import (
	"context"
	"time"

	"github.com/gin-gonic/gin"
)

// Status reports the state of the collector's sources for GET
// /api/v1/status.
type Status interface {
	Status(ctx context.Context) (StatusResponse, error)
}

// StatusResponse is the answer of GET /api/v1/status.
type StatusResponse struct {
	Kubernetes KubernetesStatus `json:"kubernetes"`
}

// KubernetesStatus is the state of the collector's view of the cluster.
type KubernetesStatus struct {
	// Source is where objects come from: in-cluster, kubeconfig,
	// inventory, or off.
	Source string `json:"source"`
	// Synced is true once the initial list of every kind is indexed.
	Synced bool `json:"synced"`
	// Stale is true while some kind has been without a watch for a few
	// seconds (the API server is unreachable or refuses the collector):
	// names may be out of date, and rows written meanwhile have
	// k8s_view_stale = true.
	Stale bool `json:"stale"`
	// Kinds is the state of each watched kind; empty for the inventory
	// source and when off.
	Kinds []KubernetesKind `json:"kinds"`
}

// KubernetesKind is the state of the view of one kind.
type KubernetesKind struct {
	Kind string `json:"kind"`
	// Watching is true while a watch of the kind is open.
	Watching bool `json:"watching"`
	// StaleSeconds is how long the kind has been without a watch (0
	// while watching).
	StaleSeconds float64 `json:"stale_seconds"`
	// LastOK is the last successful list or watch data (absent before
	// the first).
	LastOK *time.Time `json:"last_ok,omitempty"`
}

func (a *API) status(c *gin.Context) (any, error) {
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.cfg.QueryTimeout)
	defer cancel()
	s, err := a.cfg.Status.Status(ctx)
	if s.Kubernetes.Kinds == nil {
		s.Kubernetes.Kinds = []KubernetesKind{}
	}
	return s, err
}
