package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/exporter"
	xovs "github.com/dualflow/dualflow/exporter/ovs"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/ovs"
	"github.com/dualflow/dualflow/test/support/ipfixtest"
	"github.com/dualflow/dualflow/test/support/labtruth"
)

// TestExporter runs `dualflow exporter` (in process) against node-1 of a
// lab of each datapath (kernel conntrack, and `--exporter.source ovs` on
// the OVS datapath) in each mode, and sends pod traffic through node-1:
// same node, across nodes, to a Service (DNAT), TCP and UDP, in every
// family of the mode. A test collector (on [::1] when the mode has IPv6,
// so the exporter speaks IPFIX over IPv6) must receive, for each
// connection, records whose addresses, ports and counters match node-1's
// ground truth (the kernel's conntrack entry, or OVS's learned counter
// flows), and no record of a family the mode lacks.
//
// On OVS, denied connections (egress and ingress drops on node-1, TCP and
// UDP) must also arrive, as records of source "ovs". The IPFIX template
// does not carry policy elements, so the rule that dropped them
// (ReportedVerdict denied, ReportedName the drop rule) is checked on the
// records a second OVS source on node-1 produces.
func TestExporter(t *testing.T) {
	t.Parallel() // each mode its own lab
	for _, datapath := range []string{lab.DatapathKernel, lab.DatapathOVS} {
		for _, mode := range manifest.Modes {
			label := string(mode)
			if datapath != lab.DatapathKernel {
				label += "/" + datapath
			}
			t.Run(label, func(t *testing.T) {
				t.Parallel()
				recordAs(t, label)
				testExporter(t, mode, datapath)
			})
		}
	}
}

func testExporter(t *testing.T, mode manifest.Mode, datapath string) {
	l := startLabOn(t, mode, datapath)
	onOVS := datapath == lab.DatapathOVS
	listen := "[::1]:0"
	if mode == manifest.ModeIPv4 {
		listen = "127.0.0.1:0"
	}
	col := ipfixtest.Start(t, ipfixtest.Options{Address: listen})

	cfg := exporter.NewConfig()
	cfg.NodeName = "node-1"
	cfg.MetricsAddr = ""
	if onOVS {
		cfg.Source = exporter.SourceOVS
		cfg.OVS.RunDir, cfg.OVS.RulesFile, cfg.OVS.DeniedIdle = l.OVSDir("node-1"), l.OVSRulesPath(), 500*time.Millisecond
	} else {
		cfg.NetNS = l.NodeNetNSPath("node-1")
		cfg.RequireAccounting = true
	}
	cfg.IPv4, cfg.IPv6 = false, false
	for _, f := range mode.Families() {
		cfg.IPv4 = cfg.IPv4 || f == corev1.IPv4Protocol
		cfg.IPv6 = cfg.IPv6 || f == corev1.IPv6Protocol
	}
	cfg.PollInterval = 200 * time.Millisecond
	cfg.Store.IdleTimeout = time.Second
	cfg.Store.ActiveTimeout = time.Hour
	cfg.IPFIX.Address = col.Addr
	cfg.IPFIX.FlushInterval = 50 * time.Millisecond
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e, err := exporter.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	defer func() {
		cancel()
		wg.Wait()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("exporter: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Error("exporter did not stop")
		}
	}()
	select {
	case <-e.Ready(): // subscribed to events, first dump done
	case err := <-done:
		done <- nil // Run returned: the deferred stop must not wait
		t.Fatalf("exporter: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("exporter not ready")
	}
	// On OVS, a second source on node-1 shows the denied records before
	// IPFIX encoding, with the rule that dropped them.
	var mu sync.Mutex
	var denied []flow.Record
	if onOVS {
		src, err := xovs.New(cfg.OVS, nil)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			src.Denied(ctx, func(recs []flow.Record) {
				mu.Lock()
				denied = append(denied, recs...)
				mu.Unlock()
			})
		})
	}

	pod := func(ns, app string, node int) *corev1.Pod {
		p, err := l.PodOn(ns, app, node)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	web1, web2 := pod(manifest.NSFrontend, "web", 1), pod(manifest.NSFrontend, "web", 2)
	api1, api2 := pod(manifest.NSBackend, "api", 1), pod(manifest.NSBackend, "api", 2)
	probe1 := pod(manifest.NSTools, "probe", 1)
	svc, _ := l.Manifest.Service(manifest.NSBackend, manifest.ServiceAPI)
	type sent struct {
		name  string
		proto uint8
		to    netip.AddrPort
		local netip.AddrPort
		dnat  bool
	}
	type drop struct {
		name string
		from netip.Addr
		to   netip.AddrPort
		prot uint8
		rule string
	}
	var allowed []sent
	var drops []drop
	for _, f := range mode.Families() {
		podAddr := func(p *corev1.Pod) netip.Addr {
			a, ok := manifest.PodAddr(p, f)
			if !ok {
				t.Fatalf("pod %s has no %s address", p.Name, f)
			}
			return a
		}
		vip, ok := manifest.ServiceAddr(svc, f)
		if !ok {
			t.Fatalf("service api has no %s ClusterIP", f)
		}
		for _, s := range []struct {
			name  string
			proto string
			to    netip.AddrPort
			dnat  bool
		}{
			{"tcp same node", agent.TCP, netip.AddrPortFrom(podAddr(api1), manifest.PortHTTP), false},
			{"tcp across nodes", agent.TCP, netip.AddrPortFrom(podAddr(api2), manifest.PortHTTP), false},
			{"tcp to service", agent.TCP, netip.AddrPortFrom(vip, manifest.ServicePortHTTP), true},
			{"udp across nodes", agent.UDP, netip.AddrPortFrom(podAddr(api2), manifest.PortUDPEcho), false},
		} {
			dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
			r, err := labDial(dctx, l, web1, s.proto, s.to)
			dcancel()
			if err != nil {
				t.Fatalf("%s %s -> %s: %v", f, s.name, s.to, err)
			}
			proto := map[string]uint8{agent.TCP: flow.ProtoTCP, agent.UDP: flow.ProtoUDP}[s.proto]
			allowed = append(allowed, sent{fmt.Sprintf("%s/%s", f, s.name), proto, s.to, r.Local, s.dnat})
		}
		if onOVS {
			egress := nft.DropName(nft.Egress, probe1.Namespace, probe1.Name)
			ingress := nft.DropName(nft.Ingress, api1.Namespace, api1.Name)
			drops = append(drops,
				drop{fmt.Sprintf("%s/egress tcp", f), podAddr(probe1), netip.AddrPortFrom(podAddr(web2), manifest.PortHTTP), flow.ProtoTCP, egress},
				drop{fmt.Sprintf("%s/egress udp", f), podAddr(probe1), netip.AddrPortFrom(podAddr(web2), manifest.PortUDPEcho), flow.ProtoUDP, egress},
				drop{fmt.Sprintf("%s/ingress same node", f), podAddr(probe1), netip.AddrPortFrom(podAddr(api1), manifest.PortHTTP), flow.ProtoTCP, ingress})
		}
	}

	// Connections are told apart by their whole tuple: a client may use
	// one port for two destinations (connect() needs a unique 4-tuple, not
	// a unique port), e.g. api1:8080 and api2:8080.
	findAllowed := func(recs []flow.Record, s sent) []flow.Record {
		var out []flow.Record
		for _, r := range recs {
			dst := netip.AddrPortFrom(r.DstAddr, r.DstPort)
			if r.ServiceAddr.IsValid() {
				dst = netip.AddrPortFrom(r.ServiceAddr, r.ServicePort)
			}
			if r.Proto == s.proto && r.SrcAddr == s.local.Addr().Unmap() && r.SrcPort == s.local.Port() && dst == s.to {
				out = append(out, r)
			}
		}
		return out
	}
	findDenied := func(recs []flow.Record, d drop) []flow.Record {
		var out []flow.Record
		for _, r := range recs {
			if r.Proto == d.prot && r.SrcAddr == d.from && r.DstAddr == d.to.Addr() && r.DstPort == d.to.Port() && r.Source == xovs.SourceName {
				out = append(out, r)
			}
		}
		return out
	}
	// The drops are sent again until both the collector and the second
	// source have seen each: the second source's packet-in monitor
	// connects on its own time, and a drop before that leaves no record.
	var recs, got []flow.Record
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, d := range drops {
			proto := map[uint8]string{flow.ProtoTCP: agent.TCP, flow.ProtoUDP: agent.UDP}[d.prot]
			if _, err := labDial(context.Background(), l, probe1, proto, d.to); err == nil {
				t.Fatalf("%s: %s -> %s answered, want a drop", d.name, d.from, d.to)
			}
		}
		recs = col.Wait(t, 20*time.Second, func(recs []flow.Record) bool {
			for _, s := range allowed {
				if len(findAllowed(recs, s)) == 0 {
					return false
				}
			}
			return true
		})
		mu.Lock()
		got = append(got[:0], denied...)
		mu.Unlock()
		all := true
		for _, d := range drops {
			all = all && len(findDenied(recs, d)) > 0 && len(findDenied(got, d)) > 0
		}
		if all || time.Now().After(deadline) {
			break
		}
	}
	conns, err := labtruth.Conntrack(l, "node-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		if (r.IPVersion == 4 && !cfg.IPv4) || (r.IPVersion == 6 && !cfg.IPv6) {
			t.Errorf("IPv%d record in %s mode: %v -> %v", r.IPVersion, mode, r.SrcAddr, r.DstAddr)
		}
	}
	for _, s := range allowed {
		t.Run(s.name, func(t *testing.T) {
			c, ok := findConnTo(conns, s.proto, s.local, s.to)
			if !ok {
				t.Fatalf("node-1 has no %s conntrack entry from %v to %v", datapath, s.local, s.to)
			}
			rs := findAllowed(recs, s)
			r := rs[len(rs)-1]
			if r.Packets == 0 || r.ReversePackets == 0 {
				t.Errorf("record without counters: %d/%d packets", r.Packets, r.ReversePackets)
			}
			if r.Packets != c.OrigPackets || r.Bytes != c.OrigBytes || r.ReversePackets != c.ReplyPackets || r.ReverseBytes != c.ReplyBytes {
				t.Errorf("counters %d/%d %d/%d, %s ground truth %d/%d %d/%d", r.Packets, r.Bytes, r.ReversePackets, r.ReverseBytes,
					datapath, c.OrigPackets, c.OrigBytes, c.ReplyPackets, c.ReplyBytes)
			}
			if r.DstAddr != c.Reply.Src || r.DstPort != c.Reply.SrcPort {
				t.Errorf("destination %v:%d, conntrack reply source %v:%d", r.DstAddr, r.DstPort, c.Reply.Src, c.Reply.SrcPort)
			}
			if s.dnat {
				if !c.DstNAT || r.ServiceAddr != s.to.Addr() || r.ServicePort != s.to.Port() || r.DstAddr == s.to.Addr() {
					t.Errorf("service %v:%d endpoint %v, want service %v", r.ServiceAddr, r.ServicePort, r.DstAddr, s.to)
				}
			} else if r.ServiceAddr.IsValid() || r.DstAddr != s.to.Addr() || r.DstPort != s.to.Port() {
				t.Errorf("plain flow: service %v, destination %v:%d, want %v", r.ServiceAddr, r.DstAddr, r.DstPort, s.to)
			}
			if r.SNATAddr.IsValid() {
				t.Errorf("SNAT %v: the lab never SNATs", r.SNATAddr)
			}
			if r.EndReason != flow.EndReasonIdleTimeout && r.EndReason != flow.EndReasonEndOfFlow {
				t.Errorf("end reason %v", r.EndReason)
			}
			if r.ExporterNode != "node-1" || r.Zone != c.Zone {
				t.Errorf("node %q zone %d, want node-1 zone %d", r.ExporterNode, r.Zone, c.Zone)
			}
			if onOVS {
				if r.Source != xovs.SourceName || r.Mark&ovs.MarkAllowed == 0 || r.FlowStart.IsZero() {
					t.Errorf("source %q mark %#x start %v", r.Source, r.Mark, r.FlowStart)
				}
				return
			}
			var sum uint64
			for _, x := range rs {
				sum += x.BytesDelta
			}
			if sum != r.Bytes {
				t.Errorf("byte deltas add up to %d, total %d", sum, r.Bytes)
			}
			if r.Source != "conntrack" || r.Mark != c.Mark || !r.FlowStart.Equal(c.Start.Truncate(time.Millisecond)) {
				t.Errorf("source %q mark %#x start %v (conntrack mark %#x start %v)", r.Source, r.Mark, r.FlowStart, c.Mark, c.Start)
			}
		})
	}
	for _, d := range drops {
		t.Run(d.name, func(t *testing.T) {
			rs := findDenied(recs, d)
			if len(rs) == 0 {
				t.Fatalf("no denied record over IPFIX %s -> %s", d.from, d.to)
			}
			if rs[0].Packets == 0 {
				t.Errorf("denied record over IPFIX without packets: %+v", rs[0])
			}
			rs = findDenied(got, d)
			if len(rs) == 0 {
				t.Fatalf("the source produced no denied record %s -> %s", d.from, d.to)
			}
			p := rs[0].Ingress
			if strings.HasPrefix(d.rule, "drop/egress/") {
				p = rs[0].Egress
			}
			if p.ReportedVerdict != flow.VerdictDenied || p.ReportedName != d.rule {
				t.Errorf("denied record reports %v by %q, want denied by %q", p.ReportedVerdict, p.ReportedName, d.rule)
			}
		})
	}
}

// findConnTo returns the entry of the connection from local to to (its
// original destination: a Service address before DNAT). labtruth.FindConn
// matches the source alone, which two connections from one client port
// to different destinations share.
func findConnTo(conns []labtruth.Conn, proto uint8, local, to netip.AddrPort) (labtruth.Conn, bool) {
	for _, c := range conns {
		if c.Orig.Proto == proto && c.Orig.Src == local.Addr().Unmap() && c.Orig.SrcPort == local.Port() &&
			c.Orig.Dst == to.Addr().Unmap() && c.Orig.DstPort == to.Port() {
			return c, true
		}
	}
	return labtruth.Conn{}, false
}
