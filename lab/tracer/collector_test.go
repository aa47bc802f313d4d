package tracer

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
)

// TestCollector feeds nft trace lines (as captured in the lab) of one probe
// and checks the observations they become.
func TestCollector(t *testing.T) {
	inv := inventory(t, manifest.ModeDual)
	api2 := podRef(t, inv, manifest.NSBackend, "api", 2)
	_, api2Name, _ := strings.Cut(api2, "/")
	tests := []struct {
		name  string
		probe traceflow.Probe
		lines []struct{ node, line string }
		want  []traceflow.Observation
		out   traceflow.Outcome
	}{
		{"service dnat then allow", traceflow.Probe{Src: mustAddr("198.18.1.10"), Dst: mustAddr("198.19.0.11"), DstPort: 80, Service: "backend/api"},
			[]struct{ node, line string }{
				{"node-1", `trace id 1 inet dualflow_trace_1 pre packet: iif "veth9dd0" ether saddr ee:67:82:5d:a1:0e ip saddr 198.18.1.10 ip daddr 198.19.0.11 tcp sport 40000 tcp dport 80`},
				{"node-1", `trace id 1 inet dualflow ep/backend/api/http/v4/1 rule meta l4proto tcp counter packets 1 bytes 40 dnat ip to 198.18.2.11:8080 comment "endpoint 198.18.2.11:8080 of backend/api/http/v4" (verdict accept)`},
				{"node-1", `trace id 1 inet dualflow forward packet: iif "veth9dd0" oif "eth0" ip saddr 198.18.1.10 ip daddr 198.18.2.11 tcp sport 40000 tcp dport 8080`},
				{"node-2", `trace id 2 inet dualflow ingress/backend/x rule ip saddr { 198.18.1.10 } tcp dport 8080 counter name "backend/allow-web-to-api/ingress/0" accept comment "backend/allow-web-to-api/ingress/0" (verdict accept)`},
				{"node-2", `trace id 2 inet dualflow_trace_1 post packet: iif "eth0" oif "vethd9cd" ip saddr 198.18.1.10 ip daddr 198.18.2.11 tcp sport 40000 tcp dport 8080`},
			},
			[]traceflow.Observation{
				{Node: "node-1", Component: traceflow.Forwarding, Action: traceflow.ActionReceived, Interface: "veth9dd0"},
				{Node: "node-1", Component: traceflow.LoadBalancing, Action: traceflow.ActionForwarded, Service: "backend/api", TranslatedDst: netip.MustParseAddrPort("198.18.2.11:8080"), Detail: "endpoint 198.18.2.11:8080 of backend/api/http/v4"},
				{Node: "node-1", Component: traceflow.Routing, Action: traceflow.ActionForwarded, Interface: "eth0", TranslatedDst: netip.MustParseAddrPort("198.18.2.11:8080")},
				{Node: "node-2", Component: traceflow.NetworkPolicy, Action: traceflow.ActionForwarded, Policy: "backend/allow-web-to-api", Rule: "backend/allow-web-to-api/ingress/0", Detail: "ingress"},
				{Node: "node-2", Component: traceflow.Forwarding, Action: traceflow.ActionForwarded, Interface: "vethd9cd"},
			}, ""},
		{"ipv6 default deny", traceflow.Probe{Src: mustAddr("fd00:10:0:1::12"), Dst: mustAddr("fd00:10:0:2::11"), DstPort: 8080},
			[]struct{ node, line string }{
				{"node-2", `trace id 3 inet dualflow ingress/backend/` + api2Name + ` rule counter name "drop/ingress/backend/` + api2Name + `" log prefix "drop/ingress/backend/` + api2Name + `" group 100 drop comment "drop/ingress/backend/` + api2Name + `" (verdict drop)`},
			},
			[]traceflow.Observation{
				{Node: "node-2", Component: traceflow.NetworkPolicy, Action: traceflow.ActionDropped, Rule: "drop/ingress/backend/" + api2Name,
					Policy: "backend/default-deny-ingress,backend/allow-web-to-api,backend/allow-metrics-ipv4-only", Detail: "no rule of the isolating policies allows it"},
			}, traceflow.Dropped},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := collector{p: tt.probe, t: &Tracer{inv: inv}, srcNode: "node-1"}
			for _, l := range tt.lines {
				ev, ok := observe.ParseTrace(l.line)
				if !ok {
					t.Fatalf("unparsed %q", l.line)
				}
				c.add(nodeEvent{node: l.node, ev: ev})
			}
			var got []traceflow.Observation
			for _, n := range c.order {
				got = append(got, c.obs[n]...)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %d observations, want %d:\n%+v", len(got), len(tt.want), got)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Errorf("observation %d:\n got %+v\nwant %+v", i, got[i], tt.want[i])
				}
			}
			if c.outcome != tt.out {
				t.Errorf("outcome %q, want %q", c.outcome, tt.out)
			}
		})
	}
}
