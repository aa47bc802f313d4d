package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dualflow/dualflow/nsrun"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
)

// cleanupTimeout bounds removing a trace table after a trace.
const cleanupTimeout = 2 * time.Second

// conntrackWait bounds waiting for the conntrack entry of a probe that a
// Service rule translated (the entry is confirmed as the packet leaves).
const conntrackWait = 100 * time.Millisecond

// startTrace starts `nft monitor` in the node's namespace, loads the trace
// table rules and waits until the monitor echoes them, so the monitor is
// subscribed before the probe is sent. The caller must call the returned
// stop function.
func (t *Tracer) startTrace(ctx context.Context, tag uint8, rules string) (*monitorSub, func(), error) {
	if t.NFT == "" {
		return nil, nil, fmt.Errorf("%w: no nft binary (the kernel datapath needs nftables)", traceflow.ErrNotSupported)
	}
	ns := t.nodeNS()
	mon, confirmed, err := t.hub.subscribe()
	if err != nil {
		return nil, nil, err
	}
	// handle is the trace table's as last loaded, and stop removes that
	// table only: the controller frees a tag as soon as its trace returns,
	// maybe before this watch has cleaned up, and removing the table by
	// name could then remove the next trace's table of the same tag.
	var handle string
	stop := func() {
		mon.Close()
		cctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		del := observe.DeleteTable(tag)
		if handle != "" {
			del = "delete table inet handle " + handle + "\n"
		}
		_, err := nsrun.Output(cctx, ns, []byte(del), t.NFT, "-f", "-")
		// No such table: the next trace of the tag replaced it.
		if err != nil && (handle == "" || !strings.Contains(err.Error(), "No such file or directory")) {
			t.Logger.Warn("traceflow: remove trace table", "table", observe.TableName(tag), "err", err)
		}
	}
	// A monitor just started subscribes some time later: load the table
	// until the monitor echoes it (loading is idempotent). One known to be
	// subscribed echoes the first load, however late on a loaded node: no
	// reload then (each is an nft process, the expensive part of a watch).
	echo := "add rule inet " + observe.TableName(tag) + " " + observe.ChainPost + " "
	wait := 20 * time.Millisecond
	if confirmed {
		wait = time.Hour // bounded by ctx
	}
	for ; ; wait = min(2*wait, max(wait, time.Second)) {
		out, err := nsrun.Output(ctx, ns, []byte(rules), t.NFT, "--echo", "--handle", "-f", "-")
		if err != nil {
			stop()
			return nil, nil, fmt.Errorf("load trace table: %w", err)
		}
		handle = tableHandle(string(out), observe.TableName(tag))
		wctx, cancel := context.WithTimeout(ctx, wait)
		_, err = mon.WaitFor(wctx, echo)
		cancel()
		if err == nil {
			t.hub.confirm(mon)
			return mon, stop, nil
		}
		if ctx.Err() != nil {
			stop()
			return nil, nil, fmt.Errorf("nft monitor not subscribed: %w", ctx.Err())
		}
		if errors.Is(err, errMonitorExited) {
			stop()
			return nil, nil, fmt.Errorf("nft monitor of node %s: %w", t.Name, err)
		}
	}
}

// RemoveStaleTables deletes the trace tables a previous agent of this node
// left behind (killed in the middle of a watch): a live trace's table
// would keep tracing every new connection of its pod. Call it before
// serving.
func (t *Tracer) RemoveStaleTables(ctx context.Context) error {
	t.init()
	if t.NFT == "" || t.OVS != nil {
		return nil
	}
	out, err := nsrun.Output(ctx, t.nodeNS(), nil, t.NFT, "list", "tables")
	if err != nil {
		return fmt.Errorf("nft list tables: %w", err)
	}
	var del strings.Builder
	for l := range strings.Lines(string(out)) {
		f := strings.Fields(l)
		if len(f) == 3 && f[0] == "table" && f[1] == "inet" && strings.HasPrefix(f[2], observe.TablePrefix) {
			fmt.Fprintf(&del, "delete table inet %s\n", f[2])
		}
	}
	if del.Len() == 0 {
		return nil
	}
	t.Logger.Info("traceflow: removing trace tables a previous agent left", "node", t.Name, "tables", strings.Count(del.String(), "\n"))
	if _, err := nsrun.Output(ctx, t.nodeNS(), []byte(del.String()), t.NFT, "-f", "-"); err != nil {
		return fmt.Errorf("remove stale trace tables: %w", err)
	}
	return nil
}

// tableHandle returns the handle of table in `nft --echo --handle` output
// ("add table inet NAME # handle 12"), or "" when it is not there.
func tableHandle(out, table string) string {
	for l := range strings.Lines(out) {
		if h, ok := strings.CutPrefix(strings.TrimSpace(l), "add table inet "+table+" # handle "); ok {
			if _, err := strconv.ParseUint(h, 10, 64); err == nil {
				return h
			}
		}
	}
	return ""
}

// traceEvents filters the monitor's lines down to the trace events of the
// probe of tag and sends them to out until ctx ends.
//
// Once a probe's nftrace is set, every table traces it, the other probes'
// trace tables included; and the kernel reuses trace ids. A packet is this
// probe's when the rule of this probe's pre chain matched it (only that
// rule can); events of other trace tables are skipped.
//
// It closes out when the monitor exits (the watch then fails: it would
// see nothing more) and returns, without closing out, when ctx ends.
func (t *Tracer) traceEvents(ctx context.Context, mon *monitorSub, tag uint8, out chan<- observe.Event) {
	table := observe.TableName(tag)
	mine := map[string]bool{}             // trace id -> belongs to this probe
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
			fmt.Fprintf(t.Raw, "probe %d %s: %s\n", tag, t.Name, l)
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

func (t *Tracer) watchKernel(ctx context.Context, p traceflow.Probe, emit func(traceflow.WatchEvent) error) error {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	match := observe.ProbeMatch{Tag: p.Tag, Src: p.Src, Proto: p.ProtoNumber(), SrcPort: p.SrcPort}
	mon, stop, err := t.startTrace(ctx, p.Tag, observe.TableRules(match))
	if err != nil {
		return err
	}
	defer stop()
	targets, err := t.localTargets(p)
	if err != nil {
		return err
	}
	delivered := make(chan delivery, len(targets))
	if err := capture(ctx, p, targets, delivered, &wg); err != nil {
		return err
	}
	events := make(chan observe.Event, 64)
	wg.Go(func() { t.traceEvents(ctx, mon, p.Tag, events) })
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
		err := emit(traceflow.WatchEvent{Observation: ptr(t.deliveryObs(p, *held)), Outcome: traceflow.Delivered})
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

func ptr[T any](v T) *T { return &v }

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
			out.Outcome, out.Reason = traceflow.Rejected, "rejected by "+cmpOr(comment, ev.Rule)
			if strings.Contains(comment, "no endpoints") || strings.Contains(ev.Rule, "no endpoints") {
				o.Component = traceflow.LoadBalancing
			}
		case strings.HasPrefix(name, "drop/"):
			o.Component, o.Rule = traceflow.NetworkPolicy, name
			o.Detail = "no rule of the isolating policies allows it"
			out.Reason = fmt.Sprintf("dropped by NetworkPolicy rule %s on %s", name, k.t.Name)
		case isPolicyChain:
			o.Component, o.Rule, o.Policy = traceflow.NetworkPolicy, name, PolicyOfRule(name)
			out.Reason = fmt.Sprintf("dropped by NetworkPolicy rule %s on %s", name, k.t.Name)
		default:
			out.Reason = fmt.Sprintf("dropped on %s by rule %q in chain %s", k.t.Name, cmpOr(comment, ev.Rule), ev.Chain)
		}
		o.Node = k.t.Name
		out.Observation = &o
		return append(k.flush(), out)
	}
	return nil
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
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
