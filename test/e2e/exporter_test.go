package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/exporter"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/test/support/ipfixtest"
	"github.com/dualflow/dualflow/test/support/labtruth"
)

// TestExporter runs `dualflow exporter` (in process) against node-1 of a
// lab in each mode, from the test's own namespace, and sends pod traffic
// through node-1: same node, across nodes, to a Service (DNAT), TCP and
// UDP, in every family of the mode. A test collector (on [::1] when the
// mode has IPv6, so the exporter speaks IPFIX over IPv6) must receive one
// record per connection whose addresses, ports and counters match node-1's
// conntrack entry, and no record of a family the mode lacks.
func TestExporter(t *testing.T) {
	requirePrereqs(t)
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			record(t, mode)
			l := startLab(t, mode)
			listen := "[::1]:0"
			if mode == manifest.ModeIPv4 {
				listen = "127.0.0.1:0"
			}
			col := ipfixtest.Start(t, ipfixtest.Options{Address: listen})

			cfg := exporter.NewConfig()
			cfg.NodeName = "node-1"
			cfg.MetricsAddr = ""
			cfg.NetNS = l.NodeNetNSPath("node-1")
			cfg.IPv4, cfg.IPv6 = false, false
			for _, f := range mode.Families() {
				cfg.IPv4 = cfg.IPv4 || f == corev1.IPv4Protocol
				cfg.IPv6 = cfg.IPv6 || f == corev1.IPv6Protocol
			}
			cfg.RequireAccounting = true
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
			done := make(chan error, 1)
			go func() { done <- e.Run(ctx) }()
			defer func() {
				cancel()
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

			pod := func(ns, app string, node int) *corev1.Pod {
				p, err := l.PodOn(ns, app, node)
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
			web1, api1, api2 := pod(manifest.NSFrontend, "web", 1), pod(manifest.NSBackend, "api", 1), pod(manifest.NSBackend, "api", 2)
			svc, _ := l.Manifest.Service(manifest.NSBackend, manifest.ServiceAPI)
			type sent struct {
				name  string
				proto uint8
				to    netip.AddrPort
				local netip.AddrPort
				dnat  bool
			}
			var all []sent
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
					r, err := l.Dial(dctx, web1, s.proto, s.to)
					dcancel()
					if err != nil {
						t.Fatalf("%s %s -> %s: %v", f, s.name, s.to, err)
					}
					proto := map[string]uint8{agent.TCP: flow.ProtoTCP, agent.UDP: flow.ProtoUDP}[s.proto]
					all = append(all, sent{fmt.Sprintf("%s/%s", f, s.name), proto, s.to, r.Local, s.dnat})
				}
			}

			find := func(recs []flow.Record, s sent) []flow.Record {
				var out []flow.Record
				for _, r := range recs {
					if r.Proto == s.proto && r.SrcAddr == s.local.Addr().Unmap() && r.SrcPort == s.local.Port() {
						out = append(out, r)
					}
				}
				return out
			}
			recs := col.Wait(t, 20*time.Second, func(recs []flow.Record) bool {
				for _, s := range all {
					if len(find(recs, s)) == 0 {
						return false
					}
				}
				return true
			})
			conns, err := labtruth.Conntrack(l, "node-1")
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if (r.IPVersion == 4 && !cfg.IPv4) || (r.IPVersion == 6 && !cfg.IPv6) {
					t.Errorf("IPv%d record in %s mode: %v -> %v", r.IPVersion, mode, r.SrcAddr, r.DstAddr)
				}
			}
			for _, s := range all {
				t.Run(s.name, func(t *testing.T) {
					c, ok := labtruth.FindConn(conns, s.proto, s.local)
					if !ok {
						t.Fatalf("node-1 has no conntrack entry from %v", s.local)
					}
					rs := find(recs, s)
					r := rs[len(rs)-1]
					if r.Packets != c.OrigPackets || r.Bytes != c.OrigBytes || r.ReversePackets != c.ReplyPackets || r.ReverseBytes != c.ReplyBytes {
						t.Errorf("counters %d/%d %d/%d, conntrack %d/%d %d/%d", r.Packets, r.Bytes, r.ReversePackets, r.ReverseBytes,
							c.OrigPackets, c.OrigBytes, c.ReplyPackets, c.ReplyBytes)
					}
					var sum uint64
					for _, x := range rs {
						sum += x.BytesDelta
					}
					if sum != r.Bytes {
						t.Errorf("byte deltas add up to %d, total %d", sum, r.Bytes)
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
					if r.ExporterNode != "node-1" || r.Source != "conntrack" || r.Zone != c.Zone || r.Mark != c.Mark ||
						!r.FlowStart.Equal(c.Start.Truncate(time.Millisecond)) {
						t.Errorf("node %q source %q zone %d mark %#x start %v (conntrack start %v)", r.ExporterNode, r.Source, r.Zone, r.Mark, r.FlowStart, c.Start)
					}
					if r.EndReason != flow.EndReasonIdleTimeout && r.EndReason != flow.EndReasonEndOfFlow {
						t.Errorf("end reason %v", r.EndReason)
					}
				})
			}
		})
	}
}
