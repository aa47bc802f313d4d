package api

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/collector/audit"
)

// TraceflowRequest is the body of POST /traceflow.
type TraceflowRequest struct {
	Source      Endpoint `json:"source"`
	Destination Endpoint `json:"destination"`
	Protocol    string   `json:"protocol,omitempty"` // default TCP
	Port        uint16   `json:"port,omitempty"`
	// Family is 4, 6, or 0 for both (a dual trace, run in parallel).
	Family int `json:"family,omitempty"`
}

// TraceflowResponse has one result or error per family traced.
type TraceflowResponse struct {
	Results []*TraceResult    `json:"results"`
	Errors  map[string]string `json:"errors,omitempty"`
}

func validEndpoint(e Endpoint, field string) error {
	switch e.Kind {
	case "pod", "workload", "service":
		if e.Namespace == "" || e.Name == "" {
			return fieldErr(field, "%s needs namespace and name", e.Kind)
		}
	case "ip":
		if _, err := ipCond("x", e.Name); err != nil || strings.Contains(e.Name, "/") {
			return fieldErr(field, "want an address")
		}
	default:
		return fieldErr(field, "kind %q is not pod, workload, service or ip", e.Kind)
	}
	return nil
}

func (a *API) traceflow(c *gin.Context) {
	if a.cfg.Tracer == nil {
		a.fail(c, fmt.Errorf("traceflow: %w", ErrNotConfigured))
		return
	}
	var req TraceflowRequest
	if err := c.ShouldBindJSON(&req); err != nil {
		a.fail(c, fieldErr("body", "bad JSON: %v", err))
		return
	}
	if err := validEndpoint(req.Source, "source"); err != nil {
		a.fail(c, err)
		return
	}
	if req.Source.Kind == "service" {
		a.fail(c, fieldErr("source", "a Service can only be a destination"))
		return
	}
	if err := validEndpoint(req.Destination, "destination"); err != nil {
		a.fail(c, err)
		return
	}
	proto := uint8(6)
	if req.Protocol != "" {
		n, ok := protoNumbers[strings.ToLower(req.Protocol)]
		if !ok {
			a.fail(c, fieldErr("protocol", "unknown protocol %q", req.Protocol))
			return
		}
		proto = n
	}
	var fams []int
	switch req.Family {
	case 0:
		fams = []int{4, 6}
	case 4, 6:
		fams = []int{req.Family}
	default:
		a.fail(c, fieldErr("family", "want 4, 6 or 0 (both)"))
		return
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.cfg.TraceTimeout)
	defer cancel()
	resp := TraceflowResponse{Results: []*TraceResult{}, Errors: map[string]string{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, fam := range fams {
		wg.Go(func() {
			res, err := a.cfg.Tracer.Trace(ctx, TraceRequest{Source: req.Source, Destination: req.Destination, Family: fam, Protocol: proto, Port: req.Port})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				resp.Errors[strconv.Itoa(fam)] = err.Error()
				return
			}
			res.Family = fam
			resp.Results = append(resp.Results, res)
		})
	}
	wg.Wait()
	sort.Slice(resp.Results, func(i, j int) bool { return resp.Results[i].Family < resp.Results[j].Family })
	c.JSON(http.StatusOK, resp)
}

// AuditResponse is the answer of GET /audit.
type AuditResponse struct {
	Findings  []audit.Finding `json:"findings"`
	DualStack int             `json:"dual_stack"`
}

func (a *API) audit(c *gin.Context) {
	if a.cfg.Auditor == nil {
		a.fail(c, fmt.Errorf("audit: %w", ErrNotConfigured))
		return
	}
	fs, err := a.cfg.Auditor.Findings(c.Request.Context())
	if err != nil {
		a.fail(c, err)
		return
	}
	fs = append([]audit.Finding(nil), fs...)
	// Dual-stack gaps first, otherwise the auditor's order.
	sort.SliceStable(fs, func(i, j int) bool { return fs[i].DualStack() && !fs[j].DualStack() })
	kind := c.Query("kind")
	resp := AuditResponse{Findings: []audit.Finding{}}
	for _, f := range fs {
		if kind != "" && f.Kind != kind {
			continue
		}
		if f.DualStack() {
			resp.DualStack++
		}
		resp.Findings = append(resp.Findings, f)
	}
	c.JSON(http.StatusOK, resp)
}
