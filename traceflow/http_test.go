package traceflow

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
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
	r, err := http.Get(srv.URL + "/api/v1/traceflows/tf-unknown")
	if err != nil {
		t.Fatal(err)
	}
	r.Body.Close()
	if r.StatusCode != http.StatusNotFound {
		t.Errorf("GET unknown: %d", r.StatusCode)
	}
}
