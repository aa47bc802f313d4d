package ipfix

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	fipfix "github.com/dualflow/dualflow/flow/ipfix"
	"github.com/dualflow/dualflow/internal/defaults"
	"github.com/dualflow/dualflow/internal/reload"
)

// Transports.
const (
	TCP = "tcp"
	UDP = "udp"
	TLS = "tls" // TLS over TCP
)

// Config configures the connection to the collector and the buffer in
// front of it.
type Config struct {
	// Address of the collector, host:port ("[::1]:4739" for IPv6).
	Address string
	// Transport is tcp (default), udp or tls.
	Transport string
	// TLS: CAFile verifies the collector (system roots when empty),
	// CertFile and KeyFile are an optional client certificate, ServerName
	// overrides the name checked in the collector's certificate (default:
	// the host of Address). The files are read again when they change,
	// for the connections made after (package reload).
	CAFile, CertFile, KeyFile, ServerName string
	// TLSFiles, when set, is the content of CAFile, CertFile and KeyFile,
	// loaded by the caller with LoadTLS so that several exporters (a
	// shard's) share one load; nil: New loads them.
	TLSFiles *reload.TLS
	// ObservationDomainID goes in every message header.
	ObservationDomainID uint32
	// BufferBytes bounds the encoded records waiting for the collector.
	// When full, the oldest messages are dropped (drop-oldest: fresh
	// records are worth more) and their records counted in
	// Stats.DroppedBufferFull.
	BufferBytes int
	// MaxMessageSize is the largest IPFIX message sent; default 65535 for
	// tcp/tls and 1400 for udp (fits a 1500-byte path MTU in both
	// families without fragmentation).
	MaxMessageSize int
	// FlushInterval is the longest a record waits in a partly filled
	// message.
	FlushInterval time.Duration
	// TemplateRefresh is how often templates are resent over UDP (RFC 7011
	// section 8.4); stream transports send them once per connection.
	TemplateRefresh time.Duration
	// DialTimeout bounds each connection attempt, WriteTimeout each message
	// write (a collector that stops reading counts as down).
	DialTimeout, WriteTimeout time.Duration
	// BackoffMin and BackoffMax bound the exponential wait between
	// connection attempts.
	BackoffMin, BackoffMax time.Duration
	// DrainTimeout bounds how long Run keeps sending buffered records
	// after its context is done.
	DrainTimeout time.Duration
	// Logger receives the connection's logs (outages, drops); nil:
	// slog.Default() at New.
	Logger *slog.Logger
}

// Defaults of Config.
const (
	DefaultAddress         = "127.0.0.1:4739" // IANA port of IPFIX
	DefaultBufferBytes     = 16 << 20         // ~100k records at ~160 B each
	DefaultUDPMessageSize  = 1400
	DefaultFlushInterval   = time.Second
	DefaultTemplateRefresh = time.Minute
	DefaultDialTimeout     = 5 * time.Second
	DefaultWriteTimeout    = 10 * time.Second
	DefaultBackoffMin      = 500 * time.Millisecond
	DefaultBackoffMax      = 30 * time.Second
	DefaultDrainTimeout    = 5 * time.Second
)

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	c.Address = cmp.Or(c.Address, DefaultAddress)
	c.Transport = cmp.Or(c.Transport, TCP)
	c.BufferBytes = cmp.Or(c.BufferBytes, DefaultBufferBytes)
	if c.MaxMessageSize == 0 {
		c.MaxMessageSize = fipfix.MaxMessageLen
		if c.Transport == UDP {
			c.MaxMessageSize = DefaultUDPMessageSize
		}
	}
	c.FlushInterval = cmp.Or(c.FlushInterval, DefaultFlushInterval)
	c.TemplateRefresh = cmp.Or(c.TemplateRefresh, DefaultTemplateRefresh)
	c.DialTimeout = cmp.Or(c.DialTimeout, DefaultDialTimeout)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultWriteTimeout)
	c.BackoffMin = cmp.Or(c.BackoffMin, DefaultBackoffMin)
	c.BackoffMax = cmp.Or(c.BackoffMax, DefaultBackoffMax)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultDrainTimeout)
}

// minMessageSize fits the message and set headers and one record of the
// larger (IPv6) template with short strings.
const minMessageSize = 512

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Address); err != nil {
		errs = append(errs, fmt.Errorf("collector address %q: %w", c.Address, err))
	}
	switch c.Transport {
	case TCP, UDP:
		if c.CAFile != "" || c.CertFile != "" || c.KeyFile != "" {
			errs = append(errs, fmt.Errorf("TLS files given with transport %s", c.Transport))
		}
	case TLS:
	default:
		errs = append(errs, fmt.Errorf("transport %q: want tcp, udp or tls", c.Transport))
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		errs = append(errs, errors.New("client certificate needs both cert and key file"))
	}
	if c.MaxMessageSize < minMessageSize || c.MaxMessageSize > fipfix.MaxMessageLen {
		errs = append(errs, fmt.Errorf("max message size %d: want %d..%d", c.MaxMessageSize, minMessageSize, fipfix.MaxMessageLen))
	}
	if c.BufferBytes < c.MaxMessageSize {
		errs = append(errs, fmt.Errorf("buffer %d bytes: smaller than one message (%d)", c.BufferBytes, c.MaxMessageSize))
	}
	errs = append(errs, defaults.RequirePositive("flush interval", c.FlushInterval), defaults.RequirePositive("template refresh", c.TemplateRefresh),
		defaults.RequirePositive("dial timeout", c.DialTimeout), defaults.RequirePositive("write timeout", c.WriteTimeout),
		defaults.RequirePositive("backoff min", c.BackoffMin), defaults.RequirePositive("backoff max", c.BackoffMax),
		defaults.RequirePositive("drain timeout", c.DrainTimeout))
	if c.BackoffMax < c.BackoffMin {
		errs = append(errs, fmt.Errorf("backoff max %v below min %v", c.BackoffMax, c.BackoffMin))
	}
	return errors.Join(errs...)
}

// LoadTLS loads CAFile, CertFile and KeyFile, reloaded when they change;
// nil without any of them (the system's roots, no client certificate).
func (c Config) LoadTLS() (*reload.TLS, error) {
	if c.CAFile == "" && c.CertFile == "" {
		return nil, nil
	}
	t, err := reload.LoadTLS(reload.TLSFiles{CA: c.CAFile, Cert: c.CertFile, Key: c.KeyFile},
		reload.Options{Name: "ipfix-client", Logger: c.Logger})
	if err != nil {
		return nil, fmt.Errorf("ipfix tls: %w", err)
	}
	return t, nil
}

// tlsConfig returns the TLS configuration of the connections to the
// collector, verified for ServerName, else the host of Address.
func (c Config) tlsConfig() (*tls.Config, error) {
	files := c.TLSFiles
	if files == nil {
		var err error
		if files, err = c.LoadTLS(); err != nil {
			return nil, err
		}
	}
	host, _, _ := net.SplitHostPort(c.Address)
	name := cmp.Or(c.ServerName, host)
	if files == nil {
		return &tls.Config{MinVersion: tls.VersionTLS12, ServerName: name}, nil
	}
	return files.ClientConfig(name), nil
}
