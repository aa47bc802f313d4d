package flowmetrics

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"

	"github.com/dualflow/dualflow/flow"
)

// rec is a record of a connection's first slice from pod src to pod dst
// over the family of the addresses.
func rec(src, dst string, srcNS, dstNS string, packets, bytes uint64) flow.Record {
	r := flow.Record{SrcAddr: netip.MustParseAddr(src), DstAddr: netip.MustParseAddr(dst), Proto: flow.ProtoTCP, DstPort: 8080,
		Packets: packets, PacketsDelta: packets, Bytes: bytes, BytesDelta: bytes, ReversePacketsDelta: 1, ReverseBytesDelta: 60,
		Src:     flow.Endpoint{PodNamespace: srcNS, PodName: "web-1", WorkloadKind: "Deployment", WorkloadName: "web", NodeName: "node-1"},
		Dst:     flow.Endpoint{PodNamespace: dstNS, PodName: "api-1", WorkloadKind: "Deployment", WorkloadName: "api", NodeName: "node-2"},
		Ingress: flow.Policy{Verdict: flow.VerdictAllowed, Rule: 0, Namespace: dstNS, Name: "allow-web"},
		Egress:  flow.Policy{Verdict: flow.VerdictNotIsolated, Rule: -1},
	}
	r.Normalize()
	return r
}

var families = map[string][][2]string{
	"ipv4": {{"198.18.1.10", "198.18.2.11"}},
	"ipv6": {{"fd00:10:0:1::10", "fd00:10:0:2::11"}},
	"dual": {{"198.18.1.10", "198.18.2.11"}, {"fd00:10:0:1::10", "fd00:10:0:2::11"}},
}

// TestObserve: the default metrics, scraped from a registry, in three
// modes: bytes, packets and connections per family; the later slice of a
// connection adds bytes, not a connection; a denied connection counts by
// its policy and the node of the side that denied; probes count nothing.
func TestObserve(t *testing.T) {
	for _, mode := range []string{"ipv4", "ipv6", "dual"} {
		t.Run(mode, func(t *testing.T) {
			m, err := New(DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			reg := prometheus.NewPedanticRegistry()
			reg.MustRegister(m)
			var recs []flow.Record
			var want strings.Builder
			for _, a := range families[mode] {
				first := rec(a[0], a[1], "frontend", "backend", 10, 1000)
				first.DualStackGap = true // the auditor's flag: a connection counts once
				later := first
				later.Packets, later.PacketsDelta, later.Bytes, later.BytesDelta = 15, 5, 1500, 500
				denied := rec(a[0], a[1], "frontend", "backend", 2, 120)
				denied.DstPort = 9090
				denied.Ingress = flow.Policy{Verdict: flow.VerdictDenied, Rule: -1, Namespace: "backend", Name: "default-deny"}
				probe := first
				probe.ProbeTraceID = "t1"
				recs = append(recs, first, later, denied, probe)
				fam := "ipv4"
				if first.IPVersion == 6 {
					fam = "ipv6"
				}
				fmt.Fprintf(&want, `dualflow_flow_bytes_total{dst_namespace="backend",ip_family=%q,protocol="TCP",src_namespace="frontend",verdict="allowed"} 1500
dualflow_flow_bytes_total{dst_namespace="backend",ip_family=%[1]q,protocol="TCP",src_namespace="frontend",verdict="denied"} 120
dualflow_flow_connections_total{dst_namespace="backend",ip_family=%[1]q,protocol="TCP",src_namespace="frontend",verdict="allowed"} 1
dualflow_flow_connections_total{dst_namespace="backend",ip_family=%[1]q,protocol="TCP",src_namespace="frontend",verdict="denied"} 1
dualflow_flow_denied_connections_total{dst_namespace="backend",ip_family=%[1]q,node="node-2",policy="backend/default-deny",protocol="TCP",src_namespace="frontend"} 1
dualflow_flow_dual_stack_gap_connections_total{dst_namespace="backend",ip_family=%[1]q,protocol="TCP",src_namespace="frontend",verdict="allowed"} 1
dualflow_flow_packets_total{dst_namespace="backend",ip_family=%[1]q,protocol="TCP",src_namespace="frontend",verdict="allowed"} 15
dualflow_flow_packets_total{dst_namespace="backend",ip_family=%[1]q,protocol="TCP",src_namespace="frontend",verdict="denied"} 2
`, fam)
			}
			m.Observe(recs)
			got := gather(t, reg, "dualflow_flow_bytes_total", "dualflow_flow_packets_total", "dualflow_flow_connections_total", "dualflow_flow_denied_connections_total", "dualflow_flow_dual_stack_gap_connections_total")
			if w := sortLines(want.String()); got != w {
				t.Errorf("scraped\n%s\nwant\n%s", got, w)
			}
		})
	}
}

// TestFold: past MaxSeries a new series folds its namespaces into _other
// and keeps its family; the folds are counted, and the series stay
// bounded whatever the stream.
func TestFold(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxSeries = 3
	cfg.Metrics = cfg.Metrics[2:3] // connections
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	for i := range 1000 {
		for _, a := range families["dual"] {
			m.Observe([]flow.Record{rec(a[0], a[1], fmt.Sprintf("ns-%d", i), "backend", 1, 60)})
		}
	}
	got := gather(t, reg, "dualflow_flow_connections_total", "dualflow_flow_metrics_folded_total", "dualflow_flow_metrics_series")
	want := sortLines(`dualflow_flow_connections_total{dst_namespace="backend",ip_family="ipv4",protocol="TCP",src_namespace="ns-0",verdict="allowed"} 1
dualflow_flow_connections_total{dst_namespace="backend",ip_family="ipv4",protocol="TCP",src_namespace="ns-1",verdict="allowed"} 1
dualflow_flow_connections_total{dst_namespace="backend",ip_family="ipv6",protocol="TCP",src_namespace="ns-0",verdict="allowed"} 1
dualflow_flow_connections_total{dst_namespace="_other",ip_family="ipv4",protocol="TCP",src_namespace="_other",verdict="allowed"} 998
dualflow_flow_connections_total{dst_namespace="_other",ip_family="ipv6",protocol="TCP",src_namespace="_other",verdict="allowed"} 999
dualflow_flow_metrics_folded_total{metric="connections"} 1997
dualflow_flow_metrics_series{metric="connections"} 5
`)
	if got != want {
		t.Errorf("scraped\n%s\nwant\n%s", got, want)
	}
}

// TestExpire: a series not updated for the expire time goes at the next
// scrape (a deleted workload's), and is counted; an updated one stays.
func TestExpire(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Expire = Duration{10 * time.Minute}
	m, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	m.now = func() time.Time { return now }
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	m.Observe([]flow.Record{rec("198.18.1.10", "198.18.2.11", "gone", "backend", 1, 60), rec("fd00:10:0:1::10", "fd00:10:0:2::11", "kept", "backend", 1, 60)})
	now = now.Add(6 * time.Minute)
	m.Observe([]flow.Record{rec("fd00:10:0:1::10", "fd00:10:0:2::11", "kept", "backend", 1, 60)})
	now = now.Add(6 * time.Minute)
	got := gather(t, reg, "dualflow_flow_connections_total", "dualflow_flow_metrics_expired_total")
	want := sortLines(`dualflow_flow_connections_total{dst_namespace="backend",ip_family="ipv6",protocol="TCP",src_namespace="kept",verdict="allowed"} 2
dualflow_flow_metrics_expired_total{metric="bytes"} 1
dualflow_flow_metrics_expired_total{metric="connections"} 1
dualflow_flow_metrics_expired_total{metric="denied_connections"} 0
dualflow_flow_metrics_expired_total{metric="dual_stack_gap_connections"} 0
dualflow_flow_metrics_expired_total{metric="packets"} 1
`)
	if got != want {
		t.Errorf("scraped\n%s\nwant\n%s", got, want)
	}
}

// TestConfig: a file selects metrics and labels (workloads, Service);
// bad names, labels, bounds and fields are errors naming them.
func TestConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(s string) string {
		p := filepath.Join(dir, fmt.Sprintf("c%d.yaml", len(s)))
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := LoadConfig(write("metrics:\n- name: bytes\n  labels: [src_workload, dst_workload, service, ip_family]\nmaxSeries: 50\nexpire: 5m\n"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	r := rec("fd00:10:0:1::10", "fd00:10:0:2::11", "frontend", "backend", 1, 60)
	r.Service = flow.Service{Namespace: "backend", Name: "api"}
	m.Observe([]flow.Record{r})
	if got, want := gather(t, reg, "dualflow_flow_bytes_total"), `dualflow_flow_bytes_total{dst_workload="Deployment/api",ip_family="ipv6",service="backend/api",src_workload="Deployment/web"} 60`+"\n"; got != want {
		t.Errorf("scraped\n%s\nwant\n%s", got, want)
	}
	if m.Config().MaxSeries != 50 || m.Config().Expire.Duration != 5*time.Minute {
		t.Errorf("config %+v", m.Config())
	}
	off, err := LoadConfig(write("metrics: []\n"))
	if err != nil || len(off.Metrics) != 0 {
		t.Errorf("metrics: [] gives %+v, %v", off, err)
	}
	for _, tc := range []struct{ file, want string }{
		{"metrics:\n- name: flows\n", `metric "flows"`},
		{"metrics:\n- name: bytes\n  labels: [pod]\n", `label "pod"`},
		{"metrics:\n- name: bytes\n  labels: [policy]\n", `label "policy" is only for denied_connections`},
		{"metrics:\n- name: bytes\n- name: bytes\n", "listed twice"},
		{"maxSeries: -1\n", "maxSeries -1"},
		{"expire: soon\n", "duration"},
		{"series: 5\n", `unknown field "series"`},
	} {
		if _, err := LoadConfig(write(tc.file)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error naming %s", tc.file, err, tc.want)
		}
	}
}

// gather returns the scraped samples of the named metrics, one per line,
// sorted.
func gather(t *testing.T, reg *prometheus.Registry, names ...string) string {
	t.Helper()
	var lines []string
	for _, n := range names {
		out, err := testutil.CollectAndFormat(reg, expfmt.TypeTextPlain, n)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if l != "" && !strings.HasPrefix(l, "#") {
				lines = append(lines, l)
			}
		}
	}
	return sortLines(strings.Join(lines, "\n"))
}

func sortLines(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n") + "\n"
}
