package node

import (
	"bufio"
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
)

// pathOf runs the `nft monitor trace` lines of file (recorded on a real
// cluster's node: kube-proxy in nftables mode, kube-router's iptables-nft
// pod firewalls) through a watch's filter and path, as watchKernel does.
func pathOf(t *testing.T, file string, tb observe.Table, p traceflow.Probe) []traceflow.WatchEvent {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines := make(chan string, 128)
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		lines <- sc.Text()
	}
	close(lines)
	tr := &Tracer{Name: "n", NetNS: "/nonexistent"} // no conntrack to ask
	events := make(chan observe.Event, 128)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go tr.traceEvents(ctx, &monitorSub{lines: lines}, tb, events)
	k := kernelPath{t: tr, p: p}
	var out []traceflow.WatchEvent
	for ev := range events {
		out = append(out, k.add(ev)...)
	}
	return append(out, k.flush()...)
}

// An IPv6 probe to a Service, DNATed by kube-proxy's numgen map to a pod
// of the other node: the packet changes trace id between nat prerouting
// and filter forward, and the path still has the DNAT (its target from
// the packet's headers) and the probe leaving by eth0.
func TestKubeProxyServiceDNATAcrossTraceIDs(t *testing.T) {
	src := netip.MustParseAddr("fd00:10:c0:101::3")
	tb := observe.ProbeTable("dualflow_trace_1_1796359474_43c675325", observe.ProbeMatch{Tag: 1, Src: src, Proto: 6, SrcPort: 51528})
	p := traceflow.Probe{Family: traceflow.IPv6, Src: src, Dst: netip.MustParseAddr("fd00:10:c0:200::7d19"), Protocol: traceflow.TCP,
		SrcPort: 51528, DstPort: 80, Service: "backend/api", Tag: 1}
	var got []string
	var lb *traceflow.Observation
	left := false
	for _, ev := range pathOf(t, "testdata/kube-proxy-ipv6-service-n1.trace", tb, p) {
		if o := ev.Observation; o != nil {
			got = append(got, string(o.Component)+":"+string(o.Action)+":"+o.Interface)
			if o.Component == traceflow.LoadBalancing {
				lb = o
			}
		}
		left = left || ev.Left
	}
	want := "forwarding:received:cni0 load-balancing:forwarded: forwarding:forwarded:eth0"
	if strings.Join(got, " ") != want {
		t.Errorf("path %v, want %s", got, want)
	}
	if lb == nil || lb.Service != "backend/api" || lb.TranslatedDst != netip.MustParseAddrPort("[fd00:10:c0:102::4]:8080") {
		t.Errorf("load balancing %+v, want backend/api to [fd00:10:c0:102::4]:8080", lb)
	}
	if !left {
		t.Error("the probe never left the node")
	}
}

// kube-router rejects a probe in a pod's firewall chain: a rule that names
// no policy, which the node reports with its chain for the controller to
// name.
func TestKubeRouterReject(t *testing.T) {
	testKubeRouterReject(t, "testdata/kube-router-ipv6-reject-n2.trace", traceflow.Rejected)
}

// After kube-router's next sync replaced its rules, nft monitor knows
// them by handle only ("unknown rule handle N"): the drop is still one.
func TestKubeRouterUncachedRuleDrop(t *testing.T) {
	b, err := os.ReadFile("testdata/kube-router-ipv6-reject-n2.trace")
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if i := strings.Index(l, " rule  meta mark & 0x00010000 != 0x00010000 counter packets 27 bytes 2116 reject (verdict drop)"); i > 0 {
			l = l[:i] + " unknown rule handle 1234 (verdict drop)"
		}
		lines = append(lines, l)
	}
	f := filepath.Join(t.TempDir(), "uncached.trace")
	if err := os.WriteFile(f, []byte(strings.Join(lines, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	if string(b) == strings.Join(lines, "\n") {
		t.Fatal("the fixture has no reject rule line to replace")
	}
	testKubeRouterReject(t, f, traceflow.Dropped)
}

func testKubeRouterReject(t *testing.T, file string, want traceflow.Outcome) {
	src := netip.MustParseAddr("fd00:10:c0:101::3")
	tb := observe.ProbeTable("dualflow_trace_1_1796359514_e43b2d2a7", observe.ProbeMatch{Tag: 1, Src: src, Proto: 6, SrcPort: 57985})
	p := traceflow.Probe{Family: traceflow.IPv6, Src: src, Dst: netip.MustParseAddr("fd00:10:c0:102::4"), Protocol: traceflow.TCP,
		SrcPort: 57985, DstPort: 8080, DstPod: "backend/api-774977779b-47x6k", Tag: 1}
	var end *traceflow.WatchEvent
	for _, ev := range pathOf(t, file, tb, p) {
		if ev.Outcome != "" {
			end = &ev
		}
	}
	if end == nil || end.Outcome != want || end.Observation == nil {
		t.Fatalf("outcome %+v, want %s", end, want)
	}
	if o := end.Observation; o.Rule != "KUBE-POD-FW-YXI4EGRXRLR2G42E" || o.Component != traceflow.Forwarding ||
		!strings.Contains(o.Detail, "in filter KUBE-POD-FW-YXI4EGRXRLR2G42E") {
		t.Errorf("drop %+v", o)
	}
}
