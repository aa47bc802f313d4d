package tracer

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"

	xovs "github.com/dualflow/dualflow/exporter/ovs"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	labovs "github.com/dualflow/dualflow/lab/ovs"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
)

// The OVS datapath has no nftables trace. The real probe is still injected
// and captured at the destination; drops are the drop flows' packet-ins
// (`ovs-ofctl monitor`, cookie → rule through the lab's rules file); the
// path through each node's tables comes from `ovs-appctl ofproto/trace` of
// the probe's flow (on the source node with the original destination, on
// the next node with the translated one), run once the outcome is known.

// ovsMonitorReady is what `ovs-ofctl monitor … watch:` prints once it is
// subscribed (packet-ins are enabled before the flow monitor request).
const ovsMonitorReady = "NXST_FLOW_MONITOR reply"

// ovsWatchTable is an unused table the monitor watches, so its initial
// flow dump is empty.
const ovsWatchTable = 254

type packetIn struct {
	node string
	pi   xovs.PacketIn
}

func (t *Tracer) ovsNode(node string) labovs.Node {
	return labovs.Node{Dir: t.lab.OVSDir(node), NetNS: t.lab.NodeNetNSPath(node)}
}

// startPacketIns runs ovs-ofctl monitor on node's bridge until done and
// sends the probe's packet-ins of drop flows to out.
func (t *Tracer) startPacketIns(ctx context.Context, node string, p traceflow.Probe, out chan<- packetIn, done <-chan struct{}, wg *sync.WaitGroup) (*exec.Cmd, error) {
	n := t.ovsNode(node)
	cmd := exec.Command("ovs-ofctl", "--no-names", "monitor", labovs.Bridge, strconv.Itoa(xovs.DefaultMonitorMissLen), "watch:table="+strconv.Itoa(ovsWatchTable))
	cmd.Env = n.Env()
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = w, w // replies on stdout, packet-ins on stderr
	if err := cmd.Start(); err != nil {
		w.Close()
		r.Close()
		return nil, fmt.Errorf("node %s: ovs-ofctl monitor: %w", node, err)
	}
	w.Close()
	lines := make(chan string, 64)
	wg.Go(func() {
		defer close(lines)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			case <-done:
				return
			}
		}
	})
	ready := false
	for !ready {
		select {
		case l, ok := <-lines:
			if !ok {
				cmd.Process.Kill()
				cmd.Wait()
				return nil, fmt.Errorf("node %s: ovs-ofctl monitor exited", node)
			}
			ready = strings.HasPrefix(l, ovsMonitorReady)
		case <-ctx.Done():
			cmd.Process.Kill()
			cmd.Wait()
			return nil, fmt.Errorf("node %s: ovs-ofctl monitor: %w", node, ctx.Err())
		}
	}
	proto := p.ProtoNumber()
	wg.Go(func() {
		var mp xovs.MonitorParser
		for l := range lines {
			pi, ok, err := mp.Feed(l)
			if err != nil || !ok || pi.Tuple.Src != p.Src || pi.Tuple.Proto != proto {
				continue
			}
			if (proto == 6 || proto == 17) && pi.Tuple.SrcPort != p.SrcPort {
				continue
			}
			select {
			case out <- packetIn{node: node, pi: pi}:
			case <-done:
				return
			}
		}
	})
	return cmd, nil
}

func (t *Tracer) traceOVS(ctx context.Context, p traceflow.Probe, src *corev1.Pod, frame []byte, send func() error) (traceflow.Path, error) {
	rules, err := xovs.LoadRules(t.lab.OVSRulesPath())
	if err != nil {
		return traceflow.Path{}, err
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	var cmds []*exec.Cmd
	defer func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
		close(done)
		wg.Wait()
	}()
	pins := make(chan packetIn, 8)
	for i := range t.inv.M.Nodes {
		cmd, err := t.startPacketIns(ctx, t.inv.M.Nodes[i].Name, p, pins, done, &wg)
		if err != nil {
			return traceflow.Path{}, err
		}
		cmds = append(cmds, cmd)
	}
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
	var drop *packetIn
wait:
	for {
		select {
		case d := <-delivered:
			c.deliver(d)
			break wait
		case pi := <-pins:
			drop = &pi
			break wait
		case <-rs.timer.C:
			if err := rs.fire(); err != nil {
				return traceflow.Path{}, err
			}
		case <-ctx.Done():
			break wait
		}
	}

	// The path: the source node, then the node that delivered or dropped.
	dst, dport := p.Dst, p.DstPort
	next := ""
	switch {
	case c.delivered != nil:
		next = c.deliverNode
		if c.delivered.TranslatedDst.IsValid() {
			dst, dport = c.delivered.TranslatedDst.Addr(), c.delivered.TranslatedDst.Port()
		}
	case drop != nil:
		next = drop.node
		dst, dport = drop.pi.Tuple.Dst, drop.pi.Tuple.DstPort
	}
	tctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
	defer cancel()
	if err := t.ofTrace(tctx, &c, src.Spec.NodeName, src.Annotations[manifest.AnnotationHostIface], p, p.Dst, p.DstPort, rules); err != nil {
		return traceflow.Path{}, err
	}
	if next != "" && next != src.Spec.NodeName {
		if err := t.ofTrace(tctx, &c, next, "eth0", p, dst, dport, rules); err != nil {
			return traceflow.Path{}, err
		}
	}
	if drop != nil {
		c.ovsDrop(*drop, rules)
	}
	path := c.path(context.Background())
	if ctx.Err() != nil && c.outcome == "" {
		path.Outcome, path.Reason = traceflow.TimedOut, c.timeoutReason(ctx)
	}
	return path, nil
}

// captureAt listens on eth0 of every pod the probe may reach and sends the
// first match to the returned channel.
func (t *Tracer) captureAt(ctx context.Context, p traceflow.Probe, done <-chan struct{}, wg *sync.WaitGroup) (<-chan delivery, error) {
	delivered := make(chan delivery, 4)
	for _, dp := range t.inv.Endpoints(p) {
		if err := t.capture(ctx, p, dp, delivered, done, wg); err != nil {
			return nil, err
		}
	}
	return delivered, nil
}

// ofTrace runs ofproto/trace of the probe entering node's bridge on iface
// (a pod's host veth, or eth0 from the fabric) and adds its steps.
func (t *Tracer) ofTrace(ctx context.Context, c *collector, node, iface string, p traceflow.Probe, dst netip.Addr, dport uint16, rules *xovs.Rules) error {
	n := t.ovsNode(node)
	out, err := n.Vsctl(ctx, "get", "Interface", iface, "ofport")
	if err != nil {
		return fmt.Errorf("node %s: ofport of %s: %w", node, iface, err)
	}
	port, err := strconv.Atoi(strings.TrimSpace(out))
	if err != nil {
		return fmt.Errorf("node %s: ofport of %s: %q", node, iface, out)
	}
	ttl := p.TTL
	if ttl == 0 {
		ttl = 64
	}
	flow := observe.OFFlow(port, p.Src, dst, p.ProtoNumber(), p.SrcPort, dport, p.TCPFlags, p.Tag, ttl)
	out, err = n.Appctl(ctx, "ofproto/trace", labovs.Bridge, flow)
	if err != nil {
		return fmt.Errorf("node %s: ofproto/trace: %w", node, err)
	}
	tr := observe.ParseOFTrace(out)
	c.addObs(node, traceflow.Observation{Component: traceflow.Forwarding, Action: traceflow.ActionReceived, Interface: iface,
		Detail: fmt.Sprintf("ofproto/trace %s", flow)})
	for _, s := range tr.Steps {
		kind, id, ok := xovs.SplitCookie(s.Cookie)
		if !ok {
			continue
		}
		switch {
		case kind == xovs.KindService:
			o := traceflow.Observation{Component: traceflow.LoadBalancing, Action: traceflow.ActionForwarded, Service: p.Service,
				Detail: fmt.Sprintf("table %d: %s", s.Table, s.Match)}
			if dst != p.Dst || c.delivered != nil && c.delivered.TranslatedDst.IsValid() {
				o.TranslatedDst = netip.AddrPortFrom(dst, dport)
			}
			if tr.NoLiveBucket {
				o.Detail += " (select group: the endpoint is chosen by the datapath's hash)"
			}
			c.addObs(node, o)
		case kind == xovs.KindAllow:
			r, _ := rules.Lookup(id)
			c.addObs(node, traceflow.Observation{Component: traceflow.NetworkPolicy, Action: traceflow.ActionForwarded,
				Policy: r.Namespace + "/" + r.Policy, Rule: r.Name, Detail: fmt.Sprintf("table %d", s.Table)})
		case kind == xovs.KindPipeline && s.Table == labovs.TableForward:
			c.addObs(node, traceflow.Observation{Component: traceflow.Routing, Action: traceflow.ActionForwarded,
				Detail: fmt.Sprintf("table %d: %s → %s", s.Table, s.Match, strings.Join(s.Actions, ","))})
		}
	}
	return nil
}

// ovsDrop records a drop flow's packet-in: the real probe was dropped.
func (c *collector) ovsDrop(d packetIn, rules *xovs.Rules) {
	kind, id, _ := xovs.SplitCookie(d.pi.Cookie)
	r, ok := rules.Lookup(id)
	o := traceflow.Observation{Node: d.node, Component: traceflow.NetworkPolicy, Action: traceflow.ActionDropped,
		Detail: fmt.Sprintf("packet-in of table %d (%s flow)", d.pi.Table, kind)}
	if d.pi.Tuple.Dst != c.p.Dst {
		o.TranslatedDst = netip.AddrPortFrom(d.pi.Tuple.Dst, d.pi.Tuple.DstPort)
	}
	if ok {
		o.Rule = r.Name
		if r.Kind == xovs.KindDrop {
			o.Policy = strings.Join(c.t.inv.IsolatingPolicies(r.Namespace, r.Pod, nft.Direction(r.Direction)), ",")
		} else {
			o.Policy = r.Namespace + "/" + r.Policy
		}
	}
	c.addObs(d.node, o)
	c.outcome = traceflow.Dropped
	c.reason = fmt.Sprintf("dropped by NetworkPolicy %s (rule %s) on %s", cmpOr(o.Policy, "?"), cmpOr(o.Rule, fmt.Sprintf("cookie %#x", d.pi.Cookie)), d.node)
}
