// Package agent is the node-side HTTP API of traceflow: the controller (in
// the collector) asks the tracer of a node (in the exporter) to send and
// follow one probe. Requests carry a bearer token; the token comes from the
// environment or a file, never from a flag.
//
//	POST /agent/v1/trace   body {"probe": Probe, "timeout": "2s"} → 200 Path
//
// Client implements the controller's node tracer over this API, so a
// Controller works the same with the in-process lab tracer or with remote
// agents.
package agent

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/dualflow/dualflow/traceflow"
)

// Path of the trace endpoint.
const Path = "/agent/v1/trace"

// TokenEnv is the environment variable holding the bearer token.
const TokenEnv = "DUALFLOW_TRACEFLOW_TOKEN"

// maxBody caps request and response bodies (a path is a few KiB).
const maxBody = 1 << 20

// maxTimeout caps the timeout a caller may ask for.
const maxTimeout = time.Minute

// replyMargin is the most a Client keeps of its deadline for the reply.
const replyMargin = 250 * time.Millisecond

// ErrUnauthorized is returned by Client when the agent refuses the token.
var ErrUnauthorized = errors.New("traceflow agent: unauthorized")

// tracer sends and follows one probe (lab/tracer.Tracer).
type tracer interface {
	Trace(ctx context.Context, p traceflow.Probe) (traceflow.Path, error)
}

// request is the body of POST /agent/v1/trace.
type request struct {
	Probe   traceflow.Probe    `json:"probe"`
	Timeout traceflow.Duration `json:"timeout"`
}

type errorBody struct {
	Error string `json:"error"`
}

// LoadToken reads the token from $DUALFLOW_TRACEFLOW_TOKEN, else from
// file (trailing whitespace trimmed). An empty token is an error.
func LoadToken(file string) (string, error) {
	tok := os.Getenv(TokenEnv)
	if tok == "" && file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("traceflow token: %w", err)
		}
		tok = strings.TrimSpace(string(b))
	}
	if tok == "" {
		return "", fmt.Errorf("traceflow token: set $%s or a token file", TokenEnv)
	}
	return tok, nil
}

// Handler serves the agent API for t, accepting only "Authorization:
// Bearer <token>". It panics if token is empty (an open agent would inject
// packets for anyone).
func Handler(t tracer, token string) http.Handler {
	if token == "" {
		panic("traceflow agent: empty token")
	}
	want := []byte("Bearer " + token)
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+Path, func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="dualflow-traceflow"`)
			writeJSON(w, http.StatusUnauthorized, errorBody{"unauthorized"})
			return
		}
		var req request
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody)).Decode(&req); err != nil {
			writeJSON(w, http.StatusBadRequest, errorBody{"decode request: " + err.Error()})
			return
		}
		timeout := time.Duration(req.Timeout)
		if timeout <= 0 || timeout > maxTimeout {
			writeJSON(w, http.StatusBadRequest, errorBody{fmt.Sprintf("timeout %v: want 0 < timeout <= %v", timeout, maxTimeout)})
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		path, err := t.Trace(ctx, req.Probe)
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			path.Outcome, path.Reason = traceflow.TimedOut, fmt.Sprintf("no delivery or drop seen within %v", timeout)
		case errors.Is(err, traceflow.ErrNotSupported):
			writeJSON(w, http.StatusNotImplemented, errorBody{err.Error()})
			return
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, errorBody{err.Error()})
			return
		}
		if path.Observations == nil {
			path.Observations = []traceflow.Observation{}
		}
		writeJSON(w, http.StatusOK, path)
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v) // status already sent; nothing to do on error
}

// Client calls one node's agent. It is safe for concurrent use.
type Client struct {
	// URL is the agent's base URL, e.g. https://node-1:9444.
	URL   string
	Token string
	// HTTP is the client to use (default http.DefaultClient); give it TLS
	// settings for a real deployment.
	HTTP *http.Client
}

// Trace asks the agent to trace p within ctx's deadline (required: it is
// the probe's timeout).
func (c *Client) Trace(ctx context.Context, p traceflow.Probe) (traceflow.Path, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		return traceflow.Path{}, errors.New("traceflow agent: the context needs a deadline")
	}
	// The agent gets a little less than what is left, so that its answer
	// (a timed-out path with what it saw) arrives before ctx ends.
	left := time.Until(dl)
	left -= min(left/10, replyMargin)
	if left <= 0 {
		return traceflow.Path{}, fmt.Errorf("traceflow agent: %w", context.DeadlineExceeded)
	}
	body, err := json.Marshal(request{Probe: p, Timeout: traceflow.Duration(left)})
	if err != nil {
		return traceflow.Path{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(c.URL, "/")+Path, bytes.NewReader(body))
	if err != nil {
		return traceflow.Path{}, fmt.Errorf("traceflow agent: %w", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	req.Header.Set("Content-Type", "application/json")
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	resp, err := hc.Do(req)
	if err != nil {
		return traceflow.Path{}, fmt.Errorf("traceflow agent %s: %w", c.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return traceflow.Path{}, fmt.Errorf("traceflow agent %s: %w", c.URL, err)
	}
	if resp.StatusCode != http.StatusOK {
		var eb errorBody
		json.Unmarshal(b, &eb)
		switch resp.StatusCode {
		case http.StatusUnauthorized:
			return traceflow.Path{}, ErrUnauthorized
		case http.StatusNotImplemented:
			return traceflow.Path{}, fmt.Errorf("traceflow agent %s: %w: %s", c.URL, traceflow.ErrNotSupported, eb.Error)
		}
		return traceflow.Path{}, fmt.Errorf("traceflow agent %s: %s: %s", c.URL, resp.Status, eb.Error)
	}
	var path traceflow.Path
	if err := json.Unmarshal(b, &path); err != nil {
		return traceflow.Path{}, fmt.Errorf("traceflow agent %s: decode path: %w", c.URL, err)
	}
	return path, nil
}
