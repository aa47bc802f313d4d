package api

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store/chdb"
)

// logRecorder keeps the records of a slog.Logger.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, r)
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

func (l *logRecorder) errors() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.recs {
		if r.Level >= slog.LevelError {
			out = append(out, r.Message)
		}
	}
	return out
}

func values(n int, f func(i int) string) string {
	v := make([]string, n)
	for i := range v {
		v[i] = f(i)
	}
	return url.QueryEscape(strings.Join(v, ","))
}

// TestFilterTooLarge: a filter too large for the engine is the client's
// error, a 400 naming the field, not a store failure (502) logged as an
// ERROR. The engine refuses a query text over max_query_size (256 KiB).
func TestFilterTooLarge(t *testing.T) {
	rec := &logRecorder{}
	h := testAPI(t, Config{Logger: slog.New(rec)})
	long := strings.Repeat("a", 300<<10)
	for _, tc := range []struct {
		name, url, field string
	}{
		{"a value over max_query_size", "/api/v1/flows?src_pod=" + long, "src_pod"},
		{"a long value", "/api/v1/flows?src_pod=" + strings.Repeat("a", maxValueBytes+1), "src_pod"},
		{"many long values", "/api/v1/flows?policy=" + values(maxValues, func(i int) string {
			return fmt.Sprintf("ns-%d/%s", i, strings.Repeat("p", 900))
		}), "policy"},
		{"long values over several fields", "/api/v1/flows?" + func() string {
			var p []string
			for _, k := range []string{"pod", "workload", "namespace", "node", "zone", "label"} {
				p = append(p, k+"="+values(maxValues, func(i int) string { return fmt.Sprintf("%d-%s", i, strings.Repeat("x", 200)) }))
			}
			return strings.Join(p, "&")
		}(), ""},
		{"summary", "/api/v1/flows/summary?dst_pod=" + long, "dst_pod"},
		{"service map", "/api/v1/servicemap?not.node=" + long, "not.node"},
		{"follow", "/api/v1/flows?follow=true&label=" + long, "label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A follow stream that is let in runs until its request ends.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequestWithContext(ctx, "GET", tc.url, nil))
			r := resp{w.Code, w.Body.String(), w.Header()}
			if r.code != 400 {
				t.Fatalf("%v, want 400", r)
			}
			e := decode[errorBody](t, r)
			if tc.field != "" && e.Field != tc.field || e.Field == "" || !strings.Contains(e.Message, "bytes") && !strings.Contains(e.Message, "too large") {
				t.Errorf("error %+v, want field %q and a message about the size", e, tc.field)
			}
		})
	}
	// Large filters within the bounds run.
	for _, u := range []string{
		"/api/v1/flows?src_pod=" + values(maxValues, func(i int) string { return fmt.Sprintf("shop/frontend-%d", i) }),
		"/api/v1/flows?label=" + values(maxValues, func(i int) string { return fmt.Sprintf("app.kubernetes.io/name-%d=%s", i, strings.Repeat("v", 63)) }),
		"/api/v1/flows?dst_ip=" + values(maxValues, func(i int) string { return fmt.Sprintf("fd00:10:244:%x::/64", i) }) + "&src_ip=" + values(maxValues, func(i int) string { return fmt.Sprintf("198.18.%d.0/24", i) }),
	} {
		if r := do(t, h, "GET", u, ""); r.code != 200 {
			t.Errorf("%.80s…: %v", u, r)
		}
	}
	r := do(t, h, "POST", "/api/v1/reachability", `{"sources":[{"kind":"pod","namespace":"shop","name":"`+long+`"}],"destinations":[{"kind":"workload","namespace":"shop","name":"db"}]}`)
	if e := decode[errorBody](t, r); r.code != 400 || e.Field != "sources[0]" {
		t.Errorf("reachability with a long name: %v", r)
	}
	if errs := rec.errors(); len(errs) > 0 {
		t.Errorf("client errors logged as ERROR: %q", errs)
	}
}

// TestEngineRefusesSize: should a request still make a query the engine
// refuses for its size, that is a 400, not a store failure.
func TestEngineRefusesSize(t *testing.T) {
	rec := &logRecorder{}
	for _, err := range []error{
		&chdb.Error{Code: chdb.CodeSyntaxError, Name: "SYNTAX_ERROR", Message: "Max query size exceeded (can be increased with the `max_query_size` setting): Syntax error: failed at position 1411"},
		&chdb.Error{Code: 168, Name: "TOO_BIG_AST", Message: "AST is too big. Maximum: 50000. (TOO_BIG_AST)"},
	} {
		h := testAPI(t, Config{Store: &fakeStore{err: err}, Logger: slog.New(rec)})
		if r := do(t, h, "GET", "/api/v1/flows?src_pod=a", ""); r.code != 400 || !strings.Contains(r.body, "too large") {
			t.Errorf("%v: %v, want 400", err, r)
		}
	}
	// Any other syntax error is ours: a store failure.
	h := testAPI(t, Config{Store: &fakeStore{err: &chdb.Error{Code: chdb.CodeSyntaxError, Message: "Syntax error: failed at position 3"}}, Logger: slog.New(rec)})
	if r := do(t, h, "GET", "/api/v1/flows", ""); r.code != 502 {
		t.Errorf("a syntax error of the API's own SQL: %v, want 502", r)
	}
	if errs := rec.errors(); len(errs) != 1 {
		t.Errorf("ERROR logs %q, want only the API's own syntax error", errs)
	}
}
