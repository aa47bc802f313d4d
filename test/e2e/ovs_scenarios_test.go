package e2e

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	xovs "github.com/dualflow/dualflow/exporter/ovs"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/lab/topology"
)

// TestOVSScenarios runs the lab scenarios (same node, across nodes,
// Service DNAT, policy denied, dual-stack gap, UDP, ICMP/ICMPv6, the probe
// matrix, policy reload) on the OVS datapath in every mode, plus what only
// OVS has: drops reported as packet-ins with the drop rule's cookie, and
// the gateway's ARP/neighbour responders.
func TestOVSScenarios(t *testing.T) {
	requireOVS(t)
	t.Parallel() // each mode its own lab and OVS daemons
	runScenarios(t, lab.DatapathOVS, append(append([]scenario(nil), scenarios...),
		scenario{"ovs-drop-packet-in", ovsDropPacketIn, false},
		scenario{"ovs-neighbor-responders", ovsNeighbors, false},
	))
}

// ovsDropPacketIn checks that a denied packet reaches the controller (an
// exporter/ovs source's Denied) with the drop flow's cookie and the flow's
// tuple, as NFLOG does on the kernel datapath.
func ovsDropPacketIn(t *testing.T, e *env) {
	drop := nft.DropName(nft.Ingress, e.api[2].Namespace, e.api[2].Name)
	cfg := xovs.Config{RunDir: e.l.OVSDir("node-2"), RulesFile: e.l.OVSRulesPath(), IPv4: true, IPv6: true, DeniedIdle: 300 * time.Millisecond}
	cfg.SetDefaults()
	src, err := xovs.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	recs := make(chan flow.Record, 64)
	done := make(chan struct{})
	go func() {
		defer close(done)
		src.Denied(ctx, func(rs []flow.Record) {
			for _, r := range rs {
				select {
				case recs <- r:
				default:
				}
			}
		})
	}()
	defer func() { cancel(); <-done }()
	time.Sleep(300 * time.Millisecond) // monitor connected
	e.eachFamily(t, func(t *testing.T, f corev1.IPFamily) {
		src := addr(t, e.probe[1], f)
		to := netip.AddrPortFrom(addr(t, e.api[2], f), manifest.PortHTTP)
		e.mustDrop(t, e.probe[1], agent.TCP, to)
		deadline := time.After(5 * time.Second)
		for {
			select {
			case r := <-recs:
				if r.SrcAddr == src && r.DstAddr == to.Addr() && r.DstPort == to.Port() && r.Proto == flow.ProtoTCP {
					if r.Ingress.ReportedVerdict != flow.VerdictDenied || r.Ingress.ReportedName != drop || r.Source != "ovs" || r.Packets < 1 {
						t.Errorf("denied record %+v: want verdict denied by %s", r.Ingress, drop)
					}
					return
				}
			case <-deadline:
				t.Fatalf("no denied record %s -> %s naming %s", src, to, drop)
			}
		}
	})
}

// ovsNeighbors removes a pod's permanent gateway neighbour entries and
// checks that OVS answers ARP (IPv4) and neighbour solicitation (IPv6)
// for the gateway with the gateway MAC; the node's kernel is fenced off,
// so only OVS can answer.
func ovsNeighbors(t *testing.T, e *env) {
	p := e.web[1]
	restore := func(gw string) {
		labExec(context.Background(), e.l, p, "ip", "neigh", "replace", gw, "lladdr", topology.GatewayMAC.String(), "dev", "eth0", "nud", "permanent")
	}
	e.eachFamily(t, func(t *testing.T, f corev1.IPFamily) {
		gw := topology.GatewayIPv6.String()
		if f == corev1.IPv4Protocol {
			n, _ := e.l.Manifest.Node("node-1")
			cidr, _ := manifest.NodePodCIDR(n, f)
			gw = cidr.Addr().Next().String()
		}
		defer restore(gw)
		if out, err := labExec(ctx(t), e.l, p, "ip", "neigh", "del", gw, "dev", "eth0"); err != nil {
			t.Fatalf("ip neigh del: %v: %s", err, out)
		}
		e.mustReach(t, p, agent.TCP, netip.AddrPortFrom(addr(t, e.api[2], f), manifest.PortHTTP))
		out, err := labExec(ctx(t), e.l, p, "ip", "neigh", "show", gw, "dev", "eth0")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(out), topology.GatewayMAC.String()) {
			t.Errorf("gateway %s resolved to %q, want %s", gw, strings.TrimSpace(string(out)), topology.GatewayMAC)
		}
	})
}
