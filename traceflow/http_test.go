package traceflow

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

func TestHandler(t *testing.T) {
	c := New(Config{}, &fakeTracer{trace: delivered}, fakeResolver{noV6: true}, nil)
	defer c.Close()
	srv := httptest.NewServer(Handler(c))
	defer srv.Close()

	post := func(body, query string) (*http.Response, map[string]any) {
		t.Helper()
		resp, err := http.Post(srv.URL+"/api/v1/traceflows"+query, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		json.NewDecoder(resp.Body).Decode(&m)
		return resp, m
	}
	body := `{"source":"frontend/web-1","destination":{"service":"backend/api-single","port":8080},"family":"dual","timeout":"2s"}`
	resp, m := post(body, "")
	if resp.StatusCode != http.StatusAccepted || m["id"] == nil || resp.Header.Get("Location") == "" {
		t.Fatalf("POST: %d %v", resp.StatusCode, m)
	}
	id := m["id"].(string)
	var res Result
	deadline := time.Now().Add(5 * time.Second)
	for {
		r, err := http.Get(srv.URL + "/api/v1/traceflows/" + id)
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(r.Body).Decode(&res)
		r.Body.Close()
		if res.Phase != Running || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if res.Phase != Succeeded || len(res.Families) != 2 || res.Families[1].Outcome != NoAddress || res.Families[0].Outcome != Delivered {
		t.Errorf("GET: %+v", res)
	}

	resp, m = post(body, "?wait=true")
	if resp.StatusCode != http.StatusOK || m["phase"] != "succeeded" {
		t.Errorf("POST wait: %d %v", resp.StatusCode, m)
	}
	for _, tt := range []struct {
		body string
		want int
	}{
		{`{"source":"frontend/web-1","destination":{"service":"backend/api","port":80},"droppedOnly":true}`, http.StatusBadRequest},
		{`{"source":"frontend/web-1","destination":{}}`, http.StatusBadRequest},
		{`{"source":"frontend/web-1","bogus":1}`, http.StatusBadRequest},
		{`not json`, http.StatusBadRequest},
	} {
		if resp, m := post(tt.body, ""); resp.StatusCode != tt.want || m["message"] == nil {
			t.Errorf("POST %s: %d %v, want %d with an error", tt.body, resp.StatusCode, m, tt.want)
		}
	}
	if resp, m := post(`{"source":"frontend/web-1","bogus":1}`, ""); resp.StatusCode != http.StatusBadRequest || m["field"] != "bogus" {
		t.Errorf("unknown field: %d %v, want 400 naming the field", resp.StatusCode, m)
	}
	// An invalid value is named too, and said once.
	if resp, m := post(`{"sourceWorkload":"x/gone","destination":{"service":"backend/api","port":80}}`, ""); resp.StatusCode != http.StatusBadRequest ||
		m["field"] != "sourceWorkload" || m["message"] != "no pod of workload x/gone to trace (it does not exist, or has no running pod off the host network)" {
		t.Errorf("unknown workload: %d %v, want 400 naming the field", resp.StatusCode, m)
	}
	r, err := http.Get(srv.URL + "/api/v1/traceflows/tf-unknown")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusNotFound {
		t.Errorf("GET unknown: %d", r.StatusCode)
	}
}

// TestHandlerSharedStoreChDB runs two controllers over one store, as two
// web replicas: a trace started on A is not found on B while it runs, and
// B answers GET with A's result once A saved it.
func TestHandlerSharedStoreChDB(t *testing.T) {
	st := NewStore(newEngine(t), "dualflow")
	b := New(Config{}, &fakeTracer{trace: func(Probe) (Path, error) {
		t.Error("replica B traced")
		return Path{}, errors.New("not here")
	}}, fakeResolver{}, st)
	defer b.Close()
	srvB := httptest.NewServer(Handler(b))
	defer srvB.Close()
	get := func(id string) (int, Result) {
		t.Helper()
		r, err := http.Get(srvB.URL + "/api/v1/traceflows/" + url.PathEscape(id))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		var res Result
		if r.StatusCode == http.StatusOK {
			if err := json.NewDecoder(r.Body).Decode(&res); err != nil {
				t.Fatal(err)
			}
		}
		return r.StatusCode, res
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
