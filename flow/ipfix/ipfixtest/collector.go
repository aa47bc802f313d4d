// Package ipfixtest runs a go-ipfix collecting process for tests and
// decodes what it receives into flow.Records with flow/ipfix, the mapping
// the exporter encodes with.
package ipfixtest

import (
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/vmware/go-ipfix/pkg/collector"
	"k8s.io/klog/v2"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/flow/ipfix"
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

// Collector is a running collecting process. It decodes strictly: every
// element must be registered (ipfix.Register), so a template with an
// element of the wrong type or ID fails the test's connection.
type Collector struct {
	cp   *collector.CollectingProcess
	Addr string // listening address, host:port

	mu       sync.Mutex
	records  []flow.Record
	errs     []error
	messages int
	done     chan struct{}
	stopOnce sync.Once
}

var quietOnce sync.Once

// Start starts a collector and registers Stop with t.Cleanup.
func Start(t testing.TB, o Options) *Collector {
	t.Helper()
	quietOnce.Do(func() {
		// go-ipfix logs every connection through klog; keep test output readable.
		klog.SetLogger(logr.Discard())
	})
	if err := ipfix.Register(); err != nil {
		t.Fatal(err)
	}
	if o.Address == "" {
		o.Address = "127.0.0.1:0"
	}
	if o.Protocol == "" {
		o.Protocol = "tcp"
	}
	cp, err := collector.InitCollectingProcess(collector.CollectorInput{
		Address: o.Address, Protocol: o.Protocol, MaxBufferSize: 65535,
		DecodingMode: collector.DecodingModeStrict,
		IsEncrypted:  o.ServerCert != nil, ServerCert: o.ServerCert, ServerKey: o.ServerKey, CACert: o.ClientCA,
	})
	if err != nil {
		t.Fatal(err)
	}
	c := &Collector{cp: cp, done: make(chan struct{})}
	go cp.Start()
	deadline := time.Now().Add(5 * time.Second)
	for cp.GetAddress() == nil {
		if time.Now().After(deadline) {
			t.Fatalf("collector on %s did not start", o.Address)
		}
		time.Sleep(5 * time.Millisecond)
	}
	c.Addr = cp.GetAddress().String()
	go c.read()
	t.Cleanup(c.Stop)
	return c
}

func (c *Collector) read() {
	defer close(c.done)
	for msg := range c.cp.GetMsgChan() {
		recs, err := ipfix.AppendMessage(nil, msg, time.Now())
		c.mu.Lock()
		c.messages++
		c.records = append(c.records, recs...)
		if err != nil {
			c.errs = append(c.errs, err)
		}
		c.mu.Unlock()
	}
}

// Stop stops the collecting process and closes its connections. It is
// idempotent.
func (c *Collector) Stop() {
	c.stopOnce.Do(func() {
		c.cp.Stop()
		<-c.done
	})
}

// Records returns a copy of the records received so far.
func (c *Collector) Records() []flow.Record {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]flow.Record(nil), c.records...)
}

// Messages returns how many IPFIX messages (templates included) arrived.
func (c *Collector) Messages() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.messages
}

// Errors returns the decode errors so far.
func (c *Collector) Errors() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
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
			t.Fatalf("collector %s: condition not met after %v; %d records, decode errors %v", c.Addr, timeout, len(recs), c.Errors())
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
			t.Fatalf("collector %s: %d of %d records after %v, decode errors %v", c.Addr, c.Len(), n, timeout, c.Errors())
		}
		time.Sleep(5 * time.Millisecond)
	}
	return c.Records()
}
