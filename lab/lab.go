// Package lab builds a small Kubernetes-like cluster on one machine out of
// network namespaces, for dualflow's demo and its e2e tests: nodes are
// routers with nftables (ClusterIP DNAT and NetworkPolicy enforcement) and
// kernel conntrack; pods are namespaces routed to their node, running small
// TCP/UDP servers. The whole lab is described by a Kubernetes manifest
// (package manifest) that the lab writes to its state directory.
//
// Up builds a lab and returns a *Lab; Open attaches to a running one; Down
// removes one, even after a crash. agent.Dial sends traffic from a pod's
// namespace (Lab.PodNetNSPath); test/support/labtruth reads a node's ground
// truth (conntrack, nftables rule counters) that tests compare dualflow
// against.
//
// Nothing is changed in the root network namespace: no address, route,
// rule or sysctl. Everything lives in namespaces named <prefix>...
package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/internal/atomicfile"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/lab/ovs"
	"github.com/dualflow/dualflow/lab/topology"
	"github.com/dualflow/dualflow/nsrun"
)

// Files in the state directory.
const (
	ManifestFile = "manifest.yaml"
	StateFile    = "state.json"
	runDir       = "run" // pid files
	logDir       = "log" // agent logs
	ovsDir       = "ovs" // OVS datapath: one directory per node, and the rules file
)

// ErrExists means namespaces with the lab's prefix already exist.
var ErrExists = errors.New("lab already exists")

// State is what state.json records about a running lab.
type State struct {
	Prefix   string        `json:"prefix"`
	Mode     manifest.Mode `json:"mode"`
	Datapath string        `json:"datapath"`
	Created  time.Time     `json:"created"`
	// BuildTime is how long Up took, agents included.
	BuildTime time.Duration `json:"build_time_ns"`
}

// Lab is a running lab. Its methods are safe for concurrent use.
type Lab struct {
	cfg      Config
	state    State
	Manifest *manifest.Manifest

	stop context.CancelFunc // stops in-process agents
	wg   sync.WaitGroup     // in-process agents and generator
	gen  *agent.Generator
}

// Up builds the lab described by cfg and starts its agents. If anything
// fails it removes what it built. ctx bounds the build only; in-process
// agents run until Close or Down.
func Up(ctx context.Context, cfg Config) (*Lab, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("lab config: %w", err)
	}
	start := time.Now()
	if names, err := topology.List(cfg.Prefix); err != nil {
		return nil, err
	} else if len(names) > 0 {
		return nil, fmt.Errorf("%w: %d namespaces start with %q (run `dualflow lab down`)", ErrExists, len(names), cfg.Prefix)
	}
	if b, err := os.ReadFile(filepath.Join(cfg.StateDir, StateFile)); err == nil {
		var st State
		if json.Unmarshal(b, &st) == nil && st.Prefix != "" && st.Prefix != cfg.Prefix {
			if names, _ := topology.List(st.Prefix); len(names) > 0 {
				return nil, fmt.Errorf("%w: state dir %s belongs to the running lab %q", ErrExists, cfg.StateDir, st.Prefix)
			}
		}
	}
	m, err := loadOrGenerate(cfg)
	if err != nil {
		return nil, err
	}
	l := &Lab{cfg: cfg, Manifest: m, state: State{Prefix: cfg.Prefix, Mode: m.Mode(), Datapath: cfg.Datapath, Created: start.UTC()}}
	if err := l.build(ctx); err != nil {
		derr := l.destroy()
		return nil, errors.Join(fmt.Errorf("lab up: %w", err), derr)
	}
	l.state.BuildTime = time.Since(start)
	if err := l.writeState(); err != nil {
		derr := l.destroy()
		return nil, errors.Join(err, derr)
	}
	cfg.Logger.Debug("lab up", "mode", l.state.Mode, "nodes", len(m.Nodes), "pods", len(m.Pods), "prefix", cfg.Prefix, "took", l.state.BuildTime.Round(time.Millisecond))
	return l, nil
}

func loadOrGenerate(cfg Config) (*manifest.Manifest, error) {
	if cfg.ManifestFile == "" {
		return manifest.Generate(manifest.Spec{Mode: cfg.Mode, Nodes: cfg.Nodes, Prefix: cfg.Prefix})
	}
	m, err := manifest.Load(cfg.ManifestFile)
	if err != nil {
		return nil, err
	}
	// Namespace names always come from this lab's prefix, so that Down finds
	// them; a manifest written by another lab may carry another prefix.
	for i := range m.Nodes {
		delete(m.Nodes[i].Annotations, manifest.AnnotationNetNS)
	}
	for i := range m.Pods {
		delete(m.Pods[i].Annotations, manifest.AnnotationNetNS)
	}
	m.Annotate(cfg.Prefix)
	return m, nil
}

func (l *Lab) build(ctx context.Context) error {
	spec, err := TopologySpec(l.Manifest, l.cfg.Prefix)
	if err != nil {
		return err
	}
	if err := topology.Build(ctx, spec); err != nil {
		return err
	}
	if err := os.MkdirAll(l.cfg.StateDir, 0o755); err != nil {
		return fmt.Errorf("state dir: %w", err)
	}
	if l.state.Datapath == DatapathOVS {
		err = l.startOVS(ctx)
	} else {
		err = l.applyRules(ctx)
	}
	if err != nil {
		return err
	}
	if err := l.startAgents(); err != nil {
		return err
	}
	if l.cfg.Traffic {
		return l.startTraffic()
	}
	return nil
}

// TopologySpec derives the network to build from the manifest: node
// underlay addresses from the nodes' InternalIPs, routes from their
// spec.podCIDRs, pod addresses from status.podIPs.
func TopologySpec(m *manifest.Manifest, prefix string) (*topology.Spec, error) {
	spec := &topology.Spec{Fabric: manifest.FabricNetNS(prefix)}
	fams := m.Mode().Families()
	gw4 := map[string]netip.Addr{}
	nodeNS := map[string]string{}
	for i := range m.Nodes {
		n := &m.Nodes[i]
		tn := topology.Node{NetNS: n.Annotations[manifest.AnnotationNetNS], FabricPort: "n" + strconv.Itoa(i+1)}
		nodeNS[n.Name] = tn.NetNS
		for _, f := range fams {
			a, ok := manifest.NodeAddr(n, f)
			if !ok {
				return nil, fmt.Errorf("node %s: no %s InternalIP", n.Name, f)
			}
			tn.Addrs = append(tn.Addrs, netip.PrefixFrom(a, manifest.NodeNetwork(f).Bits()))
			cidr, ok := manifest.NodePodCIDR(n, f)
			if !ok {
				return nil, fmt.Errorf("node %s: no %s pod CIDR", n.Name, f)
			}
			if f == corev1.IPv4Protocol {
				gw4[n.Name] = cidr.Addr().Next()
				tn.Gateways = append(tn.Gateways, gw4[n.Name])
			}
			for j := range m.Nodes {
				if j == i {
					continue
				}
				o := &m.Nodes[j]
				via, ok1 := manifest.NodeAddr(o, f)
				dst, ok2 := manifest.NodePodCIDR(o, f)
				if ok1 && ok2 {
					tn.Routes = append(tn.Routes, topology.Route{Dst: dst, Via: via})
				}
			}
		}
		spec.Nodes = append(spec.Nodes, tn)
	}
	for i := range m.Pods {
		p := &m.Pods[i]
		node, ok := nodeNS[p.Spec.NodeName]
		if !ok {
			return nil, fmt.Errorf("pod %s/%s: unknown node %q", p.Namespace, p.Name, p.Spec.NodeName)
		}
		spec.Pods = append(spec.Pods, topology.Pod{
			NetNS: p.Annotations[manifest.AnnotationNetNS], Node: node,
			HostIface: p.Annotations[manifest.AnnotationHostIface],
			Addrs:     manifest.PodAddrs(p), GatewayV4: gw4[p.Spec.NodeName],
		})
	}
	return spec, nil
}

// applyRules loads each node's ruleset with `nft -f -` inside the node.
func (l *Lab) applyRules(ctx context.Context) error {
	return topology.Parallel(ctx, len(l.Manifest.Nodes), func(i int) error {
		n := &l.Manifest.Nodes[i]
		rules, err := nft.Render(l.Manifest, n.Name, nft.Options{})
		if err != nil {
			return err
		}
		nftBin, err := NFTPath()
		if err != nil {
			return err
		}
		if _, err := nsrun.Output(ctx, l.NodeNetNSPath(n.Name), []byte(rules), nftBin, "-f", "-"); err != nil {
			return fmt.Errorf("node %s: load ruleset: %w", n.Name, err)
		}
		return nil
	})
}

// NFTPath finds the nft binary (topology.Tool).
func NFTPath() (string, error) {
	p, err := topology.Tool("nft")
	if err != nil {
		return "", fmt.Errorf("%w (install nftables)", err)
	}
	return p, nil
}

// Reload re-renders and reloads every node's ruleset from l.Manifest, e.g.
// after a test changed a NetworkPolicy. Existing connections are kept.
func (l *Lab) Reload(ctx context.Context) error {
	apply := l.applyRules
	if l.state.Datapath == DatapathOVS {
		apply = func(ctx context.Context) error {
			return l.loadOVS(ctx, func(node string, rs *ovs.Ruleset) error { return l.ovsNode(node).Apply(ctx, rs) })
		}
	}
	if err := apply(ctx); err != nil {
		return err
	}
	return l.writeManifest()
}

func (l *Lab) writeState() error {
	if err := l.writeManifest(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(l.state, "", "  ")
	if err != nil {
		return fmt.Errorf("encode state: %w", err)
	}
	if err := os.WriteFile(filepath.Join(l.cfg.StateDir, StateFile), b, 0o644); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}

func (l *Lab) writeManifest() error {
	if err := atomicfile.Write(l.ManifestPath(), 0o600, l.Manifest.Encode); err != nil {
		return fmt.Errorf("write manifest: %w", err)
	}
	return nil
}

// Open attaches to the lab whose state is in stateDir. The returned Lab
// runs no agents of its own; Close is a no-op for it.
func Open(stateDir string, cfg Config) (*Lab, error) {
	cfg.StateDir = stateDir
	cfg.SetDefaults()
	b, err := os.ReadFile(filepath.Join(stateDir, StateFile))
	if err != nil {
		return nil, fmt.Errorf("open lab: %w", err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		return nil, fmt.Errorf("open lab: decode state: %w", err)
	}
	m, err := manifest.Load(filepath.Join(stateDir, ManifestFile))
	if err != nil {
		return nil, fmt.Errorf("open lab: %w", err)
	}
	cfg.Prefix, cfg.Mode = st.Prefix, st.Mode
	return &Lab{cfg: cfg, state: st, Manifest: m}, nil
}

// State returns what state.json records.
func (l *Lab) State() State { return l.state }

// Mode returns the lab mode.
func (l *Lab) Mode() manifest.Mode { return l.state.Mode }

// ManifestPath returns the path of the manifest file.
func (l *Lab) ManifestPath() string { return filepath.Join(l.cfg.StateDir, ManifestFile) }

// Close stops the agents and traffic generator running in this process and
// waits for them. It leaves the network in place; see Down.
func (l *Lab) Close() error {
	if l.stop != nil {
		l.stop()
	}
	l.wg.Wait()
	return nil
}

// Down stops this process's agents and removes the lab (see Down).
func (l *Lab) Down() error {
	return errors.Join(l.Close(), l.destroy())
}

func (l *Lab) destroy() error {
	if l.stop != nil {
		l.stop()
		l.wg.Wait()
	}
	// This lab's own prefix, never one read from a (possibly stale) state
	// file: a failed Up must remove the namespaces it created.
	return down(l.cfg.StateDir, l.cfg.Prefix)
}

// Down removes a lab without needing it to be healthy: it kills the agent
// processes recorded in stateDir's pid files, kills every process inside a
// namespace named prefix*, deletes those namespaces, and removes the files
// the lab wrote to stateDir. If stateDir has a state file, its prefix wins
// over the argument.
func Down(stateDir, prefix string) error {
	return down(stateDir, RecordedPrefix(stateDir, prefix))
}

// RecordedPrefix returns the prefix recorded in stateDir's state file, or
// prefix when there is none: the namespaces Down(stateDir, prefix) removes.
func RecordedPrefix(stateDir, prefix string) string {
	if b, err := os.ReadFile(filepath.Join(stateDir, StateFile)); err == nil {
		var st State
		if json.Unmarshal(b, &st) == nil && st.Prefix != "" {
			return st.Prefix
		}
	}
	return prefix
}

func down(stateDir, prefix string) error {
	if err := ValidatePrefix(prefix); err != nil {
		return fmt.Errorf("lab down: %w", err)
	}
	errs := []error{killPidFiles(stateDir), stopOVS(stateDir), topology.Destroy(prefix, 2*time.Second)}
	for _, f := range []string{StateFile, ManifestFile, runDir, logDir, ovsDir} {
		errs = append(errs, os.RemoveAll(filepath.Join(stateDir, f)))
	}
	os.Remove(stateDir) // only if empty
	return errors.Join(errs...)
}
