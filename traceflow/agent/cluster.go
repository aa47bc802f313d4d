package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dualflow/dualflow/traceflow"
)

// Defaults of a Cluster.
const (
	// DefaultSettle is how long a trace keeps reading the nodes' events
	// after the probe was delivered (half of it after a drop), so the last
	// hooks a node reports after the packet moved on are in the path.
	DefaultSettle = 60 * time.Millisecond
	// DefaultResendAfter is how long a trace waits for its probe to be
	// delivered or dropped before injecting it again, DefaultMaxSends
	// times in all: one packet can be lost on any hop, or its drop report
	// can be. The copies are the same packet (tag and tuple), observed as
	// one probe.
	DefaultResendAfter = time.Second
	DefaultMaxSends    = 3
)

// sourceWait caps how long a decided trace waits for the source node to
// report that the probe left it.
const sourceWait = time.Second

// Directory finds node agents.
type Directory interface {
	// Agent returns the client of node's agent.
	Agent(node string) (*Client, error)
	// Nodes returns every node with an agent (watched when a probe does not
	// say where it may go).
	Nodes() []string
}

// PolicyNamer explains drops from the cluster's view, which the controller
// has and a node has not.
type PolicyNamer interface {
	// Denial evaluates a packet from src to dst (the endpoint it reached,
	// after DNAT) as the audit evaluates stored flows, and explains the
	// side whose policies deny it. ok is false when the policies allow
	// it. It names the policy behind an isolation drop rule, which names
	// only the pod, and behind a drop by a rule of another NetworkPolicy
	// implementation (kube-router's pod firewall chains, say), which
	// names no policy.
	Denial(src netip.Addr, dst netip.AddrPort, proto uint8) (Denial, bool)
}

// Denial is why the cluster's policies deny a packet.
type Denial struct {
	// Policy is the deciding policy, namespace/name: the isolating
	// policy the Flows page names for the same connection.
	Policy string
	// Reason is the one explanation of the drop: the isolating policy,
	// what no rule allowed (family, protocol, port) and the nearest rule
	// with what it lacks.
	Reason string
}

// Cluster is the controller's node tracer: it traces a probe through the
// agents of the nodes it may cross. It is safe for concurrent use.
type Cluster struct {
	Agents   Directory
	Policies PolicyNamer // may be nil
	// Settle, ResendAfter and MaxSends default to the constants above.
	Settle      time.Duration
	ResendAfter time.Duration
	MaxSends    int
}

type nodeEvent struct {
	node string
	ev   traceflow.WatchEvent
	err  error // the stream ended (io.EOF) or failed
}

// Trace implements traceflow's node tracer: watch on every node the probe
// may cross, inject at the source node, merge.
func (c *Cluster) Trace(ctx context.Context, p traceflow.Probe) (traceflow.Path, error) {
	settle := cmp.Or(c.Settle, DefaultSettle)
	resendAfter := cmp.Or(c.ResendAfter, DefaultResendAfter)
	maxSends := cmp.Or(c.MaxSends, DefaultMaxSends)
	nodes := c.nodes(p)
	if p.SourceNode == "" {
		return traceflow.Path{}, fmt.Errorf("pod %s has no node", p.SourcePod)
	}
	src, err := c.Agents.Agent(p.SourceNode)
	if err != nil {
		return traceflow.Path{}, fmt.Errorf("node %s: %w", p.SourceNode, err)
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	streams := make([]*Stream, len(nodes))
	errs := make([]error, len(nodes))
	watch := func(i int) {
		a, err := c.Agents.Agent(nodes[i])
		if err != nil {
			errs[i] = fmt.Errorf("node %s: %w", nodes[i], err)
			return
		}
		streams[i], errs[i] = a.Watch(wctx, p)
	}
	// A live trace follows the connections the source node announces:
	// watch there only once every other node is ready, so each announced
	// connection is one the other nodes see too.
	var setup sync.WaitGroup
	for i := range nodes {
		if i > 0 || !p.Live {
			setup.Go(func() { watch(i) })
		}
	}
	setup.Wait()
	// The source node and the nodes of the targets must watch; when the
	// probe could go anywhere every node is asked, and one that cannot
	// watch only makes the path less complete.
	var lost []string
	if len(p.Nodes) == 0 {
		for i := 1; i < len(nodes); i++ {
			if errs[i] != nil && ctx.Err() == nil {
				lost = append(lost, errs[i].Error())
				errs[i] = nil
			}
		}
	}
	if p.Live && errors.Join(errs...) == nil {
		watch(0)
	}
	events := make(chan nodeEvent, 64)
	var readers sync.WaitGroup
	defer func() {
		cancel()
		for _, s := range streams {
			if s != nil {
				s.Close()
			}
		}
		readers.Wait()
	}()
	if err := errors.Join(errs...); err != nil {
		if ctx.Err() != nil {
			return traceflow.Path{Outcome: traceflow.TimedOut,
				Reason: fmt.Sprintf("timeout before the probe was sent: the nodes took longer than the trace's timeout to start watching (%v)", err)}, nil
		}
		return traceflow.Path{}, err
	}
	for i, s := range streams {
		if s == nil {
			continue // a node that could not watch (in lost)
		}
		readers.Go(func() {
			for {
				ev, err := s.Next()
				select {
				case events <- nodeEvent{node: nodes[i], ev: ev, err: err}:
				case <-wctx.Done():
					return
				}
				if err != nil {
					return
				}
			}
		})
	}

	m := merger{p: p, policies: c.Policies, lost: lost}
	var resendC <-chan time.Time
	if !p.Live {
		if err := inject(ctx, src, p); err != nil {
			return traceflow.Path{}, err
		}
		resend := time.NewTimer(resendAfter)
		defer resend.Stop()
		resendC = resend.C
		sent := 1
		m.resend = func() error {
			sent++
			if sent < maxSends {
				resend.Reset(resendAfter)
			} else {
				resendC = nil
			}
			return src.Inject(ctx, p)
		}
	}
	var settleC, waitC <-chan time.Time
	for {
		select {
		case <-resendC:
			if !m.decided() {
				// A copy refused for the agent's rate is only a copy less.
				if err := m.resend(); err != nil && ctx.Err() == nil && !errors.Is(err, traceflow.ErrRateLimited) {
					return traceflow.Path{}, err
				}
			}
		case ne := <-events:
			if ne.err != nil {
				if !errors.Is(ne.err, io.EOF) || ctx.Err() == nil {
					m.lose(fmt.Sprintf("%s: %v", ne.node, ne.err))
				}
				continue
			}
			m.add(ne.node, ne.ev)
			switch {
			case settleC != nil || !m.decided():
			case m.sourceDone():
				d := settle
				if m.outcome != traceflow.Delivered {
					d = settle / 2
				}
				settleC = time.After(d)
			case waitC == nil:
				waitC = time.After(sourceWait)
			}
		case <-waitC:
			// The source node never said the probe left it (a report
			// lost): close the path with what arrived.
			if settleC == nil {
				settleC = time.After(0)
			}
		case <-settleC:
			return m.path(), nil
		case <-ctx.Done():
			path := m.path()
			path.Outcome, path.Reason = traceflow.TimedOut, m.timeoutReason(ctx)
			return path, nil
		}
	}
}

// inject asks the source node's agent to send p. Refused for the agent's
// rate (traceflow.RateLimitError), it asks again after the agent's
// Retry-After, while ctx leaves time for it.
func inject(ctx context.Context, src *Client, p traceflow.Probe) error {
	for {
		err := src.Inject(ctx, p)
		var rl *traceflow.RateLimitError
		if !errors.As(err, &rl) {
			return err
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < rl.RetryAfter {
			return err
		}
		t := time.NewTimer(rl.RetryAfter)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return err
		}
	}
}

// nodes returns the nodes to watch: the source node first, then the
// probe's, or every agent's.
func (c *Cluster) nodes(p traceflow.Probe) []string {
	all := p.Nodes
	if len(all) == 0 {
		all = c.Agents.Nodes()
	}
	out := []string{p.SourceNode}
	for _, n := range all {
		if n != "" && !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// merger turns the nodes' events into one path.
type merger struct {
	p        traceflow.Probe
	policies PolicyNamer
	resend   func() error

	order     []string // nodes in the order they saw the probe
	obs       map[string][]traceflow.Observation
	last      []traceflow.Observation // deliveries: the end of the path
	outcome   traceflow.Outcome
	reason    string
	outcomeAt string // the node that decided the outcome
	srcLeft   bool   // the source node reported the probe leaving
	lastAt    string
	lost      []string // streams that failed

	// Live traces: the connections the source node picked, in order, and
	// each one's events until one is chosen.
	conns   []uint16
	byConn  map[uint16][]nodeEventLite
	chosen  uint16
	skipped int
}

type nodeEventLite struct {
	node string
	ev   traceflow.WatchEvent
}

func (m *merger) decided() bool { return m.outcome != "" }

// lose notes a problem with a node's stream (once per text, bounded).
func (m *merger) lose(what string) {
	if len(m.lost) < maxLost && !slices.Contains(m.lost, what) {
		m.lost = append(m.lost, what)
	}
}

// sourceDone reports whether the source node has said all it saw: the
// probe left it, or it decided the outcome there.
func (m *merger) sourceDone() bool { return m.srcLeft || m.outcomeAt == m.p.SourceNode }

func (m *merger) add(n string, ev traceflow.WatchEvent) {
	if !m.p.Live {
		m.apply(n, ev)
		return
	}
	if m.byConn == nil {
		m.byConn = map[uint16][]nodeEventLite{}
	}
	if ev.SrcPort != 0 && n == m.p.SourceNode && !slices.Contains(m.conns, ev.SrcPort) {
		m.conns = append(m.conns, ev.SrcPort)
	}
	if m.chosen != 0 {
		if ev.Conn == m.chosen {
			m.apply(n, ev)
		}
		return
	}
	if len(m.byConn[ev.Conn]) >= maxEventsConn {
		m.lose(fmt.Sprintf("%s: more than %d events of connection %d, the rest dropped", n, maxEventsConn, ev.Conn))
		return
	}
	m.byConn[ev.Conn] = append(m.byConn[ev.Conn], nodeEventLite{n, ev})
	m.choose()
}

// choose picks the live connection to report: the first one the source
// node picked (with droppedOnly, the first one some node dropped).
func (m *merger) choose() {
	skipped := 0
	for _, conn := range m.conns {
		var outcome traceflow.Outcome
		for _, e := range m.byConn[conn] {
			if e.ev.Outcome != "" && outcome == "" {
				outcome = e.ev.Outcome
			}
		}
		if m.p.DroppedOnly && outcome != traceflow.Dropped && outcome != traceflow.Rejected {
			if outcome == traceflow.Delivered {
				skipped++
			}
			continue
		}
		m.chosen = conn
		for _, e := range m.byConn[conn] {
			m.apply(e.node, e.ev)
		}
		m.byConn = nil // only the chosen one's events matter now
		break
	}
	m.skipped = skipped
	m.bound()
}

// maxConns bounds the live connections a trace keeps events of before it
// chooses one (a busy pod opens many); the oldest go first.
const maxConns = 256

// bound forgets the oldest connections beyond maxConns.
func (m *merger) bound() {
	if m.chosen != 0 || len(m.byConn) <= maxConns {
		return
	}
	for conn := range m.byConn {
		if !slices.Contains(m.conns, conn) {
			delete(m.byConn, conn) // announced by no source node: noise
		}
	}
	for len(m.conns) > maxConns {
		delete(m.byConn, m.conns[0])
		m.conns = m.conns[1:]
	}
}

// Bounds of what a trace keeps of the nodes' streams: a real path is a
// few dozen observations; a broken or hostile agent must not fill the
// collector's memory.
const (
	maxObsPerNode = 256
	maxEventsConn = 512
	maxLost       = 16
	maxDeliveries = 8
)

func (m *merger) apply(n string, ev traceflow.WatchEvent) {
	if o := ev.Observation; o != nil && (len(m.obs[n]) >= maxObsPerNode || len(m.last) >= maxDeliveries && o.Component == traceflow.Delivery) {
		m.lose(fmt.Sprintf("%s: more than %d observations, the rest dropped", n, maxObsPerNode))
		ev.Observation = nil
	}
	if o := ev.Observation; o != nil {
		o.Node = n
		if o.Component == traceflow.Delivery {
			m.last = append(m.last, *o)
		} else {
			if m.obs == nil {
				m.obs = map[string][]traceflow.Observation{}
			}
			if _, ok := m.obs[n]; !ok {
				m.order = append(m.order, n)
			}
			// A resent copy crosses the same hops again: keep one.
			if !slices.Contains(m.obs[n], *o) {
				m.obs[n] = append(m.obs[n], *o)
			}
		}
		m.lastAt = n
	}
	if ev.Left && n == m.p.SourceNode {
		m.srcLeft = true
	}
	if ev.Outcome != "" && m.outcome == "" {
		m.outcome, m.reason, m.outcomeAt = ev.Outcome, ev.Reason, n
		if ev.Outcome == traceflow.Delivered {
			m.reason = ""
		}
	}
}

// path orders the observations: the source node first, then the nodes in
// the order they reported the probe, deliveries last; and names the
// policies behind isolation drops.
func (m *merger) path() traceflow.Path {
	order := slices.Clone(m.order)
	if i := slices.Index(order, m.p.SourceNode); i > 0 {
		order = append([]string{m.p.SourceNode}, slices.Delete(order, i, i+1)...)
	}
	out := []traceflow.Observation{}
	for _, n := range order {
		out = append(out, m.obs[n]...)
	}
	if len(m.last) > 0 {
		out = append(out, m.last[0])
	}
	reason := m.reason
	for i := range out {
		o := &out[i]
		isolation := o.Component == traceflow.NetworkPolicy && o.Policy == ""
		foreign := o.Component == traceflow.Forwarding && o.Rule != ""
		if m.policies != nil && (isolation || foreign) &&
			(o.Action == traceflow.ActionDropped || o.Action == traceflow.ActionRejected) {
			reason = m.explainDrop(out, o, reason)
		}
	}
	if m.skipped > 0 {
		reason = fmt.Sprintf("%s (after %d delivered connections)", reason, m.skipped)
	}
	outcome := cmp.Or(m.outcome, traceflow.TimedOut)
	return traceflow.Path{Outcome: outcome, Reason: reason, Observations: out, SrcPort: m.chosen}
}

// explainDrop explains drop, a drop by a rule that names no policy (an
// isolation drop rule, or another implementation's), when the cluster's
// policies deny the probe at the endpoint it reached (the DNAT seen on
// the path, else the destination): the trace's reason becomes the one
// explanation of the drop, and the datapath's rule moves to the
// observation's detail. It returns the trace's reason.
func (m *merger) explainDrop(path []traceflow.Observation, drop *traceflow.Observation, reason string) string {
	dst := netip.AddrPortFrom(m.p.Dst, m.p.DstPort)
	for _, o := range path {
		if o.TranslatedDst.IsValid() {
			dst = o.TranslatedDst
		}
	}
	d, denied := m.policies.Denial(m.p.Src, dst, m.p.ProtoNumber())
	if !denied {
		return reason
	}
	verb := "dropped"
	if drop.Action == traceflow.ActionRejected {
		verb = "rejected"
	}
	drop.Component, drop.Policy = traceflow.NetworkPolicy, d.Policy
	drop.Detail = strings.TrimSuffix("the datapath's rule "+drop.Rule+"; "+drop.Detail, "; ")
	return fmt.Sprintf("%s on %s: %s", verb, drop.Node, d.Reason)
}

func (m *merger) timeoutReason(ctx context.Context) string {
	if m.p.Live && m.chosen == 0 {
		what := "new connection"
		if m.p.DroppedOnly {
			what = "dropped connection"
		}
		return fmt.Sprintf("no %s from %s to %s port %d seen before the timeout (%d delivered skipped)", what, m.p.SourcePod, m.p.Dst, m.p.DstPort, m.skipped)
	}
	last := "the probe was not seen on any node"
	if m.lastAt != "" {
		last = "last seen on " + m.lastAt
	}
	s := fmt.Sprintf("no delivery or drop seen before the timeout (%v); %s", context.Cause(ctx), last)
	if len(m.lost) > 0 {
		s += "; watches lost: " + strings.Join(m.lost, "; ")
	}
	return s
}
