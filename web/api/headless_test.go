package api

import (
	"context"
	"testing"

	"github.com/dualflow/dualflow/lab/manifest"
)

// TestHeadlessServiceEvaluatedOnThePortAsked: clients of a headless
// Service dial its pods directly, on the port they choose, so there is no
// port mapping and no "no such port".
func TestHeadlessServiceEvaluatedOnThePortAsked(t *testing.T) {
	ev := labEvaluator(t, manifest.ModeDual)
	r := ev.Resolver.(InventoryResolver)
	svc := r.Service
	r.Service = func(ns, name string) (*ServiceSpec, bool) {
		s, ok := svc(ns, name)
		if ok {
			c := *s
			c.Headless = true
			s = &c
		}
		return s, ok
	}
	ev.Resolver = r
	web := Endpoint{Kind: "workload", Namespace: manifest.NSFrontend, Name: "web"}
	api := Endpoint{Kind: "service", Namespace: manifest.NSBackend, Name: manifest.ServiceAPI}
	// 8080 is api's target port, not one of the Service's ports: a
	// headless Service answers on it (allowed by allow-web-to-api).
	m, err := ev.EvaluateMatrix(context.Background(), []Endpoint{web}, []Endpoint{api}, 6, 8080)
	if err != nil {
		t.Fatal(err)
	}
	for _, fam := range []int{4, 6} {
		got := m[0][0][fam]
		if got.Outcome != OutcomeAllow || got.Total != 4 || got.Pairs[0].Port != 8080 {
			t.Errorf("headless api:8080 IPv%d: %+v, want 4 pairs allowed on 8080", fam, got)
		}
	}
}
