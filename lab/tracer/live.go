package tracer

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
	"github.com/dualflow/dualflow/traceflow/packet"
)

// Live traffic (kernel datapath): every node traces the first packet of
// each new connection from the source pod (observe.LiveRules). On the
// source node the first one whose destination (before DNAT) and port are
// the requested ones is chosen; on the other nodes the packets of the same
// connection (source port and translated destination) follow it. Delivery
// is the packet leaving a node towards a pod's veth.

// liveGroup is one packet's pass through one node's hooks.
type liveGroup struct {
	node string
	pre  observe.Event // this table's pre packet line
	evs  []observe.Event
}

func (g *liveGroup) fwdDst() (netip.Addr, uint16, bool) {
	for _, e := range g.evs {
		if e.Kind == observe.KindPacket && e.Chain == "forward" && e.Table != g.pre.Table {
			return e.Dst, e.DstPort, true
		}
	}
	return netip.Addr{}, 0, false
}

func (t *Tracer) traceLive(ctx context.Context, p traceflow.Probe, src *corev1.Pod) (traceflow.Path, error) {
	nodes := make([]string, 0, len(t.inv.M.Nodes))
	for i := range t.inv.M.Nodes {
		nodes = append(nodes, t.inv.M.Nodes[i].Name)
	}
	events := make(chan nodeEvent, 256)
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(done)
		wg.Wait()
	}()
	rules := observe.LiveRules(p.Tag, p.Src, p.ProtoNumber())
	mons := make([]*observe.Monitor, len(nodes))
	errs := make([]error, len(nodes))
	var setup sync.WaitGroup
	for i, n := range nodes {
		setup.Go(func() { mons[i], errs[i] = t.watchNode(ctx, n, p.Tag, rules, events, done, &wg) })
	}
	setup.Wait()
	defer t.cleanup(nodes, mons, p.Tag)
	if err := errors.Join(errs...); err != nil {
		return traceflow.Path{}, err
	}

	podByIface := map[string]*corev1.Pod{} // node/iface -> pod
	for i := range t.inv.M.Pods {
		pd := &t.inv.M.Pods[i]
		podByIface[pd.Spec.NodeName+"/"+pd.Annotations[manifest.AnnotationHostIface]] = pd
	}
	table := observe.TableName(p.Tag)
	srcNode := src.Spec.NodeName
	var (
		c       *collector
		chosen  *liveGroup
		cur     = map[string]*liveGroup{} // node/id -> the packet being traced there
		follow  = map[*liveGroup]bool{}   // groups fed into c
		skipped int                       // delivered connections skipped (droppedOnly)
		settleC <-chan time.Time
	)
	reset := func() {
		c = &collector{p: p, t: t, srcNode: srcNode}
		chosen = nil
		clear(follow)
	}
	reset()
	feed := func(g *liveGroup, e observe.Event) {
		c.add(nodeEvent{node: g.node, ev: e})
		if e.Table == table && e.Chain == observe.ChainPost && e.Kind == observe.KindPacket {
			if pd, ok := podByIface[g.node+"/"+e.OIf]; ok {
				c.deliver(delivery{pod: pd, seen: seenOf(e)})
			}
		}
	}
	// attach feeds the groups of other nodes that belong to the chosen
	// connection.
	attach := func() {
		dst, dport, ok := chosen.fwdDst()
		if !ok {
			return
		}
		for _, g := range cur {
			if follow[g] || g.node == srcNode || g.pre.Src != p.Src || g.pre.Dst != dst {
				continue
			}
			if (p.Protocol == traceflow.TCP || p.Protocol == traceflow.UDP) && (g.pre.SrcPort != chosen.pre.SrcPort || g.pre.DstPort != dport) {
				continue
			}
			follow[g] = true
			for _, e := range g.evs {
				feed(g, e)
			}
		}
	}
	for {
		select {
		case ne := <-events:
			key := ne.node + "/" + ne.ev.ID
			if ne.ev.Table == table && ne.ev.Chain == observe.ChainPre && ne.ev.Kind == observe.KindPacket {
				cur[key] = &liveGroup{node: ne.node, pre: ne.ev}
			}
			g := cur[key]
			if g == nil {
				continue
			}
			g.evs = append(g.evs, ne.ev)
			if chosen == nil && g.node == srcNode && len(g.evs) == 1 && matchesDst(p, g.pre) {
				chosen = g
				c.p.SrcPort = g.pre.SrcPort
			}
			if follow[g] || g == chosen {
				if !follow[g] {
					follow[g] = true
				}
				feed(g, ne.ev)
			}
			if chosen != nil {
				attach()
			}
		case <-settleC:
			if c.outcome == traceflow.Delivered && p.DroppedOnly {
				skipped++
				reset()
				settleC = nil
				continue
			}
			path := c.path(context.Background())
			path.SrcPort = c.p.SrcPort
			if skipped > 0 {
				path.Reason = fmt.Sprintf("%s (after %d delivered connections)", path.Reason, skipped)
			}
			return path, nil
		case <-ctx.Done():
			path := c.path(context.Background())
			path.Outcome = traceflow.TimedOut
			if chosen == nil {
				what := "new connection"
				if p.DroppedOnly {
					what = "dropped connection"
				}
				path.Reason = fmt.Sprintf("no %s from %s to %s port %d seen before the timeout (%d delivered skipped)", what, p.SourcePod, p.Dst, p.DstPort, skipped)
			} else {
				path.Reason = c.timeoutReason(ctx)
			}
			return path, nil
		}
		if settleC == nil && c.outcome != "" {
			settleC = time.After(settle)
		}
	}
}

// matchesDst reports whether a packet seen entering the source node is a
// connection to the probe's destination (before DNAT), from its source port
// when one was requested.
func matchesDst(p traceflow.Probe, pre observe.Event) bool {
	if pre.Src != p.Src || pre.Dst != p.Dst {
		return false
	}
	if p.Protocol == traceflow.TCP || p.Protocol == traceflow.UDP {
		return pre.DstPort == p.DstPort && (p.SrcPort == 0 || pre.SrcPort == p.SrcPort)
	}
	return true
}

// seenOf is what a delivery reports for the packet line e.
func seenOf(e observe.Event) packet.Seen {
	return packet.Seen{Src: e.Src, Dst: e.Dst, SrcPort: e.SrcPort, DstPort: e.DstPort}
}
