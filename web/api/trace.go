package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/traceflow"
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

// TraceflowResponse has the result of each family traced. A request no
// family can be traced for is answered 400 {message, field} instead (504
// when it timed out); Errors holds, by family ("4", "6"), why a family of
// a dual trace could not be traced while the other was (e.g. a Service
// without an IPv6 ClusterIP).
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
	if err := bindJSON(c, &req); err != nil {
		a.fail(c, err)
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
	ctx, cancel := context.WithTimeout(traceflow.WithCaller(c.Request.Context(), principalOf(c).Name), a.cfg.TraceTimeout)
	defer cancel()
	resp := TraceflowResponse{Results: []*TraceResult{}, Errors: map[string]string{}}
	failed := map[int]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, fam := range fams {
		wg.Go(func() {
			res, err := a.cfg.Tracer.Trace(ctx, TraceRequest{Source: req.Source, Destination: req.Destination, Family: fam, Protocol: proto, Port: req.Port})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				resp.Errors[strconv.Itoa(fam)] = err.Error()
				failed[fam] = err
				return
			}
			res.Family = fam
			resp.Results = append(resp.Results, res)
		})
	}
	wg.Wait()
	if len(resp.Results) == 0 {
		a.fail(c, traceFailed(fams, failed))
		return
	}
	sort.Slice(resp.Results, func(i, j int) bool { return resp.Results[i].Family < resp.Results[j].Family })
	c.JSON(http.StatusOK, resp)
}

// traceFailed is the error of a trace no family of fams could be traced
// for: the tracer's FieldError, a timeout (504), or else a 400 naming what
// the message is about, said once when the families failed alike.
func traceFailed(fams []int, failed map[int]error) error {
	msgs := make([]string, 0, len(fams))
	same := true
	timeouts := 0
	var fe *FieldError
	for _, fam := range fams {
		err := failed[fam]
		if err == nil {
			continue
		}
		if errors.Is(err, context.DeadlineExceeded) {
			timeouts++
		}
		if errors.Is(err, ErrNotConfigured) || errors.Is(err, context.Canceled) {
			return err
		}
		var e *FieldError
		if errors.As(err, &e) && fe == nil {
			fe = e
		}
		msg := err.Error()
		if e != nil {
			msg = e.Message
		}
		same = same && (len(msgs) == 0 || msgs[0] == msg)
		msgs = append(msgs, msg)
	}
	if timeouts == len(fams) {
		return fmt.Errorf("traceflow: %w", context.DeadlineExceeded)
	}
	msg := ""
	if same && len(msgs) > 0 {
		msg = msgs[0]
	} else {
		parts := make([]string, len(msgs))
		for i, m := range msgs {
			parts[i] = "IPv" + strconv.Itoa(fams[i]) + ": " + m
		}
		msg = strings.Join(parts, "; ")
	}
	field := ""
	switch {
	case fe != nil:
		field = fe.Field
	case strings.HasPrefix(msg, "source"):
		field = "source"
	case strings.HasPrefix(msg, "destination"), strings.Contains(msg, "ClusterIP"):
		field = "destination"
	case strings.Contains(msg, "no port"):
		field = "port"
	case len(fams) == 1:
		field = "family"
	}
	return &FieldError{Field: field, Message: msg, reason: reasonInvalid}
}
