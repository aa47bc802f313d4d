package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/exporter"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
)

// TestCollector runs the whole ingest path in a lab, in each mode: an
// exporter per node (in process, reading that node's conntrack) sends
// IPFIX to `dualflow collector` (in process, embedded ClickHouse, the lab
// manifest as inventory). Pod traffic across nodes, to a Service and within
// a node must land as one row per connection: cross-node connections merged
// from both nodes' halves, with counters equal to the source node's
// conntrack entry; same-node connections not correlated.
//
// The modes run one after the other: chDB opens one data directory per
// process at a time, and the labs' addresses are the same in every mode.
func TestCollector(t *testing.T) {
	requirePrereqs(t)
	if _, err := chdb.FindLibrary(""); err != nil {
		if os.Getenv("DUALFLOW_E2E") == "1" {
			t.Fatalf("libchdb: %v (run make deps)", err)
		}
		t.Skip("libchdb not available (make deps)")
	}
	dataDir := filepath.Join(t.TempDir(), "data")
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			record(t, mode)
			testCollectorMode(t, mode, dataDir)
		})
	}
}

func testCollectorMode(t *testing.T, mode manifest.Mode, dataDir string) {
	l := startLab(t, mode)
	listen := "[::1]:0"
	if mode == manifest.ModeIPv4 {
		listen = "127.0.0.1:0" // the exporters speak IPFIX over the mode's family
	}
	var cfg collector.Config
	cfg.Store.DataDir = dataDir
	cfg.Writer.FlushInterval = 100 * time.Millisecond
	cfg.IPFIX.TCPAddrs = []string{listen}
	cfg.Correlate.Timeout = 5 * time.Second
	cfg.InventoryFile = l.ManifestPath()
	c, err := collector.New(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cctx, stopCollector := context.WithCancel(context.Background())
	cdone := make(chan error, 1)
	go func() { cdone <- c.Run(cctx) }()
	defer func() {
		stopCollector()
		if err := <-cdone; err != nil {
			t.Errorf("collector: %v", err)
		}
	}()
	addr := c.IPFIXAddrs()["tcp"][0].String()
	for _, node := range []string{"node-1", "node-2"} {
		startExporter(t, l, mode, node, addr)
	}
	time.Sleep(300 * time.Millisecond) // subscribed to events, first dump done

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
	}
	var all []sent
	for _, f := range mode.Families() {
		addrOf := func(p *corev1.Pod) netip.Addr {
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
			name, proto string
			to          netip.AddrPort
		}{
			{"tcp across nodes", agent.TCP, netip.AddrPortFrom(addrOf(api2), manifest.PortHTTP)},
			{"udp across nodes", agent.UDP, netip.AddrPortFrom(addrOf(api2), manifest.PortUDPEcho)},
			{"tcp same node", agent.TCP, netip.AddrPortFrom(addrOf(api1), manifest.PortHTTP)},
			{"tcp to service", agent.TCP, netip.AddrPortFrom(vip, manifest.ServicePortHTTP)},
		} {
			dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			r, err := l.Dial(dctx, web1, s.proto, s.to)
			cancel()
			if err != nil {
				t.Fatalf("%s %s -> %s: %v", f, s.name, s.to, err)
			}
			proto := map[string]uint8{agent.TCP: flow.ProtoTCP, agent.UDP: flow.ProtoUDP}[s.proto]
			all = append(all, sent{fmt.Sprintf("%s/%s", f, s.name), proto, s.to, r.Local})
		}
	}
	conns1, err := l.Conntrack("node-1")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range all {
		t.Run(s.name, func(t *testing.T) {
			ct, ok := lab.FindConn(conns1, s.proto, s.local)
			if !ok {
				t.Fatalf("node-1 has no conntrack entry from %v", s.local)
			}
			endpoint := ct.Reply.Src
			crossNode := strings.HasPrefix(nodeOfPod(l, endpoint), "node-2")
			q := fmt.Sprintf(`SELECT correlation, packets_total, bytes_total, reverse_packets_total, reverse_bytes_total,
				sum(packets) OVER (), src_node, dst_node, exporter_node, toString(service_ip), toString(dst_ip)
				FROM dualflow.flows WHERE ip_version = %d AND protocol = %d AND src_port = %d ORDER BY flow_end`,
				flow.Version(s.local.Addr()), s.proto, s.local.Port())
			rows := waitRows(t, c, q, func(rows [][]string) bool {
				// Wait for the merged row (or, same node, the single row),
				// and past the correlation timeout for stray halves.
				return len(rows) > 0 && (!crossNode || rows[len(rows)-1][0] == "merged")
			})
			time.Sleep(cfg.Correlate.Timeout / 2)
			rows = waitRows(t, c, q, func([][]string) bool { return true })
			if len(rows) != 1 {
				t.Fatalf("%d rows, want 1: %v", len(rows), rows)
			}
			r := rows[0]
			wantCorr, wantDst := "none", "node-1"
			if crossNode {
				wantCorr, wantDst = "merged", "node-2"
			}
			if r[0] != wantCorr || r[6] != "node-1" || r[7] != wantDst || r[8] != "node-1" {
				t.Errorf("correlation %s src_node %s dst_node %s exporter %s; want %s node-1 %s node-1", r[0], r[6], r[7], r[8], wantCorr, wantDst)
			}
			got := fmt.Sprintf("%s/%s %s/%s (deltas %s)", r[1], r[2], r[3], r[4], r[5])
			want := fmt.Sprintf("%d/%d %d/%d (deltas %d)", ct.OrigPackets, ct.OrigBytes, ct.ReplyPackets, ct.ReplyBytes, ct.OrigPackets)
			if got != want {
				t.Errorf("counters %s, source node conntrack %s", got, want)
			}
			if r[10] != ipString(endpoint) {
				t.Errorf("dst_ip %s, want the endpoint %s", r[10], endpoint)
			}
			if ct.DstNAT && r[9] != ipString(s.to.Addr()) {
				t.Errorf("service_ip %s, want %s", r[9], s.to.Addr())
			}
		})
	}
}

// ipString is how toString prints an address column (IPv4 unmapped).
func ipString(a netip.Addr) string { return a.Unmap().String() }

// nodeOfPod returns the node of the pod with address a ("" if none).
func nodeOfPod(l *lab.Lab, a netip.Addr) string {
	for i := range l.Manifest.Pods {
		p := &l.Manifest.Pods[i]
		for _, pa := range manifest.PodAddrs(p) {
			if pa == a {
				return p.Spec.NodeName
			}
		}
	}
	return ""
}

func startExporter(t *testing.T, l *lab.Lab, mode manifest.Mode, node, addr string) {
	cfg := exporter.NewConfig()
	cfg.NodeName = node
	cfg.MetricsAddr = ""
	cfg.NetNS = l.NodeNetNSPath(node)
	cfg.IPv4, cfg.IPv6 = mode.Has(corev1.IPv4Protocol), mode.Has(corev1.IPv6Protocol)
	cfg.RequireAccounting = true
	cfg.PollInterval = 200 * time.Millisecond
	cfg.Store.IdleTimeout = time.Second
	cfg.Store.ActiveTimeout = time.Hour
	cfg.IPFIX.Address = addr
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
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("exporter %s: %v", node, err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("exporter %s did not stop", node)
		}
	})
}

// waitRows runs q (TSV) until ok accepts its rows or 30 s pass.
func waitRows(t *testing.T, c *collector.Collector, q string, ok func([][]string) bool) [][]string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		out, err := c.Conn().Query(context.Background(), q, "TSV")
		if err != nil {
			t.Fatal(err)
		}
		var rows [][]string
		for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
			if line != "" {
				rows = append(rows, strings.Split(line, "\t"))
			}
		}
		if ok(rows) || time.Now().After(deadline) {
			return rows
		}
		time.Sleep(200 * time.Millisecond)
	}
}
