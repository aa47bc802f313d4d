package app

import (
	"context"

	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/web/api"
)

var _ api.Status = (*view)(nil)

// Status implements api.Status from the enrichment's view of the cluster.
func (v *view) Status(context.Context) (api.StatusResponse, error) {
	var out api.StatusResponse
	e := v.c.Enricher()
	if e == nil {
		out.Kubernetes.Source = string(enrich.SourceOff)
		return out, nil
	}
	return api.StatusResponse{Kubernetes: kubernetesStatus(e)}, nil
}

func kubernetesStatus(e *enrich.Enricher) api.KubernetesStatus {
	k := api.KubernetesStatus{Source: string(e.Source()), Synced: e.Synced(), Stale: e.Stale()}
	for _, s := range e.Status() {
		kk := api.KubernetesKind{Kind: s.Kind, Watching: s.Watching, StaleSeconds: s.StaleFor.Seconds()}
		if !s.LastOK.IsZero() {
			t := s.LastOK.UTC()
			kk.LastOK = &t
		}
		k.Kinds = append(k.Kinds, kk)
	}
	return k
}
