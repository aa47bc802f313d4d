package api

import (
	"context"
	"net/http"
	"testing"
	"time"
)

type statusFunc func(context.Context) (StatusResponse, error)

func (f statusFunc) Status(ctx context.Context) (StatusResponse, error) { return f(ctx) }

func TestStatus(t *testing.T) {
	tok := &Tokens{}
	tok.Add("view-secret", Principal{Name: "v", Role: RoleViewer})
	last := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	st := statusFunc(func(context.Context) (StatusResponse, error) {
		return StatusResponse{Kubernetes: KubernetesStatus{Source: "kubeconfig", Synced: true, Stale: true, Kinds: []KubernetesKind{
			{Kind: "pod", StaleSeconds: 12.5, LastOK: &last},
			{Kind: "service", Watching: true, LastOK: &last},
		}}}, nil
	})
	h := testAPI(t, Config{Store: &fakeStore{}, Tokens: tok, Status: st})
	if r := do(t, h, "GET", "/api/v1/status", ""); r.code != http.StatusUnauthorized {
		t.Errorf("no token: %s", r)
	}
	got := decode[StatusResponse](t, do(t, h, "GET", "/api/v1/status", "", "Authorization", "Bearer view-secret"))
	k := got.Kubernetes
	if !k.Stale || !k.Synced || k.Source != "kubeconfig" || len(k.Kinds) != 2 || k.Kinds[0].Watching || k.Kinds[0].StaleSeconds != 12.5 ||
		!k.Kinds[1].Watching || !k.Kinds[1].LastOK.Equal(last) {
		t.Errorf("status %+v", got)
	}
	// The inventory source: no kinds, an empty list rather than null.
	inv := testAPI(t, Config{Store: &fakeStore{}, Status: statusFunc(func(context.Context) (StatusResponse, error) {
		return StatusResponse{Kubernetes: KubernetesStatus{Source: "inventory", Synced: true}}, nil
	})})
	if r := do(t, inv, "GET", "/api/v1/status", ""); r.code != 200 || r.body != `{"kubernetes":{"source":"inventory","synced":true,"stale":false,"kinds":[]}}` {
		t.Errorf("inventory status: %s", r)
	}
	if r := do(t, testAPI(t, Config{Store: &fakeStore{}}), "GET", "/api/v1/status", ""); r.code != http.StatusNotImplemented {
		t.Errorf("no status: %s", r)
	}
}
