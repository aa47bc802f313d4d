package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"
)

// API serves the audit as JSON over net/http. Its routes are absolute, so
// mount Handler at the root of a mux (or as a fallback):
//
//	GET  /api/v1/audit/findings?since=1h       static findings, plus observed gaps when Reports is set
//	GET  /api/v1/audit/unprotected             workloads not isolated per direction
//	GET  /api/v1/audit/denied?since=1h&until=&namespace=&family=4&limit=
//	GET  /api/v1/audit/unused?since=24h        rules that allowed no flow
//	POST /api/v1/audit/whatif?since=6h&limit=  body: proposed NetworkPolicy YAML or JSON (several documents allowed)
//	GET  /api/v1/audit/evaluate?from=ns/pod&to=ns/pod|IP&port=80&proto=tcp&family=6
//
// since is a duration back from now (1h, 30m) or an RFC 3339 time; until
// is an RFC 3339 time (default now). Errors are {"message", "field"} with
// 400 for a bad parameter, 422 for a what-if past Reports.WhatIfLimits
// (field: what to narrow), 503 when the inventory or the store is not
// configured, 500 otherwise. Handlers are safe for concurrent use.
type API struct {
	// Reports runs the store reports; nil answers them with 503.
	Reports *Reports
	// Inventory returns the current cluster snapshot (treated as
	// read-only); nil answers the inventory-based routes with 503.
	Inventory func() (*Inventory, error)
	// Options bound the static analysis.
	Options Options
	// Now is the clock; nil is time.Now.
	Now func() time.Time
}

// maxPolicyBody bounds a what-if request body.
const maxPolicyBody = 1 << 20

// Handler returns the routes of the audit API.
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/v1/audit/findings", a.findings)
	mux.HandleFunc("GET /api/v1/audit/unprotected", a.unprotected)
	mux.HandleFunc("GET /api/v1/audit/denied", a.denied)
	mux.HandleFunc("GET /api/v1/audit/unused", a.unused)
	mux.HandleFunc("POST /api/v1/audit/whatif", a.whatif)
	mux.HandleFunc("GET /api/v1/audit/evaluate", a.evaluate)
	return mux
}

// httpError is an error with a status code and, for bad input, the
// parameter at fault.
type httpError struct {
	code  int
	err   error
	field string
}

func (e *httpError) Error() string { return e.err.Error() }

func badRequest(format string, args ...any) error {
	return &httpError{code: http.StatusBadRequest, err: fmt.Errorf(format, args...)}
}

// badField is a 400 about one parameter (or "body").
func badField(field, format string, args ...any) error {
	return &httpError{code: http.StatusBadRequest, err: fmt.Errorf(format, args...), field: field}
}

// errorBody is every error answer, as in the rest of /api/v1: a message
// and, for bad input, the parameter at fault.
type errorBody struct {
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

// ErrUnavailable is answered as 503: the inventory or the store is not
// configured, or not ready (wrap it to say why).
var ErrUnavailable = errors.New("not available on this server")

func reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		code := http.StatusInternalServerError
		body := errorBody{Message: err.Error()}
		var he *httpError
		var tl *TooLargeError
		switch {
		case errors.As(err, &he):
			code, body.Field = he.code, he.field
		case errors.As(err, &tl):
			code, body.Field = http.StatusUnprocessableEntity, tl.Field
		case errors.Is(err, ErrUnavailable):
			code = http.StatusServiceUnavailable
		}
		w.WriteHeader(code)
		v = body
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v) // the client went away: nothing to do
}

func (a *API) now() time.Time {
	if a.Now != nil {
		return a.Now()
	}
	return time.Now()
}

// window reads since (default def back from now) and until.
func (a *API) window(r *http.Request, def time.Duration) (Window, error) {
	now := a.now()
	w := Window{Since: now.Add(-def), Until: now}
	if s := r.URL.Query().Get("since"); s != "" {
		t, err := ParseSince(s, now)
		if err != nil {
			return w, badField("since", "since: %v", err)
		}
		w.Since = t
	}
	if s := r.URL.Query().Get("until"); s != "" {
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return w, badField("until", "until: %v", err)
		}
		w.Until = t
	}
	if !w.Since.Before(w.Until) {
		return w, badField("since", "since must be before until")
	}
	return w, nil
}

// ParseSince reads a duration back from now ("1h", "90m") or an RFC 3339
// time.
func ParseSince(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("%q: want a positive duration", s)
		}
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q: want a duration (1h) or an RFC 3339 time", s)
	}
	return t, nil
}

func intParam(r *http.Request, name string, max int) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || n > max {
		return 0, badField(name, "%s %q: want 0-%d", name, s, max)
	}
	return n, nil
}

func (a *API) inventory() (*Inventory, error) {
	if a.Inventory == nil {
		return nil, fmt.Errorf("cluster inventory: %w", ErrUnavailable)
	}
	return a.Inventory()
}

func (a *API) reports() (*Reports, error) {
	if a.Reports == nil {
		return nil, fmt.Errorf("flow store: %w", ErrUnavailable)
	}
	return a.Reports, nil
}

// FindingsResponse is the body of /api/v1/audit/findings.
type FindingsResponse struct {
	// Findings lists the dual-stack gaps first, then by kind and message.
	Findings []Finding `json:"findings"`
	// DualStack counts the dual-stack gaps (kinds dual-stack-*).
	DualStack int `json:"dual_stack"`
	// Observed says whether recorded flows were analysed too (the store
	// is configured); ObservedError is set if that part failed.
	Observed      bool   `json:"observed"`
	ObservedError string `json:"observed_error,omitempty"`
}

func (a *API) findings(w http.ResponseWriter, r *http.Request) {
	res, err := func() (*FindingsResponse, error) {
		win, err := a.window(r, time.Hour)
		if err != nil {
			return nil, err
		}
		inv, err := a.inventory()
		if err != nil {
			return nil, err
		}
		res := &FindingsResponse{Findings: Findings(inv, a.Options)}
		if a.Reports != nil {
			res.Observed = true
			obs, err := a.Reports.ObservedGaps(r.Context(), inv, win, 0)
			if err != nil {
				res.ObservedError = err.Error()
			}
			res.Findings = append(res.Findings, obs...)
			sortFindings(res.Findings)
		}
		if res.Findings == nil {
			res.Findings = []Finding{}
		}
		slices.SortStableFunc(res.Findings, func(a, b Finding) int {
			switch {
			case a.DualStack() == b.DualStack():
				return 0
			case a.DualStack():
				return -1
			}
			return 1
		})
		for _, f := range res.Findings {
			if f.DualStack() {
				res.DualStack++
			}
		}
		return res, nil
	}()
	reply(w, res, err)
}

func (a *API) unprotected(w http.ResponseWriter, r *http.Request) {
	res, err := func() ([]UnprotectedWorkload, error) {
		inv, err := a.inventory()
		if err != nil {
			return nil, err
		}
		set, _ := inv.Compile()
		return append([]UnprotectedWorkload{}, Unprotected(inv, set)...), nil
	}()
	reply(w, res, err)
}

func (a *API) denied(w http.ResponseWriter, r *http.Request) {
	res, err := func() ([]DeniedGroup, error) {
		rep, err := a.reports()
		if err != nil {
			return nil, err
		}
		win, err := a.window(r, time.Hour)
		if err != nil {
			return nil, err
		}
		fam, err := ParseFamily(r.URL.Query().Get("family"))
		if err != nil {
			return nil, badField("family", "%v", err)
		}
		limit, err := intParam(r, "limit", 100_000)
		if err != nil {
			return nil, err
		}
		g, err := rep.Denied(r.Context(), DeniedOptions{Window: win, Namespace: r.URL.Query().Get("namespace"), Family: fam, Limit: limit})
		return append([]DeniedGroup{}, g...), err
	}()
	reply(w, res, err)
}

func (a *API) unused(w http.ResponseWriter, r *http.Request) {
	res, err := func() (*UnusedReport, error) {
		rep, err := a.reports()
		if err != nil {
			return nil, err
		}
		inv, err := a.inventory()
		if err != nil {
			return nil, err
		}
		win, err := a.window(r, 24*time.Hour)
		if err != nil {
			return nil, err
		}
		return rep.Unused(r.Context(), inv.NetworkPolicies(), win)
	}()
	reply(w, res, err)
}

func (a *API) whatif(w http.ResponseWriter, r *http.Request) {
	res, err := func() (*WhatIfReport, error) {
		rep, err := a.reports()
		if err != nil {
			return nil, err
		}
		inv, err := a.inventory()
		if err != nil {
			return nil, err
		}
		win, err := a.window(r, 6*time.Hour)
		if err != nil {
			return nil, err
		}
		limit, err := intParam(r, "limit", 1_000_000)
		if err != nil {
			return nil, err
		}
		pols, err := DecodePolicies("request body", io.LimitReader(r.Body, maxPolicyBody), "default")
		if err != nil {
			return nil, badField("body", "%v", err)
		}
		out, err := rep.WhatIf(r.Context(), inv, pols, win, limit)
		if errors.Is(err, ErrInvalidPolicy) {
			return nil, badField("body", "%v", err)
		}
		return out, err
	}()
	reply(w, res, err)
}

func (a *API) evaluate(w http.ResponseWriter, r *http.Request) {
	res, err := func() ([]ProbeResult, error) {
		inv, err := a.inventory()
		if err != nil {
			return nil, err
		}
		q := r.URL.Query()
		proto, err := ParseProto(q.Get("proto"))
		if err != nil {
			return nil, badField("proto", "%v", err)
		}
		fam, err := ParseFamily(q.Get("family"))
		if err != nil {
			return nil, badField("family", "%v", err)
		}
		port, err := intParam(r, "port", 65535)
		if err != nil {
			return nil, err
		}
		set, _ := inv.Compile()
		out, err := Evaluate(inv, set, Probe{From: q.Get("from"), To: q.Get("to"), Proto: proto, Port: uint16(port), Family: fam})
		if err != nil {
			return nil, badRequest("%v", err)
		}
		return out, nil
	}()
	reply(w, res, err)
}
