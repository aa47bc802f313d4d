package agent

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/internal/reload"
	"github.com/dualflow/dualflow/netaddr"
)

// DefaultPort is the agents' port when the collector finds them by node
// address.
const DefaultPort = 9444

// DirectoryConfig tells the controller where the node agents are and how
// to call them.
type DirectoryConfig struct {
	// Static maps node names to agent base URLs; nodes not in it are
	// reached at Scheme://<node address>:Port.
	Static map[string]string
	// Port and Scheme ("https", or "http" for agents on loopback or behind
	// a mesh) of agents found by node address.
	Port   int
	Scheme string
	// TokenFile holds the agents' bearer token (or $DUALFLOW_TRACEFLOW_TOKEN).
	TokenFile string
	// CAFile verifies the agents' certificates (empty: system roots);
	// CertFile and KeyFile are the collector's client certificate (mutual
	// TLS). The files are read again when they change, for the
	// connections made after (package reload).
	CAFile, CertFile, KeyFile string
	// ServerName is the name the agents' certificates are verified for
	// (empty: the address dialled). One certificate shared by every node's
	// agent cannot name each node's address; with a private CA that issues
	// only dualflow's certificates (dualflow certs, cert-manager), a fixed
	// name is as strong.
	ServerName string
	// DisableIPv6 picks the node's IPv4 address even when it has both.
	DisableIPv6 bool
	// Logger logs the reloads of the TLS files (nil: slog.Default()).
	Logger *slog.Logger
}

// Enabled reports whether the controller should trace through agents.
func (c *DirectoryConfig) Enabled() bool { return c.TokenFile != "" || len(c.Static) > 0 }

// BindFlags registers the --traceflow.* flags of the collector.
func (c *DirectoryConfig) BindFlags(fs *flag.FlagSet) {
	fs.Var((*agentMap)(&c.Static), "traceflow.agents", "node agents by name, NODE=URL comma-separated (e.g. node-1=https://10.0.0.1:9444); other nodes are reached at their InternalIP and --traceflow.agent-port")
	fs.IntVar(&c.Port, "traceflow.agent-port", DefaultPort, "port of the exporters' traceflow agents (--traceflow.addr on the nodes)")
	fs.StringVar(&c.Scheme, "traceflow.agent-scheme", "https", "https, or http for agents on loopback only (the token is never sent in clear over the network)")
	fs.StringVar(&c.TokenFile, "traceflow.token-file", "", "file holding the agents' bearer token (or $"+TokenEnv+"); traces through node agents are on when it is set")
	fs.StringVar(&c.CAFile, "traceflow.ca-file", "", "PEM CA verifying the agents' certificates (empty: system roots)")
	fs.StringVar(&c.CertFile, "traceflow.cert-file", "", "PEM client certificate for agents that require one (mutual TLS)")
	fs.StringVar(&c.KeyFile, "traceflow.key-file", "", "PEM key of --traceflow.cert-file")
	fs.StringVar(&c.ServerName, "traceflow.server-name", "", "name the agents' certificates are verified for (empty: the node address dialled); with one certificate for every node, its name, e.g. dualflow-agent (dualflow certs), and a private --traceflow.ca-file")
}

type agentMap map[string]string

func (m *agentMap) String() string {
	if m == nil || *m == nil {
		return ""
	}
	var kv []string
	for k, v := range *m {
		kv = append(kv, k+"="+v)
	}
	slices.Sort(kv)
	return strings.Join(kv, ",")
}

func (m *agentMap) Set(s string) error {
	if *m == nil {
		*m = map[string]string{}
	}
	for _, kv := range strings.Split(s, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("%q: want NODE=URL", kv)
		}
		u, err := url.Parse(v)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return fmt.Errorf("%q: want an http:// or https:// URL", v)
		}
		(*m)[k] = v
	}
	return nil
}

// NodeView is what the directory needs of the cluster: the nodes and
// their addresses (the collector's Kubernetes view).
type NodeView interface {
	NodeAddrs(node string) ([]netip.Addr, bool)
	NodeNames() []string
}

// NodeDirectory finds agents by node name: the static map, else the node's
// InternalIP (IPv6 preferred when it has both) and the agent port.
type NodeDirectory struct {
	cfg   DirectoryConfig
	view  NodeView
	token string
	http  *http.Client
	tls   *reload.TLS // nil without TLS files
}

// NewDirectory loads the token and TLS files of cfg.
func NewDirectory(cfg DirectoryConfig, view NodeView) (*NodeDirectory, error) {
	tok, err := LoadToken(cfg.TokenFile)
	if err != nil {
		return nil, err
	}
	cfg.Port = cmp.Or(cfg.Port, DefaultPort)
	cfg.Scheme = cmp.Or(cfg.Scheme, "https")
	if cfg.Scheme != "http" && cfg.Scheme != "https" {
		return nil, fmt.Errorf("--traceflow.agent-scheme %q: want https or http", cfg.Scheme)
	}
	if (cfg.CertFile == "") != (cfg.KeyFile == "") {
		return nil, errors.New("--traceflow.cert-file and --traceflow.key-file go together")
	}
	for n, u := range cfg.Static {
		if err := clearTextOK(u); err != nil {
			return nil, fmt.Errorf("--traceflow.agents %s: %w", n, err)
		}
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil // the token goes to the node itself, never through a proxy
	dialer := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	tr.DialContext = dialer.DialContext
	tr.ResponseHeaderTimeout = 0 // a watch answers once the node observes
	tr.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.ServerName}
	var files *reload.TLS
	if cfg.CAFile != "" || cfg.CertFile != "" {
		files, err = reload.LoadTLS(reload.TLSFiles{CA: cfg.CAFile, Cert: cfg.CertFile, Key: cfg.KeyFile},
			reload.Options{Name: "traceflow-client", Logger: cfg.Logger})
		if err != nil {
			return nil, fmt.Errorf("traceflow TLS: %w", err)
		}
		tr.TLSClientConfig = files.ClientConfig(cfg.ServerName)
		if cfg.ServerName == "" && cfg.CAFile != "" {
			tr.DialTLSContext = dialTLS(files, dialer, tr.TLSHandshakeTimeout)
		}
	}
	return &NodeDirectory{cfg: cfg, view: view, token: tok, http: &http.Client{Transport: tr}, tls: files}, nil
}

// dialTLS dials agents when no server name is set: each agent's
// certificate is checked for the host dialled (a node's address), which
// only the dial knows (reload.TLS.ClientConfig).
func dialTLS(files *reload.TLS, d *net.Dialer, handshake time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, err
		}
		cfg := files.ClientConfig(host)
		cfg.NextProtos = []string{"h2", "http/1.1"} // what http.Transport offers by itself
		ctx, cancel := context.WithTimeout(ctx, d.Timeout+handshake)
		defer cancel()
		return (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, network, addr)
	}
}

// Metrics returns the collector of the TLS files' reloads, for the
// collector's registry.
func (d *NodeDirectory) Metrics() prometheus.Collector { return reload.Metrics(d.tls) }

// Agent implements Directory.
func (d *NodeDirectory) Agent(node string) (*Client, error) {
	if u, ok := d.cfg.Static[node]; ok {
		return &Client{Node: node, URL: u, Token: d.token, HTTP: d.http}, nil
	}
	addrs, ok := d.view.NodeAddrs(node)
	if !ok {
		return nil, fmt.Errorf("node %s: unknown (not in the Kubernetes view, not in --traceflow.agents)", node)
	}
	a, ok := pick(addrs, !d.cfg.DisableIPv6)
	if !ok {
		return nil, fmt.Errorf("node %s: no InternalIP to reach its traceflow agent at (set --traceflow.agents)", node)
	}
	urlOf := func(a netip.Addr) (string, error) {
		u := d.cfg.Scheme + "://" + net.JoinHostPort(a.String(), strconv.Itoa(d.cfg.Port))
		return u, clearTextOK(u)
	}
	u, err := urlOf(a)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	c := &Client{Node: node, URL: u, Token: d.token, HTTP: d.http}
	// The node's address of the other family, if the agent does not
	// answer on the preferred one.
	if a.Is6() {
		if v4, ok := pick(addrs, false); ok {
			if u, err := urlOf(v4); err == nil {
				c.Fallback = []string{u}
			}
		}
	}
	return c, nil
}

// clearTextOK refuses an http:// agent URL whose host is not loopback: the
// bearer token must not cross the network in clear (the agent refuses to
// serve that way too).
func clearTextOK(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	if u.Scheme != "http" {
		return nil
	}
	if netaddr.Loopback(u.Hostname()) {
		return nil
	}
	return fmt.Errorf("%s: plain http beyond loopback would send the traceflow token in clear; use https", raw)
}

// pick prefers an IPv6 address when ipv6 is allowed and there is one.
func pick(addrs []netip.Addr, ipv6 bool) (netip.Addr, bool) {
	var v4 netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if a.Is6() && ipv6 {
			return a, true
		}
		if a.Is4() && !v4.IsValid() {
			v4 = a
		}
	}
	return v4, v4.IsValid()
}

// Nodes implements Directory: the static map's nodes and the view's.
func (d *NodeDirectory) Nodes() []string {
	out := append(slices.Collect(maps.Keys(d.cfg.Static)), d.view.NodeNames()...)
	slices.Sort(out)
	return slices.Compact(out)
}
