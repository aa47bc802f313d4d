package labcmd

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
)

const labHelp = `Build a small dual-stack Kubernetes-like cluster out of network namespaces:
nodes are routers (nftables DNAT + NetworkPolicy, kernel conntrack), pods are
routed namespaces running small TCP/UDP servers. The root namespace is never
changed. The lab is described by a Kubernetes manifest in the state directory.

Subcommands:
  up       build the lab (--mode dual|ipv4|ipv6 --nodes 2 --datapath kernel|ovs)
  down     remove the lab, its processes and namespaces (also after a crash)
  status   show nodes, pods, addresses and services
  manifest print the default lab manifest without building anything
  rules    print the nftables ruleset of a node (the OpenFlow flows with --datapath ovs)
  publish  write the lab's Kubernetes objects into an API server (--kubeconfig), so a
           collector can watch them as it watches a cluster (lab up --kubeconfig does it too)`

// Lab runs `dualflow lab <sub> [flags]`.
func (lc *Commands) Lab(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Println("Usage: dualflow lab <up|down|status|manifest|rules> [flags]\n\n" + labHelp)
		return nil
	}
	subs := map[string]func(context.Context, []string) error{"up": lc.labUp, "down": lc.labDown, "status": lc.labStatus,
		"manifest": lc.labManifest, "rules": lc.labRules, "publish": lc.labPublish,
		"agent": lc.labAgent} // hidden: the workload inside pods and the traffic generator
	if run, ok := subs[args[0]]; ok {
		return run(ctx, args[1:])
	}
	return fmt.Errorf("lab: unknown subcommand %q (want up, down, status, manifest, rules or publish)", args[0])
}

// bindLab binds the lab flags onto fs with their dotted names.
func bindLab(fs *flag.FlagSet, cfg *lab.Config) {
	fs.Func("mode", "IP families: dual, ipv4 or ipv6 (default dual)", func(s string) error {
		m, err := manifest.ParseMode(s)
		cfg.Mode = m
		return err
	})
	fs.IntVar(&cfg.Nodes, "nodes", 2, "number of nodes")
	fs.StringVar(&cfg.Prefix, "prefix", lab.DefaultPrefix, "name prefix of every network namespace of the lab")
	fs.StringVar(&cfg.StateDir, "state-dir", lab.DefaultStateDir, "directory for the manifest, state, pid files and agent logs")
}

func (lc *Commands) labUp(ctx context.Context, args []string) error {
	fs := lc.NewFlagSet("lab up", "[flags]", "Build the lab and start the pod agents (and the traffic generator).")
	var cfg lab.Config
	bindLab(fs, &cfg)
	fs.StringVar(&cfg.Datapath, "datapath", lab.DatapathKernel, "node datapath: kernel (nftables, kernel conntrack) or ovs (an Open vSwitch bridge per node, userspace datapath)")
	fs.StringVar(&cfg.ManifestFile, "manifest", "", "build this manifest instead of the default lab")
	fs.BoolVar(&cfg.Traffic, "traffic", true, "run the traffic generator (default lab only)")
	fs.DurationVar(&cfg.TrafficInterval, "traffic.interval", time.Second, "traffic generator round period")
	var pub publishFlags
	pub.bind(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own binary: %w", err)
	}
	cfg.AgentBinary = exe
	if err := noDemoOn(cfg.StateDir, cfg.Prefix); err != nil {
		return err
	}
	l, err := lab.Up(ctx, cfg)
	if err != nil {
		return err
	}
	st := l.State()
	fmt.Printf("lab up: mode %s, %d nodes, %d pods in %v; manifest %s\n", st.Mode, len(l.Manifest.Nodes), len(l.Manifest.Pods), st.BuildTime.Round(time.Millisecond), l.ManifestPath())
	if pub.kubeconfig == "" {
		return nil
	}
	return pub.publish(ctx, l.Manifest)
}

// publishFlags say where and how to publish a lab's objects.
type publishFlags struct {
	kubeconfig, context, order string
	seed                       uint64
}

func (p *publishFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&p.kubeconfig, "kubeconfig", "", "publish the lab's Kubernetes objects into the API server of this kubeconfig (a test cluster: objects of the same names must not exist)")
	fs.StringVar(&p.context, "context", "", "kubeconfig context (default: the current one)")
	fs.StringVar(&p.order, "order", string(lab.OrderForward), "order of publication after the namespaces: forward, reverse (EndpointSlices before Services, pods before nodes) or random")
	fs.Uint64Var(&p.seed, "seed", 0, "seed of --order random (default: the time)")
}

func (p *publishFlags) publish(ctx context.Context, m *manifest.Manifest) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = p.kubeconfig
	rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: p.context}).ClientConfig()
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	rc.QPS, rc.Burst = 50, 100
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if p.seed == 0 {
		p.seed = uint64(time.Now().UnixNano())
	}
	start := time.Now()
	if err := lab.Publish(ctx, c, m, lab.PublishOptions{Order: lab.PublishOrder(p.order), Seed: p.seed}); err != nil {
		return err
	}
	fmt.Printf("published %d nodes, %d pods, %d services, %d endpointslices, %d networkpolicies to %s (%s order", len(m.Nodes), len(m.Pods),
		len(m.Services), len(m.EndpointSlices), len(m.NetworkPolicies), rc.Host, p.order)
	if p.order == string(lab.OrderRandom) {
		fmt.Printf(", seed %d", p.seed)
	}
	fmt.Printf(") in %v\n", time.Since(start).Round(time.Millisecond))
	return nil
}

func (lc *Commands) labPublish(ctx context.Context, args []string) error {
	fs := lc.NewFlagSet("lab publish", "--kubeconfig FILE [flags]", `Write the running lab's Kubernetes objects (or --manifest's) into an API
server, as a cluster's controllers and kubelets would leave them: namespaces
with their default ServiceAccount, nodes and pods with their status
(addresses of every family), Services with their exact clusterIPs, one
EndpointSlice per Service and family, NetworkPolicies. A collector with
--k8s.source kubeconfig then watches the lab as it watches a cluster.`)
	var cfg lab.Config
	bindLab(fs, &cfg)
	var pub publishFlags
	pub.bind(fs)
	file := fs.String("manifest", "", "publish this manifest instead of the running lab's")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if pub.kubeconfig == "" {
		return errors.New("lab publish: --kubeconfig is required")
	}
	var m *manifest.Manifest
	if *file != "" {
		var err error
		if m, err = manifest.Load(*file); err != nil {
			return err
		}
	} else {
		l, err := lab.Open(cfg.StateDir, cfg)
		if err != nil {
			return err
		}
		m = l.Manifest
	}
	return pub.publish(ctx, m)
}

func (lc *Commands) labDown(_ context.Context, args []string) error {
	fs := lc.NewFlagSet("lab down", "[flags]", "Remove the lab: agent processes, every namespace named <prefix>*, and the state files.")
	var cfg lab.Config
	bindLab(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	// lab.Down removes the namespaces of the prefix the state directory
	// records (the flag only counts without one): guard those, so a demo
	// on the default prefix does not refuse the removal of another lab.
	if err := noDemoOn(cfg.StateDir, lab.RecordedPrefix(cfg.StateDir, cfg.Prefix)); err != nil {
		return err
	}
	start := time.Now()
	if err := lab.Down(cfg.StateDir, cfg.Prefix); err != nil {
		return err
	}
	fmt.Printf("lab down in %v\n", time.Since(start).Round(time.Millisecond))
	return nil
}

func (lc *Commands) labStatus(_ context.Context, args []string) error {
	fs := lc.NewFlagSet("lab status", "[flags]", "Show the nodes, pods, addresses and services of the running lab.")
	var cfg lab.Config
	bindLab(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	l, err := lab.Open(cfg.StateDir, cfg)
	if err != nil {
		return err
	}
	return l.WriteStatus(os.Stdout)
}

func (lc *Commands) labManifest(_ context.Context, args []string) error {
	fs := lc.NewFlagSet("lab manifest", "[flags]", "Print the default lab manifest (multi-document YAML).")
	var cfg lab.Config
	bindLab(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	m, err := manifest.Generate(manifest.Spec{Mode: cfg.Mode, Nodes: cfg.Nodes, Prefix: cfg.Prefix})
	if err != nil {
		return err
	}
	return m.Encode(os.Stdout)
}

func (lc *Commands) labRules(ctx context.Context, args []string) error {
	fs := lc.NewFlagSet("lab rules", "[flags] NODE", "Print the nftables ruleset the lab loads on NODE (from the running lab's manifest, or the default one); for a running OVS lab, the node's OpenFlow flows with their statistics.")
	var cfg lab.Config
	bindLab(fs, &cfg)
	if err := fs.Parse(args); err != nil {
		return err
	}
	node := cmp.Or(fs.Arg(0), manifest.NodeName(1))
	var m *manifest.Manifest
	if l, err := lab.Open(cfg.StateDir, cfg); err == nil && l.State().Datapath == lab.DatapathOVS {
		flows, err := l.OVSFlows(ctx, node)
		if err != nil {
			return err
		}
		fmt.Print(flows)
		return nil
	} else if err == nil {
		m = l.Manifest
	} else if m, err = manifest.Generate(manifest.Spec{Mode: cfg.Mode, Nodes: cfg.Nodes, Prefix: cfg.Prefix}); err != nil {
		return err
	}
	s, err := nft.Render(m, node, nft.Options{})
	if err != nil {
		return err
	}
	fmt.Print(s)
	return nil
}

// runLabAgent is the hidden `lab agent serve|traffic` used by `lab up`.
func (lc *Commands) labAgent(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("lab agent: want serve or traffic")
	}
	fs := lc.NewFlagSet("lab agent "+args[0], "[flags]", "Internal: run by `dualflow lab up`.")
	readyFD := fs.Int("ready-fd", 0, "write \"ready\" to this fd once serving")
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ready := func() {
		if *readyFD > 0 {
			f := os.NewFile(uintptr(*readyFD), "ready")
			f.Write([]byte("ready\n"))
			f.Close()
		}
	}
	switch args[0] {
	case "serve":
		var cfg agent.ServerConfig
		var tcp, udp string
		fs.StringVar(&cfg.Name, "name", "", "name to answer with (namespace/pod)")
		fs.StringVar(&tcp, "tcp", "", "comma-separated TCP ports")
		fs.StringVar(&udp, "udp", "", "comma-separated UDP ports")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		var err error
		if cfg.TCP, err = parsePorts(tcp); err != nil {
			return err
		}
		if cfg.UDP, err = parsePorts(udp); err != nil {
			return err
		}
		cfg.Logger = logger
		srv, err := agent.Listen(cfg) // in the namespace we were started in
		if err != nil {
			return err
		}
		ready()
		return srv.Serve(ctx)
	case "traffic":
		stateDir := fs.String("state-dir", lab.DefaultStateDir, "lab state directory")
		interval := fs.Duration("interval", time.Second, "round period")
		if err := fs.Parse(args[1:]); err != nil {
			return err
		}
		l, err := lab.Open(*stateDir, lab.Config{Logger: logger})
		if err != nil {
			return err
		}
		g, err := agent.NewGenerator(agent.GeneratorConfig{Flows: l.DefaultFlows(), Interval: *interval, Logger: logger})
		if err != nil {
			return err
		}
		ready()
		return g.Run(ctx)
	}
	return fmt.Errorf("lab agent: unknown role %q", args[0])
}

func parsePorts(s string) ([]uint16, error) {
	var out []uint16
	for f := range strings.SplitSeq(s, ",") {
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 16)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("port %q: want 1..65535", f)
		}
		out = append(out, uint16(n))
	}
	return out, nil
}

// noDemoOn refuses to touch the lab of stateDir, or the namespaces of
// prefix, while a demo runs on them (lab up and lab down would remove the
// demo's lab under it).
func noDemoOn(stateDir, prefix string) error {
	p, err := lockPrefix(prefix)
	if err != nil {
		return err
	}
	p.Unlock()
	abs, err := filepath.Abs(stateDir)
	if err != nil {
		return err
	}
	if _, err := os.Stat(abs); err != nil {
		return nil // no lab there at all
	}
	l, err := lockDemo(abs)
	if err != nil {
		return err
	}
	l.Unlock()
	return nil
}
