package ovs

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/ovs"
)

func TestPortMasks(t *testing.T) {
	for _, r := range [][2]uint16{{7000, 7100}, {1, 65535}, {8080, 8080}, {0, 0}, {1024, 2047}, {65534, 65535}} {
		masks := PortMasks(r[0], r[1])
		covered := map[int]bool{}
		for _, m := range masks {
			v, mask := m, "0xffff"
			if i := strings.IndexByte(m, '/'); i >= 0 {
				v, mask = m[:i], m[i+1:]
			}
			vv, _ := strconv.ParseUint(v, 0, 16)
			mm, _ := strconv.ParseUint(mask, 0, 16)
			for p := range 65536 {
				if uint64(p)&mm == vv {
					if covered[p] {
						t.Errorf("%v: port %d covered twice", r, p)
					}
					covered[p] = true
				}
			}
		}
		if len(covered) != int(r[1])-int(r[0])+1 || !covered[int(r[0])] || !covered[int(r[1])] {
			t.Errorf("%v: masks %v cover %d ports", r, masks, len(covered))
		}
	}
}

func TestSubtract(t *testing.T) {
	tests := []struct {
		block  string
		except []string
		want   int
		probe  map[string]bool // address -> inside the result
	}{
		{"198.18.0.0/16", []string{"198.18.1.0/24"}, 8, map[string]bool{"198.18.1.7": false, "198.18.2.11": true, "198.18.0.1": true, "198.18.255.1": true}},
		{"fd00:10::/56", []string{"fd00:10:0:1::/64", "fd00:10:0:3::/64"}, 8, map[string]bool{"fd00:10:0:1::11": false, "fd00:10:0:3::1": false, "fd00:10:0:2::11": true}},
		{"198.18.1.0/24", []string{"198.18.0.0/16"}, 0, nil},
		{"198.18.0.0/16", []string{"fd00:10::/56", "198.19.0.0/16"}, 1, map[string]bool{"198.18.1.7": true}},
	}
	for _, tc := range tests {
		t.Run(tc.block, func(t *testing.T) {
			var ex []netip.Prefix
			for _, e := range tc.except {
				ex = append(ex, netip.MustParsePrefix(e))
			}
			got := Subtract(netip.MustParsePrefix(tc.block), ex)
			if len(got) != tc.want {
				t.Errorf("%d prefixes %v, want %d", len(got), got, tc.want)
			}
			for a, in := range tc.probe {
				found := false
				for _, p := range got {
					found = found || p.Contains(netip.MustParseAddr(a))
				}
				if found != in {
					t.Errorf("%s inside = %v, want %v", a, found, in)
				}
			}
		})
	}
}

func testEnv(m *manifest.Manifest) Env {
	env := Env{PodMACs: map[string]net.HardwareAddr{}, NodeMACs: map[string]net.HardwareAddr{}}
	for i, p := range m.Pods {
		env.PodMACs[p.Annotations[manifest.AnnotationNetNS]] = net.HardwareAddr{2, 0, 0, 0, 1, byte(i)}
	}
	for i, n := range m.Nodes {
		env.NodeMACs[n.Name] = net.HardwareAddr{2, 0, 0, 0, 2, byte(i)}
	}
	return env
}

// TestRender checks the default lab's flows on node-2 per mode: allow
// flows with the rule's cookie and ID, drop flows with the drop rule's
// cookie, Service groups, forwarding, and no Service or neighbour flow of
// a family the mode lacks (policy ipBlocks of the other family still get
// flows, as they get nft rules).
func TestRender(t *testing.T) {
	for _, tc := range []struct {
		mode    manifest.Mode
		want    []string
		notWant []string
	}{
		{manifest.ModeIPv4, []string{
			"table=45,priority=19999,cookie=ALLOWWEB,tcp,tp_dst=8080,nw_dst=198.18.2.11,nw_src=198.18.1.10,actions=load:ALLOWID->NXM_NX_REG5[],goto_table:50",
			"table=45,priority=20000,cookie=METRICS,tcp,tp_dst=9090,nw_dst=198.18.2.11,nw_src=198.18.0.0/23,",
			"table=45,priority=100,cookie=DROPAPI,ip,nw_dst=198.18.2.11,actions=meter:1,controller(max_len=128)",
			"table=40,priority=100,cookie=DROPPROBE,ip,in_port=12,actions=meter:1,controller(max_len=128)",
			"table=30,priority=100,cookie=",
			",tcp,nw_dst=198.19.0.11,tp_dst=80,actions=group:",
			"table=70,priority=50,cookie=0xdf01000000000046,ip,nw_dst=198.18.1.0/24,actions=mod_dl_src:02:00:00:00:02:01,mod_dl_dst:02:00:00:00:02:00,dec_ttl,output:1",
			"in_port=10,arp,arp_op=1,arp_tpa=198.18.2.1,",
		}, []string{"icmp_type=135", "tcp6,ipv6_dst=fd00:10:ff"}},
		{manifest.ModeIPv6, []string{
			"table=45,priority=19999,cookie=ALLOWWEB,tcp6,tp_dst=8080,ipv6_dst=fd00:10:0:2::11,ipv6_src=fd00:10:0:1::10,actions=load:ALLOWID->NXM_NX_REG5[],goto_table:50",
			"table=45,priority=100,cookie=DROPAPI,ipv6,ipv6_dst=fd00:10:0:2::11,actions=meter:1,controller(max_len=128)",
			"table=40,priority=100,cookie=DROPPROBE,ipv6,in_port=12,actions=meter:1,controller(max_len=128)",
			",tcp6,ipv6_dst=fd00:10:ff::11,tp_dst=80,actions=group:",
			"in_port=10,icmp6,icmp_type=135,nd_target=fe80::ecee:eeff:feee:eeee,",
			"ipv6,ipv6_dst=fd00:10:0:1::/64,actions=mod_dl_src:02:00:00:00:02:01,",
			// The metrics policy has no IPv6 block (the dual-stack gap): no
			// IPv6 allow flow for port 9090.
		}, []string{"arp_tpa", "tcp,nw_dst=198.19", "tcp6,tp_dst=9090,ipv6_dst=fd00:10:0:2::11"}},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			m, err := manifest.Generate(manifest.Spec{Mode: tc.mode, Nodes: 2})
			if err != nil {
				t.Fatal(err)
			}
			rs, err := Render(m, "node-2", testEnv(m))
			if err != nil {
				t.Fatal(err)
			}
			api, _ := podOn(m, "backend", "api", "node-2")
			probe, _ := podOn(m, "tools", "probe", "node-2")
			allow := nft.RuleName("backend", manifest.PolicyAllowWeb, nft.Ingress, 0)
			metrics := nft.RuleName("backend", manifest.PolicyMetricsIPv4, nft.Ingress, 0)
			r := strings.NewReplacer(
				"ALLOWWEB", fmt.Sprintf("%#x", ovs.Cookie(ovs.KindAllow, ovs.RuleID(allow))),
				"ALLOWID", fmt.Sprintf("%#x", ovs.RuleID(allow)),
				"METRICS", fmt.Sprintf("%#x", ovs.Cookie(ovs.KindAllow, ovs.RuleID(metrics))),
				"DROPAPI", fmt.Sprintf("%#x", ovs.Cookie(ovs.KindDrop, ovs.RuleID(nft.DropName(nft.Ingress, "backend", api)))),
				"DROPPROBE", fmt.Sprintf("%#x", ovs.Cookie(ovs.KindDrop, ovs.RuleID(nft.DropName(nft.Egress, "tools", probe)))),
			)
			for _, w := range tc.want {
				if w = r.Replace(w); !strings.Contains(rs.Flows, w) {
					t.Errorf("missing %q in\n%s", w, rs.Flows)
				}
			}
			for _, nw := range tc.notWant {
				if strings.Contains(rs.Flows, nw) {
					t.Errorf("unexpected %q", nw)
				}
			}
			if !strings.Contains(rs.Groups, "type=select,bucket=actions=ct(commit,zone=1,nat(dst=") || rs.NFlows < 30 {
				t.Errorf("groups %q, %d flows", rs.Groups, rs.NFlows)
			}
			if len(rs.Ports) != 4 || rs.Ports[0] != (Port{"eth0", UplinkPort}) {
				t.Errorf("ports %+v", rs.Ports)
			}
		})
	}
}

func podOn(m *manifest.Manifest, ns, app, node string) (string, bool) {
	for _, p := range m.PodsOnNode(node) {
		if p.Namespace == ns && p.Labels["app"] == app {
			return p.Name, true
		}
	}
	return "", false
}

func TestRules(t *testing.T) {
	m, err := manifest.Generate(manifest.Spec{Mode: manifest.ModeDual, Nodes: 3})
	if err != nil {
		t.Fatal(err)
	}
	rules, err := Rules(m)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]ovs.Rule{}
	for _, r := range rules {
		names[r.Name] = r
		if r.ID != ovs.RuleID(r.Name) {
			t.Errorf("rule %s: id %#x", r.Name, r.ID)
		}
	}
	if r, ok := names[nft.RuleName("tools", "restrict-egress", nft.Egress, 1)]; !ok || r.Kind != ovs.KindAllow || r.Index != 1 || r.Direction != "egress" {
		t.Errorf("restrict-egress rule 1: %+v %v", r, ok)
	}
	if r, ok := names[nft.DropName(nft.Egress, "tools", "probe-3")]; !ok || r.Kind != ovs.KindDrop || r.Pod != "probe-3" {
		t.Errorf("drop rule of probe-3: %+v %v", r, ok)
	}
}
