package ipfix

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vmware/go-ipfix/pkg/entities"
	"github.com/vmware/go-ipfix/pkg/exporter"
	"github.com/vmware/go-ipfix/pkg/registry"

	"github.com/dualflow/dualflow/collector/pipeline"
	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
	"github.com/dualflow/dualflow/test/support/logtest"
)

// startListener runs a Listener on loopback and returns it with its output
// queue and registry.
func startListener(t *testing.T, cfg Config) (*Listener, *pipeline.Queue, *prometheus.Registry) {
	t.Helper()
	return startListenerLog(t, cfg, nil)
}

// startListenerLog is startListener logging to log (nil: slog.Default()).
func startListenerLog(t *testing.T, cfg Config, log *slog.Logger) (*Listener, *pipeline.Queue, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	pm := pipeline.NewMetrics(reg)
	q := pipeline.NewQueue("decoded", 64, pm)
	l, err := New(cfg, q, pipeline.NewPool(256, 64), pm, reg, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return l, q, reg
}

// collect reads n records from q.
func collect(t *testing.T, q *pipeline.Queue, n int) []flow.Record {
	t.Helper()
	var out []flow.Record
	deadline := time.After(10 * time.Second)
	for len(out) < n {
		select {
		case b := <-q.C():
			out = append(out, b.Recs...)
			b.Release()
		case <-deadline:
			t.Fatalf("got %d of %d records", len(out), n)
		}
	}
	return out
}

func ie(t *testing.T, name string, ent uint32) *entities.InfoElement {
	t.Helper()
	e, err := registry.GetInfoElement(name, ent)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestGoIPFIXExporter receives from go-ipfix's exporting process, an
// exporter we did not write, over TCP and UDP, in both families.
func TestGoIPFIXExporter(t *testing.T) {
	registry.LoadRegistry()
	for _, proto := range []string{"tcp", "udp"} {
		t.Run(proto, func(t *testing.T) {
			cfg := Config{}
			if proto == "tcp" {
				cfg.TCPAddrs = []string{"127.0.0.1:0"}
			} else {
				cfg.UDPAddrs = []string{"127.0.0.1:0"}
			}
			l, q, _ := startListener(t, cfg)
			addr := append(l.TCPAddrs(), l.UDPAddrs()...)[0].String()
			ep, err := exporter.InitExportingProcess(exporter.ExporterInput{
				CollectorAddress: addr, CollectorProtocol: proto, ObservationDomainID: 77, TempRefTimeout: 1,
			})
			if err != nil {
				t.Fatal(err)
			}
			defer ep.CloseConnToCollector()
			start := time.Unix(1_780_000_000, 0)
			sent := time.Now().Truncate(time.Second) // export times are whole seconds
			type row struct {
				fam      string
				src, dst string
				srcName  string
				dstNames []string
			}
			rows := []row{
				{"ipv4", "198.18.1.1", "198.18.2.2", "sourceIPv4Address", []string{"destinationIPv4Address"}},
				{"ipv6", "fd00:10:1::1", "fd00:10:2::2", "sourceIPv6Address", []string{"destinationIPv6Address"}},
			}
			for _, r := range rows {
				tid := ep.NewTemplateID()
				mk := func(src, dst net.IP) []entities.InfoElementWithValue {
					return []entities.InfoElementWithValue{
						entities.NewIPAddressInfoElement(ie(t, r.srcName, 0), src),
						entities.NewIPAddressInfoElement(ie(t, r.dstNames[0], 0), dst),
						entities.NewUnsigned16InfoElement(ie(t, "sourceTransportPort", 0), 40000),
						entities.NewUnsigned16InfoElement(ie(t, "destinationTransportPort", 0), 8080),
						entities.NewUnsigned8InfoElement(ie(t, "protocolIdentifier", 0), 6),
						entities.NewDateTimeSecondsInfoElement(ie(t, "flowStartSeconds", 0), uint32(start.Unix())),
						entities.NewUnsigned64InfoElement(ie(t, "packetDeltaCount", 0), 5),
						entities.NewUnsigned64InfoElement(ie(t, "octetTotalCount", 0), 300),
						entities.NewStringInfoElement(ie(t, "sourcePodName", fipfix.EnterpriseAntrea), "web-1"),
						entities.NewUnsigned64InfoElement(ie(t, "reversePacketDeltaCount", fipfix.EnterpriseReverse), 4),
					}
				}
				tmpl := entities.NewSet(false)
				tmpl.PrepareSet(entities.Template, tid)
				tmpl.AddRecordV2(mk(nil, nil), tid)
				if _, err := ep.SendSet(tmpl); err != nil {
					t.Fatal(err)
				}
				data := entities.NewSet(false)
				data.PrepareSet(entities.Data, tid)
				src, dst := net.ParseIP(r.src), net.ParseIP(r.dst)
				data.AddRecordV2(mk(src, dst), tid)
				data.AddRecordV2(mk(src, dst), tid)
				if _, err := ep.SendSet(data); err != nil {
					t.Fatal(err)
				}
			}
			got := collect(t, q, 4)
			for i, g := range got {
				r := rows[i/2]
				want := flow.Record{
					SrcAddr: netip.MustParseAddr(r.src), DstAddr: netip.MustParseAddr(r.dst),
					SrcPort: 40000, DstPort: 8080, Proto: 6, FlowStart: start,
					PacketsDelta: 5, Bytes: 300, ReversePacketsDelta: 4,
					Source: fipfix.SourceForeign, ObservationDomainID: 77,
				}
				want.Src.PodName = "web-1"
				want.Normalize()
				want.Ingress.Rule, want.Egress.Rule = -1, -1
				g.TimeReceived, g.ExporterAddr = time.Time{}, netip.Addr{}
				if !g.FlowStart.Equal(want.FlowStart) {
					t.Errorf("%s: start %v", r.fam, g.FlowStart)
				}
				// No end element: the end is the message's export time.
				if g.FlowEnd.Before(sent) || g.FlowEnd.After(time.Now()) {
					t.Errorf("%s: end %v, want the export time (sent at %v)", r.fam, g.FlowEnd, sent)
				}
				g.FlowStart, want.FlowStart, g.FlowEnd = time.Time{}, time.Time{}, time.Time{}
				if !reflect.DeepEqual(g, want) {
					t.Errorf("%s:\n got %+v\nwant %+v", r.fam, g, want)
				}
			}
		})
	}
}

// writeCerts writes a CA, a server certificate for 127.0.0.1 and a client
// certificate, all signed by the CA, and returns their paths.
func writeCerts(t *testing.T) (dir string) {
	dir = t.TempDir()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name, typ string, der []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "dualflow test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write("ca.pem", "CERTIFICATE", caDER)
	for i, name := range []string{"server", "client"} {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(int64(i + 2)), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, _ := x509.MarshalECPrivateKey(k)
		write(name+".pem", "CERTIFICATE", der)
		write(name+"-key.pem", "EC PRIVATE KEY", kd)
	}
	return dir
}

func TestMutualTLS(t *testing.T) {
	dir := writeCerts(t)
	p := func(n string) string { return filepath.Join(dir, n) }
	l, q, reg := startListener(t, Config{TLSAddrs: []string{"127.0.0.1:0"},
		TLSCertFile: p("server.pem"), TLSKeyFile: p("server-key.pem"), TLSClientCAFile: p("ca.pem")})
	caPEM, _ := os.ReadFile(p("ca.pem"))
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(p("client.pem"), p("client-key.pem"))
	if err != nil {
		t.Fatal(err)
	}
	addr := l.TLSAddrs()[0].String()
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{cert}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	recs := sampleRecords()
	for _, v := range []uint8{4, 6} {
		e := mustEncoder(v, 256+uint16(v))
		for i := range recs {
			if flow.Version(recs[i].SrcAddr) == v {
				if _, err := c.Write(encoderMessage(e, 1, 0, true, &recs[i])); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	got := collect(t, q, len(recs))
	for _, g := range got {
		if g.ObservationDomainID != 1 || g.ExporterNode != "node-1" {
			t.Errorf("record %+v", g)
		}
	}
	// Without a client certificate the handshake fails and nothing arrives.
	bad, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots})
	if err == nil {
		bad.Write(encoderMessage(mustEncoder(4, 256), 1, 0, true, &recs[0]))
		buf := make([]byte, 1)
		bad.SetReadDeadline(time.Now().Add(2 * time.Second))
		_, err = bad.Read(buf) // the server's alert surfaces here (TLS 1.3)
		bad.Close()
	}
	if err == nil {
		t.Fatal("TLS session without a client certificate accepted")
	}
	deadline := time.Now().Add(3 * time.Second)
	for testutil.ToFloat64(closedCounter(t, reg, "tls", "tls_handshake")) < 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if n := testutil.ToFloat64(closedCounter(t, reg, "tls", "tls_handshake")); n != 1 {
		t.Errorf("tls_handshake closes %v, want 1", n)
	}
}

func closedCounter(t *testing.T, reg *prometheus.Registry, tr, reason string) prometheus.Collector {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "x"})
	v, _ := counterValue(t, reg, "dualflow_ipfix_sessions_closed_total", map[string]string{"transport": tr, "reason": reason})
	c.Add(v)
	return c
}

// counterValue sums the series of counter name that have labels want;
// false when none exists.
func counterValue(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum, found := 0.0, false
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue series
				}
			}
			sum, found = sum+m.GetCounter().GetValue(), true
		}
	}
	return sum, found
}

// TestSequenceLossPerExporter: sequence losses are counted per exporter
// address, in three modes (an IPv4 exporter, an IPv6 one, both on one
// listener): the exporter that lost records has them, the other a series
// at 0 from its first message (so that increase() sees a first loss).
func TestSequenceLossPerExporter(t *testing.T) {
	for _, mode := range []string{"ipv4", "ipv6", "dual"} {
		t.Run(mode, func(t *testing.T) {
			addrs := map[string][]string{"ipv4": {"127.0.0.1:0"}, "ipv6": {"[::1]:0"}, "dual": {"127.0.0.1:0", "[::1]:0"}}[mode]
			l, q, reg := startListener(t, Config{UDPAddrs: addrs})
			r := sampleRecords()[0]
			want := map[string]float64{}
			total := 0
			for i, a := range l.UDPAddrs() {
				c, err := net.Dial("udp", a.String())
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				// The first exporter loses messages 2..9 (8 records); the
				// second (dual) loses none.
				seqs, lost := []uint32{0, 1, 10, 11}, 8.0
				if i == 1 {
					seqs, lost = []uint32{0, 1, 2, 3}, 0
				}
				e := mustEncoder(4, 300)
				for j, s := range seqs {
					if _, err := c.Write(encoderMessage(e, 1, s, j == 0, &r)); err != nil {
						t.Fatal(err)
					}
					total++
				}
				host, _, _ := net.SplitHostPort(c.LocalAddr().String())
				want[host] = lost
			}
			collect(t, q, total)
			deadline := time.Now().Add(10 * time.Second)
			for {
				ok := true
				var got []string
				for host, n := range want {
					v, found := counterValue(t, reg, "dualflow_ipfix_sequence_lost_records_total", map[string]string{"transport": "udp", "exporter": host})
					got = append(got, fmt.Sprintf("%s: %v (series %v)", host, v, found))
					ok = ok && found && v == n
				}
				if ok {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("lost records per exporter %v, want %v", got, want)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// TestTCPBadFraming: a header that cannot be trusted ends that session
// only; a good session on the same listener keeps working.
func TestTCPBadFraming(t *testing.T) {
	l, q, reg := startListener(t, Config{TCPAddrs: []string{"[::1]:0"}})
	addr := l.TCPAddrs()[0].String()
	good, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	bad, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	r := sampleRecords()[2]
	e := mustEncoder(6, 256)
	// A message with a bad set inside: dropped, the stream continues.
	if _, err := good.Write(message(1, 0, cat(be16(256), be16(2)))); err != nil {
		t.Fatal(err)
	}
	bad.Write([]byte{0, 10, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	buf := make([]byte, 1)
	bad.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bad.Read(buf); err == nil {
		t.Error("session with a bad header not closed")
	}
	if _, err := good.Write(encoderMessage(e, 1, 0, true, &r, &r)); err != nil {
		t.Fatal(err)
	}
	got := collect(t, q, 2)
	if got[0].SrcAddr != r.SrcAddr {
		t.Errorf("record %+v", got[0])
	}
	if n := testutil.ToFloat64(closedCounter(t, reg, "tcp", "bad_framing")); n != 1 {
		t.Errorf("bad_framing closes %v, want 1", n)
	}
}

// TestUDPListener receives both families from two UDP exporters, whose
// templates are kept apart.
func TestUDPListener(t *testing.T) {
	l, q, reg := startListener(t, Config{UDPAddrs: []string{"127.0.0.1:0", "[::1]:0"}})
	recs := sampleRecords()
	total := 0
	for i, a := range l.UDPAddrs() {
		c, err := net.Dial("udp", a.String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		// Same template IDs, different layouts per exporter.
		e4, e6 := mustEncoder(4, 300), mustEncoder(6, 300)
		if i == 1 {
			e4, e6 = mustEncoder(6, 300), mustEncoder(4, 300)
			_ = e4
		}
		for j := range recs {
			e := e4
			if flow.Version(recs[j].SrcAddr) != e.IPVersion() {
				e = e6
			}
			if e.IPVersion() != flow.Version(recs[j].SrcAddr) {
				continue
			}
			if _, err := c.Write(encoderMessage(e, 1, uint32(j), true, &recs[j])); err != nil {
				t.Fatal(err)
			}
			total++
		}
	}
	got := collect(t, q, total)
	if len(got) != total {
		t.Errorf("got %d records, want %d", len(got), total)
	}
	mfs, _ := reg.Gather()
	found := false
	for _, mf := range mfs {
		found = found || mf.GetName() == "dualflow_ipfix_udp_kernel_drops_total"
	}
	if !found {
		t.Error("kernel drop metric missing")
	}
}

// awaitClosed waits until the server closes c (a read returns an error).
func awaitClosed(t *testing.T, c net.Conn, within time.Duration) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(within))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestIdleSocketsDoNotLockExportersOut: sockets opened and left idle
// cannot take every session: one address gets MaxSessionsPerSource, idle
// sessions (no records) give their place to a new connection once all are
// taken and they are evictIdle old, idle
// sessions end after IdleTimeout, and a header that promises a message
// that never comes holds the session for MessageTimeout only. A
// well-behaved exporter delivers through all of it.
func TestIdleSocketsDoNotLockExportersOut(t *testing.T) {
	defer func(d time.Duration) { evictIdle = d }(evictIdle)
	// Long enough that the six sockets of one address are all younger
	// (the fifth and sixth are then refused rather than taking the place
	// of the first), on a loaded machine too.
	evictIdle = 2 * time.Second
	l, q, reg := startListener(t, Config{TCPAddrs: []string{"[::]:0"}, MaxSessions: 8, MaxSessionsPerSource: 4,
		IdleTimeout: time.Hour, MessageTimeout: 500 * time.Millisecond})
	port := l.TCPAddrs()[0].(*net.TCPAddr).Port
	dial := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}}
		c, err := d.Dial("tcp", net.JoinHostPort(src, fmt.Sprint(port)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	// An attacker on 127.0.0.2 opens 6 idle sockets: 4 are kept.
	var idle []net.Conn
	for range 6 {
		idle = append(idle, dial("127.0.0.2"))
	}
	for _, c := range idle[4:] {
		if !awaitClosed(t, c, 10*time.Second) {
			t.Error("a fifth session from one address was kept")
		}
	}
	// A slow message: a header promising 65,535 bytes, then 10 bytes.
	slow := dial("::1")
	slow.Write(cat(be16(fipfix.Version), be16(65535), make([]byte, 8)))
	if !awaitClosed(t, slow, 20*time.Second) {
		t.Error("a message that never completes held its session")
	}
	if n := testutil.ToFloat64(closedCounter(t, reg, "tcp", "slow_message")); n != 1 {
		t.Errorf("slow_message closes %v, want 1", n)
	}
	// Another attacker on 127.0.0.3 fills the listener (8 sessions).
	for range 4 {
		idle = append(idle, dial("127.0.0.3"))
	}
	// All 8 taken by idle sockets: the exporter's connection takes the
	// place of one evictIdle old.
	time.Sleep(evictIdle) // the age that makes a socket evictable, not a wait for the code under test
	good := dial("127.0.0.1")
	r := sampleRecords()[2]
	e := mustEncoder(6, 256)
	if _, err := good.Write(encoderMessage(e, 1, 0, true, &r)); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, q, 1); got[0].SrcAddr != r.SrcAddr {
		t.Errorf("record %+v", got[0])
	}
	// The evicted session's goroutine counts the eviction when it sees the
	// close, which may be after the exporter's record is through.
	evicted := func() float64 { return testutil.ToFloat64(closedCounter(t, reg, "tcp", "evicted")) }
	eventually(t, "the eviction counted", func() bool { return evicted() >= 1 })
	if n := evicted(); n != 1 {
		t.Errorf("evicted %v, want 1", n)
	}
	if n := testutil.ToFloat64(closedCounter(t, reg, "tcp", "source_limit")); n != 2 {
		t.Errorf("source_limit refusals %v, want 2", n)
	}
}

// TestIdleTimeout: a session that sends nothing for IdleTimeout ends.
func TestIdleTimeout(t *testing.T) {
	l, _, reg := startListener(t, Config{TCPAddrs: []string{"127.0.0.1:0"}, IdleTimeout: 300 * time.Millisecond})
	c, err := net.Dial("tcp", l.TCPAddrs()[0].String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if !awaitClosed(t, c, 20*time.Second) {
		t.Fatal("idle session kept")
	}
	if n := testutil.ToFloat64(closedCounter(t, reg, "tcp", "idle")); n != 1 {
		t.Errorf("idle closes %v, want 1", n)
	}
}

// TestTemplateBudget: the template memory of all sessions together is
// bounded: past the budget a session's templates are refused (its data
// sets then unknown) and counted; memory comes back when a session ends.
// Sessions come from both families.
func TestTemplateBudget(t *testing.T) {
	r4, r6 := sampleRecords()[0], sampleRecords()[2]
	// What one session's templates (one IPv4 and one IPv6 encoder) take.
	probe := NewSession(netip.MustParseAddrPort("[fd00:10::1]:1"), TCP, Limits{Budget: NewTemplateBudget(1 << 30)})
	d := NewDecoder()
	e4, e6 := mustEncoder(4, 256), mustEncoder(6, 257)
	d.Decode(probe, encoderMessage(e4, 1, 0, true), time.Now(), nil)
	d.Decode(probe, encoderMessage(e6, 1, 1, true), time.Now(), nil)
	per := probe.lim.Budget.Used()
	probe.Close()
	if per == 0 || probe.lim.Budget.Used() != 0 {
		t.Fatalf("one session holds %d bytes; after Close %d", per, probe.lim.Budget.Used())
	}

	l, q, _ := startListener(t, Config{TCPAddrs: []string{"[::]:0"}, MaxTemplateBytesTotal: 2*per + per/2})
	port := l.TCPAddrs()[0].(*net.TCPAddr).Port
	budget := l.cfg.Limits.Budget
	session := func(host string) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", net.JoinHostPort(host, fmt.Sprint(port)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		e4, e6 := mustEncoder(4, 256), mustEncoder(6, 257)
		c.Write(encoderMessage(e4, 1, 0, true, &r4))
		c.Write(encoderMessage(e6, 1, 1, true, &r6))
		return c
	}
	a, _ := session("127.0.0.1"), session("::1")
	collect(t, q, 4)
	if used := budget.Used(); used != 2*per {
		t.Fatalf("two sessions hold %d bytes, want %d", used, 2*per)
	}
	session("127.0.0.1") // a third session: over the budget, its records unknown
	deadline := time.Now().Add(10 * time.Second)
	for testutil.ToFloat64(l.m.templates.WithLabelValues("over_budget")) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no template refused over the budget")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if used := budget.Used(); used > l.cfg.MaxTemplateBytesTotal {
		t.Errorf("budget %d exceeded: %d bytes held", l.cfg.MaxTemplateBytesTotal, used)
	}
	// A session ends: its templates' memory comes back, a new one fits.
	a.Close()
	for budget.Used() > per+per/2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d bytes held after a session ended", budget.Used())
		}
		time.Sleep(10 * time.Millisecond)
	}
	session("::1")
	if got := collect(t, q, 2); got[0].SrcAddr != r4.SrcAddr && got[0].SrcAddr != r6.SrcAddr {
		t.Errorf("records after the budget freed: %+v", got[0])
	}
}

// TestIdleSessionsHoldLittleMemory: a session waiting for its exporter
// holds no batch and a small read buffer. 1,500 sessions once took the
// collector past 2 GB: each held a pooled batch (2,048 records, 1.5 MB)
// and a 256 KiB buffer, whatever it sent.
func TestIdleSessionsHoldLittleMemory(t *testing.T) {
	const sessions = 300
	reg := prometheus.NewRegistry()
	pm := pipeline.NewMetrics(reg)
	q := pipeline.NewQueue("decoded", 4*sessions, pm)
	pool := pipeline.NewPool(2*DefaultBatchRecords, 64)
	// The pool keeps a bounded free list whatever the sessions do: fill it
	// before the baseline.
	var warm []*pipeline.Batch
	for range 128 {
		warm = append(warm, pool.Get())
	}
	for _, b := range warm {
		b.Release()
	}
	l, err := New(Config{TCPAddrs: []string{"127.0.0.1:0"}, MaxSessions: 2 * sessions, MaxSessionsPerSource: 2 * sessions, MaxSessionsPerPrefix: 2 * sessions},
		q, pool, pm, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	heap := func() uint64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	before := heap()
	r := sampleRecords()[0]
	e := mustEncoder(4, 256)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range sessions {
		c, err := net.Dial("tcp", l.TCPAddrs()[0].String())
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
		if _, err := c.Write(encoderMessage(e, uint32(i+1), 0, true, &r)); err != nil {
			t.Fatal(err)
		}
	}
	collect(t, q, sessions) // every session decoded its message, then waits
	per := (int64(heap()) - int64(before)) / sessions
	t.Logf("%d idle sessions: %d bytes of heap each", sessions, per)
	if per > 256<<10 {
		t.Errorf("an idle session holds %d bytes of heap, want under 256 KiB", per)
	}
}

// TestNetFlowOverTCP: NetFlow has no length field, so a TCP or TLS stream
// of it cannot be framed: the session is closed (bad_framing), the message
// counted as reason version (as for a datagram of an unknown version) and
// the log says NetFlow over TCP, once a minute per source.
func TestNetFlowOverTCP(t *testing.T) {
	var logs logtest.Buffer
	l, _, reg := startListenerLog(t, Config{TCPAddrs: []string{"127.0.0.1:0", "[::1]:0"}}, logs.Logger())
	msgs := map[string][]byte{
		"v9": v9Message(1, 0, 100_000, v9Set(0, v9Template(256, v9Src4, v9Dst4)), v9Set(256, cat(lab4a, lab4b))),
		"v5": v5Packet(100_000, 1000, 2000),
	}
	for _, a := range l.TCPAddrs() {
		for _, v := range []string{"v9", "v5", "v9"} {
			c, err := net.Dial("tcp", a.String())
			if err != nil {
				t.Fatal(err)
			}
			c.Write(msgs[v])
			if !awaitClosed(t, c, 20*time.Second) {
				t.Fatalf("%s: NetFlow %s session not closed", a, v)
			}
			c.Close()
		}
	}
	eventually(t, "every session counted", func() bool {
		return testutil.ToFloat64(closedCounter(t, reg, "tcp", "bad_framing")) == 6
	})
	eventually(t, "every message counted", func() bool { return testutil.ToFloat64(l.m.dropped[ReasonVersion]) == 6 })
	if n := testutil.ToFloat64(l.m.dropped[ReasonLength]); n != 0 {
		t.Errorf("%v messages dropped for their length, want 0", n)
	}
	lines := logs.Lines("NetFlow over TCP")
	if len(lines) != 2 || !strings.Contains(strings.Join(lines, "\n"), "127.0.0.1") || !strings.Contains(strings.Join(lines, "\n"), "::1") {
		t.Errorf("log lines %q, want one per source", lines)
	}
}
