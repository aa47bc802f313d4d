package lab

import (
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/lab/manifest"
)

func TestTopologySpec(t *testing.T) {
	tests := []struct {
		mode      manifest.Mode
		nodeAddrs []string // node-1 underlay
		gateways  int
		routes    []string // node-1 routes as dst>via
		podAddrs  int
	}{
		{manifest.ModeIPv4, []string{"198.18.0.1/24"}, 1, []string{"198.18.2.0/24>198.18.0.2"}, 1},
		{manifest.ModeIPv6, []string{"fd00:10::1/64"}, 0, []string{"fd00:10:0:2::/64>fd00:10::2"}, 1},
		{manifest.ModeDual, []string{"198.18.0.1/24", "fd00:10::1/64"}, 1, []string{"198.18.2.0/24>198.18.0.2", "fd00:10:0:2::/64>fd00:10::2"}, 2},
	}
	for _, tc := range tests {
		t.Run(string(tc.mode), func(t *testing.T) {
			m, err := manifest.Generate(manifest.Spec{Mode: tc.mode, Nodes: 2, Prefix: "dfu-"})
			if err != nil {
				t.Fatal(err)
			}
			spec, err := TopologySpec(m, "dfu-")
			if err != nil {
				t.Fatal(err)
			}
			if err := spec.Validate(); err != nil {
				t.Fatal(err)
			}
			n := spec.Nodes[0]
			var got []string
			for _, a := range n.Addrs {
				got = append(got, a.String())
			}
			if strings.Join(got, ",") != strings.Join(tc.nodeAddrs, ",") {
				t.Errorf("node-1 addrs %v, want %v", got, tc.nodeAddrs)
			}
			if len(n.Gateways) != tc.gateways {
				t.Errorf("gateways %v", n.Gateways)
			}
			got = nil
			for _, r := range n.Routes {
				got = append(got, r.Dst.String()+">"+r.Via.String())
			}
			if strings.Join(got, ",") != strings.Join(tc.routes, ",") {
				t.Errorf("routes %v, want %v", got, tc.routes)
			}
			for _, p := range spec.Pods {
				if len(p.Addrs) != tc.podAddrs || !strings.HasPrefix(p.NetNS, "dfu-") || !strings.HasPrefix(p.Node, "dfu-node-") {
					t.Errorf("pod %+v", p)
				}
				if tc.mode != manifest.ModeIPv6 && p.GatewayV4 != netip.MustParseAddr("198.18.1.1") && p.GatewayV4 != netip.MustParseAddr("198.18.2.1") {
					t.Errorf("pod %s gateway %s", p.NetNS, p.GatewayV4)
				}
			}
		})
	}
}

func TestDefaultProbes(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			m, err := manifest.Generate(manifest.Spec{Mode: mode})
			if err != nil {
				t.Fatal(err)
			}
			l := &Lab{cfg: Config{Prefix: "dfu-"}, Manifest: m, state: State{Mode: mode}}
			probes := l.DefaultProbes()
			allowed, denied := map[corev1.IPFamily]int{}, map[corev1.IPFamily]int{}
			for _, p := range probes {
				if manifest.FamilyOf(p.To.Addr()) != p.Family {
					t.Errorf("%s: address %s is not %s", p.Name, p.To, p.Family)
				}
				if p.Allowed {
					allowed[p.Family]++
				} else {
					denied[p.Family]++
				}
			}
			for _, f := range mode.Families() {
				if allowed[f] == 0 || denied[f] == 0 {
					t.Errorf("%s: %d allowed, %d denied: want a mix", f, allowed[f], denied[f])
				}
			}
			if len(l.DefaultFlows()) != len(probes) {
				t.Error("flows and probes differ")
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*Config)
		ok   bool
	}{
		{"defaults", func(*Config) {}, true},
		{"bad mode", func(c *Config) { c.Mode = "ipv5" }, false},
		{"prefix without dash", func(c *Config) { c.Prefix = "df" }, false},
		{"prefix with slash", func(c *Config) { c.Prefix = "d/f-" }, false},
		{"ovs datapath", func(c *Config) { c.Datapath = DatapathOVS }, true},
		{"unknown datapath", func(c *Config) { c.Datapath = "ebpf" }, false},
		{"relative state dir", func(c *Config) { c.StateDir = "lab" }, false},
		{"too many nodes", func(c *Config) { c.Nodes = manifest.MaxNodes + 1 }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c Config
			tc.mod(&c)
			c.SetDefaults()
			if err := c.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}
