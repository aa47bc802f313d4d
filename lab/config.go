package lab

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dualflow/dualflow/lab/manifest"
)

// Defaults of Config.
const (
	DefaultStateDir = "/run/dualflow/lab"
	DefaultPrefix   = "df-"
	DatapathKernel  = "kernel"
	// DatapathOVS forwards through an Open vSwitch bridge per node
	// (userspace datapath, OpenFlow policy); see lab/ovs.
	DatapathOVS = "ovs"
)

// Config configures a lab. Bind it to flags, then SetDefaults and Validate.
type Config struct {
	// Mode is ipv4, ipv6 or dual (default dual).
	Mode manifest.Mode
	// Nodes is the number of nodes of the generated manifest (default 2).
	Nodes int
	// Prefix starts the name of every network namespace of the lab; Down
	// removes every namespace with this prefix (default "df-").
	Prefix string
	// StateDir holds the manifest, the state file, pid files and agent logs
	// (default /run/dualflow/lab).
	StateDir string
	// Datapath is the node datapath: "kernel" (nftables + kernel
	// conntrack, the default) or "ovs" (an OVS bridge per node, OpenFlow
	// policy, OVS userspace conntrack).
	Datapath string
	// ManifestFile, if set, is read instead of generating the default lab.
	ManifestFile string
	// AgentBinary, if set, runs each pod's servers as a process
	// `<AgentBinary> lab agent serve` inside the pod namespace, tracked by a
	// pid file, so the lab outlives the caller. If empty, the servers run
	// in the calling process until Close (what tests use).
	AgentBinary string
	// Traffic starts the traffic generator (default lab only).
	Traffic bool
	// TrafficInterval is the generator's round period (default 1s).
	TrafficInterval time.Duration
	Logger          *slog.Logger
}

// SetDefaults fills in unset fields.
func (c *Config) SetDefaults() {
	c.Mode = cmp.Or(c.Mode, manifest.ModeDual)
	c.Nodes = cmp.Or(c.Nodes, 2)
	c.Prefix = cmp.Or(c.Prefix, DefaultPrefix)
	c.StateDir = cmp.Or(c.StateDir, DefaultStateDir)
	c.Datapath = cmp.Or(c.Datapath, DatapathKernel)
	c.TrafficInterval = cmp.Or(c.TrafficInterval, time.Second)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

// Validate reports a config that cannot build a lab.
func (c *Config) Validate() error {
	if _, err := manifest.ParseMode(string(c.Mode)); err != nil {
		return err
	}
	if c.Nodes < 1 || c.Nodes > manifest.MaxNodes {
		return fmt.Errorf("nodes %d: want 1..%d", c.Nodes, manifest.MaxNodes)
	}
	if err := ValidatePrefix(c.Prefix); err != nil {
		return err
	}
	if c.Datapath != DatapathKernel && c.Datapath != DatapathOVS {
		return fmt.Errorf("datapath %q: want %q or %q", c.Datapath, DatapathKernel, DatapathOVS)
	}
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		return fmt.Errorf("state dir %q: want an absolute path", c.StateDir)
	}
	if c.AgentBinary != "" {
		if _, err := os.Stat(c.AgentBinary); err != nil {
			return fmt.Errorf("agent binary: %w", err)
		}
	}
	return nil
}

// ValidatePrefix accepts prefixes of 2..24 characters of [a-z0-9-] that end
// in '-', so that a prefix never matches an unrelated namespace by accident
// ("df" would match "dfoo").
func ValidatePrefix(p string) error {
	if len(p) < 2 || len(p) > 24 || !strings.HasSuffix(p, "-") {
		return errors.New("prefix: want 2..24 characters ending in '-'")
	}
	for _, r := range p {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return fmt.Errorf("prefix %q: only a-z, 0-9 and '-'", p)
		}
	}
	return nil
}
