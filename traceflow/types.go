// Package traceflow injects a probe packet at a pod and reports the path it
// takes through the cluster, per IP family: forwarding, Service load
// balancing (with the DNAT/SNAT translation), NetworkPolicy verdicts (the
// policy and rule that dropped it) and delivery at the destination pod.
//
// Controller is the gin-independent service behind `POST /api/v1/traceflows`
// and `GET /api/v1/traceflows/{id}`: Start validates and resolves a Request
// and traces each requested family concurrently in the background; Get
// returns the Result so far. The per-family work is done by the node
// agents in the exporters (package traceflow/agent: watch on every node the
// probe may cross, inject at the source node, merge; package
// traceflow/node: gopacket probe injected from the source pod's netns,
// nftables trace, conntrack and captures on the node itself).
//
// Every probe carries a tag in its DSCP bits (packet.MinTag..packet.MaxTag),
// one per family trace in flight, so at most packet.MaxTag family traces
// (31 dual-family traces) run at once; Start returns ErrBusy beyond that.
package traceflow

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// Family selects the IP families of a trace.
type Family string

// Families of a request; a family result is always ipv4 or ipv6.
const (
	IPv4 Family = "ipv4"
	IPv6 Family = "ipv6"
	Dual Family = "dual"
)

// Families returns the single families f stands for, IPv4 first.
func (f Family) Families() []Family {
	switch f {
	case Dual:
		return []Family{IPv4, IPv6}
	case IPv4, IPv6:
		return []Family{f}
	}
	return nil
}

// parseFamily reads a request's family as flow.ParseFamily does (4,
// ipv4, 6, ipv6, 0, dual or empty, any case).
func parseFamily(s string) (Family, error) {
	switch v, err := flow.ParseFamily(s); {
	case err != nil:
		return "", err
	case v == 4:
		return IPv4, nil
	case v == 6:
		return IPv6, nil
	}
	return Dual, nil
}

// UnmarshalJSON reads a family as a string or as the number 0, 4 or 6
// (the numbers the flows and audit APIs use); Normalize checks it.
func (f *Family) UnmarshalJSON(b []byte) error {
	var n int
	if json.Unmarshal(b, &n) == nil {
		*f = Family(fmt.Sprint(n))
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("family %s: want a string or 0, 4 or 6", b)
	}
	*f = Family(s)
	return nil
}

// Protocol is the probe's protocol.
type Protocol string

// Protocols of a probe.
const (
	TCP    Protocol = "TCP"
	UDP    Protocol = "UDP"
	ICMP   Protocol = "ICMP"
	ICMPv6 Protocol = "ICMPv6"
)

// Duration is a time.Duration that reads and writes JSON as "1.5s".
type Duration time.Duration

// MarshalJSON writes d as a Go duration string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a Go duration string ("2s") or a number of seconds.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		v, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("duration %q: %w", s, err)
		}
		*d = Duration(v)
		return nil
	}
	var secs float64
	if err := json.Unmarshal(b, &secs); err != nil {
		return fmt.Errorf("duration: want \"2s\" or seconds: %w", err)
	}
	*d = Duration(secs * float64(time.Second))
	return nil
}

// Request asks for one trace (the body of POST /api/v1/traceflows).
type Request struct {
	// Source is the pod the probe leaves from: "namespace/name".
	Source string `json:"source"`
	// SourceWorkload, instead of Source, is a workload the probe leaves
	// from: "namespace/name" of its top-level controller (a Deployment,
	// StatefulSet, DaemonSet, ...). Start picks one of its pods, once for
	// every family, and sets Source to it.
	SourceWorkload string      `json:"source_workload,omitempty"`
	Destination    Destination `json:"destination"`
	// Protocol defaults to TCP. ICMP and ICMPv6 both mean "echo request of
	// the family": a dual trace with protocol ICMP sends ICMPv6 over IPv6.
	Protocol Protocol `json:"protocol,omitempty"`
	// SrcPort is the source port (TCP/UDP) or echo id (ICMP); 0 picks one.
	SrcPort uint16 `json:"src_port,omitempty"`
	// TCPFlags are the TCP header flags: 0x02 (SYN, the default) is the
	// only one a trace sends.
	TCPFlags uint8 `json:"tcp_flags,omitempty"`
	// TTL is the IPv4 TTL and IPv6 hop limit: 0 (64, the default) or
	// MinTTL..255.
	TTL uint8 `json:"ttl,omitempty"`
	// Family is ipv4, ipv6 or dual (default dual).
	Family Family `json:"family,omitempty"`
	// LiveTraffic traces the first packet of the next real connection
	// from the source to the destination (and SrcPort when set) instead
	// of injecting one; DroppedOnly skips delivered ones and reports the
	// next dropped one. Kernel datapath only (OVS: outcome error, "not
	// supported yet"); the trace waits up to its timeout.
	LiveTraffic bool `json:"live_traffic,omitempty"`
	DroppedOnly bool `json:"dropped_only,omitempty"`
	// Timeout bounds each family trace (default Config.Timeout).
	Timeout Duration `json:"timeout,omitempty"`
	// External asks to trace an IP destination outside the cluster (no
	// pod, Service or node has it). It is refused unless the collector
	// allows such destinations (Config.AllowExternal) and the request
	// says so here: a probe then leaves the cluster.
	External bool `json:"external,omitempty"`
}

// Destination is exactly one of a pod, a workload, a Service or an IP
// address.
type Destination struct {
	Pod string `json:"pod,omitempty"` // "namespace/name"
	// Workload is "namespace/name" of a workload (see
	// Request.SourceWorkload): Start picks one of its pods and sets Pod to
	// it, so the families go to the same pod.
	Workload string     `json:"workload,omitempty"`
	Service  string     `json:"service,omitempty"` // "namespace/name"
	IP       netip.Addr `json:"ip,omitzero"`
	// Port is the destination port (the Service port for a Service);
	// required for TCP and UDP, ignored for ICMP.
	Port uint16 `json:"port,omitempty"`
}

// String is the CLI spelling: pod:ns/name:80, svc:ns/name:80,
// workload:ns/name:80 or ip:addr:80. A workload destination whose pod was
// picked is spelt by that pod (what the traceflows table keeps).
func (d Destination) String() string {
	var s string
	switch {
	case d.Service != "":
		s = "svc:" + d.Service
	case d.Pod != "":
		s = "pod:" + d.Pod
	case d.Workload != "":
		s = "workload:" + d.Workload
	case d.IP.IsValid():
		if d.Port != 0 {
			return "ip:" + netip.AddrPortFrom(d.IP, d.Port).String()
		}
		return "ip:" + d.IP.String()
	}
	if d.Port != 0 {
		s += fmt.Sprintf(":%d", d.Port)
	}
	return s
}

// ParseDestination reads the CLI spelling of a destination:
// "svc:ns/name:80", "pod:ns/name:8080" (or "ns/name:8080"),
// "workload:ns/name:8080" (one of its pods),
// "ip:198.18.2.11:8080", "ip:[fd00:10:0:2::11]:8080" or a bare address.
func ParseDestination(s string) (Destination, error) {
	kind, rest, ok := strings.Cut(s, ":")
	if !ok || (kind != "svc" && kind != "service" && kind != "pod" && kind != "workload" && kind != "ip") {
		kind, rest = "", s
	}
	if kind == "ip" || kind == "" {
		if ap, err := netip.ParseAddrPort(rest); err == nil {
			return Destination{IP: ap.Addr().Unmap(), Port: ap.Port()}, nil
		}
		if a, err := netip.ParseAddr(rest); err == nil {
			return Destination{IP: a.Unmap()}, nil
		}
		if kind == "ip" {
			return Destination{}, fmt.Errorf("destination %q: want ip:ADDR[:PORT] (IPv6 with a port in brackets)", s)
		}
		kind = "pod"
	}
	var d Destination
	ref, port, hasPort := strings.Cut(rest, ":")
	if hasPort {
		var p uint16
		if _, err := fmt.Sscanf(port, "%d", &p); err != nil || p == 0 || fmt.Sprint(p) != port {
			return Destination{}, fmt.Errorf("destination %q: bad port %q", s, port)
		}
		d.Port = p
	}
	if ns, name, ok := strings.Cut(ref, "/"); !ok || ns == "" || name == "" {
		return Destination{}, fmt.Errorf("destination %q: want namespace/name", s)
	}
	switch kind {
	case "pod":
		d.Pod = ref
	case "workload":
		d.Workload = ref
	default:
		d.Service = ref
	}
	return d, nil
}

// Phase is where a trace is.
type Phase string

// Phases of a trace.
const (
	Running   Phase = "running"
	Succeeded Phase = "succeeded" // every family reached an outcome
	Failed    Phase = "failed"    // see Result.Reason
)

// Outcome is how one family's probe ended.
type Outcome string

// Outcomes of a family trace.
const (
	Delivered Outcome = "delivered"
	Dropped   Outcome = "dropped"
	Rejected  Outcome = "rejected"
	// NoAddress: the source or the destination has no address of the family.
	NoAddress Outcome = "no-address"
	// TimedOut: neither delivery nor a drop was seen before the timeout.
	TimedOut Outcome = "timeout"
	Error    Outcome = "error"
	Pending  Outcome = "pending"
)

// Arrived reports whether the probe reached its destination.
func (o Outcome) Arrived() bool { return o == Delivered }

// Component is the part of the datapath an observation comes from.
type Component string

// Components of observations.
const (
	Forwarding    Component = "forwarding"
	LoadBalancing Component = "load-balancing"
	NetworkPolicy Component = "network-policy"
	Routing       Component = "routing"
	Delivery      Component = "delivery"
)

// Action is what the component did with the probe.
type Action string

// Actions of observations.
const (
	ActionReceived  Action = "received"
	ActionForwarded Action = "forwarded"
	ActionDelivered Action = "delivered"
	ActionDropped   Action = "dropped"
	ActionRejected  Action = "rejected"
)

// Observation is one step of the probe's path, in path order.
type Observation struct {
	Node      string    `json:"node"`
	Component Component `json:"component"`
	Action    Action    `json:"action"`
	// Interface is the interface the packet came in on (received) or left
	// by (forwarded, delivered).
	Interface string `json:"interface,omitempty"`
	// Pod is the destination pod of a delivery ("namespace/name").
	Pod string `json:"pod,omitempty"`
	// Service is the Service that load-balanced the probe ("ns/name").
	Service string `json:"service,omitempty"`
	// Policy and Rule name the NetworkPolicy rule ("ns/name", and the
	// rule name "ns/name/ingress/0"); for a default-deny drop Rule is the
	// drop rule ("drop/ingress/ns/pod") and Policy the isolating policies.
	Policy string `json:"policy,omitempty"`
	Rule   string `json:"rule,omitempty"`
	// TranslatedSrc and TranslatedDst are the addresses after SNAT/DNAT.
	TranslatedSrc netip.AddrPort `json:"translated_src,omitzero"`
	TranslatedDst netip.AddrPort `json:"translated_dst,omitzero"`
	Detail        string         `json:"detail,omitempty"`
}

// UnmarshalJSON reads an observation, also as dualflow before 2026-12
// wrote it (translatedSrc, translatedDst): the traces it stored, and the
// watch streams of node agents not yet upgraded.
func (o *Observation) UnmarshalJSON(b []byte) error {
	type plain Observation
	var v struct {
		plain
		LegacySrc netip.AddrPort `json:"translatedSrc"`
		LegacyDst netip.AddrPort `json:"translatedDst"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*o = Observation(v.plain)
	if !o.TranslatedSrc.IsValid() {
		o.TranslatedSrc = v.LegacySrc
	}
	if !o.TranslatedDst.IsValid() {
		o.TranslatedDst = v.LegacyDst
	}
	return nil
}

// FamilyResult is one family's probe and path.
type FamilyResult struct {
	Family  Family  `json:"family"`
	Outcome Outcome `json:"outcome"`
	Reason  string  `json:"reason,omitempty"`
	// The probe as sent (zero when it could not be built).
	Src      netip.Addr `json:"src,omitzero"`
	Dst      netip.Addr `json:"dst,omitzero"`
	Protocol Protocol   `json:"protocol,omitempty"`
	SrcPort  uint16     `json:"src_port,omitempty"` // or ICMP echo id
	DstPort  uint16     `json:"dst_port,omitempty"`
	Tag      uint8      `json:"tag,omitempty"` // DSCP tag
	// Observations in path order, grouped by node along the path.
	Observations []Observation `json:"observations"`
	Duration     Duration      `json:"duration"`
}

// Result is the state of one trace (the body of GET /api/v1/traceflows/{id}).
type Result struct {
	ID       string         `json:"id"`
	Request  Request        `json:"request"`
	Phase    Phase          `json:"phase"`
	Reason   string         `json:"reason,omitempty"`
	Started  time.Time      `json:"started"`
	Ended    time.Time      `json:"ended,omitzero"`
	Families []FamilyResult `json:"families"`
}

// Family returns the result of family f.
func (r *Result) Family(f Family) (FamilyResult, bool) {
	for _, fr := range r.Families {
		if fr.Family == f {
			return fr, true
		}
	}
	return FamilyResult{}, false
}

// MinTTL is the lowest TTL (IPv4) or hop limit (IPv6) a probe may carry
// besides 0 (the default, 64). A path through a cluster is a few hops; a
// lower TTL would expire the probe on the way, which only maps the
// network hop by hop (a traceroute), and no trace needs that.
const MinTTL = 32

// Errors of Start; the REST layer maps ErrInvalid and ErrNotSupported to
// 400/501, ErrNotFound to 404, and ErrBusy and ErrRateLimited to 429. An
// ErrInvalid about one field of the request is a FieldError.
var (
	ErrInvalid      = errors.New("invalid traceflow request")
	ErrNotSupported = errors.New("not supported yet")
	ErrBusy         = errors.New("too many traces in flight")
	ErrNotFound     = errors.New("traceflow not found")
	// ErrRateLimited is wrapped by RateLimitError: a caller or a node
	// went beyond its rate.
	ErrRateLimited = errors.New("rate limited")
	// ErrNoAddress is wrapped by resolvers when the source or destination
	// has no address of a family ("service backend/api-single has no IPv6
	// ClusterIP"); that family's outcome is NoAddress.
	ErrNoAddress = errors.New("no address of this family")
)

// FieldError is an invalid request naming the field at fault, by its JSON
// path ("source", "destination.port"), which the REST answer carries. It
// wraps ErrInvalid.
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string { return ErrInvalid.Error() + ": " + e.Message }

func (e *FieldError) Unwrap() error { return ErrInvalid }

// Invalid returns a FieldError about field.
func Invalid(field, format string, args ...any) error {
	return &FieldError{Field: field, Message: fmt.Sprintf(format, args...)}
}

// RateLimitError is a trace (or, at a node agent, a probe) refused for
// its rate: Scope says whose ("caller alice", "node node-1") and
// RetryAfter when the tokens will be back. It wraps ErrRateLimited.
type RateLimitError struct {
	Scope      string
	RetryAfter time.Duration
}

func (e *RateLimitError) Error() string {
	return fmt.Sprintf("%v: %s: retry in %v", ErrRateLimited, e.Scope, e.RetryAfter.Round(time.Millisecond))
}

func (e *RateLimitError) Unwrap() error { return ErrRateLimited }

// callerKey is the context key of the caller's identity.
type callerKey struct{}

// WithCaller returns ctx carrying the identity of whoever asks for a
// trace (a REST principal, a hash of its token, an address): the key of
// its rate limit and of its share of the results kept.
func WithCaller(ctx context.Context, caller string) context.Context {
	return context.WithValue(ctx, callerKey{}, caller)
}

// CallerFrom returns the caller of WithCaller, "" when there is none.
func CallerFrom(ctx context.Context) string {
	s, _ := ctx.Value(callerKey{}).(string)
	return s
}
