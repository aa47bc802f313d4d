package shard

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/dualflow/dualflow/exporter/ipfix"
	"github.com/dualflow/dualflow/internal/defaults"
)

// DNS families (Config.DNSFamily).
const (
	FamilyAny  = "any"
	FamilyIPv4 = "ipv4"
	FamilyIPv6 = "ipv6"
)

// Config configures a Sharder: where the member list comes from, when a
// member's share moves, and the IPFIX connection to each member.
type Config struct {
	// Collectors is a static member list, host:port each. Every exporter
	// must be given the same list, spelled the same (IP literals are
	// normalised, names are not).
	Collectors []string
	// DNS is a name resolved to the member list, host:port (a headless
	// Service: one address per collector pod). Exclusive with Collectors.
	DNS string
	// DNSInterval is how often DNS is resolved again.
	DNSInterval time.Duration
	// DNSFamily keeps the addresses of one family (FamilyIPv4, FamilyIPv6)
	// or of both (FamilyAny). A dual-stack headless Service returns every
	// pod under both families: with FamilyAny each collector is two
	// members. That still pairs halves (every exporter sees the same
	// set), at twice the connections.
	DNSFamily string
	// FailoverTimeout is how long a member may be disconnected before new
	// records for its share go to the survivors.
	FailoverTimeout time.Duration
	// CheckInterval is how often member health is looked at; default a
	// tenth of FailoverTimeout within 50 ms..1 s.
	CheckInterval time.Duration
	// IPFIX is the connection to each member; its Address is replaced by
	// the member's. Each member gets a buffer of IPFIX.BufferBytes.
	IPFIX ipfix.Config
	// Logger receives membership and failover logs; nil: slog.Default().
	Logger *slog.Logger

	// Tests: the clock of the health checks, the resolver and the member
	// senders.
	now       func() time.Time
	lookup    func(ctx context.Context, network, host string) ([]netip.Addr, error)
	newSender func(ipfix.Config) (sender, error)
}

// Defaults of Config.
const (
	DefaultDNSInterval     = 30 * time.Second
	DefaultFailoverTimeout = 10 * time.Second
	minCheckInterval       = 50 * time.Millisecond
	maxCheckInterval       = time.Second
	// dnsTimeout bounds one resolution.
	dnsTimeout = 5 * time.Second
)

// Enabled reports whether a member list is configured; without one the
// exporter sends to its single --exporter.ipfix.collector.
func (c Config) Enabled() bool { return len(c.Collectors) > 0 || c.DNS != "" }

// SetDefaults fills unset fields (IPFIX included).
func (c *Config) SetDefaults() {
	c.DNSInterval = cmp.Or(c.DNSInterval, DefaultDNSInterval)
	c.DNSFamily = cmp.Or(c.DNSFamily, FamilyAny)
	c.FailoverTimeout = cmp.Or(c.FailoverTimeout, DefaultFailoverTimeout)
	if c.CheckInterval == 0 {
		c.CheckInterval = min(max(c.FailoverTimeout/10, minCheckInterval), maxCheckInterval)
	}
	c.IPFIX.SetDefaults()
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if len(c.Collectors) > 0 && c.DNS != "" {
		errs = append(errs, errors.New("--exporter.collectors and --exporter.collectors-dns are exclusive"))
	}
	if !c.Enabled() {
		errs = append(errs, errors.New("no collectors: set --exporter.collectors or --exporter.collectors-dns"))
	}
	for _, a := range c.Collectors {
		if _, err := memberName(a); err != nil {
			errs = append(errs, fmt.Errorf("--exporter.collectors: %w", err))
		}
	}
	if c.DNS != "" {
		if _, port, err := net.SplitHostPort(c.DNS); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("--exporter.collectors-dns %q: want host:port", c.DNS))
		}
		errs = append(errs, defaults.RequirePositive("--exporter.collectors-dns-interval", c.DNSInterval))
	}
	if _, err := c.network(); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, defaults.RequirePositive("--exporter.collector-failover-timeout", c.FailoverTimeout),
		defaults.RequirePositive("check interval", c.CheckInterval))
	member := c.IPFIX
	member.Address = "127.0.0.1:4739" // each member's own; checked above
	errs = append(errs, member.Validate())
	return errors.Join(errs...)
}

// network is the net.Resolver network of DNSFamily.
func (c Config) network() (string, error) {
	switch c.DNSFamily {
	case "", FamilyAny:
		return "ip", nil
	case FamilyIPv4:
		return "ip4", nil
	case FamilyIPv6:
		return "ip6", nil
	}
	return "", fmt.Errorf("--exporter.collectors-dns-family %q: want %s, %s or %s", c.DNSFamily, FamilyAny, FamilyIPv4, FamilyIPv6)
}

// memberName is the identity of a member given as host:port: an IP
// literal in its canonical form (unmapped, IPv6 bracketed), a name as
// given (lowercased).
func memberName(s string) (string, error) {
	host, port, err := net.SplitHostPort(strings.TrimSpace(s))
	if err != nil {
		return "", fmt.Errorf("collector %q: %w", s, err)
	}
	if host == "" || port == "" {
		return "", fmt.Errorf("collector %q: want host:port", s)
	}
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.Unmap().String()
	}
	return net.JoinHostPort(strings.ToLower(host), port), nil
}

// memberNames normalises, deduplicates and sorts a member list.
func memberNames(list []string) ([]string, error) {
	var out []string
	for _, s := range list {
		if strings.TrimSpace(s) == "" {
			continue
		}
		n, err := memberName(s)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}
