package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/correlate"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/test/support/labtruth"
)

// TestEnrich runs the Kubernetes enrichment in inventory mode on the lab's
// own manifest, in each lab mode, and checks it against real connections:
// for each connection the test makes (pod to pod on one node and across
// nodes, to a Service with DNAT, TCP and UDP, Deployment pods and a bare
// pod, every family of the mode), it reads the connection from the
// conntrack table of each node it crossed, builds the flow record the
// exporter would (source, destination after DNAT, ServiceAddr for a DNAT
// entry), enriches it, and compares pod, namespace, workload, node, zone,
// Service, port name and flow type with the manifest.
func TestEnrich(t *testing.T) {
	requirePrereqs(t)
	t.Parallel() // each mode its own lab
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			l := startLab(t, mode)
			e := startEnricher(t, l.ManifestPath())
			// off has IPv6 enrichment switched off: it must still pair the
			// two node halves of an IPv6 connection (issue 24).
			offCfg := enrich.NewConfig()
			offCfg.Source, offCfg.Inventory, offCfg.EnableIPv6 = enrich.SourceInventory, []string{l.ManifestPath()}, false
			off := runEnricher(t, offCfg)
			pod := func(ns, app string, node int) *corev1.Pod {
				p, err := l.PodOn(ns, app, node)
				if err != nil {
					t.Fatal(err)
				}
				return p
			}
			web1, web2 := pod(manifest.NSFrontend, "web", 1), pod(manifest.NSFrontend, "web", 2)
			api1, api2 := pod(manifest.NSBackend, "api", 1), pod(manifest.NSBackend, "api", 2)
			probe1, probe2 := pod(manifest.NSTools, "probe", 1), pod(manifest.NSTools, "probe", 2)
			apiSvc, _ := l.Manifest.Service(manifest.NSBackend, manifest.ServiceAPI)
			webSvc, _ := l.Manifest.Service(manifest.NSFrontend, manifest.ServiceWeb)

			// crossZone counts, per IP version, the connections whose ends
			// are in different zones, from the enriched records.
			crossZone := map[uint8]int{}
			for _, f := range mode.Families() {
				podAddr := func(p *corev1.Pod) netip.Addr {
					a, ok := manifest.PodAddr(p, f)
					if !ok {
						t.Fatalf("pod %s has no %s address", p.Name, f)
					}
					return a
				}
				vip := func(s *corev1.Service) netip.Addr {
					a, ok := manifest.ServiceAddr(s, f)
					if !ok {
						t.Fatalf("service %s has no %s ClusterIP", s.Name, f)
					}
					return a
				}
				for _, c := range []struct {
					name     string
					from     *corev1.Pod
					proto    string
					to       netip.AddrPort
					svc      *corev1.Service
					portName string
				}{
					{"tcp same node", web1, agent.TCP, netip.AddrPortFrom(podAddr(api1), manifest.PortHTTP), nil, ""},
					{"tcp across nodes", web1, agent.TCP, netip.AddrPortFrom(podAddr(api2), manifest.PortHTTP), nil, ""},
					{"tcp across nodes, reverse", web2, agent.TCP, netip.AddrPortFrom(podAddr(web1), manifest.PortHTTP), nil, ""},
					{"tcp bare pods across nodes", probe1, agent.TCP, netip.AddrPortFrom(podAddr(probe2), manifest.PortDebug), nil, ""},
					{"tcp to service api", web1, agent.TCP, netip.AddrPortFrom(vip(apiSvc), manifest.ServicePortHTTP), apiSvc, "http"},
					{"udp to service api", web1, agent.UDP, netip.AddrPortFrom(vip(apiSvc), manifest.ServicePortUDPEcho), apiSvc, "udp-echo"},
					{"tcp to service web", api2, agent.TCP, netip.AddrPortFrom(vip(webSvc), manifest.ServicePortHTTP), webSvc, "http"},
				} {
					t.Run(fmt.Sprintf("%s/%s", f, c.name), func(t *testing.T) {
						record(t, mode)
						dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
						defer cancel()
						r, err := labDial(dctx, l, c.from, c.proto, c.to)
						if err != nil {
							t.Fatalf("%s -> %s: %v", c.from.Name, c.to, err)
						}
						proto := map[string]uint8{agent.TCP: flow.ProtoTCP, agent.UDP: flow.ProtoUDP}[c.proto]
						// The client's node always sees the connection, as
						// sent (with DNAT); the server's node too when it is
						// another node (after DNAT).
						nodes := []string{c.from.Spec.NodeName}
						var views, raws []flow.Record
						for i := 0; i < len(nodes); i++ {
							conns, err := labtruth.Conntrack(l, nodes[i])
							if err != nil {
								t.Fatal(err)
							}
							conn, ok := labtruth.FindConn(conns, proto, r.Local)
							if !ok {
								t.Fatalf("%s has no conntrack entry from %v", nodes[i], r.Local)
							}
							rec := exportedRecord(conn, proto)
							raw := rec
							raw.ExporterNode = nodes[i]
							raws = append(raws, raw)
							e.Enrich(unsafe.Slice(&rec, 1))
							views = append(views, rec)
							if i == 0 {
								if dst := podAt(t, l.Manifest, rec.DstAddr); dst.Spec.NodeName != nodes[0] {
									nodes = append(nodes, dst.Spec.NodeName)
								}
							}
						}
						for i, rec := range views {
							checkEnriched(t, l.Manifest, nodes[i], rec, c.from, c.svc, c.portName, i == 0 && c.svc != nil)
						}
						checkIPv6Off(t, off, raws)
						if rec := views[0]; rec.Src.Zone != rec.Dst.Zone {
							crossZone[rec.IPVersion]++
						}
					})
				}
			}
			// Cross-zone traffic per family: each family made the same
			// connections, so the counts agree (where DNAT chose
			// endpoints in the same zones; the Service flows may differ).
			t.Logf("%s: cross-zone connections per IP version %v", mode, crossZone)
			if mode == manifest.ModeDual && (crossZone[4] == 0 || crossZone[6] == 0) {
				t.Errorf("dual mode: cross-zone connections per family %v, want some in both", crossZone)
			}
		})
	}
}

// checkIPv6Off feeds the nodes' records of one connection (the client's
// node first) through a correlator backed by off, an Enricher with
// --k8s.enable-ipv6=false: a cross-node connection of either family
// becomes exactly one merged row (IPv6 rows were written twice when the
// switch hid IPv6 nodes from the correlator), and only IPv4 rows are
// enriched.
func checkIPv6Off(t *testing.T, off *enrich.Enricher, raws []flow.Record) {
	t.Helper()
	c := correlate.New(correlate.Config{}, off, nil)
	var out []flow.Record
	for i := range raws {
		out = c.Add(&raws[i], out)
	}
	want := flow.CorrelationNone
	if len(raws) == 2 {
		want = flow.CorrelationMerged
	}
	if len(out) != 1 || out[0].Correlation != want || c.Held() != 0 {
		t.Fatalf("--k8s.enable-ipv6=false: %d rows (held %d) from %d node records, want one %s row", len(out), c.Held(), len(raws), want)
	}
	r := out[0]
	off.Enrich(unsafe.Slice(&r, 1))
	if v6 := r.IPVersion == 6; (r.Src.PodName == "") != v6 {
		t.Errorf("--k8s.enable-ipv6=false: IPv%d row has source pod %q", r.IPVersion, r.Src.PodName)
	}
}

// startEnricher runs an Enricher on inventory files until the test ends.
func startEnricher(t *testing.T, files ...string) *enrich.Enricher {
	t.Helper()
	cfg := enrich.NewConfig()
	cfg.Source = enrich.SourceInventory
	cfg.Inventory = files
	return runEnricher(t, cfg)
}

// runEnricher runs an Enricher of cfg for the test and waits for its sync.
func runEnricher(t *testing.T, cfg enrich.Config) *enrich.Enricher {
	t.Helper()
	e, err := enrich.New(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("enricher: %v", err)
		}
	})
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer wcancel()
	if err := e.WaitForSync(wctx); err != nil {
		t.Fatal(err)
	}
	return e
}

// exportedRecord is the record the exporter builds from a conntrack entry:
// the original source, the reply's source as the destination (the
// endpoint after DNAT), and the original destination as the Service
// address when the entry was DNAT-ed.
func exportedRecord(c labtruth.Conn, proto uint8) flow.Record {
	r := flow.Record{
		FlowStart: c.Start, FlowEnd: time.Now(),
		SrcAddr: c.Orig.Src, SrcPort: c.Orig.SrcPort,
		DstAddr: c.Reply.Src, DstPort: c.Reply.SrcPort,
		Proto:   proto,
		Packets: c.OrigPackets, Bytes: c.OrigBytes, ReversePackets: c.ReplyPackets, ReverseBytes: c.ReplyBytes,
	}
	if c.DstNAT {
		r.ServiceAddr, r.ServicePort = c.Orig.Dst, c.Orig.DstPort
	}
	r.Normalize()
	return r
}

// podAt returns the manifest pod with address a.
func podAt(t *testing.T, m *manifest.Manifest, a netip.Addr) *corev1.Pod {
	t.Helper()
	for i := range m.Pods {
		for _, pa := range manifest.PodAddrs(&m.Pods[i]) {
			if pa == a {
				return &m.Pods[i]
			}
		}
	}
	t.Fatalf("no pod has address %v", a)
	return nil
}

// wantEndpoint is what enrichment must say about pod p.
func wantEndpoint(m *manifest.Manifest, p *corev1.Pod) flow.Endpoint {
	w := flow.Endpoint{PodNamespace: p.Namespace, PodName: p.Name, WorkloadKind: enrich.KindPod, WorkloadName: p.Name, NodeName: p.Spec.NodeName}
	if len(p.OwnerReferences) > 0 { // the lab's ReplicaSets belong to Deployments named after the app
		w.WorkloadKind, w.WorkloadName = enrich.KindDeployment, p.Labels["app"]
	}
	if n, ok := m.Node(p.Spec.NodeName); ok {
		w.Zone = n.Labels[manifest.LabelZone]
	}
	return w
}

func checkEnriched(t *testing.T, m *manifest.Manifest, node string, rec flow.Record, from *corev1.Pod, svc *corev1.Service, portName string, dnat bool) {
	t.Helper()
	dst := podAt(t, m, rec.DstAddr)
	for _, side := range []struct {
		name string
		got  flow.Endpoint
		want flow.Endpoint
		pod  *corev1.Pod
	}{{"source", rec.Src, wantEndpoint(m, from), from}, {"destination", rec.Dst, wantEndpoint(m, dst), dst}} {
		g, w := side.got, side.want
		if g.PodNamespace != w.PodNamespace || g.PodName != w.PodName || g.WorkloadKind != w.WorkloadKind || g.WorkloadName != w.WorkloadName ||
			g.NodeName != w.NodeName || g.Zone != w.Zone || g.Labels["app"] != side.pod.Labels["app"] {
			t.Errorf("%s's view, IPv%d %s: %s/%s %s/%s on %s in %s (labels %v), want %s/%s %s/%s on %s in %s", node, rec.IPVersion, side.name,
				g.PodNamespace, g.PodName, g.WorkloadKind, g.WorkloadName, g.NodeName, g.Zone, g.Labels,
				w.PodNamespace, w.PodName, w.WorkloadKind, w.WorkloadName, w.NodeName, w.Zone)
		}
	}
	want := flow.Service{}
	if dnat {
		if !rec.ServiceAddr.IsValid() {
			t.Fatalf("%s's entry for a Service connection has no DNAT", node)
		}
		want = flow.Service{Namespace: svc.Namespace, Name: svc.Name, PortName: portName}
	}
	if rec.Service != want {
		t.Errorf("%s's view, IPv%d: service %+v, want %+v", node, rec.IPVersion, rec.Service, want)
	}
	typ := flow.FlowTypeInterNode
	if from.Spec.NodeName == dst.Spec.NodeName {
		typ = flow.FlowTypeIntraNode
	}
	if rec.Type != typ {
		t.Errorf("%s's view, IPv%d: flow type %v, want %v", node, rec.IPVersion, rec.Type, typ)
	}
}
