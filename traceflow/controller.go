package traceflow

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dualflow/dualflow/traceflow/packet"
)

// Probe is one family's probe after resolution: what a node tracer sends
// and watches for.
type Probe struct {
	Family     Family     `json:"family"`
	SourcePod  string     `json:"sourcePod"` // "namespace/name"
	SourceNode string     `json:"sourceNode"`
	Src        netip.Addr `json:"src"`
	Dst        netip.Addr `json:"dst"`
	// Service is "namespace/name" when Dst is one of its ClusterIPs.
	Service string `json:"service,omitempty"`
	// DstPod is "namespace/name" when the destination is a pod.
	DstPod   string   `json:"dstPod,omitempty"`
	Protocol Protocol `json:"protocol"` // TCP, UDP, ICMP (IPv4) or ICMPv6 (IPv6)
	SrcPort  uint16   `json:"srcPort"`  // or echo id
	DstPort  uint16   `json:"dstPort,omitempty"`
	TCPFlags uint8    `json:"tcpFlags,omitempty"`
	TTL      uint8    `json:"ttl,omitempty"`
	Tag      uint8    `json:"tag"` // DSCP, packet.MinTag..packet.MaxTag
	// Nodes are the nodes whose agents watch for the probe: the source
	// node and every node the probe may be delivered on (the destination
	// pod's, the Service endpoints'). Empty: every node with an agent.
	Nodes []string `json:"nodes,omitempty"`
	// Targets are the addresses the probe may be delivered to, with the
	// pod holding each: the destination pod, the Service's endpoints of
	// the family, or the given address. A node captures at the targets
	// it hosts.
	Targets []Target `json:"targets,omitempty"`
	// Live traces the next real packet of a new connection from SourcePod
	// to Dst:DstPort (SrcPort, when set, must match) instead of sending
	// one; DroppedOnly skips delivered ones and waits for a drop.
	Live        bool `json:"live,omitempty"`
	DroppedOnly bool `json:"droppedOnly,omitempty"`
}

// Target is an address a probe may be delivered to and the pod holding it
// ("namespace/name", empty when unknown).
type Target struct {
	Addr netip.Addr `json:"addr"`
	Pod  string     `json:"pod,omitempty"`
}

// WatchEvent is one message of a node agent's watch stream (JSON lines):
// first Ready once the node observes, then observations as the probe
// crosses the node, an Outcome when the node delivered, dropped or
// rejected it, and Error when watching failed.
type WatchEvent struct {
	Ready       bool         `json:"ready,omitempty"`
	Observation *Observation `json:"observation,omitempty"`
	Outcome     Outcome      `json:"outcome,omitempty"`
	Reason      string       `json:"reason,omitempty"`
	// Left says the probe left the node (the last hook it crosses there),
	// so the node has reported all it saw of it. The controller waits for
	// the source node's Left (or a cap) before it closes a path delivered
	// elsewhere: the capture at a remote pod can beat the source node's
	// report.
	Left bool `json:"left,omitempty"`
	// SrcPort is the source port (or echo id) of the connection a live
	// trace follows, once the source node picked it.
	SrcPort uint16 `json:"srcPort,omitempty"`
	// Conn is, in a live trace, the source port of the connection the
	// event belongs to: every node reports each new connection of the
	// source pod, and the controller keeps the one the source node picked.
	Conn  uint16 `json:"conn,omitempty"`
	Error string `json:"error,omitempty"`
}

// ProtoNumber returns the IANA number of p.Protocol.
func (p Probe) ProtoNumber() uint8 {
	switch p.Protocol {
	case UDP:
		return packet.ProtoUDP
	case ICMP:
		return packet.ProtoICMP
	case ICMPv6:
		return packet.ProtoICMPv6
	}
	return packet.ProtoTCP
}

// Path is what a node tracer saw of one probe.
type Path struct {
	Outcome      Outcome       `json:"outcome"`
	Reason       string        `json:"reason,omitempty"`
	Observations []Observation `json:"observations"`
	// SrcPort is the source port (or echo id) of the packet traced when
	// the probe did not fix one (live traffic).
	SrcPort uint16 `json:"srcPort,omitempty"`
}

// nodeTracer sends one probe and observes it on the nodes it crosses. It
// returns when the probe is delivered or dropped, or when ctx ends (then
// with Outcome TimedOut and what it saw so far). Implementation: the node
// agents of the exporters (traceflow/agent.Cluster).
type nodeTracer interface {
	Trace(ctx context.Context, p Probe) (Path, error)
}

// resolver turns a request into family f's probe (addresses, source node,
// Service port). It wraps ErrNoAddress when an endpoint lacks family f and
// ErrInvalid when a name does not exist.
type resolver interface {
	Resolve(req Request, f Family) (Probe, error)
}

// resultStore keeps finished results (the ClickHouse traceflows table),
// shared by every replica over the same store.
type resultStore interface {
	Save(ctx context.Context, r Result) error
	// Load returns a saved result; its error wraps ErrNotFound when there
	// is none.
	Load(ctx context.Context, id string) (Result, error)
}

// Config configures a Controller.
type Config struct {
	// Timeout is the default per-family timeout (default 3s).
	Timeout time.Duration
	// MaxTimeout caps a request's timeout (default 1m).
	MaxTimeout time.Duration
	// Keep is how many finished results Get can return; the oldest are
	// forgotten first (default 1000).
	Keep int
	// SaveTimeout bounds writing one result to the store, and reading one
	// back (default 5s).
	SaveTimeout time.Duration
	Logger      *slog.Logger
}

// SetDefaults fills in unset fields.
func (c *Config) SetDefaults() {
	c.Timeout = cmp.Or(c.Timeout, 3*time.Second)
	c.MaxTimeout = cmp.Or(c.MaxTimeout, time.Minute)
	c.Keep = cmp.Or(c.Keep, 1000)
	c.SaveTimeout = cmp.Or(c.SaveTimeout, 5*time.Second)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

// Controller runs traces. Its methods are safe for concurrent use. Traces
// run on goroutines the controller owns; Close cancels and waits for them.
type Controller struct {
	cfg      Config
	tracer   nodeTracer
	resolver resolver
	store    resultStore // may be nil

	ctx    context.Context // parent of every trace; cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	traces map[string]*trace
	done   []string // finished ids, oldest first, for Keep
	tags   [packet.MaxTag + 1]bool
}

type trace struct {
	res  Result
	done chan struct{} // closed when res is final
}

// New returns a controller that resolves requests with r, traces with t and
// saves finished results to s (nil: results are only kept in memory).
func New(cfg Config, t nodeTracer, r resolver, s resultStore) *Controller {
	cfg.SetDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Controller{cfg: cfg, tracer: t, resolver: r, store: s, ctx: ctx, cancel: cancel, traces: map[string]*trace{}}
}

// Close cancels the running traces and waits for them to finish.
func (c *Controller) Close() error {
	c.cancel()
	c.wg.Wait()
	return nil
}

// Normalize fills in the request's defaults and checks it. The errors wrap
// ErrInvalid or ErrNotSupported.
func (c *Controller) Normalize(req *Request) error {
	req.Family = cmp.Or(req.Family, Dual)
	req.Protocol = cmp.Or(req.Protocol, TCP)
	if req.Timeout == 0 {
		req.Timeout = Duration(c.cfg.Timeout)
	}
	switch {
	case req.DroppedOnly && !req.LiveTraffic:
		return fmt.Errorf("%w: droppedOnly needs liveTraffic", ErrInvalid)
	case req.Family.Families() == nil:
		return fmt.Errorf("%w: family %q (want ipv4, ipv6 or dual)", ErrInvalid, req.Family)
	case !strings.Contains(req.Source, "/"):
		return fmt.Errorf("%w: source %q (want namespace/name)", ErrInvalid, req.Source)
	case time.Duration(req.Timeout) < 0 || time.Duration(req.Timeout) > c.cfg.MaxTimeout:
		return fmt.Errorf("%w: timeout %v (max %v)", ErrInvalid, time.Duration(req.Timeout), c.cfg.MaxTimeout)
	}
	n := 0
	for _, set := range []bool{req.Destination.Pod != "", req.Destination.Service != "", req.Destination.IP.IsValid()} {
		if set {
			n++
		}
	}
	if n != 1 {
		return fmt.Errorf("%w: destination needs exactly one of pod, service and ip", ErrInvalid)
	}
	switch req.Protocol {
	case TCP, UDP:
		if req.Destination.Port == 0 {
			return fmt.Errorf("%w: %s needs a destination port", ErrInvalid, req.Protocol)
		}
	case ICMP, ICMPv6:
		req.Destination.Port = 0
	default:
		return fmt.Errorf("%w: protocol %q (want TCP, UDP, ICMP or ICMPv6)", ErrInvalid, req.Protocol)
	}
	if req.TCPFlags != 0 && req.Protocol != TCP {
		return fmt.Errorf("%w: tcpFlags with protocol %s", ErrInvalid, req.Protocol)
	}
	return nil
}

// Start validates req, resolves it per family and starts tracing in the
// background. It returns the trace id for Get and Wait. ctx bounds only
// the start; the trace itself is bounded by req.Timeout (and Close).
func (c *Controller) Start(ctx context.Context, req Request) (string, error) {
	if err := c.Normalize(&req); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	fams := req.Family.Families()
	probes := make([]Probe, len(fams))
	results := make([]FamilyResult, len(fams))
	srcPort := req.SrcPort
	if srcPort == 0 && !req.LiveTraffic {
		srcPort = uint16(32768 + rand.IntN(28000)) // Linux's ephemeral range, 32768..60767
	}
	resolved := 0
	for i, f := range fams {
		results[i] = FamilyResult{Family: f, Outcome: Pending, Observations: []Observation{}}
		p, err := c.resolver.Resolve(req, f)
		switch {
		case errors.Is(err, ErrNoAddress):
			results[i].Outcome, results[i].Reason = NoAddress, err.Error()
			continue
		case err != nil:
			return "", err
		}
		p.Family = f
		p.Protocol = protocolFor(req.Protocol, f)
		p.SrcPort, p.TCPFlags, p.TTL = srcPort, req.TCPFlags, req.TTL
		p.Live, p.DroppedOnly = req.LiveTraffic, req.DroppedOnly
		if p.Protocol == TCP && p.TCPFlags == 0 && !p.Live {
			p.TCPFlags = packet.SYN
		}
		probes[i] = p
		results[i].Src, results[i].Dst, results[i].Protocol = p.Src, p.Dst, p.Protocol
		results[i].SrcPort, results[i].DstPort = p.SrcPort, p.DstPort
		resolved++
	}
	id, err := newID()
	if err != nil {
		return "", err
	}
	t := &trace{res: Result{ID: id, Request: req, Phase: Running, Started: time.Now().UTC(), Families: results}, done: make(chan struct{})}

	c.mu.Lock()
	var tags []uint8
	for i := range probes {
		if results[i].Outcome != Pending {
			continue
		}
		tag, ok := c.allocTag()
		if !ok {
			for _, tg := range tags {
				c.tags[tg] = false
			}
			c.mu.Unlock()
			return "", fmt.Errorf("%w: at most %d family traces at once", ErrBusy, packet.MaxTag)
		}
		tags = append(tags, tag)
		probes[i].Tag, t.res.Families[i].Tag = tag, tag
	}
	c.traces[id] = t
	c.wg.Add(1)
	c.mu.Unlock()

	go c.run(t, probes, time.Duration(req.Timeout))
	return id, nil
}

func protocolFor(p Protocol, f Family) Protocol {
	if p == ICMP || p == ICMPv6 {
		if f == IPv6 {
			return ICMPv6
		}
		return ICMP
	}
	return p
}

// allocTag takes a free tag; c.mu must be held.
func (c *Controller) allocTag() (uint8, bool) {
	for tg := packet.MinTag; tg <= packet.MaxTag; tg++ {
		if !c.tags[tg] {
			c.tags[tg] = true
			return uint8(tg), true
		}
	}
	return 0, false
}

func newID() (string, error) {
	b := make([]byte, 8)
	if _, err := crand.Read(b); err != nil {
		return "", fmt.Errorf("traceflow id: %w", err)
	}
	return "tf-" + hex.EncodeToString(b), nil
}

// validID reports whether id has newID's form: "tf-" and 16 lowercase hex
// digits.
func validID(id string) bool {
	h, ok := strings.CutPrefix(id, "tf-")
	if !ok || len(h) != 16 {
		return false
	}
	for i := 0; i < len(h); i++ {
		if c := h[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// run traces each pending family concurrently, then finalises t.
func (c *Controller) run(t *trace, probes []Probe, timeout time.Duration) {
	defer c.wg.Done()
	var wg sync.WaitGroup
	for i := range probes {
		c.mu.Lock()
		pending := t.res.Families[i].Outcome == Pending
		c.mu.Unlock()
		if !pending {
			continue
		}
		wg.Go(func() {
			start := time.Now()
			ctx, cancel := context.WithTimeout(c.ctx, timeout)
			path, err := c.tracer.Trace(ctx, probes[i])
			cancel()
			switch {
			case err != nil && errors.Is(err, context.DeadlineExceeded):
				path.Outcome, path.Reason = TimedOut, fmt.Sprintf("no delivery or drop seen within %v", timeout)
			case err != nil:
				path.Outcome, path.Reason = Error, err.Error()
			case path.Outcome == TimedOut && path.Reason == "":
				path.Reason = fmt.Sprintf("no delivery or drop seen within %v", timeout)
			case path.Outcome == "" || path.Outcome == Pending:
				path.Outcome, path.Reason = Error, "tracer returned no outcome"
			}
			c.mu.Lock()
			fr := &t.res.Families[i]
			fr.Outcome, fr.Reason, fr.Duration = path.Outcome, path.Reason, Duration(time.Since(start))
			if path.Observations != nil {
				fr.Observations = path.Observations
			}
			if path.SrcPort != 0 {
				fr.SrcPort = path.SrcPort
			}
			c.tags[probes[i].Tag] = false
			c.mu.Unlock()
		})
	}
	wg.Wait()

	c.mu.Lock()
	t.res.Ended = time.Now().UTC()
	t.res.Phase, t.res.Reason = finalPhase(t.res.Families)
	res := cloneResult(t.res)
	c.done = append(c.done, t.res.ID)
	for len(c.done) > c.cfg.Keep {
		delete(c.traces, c.done[0])
		c.done = c.done[1:]
	}
	c.mu.Unlock()
	close(t.done)

	if c.store != nil {
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.SaveTimeout)
		if err := c.store.Save(ctx, res); err != nil {
			c.cfg.Logger.Warn("traceflow: save result", "id", res.ID, "err", err)
		}
		cancel()
	}
}

// finalPhase: succeeded when every family reached an outcome (delivered,
// dropped, rejected, or no address of the family) and at least one family
// was traced; failed otherwise, with the reasons.
func finalPhase(frs []FamilyResult) (Phase, string) {
	var reasons []string
	traced := 0
	for _, fr := range frs {
		switch fr.Outcome {
		case Delivered, Dropped, Rejected:
			traced++
		case NoAddress:
		default:
			reasons = append(reasons, fmt.Sprintf("%s: %s", fr.Family, cmp.Or(fr.Reason, string(fr.Outcome))))
		}
	}
	if len(reasons) == 0 && traced == 0 {
		for _, fr := range frs {
			reasons = append(reasons, fmt.Sprintf("%s: %s", fr.Family, fr.Reason))
		}
	}
	if len(reasons) > 0 {
		return Failed, strings.Join(reasons, "; ")
	}
	return Succeeded, ""
}

func cloneResult(r Result) Result {
	r.Families = slices.Clone(r.Families)
	for i := range r.Families {
		// Empty stays empty, not nil: the JSON says [] either way.
		r.Families[i].Observations = slices.Clone(r.Families[i].Observations)
	}
	return r
}

// Get returns the current state of trace id (a copy), or an error wrapping
// ErrNotFound. A trace this controller ran (or runs) and still keeps comes
// from memory; any other is read from the store, where every controller
// over it saves finished traces: a trace running on another replica is not
// found until it has finished and been saved. ctx bounds the store read.
func (c *Controller) Get(ctx context.Context, id string) (Result, error) {
	c.mu.Lock()
	t, ok := c.traces[id]
	var res Result
	if ok {
		res = cloneResult(t.res)
	}
	c.mu.Unlock()
	if !ok {
		return c.load(ctx, id)
	}
	return res, nil
}

// load reads a finished trace from the store.
func (c *Controller) load(ctx context.Context, id string) (Result, error) {
	if c.store == nil {
		return Result{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.SaveTimeout)
	defer cancel()
	return c.store.Load(ctx, id)
}

// Wait blocks until trace id finishes or ctx ends, and returns its result.
// A trace not in memory is read from the store as by Get: found there, it
// has finished; not found, Wait returns ErrNotFound at once (it does not
// wait for a trace running on another replica).
func (c *Controller) Wait(ctx context.Context, id string) (Result, error) {
	c.mu.Lock()
	t, ok := c.traces[id]
	c.mu.Unlock()
	if !ok {
		return c.load(ctx, id)
	}
	select {
	case <-t.done:
	case <-ctx.Done():
		return Result{}, ctx.Err()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return cloneResult(t.res), nil
}

// Trace starts req and waits for its result.
func (c *Controller) Trace(ctx context.Context, req Request) (Result, error) {
	id, err := c.Start(ctx, req)
	if err != nil {
		return Result{}, err
	}
	return c.Wait(ctx, id)
}
