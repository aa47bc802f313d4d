package traceflow

import (
	"cmp"
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dualflow/dualflow/traceflow/packet"
	"github.com/dualflow/dualflow/traceflow/probes"
	"github.com/dualflow/dualflow/traceflow/ratelimit"
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

// Sendable checks that p is a probe a trace needs, as an agent must before
// sending it: a TCP SYN (the flags exactly SYN), a UDP datagram, or an
// echo request of its family (ICMP over IPv4, ICMPv6 over IPv6); a TTL or
// hop limit of 0 (64) or MinTTL..255; a tag; unicast addresses of one
// family, the destination neither loopback nor link-local. The errors wrap
// ErrInvalid.
func (p Probe) Sendable() error {
	src, dst := p.Src.Unmap(), p.Dst.Unmap()
	switch {
	case !src.IsValid() || !dst.IsValid() || src.Is4() != dst.Is4():
		return fmt.Errorf("%w: probe %s -> %s: want two addresses of one family", ErrInvalid, p.Src, p.Dst)
	case !unicast(src) || !unicast(dst) || dst.IsLinkLocalUnicast():
		return fmt.Errorf("%w: probe %s -> %s: a trace sends from a pod to a unicast address (not loopback, link-local, multicast or broadcast)", ErrInvalid, src, dst)
	case p.Tag < packet.MinTag || p.Tag > packet.MaxTag:
		return fmt.Errorf("%w: tag %d (want %d..%d)", ErrInvalid, p.Tag, packet.MinTag, packet.MaxTag)
	case p.TTL != 0 && p.TTL < MinTTL:
		return fmt.Errorf("%w: ttl %d: want 0 (64) or %d..255", ErrInvalid, p.TTL, MinTTL)
	}
	switch p.Protocol {
	case TCP:
		if p.TCPFlags != packet.SYN {
			return fmt.Errorf("%w: tcp flags %#02x: a trace sends a SYN (0x02) only", ErrInvalid, p.TCPFlags)
		}
	case UDP, ICMP, ICMPv6:
		if p.TCPFlags != 0 {
			return fmt.Errorf("%w: tcp flags with protocol %s", ErrInvalid, p.Protocol)
		}
	default:
		return fmt.Errorf("%w: protocol %q (want TCP, UDP, ICMP or ICMPv6)", ErrInvalid, p.Protocol)
	}
	switch {
	case (p.Protocol == TCP || p.Protocol == UDP) && p.DstPort == 0:
		return fmt.Errorf("%w: %s needs a destination port", ErrInvalid, p.Protocol)
	case p.Protocol == ICMP && !src.Is4(), p.Protocol == ICMPv6 && src.Is4():
		return fmt.Errorf("%w: %s echo request over %s", ErrInvalid, p.Protocol, map[bool]string{true: "IPv4", false: "IPv6"}[src.Is4()])
	}
	return nil
}

// broadcast is the IPv4 limited broadcast address.
var broadcast = netip.AddrFrom4([4]byte{255, 255, 255, 255})

func unicast(a netip.Addr) bool {
	return !a.IsUnspecified() && !a.IsLoopback() && !a.IsMulticast() && a != broadcast
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
	// WorkloadPod picks the pod a workload ("namespace/name") is traced
	// from or to; found is false when the workload has no pod to trace.
	WorkloadPod(ref string) (pod string, found bool, err error)
}

// clusterAddrs is what a resolver may also know: whether an address is
// the cluster's (a pod's, a Service's, a node's or in a node's pod CIDR).
// With a resolver that does not, only a pod the resolver found holding an
// IP destination (Probe.DstPod) makes it the cluster's.
type clusterAddrs interface {
	InCluster(a netip.Addr) bool
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
	// KeepPerCaller is how many of those each caller (CallerFrom) keeps:
	// its oldest are forgotten first, so that one caller cannot push
	// out the others' results (default 100).
	KeepPerCaller int
	// SaveTimeout bounds writing one result to the store, and reading one
	// back (default 5s).
	SaveTimeout time.Duration
	// CallerLimit bounds the family traces each caller may start (a dual
	// trace is two), NodeLimit those whose probe leaves from one node
	// (live traces send nothing and count for the caller only). Zero
	// fields take DefaultCallerLimit and DefaultNodeLimit; a negative
	// Rate is no limit. A burst below 2 is raised to 2: a dual trace
	// takes two at once.
	CallerLimit, NodeLimit ratelimit.Limit
	// AllowExternal lets a request that asks for it (Request.External)
	// trace an IP destination outside the cluster. Off, such
	// destinations are refused: a probe would leave the cluster.
	AllowExternal bool
	// Probes, when set, is told of every probe before it is sent, so that
	// the collector marks the probe's flow records (probe_trace_id) and
	// leaves them out of the traffic by default.
	Probes *probes.Registry
	Logger *slog.Logger
}

// Default rate limits of a controller. A trace sends its probe at most 3
// times, 1 s apart, and a dual trace is two family traces: a user tracing
// by hand, the UI's dual trace of a reachability cell, even a dozen
// family traces at once, stay within the bursts; a script starting traces
// in a loop is held to the rates.
var (
	DefaultCallerLimit = ratelimit.Limit{Rate: 5, Burst: 30}
	DefaultNodeLimit   = ratelimit.Limit{Rate: 10, Burst: 40}
)

// SetDefaults fills in unset fields.
func (c *Config) SetDefaults() {
	c.Timeout = cmp.Or(c.Timeout, 3*time.Second)
	c.MaxTimeout = cmp.Or(c.MaxTimeout, time.Minute)
	c.Keep = cmp.Or(c.Keep, 1000)
	c.KeepPerCaller = cmp.Or(c.KeepPerCaller, 100)
	c.SaveTimeout = cmp.Or(c.SaveTimeout, 5*time.Second)
	c.CallerLimit = defaultLimit(c.CallerLimit, DefaultCallerLimit)
	c.NodeLimit = defaultLimit(c.NodeLimit, DefaultNodeLimit)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

func defaultLimit(l, def ratelimit.Limit) ratelimit.Limit {
	l.Rate = cmp.Or(l.Rate, def.Rate)
	l.Burst = cmp.Or(l.Burst, def.Burst)
	l.Burst = max(l.Burst, 2)
	return l
}

// BindFlags registers the controller's --traceflow.* flags.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.Timeout, "traceflow.timeout", 3*time.Second, "default timeout of one family's trace")
	fs.Float64Var(&c.CallerLimit.Rate, "traceflow.caller-rate", DefaultCallerLimit.Rate, "family traces each caller (REST token, else client address) may start per second after its burst; a dual trace is two; more answer 429 with Retry-After (negative: no limit)")
	fs.IntVar(&c.CallerLimit.Burst, "traceflow.caller-burst", DefaultCallerLimit.Burst, "family traces a caller may start at once after a quiet while")
	fs.Float64Var(&c.NodeLimit.Rate, "traceflow.node-rate", DefaultNodeLimit.Rate, "family traces whose probe leaves from one node, per second after its burst, all callers together (negative: no limit)")
	fs.IntVar(&c.NodeLimit.Burst, "traceflow.node-burst", DefaultNodeLimit.Burst, "family traces from one node at once after a quiet while")
	fs.IntVar(&c.KeepPerCaller, "traceflow.keep-per-caller", 100, "finished traces each caller keeps in memory (of the 1000 kept), its oldest forgotten first")
	fs.BoolVar(&c.AllowExternal, "traceflow.allow-external", false, "trace IP destinations outside the cluster (no pod, Service or node has them) when the request asks (\"external\": true); off, they are refused, as a probe would leave the cluster")
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

	callers, nodes *ratelimit.Keyed // CallerLimit, NodeLimit

	mu       sync.Mutex
	traces   map[string]*trace
	done     []string            // finished ids, oldest first, for Keep
	byCaller map[string][]string // finished ids of each caller, oldest first, for KeepPerCaller
	tags     [packet.MaxTag + 1]bool
}

type trace struct {
	res    Result
	caller string
	done   chan struct{} // closed when res is final
}

// New returns a controller that resolves requests with r, traces with t and
// saves finished results to s (nil: results are only kept in memory).
func New(cfg Config, t nodeTracer, r resolver, s resultStore) *Controller {
	cfg.SetDefaults()
	ctx, cancel := context.WithCancel(context.Background())
	return &Controller{cfg: cfg, tracer: t, resolver: r, store: s, ctx: ctx, cancel: cancel,
		callers: ratelimit.NewKeyed(cfg.CallerLimit), nodes: ratelimit.NewKeyed(cfg.NodeLimit),
		traces: map[string]*trace{}, byCaller: map[string][]string{}}
}

// Close cancels the running traces and waits for them to finish.
func (c *Controller) Close() error {
	c.cancel()
	c.wg.Wait()
	return nil
}

// Normalize fills in the request's defaults and checks it. The errors wrap
// ErrInvalid (a FieldError naming the field) or ErrNotSupported.
func (c *Controller) Normalize(req *Request) error {
	fam, famErr := parseFamily(string(req.Family))
	req.Family = cmp.Or(fam, req.Family)
	req.Protocol = cmp.Or(req.Protocol, TCP)
	req.Timeout = cmp.Or(req.Timeout, Duration(c.cfg.Timeout))
	d := req.Destination
	switch {
	case req.DroppedOnly && !req.LiveTraffic:
		return Invalid("dropped_only", "dropped_only needs live_traffic")
	case famErr != nil:
		return Invalid("family", "%v", famErr)
	case req.Source != "" && req.SourceWorkload != "":
		return Invalid("source_workload", "source_workload with source: want one of them")
	case req.SourceWorkload != "" && !strings.Contains(req.SourceWorkload, "/"):
		return Invalid("source_workload", "source_workload %q (want namespace/name)", req.SourceWorkload)
	case req.SourceWorkload == "" && !strings.Contains(req.Source, "/"):
		return Invalid("source", "source %q (want namespace/name)", req.Source)
	case time.Duration(req.Timeout) < 0 || time.Duration(req.Timeout) > c.cfg.MaxTimeout:
		return Invalid("timeout", "timeout %v (max %v)", time.Duration(req.Timeout), c.cfg.MaxTimeout)
	case d.Workload != "" && !strings.Contains(d.Workload, "/"):
		return Invalid("destination.workload", "destination workload %q (want namespace/name)", d.Workload)
	}
	n := 0
	for _, set := range []bool{d.Pod != "", d.Workload != "", d.Service != "", d.IP.IsValid()} {
		if set {
			n++
		}
	}
	if n != 1 {
		return Invalid("destination", "destination needs exactly one of pod, workload, service and ip")
	}
	switch req.Protocol {
	case TCP, UDP:
		if req.Destination.Port == 0 {
			return Invalid("destination.port", "%s needs a destination port", req.Protocol)
		}
	case ICMP, ICMPv6:
		req.Destination.Port = 0
	default:
		return Invalid("protocol", "protocol %q (want TCP, UDP, ICMP or ICMPv6)", req.Protocol)
	}
	switch {
	case req.TCPFlags != 0 && req.Protocol != TCP:
		return Invalid("tcp_flags", "tcp_flags with protocol %s", req.Protocol)
	case req.TCPFlags != 0 && req.TCPFlags != packet.SYN:
		return Invalid("tcp_flags", "tcp_flags %#02x: a trace sends a SYN (0x02) only", req.TCPFlags)
	case req.TTL != 0 && req.TTL < MinTTL:
		return Invalid("ttl", "ttl %d: want 0 (64) or %d..255", req.TTL, MinTTL)
	case req.External && !req.Destination.IP.IsValid():
		return Invalid("external", "external is for an ip destination")
	}
	return nil
}

// pickPods sets the pod of each workload end of req, picked once for
// every family: a dual trace's families leave from, and go to, the same
// pods, so that they differ by family only.
func (c *Controller) pickPods(req *Request) error {
	for _, w := range []struct {
		ref, field string
		pod        *string
	}{
		{req.SourceWorkload, "source_workload", &req.Source},
		{req.Destination.Workload, "destination.workload", &req.Destination.Pod},
	} {
		if w.ref == "" {
			continue
		}
		pod, found, err := c.resolver.WorkloadPod(w.ref)
		switch {
		case err != nil:
			return err
		case !found:
			return Invalid(w.field, "no pod of workload %s to trace (it does not exist, or has no running pod off the host network)", w.ref)
		}
		*w.pod = pod
	}
	return nil
}

// Start validates req, resolves it per family and starts tracing in the
// background. It returns the trace id for Get and Wait. ctx bounds only
// the start; the trace itself is bounded by req.Timeout (and Close).
//
// ctx's caller (CallerFrom) is the trace's: Start refuses a caller, or a
// source node, beyond its rate with a RateLimitError (nothing is taken
// from the buckets then), and the caller keeps its share of the results.
func (c *Controller) Start(ctx context.Context, req Request) (string, error) {
	return c.start(ctx, req, 0)
}

// start is Start, waiting up to maxWait for the caller's and the node's
// rate instead of refusing.
func (c *Controller) start(ctx context.Context, req Request, maxWait time.Duration) (string, error) {
	if err := c.Normalize(&req); err != nil {
		return "", err
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if err := c.pickPods(&req); err != nil {
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
		if err := c.checkExternal(req, p); err != nil {
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
	caller := CallerFrom(ctx)
	if err := c.takeRate(ctx, caller, probes, resolved, maxWait); err != nil {
		return "", err
	}
	id, err := newID()
	if err != nil {
		return "", err
	}
	t := &trace{res: Result{ID: id, Request: req, Phase: Running, Started: time.Now().UTC(), Families: results}, caller: caller, done: make(chan struct{})}

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

	c.remember(id, t.res.Started, time.Duration(req.Timeout), probes, results)
	go c.run(t, probes, time.Duration(req.Timeout))
	return id, nil
}

// remember tells the probe registry of the probes trace id is about to
// send (every pending family's; a live trace sends none).
func (c *Controller) remember(id string, start time.Time, timeout time.Duration, ps []Probe, results []FamilyResult) {
	if c.cfg.Probes == nil {
		return
	}
	for i, p := range ps {
		if results[i].Outcome != Pending || p.Live {
			continue
		}
		targets := make([]netip.Addr, 0, len(p.Targets))
		for _, t := range p.Targets {
			targets = append(targets, t.Addr)
		}
		c.cfg.Probes.Add(probes.Sent{TraceID: id, Src: p.Src, SrcPort: p.SrcPort, Proto: p.ProtoNumber(),
			Dst: p.Dst, DstPort: p.DstPort, Targets: targets, Start: start, End: start.Add(timeout)})
	}
}

// checkExternal refuses an IP destination outside the cluster (p.Dst, of
// one family) unless the request asks for it and the collector allows it.
func (c *Controller) checkExternal(req Request, p Probe) error {
	if !req.Destination.IP.IsValid() || p.DstPod != "" {
		return nil
	}
	if ca, ok := c.resolver.(clusterAddrs); ok && ca.InCluster(p.Dst) {
		return nil
	}
	switch {
	case req.External && c.cfg.AllowExternal:
		return nil
	case req.External:
		return Invalid("destination.ip", "destination %s is outside the cluster (no pod, Service or node has it), and this collector does not send probes out of the cluster (--traceflow.allow-external)", p.Dst)
	}
	return Invalid("destination.ip", "destination %s is outside the cluster (no pod, Service or node has it): the probe would leave the cluster; ask with \"external\": true a collector started with --traceflow.allow-external", p.Dst)
}

// takeRate takes n family traces from caller's bucket and from the
// source node's (probes sent; live traces send none), waiting up to
// maxWait, or returns a RateLimitError and takes nothing.
func (c *Controller) takeRate(ctx context.Context, caller string, probes []Probe, n int, maxWait time.Duration) error {
	if n == 0 {
		return nil
	}
	buckets := []ratelimit.Bucket{c.callers.Bucket(caller)}
	scopes := []string{"caller " + cmp.Or(caller, "(unnamed)")}
	for _, p := range probes {
		if p.Src.IsValid() && !p.Live {
			// A trace's families leave from one pod, so from one node.
			buckets = append(buckets, c.nodes.Bucket(p.SourceNode))
			scopes = append(scopes, "node "+cmp.Or(p.SourceNode, "(unknown)"))
			break
		}
	}
	wait, slowest, ok := ratelimit.Take(time.Now(), n, maxWait, buckets...)
	if !ok {
		return &RateLimitError{Scope: scopes[max(slowest, 0)], RetryAfter: wait}
	}
	if wait <= 0 {
		return nil
	}
	tm := time.NewTimer(wait)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
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
	_, err := hex.DecodeString(h)
	return ok && len(h) == 16 && err == nil && h == strings.ToLower(h)
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
			// The tracer's deadline may pass before it writes its own
			// reason (on a loaded node): say the same, less the last hop.
			timedOut := fmt.Sprintf("no delivery or drop seen before the timeout (%v)", timeout)
			switch {
			case err != nil && errors.Is(err, context.DeadlineExceeded):
				path.Outcome, path.Reason = TimedOut, timedOut
			case err != nil:
				path.Outcome, path.Reason = Error, err.Error()
			case path.Outcome == TimedOut && path.Reason == "":
				path.Reason = timedOut
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
	c.byCaller[t.caller] = append(c.byCaller[t.caller], t.res.ID)
	for len(c.byCaller[t.caller]) > c.cfg.KeepPerCaller {
		c.forget(c.byCaller[t.caller][0], t.caller)
	}
	for len(c.done) > c.cfg.Keep {
		id, caller := c.done[0], ""
		if t := c.traces[id]; t != nil {
			caller = t.caller
		}
		c.forget(id, caller)
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

// forget drops finished trace id of caller from memory (Get then reads
// the store); c.mu must be held. O(Keep), once per finished trace.
func (c *Controller) forget(id, caller string) {
	delete(c.traces, id)
	c.done = deleteID(c.done, id)
	if ids := deleteID(c.byCaller[caller], id); len(ids) > 0 {
		c.byCaller[caller] = ids
	} else {
		delete(c.byCaller, caller)
	}
}

func deleteID(ids []string, id string) []string {
	if i := slices.Index(ids, id); i >= 0 {
		return slices.Delete(ids, i, i+1)
	}
	return ids
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

// Trace starts req and waits for its result. Unlike Start, it waits for
// the caller's and the node's rate (as long as ctx allows, at most
// MaxTimeout) instead of refusing: a UI's reachability matrix, which
// traces cell after cell, is paced rather than failed.
func (c *Controller) Trace(ctx context.Context, req Request) (Result, error) {
	maxWait := c.cfg.MaxTimeout
	if dl, ok := ctx.Deadline(); ok {
		maxWait = min(maxWait, time.Until(dl))
	}
	id, err := c.start(ctx, req, maxWait)
	if err != nil {
		return Result{}, err
	}
	return c.Wait(ctx, id)
}
