package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/inject"
	"github.com/dualflow/dualflow/traceflow/observe"
	"github.com/dualflow/dualflow/traceflow/packet"
	"github.com/dualflow/dualflow/traceflow/podns"
)

// Tracer is a node's side of traceflow (the agent the exporter serves): it
// injects probes from the node's pods and watches for them on the node's
// own datapath only. A controller that merges what every node saw into one
// path is in package traceflow/agent.
//
// The kernel datapath is observed with an nftables trace table per watch
// (programmed over netlink, at most loadSlots loads at once, removed when
// the watch ends and swept every sweepInterval if that failed; traced by
// `nft monitor` in the node's namespace), conntrack for the DNAT a
// Service applied, and an AF_PACKET capture at each local pod the probe
// may reach. The OVS datapath with drop flows' packet-ins,
// `ofproto/trace` and the same captures.
//
// It is safe for concurrent use; concurrent probes carry distinct tags
// (the controller's job).
type Tracer struct {
	// Name is the node's name, in every observation.
	Name string
	// NetNS is the node's network namespace ("" is the caller's, as for an
	// agent in a hostNetwork pod).
	NetNS string
	// NFT is the nft binary (the kernel datapath).
	NFT string
	// Pods finds the node's pods by address (nil: a Finder of the default
	// runtime directories and /proc).
	Pods *podns.Finder
	// OVS, when set, selects the Open vSwitch datapath.
	OVS *OVS
	// Logger logs the traces (nil: slog.Default()).
	Logger *slog.Logger
	// Raw, when set, receives every `nft monitor` line, and on OVS the
	// monitor's lines and the ofproto/trace output (debugging).
	Raw io.Writer

	once      sync.Once
	hub       *monitorHub   // the node's shared nft monitor
	tables    tableOps      // the trace tables (netlink; a fake in tests)
	slots     chan struct{} // loadSlots: table loads at once
	stopSweep chan struct{} // closed by Close: ends sweepEvery
	swept     chan struct{} // closed when sweepEvery returned
	closeOnce sync.Once

	mu     sync.Mutex
	active map[string]bool // trace tables of the watches running
}

func (t *Tracer) init() {
	t.once.Do(func() {
		if t.Pods == nil {
			t.Pods = &podns.Finder{}
		}
		t.Logger = cmp.Or(t.Logger, slog.Default())
		if t.tables == nil {
			t.tables = netlinkTables{}
		}
		t.hub = &monitorHub{start: func() (*observe.Monitor, error) { return observe.StartMonitor(t.nodeNS(), t.NFT) }, canary: t.canary}
		t.slots = make(chan struct{}, loadSlots)
		t.active = map[string]bool{}
		t.stopSweep, t.swept = make(chan struct{}), make(chan struct{})
		if t.NFT == "" || t.OVS != nil {
			close(t.swept) // no trace tables: nothing to sweep
			return
		}
		go func() {
			defer close(t.swept)
			t.sweepEvery(sweepInterval, t.stopSweep)
		}()
	})
}

// Close stops what the tracer keeps between traces: the node's nft
// monitor, which lingers a while after the last watch, and the sweep of
// trace tables.
func (t *Tracer) Close() error {
	t.init()
	t.closeOnce.Do(func() { close(t.stopSweep) })
	<-t.swept
	t.hub.close()
	return nil
}

func (t *Tracer) nodeNS() string {
	if t.NetNS == "" {
		return "/proc/self/ns/net"
	}
	return t.NetNS
}

func (t *Tracer) injector() *Injector { return &Injector{Pods: t.Pods, NodeNS: t.NetNS} }

// Inject sends p from its source pod, which must be on this node
// (ErrPodNotOnNode otherwise).
func (t *Tracer) Inject(ctx context.Context, p traceflow.Probe) error {
	t.init()
	p = normalize(p)
	if p.Live {
		return fmt.Errorf("%w: a live trace sends nothing", traceflow.ErrInvalid)
	}
	from, err := t.injector().Locate(p.Src)
	if err != nil {
		return fmt.Errorf("pod %s: %w", p.SourcePod, err)
	}
	frame, err := from.Frame(p)
	if err != nil {
		return fmt.Errorf("%w: %v", traceflow.ErrInvalid, err)
	}
	return from.Send(frame)
}

// maxTargets bounds the targets a watch captures at (a Service's
// endpoints on one node; the request's body could list thousands).
const maxTargets = 256

// normalize unmaps the probe's addresses (an IPv4-mapped IPv6 address is
// the IPv4 address) and drops duplicate targets.
func normalize(p traceflow.Probe) traceflow.Probe {
	p.Src, p.Dst = p.Src.Unmap(), p.Dst.Unmap()
	seen := map[netip.Addr]bool{}
	var tgs []traceflow.Target
	for _, tg := range p.Targets {
		tg.Addr = tg.Addr.Unmap()
		if seen[tg.Addr] {
			continue
		}
		seen[tg.Addr] = true
		tgs = append(tgs, tg)
	}
	p.Targets = tgs
	return p
}

// Watch observes p on this node until ctx ends, calling emit with a Ready
// event once every observer is in place (the probe may be sent then), and
// with what the node sees of the probe afterwards. It returns when ctx
// ends (nil) or when watching fails or emit fails (the caller went away).
func (t *Tracer) Watch(ctx context.Context, p traceflow.Probe, emit func(traceflow.WatchEvent) error) error {
	t.init()
	p = normalize(p)
	if len(p.Targets) > maxTargets {
		return fmt.Errorf("%w: %d targets (at most %d)", traceflow.ErrInvalid, len(p.Targets), maxTargets)
	}
	if !p.Src.IsValid() || !p.Dst.IsValid() || p.Src.Is4() != p.Dst.Is4() {
		return fmt.Errorf("%w: probe %s -> %s", traceflow.ErrInvalid, p.Src, p.Dst)
	}
	if p.Tag < packet.MinTag || p.Tag > packet.MaxTag {
		return fmt.Errorf("%w: tag %d (want %d..%d)", traceflow.ErrInvalid, p.Tag, packet.MinTag, packet.MaxTag)
	}
	if t.OVS != nil && p.Live {
		return fmt.Errorf("live traffic on the OVS datapath: %w", traceflow.ErrNotSupported)
	}
	// The watch's goroutines (captures, trace readers) end with ctx; the
	// watch's own deferred teardown runs first.
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	switch {
	case t.OVS != nil:
		return t.watchOVS(ctx, &wg, p, emit)
	case p.Live:
		return t.watchLive(ctx, &wg, p, emit)
	}
	return t.watchKernel(ctx, &wg, p, emit)
}

// localTarget is a target pod of the probe hosted on this node.
type localTarget struct {
	traceflow.Target
	ns   podns.Namespace
	host string // the node side of its veth
}

// localTargets returns the probe's targets that are pods of this node.
func (t *Tracer) localTargets(p traceflow.Probe) ([]localTarget, error) {
	var out []localTarget
	for _, tg := range p.Targets {
		if !tg.Addr.IsValid() || tg.Addr.Is4() != p.Src.Is4() {
			continue
		}
		ns, pr, err := t.injector().find(tg.Addr)
		if errors.Is(err, ErrPodNotOnNode) {
			continue
		}
		if err != nil {
			// One target this node cannot capture at must not fail the
			// trace: the others, and the other nodes, still report.
			t.Logger.Warn("traceflow: no capture at a target", "node", t.Name, "target", tg.Addr, "err", err)
			continue
		}
		out = append(out, localTarget{Target: tg, ns: ns, host: pr.Name})
	}
	return out, nil
}

// delivery is a probe captured at a local target pod.
type delivery struct {
	target localTarget
	seen   packet.Seen
}

// capture listens at each target's interface until ctx ends and sends the
// first packet of the probe each one sees to out.
func capture(ctx context.Context, p traceflow.Probe, targets []localTarget, out chan<- delivery, wg *sync.WaitGroup) error {
	proto := p.ProtoNumber()
	for _, tg := range targets {
		c, err := inject.Listen(tg.ns.Path, tg.ns.Iface)
		if err != nil {
			return fmt.Errorf("capture at %s: %w", tg.Addr, err)
		}
		wg.Go(func() {
			defer c.Close()
			for {
				f, err := c.Next(ctx)
				if err != nil {
					return
				}
				if seen, ok := packet.Match(f, p.Tag, p.Src, proto, p.SrcPort); ok {
					select {
					case out <- delivery{target: tg, seen: seen}:
					case <-ctx.Done():
					}
					return
				}
			}
		})
	}
	return nil
}

// deliveryObs is the observation of p delivered to local target tg, seen
// at iface (a capture in the pod, or the node side of its veth) with
// addresses seen, after any NAT.
func (t *Tracer) deliveryObs(p traceflow.Probe, tg localTarget, iface string, seen packet.Seen) traceflow.Observation {
	o := traceflow.Observation{Node: t.Name, Component: traceflow.Delivery, Action: traceflow.ActionDelivered,
		Interface: iface, Pod: tg.Pod}
	if seen.Dst.IsValid() && (seen.Dst != p.Dst || seen.DstPort != p.DstPort) {
		o.TranslatedDst = netip.AddrPortFrom(seen.Dst, seen.DstPort)
	}
	if seen.Src.IsValid() && seen.Src != p.Src {
		o.TranslatedSrc = netip.AddrPortFrom(seen.Src, seen.SrcPort)
	}
	if o.Pod == "" {
		o.Detail = "delivered to the pod holding " + tg.Addr.String()
	}
	return o
}

// emitAll emits evs in order, stopping at the first error.
func emitAll(emit func(traceflow.WatchEvent) error, evs []traceflow.WatchEvent) error {
	for _, ev := range evs {
		if err := emit(ev); err != nil {
			return err
		}
	}
	return nil
}
