package ipfix

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
	"github.com/dualflow/dualflow/test/support/ipfixtest"
)

var t0 = time.UnixMilli(1_780_000_000_000)

// records returns n records of IP version v, numbered through SrcPort and
// BytesDelta so tests can tell which arrived.
func records(v uint8, n, first int) []flow.Record {
	src, dst := netip.MustParseAddr("198.18.1.1"), netip.MustParseAddr("198.18.2.2")
	if v == 6 {
		src, dst = netip.MustParseAddr("fd00:10:1::1"), netip.MustParseAddr("fd00:10:2::2")
	}
	out := make([]flow.Record, n)
	for i := range out {
		k := first + i
		out[i] = flow.Record{FlowStart: t0, FlowEnd: t0.Add(time.Second), SrcAddr: src, DstAddr: dst,
			SrcPort: uint16(k), DstPort: 8080, Proto: flow.ProtoTCP, Packets: 1, Bytes: uint64(k), BytesDelta: uint64(k),
			EndReason: flow.EndReasonEndOfFlow, TCPState: "CLOSE", ExporterNode: "node-a", Source: fipfix.SourceConntrack,
			IPVersion: v}
	}
	return out
}

// start runs e until the test ends and returns a func that stops it and
// waits for Run to return.
func start(t *testing.T, e *Exporter) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	}
	t.Cleanup(stop)
	return stop
}

// waitFor polls cond until it holds, failing the test after timeout.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newExporter(t *testing.T, cfg Config) *Exporter {
	t.Helper()
	cfg.SetDefaults()
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestRoundTrip sends records of each family over each transport to the
// collector's listener (ipfixtest) and decodes them back. The transport family
// is separate from the records' family: IPv6 records over IPv4 and the
// other way round.
func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name, listen, transport string
	}{
		{"tcp over ipv4", "127.0.0.1:0", TCP},
		{"tcp over ipv6", "[::1]:0", TCP},
		{"udp over ipv4", "127.0.0.1:0", UDP},
		{"udp over ipv6", "[::1]:0", UDP},
	} {
		t.Run(tc.name, func(t *testing.T) {
			col := ipfixtest.Start(t, ipfixtest.Options{Address: tc.listen, Protocol: tc.transport})
			e := newExporter(t, Config{Address: col.Addr, Transport: tc.transport, ObservationDomainID: 7, FlushInterval: 50 * time.Millisecond})
			start(t, e)
			n := 200
			if tc.transport == UDP {
				n = 20 // UDP may lose a burst on a loaded machine
			}
			var sent []flow.Record
			for _, v := range []uint8{4, 6} {
				recs := records(v, n, 0)
				sent = append(sent, recs...)
				e.Export(recs)
			}
			got := col.WaitN(t, 5*time.Second, len(sent))
			byKey := map[[2]any]flow.Record{}
			for _, r := range got {
				byKey[[2]any{r.IPVersion, r.SrcPort}] = r
			}
			for _, w := range sent {
				r, ok := byKey[[2]any{w.IPVersion, w.SrcPort}]
				if !ok {
					t.Fatalf("IPv%d record %d missing", w.IPVersion, w.SrcPort)
				}
				w.Ingress.Rule, w.Egress.Rule = -1, -1
				w.ObservationDomainID, w.ExporterAddr, w.TimeReceived = 7, r.ExporterAddr, r.TimeReceived
				if !reflect.DeepEqual(r, w) {
					t.Fatalf("record:\n got %+v\nwant %+v", r, w)
				}
				if want := netip.MustParseAddrPort(col.Addr).Addr().Unmap(); r.ExporterAddr != want {
					t.Fatalf("exporter address %v, want %v (the transport's)", r.ExporterAddr, want)
				}
			}
			st := e.Stats()
			if st.Records != [2]uint64{uint64(n), uint64(n)} || !st.Connected || st.Connects != 1 {
				t.Errorf("stats %+v", st)
			}
			if tc.transport == TCP && st.Messages > 2 {
				t.Errorf("%d records took %d messages; want them batched", 2*n, st.Messages)
			}
		})
	}
}

// TestIPv6Collector is the IPv6-only case: the exporter reaches the
// collector at [::1] only, records are IPv6.
func TestIPv6Collector(t *testing.T) {
	col := ipfixtest.Start(t, ipfixtest.Options{Address: "[::1]:0"})
	if ap := netip.MustParseAddrPort(col.Addr); !ap.Addr().Is6() || ap.Addr().Is4In6() {
		t.Fatalf("collector on %s, want IPv6", col.Addr)
	}
	e := newExporter(t, Config{Address: col.Addr, FlushInterval: 20 * time.Millisecond})
	start(t, e)
	e.Export(records(6, 10, 0))
	got := col.WaitN(t, 5*time.Second, 10)
	for _, r := range got {
		if r.ExporterAddr != netip.MustParseAddr("::1") || r.IPVersion != 6 {
			t.Fatalf("record from %v, IPv%d", r.ExporterAddr, r.IPVersion)
		}
	}
}

// TestTLS uses TLS with and without a client certificate.
func TestTLS(t *testing.T) {
	pki := newPKI(t)
	for _, tc := range []struct {
		name       string
		clientCert bool
	}{
		{"server auth", false},
		{"client certificate", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ipfixtest.Options{Address: "[::1]:0", ServerCert: pki.serverCert, ServerKey: pki.serverKey}
			cfg := Config{Transport: TLS, CAFile: pki.caFile, ServerName: "collector.test", FlushInterval: 20 * time.Millisecond}
			if tc.clientCert {
				o.ClientCA = pki.caPEM
				cfg.CertFile, cfg.KeyFile = pki.clientCertFile, pki.clientKeyFile
			}
			col := ipfixtest.Start(t, o)
			cfg.Address = col.Addr
			e := newExporter(t, cfg)
			start(t, e)
			e.Export(records(4, 5, 0))
			e.Export(records(6, 5, 0))
			col.WaitN(t, 5*time.Second, 10)
		})
	}
	t.Run("collector requires a client certificate we lack", func(t *testing.T) {
		col := ipfixtest.Start(t, ipfixtest.Options{Address: "127.0.0.1:0", ServerCert: pki.serverCert, ServerKey: pki.serverKey, ClientCA: pki.caPEM})
		e := newExporter(t, Config{Address: col.Addr, Transport: TLS, CAFile: pki.caFile, ServerName: "collector.test",
			FlushInterval: 20 * time.Millisecond, BackoffMin: 20 * time.Millisecond, BackoffMax: 50 * time.Millisecond})
		stop := start(t, e)
		e.Export(records(4, 5, 0))
		waitFor(t, 5*time.Second, "no failed attempt counted", func() bool {
			st := e.Stats()
			return st.Disconnects+st.DialFailures >= 2
		})
		stop()
		if n := len(col.Records()); n != 0 {
			t.Errorf("collector accepted %d records", n)
		}
		if st := e.Stats(); st.Disconnects+st.DialFailures == 0 {
			t.Errorf("no failure counted: %+v", st)
		}
	})
}

// TestCollectorDown runs the exporter while nothing listens: it keeps
// running, the buffer stays within its bound and drops the oldest records,
// and once a collector appears the newest records arrive.
func TestCollectorDown(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run(listen, func(t *testing.T) {
			addr := freePort(t, listen)
			const bound = 64 << 10
			e := newExporter(t, Config{Address: addr, BufferBytes: bound, FlushInterval: 20 * time.Millisecond,
				BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
			start(t, e)
			const total = 5000
			for i := 0; i < total; i += 100 {
				e.Export(records(6, 100, i))
				if st := e.Stats(); st.BufferedBytes > bound+2*e.cfg.MaxMessageSize {
					t.Fatalf("buffer %d bytes, bound %d", st.BufferedBytes, bound)
				}
			}
			waitFor(t, 5*time.Second, "fewer than 2 reconnection attempts", func() bool {
				st := e.Stats()
				return st.DialFailures >= 2 && st.Reconnects >= 2
			})
			e.Flush()
			st := e.Stats()
			if st.Connected || st.DialFailures < 2 || st.Reconnects < 2 {
				t.Fatalf("stats while down: %+v", st)
			}
			if st.DroppedBufferFull == 0 || st.BufferedRecords+int(st.DroppedBufferFull) != total {
				t.Fatalf("buffered %d + dropped %d != %d", st.BufferedRecords, st.DroppedBufferFull, total)
			}
			if st.BufferedBytes > bound {
				t.Fatalf("buffer %d bytes over the bound %d", st.BufferedBytes, bound)
			}
			buffered := st.BufferedRecords

			col := ipfixtest.Start(t, ipfixtest.Options{Address: addr})
			e.Export(records(6, 10, total))
			got := col.WaitN(t, 10*time.Second, buffered+10)
			if len(got) != buffered+10 {
				t.Fatalf("got %d records, want %d", len(got), buffered+10)
			}
			// Drop-oldest: what arrives is the newest records, in order.
			for i, r := range got {
				if want := total + 10 - len(got) + i; int(r.SrcPort) != want {
					t.Fatalf("record %d is #%d, want #%d", i, r.SrcPort, want)
				}
			}
			if st := e.Stats(); !st.Connected || st.Connects != 1 || st.BufferedRecords != 0 {
				t.Fatalf("stats after recovery: %+v", st)
			}
		})
	}
}

// TestCollectorRestart stops the collector mid-stream: the exporter notices,
// reconnects to the new one and later records arrive there.
func TestCollectorRestart(t *testing.T) {
	col := ipfixtest.Start(t, ipfixtest.Options{Address: "127.0.0.1:0"})
	e := newExporter(t, Config{Address: col.Addr, FlushInterval: 20 * time.Millisecond,
		BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	start(t, e)
	e.Export(records(4, 10, 0))
	col.WaitN(t, 5*time.Second, 10)
	col.Stop()
	waitFor(t, 5*time.Second, "the exporter did not notice the collector left", func() bool { return e.Stats().Disconnects >= 1 })
	col2 := ipfixtest.Start(t, ipfixtest.Options{Address: col.Addr})
	deadline := time.Now().Add(10 * time.Second)
	for i := 10; ; i += 10 {
		e.Export(records(4, 10, i))
		if len(col2.Records()) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no record reached the restarted collector; stats %+v", e.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if st := e.Stats(); st.Connects < 2 || st.Disconnects < 1 {
		t.Errorf("stats %+v", st)
	}
}

// TestCollectorRestartLosesNothing stops the collector while records
// stream to it, over TCP and TLS, again and again: every record reaches
// the stopping collector or the next one. A collector that closed its
// sessions at once lost the messages in its socket buffer and on the
// wire, which the exporter had counted as sent (the real cluster's churn
// check lost a connection's row across a collector pod's deletion).
func TestCollectorRestartLosesNothing(t *testing.T) {
	pki := newPKI(t)
	for _, tc := range []struct {
		name string
		tls  bool
	}{{"tcp", false}, {"tls", true}} {
		t.Run(tc.name, func(t *testing.T) {
			o := ipfixtest.Options{Address: freePort(t, "127.0.0.1:0")}
			cfg := Config{Address: o.Address, FlushInterval: 5 * time.Millisecond,
				BackoffMin: 10 * time.Millisecond, BackoffMax: 20 * time.Millisecond}
			if tc.tls {
				o.ServerCert, o.ServerKey = pki.serverCert, pki.serverKey
				cfg.Transport, cfg.CAFile, cfg.ServerName = TLS, pki.caFile, "collector.test"
			}
			e := newExporter(t, cfg)
			start(t, e)
			const restarts, per = 8, 10
			var cols []*ipfixtest.Collector
			sent := 0
			for range restarts {
				col := ipfixtest.Start(t, o)
				cols = append(cols, col)
				// Records stream in small messages while the collector
				// stops (no wait for them): some are on the wire, some
				// in its socket buffer.
				for range 40 {
					e.Export(records(4, per, sent))
					sent += per
					time.Sleep(time.Millisecond)
				}
				col.Stop()
			}
			last := ipfixtest.Start(t, o)
			cols = append(cols, last)
			seen := make([]int, sent)
			n := 0
			for deadline := time.Now().Add(20 * time.Second); n < sent && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				clear(seen)
				n = 0
				for _, c := range cols {
					for _, r := range c.Records() {
						if seen[r.SrcPort]++; seen[r.SrcPort] == 1 {
							n++
						}
					}
				}
			}
			if n < sent {
				t.Fatalf("%d of %d records lost across %d collector restarts; stats %+v", sent-n, sent, restarts, e.Stats())
			}
			if st := e.Stats(); st.DroppedBufferFull != 0 || st.Reconnects < restarts {
				t.Errorf("stats %+v", st)
			}
		})
	}
}

// TestDrainOnShutdown exports and stops at once: Run sends everything
// before it returns.
func TestDrainOnShutdown(t *testing.T) {
	col := ipfixtest.Start(t, ipfixtest.Options{Address: "[::1]:0"})
	e := newExporter(t, Config{Address: col.Addr, FlushInterval: time.Hour})
	stop := start(t, e)
	waitFor(t, 5*time.Second, "not connected", func() bool { return e.Stats().Connected })
	e.Export(records(4, 1000, 0))
	e.Export(records(6, 1000, 0))
	stop()
	col.WaitN(t, 5*time.Second, 2000)
	if st := e.Stats(); st.DroppedShutdown != 0 || st.BufferedRecords != 0 {
		t.Errorf("stats %+v", st)
	}
}

// TestShutdownWhileDown stops an exporter whose collector never came up:
// Run returns within the drain timeout and counts the records as dropped.
func TestShutdownWhileDown(t *testing.T) {
	e := newExporter(t, Config{Address: freePort(t, "127.0.0.1:0"), DrainTimeout: 200 * time.Millisecond})
	stop := start(t, e)
	e.Export(records(4, 10, 0))
	began := time.Now()
	stop()
	if d := time.Since(began); d > 2*time.Second {
		t.Errorf("stop took %v", d)
	}
	if st := e.Stats(); st.DroppedShutdown != 10 {
		t.Errorf("stats %+v", st)
	}
}

// TestDrainBoundedBySlowCollector stops the exporter while a collector
// that reads slowly (but within the write timeout) has megabytes to go:
// Run must return within the drain timeout and count the rest as dropped.
func TestDrainBoundedBySlowCollector(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run(listen, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			running := false
			t.Cleanup(func() { // after the collector's cleanup has closed its side
				cancel()
				if running {
					<-done
				}
			})
			addr := slowCollector(t, listen)
			const drain = 300 * time.Millisecond
			e := newExporter(t, Config{Address: addr, WriteTimeout: 5 * time.Second, DrainTimeout: drain, FlushInterval: 20 * time.Millisecond})
			running = true
			go func() { done <- e.Run(ctx) }()
			waitFor(t, 5*time.Second, "not connected", func() bool { return e.Stats().Connected })
			// Fill the buffer well past what the socket buffers absorb.
			total := 0
			for e.Stats().BufferedBytes < 8<<20 && total < 500_000 {
				e.Export(records(4, 1000, total))
				total += 1000
			}
			began := time.Now()
			cancel()
			select {
			case <-done:
				running = false
			case <-time.After(drain + 3*time.Second):
				t.Fatalf("Run still draining %v after the shutdown; drain timeout %v; stats %+v", time.Since(began), drain, e.Stats())
			}
			st := e.Stats()
			if st.DroppedShutdown == 0 || st.Records[0]+st.DroppedShutdown != uint64(total) {
				t.Errorf("exported %d: sent %d + dropped at shutdown %d; stats %+v", total, st.Records[0], st.DroppedShutdown, st)
			}
		})
	}
}

// slowCollector accepts TCP connections on listen and reads each at about
// 400 KB/s, slow enough to take seconds over megabytes and fast enough
// that no single write times out. It returns the address.
func slowCollector(t *testing.T, listen string) string {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.(*net.TCPConn).SetReadBuffer(16 << 10) // no receive window autotuning
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				buf := make([]byte, 4<<10)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

// TestOversizeRecord sends a record too large for any message between
// normal ones, in each family: it is dropped and counted, and the records
// around it arrive (the stream stays in sync).
func TestOversizeRecord(t *testing.T) {
	col := ipfixtest.Start(t, ipfixtest.Options{Address: "[::1]:0"})
	e := newExporter(t, Config{Address: col.Addr, FlushInterval: 20 * time.Millisecond})
	start(t, e)
	long := strings.Repeat("n", 60000) // two of them: 120 kB, past the 16-bit message length
	for _, v := range []uint8{4, 6} {
		big := records(v, 1, 100)[0]
		big.Src.NodeName, big.Dst.NodeName = long, long
		e.Export(records(v, 5, 0))
		e.Export([]flow.Record{big})
		e.Export(records(v, 5, 5))
	}
	got := col.WaitN(t, 5*time.Second, 20)
	if len(got) != 20 || len(col.Errors()) != 0 {
		t.Fatalf("%d records, decode errors %v", len(got), col.Errors())
	}
	for _, r := range got {
		if r.SrcPort >= 10 {
			t.Errorf("IPv%d record %d arrived", r.IPVersion, r.SrcPort)
		}
	}
	waitFor(t, 5*time.Second, "sent records not counted", func() bool { return e.Stats().Records == [2]uint64{10, 10} })
	if st := e.Stats(); st.DroppedOversize != 2 {
		t.Errorf("stats %+v", st)
	}
}

// TestOversizeRecordUDP: over UDP a record longer than the 1400-byte
// message is dropped too.
func TestOversizeRecordUDP(t *testing.T) {
	e := newExporter(t, Config{Transport: UDP})
	for _, v := range []uint8{4, 6} {
		recs := records(v, 3, 0)
		recs[1].ExporterNode = strings.Repeat("n", 1500)
		e.Export(recs)
	}
	if st := e.Stats(); st.DroppedOversize != 2 || st.BufferedRecords != 4 {
		t.Errorf("stats %+v", st)
	}
}

func TestInvalidRecord(t *testing.T) {
	e := newExporter(t, Config{})
	e.Export([]flow.Record{{Proto: 6}})
	if st := e.Stats(); st.DroppedInvalid != 1 || st.BufferedRecords != 0 {
		t.Errorf("stats %+v", st)
	}
}

func TestConfig(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{}, true},
		{"ipv6", Config{Address: "[fd00:10::1]:4739"}, true},
		{"udp", Config{Transport: UDP}, true},
		{"tls", Config{Transport: TLS, CAFile: "ca.pem"}, true},
		{"no port", Config{Address: "collector"}, false},
		{"sctp", Config{Transport: "sctp"}, false},
		{"tls files on tcp", Config{CAFile: "ca.pem"}, false},
		{"cert without key", Config{Transport: TLS, CertFile: "c.pem"}, false},
		{"tiny messages", Config{MaxMessageSize: 100}, false},
		{"buffer below a message", Config{BufferBytes: 1000}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.SetDefaults()
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Errorf("Validate: %v", err)
			}
		})
	}
	var c Config
	c.Transport = UDP
	c.SetDefaults()
	if c.MaxMessageSize != DefaultUDPMessageSize {
		t.Errorf("udp message size %d", c.MaxMessageSize)
	}
}

// BenchmarkExport is the cost per record of encoding into the buffer.
func BenchmarkExport(b *testing.B) {
	e, _ := New(func() Config { c := Config{BufferBytes: 64 << 20}; c.SetDefaults(); return c }())
	recs := append(records(4, 500, 0), records(6, 500, 0)...)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += len(recs) {
		e.Export(recs[:min(len(recs), b.N-i)])
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

// BenchmarkSend is the throughput to the collector's listener over
// loopback TCP, end to end (encode, write, the collector's decode).
func BenchmarkSend(b *testing.B) {
	col := ipfixtest.Start(b, ipfixtest.Options{Address: "127.0.0.1:0"})
	e, _ := New(func() Config {
		c := Config{Address: col.Addr, BufferBytes: 256 << 20, FlushInterval: 10 * time.Millisecond}
		c.SetDefaults()
		return c
	}())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- e.Run(ctx) }()
	defer func() { cancel(); <-done }()
	recs := append(records(4, 500, 0), records(6, 500, 0)...)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += len(recs) {
		e.Export(recs[:min(len(recs), b.N-i)])
	}
	e.Flush()
	col.WaitN(b, time.Minute, b.N)
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "records/s")
}

func freePort(t *testing.T, listen string) string {
	t.Helper()
	l, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

type pki struct {
	caPEM, serverCert, serverKey  []byte
	caFile                        string
	clientCertFile, clientKeyFile string
}

// newPKI makes a CA, a server certificate for collector.test and a client
// certificate, all ECDSA P-256, valid for an hour.
func newPKI(t *testing.T) pki {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dualflow test CA"},
		NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	}
	p := pki{caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
	p.serverCert, p.serverKey = leaf(2, "collector.test", x509.ExtKeyUsageServerAuth)
	clientCert, clientKey := leaf(3, "node-a", x509.ExtKeyUsageClientAuth)
	p.caFile = filepath.Join(dir, "ca.pem")
	p.clientCertFile, p.clientKeyFile = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	for f, b := range map[string][]byte{p.caFile: p.caPEM, p.clientCertFile: clientCert, p.clientKeyFile: clientKey} {
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return p
}
