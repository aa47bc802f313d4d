package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dualflow/dualflow/ovs"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
	"github.com/dualflow/dualflow/traceflow/packet"
)

// The OVS datapath has no per-packet trace like nftables'. A node watches
// a probe with
//
//   - the packet-ins of drop flows (`ovs-ofctl monitor`): the real probe
//     dropped on this node, with the drop flow's cookie, named through the
//     rules file (ovs.Rules);
//   - the captures at the local target pods: the real probe delivered;
//   - `ovs-appctl ofproto/trace` of the probe's flow for the path through
//     the bridge's tables: on the source node from the pod's port with the
//     original destination, as soon as the node watches (it needs no real
//     packet); on another node from the uplink with the destination the
//     drop or the delivery showed, once the probe got there;
//   - OVS's conntrack on the source node for the endpoint a Service's
//     select group chose (ofproto/trace cannot know it).

// OVS is the Open vSwitch datapath of a node. The CLIs (ovs-ofctl,
// ovs-appctl) reach ovs-vswitchd through the sockets in RunDir; no OVSDB
// access is needed.
type OVS struct {
	// RunDir is the OVS_RUNDIR of the node's ovs-vswitchd (empty: the
	// CLIs' default, /var/run/openvswitch).
	RunDir string
	// Bridge is the integration bridge (default br-int).
	Bridge string
	// Uplink is the bridge port packets from other nodes enter by
	// (default eth0): the path of a probe sent from another node is traced
	// from there.
	Uplink string
	// RulesFile maps flow cookies to policy rules (ovs.Rules).
	RulesFile string
}

// DefaultUplink is OVS.Uplink's default.
const DefaultUplink = "eth0"

func (o OVS) withDefaults() OVS {
	o.Bridge = cmp.Or(o.Bridge, ovs.DefaultBridge)
	o.Uplink = cmp.Or(o.Uplink, DefaultUplink)
	return o
}

const (
	// ovsMonitorReady is what `ovs-ofctl monitor … watch:` prints once it
	// is subscribed (packet-ins are enabled before the flow monitor
	// request, so they are on by then).
	ovsMonitorReady = "NXST_FLOW_MONITOR reply"
	// ovsWatchTable is the table the monitor watches for flow updates
	// (it must watch one to subscribe): 254 is OVS's hidden internal
	// table, whose few flows are in the initial dump and never change, so
	// the monitor prints no updates.
	ovsWatchTable = 254
	// ovsCommandTimeout bounds one CLI run.
	ovsCommandTimeout = ovs.DefaultCommandTimeout
	// dropBuffer is the probe's drop packet-ins waiting for the watch
	// loop: one per copy the controller sends (agent.DefaultMaxSends). A
	// full buffer blocks the monitor's reader until the watch ends.
	dropBuffer = 4
	// ctPollMin and ctPollMax bound the interval between two looks at the
	// source node's conntrack for the endpoint a Service chose: the first
	// look soon after the probe is sent, then backing off while it has
	// not arrived yet (or went nowhere).
	ctPollMin = 10 * time.Millisecond
	ctPollMax = 250 * time.Millisecond
)

// ovsWatch is one probe watched on one node's bridge.
type ovsWatch struct {
	t      *Tracer
	p      traceflow.Probe
	cfg    OVS // with defaults
	rules  *ovs.Rules
	source bool // the probe's source pod is on this node
}

func (t *Tracer) watchOVS(ctx context.Context, wg *sync.WaitGroup, p traceflow.Probe, emit func(traceflow.WatchEvent) error) error {
	w := &ovsWatch{t: t, p: p, cfg: t.OVS.withDefaults()}
	if f := w.cfg.RulesFile; f != "" {
		rules, err := ovs.LoadRules(f)
		if err != nil {
			return err
		}
		w.rules = rules
	}
	src, err := t.injector().Locate(p.Src)
	switch {
	case err == nil:
		w.source = true
	case !errors.Is(err, ErrPodNotOnNode):
		return fmt.Errorf("source pod %s: %w", p.SourcePod, err)
	}

	drops := make(chan ovs.PacketIn, dropBuffer)
	monExit, err := w.startPacketIns(ctx, drops, wg)
	if err != nil {
		return err
	}
	targets, err := t.localTargets(p)
	if err != nil {
		return err
	}
	delivered := make(chan delivery, len(targets))
	if err := capture(ctx, p, targets, delivered, wg); err != nil {
		return err
	}
	if err := emit(traceflow.WatchEvent{Ready: true}); err != nil {
		return err
	}

	// The source node's path is known before the probe is sent, except
	// for a Service's endpoint: then it is held until the probe's
	// connection shows in conntrack (or the probe reached its outcome on
	// this node). Its last event says the node reported all of it.
	var held []traceflow.Observation
	var poll <-chan time.Time
	pollEvery := ctPollMin
	release := func(obs []traceflow.Observation) error {
		held, poll = nil, nil
		evs := w.events(obs)
		evs[len(evs)-1].Left = true
		return emitAll(emit, evs)
	}
	// flush releases the held path with what conntrack knows by now (the
	// probe was delivered or dropped here: it went through the Service).
	flush := func() error {
		if held == nil {
			return nil
		}
		ct, _ := w.conntrack(ctx)
		return release(w.afterDNAT(ctx, held, src.HostIface, ct))
	}
	if w.source {
		obs := w.ofTrace(ctx, src.HostIface, p.Dst, p.DstPort)
		if slices.ContainsFunc(obs, isLoadBalancing) {
			held, poll = obs, time.After(pollEvery)
		} else if err := release(obs); err != nil {
			return err
		}
	}
	decided := false // this node delivered or dropped the probe
	// decide marks the outcome as this node's and reports the path up to
	// it: the source node's held path, or on another node the trace from
	// the uplink with the destination the probe had when it arrived.
	decide := func(dst netip.Addr, dport uint16) error {
		decided = true
		if err := flush(); err != nil {
			return err
		}
		if w.source {
			return nil
		}
		return emitAll(emit, w.events(w.ofTrace(ctx, w.cfg.Uplink, dst, dport)))
	}
	for {
		select {
		case <-poll:
			if ct, ok := w.conntrack(ctx); ok {
				if err := release(w.afterDNAT(ctx, held, src.HostIface, ct)); err != nil {
					return err
				}
				continue
			}
			pollEvery = min(2*pollEvery, ctPollMax)
			poll = time.After(pollEvery)
		case d := <-delivered:
			if decided {
				continue
			}
			if err := decide(d.seen.Dst, d.seen.DstPort); err != nil {
				return err
			}
			if err := emit(traceflow.WatchEvent{Observation: new(t.deliveryObs(p, d.target, d.target.ns.Iface, d.seen)), Outcome: traceflow.Delivered}); err != nil {
				return err
			}
		case pi := <-drops:
			if decided {
				continue
			}
			if err := decide(pi.Tuple.Dst, pi.Tuple.DstPort); err != nil {
				return err
			}
			o, reason := dropObs(p, t.Name, pi, w.rules)
			if err := emit(traceflow.WatchEvent{Observation: &o, Outcome: traceflow.Dropped, Reason: reason}); err != nil {
				return err
			}
		case err := <-monExit:
			return err // drops would go unseen
		case <-ctx.Done():
			return nil
		}
	}
}

func isLoadBalancing(o traceflow.Observation) bool { return o.Component == traceflow.LoadBalancing }

// afterDNAT completes the source node's path obs, which stops at a
// Service's select group (ofproto/trace cannot pick the bucket the
// datapath's hash picks): the load balancing gets the translation of the
// probe's connection ct (when found), and the rest of the path is
// ofproto/trace of the probe sent to the endpoint from iface.
func (w *ovsWatch) afterDNAT(ctx context.Context, obs []traceflow.Observation, iface string, ct ctView) []traceflow.Observation {
	if ct.Text == "" {
		return obs
	}
	for i := range obs {
		if o := &obs[i]; isLoadBalancing(*o) {
			if ct.DstNAT.IsValid() {
				o.TranslatedDst = ct.DstNAT
			}
			if ct.SrcNAT.IsValid() {
				o.TranslatedSrc = ct.SrcNAT
			}
			o.Detail = strings.TrimSpace(o.Detail + " (conntrack: " + ct.Text + ")")
		}
	}
	if !ct.DstNAT.IsValid() {
		return obs
	}
	flow, rest, err := w.runTrace(ctx, iface, ct.DstNAT.Addr(), ct.DstNAT.Port())
	if err != nil {
		return obs
	}
	rest = slices.DeleteFunc(rest, isLoadBalancing)
	if len(rest) > 0 {
		rest[0].Detail += " (ofproto/trace " + flow + ")"
	}
	return append(obs, rest...)
}

func (w *ovsWatch) events(obs []traceflow.Observation) []traceflow.WatchEvent {
	evs := make([]traceflow.WatchEvent, len(obs))
	for i := range obs {
		obs[i].Node = w.t.Name
		evs[i] = traceflow.WatchEvent{Observation: &obs[i]}
	}
	return evs
}

// startPacketIns runs `ovs-ofctl monitor` on the bridge until ctx ends,
// waits until it is subscribed, and sends the probe's packet-ins of drop
// flows to out. The returned channel reports the monitor exiting before
// ctx ended. The monitor is wg's.
func (w *ovsWatch) startPacketIns(ctx context.Context, out chan<- ovs.PacketIn, wg *sync.WaitGroup) (<-chan error, error) {
	ready := make(chan struct{})
	exited := make(chan error, 1) // one send, after which the monitor's goroutine returns
	wg.Go(func() {
		subscribed := false
		var mp ovs.MonitorParser
		err := ovs.Monitor(ctx, "ovs-ofctl", w.cfg.RunDir, w.cfg.Bridge, func(l string) {
			w.raw("monitor", l)
			if !subscribed {
				if subscribed = strings.HasPrefix(l, ovsMonitorReady); subscribed {
					close(ready)
				}
				return
			}
			if pi, ok, err := mp.Feed(l); err == nil && ok && w.mine(pi, l) {
				select {
				case out <- pi:
				case <-ctx.Done():
				}
			}
		}, "watch:table="+strconv.Itoa(ovsWatchTable))
		if ctx.Err() == nil {
			exited <- err
		}
	})
	select {
	case <-ready:
		return exited, nil
	case err := <-exited:
		return nil, err
	case <-ctx.Done():
		return nil, fmt.Errorf("ovs-ofctl monitor not subscribed: %w", ctx.Err())
	}
}

// mine reports whether pi, whose packet line is line, is a drop of the
// probe: a drop flow's, of the probe's source, protocol, source port and
// tag (the DSCP; the echo id of ICMP is not in a packet-in).
func (w *ovsWatch) mine(pi ovs.PacketIn, line string) bool {
	if k, _, ok := ovs.SplitCookie(pi.Cookie); !ok || k != ovs.KindDrop {
		return false
	}
	proto := w.p.ProtoNumber()
	if pi.Tuple.Src != w.p.Src || pi.Tuple.Proto != proto {
		return false
	}
	if (proto == packet.ProtoTCP || proto == packet.ProtoUDP) && pi.Tuple.SrcPort != w.p.SrcPort {
		return false
	}
	if tos, ok := packetTOS(line); ok && tos>>2 != w.p.Tag {
		return false
	}
	return true
}

var tosRE = regexp.MustCompile(`[, ]nw_tos=(\d+)[, ]`)

// packetTOS returns the DS field (DSCP<<2, nw_tos) of a packet-in's flow
// line ("tcp,…,nw_tos=28,nw_ecn=0,…").
func packetTOS(line string) (uint8, bool) {
	m := tosRE.FindStringSubmatch(line)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseUint(m[1], 10, 8)
	if err != nil {
		return 0, false
	}
	return uint8(v), true
}

func (w *ovsWatch) raw(what, s string) {
	if w.t.Raw != nil {
		fmt.Fprintf(w.t.Raw, "probe %d %s %s: %s\n", w.p.Tag, w.t.Name, what, s)
	}
}

// ofTrace runs ofproto/trace of the probe entering the bridge at port
// iface (the source pod's veth, or the uplink) towards dst:dport, and
// returns its steps as observations, the first one the reception at
// iface. A failing trace is reported in that observation's detail.
func (w *ovsWatch) ofTrace(ctx context.Context, iface string, dst netip.Addr, dport uint16) []traceflow.Observation {
	recv := traceflow.Observation{Component: traceflow.Forwarding, Action: traceflow.ActionReceived, Interface: iface}
	flow, obs, err := w.runTrace(ctx, iface, dst, dport)
	if err != nil {
		recv.Detail = "no ofproto/trace: " + err.Error()
		return []traceflow.Observation{recv}
	}
	recv.Detail = "ofproto/trace " + flow
	return append([]traceflow.Observation{recv}, obs...)
}

// runTrace runs ofproto/trace of the probe entering the bridge at port
// iface towards dst:dport and returns the flow traced and its steps'
// observations.
func (w *ovsWatch) runTrace(ctx context.Context, iface string, dst netip.Addr, dport uint16) (string, []traceflow.Observation, error) {
	show, err := ovs.Run(ctx, w.cfg.RunDir, ovsCommandTimeout, "ovs-ofctl", "show", w.cfg.Bridge)
	if err != nil {
		return "", nil, err
	}
	ports := parsePorts(show)
	port, ok := ports[iface]
	if !ok {
		return "", nil, fmt.Errorf("%s is not a port of bridge %s", iface, w.cfg.Bridge)
	}
	ttl := cmp.Or(w.p.TTL, 64)
	flow := observe.OFFlow(port, w.p.Src, dst, w.p.ProtoNumber(), w.p.SrcPort, dport, w.p.TCPFlags, w.p.Tag, ttl)
	out, err := ovs.Run(ctx, w.cfg.RunDir, ovsCommandTimeout, "ovs-appctl", "-T", strconv.Itoa(int(ovsCommandTimeout/time.Second)), "ofproto/trace", w.cfg.Bridge, flow)
	if err != nil {
		return "", nil, err
	}
	w.raw("ofproto/trace "+flow, out)
	return flow, traceObs(w.p, observe.ParseOFTrace(out), dst, dport, ports, w.rules), nil
}

// traceObs turns the steps of an ofproto/trace towards dst:dport into
// observations: the Service flows (load balancing), the allow flows of
// NetworkPolicy rules, and the pipeline flows that output the packet
// (routing) or end it with a drop. Drop flows are left out: the real
// probe's packet-in reports them.
func traceObs(p traceflow.Probe, tr observe.OFTrace, dst netip.Addr, dport uint16, ports map[string]int, rules *ovs.Rules) []traceflow.Observation {
	names := make(map[string]string, len(ports))
	for n, no := range ports {
		names[strconv.Itoa(no)] = n
	}
	var out []traceflow.Observation
	for i, s := range tr.Steps {
		kind, id, ok := ovs.SplitCookie(s.Cookie)
		if !ok {
			continue
		}
		switch kind {
		case ovs.KindService:
			o := traceflow.Observation{Component: traceflow.LoadBalancing, Action: traceflow.ActionForwarded, Service: p.Service,
				Detail: fmt.Sprintf("table %d: %s", s.Table, s.Match)}
			if dst != p.Dst || dport != p.DstPort {
				o.TranslatedDst = netip.AddrPortFrom(dst, dport)
			}
			if tr.NoLiveBucket {
				o.Detail += " (select group: the endpoint is chosen by the datapath's hash)"
			}
			out = append(out, o)
		case ovs.KindAllow:
			o := traceflow.Observation{Component: traceflow.NetworkPolicy, Action: traceflow.ActionForwarded, Detail: fmt.Sprintf("table %d", s.Table)}
			if r, ok := rules.Lookup(id); ok {
				o.Rule, o.Policy = r.Name, r.Namespace+"/"+r.Policy
				o.Detail = r.Direction + ", " + o.Detail
			} else {
				o.Rule = rules.ReportedName(id)
			}
			out = append(out, o)
		case ovs.KindPipeline:
			detail := fmt.Sprintf("table %d: %s → %s", s.Table, cmp.Or(s.Match, "any"), strings.Join(s.Actions, ","))
			if port, ok := outputPort(s.Actions); ok {
				out = append(out, traceflow.Observation{Component: traceflow.Routing, Action: traceflow.ActionForwarded,
					Interface: cmp.Or(names[port], port), Detail: detail})
			} else if i == len(tr.Steps)-1 && len(s.Actions) == 1 && s.Actions[0] == "drop" {
				out = append(out, traceflow.Observation{Component: traceflow.Routing, Action: traceflow.ActionDropped,
					Detail: detail + " (no flow forwards the probe)"})
			}
		}
	}
	return out
}

// outputPort returns the port of a step's output action ("output:3").
func outputPort(actions []string) (string, bool) {
	for _, a := range actions {
		if port, ok := strings.CutPrefix(a, "output:"); ok {
			return strings.Trim(port, `"`), true
		}
	}
	return "", false
}

var portRE = regexp.MustCompile(`^\s*(\d+)\((.+)\): addr:`)

// parsePorts returns the OpenFlow port numbers of a bridge by name, from
// `ovs-ofctl show` (or dump-ports-desc) output: " 3(veth12ab): addr:…".
// The bridge's own LOCAL port is left out.
func parsePorts(out string) map[string]int {
	ports := map[string]int{}
	for _, l := range strings.Split(out, "\n") {
		m := portRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		if n, err := strconv.Atoi(m[1]); err == nil {
			ports[m[2]] = n
		}
	}
	return ports
}

// conntrack looks up the probe's connection in the node's OVS conntrack.
func (w *ovsWatch) conntrack(ctx context.Context) (ctView, bool) {
	out, err := ovs.Run(ctx, w.cfg.RunDir, ovsCommandTimeout, "ovs-appctl", "-T", strconv.Itoa(int(ovsCommandTimeout/time.Second)), "dpctl/dump-conntrack", "-m")
	if err != nil {
		return ctView{}, false
	}
	return findConn(out, w.p)
}

// findConn finds the probe's connection (by its original tuple) in
// `ovs-appctl dpctl/dump-conntrack -m` output.
func findConn(out string, p traceflow.Probe) (ctView, bool) {
	proto := p.ProtoNumber()
	var v ctView
	found := false
	ovs.ParseConntrack(out, func(e *ovs.Entry) {
		o, r := e.Orig, e.Reply
		if found || o.Proto != proto || o.Src != p.Src || o.Dst != p.Dst {
			return
		}
		switch proto {
		case packet.ProtoICMP, packet.ProtoICMPv6:
			if e.ICMPID != p.SrcPort {
				return
			}
		default:
			if o.SrcPort != p.SrcPort || o.DstPort != p.DstPort {
				return
			}
		}
		found = true
		v.Text = fmt.Sprintf("%s -> %s, reply %s -> %s", netip.AddrPortFrom(o.Src, o.SrcPort), netip.AddrPortFrom(o.Dst, o.DstPort),
			netip.AddrPortFrom(r.Src, r.SrcPort), netip.AddrPortFrom(r.Dst, r.DstPort))
		if e.DstNAT() {
			v.DstNAT = netip.AddrPortFrom(r.Src, r.SrcPort)
		}
		if r.Dst != o.Src || r.DstPort != o.SrcPort {
			v.SrcNAT = netip.AddrPortFrom(r.Dst, r.DstPort)
		}
	})
	return v, found
}

// dropObs is the observation of a drop flow's packet-in of probe p on
// node, and the reason of the drop. An isolated pod's drop rule is named
// "drop/<direction>/<namespace>/<pod>", the policies behind it left to the
// controller (see IsolationOfRule); a policy rule's drop names its policy.
func dropObs(p traceflow.Probe, node string, pi ovs.PacketIn, rules *ovs.Rules) (traceflow.Observation, string) {
	kind, id, _ := ovs.SplitCookie(pi.Cookie)
	o := traceflow.Observation{Node: node, Component: traceflow.NetworkPolicy, Action: traceflow.ActionDropped,
		Detail: fmt.Sprintf("packet-in of table %d (%s flow)", pi.Table, kind)}
	if pi.Tuple.Dst != p.Dst || pi.Tuple.DstPort != p.DstPort {
		o.TranslatedDst = netip.AddrPortFrom(pi.Tuple.Dst, pi.Tuple.DstPort)
	}
	r, ok := rules.Lookup(id)
	switch {
	case !ok:
		return o, fmt.Sprintf("dropped on %s by a drop flow of cookie %#x (not in the rules file)", node, pi.Cookie)
	case r.Kind == ovs.KindDrop:
		o.Rule = r.Name
		if _, _, _, ok := IsolationOfRule(r.Name); !ok {
			o.Rule = strings.Join([]string{"drop", r.Direction, r.Namespace, r.Pod}, "/")
		}
		o.Detail = "no rule of the isolating policies allows it; " + o.Detail
		return o, fmt.Sprintf("dropped by NetworkPolicy rule %s on %s", o.Rule, node)
	}
	o.Rule, o.Policy = r.Name, r.Namespace+"/"+r.Policy
	return o, fmt.Sprintf("dropped by NetworkPolicy %s (rule %s) on %s", o.Policy, o.Rule, node)
}
