package node

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
	"github.com/dualflow/dualflow/traceflow/packet"
)

// Live traffic (kernel datapath). A live trace sends nothing: the trace
// table of every watching node traces the first packet of each new
// connection of the source pod (observe.LiveTable: a TCP SYN, an echo
// request, any UDP datagram), and each node reports each such packet's
// pass through its hooks as one group of events keyed by the connection's
// source port (WatchEvent.Conn). The source node reports only the packets
// sent to the requested destination (before DNAT) and announces each one's
// connection (WatchEvent.SrcPort); the other nodes report every packet,
// and the controller keeps the events of the connection it picks.

// maxLiveGroups caps the packets a live watch follows at once (trace ids
// whose events may still come) and the UDP flows it remembers as reported;
// the oldest are forgotten first. A packet crosses a node's hooks within
// microseconds, so only more new connections than this in that time lose
// one; the cap keeps a pod that opens connections by the thousand from
// growing the watch without bound.
const maxLiveGroups = 256

// watchLive is Watch for a live probe on the kernel datapath.
func (t *Tracer) watchLive(ctx context.Context, wg *sync.WaitGroup, p traceflow.Probe, emit func(traceflow.WatchEvent) error) error {
	_, err := t.injector().Locate(p.Src)
	source := err == nil
	if err != nil && !errors.Is(err, ErrPodNotOnNode) {
		return fmt.Errorf("pod %s: %w", p.SourcePod, err)
	}
	tb := observe.LiveTable(observe.NewTableName(p.Tag, time.Now()), p.Src, p.ProtoNumber())
	mon, stop, err := t.startTrace(ctx, tb)
	if err != nil {
		return err
	}
	defer stop()
	targets, err := t.localTargets(p)
	if err != nil {
		return err
	}
	events := make(chan observe.Event, 64)
	wg.Go(func() { t.traceEvents(ctx, mon, tb, events) })
	if err := emit(traceflow.WatchEvent{Ready: true}); err != nil {
		return err
	}
	l := newLiveNode(t, p, tb.Name, source, targets)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return fmt.Errorf("node %s: %w", t.Name, mon.Err())
			}
			if err := emitAll(emit, l.add(ev)); err != nil {
				return err
			}
		case <-ctx.Done():
			return nil
		}
	}
}

// liveNode turns one node's trace events of a live probe into watch
// events. It is not safe for concurrent use.
type liveNode struct {
	t       *Tracer
	p       traceflow.Probe
	table   string
	source  bool                   // the source pod is on this node
	targets map[string]localTarget // by the node side of the veth
	groups  recent[string, *liveGroup]
	flows   recent[uint16, struct{}] // UDP connections reported (every datagram is traced)
}

// liveGroup is one packet's pass through this node's hooks (one trace id).
type liveGroup struct {
	conn uint16
	k    kernelPath
}

func newLiveNode(t *Tracer, p traceflow.Probe, table string, source bool, targets []localTarget) *liveNode {
	l := &liveNode{t: t, p: p, table: table, source: source, targets: map[string]localTarget{},
		groups: newRecent[string, *liveGroup](maxLiveGroups), flows: newRecent[uint16, struct{}](maxLiveGroups)}
	for _, tg := range targets {
		l.targets[tg.host] = tg
	}
	return l
}

// add returns the watch events of trace event ev (from traceEvents: a
// packet's events start with this table's pre packet line).
func (l *liveNode) add(ev observe.Event) []traceflow.WatchEvent {
	var out []traceflow.WatchEvent
	if ev.Table == l.table && ev.Chain == observe.ChainPre && ev.Kind == observe.KindPacket {
		g := l.start(ev)
		if g == nil {
			l.groups.delete(ev.ID) // the kernel reuses trace ids
			return nil
		}
		l.groups.put(ev.ID, g)
		if l.source {
			out = append(out, traceflow.WatchEvent{SrcPort: g.conn})
		}
	}
	g, ok := l.groups.get(ev.ID)
	if !ok {
		return nil
	}
	out = append(out, g.k.add(ev)...)
	if ev.Table == l.table && ev.Chain == observe.ChainPost && ev.Kind == observe.KindPacket {
		if tg, ok := l.targets[ev.OIf]; ok {
			out = append(out, traceflow.WatchEvent{Observation: new(l.t.deliveryObs(l.p, tg, tg.host, packet.Seen{Src: ev.Src, Dst: ev.Dst, SrcPort: ev.SrcPort, DstPort: ev.DstPort})), Outcome: traceflow.Delivered})
		}
	}
	for i := range out {
		out[i].Conn = g.conn
	}
	return out
}

// start returns the group of the packet whose pre packet line is pre, or
// nil when the node does not report it: on the source node, a connection
// to another destination; a UDP flow already reported; a packet without a
// source port or echo id to key it by.
func (l *liveNode) start(pre observe.Event) *liveGroup {
	conn := pre.SrcPort
	if conn == 0 || pre.Src != l.p.Src || (l.source && !matchesDst(l.p, pre)) {
		return nil
	}
	if l.p.Protocol == traceflow.UDP {
		if _, ok := l.flows.get(conn); ok {
			return nil
		}
		l.flows.put(conn, struct{}{})
	}
	// The group's own probe, so the translations (and the conntrack
	// lookup) are against this packet's tuple: on the other nodes the
	// packet arrives already translated by the source node.
	gp := l.p
	gp.SrcPort = conn
	if !l.source {
		gp.Dst, gp.DstPort = pre.Dst, pre.DstPort
	}
	return &liveGroup{conn: conn, k: kernelPath{t: l.t, p: gp}}
}

// matchesDst reports whether a packet seen entering the source node is a
// connection to the probe's destination (before DNAT) and port, from its
// source port (echo id) when one was requested.
func matchesDst(p traceflow.Probe, pre observe.Event) bool {
	return pre.Src == p.Src && pre.Dst == p.Dst && pre.DstPort == p.DstPort &&
		(p.SrcPort == 0 || pre.SrcPort == p.SrcPort)
}

// echoID reads the id of an ICMP or ICMPv6 echo request from its packet
// line, which observe.ParseTrace leaves out: "icmp id 18288", "icmpv6 id
// 18288", or the 32-bit word of id and sequence some nft versions print
// for an ICMPv6 echo ("icmpv6 parameter-problem 1198587905" is id 18289,
// sequence 1).
func echoID(line string) (uint16, bool) {
	f := strings.Fields(line)
	echo := false
	for i := 0; i+2 < len(f); i++ {
		if f[i] != "icmp" && f[i] != "icmpv6" {
			continue
		}
		switch k, v := f[i+1], f[i+2]; {
		case k == "type":
			echo = v == "echo-request"
		case !echo:
		case k == "id":
			if n, err := strconv.ParseUint(v, 10, 16); err == nil {
				return uint16(n), true
			}
		case f[i] == "icmpv6" && (k == "parameter-problem" || k == "mtu"):
			if n, err := strconv.ParseUint(v, 10, 32); err == nil {
				return uint16(n >> 16), true
			}
		}
	}
	return 0, false
}

// recent is a map that forgets its oldest keys beyond max entries.
type recent[K comparable, V any] struct {
	max  int
	m    map[K]V
	keys []K // oldest first
}

func newRecent[K comparable, V any](max int) recent[K, V] {
	return recent[K, V]{max: max, m: map[K]V{}}
}

func (r *recent[K, V]) get(k K) (V, bool) {
	v, ok := r.m[k]
	return v, ok
}

// put sets k to v as the newest key, forgetting the oldest beyond max.
func (r *recent[K, V]) put(k K, v V) {
	r.delete(k)
	r.m[k] = v
	r.keys = append(r.keys, k)
	for len(r.keys) > r.max {
		delete(r.m, r.keys[0])
		r.keys = r.keys[1:]
	}
}

func (r *recent[K, V]) delete(k K) {
	if _, ok := r.m[k]; !ok {
		return
	}
	delete(r.m, k)
	for i, x := range r.keys {
		if x == k {
			r.keys = append(r.keys[:i], r.keys[i+1:]...)
			break
		}
	}
}
