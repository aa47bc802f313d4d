package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	xovs "github.com/dualflow/dualflow/exporter/ovs"
	"github.com/dualflow/dualflow/lab/ovs"
	"github.com/dualflow/dualflow/lab/topology"
	vswitch "github.com/dualflow/dualflow/ovs"
)

// RulesFile is the rules file of the OVS datapath (rule ID → NetworkPolicy
// rule), under <state-dir>/ovs/, for exporter/ovs (format: package ovs).
const RulesFile = "rules.json"

// OVSDir returns the directory of node's OVS daemons (their OVS_RUNDIR),
// "" when the lab does not run the OVS datapath.
func (l *Lab) OVSDir(node string) string {
	if l.state.Datapath != DatapathOVS {
		return ""
	}
	return filepath.Join(l.cfg.StateDir, ovsDir, node)
}

// OVSRulesPath returns the path of the rules file ("" without OVS).
func (l *Lab) OVSRulesPath() string {
	if l.state.Datapath != DatapathOVS {
		return ""
	}
	return filepath.Join(l.cfg.StateDir, ovsDir, RulesFile)
}

// ovsNode returns the OVS of node.
func (l *Lab) ovsNode(node string) ovs.Node {
	return ovs.Node{Dir: filepath.Join(l.cfg.StateDir, ovsDir, node), NetNS: l.NodeNetNSPath(node)}
}

// startOVS starts every node's OVS, fences the node's kernel stack off the
// OVS ports, turns TX checksum offload off in the pods (the userspace
// datapath reads the partial checksums of offloaded packets as invalid),
// and loads the flows.
func (l *Lab) startOVS(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Join(l.cfg.StateDir, ovsDir), 0o755); err != nil {
		return fmt.Errorf("ovs dir: %w", err)
	}
	nodes := l.Manifest.Nodes
	if err := topology.Parallel(ctx, len(nodes), func(i int) error { return l.ovsNode(nodes[i].Name).Start(ctx) }); err != nil {
		return err
	}
	if err := l.podsTxOff(ctx); err != nil {
		return err
	}
	env, err := l.ovsEnv()
	if err != nil {
		return err
	}
	if err := l.writeOVSRules(); err != nil {
		return err
	}
	return topology.Parallel(ctx, len(nodes), func(i int) error {
		name := nodes[i].Name
		rs, err := ovs.Render(l.Manifest, name, env)
		if err != nil {
			return err
		}
		if err := l.fenceNode(ctx, name, rs.Ports); err != nil {
			return err
		}
		if err := l.ovsNode(name).Setup(ctx, rs); err != nil {
			return fmt.Errorf("node %s: ovs setup: %w", name, err)
		}
		return nil
	})
}

// applyOVS re-renders and reloads every node's flows (Reload).
func (l *Lab) applyOVS(ctx context.Context) error {
	env, err := l.ovsEnv()
	if err != nil {
		return err
	}
	if err := l.writeOVSRules(); err != nil {
		return err
	}
	nodes := l.Manifest.Nodes
	return topology.Parallel(ctx, len(nodes), func(i int) error {
		rs, err := ovs.Render(l.Manifest, nodes[i].Name, env)
		if err != nil {
			return err
		}
		return l.ovsNode(nodes[i].Name).Apply(ctx, rs)
	})
}

func (l *Lab) writeOVSRules() error {
	rules, err := ovs.Rules(l.Manifest)
	if err != nil {
		return err
	}
	return vswitch.WriteRules(l.OVSRulesPath(), rules)
}

// stopOVS stops the OVS daemons of every node directory under
// stateDir/ovs, from their pid files (also after a crash).
func stopOVS(stateDir string) error {
	dirs, _ := filepath.Glob(filepath.Join(stateDir, ovsDir, "*"))
	return topology.Parallel(context.Background(), len(dirs), func(i int) error { return ovs.Stop(dirs[i], time.Second) })
}

// ovsSnapshot reads node's OVS (conntrack and flows) through
// exporter/ovs, for ground truth.
func (l *Lab) ovsSnapshot(node string) (*xovs.Snapshot, error) {
	cfg := xovs.Config{RunDir: l.OVSDir(node), Bridge: ovs.Bridge, RulesFile: l.OVSRulesPath(), IPv4: true, IPv6: true}
	cfg.SetDefaults()
	src, err := xovs.New(cfg, nil)
	if err != nil {
		return nil, err
	}
	return src.Snapshot(context.Background())
}

// ovsConntrack is Conntrack for the OVS datapath: OVS's conntrack (zone
// ovs.Zone) with counters from the learned per-connection flows (IP
// bytes). Start times are unknown (the userspace conntrack has none).
func (l *Lab) ovsConntrack(node string) ([]Conn, error) {
	snap, err := l.ovsSnapshot(node)
	if err != nil {
		return nil, fmt.Errorf("conntrack of %s: %w", node, err)
	}
	counters := snap.Counters()
	out := make([]Conn, 0, len(snap.Conns))
	for i := range snap.Conns {
		e := &snap.Conns[i]
		ok, rk := vswitch.CounterKeys(e)
		oc, rc := counters[ok], counters[rk]
		out = append(out, Conn{
			Orig: e.Orig, Reply: e.Reply, ICMPID: e.ICMPID,
			OrigPackets: oc.Packets, OrigBytes: oc.Bytes, ReplyPackets: rc.Packets, ReplyBytes: rc.Bytes,
			DstNAT: e.DstNAT(), SeenReply: rc.Packets > 0, Assured: e.TCPState == "ESTABLISHED" || e.TCPState == "TIME_WAIT",
			Zone: e.Zone, Mark: e.Mark,
		})
	}
	return out, nil
}

// ovsCounters is Counters for the OVS datapath: the packet and byte counts
// of each rule's flows, summed by the rule name the flows' cookie carries
// (the same names as the kernel datapath's nft counters).
func (l *Lab) ovsCounters(node string) (map[string]Counter, error) {
	snap, err := l.ovsSnapshot(node)
	if err != nil {
		return nil, fmt.Errorf("counters of %s: %w", node, err)
	}
	list, err := ovs.Rules(l.Manifest)
	if err != nil {
		return nil, err
	}
	rules, err := vswitch.NewRules(list)
	if err != nil {
		return nil, err
	}
	out := map[string]Counter{}
	// Every rule has a counter, hit or not, as with nft's named counters.
	for _, r := range list {
		out[r.Name] = Counter{}
	}
	for _, s := range snap.RuleStats(rules) {
		out[s.Rule.Name] = Counter{Packets: s.Packets, Bytes: s.Bytes}
	}
	return out, nil
}

// OVSFlows returns `ovs-ofctl dump-flows` of node's bridge.
func (l *Lab) OVSFlows(ctx context.Context, node string) (string, error) {
	if l.state.Datapath != DatapathOVS {
		return "", fmt.Errorf("lab %s runs the %s datapath", l.cfg.Prefix, l.state.Datapath)
	}
	return l.ovsNode(node).Ofctl(ctx, "dump-flows", ovs.Bridge)
}

// fenceRuleset returns the nft ruleset that keeps a node's kernel stack
// off the OVS ports: OVS reads them with packet sockets, which see frames
// before the ingress hook, so dropping at ingress leaves OVS the only one
// that forwards (the kernel would otherwise answer ARP for the gateway
// and send ICMP errors for packets it does not route).
func fenceRuleset(ports []ovs.Port) string {
	names := make([]string, len(ports))
	for i, p := range ports {
		names[i] = p.Name
	}
	return "table netdev dualflow_ovs\ndelete table netdev dualflow_ovs\ntable netdev dualflow_ovs {\n" +
		"\tchain fence {\n\t\ttype filter hook ingress devices = { " + strings.Join(names, ", ") + " } priority filter; policy drop;\n\t}\n}\n"
}
