package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
)

// conntrackWait bounds waiting for the conntrack entry of a probe that a
// Service rule translated (the entry is confirmed as the packet leaves).
const conntrackWait = 100 * time.Millisecond

// loadSlots bounds the trace table loads a node runs at once; more wait
// their turn for as long as their watch lasts. A load is one netlink
// transaction (milliseconds, no process): the bound keeps 128 watches at
// once from piling their commits on the kernel's nftables lock together.
const loadSlots = 4

// sweepInterval is how often a tracer removes the trace tables no watch
// of its owns: its own that a failed removal left, and another agent's
// older than staleAfter.
const sweepInterval = 30 * time.Second

// staleAfter is the age beyond which a trace table of NewTableName is
// nobody's: a watch lasts at most a minute (the agent's MaxTimeout) and
// its load and removal seconds at worst.
const staleAfter = 5 * time.Minute

// tableOps programs the node's trace tables: observe's netlink functions
// (a fake in tests, whose nft monitor is a log file).
type tableOps interface {
	Load(nsPath string, t observe.Table) error
	Delete(nsPath, name string) error
	List(nsPath string) ([]string, error)
}

// netlinkTables is tableOps over netlink (package observe).
type netlinkTables struct{}

func (netlinkTables) Load(ns string, t observe.Table) error { return observe.LoadTable(ns, t) }
func (netlinkTables) Delete(ns, name string) error          { return observe.DeleteTable(ns, name) }
func (netlinkTables) List(ns string) ([]string, error)      { return observe.ListTables(ns) }

var _ tableOps = netlinkTables{}

// startTrace subscribes to the node's `nft monitor`, loads trace table tb
// (a name of its own: observe.NewTableName) and waits until the monitor
// echoes it, so the monitor is subscribed before the probe is sent. The
// caller must call the returned stop function, which removes the table.
//
// A monitor just started subscribes some time later: the watch waits for
// the node's canary to prove it did (Tracer.canary, once per monitor),
// then loads its table once. The load waits for one of loadSlots while
// ctx lasts (then nothing of the watch is in the kernel), and is not
// cancelled by ctx once started. The removal never uses ctx either: a
// watch's timeout has often just ended when it runs. A removal that fails
// is retried by the sweep.
func (t *Tracer) startTrace(ctx context.Context, tb observe.Table) (*monitorSub, func(), error) {
	if t.NFT == "" {
		return nil, nil, fmt.Errorf("%w: no nft binary (the kernel datapath needs nftables)", traceflow.ErrNotSupported)
	}
	mon, err := t.hub.subscribe()
	if err != nil {
		return nil, nil, err
	}
	// Owned before it exists: the sweep never removes it under the watch.
	t.mu.Lock()
	t.active[tb.Name] = true
	t.mu.Unlock()
	stop := func() {
		mon.Close()
		t.remove(tb.Name)
	}
	select {
	case <-mon.ready:
	case <-mon.ended:
		stop()
		return nil, nil, fmt.Errorf("nft monitor of node %s: %w", t.Name, errMonitorExited)
	case <-ctx.Done():
		stop()
		return nil, nil, fmt.Errorf("nft monitor not subscribed: %w", ctx.Err())
	}
	// Subscribed, the monitor echoes the load, however late on a loaded
	// node; a load again only if its events were lost (a monitor that
	// could not keep up).
	echo := "add rule inet " + tb.Name + " " + observe.ChainPost + " "
	for wait := echoWait; ; wait *= 2 {
		if err := t.load(ctx, tb); err != nil {
			stop()
			return nil, nil, err
		}
		if ctx.Err() != nil {
			// The load outlived the watch: it is not ready, however
			// quickly the echo follows.
			stop()
			return nil, nil, fmt.Errorf("trace table loaded after the watch ended: %w", ctx.Err())
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		err = mon.WaitFor(wctx, echo)
		cancel()
		if err == nil {
			return mon, stop, nil
		}
		if ctx.Err() != nil {
			stop()
			return nil, nil, fmt.Errorf("nft monitor did not echo the trace table: %w", ctx.Err())
		}
		if errors.Is(err, errMonitorExited) {
			stop()
			return nil, nil, fmt.Errorf("nft monitor of node %s: %w", t.Name, err)
		}
	}
}

// echoWait is how long a watch waits for the echo of its table's load by
// a subscribed monitor before it loads it again (doubling each time).
const echoWait = 2 * time.Second

// canaryBudget bounds the canary of one monitor.
const canaryBudget = 30 * time.Second

// canary proves that the node's monitor listening on s is subscribed: it
// loads an empty table of its own (it traces nothing) until the monitor
// echoes it, 20 ms, then 40, ... up to 1 s apart, within canaryBudget,
// then removes it.
func (t *Tracer) canary(s *monitorSub) bool {
	tb := observe.CanaryTable(observe.NewTableName(0, time.Now()))
	defer t.tables.Delete(t.nodeNS(), tb.Name) // a failure is the sweep's
	ctx, cancel := context.WithTimeout(context.Background(), canaryBudget)
	defer cancel()
	echo := "add table inet " + tb.Name
	for wait := 20 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		if err := t.load(ctx, tb); err != nil {
			t.Logger.Warn("traceflow: nft monitor canary", "node", t.Name, "err", err)
			return false
		}
		wctx, cancel := context.WithTimeout(ctx, wait)
		err := s.WaitFor(wctx, echo)
		cancel()
		switch {
		case err == nil:
			return true
		case errors.Is(err, errMonitorExited):
			return false
		case ctx.Err() != nil:
			t.Logger.Warn("traceflow: nft monitor never echoed a table load", "node", t.Name, "within", canaryBudget)
			return false
		}
	}
}

// load loads tb once one of the node's load slots is free.
func (t *Tracer) load(ctx context.Context, tb observe.Table) error {
	select {
	case t.slots <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("load trace table: waiting for a turn (%d at once): %w", loadSlots, ctx.Err())
	}
	defer func() { <-t.slots }()
	if err := t.tables.Load(t.nodeNS(), tb); err != nil {
		return fmt.Errorf("load trace table: %w", err)
	}
	return nil
}

// remove deletes the table of a watch that ended; one that fails stays
// for the sweep.
func (t *Tracer) remove(name string) {
	err := t.tables.Delete(t.nodeNS(), name)
	t.mu.Lock()
	delete(t.active, name)
	t.mu.Unlock()
	if err != nil {
		t.Logger.Warn("traceflow: remove trace table (the sweep retries)", "node", t.Name, "table", name, "err", err)
	}
}

// RemoveStaleTables deletes the trace tables a previous agent of this node
// left behind (killed in the middle of a watch): a live trace's table
// would keep tracing every new connection of its pod. Call it before
// serving; afterwards the tracer sweeps by itself every sweepInterval.
func (t *Tracer) RemoveStaleTables(ctx context.Context) error {
	t.init()
	if t.NFT == "" || t.OVS != nil {
		return nil
	}
	n, err := t.sweep(true)
	if n > 0 {
		t.Logger.Info("traceflow: removed trace tables a previous agent left", "node", t.Name, "tables", n)
	}
	if err != nil {
		return fmt.Errorf("remove stale trace tables: %w", err)
	}
	return nil
}

// sweep removes the node's trace tables that no watch of this tracer
// owns: with all, every one (at start); else its own (a removal that
// failed), and those of other agents older than staleAfter or not named
// by observe.NewTableName. It returns how many it removed.
func (t *Tracer) sweep(all bool) (int, error) {
	names, err := t.tables.List(t.nodeNS())
	if err != nil {
		return 0, err
	}
	var errs []error
	n := 0
	for _, name := range names {
		created, mine, ok := observe.TableInfo(name)
		t.mu.Lock()
		active := t.active[name]
		t.mu.Unlock()
		if active || !(all || !ok || mine || time.Since(created) > staleAfter) {
			continue
		}
		if err := t.tables.Delete(t.nodeNS(), name); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// sweepEvery sweeps every interval until stop is closed.
func (t *Tracer) sweepEvery(interval time.Duration, stop <-chan struct{}) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			n, err := t.sweep(false)
			if n > 0 || err != nil {
				t.Logger.Warn("traceflow: swept trace tables no watch owned", "node", t.Name, "removed", n, "err", err)
			}
		case <-stop:
			return
		}
	}
}

// traceEvents filters the monitor's lines down to the trace events of the
// probe of trace table tb and sends them to out until ctx ends.
//
// Once a probe's nftrace is set, every table traces it, the other probes'
// trace tables included; and the kernel reuses trace ids. A packet is this
// probe's when the rule of this probe's pre chain matched it (only that
// rule can); events of other trace tables are skipped. A packet may also
// change trace id on its way through the node (an IPv6 probe DNATed by
// kube-proxy and forwarded to another node does, between nat prerouting
// and filter forward): a packet line with an unknown id whose source
// address and port are the probe's, once the probe was seen on this node,
// is the probe's too.
//
// It closes out when the monitor exits (the watch then fails: it would
// see nothing more) and returns, without closing out, when ctx ends.
func (t *Tracer) traceEvents(ctx context.Context, mon *monitorSub, tb observe.Table, out chan<- observe.Event) {
	table := tb.Name
	mine := map[string]bool{}             // trace id -> belongs to this probe
	seen := false                         // this probe's pre rule matched here
	pending := map[string]observe.Event{} // trace id -> this table's pre packet line, until decided
	send := func(ev observe.Event) bool {
		select {
		case out <- ev:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		var l string
		select {
		case line, ok := <-mon.Lines():
			if !ok {
				close(out)
				return
			}
			l = line
		case <-ctx.Done():
			return
		}
		if t.Raw != nil {
			fmt.Fprintf(t.Raw, "%s %s: %s\n", table, t.Name, l)
		}
		ev, ok := observe.ParseTrace(l)
		if !ok {
			continue
		}
		if ev.Kind == observe.KindPacket && ev.SrcPort == 0 {
			ev.SrcPort, _ = echoID(l) // ParseTrace reads no echo id; a live trace keys by it
		}
		if strings.HasPrefix(ev.Table, observe.TablePrefix) {
			switch {
			case ev.Table == table && ev.Chain == observe.ChainPre && ev.Kind == observe.KindPacket:
				pending[ev.ID] = ev
				continue
			case ev.Chain == observe.ChainPre && ev.Kind == observe.KindRule:
				mine[ev.ID] = ev.Table == table
				seen = seen || mine[ev.ID]
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
		if _, known := mine[ev.ID]; !known && ev.Kind == observe.KindPacket && !tb.Live && tb.Probe.SrcPort != 0 &&
			ev.Src == tb.Probe.Src && ev.SrcPort == tb.Probe.SrcPort && seen {
			mine[ev.ID] = true
		}
		if mine[ev.ID] && !send(ev) {
			return
		}
		if ev.Table == table && ev.Chain == observe.ChainPost && ev.Kind == observe.KindPolicy {
			delete(mine, ev.ID) // the packet left: its last line
		}
		if len(mine) > maxTraced || len(pending) > maxTraced {
			// Dropped packets never reach post: a live trace of a busy pod
			// could grow these without end.
			clear(mine)
			clear(pending)
		}
	}
}

// maxTraced bounds the trace ids a watch remembers.
const maxTraced = 4096

func (t *Tracer) watchKernel(ctx context.Context, wg *sync.WaitGroup, p traceflow.Probe, emit func(traceflow.WatchEvent) error) error {
	tb := observe.ProbeTable(observe.NewTableName(p.Tag, time.Now()),
		observe.ProbeMatch{Tag: p.Tag, Src: p.Src, Proto: p.ProtoNumber(), SrcPort: p.SrcPort})
	mon, stop, err := t.startTrace(ctx, tb)
	if err != nil {
		return err
	}
	defer stop()
	targets, err := t.localTargets(p)
	if err != nil {
		return err
	}
	delivered := make(chan delivery, len(targets))
	if err := capture(ctx, p, targets, delivered, wg); err != nil {
		return err
	}
	events := make(chan observe.Event, 64)
	wg.Go(func() { t.traceEvents(ctx, mon, tb, events) })
	if err := emit(traceflow.WatchEvent{Ready: true}); err != nil {
		return err
	}
	k := kernelPath{t: t, p: p}
	// A capture sees the probe before nft monitor has printed the hooks it
	// crossed here: the delivery is held until the node's trace saw the
	// probe leave towards the pod (so the node's report is whole when the
	// controller reads its outcome), or deliveryWait passed.
	var (
		held  *delivery
		left  bool
		waitC <-chan time.Time
	)
	deliver := func() error {
		if err := emitAll(emit, k.flush()); err != nil {
			return err
		}
		err := emit(traceflow.WatchEvent{Observation: new(t.deliveryObs(p, held.target, held.target.ns.Iface, held.seen)), Outcome: traceflow.Delivered})
		held, waitC = nil, nil
		return err
	}
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("node %s: %w", t.Name, mon.Err())
			}
			evs := k.add(ev)
			left = left || slices.ContainsFunc(evs, func(we traceflow.WatchEvent) bool { return we.Left })
			if err := emitAll(emit, evs); err != nil {
				return err
			}
			if held != nil && left {
				if err := deliver(); err != nil {
					return err
				}
			}
		case d := <-delivered:
			held = &d
			if left {
				if err := deliver(); err != nil {
					return err
				}
			} else {
				waitC = time.After(deliveryWait)
			}
		case <-waitC:
			if err := deliver(); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// deliveryWait caps how long a captured delivery waits for the node's
// trace of the probe leaving towards the pod.
const deliveryWait = time.Second

// kernelPath turns one node's trace events of one probe into observations.
type kernelPath struct {
	t *Tracer
	p traceflow.Probe
	// lb is a load-balancing observation held until the probe leaves the
	// node, when conntrack has the translation; held are the events after
	// it, kept back so the path stays in hook order.
	lb   *traceflow.Observation
	held []traceflow.WatchEvent
}

func (k *kernelPath) obs(o traceflow.Observation) traceflow.WatchEvent {
	o.Node = k.t.Name
	return traceflow.WatchEvent{Observation: &o}
}

// add returns the watch events of trace event ev (none while a
// load-balancing observation waits for conntrack).
func (k *kernelPath) add(ev observe.Event) []traceflow.WatchEvent {
	// A DNAT through a map names no one endpoint: the packet's headers
	// after it do (conntrack, when the probe leaves, has the last word).
	if k.lb != nil && !k.lb.TranslatedDst.IsValid() && ev.Kind == observe.KindPacket && ev.Dst.IsValid() &&
		(ev.Dst != k.p.Dst || ev.DstPort != k.p.DstPort) {
		k.lb.TranslatedDst = netip.AddrPortFrom(ev.Dst, ev.DstPort)
	}
	out := k.events(ev)
	if k.lb != nil {
		k.held = append(k.held, out...)
		return nil
	}
	return out
}

func (k *kernelPath) events(ev observe.Event) []traceflow.WatchEvent {
	switch {
	case strings.HasPrefix(ev.Table, observe.TablePrefix):
		switch {
		case ev.Chain == observe.ChainPre && ev.Kind == observe.KindPacket:
			return []traceflow.WatchEvent{k.obs(traceflow.Observation{Component: traceflow.Forwarding, Action: traceflow.ActionReceived, Interface: ev.IIf})}
		case ev.Chain == observe.ChainPost && ev.Kind == observe.KindPacket:
			o := traceflow.Observation{Component: traceflow.Forwarding, Action: traceflow.ActionForwarded, Interface: ev.OIf}
			if ev.Src.IsValid() && ev.Src != k.p.Src {
				o.TranslatedSrc = netip.AddrPortFrom(ev.Src, ev.SrcPort)
			}
			left := k.obs(o)
			left.Left = true
			return append(k.flush(), left)
		}
	case ev.Kind == observe.KindPacket && ev.Chain == "forward":
		o := traceflow.Observation{Component: traceflow.Routing, Action: traceflow.ActionForwarded, Interface: ev.OIf}
		if ev.Dst.IsValid() && ev.Dst != k.p.Dst {
			o.TranslatedDst = netip.AddrPortFrom(ev.Dst, ev.DstPort)
		}
		return []traceflow.WatchEvent{k.obs(o)}
	case ev.Kind == observe.KindRule:
		return k.rule(ev)
	}
	return nil
}

// flush returns the held load-balancing observation, with the node's
// conntrack view of the translation.
func (k *kernelPath) flush() []traceflow.WatchEvent {
	if k.lb == nil {
		return nil
	}
	o := *k.lb
	held := k.held
	k.lb, k.held = nil, nil
	if ct, ok := k.t.conntrackOf(k.p); ok {
		if ct.DstNAT.IsValid() {
			o.TranslatedDst = ct.DstNAT
		}
		if ct.SrcNAT.IsValid() {
			o.TranslatedSrc = ct.SrcNAT
		}
		o.Detail = strings.TrimSpace(o.Detail + " (conntrack: " + ct.Text + ")")
	}
	return append([]traceflow.WatchEvent{k.obs(o)}, held...)
}

// rule handles a rule line: a DNAT of a Service, a policy verdict, a drop.
//
// Names come from what the node's rules say: kube-proxy-style DNAT rules
// ("dnat to ADDR:PORT", comment "endpoint ADDR:PORT of ns/name/port"),
// policy rules named "ns/policy/direction/index" (counter name or comment)
// in chains "ingress/…" and "egress/…", and the isolation drop rule of a
// pod, "drop/direction/ns/pod" (the controller names the policies that
// isolate the pod from the cluster's view).
func (k *kernelPath) rule(ev observe.Event) []traceflow.WatchEvent {
	comment, _ := observe.Quoted(ev.Rule, "comment")
	if dst, ok := observe.DNATTarget(ev.Rule); ok {
		o := traceflow.Observation{Node: k.t.Name, Component: traceflow.LoadBalancing, Action: traceflow.ActionForwarded,
			Service: k.p.Service, TranslatedDst: dst, Detail: comment}
		if o.Service == "" {
			o.Service = serviceOfComment(comment)
		}
		k.lb = &o
		return nil
	}
	dir, isPolicyChain := policyChain(ev.Chain)
	name := ruleName(ev.Rule, comment)
	switch ev.Verdict {
	case "accept":
		if isPolicyChain {
			return []traceflow.WatchEvent{k.obs(traceflow.Observation{Component: traceflow.NetworkPolicy, Action: traceflow.ActionForwarded,
				Policy: PolicyOfRule(name), Rule: name, Detail: dir})}
		}
	case "drop":
		o := traceflow.Observation{Component: traceflow.Forwarding, Action: traceflow.ActionDropped, Detail: comment}
		out := traceflow.WatchEvent{Outcome: traceflow.Dropped}
		switch {
		case strings.Contains(ev.Rule, " reject"):
			o.Action = traceflow.ActionRejected
			out.Outcome, out.Reason = traceflow.Rejected, "rejected by "+cmp.Or(comment, ev.Rule)
			if strings.Contains(comment, "no endpoints") || strings.Contains(ev.Rule, "no endpoints") {
				o.Component = traceflow.LoadBalancing
			} else {
				o.Rule = ev.Chain // the controller may name the policy (default case)
				o.Detail = fmt.Sprintf("rule %q in %s %s", strings.TrimSpace(cmp.Or(comment, ev.Rule)), ev.Table, ev.Chain)
			}
		case strings.HasPrefix(name, "drop/"):
			o.Component, o.Rule = traceflow.NetworkPolicy, name
			o.Detail = "no rule of the isolating policies allows it"
			out.Reason = fmt.Sprintf("dropped by NetworkPolicy rule %s on %s", name, k.t.Name)
		case isPolicyChain:
			o.Component, o.Rule, o.Policy = traceflow.NetworkPolicy, name, PolicyOfRule(name)
			out.Reason = fmt.Sprintf("dropped by NetworkPolicy rule %s on %s", name, k.t.Name)
		default:
			// Another implementation's rule (kube-router's pod firewall
			// chains, say): the controller may name the policy from the
			// cluster's view (agent.PolicyNamer).
			o.Rule = ev.Chain
			o.Detail = fmt.Sprintf("rule %q in %s %s", strings.TrimSpace(cmp.Or(comment, ev.Rule)), ev.Table, ev.Chain)
			out.Reason = fmt.Sprintf("dropped on %s by rule %q in chain %s", k.t.Name, strings.TrimSpace(cmp.Or(comment, ev.Rule)), ev.Chain)
		}
		o.Node = k.t.Name
		out.Observation = &o
		return append(k.flush(), out)
	}
	return nil
}

// policyChain reports whether chain is a per-pod policy chain
// ("ingress/ns/pod", "egress/ns/pod") and its direction.
func policyChain(chain string) (string, bool) {
	for _, d := range []string{"ingress", "egress"} {
		if strings.HasPrefix(chain, d+"/") {
			return d, true
		}
	}
	return "", false
}

// ruleName is the rule's counter name, else its comment.
func ruleName(rule, comment string) string {
	if n, ok := observe.Quoted(rule, "counter name"); ok {
		return n
	}
	return comment
}

// PolicyOfRule maps a policy rule name "ns/name/ingress/0" to "ns/name".
func PolicyOfRule(rule string) string {
	f := strings.Split(rule, "/")
	if len(f) == 4 && f[0] != "drop" {
		return f[0] + "/" + f[1]
	}
	return ""
}

// IsolationOfRule maps an isolation drop rule "drop/ingress/ns/pod" to its
// direction and pod.
func IsolationOfRule(rule string) (direction, namespace, pod string, ok bool) {
	f := strings.Split(rule, "/")
	if len(f) != 4 || f[0] != "drop" || (f[1] != "ingress" && f[1] != "egress") {
		return "", "", "", false
	}
	return f[1], f[2], f[3], true
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
