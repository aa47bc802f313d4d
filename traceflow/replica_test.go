package traceflow

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestStartGetWait: a trace started runs in the background, Get shows it
// running then finished, Wait waits for it; a request the controller
// cannot trace names its field; an unknown id is ErrNotFound.
func TestStartGetWait(t *testing.T) {
	c := New(Config{}, &fakeTracer{trace: delivered}, fakeResolver{noV6: true}, nil)
	defer c.Close()
	ctx := context.Background()
	rq := Request{Source: "frontend/web-1", Destination: Destination{Service: "backend/api-single", Port: 8080}, Family: Dual, Timeout: Duration(2 * time.Second)}
	id, err := c.Start(ctx, rq)
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	deadline := time.Now().Add(5 * time.Second)
	for {
		if res, err = c.Get(ctx, id); err != nil {
			t.Fatal(err)
		}
		if res.Phase != Running || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if res.Phase != Succeeded || len(res.Families) != 2 || res.Families[1].Outcome != NoAddress || res.Families[0].Outcome != Delivered {
		t.Errorf("Get: %+v", res)
	}
	if res, err := c.Trace(ctx, rq); err != nil || res.Phase != Succeeded {
		t.Errorf("Trace: %+v %v", res, err)
	}
	for _, bad := range []Request{
		{Source: "frontend/web-1", Destination: Destination{Service: "backend/api", Port: 80}, DroppedOnly: true},
		{Source: "frontend/web-1"},
	} {
		if _, err := c.Start(ctx, bad); !errors.Is(err, ErrInvalid) {
			t.Errorf("Start %+v: %v, want ErrInvalid", bad, err)
		}
	}
	// An invalid value is named, and said once.
	_, err = c.Start(ctx, Request{SourceWorkload: "x/gone", Destination: Destination{Service: "backend/api", Port: 80}})
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "source_workload" || fe.Message != "no pod of workload x/gone to trace (it does not exist, or has no running pod off the host network)" {
		t.Errorf("unknown workload: %v, want a FieldError naming the field", err)
	}
	if _, err := c.Get(ctx, "tf-unknown"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get unknown: %v", err)
	}
}

// TestSharedStoreChDB runs two controllers over one store, as two web
// replicas: a trace started on A is not found on B while it runs, and B
// answers Get with A's result once A saved it.
func TestSharedStoreChDB(t *testing.T) {
	st := NewStore(newEngine(t), "dualflow")
	b := New(Config{}, &fakeTracer{trace: func(Probe) (Path, error) {
		t.Error("replica B traced")
		return Path{}, errors.New("not here")
	}}, fakeResolver{}, st)
	defer b.Close()
	get := func(id string) (int, Result) {
		t.Helper()
		res, err := b.Get(context.Background(), id)
		switch {
		case errors.Is(err, ErrNotFound):
			return http.StatusNotFound, res
		case err != nil:
			t.Fatal(err)
		}
		return http.StatusOK, res
	}

	for _, tt := range []struct {
		name      string
		family    Family
		res       fakeResolver
		workloads bool
	}{
		{"ipv4", IPv4, fakeResolver{}, false},
		{"ipv6", IPv6, fakeResolver{}, false},
		{"dual", Dual, fakeResolver{}, false},
		{"dual, no IPv6 address", Dual, fakeResolver{noV6: true}, false},
		// Saved with the pods picked for the workloads.
		{"dual, workloads", Dual, fakeResolver{}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			release := make(chan struct{})
			a := New(Config{}, &fakeTracer{trace: func(p Probe) (Path, error) {
				<-release
				return delivered(p)
			}}, tt.res, st)
			defer a.Close()
			rq := req()
			rq.Family = tt.family
			if tt.workloads {
				rq.Source, rq.SourceWorkload, rq.Destination = "", "frontend/web", Destination{Workload: "backend/api", Port: 80}
			}
			id, err := a.Start(context.Background(), rq)
			if err != nil {
				t.Fatal(err)
			}
			if code, _ := get(id); code != http.StatusNotFound {
				t.Errorf("GET on B while running on A: %d, want 404", code)
			}
			close(release)
			want, err := a.Wait(context.Background(), id)
			if err != nil {
				t.Fatal(err)
			}
			a.Close() // waits for the save
			code, got := get(id)
			if code != http.StatusOK {
				t.Fatalf("GET on B after A saved: %d", code)
			}
			if g, w := jsonText(t, got), jsonText(t, stored(want)); g != w {
				t.Errorf("B answered:\n%s\nA saved:\n%s", g, w)
			}
			if len(got.Families) != len(tt.family.Families()) || got.Phase != Succeeded {
				t.Errorf("B answered %d families, phase %s", len(got.Families), got.Phase)
			}
			if w, err := b.Wait(context.Background(), id); err != nil || jsonText(t, w) != jsonText(t, got) {
				t.Errorf("Wait on B: %v", err)
			}
		})
	}
	for _, id := range []string{"tf-0123456789abcdef", "tf-1' OR '1'='1", `tf-\'\\`, strings.Repeat(`\'`, 1<<14)} {
		if code, _ := get(id); code != http.StatusNotFound {
			t.Errorf("GET %.40q: %d, want 404", id, code)
		}
	}
}
