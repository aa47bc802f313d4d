package tracer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/nsrun"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/inject"
	"github.com/dualflow/dualflow/traceflow/node"
	"github.com/dualflow/dualflow/traceflow/observe"
	"github.com/dualflow/dualflow/traceflow/packet"
	"github.com/dualflow/dualflow/traceflow/podns"
)

// podIface is the pod side of every lab pod veth.
const podIface = "eth0"

// settle is how long a trace keeps reading node events after the probe was
// delivered, so the last node's hooks (printed by nft after the packet
// moved on) are in the path.
const settle = 60 * time.Millisecond

// resendAfter is how long a trace waits for its probe to be delivered or
// dropped before sending it again (at most maxSends times in all): one
// packet can be lost on any hop, or its drop report (a packet-in under a
// meter, a trace event on a busy netlink socket) can be, and a trace that
// then waits out its whole timeout says nothing. The copies are the same
// packet (same tag and tuple), so they are observed as one probe.
const (
	resendAfter = time.Second
	maxSends    = 3
)

// resender re-sends the probe every resendAfter until maxSends are out.
type resender struct {
	send  func() error
	sent  int
	timer *time.Timer
}

func newResender(send func() error) *resender {
	return &resender{send: send, sent: 1, timer: time.NewTimer(resendAfter)}
}

// fire sends another copy and re-arms the timer (unless all are out).
func (r *resender) fire() error {
	r.sent++
	if r.sent < maxSends {
		r.timer.Reset(resendAfter)
	}
	return r.send()
}

func (r *resender) stop() { r.timer.Stop() }

// cleanupTimeout bounds removing the trace tables after a trace.
const cleanupTimeout = 2 * time.Second

// Tracer traces probes through a running lab with the kernel datapath.
// It is safe for concurrent use; concurrent probes must have distinct tags
// (the controller guarantees it).
type Tracer struct {
	lab *lab.Lab
	inv Inventory
	nft string
	// pods finds source pods by address, as the node agent does.
	pods *podns.Finder
	// Raw, when set before the first Trace, receives every `nft monitor`
	// line of every probe (for debugging the kernel datapath's tracing).
	// Writes from concurrent probes interleave by line.
	Raw io.Writer
}

// NewTracer returns a tracer for l. Names are resolved against inv (the
// lab's own manifest when inv.M is nil).
func NewTracer(l *lab.Lab, inv Inventory) (*Tracer, error) {
	if inv.M == nil {
		inv.M = l.Manifest
	}
	nftBin, err := lab.NFTPath()
	if err != nil {
		return nil, err
	}
	return &Tracer{lab: l, inv: inv, nft: nftBin, pods: &podns.Finder{Dirs: []string{nsrun.Dir}}}, nil
}

type nodeEvent struct {
	node string
	ev   observe.Event
}

type delivery struct {
	pod  *corev1.Pod
	seen packet.Seen
}

// Trace sends p from its source pod and follows it (see traceflow's
// nodeTracer), on the kernel or the OVS datapath of the lab.
func (t *Tracer) Trace(ctx context.Context, p traceflow.Probe) (traceflow.Path, error) {
	src, err := t.inv.pod(p.SourcePod)
	if err != nil {
		return traceflow.Path{}, err
	}
	if p.Live {
		if t.lab.State().Datapath == lab.DatapathOVS {
			return traceflow.Path{}, fmt.Errorf("live traffic on the OVS datapath: %w", traceflow.ErrNotSupported)
		}
		return t.traceLive(ctx, p, src)
	}
	// The source pod is found and the probe sent as on a node of a real
	// cluster: by the pod's address, to the node side of its veth.
	in := node.Injector{Pods: t.pods, NodeNS: t.lab.NodeNetNSPath(src.Spec.NodeName)}
	from, err := in.Locate(p.Src)
	if err != nil {
		return traceflow.Path{}, fmt.Errorf("pod %s: %w", p.SourcePod, err)
	}
	proto := p.ProtoNumber()
	frame, err := from.Frame(p)
	if err != nil {
		return traceflow.Path{}, err
	}
	send := func() error { return from.Send(frame) }
	if t.lab.State().Datapath == lab.DatapathOVS {
		return t.traceOVS(ctx, p, src, frame, send)
	}
	match := observe.ProbeMatch{Tag: p.Tag, Src: p.Src, Proto: proto, SrcPort: p.SrcPort}

	// Watch every node (the path is not known before the probe is sent).
	nodes := make([]string, 0, len(t.inv.M.Nodes))
	for i := range t.inv.M.Nodes {
		nodes = append(nodes, t.inv.M.Nodes[i].Name)
	}
	events := make(chan nodeEvent, 256) // producers stop on done; see below
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(done)
		wg.Wait()
	}()
	mons := make([]*observe.Monitor, len(nodes))
	errs := make([]error, len(nodes))
	var setup sync.WaitGroup
	for i, n := range nodes {
		setup.Go(func() { mons[i], errs[i] = t.watchNode(ctx, n, p.Tag, observe.TableRules(match), events, done, &wg) })
	}
	setup.Wait()
	defer t.cleanup(nodes, mons, p.Tag)
	if err := errors.Join(errs...); err != nil {
		if ctx.Err() != nil {
			// The trace's own deadline cut the setup short (a loaded node):
			// a timeout, not a failure of the datapath.
			return traceflow.Path{Outcome: traceflow.TimedOut,
				Reason: fmt.Sprintf("timeout before the probe was sent: watching the nodes took longer than the trace's timeout (%v)", err)}, nil
		}
		return traceflow.Path{}, err
	}

	// Capture where the probe may arrive.
	delivered, err := t.captureAt(ctx, p, done, &wg)
	if err != nil {
		return traceflow.Path{}, err
	}

	if err := send(); err != nil {
		return traceflow.Path{}, err
	}
	rs := newResender(send)
	defer rs.stop()

	c := collector{p: p, t: t, srcNode: src.Spec.NodeName}
	var settleC <-chan time.Time
	for {
		select {
		case <-rs.timer.C:
			if c.outcome == "" {
				if err := rs.fire(); err != nil {
					return traceflow.Path{}, err
				}
			}
		case ne := <-events:
			c.add(ne)
			if c.outcome == traceflow.Dropped || c.outcome == traceflow.Rejected {
				if settleC == nil {
					settleC = time.After(settle / 2)
				}
			}
		case d := <-delivered:
			c.deliver(d)
			settleC = time.After(settle)
		case <-settleC:
			return c.path(ctx), nil
		case <-ctx.Done():
			path := c.path(context.Background())
			path.Outcome = traceflow.TimedOut
			path.Reason = c.timeoutReason(ctx)
			return path, nil
		}
	}
}

// capture listens on dp's eth0 until done and sends the probe's arrival.
func (t *Tracer) capture(ctx context.Context, p traceflow.Probe, dp *corev1.Pod, delivered chan<- delivery, done <-chan struct{}, wg *sync.WaitGroup) error {
	// Found by its address, as a node finds its pods.
	addr, ok := manifest.PodAddr(dp, k8sFamily(p.Family))
	if !ok {
		return fmt.Errorf("pod %s/%s has no %s address", dp.Namespace, dp.Name, familyName(p.Family))
	}
	ns, err := t.pods.Find(addr)
	if err != nil {
		return fmt.Errorf("pod %s/%s: %w", dp.Namespace, dp.Name, err)
	}
	c, err := inject.Listen(ns.Path, ns.Iface)
	if err != nil {
		return err
	}
	proto := p.ProtoNumber()
	cctx, cancel := context.WithCancel(ctx)
	wg.Go(func() {
		select {
		case <-done:
		case <-cctx.Done():
		}
		cancel()
	})
	wg.Go(func() {
		defer c.Close()
		defer cancel()
		for {
			f, err := c.Next(cctx)
			if err != nil {
				return
			}
			if seen, ok := packet.Match(f, p.Tag, p.Src, proto, p.SrcPort); ok {
				select {
				case delivered <- delivery{pod: dp, seen: seen}:
				case <-done:
				}
				return
			}
		}
	})
	return nil
}

// watchNode starts nft monitor in node, loads the trace table and waits
// until the monitor echoes it (so it is subscribed before the probe is
// sent); then forwards the monitor's trace events to events until done.
func (t *Tracer) watchNode(ctx context.Context, node string, tag uint8, rules string, events chan<- nodeEvent, done <-chan struct{}, wg *sync.WaitGroup) (*observe.Monitor, error) {
	nsPath := t.lab.NodeNetNSPath(node)
	mon, err := observe.StartMonitor(nsPath, t.nft)
	if err != nil {
		return nil, err
	}
	// The monitor subscribes some time after it starts: load the table
	// until the monitor echoes it (loading is idempotent).
	echo := "add rule inet " + observe.TableName(tag) + " " + observe.ChainPost + " "
	for wait := 20 * time.Millisecond; ; wait *= 2 {
		if _, err := nsrun.Output(ctx, nsPath, []byte(rules), t.nft, "-f", "-"); err != nil {
			return mon, fmt.Errorf("node %s: load trace table: %w", node, err)
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		_, err := mon.WaitFor(wctx, echo)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return mon, fmt.Errorf("node %s: %w", node, err)
		}
	}
	wg.Go(func() {
		// Once a probe's nftrace is set, every table traces it, the other
		// probes' trace tables included; and the kernel reuses trace ids.
		// A packet is this probe's when the rule of this probe's pre chain
		// matched it (only that rule can); events of other trace tables
		// are skipped.
		table := observe.TableName(tag)
		mine := map[string]bool{}             // trace id -> belongs to this probe
		pending := map[string]observe.Event{} // trace id -> this table's pre packet line, until decided
		send := func(ev observe.Event) bool {
			select {
			case events <- nodeEvent{node: node, ev: ev}:
				return true
			case <-done:
				return false
			}
		}
		for l := range mon.Lines() {
			ev, ok := observe.ParseTrace(l)
			if t.Raw != nil {
				fmt.Fprintf(t.Raw, "probe %d %s: %s\n", tag, node, l)
			}
			if !ok {
				continue
			}
			if strings.HasPrefix(ev.Table, observe.TablePrefix) {
				switch {
				case ev.Table == table && ev.Chain == observe.ChainPre && ev.Kind == observe.KindPacket:
					pending[ev.ID] = ev
					continue
				case ev.Chain == observe.ChainPre && ev.Kind == observe.KindRule:
					mine[ev.ID] = ev.Table == table
					pre, ok := pending[ev.ID]
					delete(pending, ev.ID)
					if mine[ev.ID] && ok && !send(pre) {
						return
					}
					continue
				case ev.Table != table || ev.Chain != observe.ChainPost:
					continue
				}
			}
			if mine[ev.ID] && !send(ev) {
				return
			}
		}
	})
	return mon, nil
}

func (t *Tracer) cleanup(nodes []string, mons []*observe.Monitor, tag uint8) {
	ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() {
			if mons[i] != nil {
				mons[i].Close()
			}
			nsrun.Output(ctx, t.lab.NodeNetNSPath(n), []byte(observe.DeleteTable(tag)), t.nft, "-f", "-") // best effort: gone with the namespace anyway
		})
	}
	wg.Wait()
}

// collector turns node events into the probe's path.
type collector struct {
	p       traceflow.Probe
	t       *Tracer
	srcNode string

	order       []string // nodes in the order the probe reached them
	obs         map[string][]traceflow.Observation
	outcome     traceflow.Outcome
	reason      string
	delivered   *traceflow.Observation
	deliverNode string
	lastNode    string
}

func (c *collector) addObs(node string, o traceflow.Observation) {
	if c.obs == nil {
		c.obs = map[string][]traceflow.Observation{}
	}
	if _, ok := c.obs[node]; !ok {
		c.order = append(c.order, node)
	}
	o.Node = node
	c.obs[node] = append(c.obs[node], o)
	c.lastNode = node
}

func (c *collector) add(ne nodeEvent) {
	ev := ne.ev
	switch {
	case strings.HasPrefix(ev.Table, observe.TablePrefix):
		switch {
		case ev.Chain == observe.ChainPre && ev.Kind == observe.KindPacket:
			c.addObs(ne.node, traceflow.Observation{Component: traceflow.Forwarding, Action: traceflow.ActionReceived, Interface: ev.IIf})
		case ev.Chain == observe.ChainPost && ev.Kind == observe.KindPacket:
			o := traceflow.Observation{Component: traceflow.Forwarding, Action: traceflow.ActionForwarded, Interface: ev.OIf}
			if ev.Src.IsValid() && ev.Src != c.p.Src {
				o.TranslatedSrc = netip.AddrPortFrom(ev.Src, ev.SrcPort)
			}
			c.addObs(ne.node, o)
		}
	case ev.Kind == observe.KindPacket && ev.Chain == "forward":
		o := traceflow.Observation{Component: traceflow.Routing, Action: traceflow.ActionForwarded, Interface: ev.OIf}
		if ev.Dst.IsValid() && ev.Dst != c.p.Dst {
			o.TranslatedDst = netip.AddrPortFrom(ev.Dst, ev.DstPort)
		}
		c.addObs(ne.node, o)
	case ev.Kind == observe.KindRule:
		c.rule(ne.node, ev)
	}
}

func (c *collector) rule(node string, ev observe.Event) {
	comment, _ := observe.Quoted(ev.Rule, "comment")
	if dst, ok := observe.DNATTarget(ev.Rule); ok {
		o := traceflow.Observation{Component: traceflow.LoadBalancing, Action: traceflow.ActionForwarded, Service: c.p.Service, TranslatedDst: dst}
		if o.Service == "" {
			o.Service = serviceOfComment(comment)
		}
		o.Detail = comment
		c.addObs(node, o)
		return
	}
	dir, isPolicyChain := policyChain(ev.Chain)
	switch ev.Verdict {
	case "accept":
		if isPolicyChain {
			name := ruleName(ev.Rule, comment)
			c.addObs(node, traceflow.Observation{Component: traceflow.NetworkPolicy, Action: traceflow.ActionForwarded,
				Policy: policyOfRule(name), Rule: name, Detail: string(dir)})
		}
	case "drop":
		o := traceflow.Observation{Component: traceflow.Forwarding, Action: traceflow.ActionDropped, Detail: comment}
		name := ruleName(ev.Rule, comment)
		switch {
		case strings.Contains(ev.Rule, " reject"):
			o.Action = traceflow.ActionRejected
			c.outcome, c.reason = traceflow.Rejected, "rejected by "+cmpOr(comment, ev.Rule)
			if strings.Contains(comment, "no endpoints") || strings.Contains(ev.Rule, "no endpoints") {
				o.Component = traceflow.LoadBalancing
			}
		case strings.HasPrefix(name, "drop/"):
			o.Component, o.Rule = traceflow.NetworkPolicy, name
			o.Policy = strings.Join(c.isolating(name), ",")
			o.Detail = "no rule of the isolating policies allows it"
			c.outcome = traceflow.Dropped
			c.reason = fmt.Sprintf("dropped by NetworkPolicy %s (rule %s) on %s", cmpOr(o.Policy, "?"), name, node)
		case isPolicyChain:
			o.Component, o.Rule, o.Policy = traceflow.NetworkPolicy, name, policyOfRule(name)
			c.outcome = traceflow.Dropped
			c.reason = fmt.Sprintf("dropped by NetworkPolicy rule %s on %s", name, node)
		default:
			c.outcome = traceflow.Dropped
			c.reason = fmt.Sprintf("dropped on %s by rule %q in chain %s", node, cmpOr(comment, ev.Rule), ev.Chain)
		}
		c.addObs(node, o)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// policyChain reports whether chain is a lab policy chain
// ("ingress/ns/pod", "egress/ns/pod") and its direction.
func policyChain(chain string) (nft.Direction, bool) {
	for _, d := range []nft.Direction{nft.Ingress, nft.Egress} {
		if strings.HasPrefix(chain, string(d)+"/") {
			return d, true
		}
	}
	return "", false
}

// ruleName is the rule's counter name (nft.RuleName / nft.DropName), else
// its comment.
func ruleName(rule, comment string) string {
	if n, ok := observe.Quoted(rule, "counter name"); ok {
		return n
	}
	return comment
}

// policyOfRule maps "ns/name/ingress/0" to "ns/name".
func policyOfRule(rule string) string {
	f := strings.Split(rule, "/")
	if len(f) == 4 {
		return f[0] + "/" + f[1]
	}
	return ""
}

// serviceOfComment maps "endpoint A:P of ns/name/port/v4" to "ns/name".
func serviceOfComment(c string) string {
	_, ref, ok := strings.Cut(c, " of ")
	if !ok {
		return ""
	}
	f := strings.Split(ref, "/")
	if len(f) >= 2 {
		return f[0] + "/" + f[1]
	}
	return ""
}

// isolating maps a drop rule "drop/ingress/ns/pod" to the policies that
// isolate the pod in that direction.
func (c *collector) isolating(drop string) []string {
	f := strings.Split(drop, "/")
	if len(f) != 4 {
		return nil
	}
	return c.t.inv.IsolatingPolicies(f[2], f[3], nft.Direction(f[1]))
}

func (c *collector) deliver(d delivery) {
	o := traceflow.Observation{Component: traceflow.Delivery, Action: traceflow.ActionDelivered, Interface: podIface,
		Pod: d.pod.Namespace + "/" + d.pod.Name}
	if d.seen.Dst != c.p.Dst || d.seen.DstPort != c.p.DstPort {
		o.TranslatedDst = netip.AddrPortFrom(d.seen.Dst, d.seen.DstPort)
	}
	if d.seen.Src != c.p.Src {
		o.TranslatedSrc = netip.AddrPortFrom(d.seen.Src, d.seen.SrcPort)
	}
	c.delivered = &o
	c.deliverNode = d.pod.Spec.NodeName
	c.outcome = traceflow.Delivered
	c.reason = ""
}

// path orders the observations along the path (source node first, then
// the nodes in the order they saw the probe, delivery last) and adds the
// conntrack view of the source node.
func (c *collector) path(ctx context.Context) traceflow.Path {
	var out []traceflow.Observation
	order := slices.Clone(c.order)
	if i := slices.Index(order, c.srcNode); i > 0 {
		order = append([]string{c.srcNode}, slices.Delete(order, i, i+1)...)
	}
	for _, n := range order {
		out = append(out, c.obs[n]...)
	}
	if c.delivered != nil {
		o := *c.delivered
		o.Node = c.deliverNode
		out = append(out, o)
	}
	c.conntrack(out)
	if out == nil {
		out = []traceflow.Observation{}
	}
	return traceflow.Path{Outcome: c.outcomeOr(), Reason: c.reason, Observations: out}
}

func (c *collector) outcomeOr() traceflow.Outcome {
	if c.outcome == "" {
		return traceflow.TimedOut
	}
	return c.outcome
}

// conntrack fills the load-balancing observation's translation from the
// source node's conntrack entry of the probe (the kernel's DNAT record),
// when the trace did not already show it.
func (c *collector) conntrack(obs []traceflow.Observation) {
	conns, err := c.t.lab.Conntrack(c.srcNode)
	if err != nil {
		return
	}
	ct, ok := lab.FindConn(conns, c.p.ProtoNumber(), netip.AddrPortFrom(c.p.Src, c.p.SrcPort))
	if !ok || ct.Orig.Dst != c.p.Dst {
		return
	}
	for i := range obs {
		if obs[i].Component == traceflow.LoadBalancing && obs[i].Node == c.srcNode {
			if ct.DstNAT {
				obs[i].TranslatedDst = netip.AddrPortFrom(ct.Reply.Src, ct.Reply.SrcPort)
			}
			if ct.Reply.Dst != ct.Orig.Src {
				obs[i].TranslatedSrc = netip.AddrPortFrom(ct.Reply.Dst, ct.Reply.DstPort)
			}
			obs[i].Detail = strings.TrimSpace(obs[i].Detail + " (conntrack: " + ctString(ct) + ")")
		}
	}
}

func ctString(ct lab.Conn) string {
	return fmt.Sprintf("%s:%d -> %s:%d, reply %s:%d -> %s:%d", ct.Orig.Src, ct.Orig.SrcPort, ct.Orig.Dst, ct.Orig.DstPort,
		ct.Reply.Src, ct.Reply.SrcPort, ct.Reply.Dst, ct.Reply.DstPort)
}

func (c *collector) timeoutReason(ctx context.Context) string {
	last := "the probe was not seen on any node"
	if c.lastNode != "" {
		last = "last seen on " + c.lastNode
	}
	return fmt.Sprintf("no delivery or drop seen before the timeout (%v); %s", context.Cause(ctx), last)
}
