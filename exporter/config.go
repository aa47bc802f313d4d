package exporter

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/exporter/conntrack"
	"github.com/dualflow/dualflow/exporter/ipfix"
	"github.com/dualflow/dualflow/exporter/ovs"
	"github.com/dualflow/dualflow/exporter/shard"
	"github.com/dualflow/dualflow/internal/defaults"
	"github.com/dualflow/dualflow/netaddr"
)

// Connection sources (Config.Source).
const (
	SourceConntrack = "conntrack"
	SourceOVS       = "ovs"
)

// Config configures the exporter. Bind it to a flag set with BindFlags,
// then SetDefaults and Validate.
type Config struct {
	// NodeName is this node's name, sent as the exporter's identity
	// (observationDomainName) and as the node of local endpoints. Default:
	// $NODE_NAME, then the hostname.
	NodeName string
	// MetricsAddr serves Prometheus metrics on /metrics; empty disables.
	MetricsAddr string

	// NetNS is the network namespace whose conntrack table is read (name
	// under /run/netns or a path); empty: the exporter's own.
	NetNS string
	// IPv4 and IPv6 enable each family.
	IPv4, IPv6 bool
	// Zones restricts the export to these conntrack zones (empty: all).
	Zones []uint16
	// PollInterval is the period of full table dumps, which catch
	// counters of live connections and reconcile lost events.
	PollInterval time.Duration
	// Events subscribes to conntrack NEW/DESTROY events, so connections
	// shorter than PollInterval are exported too.
	Events bool
	// EventBuffer is the event socket's receive buffer in bytes (capped by
	// net.core.rmem_max).
	EventBuffer int
	// RequireAccounting fails the start when nf_conntrack_acct or
	// nf_conntrack_timestamp is off in the target namespace; otherwise
	// that is logged and reported by dualflow_exporter_conntrack_sysctl.
	RequireAccounting bool
	// LocalCIDRs are this node's pod CIDRs and ClusterCIDRs every pod CIDR
	// of the cluster (optional). With them the exporter fills the flow
	// type and the node of local endpoints; without them the collector
	// does it from Kubernetes.
	LocalCIDRs, ClusterCIDRs []netip.Prefix

	// Source is where connections come from: SourceConntrack (the
	// kernel's table of NetNS, the default) or SourceOVS (an Open vSwitch,
	// see exporter/ovs and OVS below).
	Source string
	// OVS selects the ovs-vswitchd read with Source "ovs". Its families
	// and zones are IPv4, IPv6 and Zones above.
	OVS ovs.Config

	Store connstore.Config // timeouts and bound of the connection store
	// StateDir keeps what outlives a run on the node (a hostPath in
	// Kubernetes): a stopping exporter leaves what it exported in
	// handover-<node>, and the next run takes it over, so that a restart
	// or a DaemonSet roll exports no connection twice. Empty: none.
	StateDir string
	IPFIX    ipfix.Config // the collector and the send buffer
	// Shard spreads the records over several collectors (off unless
	// Shard.Collectors or Shard.DNS is set): each gets a connection like
	// IPFIX describes, with a buffer of IPFIX.BufferBytes, and
	// IPFIX.Address is not used. Shard.IPFIX is filled from IPFIX.
	Shard shard.Config

	// Logger receives the exporter's logs; nil: slog.Default() at New.
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultMetricsAddr  = "127.0.0.1:9465"
	DefaultPollInterval = 5 * time.Second
	DefaultEventBuffer  = 4 << 20 // rmem_max of a stock kernel is 208 KiB; raise it for busy nodes
)

// NewConfig returns a Config holding the defaults, to bind flags onto:
// both families, events on, metrics on DefaultMetricsAddr. What depends on
// other flags (node name, observation domain, UDP message size) is left for
// SetDefaults after parsing.
func NewConfig() Config {
	c := Config{IPv4: true, IPv6: true, Events: true, MetricsAddr: DefaultMetricsAddr,
		PollInterval: DefaultPollInterval, EventBuffer: DefaultEventBuffer}
	c.Store.SetDefaults()
	c.Store.TombstoneTTL = 0 // depends on the poll interval
	c.IPFIX.SetDefaults()
	c.IPFIX.MaxMessageSize = 0 // depends on the transport
	c.Shard.DNSInterval = shard.DefaultDNSInterval
	c.Shard.DNSFamily = shard.FamilyAny
	c.Shard.FailoverTimeout = shard.DefaultFailoverTimeout
	return c
}

// BindFlags registers the exporter's flags on fs: --node-name,
// --metrics-addr and the --exporter.* flags. The current values of c are
// the defaults shown; start from NewConfig.
func (c *Config) BindFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "this node's name, sent with every record (empty: $NODE_NAME, then the hostname)")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", c.MetricsAddr, "serve Prometheus metrics on http://ADDR/metrics (empty disables)")
	fs.StringVar(&c.Source, "exporter.source", c.Source, "where connections come from: conntrack (the kernel table) or ovs (Open vSwitch: conntrack, flow statistics and drop packet-ins)")
	fs.StringVar(&c.OVS.RunDir, "exporter.ovs.rundir", c.OVS.RunDir, "OVS run directory of the ovs-vswitchd to read (its OVS_RUNDIR; empty: the CLIs' default)")
	fs.StringVar(&c.OVS.Bridge, "exporter.ovs.bridge", c.OVS.Bridge, "OVS bridge whose flows are read (default br-int)")
	fs.StringVar(&c.OVS.RulesFile, "exporter.ovs.rules", c.OVS.RulesFile, "rules file mapping flow cookies to NetworkPolicy rules (see exporter/ovs)")
	fs.StringVar(&c.NetNS, "exporter.netns", c.NetNS, "read the conntrack table of this network namespace: a name under /run/netns or a path (empty: our own)")
	fs.BoolVar(&c.IPv4, "exporter.ipv4", c.IPv4, "export IPv4 connections")
	fs.BoolVar(&c.IPv6, "exporter.ipv6", c.IPv6, "export IPv6 connections")
	fs.Var((*zonesFlag)(&c.Zones), "exporter.zones", "comma-separated conntrack zones to export (empty: all; kernel-side filtering needs Linux 6.8)")
	fs.DurationVar(&c.PollInterval, "exporter.poll-interval", c.PollInterval, "period of full conntrack dumps")
	fs.BoolVar(&c.Events, "exporter.events", c.Events, "subscribe to conntrack NEW/DESTROY events so short connections are not missed")
	fs.IntVar(&c.EventBuffer, "exporter.event-buffer", c.EventBuffer, "event socket receive buffer in bytes, capped by net.core.rmem_max")
	fs.BoolVar(&c.RequireAccounting, "exporter.require-accounting", c.RequireAccounting, "fail when nf_conntrack_acct or nf_conntrack_timestamp is off in the target netns (default: warn and report a metric)")
	fs.Var((*netaddr.PrefixList)(&c.LocalCIDRs), "exporter.local-cidrs", "comma-separated pod CIDRs of this node (both families); fills flow type and node names")
	fs.Var((*netaddr.PrefixList)(&c.ClusterCIDRs), "exporter.cluster-cidrs", "comma-separated pod CIDRs of the whole cluster (both families)")
	fs.DurationVar(&c.Store.ActiveTimeout, "exporter.active-timeout", c.Store.ActiveTimeout, "export live connections this often")
	fs.DurationVar(&c.Store.IdleTimeout, "exporter.idle-timeout", c.Store.IdleTimeout, "export a connection whose counters stood still this long")
	fs.StringVar(&c.StateDir, "exporter.state-dir", c.StateDir, "directory that outlives a run on this node (a hostPath): a stopping exporter leaves what it exported there for the next run, so a restart or DaemonSet roll exports no connection twice (empty: none)")
	fs.IntVar(&c.Store.MaxConns, "exporter.max-connections", c.Store.MaxConns, "most connections tracked; beyond it new ones are exported at once with reason lack of resources")
	fs.StringVar(&c.IPFIX.Address, "exporter.ipfix.collector", c.IPFIX.Address, "collector address host:port, [::1]:4739 for IPv6 (one collector; see --exporter.collectors for several)")
	fs.Var((*netaddr.HostList)(&c.Shard.Collectors), "exporter.collectors", "comma-separated collectors host:port ([fd00:10::1]:4739 for IPv6) to shard records over, instead of --exporter.ipfix.collector: "+
		"both halves of a cross-node connection go to the same collector, so every exporter must be given the same list")
	fs.StringVar(&c.Shard.DNS, "exporter.collectors-dns", c.Shard.DNS, "name:port resolved to the collectors to shard records over (a headless Service), instead of --exporter.collectors; "+
		"every exporter must be given the same name")
	fs.DurationVar(&c.Shard.DNSInterval, "exporter.collectors-dns-interval", c.Shard.DNSInterval, "resolve --exporter.collectors-dns again this often (a failed or empty answer keeps the last collectors)")
	fs.StringVar(&c.Shard.DNSFamily, "exporter.collectors-dns-family", c.Shard.DNSFamily, "addresses of --exporter.collectors-dns to use: any, ipv4 or ipv6 (a dual-stack headless Service lists each collector under both)")
	fs.DurationVar(&c.Shard.FailoverTimeout, "exporter.collector-failover-timeout", c.Shard.FailoverTimeout, "with several collectors, a collector disconnected this long has its share of new records sent to the others "+
		"(until then they wait in its buffer of --exporter.ipfix.buffer-bytes); its share returns when it is back")
	fs.StringVar(&c.IPFIX.Transport, "exporter.ipfix.transport", c.IPFIX.Transport, "tcp, udp or tls")
	fs.StringVar(&c.IPFIX.CAFile, "exporter.ipfix.ca-file", c.IPFIX.CAFile, "PEM CA bundle verifying the collector (tls; default system roots)")
	fs.StringVar(&c.IPFIX.CertFile, "exporter.ipfix.cert-file", c.IPFIX.CertFile, "PEM client certificate (tls, optional)")
	fs.StringVar(&c.IPFIX.KeyFile, "exporter.ipfix.key-file", c.IPFIX.KeyFile, "PEM client key (tls, optional)")
	fs.StringVar(&c.IPFIX.ServerName, "exporter.ipfix.server-name", c.IPFIX.ServerName, "name expected in the collector's certificate (tls; default the collector host)")
	fs.Func("exporter.ipfix.observation-domain-id", "IPFIX observation domain ID (default: FNV-32a hash of the node name)", func(s string) error {
		v, err := strconv.ParseUint(s, 10, 32)
		c.IPFIX.ObservationDomainID = uint32(v)
		return err
	})
	fs.IntVar(&c.IPFIX.BufferBytes, "exporter.ipfix.buffer-bytes", c.IPFIX.BufferBytes, "bound of records waiting for the collector, in encoded bytes; when full the oldest are dropped")
	fs.IntVar(&c.IPFIX.MaxMessageSize, "exporter.ipfix.max-message-size", c.IPFIX.MaxMessageSize, "largest IPFIX message (0: 65535 for tcp/tls, 1400 for udp)")
	fs.DurationVar(&c.IPFIX.FlushInterval, "exporter.ipfix.flush-interval", c.IPFIX.FlushInterval, "longest a record waits for its message to fill")
	fs.DurationVar(&c.IPFIX.TemplateRefresh, "exporter.ipfix.template-refresh", c.IPFIX.TemplateRefresh, "resend templates this often over udp")
	fs.DurationVar(&c.IPFIX.BackoffMax, "exporter.ipfix.backoff-max", c.IPFIX.BackoffMax, "longest wait between reconnection attempts")
	fs.DurationVar(&c.IPFIX.DrainTimeout, "exporter.ipfix.drain-timeout", c.IPFIX.DrainTimeout, "at shutdown, keep sending buffered records this long")
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	c.Source = cmp.Or(c.Source, SourceConntrack)
	if c.Source == SourceOVS {
		// OVS has no event stream: polls (and drop packet-ins) only.
		c.Events = false
		c.OVS.IPv4, c.OVS.IPv6, c.OVS.Zones = c.IPv4, c.IPv6, c.Zones
		c.OVS.SetDefaults()
	}
	c.NodeName = cmp.Or(c.NodeName, os.Getenv("NODE_NAME"))
	if c.NodeName == "" {
		c.NodeName, _ = os.Hostname()
	}
	c.PollInterval = cmp.Or(c.PollInterval, DefaultPollInterval)
	c.EventBuffer = cmp.Or(c.EventBuffer, DefaultEventBuffer)
	if c.Store.TombstoneTTL == 0 {
		// A late DESTROY event comes before the next dump or so; a
		// connection skipped by one dump shows up in the next.
		c.Store.TombstoneTTL = 2 * c.PollInterval
	}
	c.Store.SetDefaults()
	c.IPFIX.SetDefaults()
	if c.IPFIX.ObservationDomainID == 0 {
		h := fnv.New32a()
		h.Write([]byte(c.NodeName))
		c.IPFIX.ObservationDomainID = h.Sum32()
	}
	if c.Shard.Enabled() {
		c.Shard.IPFIX = c.IPFIX
		c.Shard.SetDefaults()
	}
}

// Validate checks the configuration.
func (c *Config) Validate() error {
	var errs []error
	switch c.Source {
	case "", SourceConntrack:
	case SourceOVS:
		errs = append(errs, c.OVS.Validate())
	default:
		errs = append(errs, fmt.Errorf("--exporter.source %q: want %s or %s", c.Source, SourceConntrack, SourceOVS))
	}
	if !c.IPv4 && !c.IPv6 {
		errs = append(errs, errors.New("--exporter.ipv4 and --exporter.ipv6 both off"))
	}
	errs = append(errs, defaults.RequirePositive("--exporter.poll-interval", c.PollInterval))
	if c.Store.IdleTimeout > 0 && c.PollInterval > c.Store.IdleTimeout {
		errs = append(errs, fmt.Errorf("--exporter.poll-interval %v longer than --exporter.idle-timeout %v: every connection would look idle", c.PollInterval, c.Store.IdleTimeout))
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			errs = append(errs, fmt.Errorf("--metrics-addr %q: %w", c.MetricsAddr, err))
		}
	}
	errs = append(errs, c.Store.Validate())
	if c.Shard.Enabled() {
		if c.IPFIX.Address != ipfix.DefaultAddress {
			errs = append(errs, errors.New("--exporter.ipfix.collector given with --exporter.collectors or --exporter.collectors-dns: use one"))
		}
		sc := c.Shard
		sc.IPFIX = c.IPFIX
		errs = append(errs, sc.Validate())
	} else {
		errs = append(errs, c.IPFIX.Validate())
	}
	return errors.Join(errs...)
}

func (c Config) source() conntrack.Config {
	return conntrack.Config{NetNS: c.NetNS, IPv4: c.IPv4, IPv6: c.IPv6, Zones: c.Zones, ReadBuffer: c.EventBuffer}
}

// zonesFlag is a comma-separated list of conntrack zones.
type zonesFlag []uint16

func (z *zonesFlag) String() string {
	var s []string
	for _, v := range *z {
		s = append(s, strconv.Itoa(int(v)))
	}
	return strings.Join(s, ",")
}

func (z *zonesFlag) Set(s string) error {
	*z = (*z)[:0]
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		v, err := strconv.ParseUint(f, 10, 16)
		if err != nil {
			return fmt.Errorf("zone %q: %w", f, err)
		}
		if !slices.Contains(*z, uint16(v)) {
			*z = append(*z, uint16(v))
		}
	}
	return nil
}
