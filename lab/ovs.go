package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

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
	return l.loadOVS(ctx, func(name string, rs *ovs.Ruleset) error {
		if err := l.fenceNode(ctx, name, rs.Ports); err != nil {
			return err
		}
		if err := l.ovsNode(name).Setup(ctx, rs); err != nil {
			return fmt.Errorf("node %s: ovs setup: %w", name, err)
		}
		return nil
	})
}

// loadOVS writes the rules file, renders every node's flows and hands
// them to load (Setup at start, Apply on Reload).
func (l *Lab) loadOVS(ctx context.Context, load func(node string, rs *ovs.Ruleset) error) error {
	env, err := l.ovsEnv()
	if err != nil {
		return err
	}
	rules, err := ovs.Rules(l.Manifest)
	if err != nil {
		return err
	}
	if err := vswitch.WriteRules(l.OVSRulesPath(), rules); err != nil {
		return err
	}
	nodes := l.Manifest.Nodes
	return topology.Parallel(ctx, len(nodes), func(i int) error {
		rs, err := ovs.Render(l.Manifest, nodes[i].Name, env)
		if err != nil {
			return err
		}
		return load(nodes[i].Name, rs)
	})
}

// stopOVS stops the OVS daemons of every node directory under
// stateDir/ovs, from their pid files (also after a crash).
func stopOVS(stateDir string) error {
	dirs, _ := filepath.Glob(filepath.Join(stateDir, ovsDir, "*"))
	return topology.Parallel(context.Background(), len(dirs), func(i int) error { return ovs.Stop(dirs[i], time.Second) })
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
