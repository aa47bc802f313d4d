package traceflow

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/dualflow/dualflow/traceflow/ratelimit"
)

// maxRequestBody caps a POST body; a request is a few hundred bytes.
const maxRequestBody = 64 << 10

// Handler serves the REST API on plain net/http (mount it under any router,
// e.g. gin.WrapH):
//
//	POST /api/v1/traceflows       body Request → 202 {"id": "...", "phase": "running"}
//	                              with ?wait=true → 200 Result once finished
//	GET  /api/v1/traceflows/{id}  → 200 Result (phase running, succeeded or failed)
//
// GET answers from the controller's memory, else from the store (see
// Controller.Get): with several replicas over one store, a trace is found
// on every replica once it has finished and been saved, and while it runs
// only on the replica that runs it (404 elsewhere).
//
// Errors are JSON {"message": "...", "field": "..."} (field for a request
// body that does not decode and for a FieldError), as in the rest of
// /api/v1: 400 invalid request, 501 not supported,
// 404 unknown id, 429 with Retry-After for a caller or a node beyond its
// rate, or too many traces in flight.
//
// The caller of a POST (its rate limit and its share of the results kept)
// is the request context's (WithCaller, set by a router that knows the
// principal), else its bearer token (by a hash: one per token of the
// tokens file), else its client address.
func Handler(c *Controller) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/v1/traceflows", func(w http.ResponseWriter, r *http.Request) {
		var req Request
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxRequestBody))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			e := errorBody{Message: "decode request: " + err.Error(), Field: "body"}
			// encoding/json has no type for it: `json: unknown field "name"`.
			if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
				e.Field = strings.Trim(name, `"`)
			}
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) && te.Field != "" {
				e.Field = te.Field
			}
			writeJSON(w, http.StatusBadRequest, e)
			return
		}
		ctx := r.Context()
		if CallerFrom(ctx) == "" {
			ctx = WithCaller(ctx, callerOf(r))
		}
		id, err := c.Start(ctx, req)
		if err != nil {
			writeError(w, err)
			return
		}
		if r.URL.Query().Get("wait") != "true" {
			w.Header().Set("Location", "/api/v1/traceflows/"+id)
			writeJSON(w, http.StatusAccepted, map[string]string{"id": id, "phase": string(Running)})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), c.cfg.MaxTimeout+5*time.Second)
		defer cancel()
		res, err := c.Wait(ctx, id)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
	})
	mux.HandleFunc("GET /api/v1/traceflows/{id}", func(w http.ResponseWriter, r *http.Request) {
		res, err := c.Get(r.Context(), r.PathValue("id"))
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, res)
	})
	return mux
}

// StatusOf maps a Controller error to its HTTP status.
func StatusOf(err error) int {
	switch {
	case errors.Is(err, ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, ErrNotSupported):
		return http.StatusNotImplemented
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrBusy), errors.Is(err, ErrRateLimited):
		return http.StatusTooManyRequests
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// errorBody is an error answer.
type errorBody struct {
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

func writeError(w http.ResponseWriter, err error) {
	var rl *RateLimitError
	switch {
	case errors.As(err, &rl):
		w.Header().Set("Retry-After", strconv.Itoa(ratelimit.RetryAfterSeconds(rl.RetryAfter)))
	case errors.Is(err, ErrBusy):
		// A tag frees when a trace ends: within its timeout, mostly
		// within a second.
		w.Header().Set("Retry-After", "1")
	}
	body := errorBody{Message: err.Error()}
	var fe *FieldError
	if errors.As(err, &fe) {
		body = errorBody{Message: fe.Message, Field: fe.Field}
	}
	writeJSON(w, StatusOf(err), body)
}

// callerOf names the caller of r for its rate limit: its bearer token by
// a hash (the token itself never leaves this function), else its client
// address.
func callerOf(r *http.Request) string {
	if scheme, tok, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " "); ok && strings.EqualFold(scheme, "Bearer") {
		if tok = strings.TrimSpace(tok); tok != "" {
			h := sha256.Sum256([]byte(tok))
			return "token:" + hex.EncodeToString(h[:6])
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	return "addr:" + host
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v) // the status is sent; a write error has nowhere to go
}
