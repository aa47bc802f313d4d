package enrich

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/dualflow/dualflow/netaddr"
)

// Source says where the Kubernetes objects come from.
type Source string

// Sources.
const (
	// SourceAuto picks inventory when files are given, else kubeconfig
	// when --k8s.kubeconfig or $KUBECONFIG is set, else in-cluster when
	// running in a pod, else off.
	SourceAuto Source = "auto"
	// SourceInCluster uses the pod's service account (rest.InClusterConfig).
	SourceInCluster Source = "in-cluster"
	// SourceKubeconfig uses a kubeconfig file (clientcmd loading rules:
	// --k8s.kubeconfig, else $KUBECONFIG, else ~/.kube/config).
	SourceKubeconfig Source = "kubeconfig"
	// SourceInventory loads manifests (--k8s.inventory) for offline audits
	// and the local demo; nothing changes after the load.
	SourceInventory Source = "inventory"
	// SourceOff disables enrichment.
	SourceOff Source = "off"
)

// Defaults of Config.
const (
	// DefaultGracePeriod keeps deleted objects (and addresses an object
	// gave up) this long, so records exported late still resolve to the
	// object that held the address: an active-timeout slice (60 s by
	// default) plus the exporter's idle timeout (15 s) and its send
	// buffer, with room to spare.
	DefaultGracePeriod = 5 * time.Minute
	// DefaultSyncTimeout bounds the initial list of every kind.
	DefaultSyncTimeout = 2 * time.Minute
	// DefaultEnableIPv6 indexes IPv6 addresses.
	DefaultEnableIPv6 = true
)

// Config configures the Kubernetes enrichment. Start from NewConfig (the
// zero value has IPv6 disabled), or bind it to flags with BindFlags, then
// SetDefaults and Validate.
type Config struct {
	// Source selects in-cluster, kubeconfig, inventory, off or auto.
	Source Source
	// Kubeconfig is the kubeconfig file (kubeconfig source).
	Kubeconfig string
	// Context is the kubeconfig context (default: current context).
	Context string
	// Inventory lists manifest files (inventory source): multi-document
	// YAML or JSON, v1 List documents included (a `kubectl get -o yaml`
	// dump).
	Inventory []string
	// EnableIPv6 enriches IPv6 records. When false, IPv6 addresses are
	// dropped from the objects and IPv6 records are not enriched; pod and
	// node IPv6 addresses still
	// answer NodesForIPs, so the correlator pairs IPv6 halves.
	EnableIPv6 bool
	// GracePeriod keeps deleted objects and given-up addresses for late
	// records (0: forget at once).
	GracePeriod time.Duration
	// SyncTimeout bounds the wait for the initial list of every kind.
	SyncTimeout time.Duration
	// InventoryReload is how often the inventory source checks its files
	// and applies what changed (0: never).
	InventoryReload time.Duration
	// ServiceCIDRs and ClusterCIDRs are the Service and pod networks of
	// both families, for the flow type of addresses no object names. Pod
	// CIDRs of nodes and known Service addresses are used without them.
	ServiceCIDRs, ClusterCIDRs []netip.Prefix
}

// NewConfig returns a Config holding the defaults.
func NewConfig() Config {
	return Config{Source: SourceAuto, EnableIPv6: DefaultEnableIPv6, GracePeriod: DefaultGracePeriod, SyncTimeout: DefaultSyncTimeout,
		InventoryReload: DefaultInventoryReload}
}

// BindFlags registers the --k8s.* flags on fs. The flag defaults are the
// package defaults (whatever c holds), so binding also initialises c.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	d := NewConfig()
	fs.StringVar((*string)(&c.Source), "k8s.source", string(d.Source), "where Kubernetes objects come from: auto, in-cluster, kubeconfig, inventory or off (auto: inventory if --k8s.inventory is set, else kubeconfig if --k8s.kubeconfig or $KUBECONFIG is set, else in-cluster inside a pod, else off)")
	fs.StringVar(&c.Kubeconfig, "k8s.kubeconfig", "", "kubeconfig file (default $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&c.Context, "k8s.context", "", "kubeconfig context (default: the current context)")
	fs.Func("k8s.inventory", "load Kubernetes manifests from `FILE` instead of watching a cluster: multi-document YAML/JSON or a v1 List (kubectl get -o yaml); repeat or comma-separate for several files", func(s string) error {
		for _, f := range strings.Split(s, ",") {
			if f = strings.TrimSpace(f); f != "" {
				c.Inventory = append(c.Inventory, f)
			}
		}
		return nil
	})
	fs.BoolVar(&c.EnableIPv6, "k8s.enable-ipv6", d.EnableIPv6, "enrich IPv6 records and let address selection pick IPv6; false leaves IPv6 rows without pod, Service and policy columns and never picks IPv6 (IPv6 node halves are still paired, so rows are not doubled)")
	fs.DurationVar(&c.GracePeriod, "k8s.grace-period", d.GracePeriod, "keep deleted objects and reused addresses' previous holders this long, so late records still resolve")
	fs.DurationVar(&c.SyncTimeout, "k8s.sync-timeout", d.SyncTimeout, "give up when the initial list of a kind takes longer")
	fs.DurationVar(&c.InventoryReload, "k8s.inventory-reload", d.InventoryReload, "how often the inventory source checks its files and applies what changed, as creates, updates and deletes, once a change has stayed the same for one check (0: load once); a file that does not load is logged and counted, and the objects stay")
	fs.Var((*netaddr.PrefixList)(&c.ServiceCIDRs), "k8s.service-cidrs", "comma-separated Service CIDRs of both families, for flow types (known ClusterIPs count without it)")
	fs.Var((*netaddr.PrefixList)(&c.ClusterCIDRs), "k8s.cluster-cidrs", "comma-separated pod network CIDRs of both families, for flow types (nodes' spec.podCIDRs count without it)")
}

// SetDefaults fills unset fields and resolves SourceAuto.
func (c *Config) SetDefaults() {
	if c.Source == "" {
		c.Source = SourceAuto
	}
	if c.SyncTimeout == 0 {
		c.SyncTimeout = DefaultSyncTimeout
	}
	if c.Source == SourceAuto {
		switch {
		case len(c.Inventory) > 0:
			c.Source = SourceInventory
		case c.Kubeconfig != "" || os.Getenv("KUBECONFIG") != "":
			c.Source = SourceKubeconfig
		case os.Getenv("KUBERNETES_SERVICE_HOST") != "" && os.Getenv("KUBERNETES_SERVICE_PORT") != "":
			c.Source = SourceInCluster
		default:
			c.Source = SourceOff
		}
	}
}

// Enabled reports whether enrichment runs (Source is not off). Call it
// after SetDefaults.
func (c Config) Enabled() bool { return c.Source != SourceOff }

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	switch c.Source {
	case SourceAuto, SourceInCluster, SourceKubeconfig, SourceOff:
		if len(c.Inventory) > 0 && c.Source != SourceAuto {
			errs = append(errs, fmt.Errorf("--k8s.inventory with --k8s.source=%s: inventory files are only read by the inventory source", c.Source))
		}
	case SourceInventory:
		if len(c.Inventory) == 0 {
			errs = append(errs, errors.New("--k8s.source=inventory needs --k8s.inventory FILE"))
		}
		if c.Kubeconfig != "" {
			errs = append(errs, errors.New("--k8s.kubeconfig and --k8s.inventory: choose one"))
		}
	default:
		errs = append(errs, fmt.Errorf("--k8s.source %q: want auto, in-cluster, kubeconfig, inventory or off", c.Source))
	}
	if c.GracePeriod < 0 {
		errs = append(errs, fmt.Errorf("--k8s.grace-period %v: must not be negative", c.GracePeriod))
	}
	if c.SyncTimeout < 0 {
		errs = append(errs, fmt.Errorf("--k8s.sync-timeout %v: must not be negative", c.SyncTimeout))
	}
	if c.InventoryReload < 0 {
		errs = append(errs, fmt.Errorf("--k8s.inventory-reload %v: must not be negative", c.InventoryReload))
	}
	for _, p := range slices.Concat(c.ServiceCIDRs, c.ClusterCIDRs) {
		if !p.IsValid() {
			errs = append(errs, errors.New("invalid CIDR in --k8s.service-cidrs or --k8s.cluster-cidrs"))
			break
		}
		if p.Addr().Is6() && !c.EnableIPv6 {
			errs = append(errs, fmt.Errorf("IPv6 CIDR %s with --k8s.enable-ipv6=false", p))
			break
		}
	}
	return errors.Join(errs...)
}
