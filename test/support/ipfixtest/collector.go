// Package ipfixtest runs the collector's own IPFIX listener
// (collector/ipfix) for tests and keeps the flow.Records it decodes, so
// the exporter's records come back through the product's decoder.
package ipfixtest

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	cipfix "github.com/dualflow/dualflow/collector/ipfix"
	"github.com/dualflow/dualflow/collector/pipeline"
	"github.com/dualflow/dualflow/flow"
)

// Options of a test collector.
type Options struct {
	// Address to listen on, e.g. "127.0.0.1:0" or "[::1]:0" (default
	// 127.0.0.1:0).
	Address string
	// Protocol is "tcp" (default) or "udp".
	Protocol string
	// TLS: the server certificate and key, and when ClientCA is set the
	// collector requires client certificates signed by it (PEM bytes).
	ServerCert, ServerKey, ClientCA []byte
}

// retention keeps every record's own times: the listener stamps records
// whose end is further than half the retention from their message's
// export time, and test records carry fixed times months away.
const retention = 200 * 365 * 24 * time.Hour

// queueBatches is the size of the listener's output queue; a reader
// drains it, and TCP senders block while it is full.
const queueBatches = 64

// Collector is a running collector.Listener. Records are decoded as the
// product decodes them: every flowDirection is kept, records without
// addresses are skipped, and elements the collector does not map are
// ignored (TestElementsMatchRegistry in flow/ipfix checks the templates
// against go-ipfix's registry).
type Collector struct {
	Addr string // listening address, host:port

	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{} // closed when the reader has every record
	stop   sync.Once

	mu      sync.Mutex
	records []flow.Record
}

// Start starts a collector and registers Stop with t.Cleanup.
func Start(t testing.TB, o Options) *Collector {
	t.Helper()
	if o.Address == "" {
		o.Address = "127.0.0.1:0"
	}
	cfg := cipfix.Config{Direction: cipfix.DirectionBoth, Retention: retention}
	switch {
	case o.Protocol == "udp" && o.ServerCert == nil:
		cfg.UDPAddrs = []string{o.Address}
	case o.Protocol == "" || o.Protocol == "tcp":
		if o.ServerCert == nil {
			cfg.TCPAddrs = []string{o.Address}
			break
		}
		dir := t.TempDir()
		cfg.TLSAddrs = []string{o.Address}
		cfg.TLSCertFile = writeFile(t, dir, "server.crt", o.ServerCert)
		cfg.TLSKeyFile = writeFile(t, dir, "server.key", o.ServerKey)
		if o.ClientCA != nil {
			cfg.TLSClientCAFile = writeFile(t, dir, "client-ca.crt", o.ClientCA)
		}
	default:
		t.Fatalf("ipfixtest: protocol %q with TLS %v", o.Protocol, o.ServerCert != nil)
	}
	reg := prometheus.NewRegistry()
	pm := pipeline.NewMetrics(reg)
	q := pipeline.NewQueue("ipfixtest", queueBatches, pm)
	l, err := cipfix.New(cfg, q, pipeline.NewPool(4*queueBatches, 4*queueBatches), pm, reg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	addrs := append(append(l.TCPAddrs(), l.TLSAddrs()...), l.UDPAddrs()...)
	ctx, cancel := context.WithCancel(context.Background())
	c := &Collector{Addr: addrs[0].String(), reg: reg, cancel: cancel, done: make(chan struct{})}
	go func() {
		l.Run(ctx)
		q.Close() // Run has handed on its last batch
	}()
	go c.read(q)
	t.Cleanup(c.Stop)
	return c
}

func writeFile(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func (c *Collector) read(q *pipeline.Queue) {
	defer close(c.done)
	for b := range q.C() {
		c.mu.Lock()
		c.records = append(c.records, b.Recs...)
		c.mu.Unlock()
		b.Release()
	}
}

// Stop stops the listener, closes its connections and keeps the records
// they delivered. It is idempotent.
func (c *Collector) Stop() {
	c.stop.Do(func() {
		c.cancel()
		<-c.done
	})
}

// Records returns a copy of the records received so far.
func (c *Collector) Records() []flow.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]flow.Record(nil), c.records...)
}

// Errors returns what the listener refused so far, from its metrics:
// dropped messages, records without addresses, data sets of unknown
// templates and sessions closed for an error, one error per kind.
func (c *Collector) Errors() []error {
	mfs, err := c.reg.Gather()
	if err != nil {
		return []error{err}
	}
	var errs []error
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			label := map[string]string{}
			for _, lp := range m.GetLabel() {
				label[lp.GetName()] = lp.GetValue()
			}
			n := m.GetCounter().GetValue()
			if n == 0 {
				continue
			}
			switch name := mf.GetName(); {
			case name == "dualflow_ipfix_messages_dropped_total",
				name == "dualflow_ipfix_records_skipped_total" && label["reason"] == "no_address",
				name == "dualflow_ipfix_sets_unknown_template_total",
				name == "dualflow_ipfix_sessions_closed_total" && label["reason"] != "eof" && label["reason"] != "shutdown":
				errs = append(errs, fmt.Errorf("%s%v: %v", name, label, n))
			}
		}
	}
	return errs
}

// Wait polls until ok accepts the records received so far or timeout
// passes, and returns the records (failing the test on timeout).
func (c *Collector) Wait(t testing.TB, timeout time.Duration, ok func([]flow.Record) bool) []flow.Record {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		recs := c.Records()
		if ok(recs) {
			return recs
		}
		if time.Now().After(deadline) {
			t.Fatalf("collector %s: condition not met after %v; %d records, errors %v", c.Addr, timeout, len(recs), c.Errors())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Len returns how many records arrived so far.
func (c *Collector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.records)
}

// WaitN waits for at least n records and returns them.
func (c *Collector) WaitN(t testing.TB, timeout time.Duration, n int) []flow.Record {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for c.Len() < n {
		if time.Now().After(deadline) {
			t.Fatalf("collector %s: %d of %d records after %v, errors %v", c.Addr, c.Len(), n, timeout, c.Errors())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return c.Records()
}
