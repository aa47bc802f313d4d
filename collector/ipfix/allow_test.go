package ipfix

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/collector/pipeline"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/internal/ratelog"
	"github.com/dualflow/dualflow/test/support/logtest"
)

// eventually waits up to 20 s for cond, polling.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAllowListSet(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    string
		allow   []string
		deny    []string
		wantErr bool
	}{
		{in: "", want: "", allow: []string{"198.18.0.1", "fd00::1"}},
		{in: "198.18.0.0/16", want: "198.18.0.0/16", allow: []string{"198.18.3.4", "::ffff:198.18.3.4"}, deny: []string{"198.19.0.1", "fd00::1", "::1"}},
		{in: "fd00:10::/32, 198.18.1.7", want: "fd00:10::/32,198.18.1.7/32", allow: []string{"fd00:10:3::1", "198.18.1.7", "fd00:10::9"}, deny: []string{"198.18.1.8", "fd00:11::1"}},
		{in: "fd00:10::1", want: "fd00:10::1/128", allow: []string{"fd00:10::1"}, deny: []string{"fd00:10::2", "0.0.0.1"}},
		{in: "::ffff:198.18.0.0/112", want: "198.18.0.0/16", allow: []string{"198.18.9.9", "::ffff:198.18.9.9"}, deny: []string{"198.19.0.1"}},
		{in: "198.18.1.1/16,198.18.0.0/16", want: "198.18.0.0/16"},
		{in: "fe80::/10", want: "fe80::/10", allow: []string{"fe80::1%eth0"}},
		{in: "any", want: "0.0.0.0/0,::/0", allow: []string{"198.18.0.1", "fd00:10::1", "::ffff:198.18.0.1"}},
		{in: "198.18.0.0/16, any,fd00:10::/32", want: "198.18.0.0/16,0.0.0.0/0,::/0,fd00:10::/32", allow: []string{"198.19.0.1", "fd00:11::1"}},
		{in: "not-an-address", wantErr: true},
		{in: "198.18.0.0/33", wantErr: true},
		{in: "fe80::1%eth0", wantErr: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			var a AllowList
			err := a.Set(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Set(%q): %v", tc.in, err)
			}
			if err != nil {
				return
			}
			if got := a.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
			for _, s := range tc.allow {
				if !a.Allows(netip.MustParseAddr(s)) {
					t.Errorf("%s refused", s)
				}
			}
			for _, s := range tc.deny {
				if a.Allows(netip.MustParseAddr(s)) {
					t.Errorf("%s allowed", s)
				}
			}
		})
	}
	// Prefixes set in code are unmapped too.
	l := AllowList{netip.MustParsePrefix("::ffff:127.0.0.1/128")}.normalize()
	if !l.Allows(netip.MustParseAddr("127.0.0.1")) || l[0] != netip.MustParsePrefix("127.0.0.1/32") {
		t.Errorf("normalize: %v", l)
	}
}

// dialFrom connects to port on host from host (loopback addresses).
func dialFrom(t *testing.T, network, host string, port int) net.Conn {
	t.Helper()
	var local net.Addr = &net.TCPAddr{IP: net.ParseIP(host)}
	if network == "udp" {
		local = &net.UDPAddr{IP: net.ParseIP(host)}
	}
	d := net.Dialer{LocalAddr: local}
	c, err := d.Dial(network, net.JoinHostPort(host, fmt.Sprint(port)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// TestAllowedSources: on dual-stack listeners (an IPv4 exporter arrives as
// ::ffff:127.0.0.1), only the allowed sources are decoded; the others are
// dropped before any byte is read, counted and logged once per source.
func TestAllowedSources(t *testing.T) {
	r4, r6 := sampleRecords()[0], sampleRecords()[2]
	for _, tc := range []struct {
		name           string
		allowed        string
		allow, refused string // source addresses
		r              flow.Record
	}{
		{"ipv4", "127.0.0.0/30", "127.0.0.1", "::1", r4},
		{"ipv6", "::1", "::1", "127.0.0.1", r6},
	} {
		for _, tr := range []string{"tcp", "udp"} {
			t.Run(tc.name+"/"+tr, func(t *testing.T) {
				var logs logtest.Buffer
				var allowed AllowList
				if err := allowed.Set(tc.allowed); err != nil {
					t.Fatal(err)
				}
				cfg := Config{AllowedSources: allowed}
				if tr == "tcp" {
					cfg.TCPAddrs = []string{"[::]:0"}
				} else {
					cfg.UDPAddrs = []string{"[::]:0"}
				}
				l, q, reg := startListenerLog(t, cfg, logs.Logger())
				port := append(l.TCPAddrs(), l.UDPAddrs()...)[0].(interface{ AddrPort() netip.AddrPort }).AddrPort().Port()
				e := mustEncoder(flow.Version(tc.r.SrcAddr), 256)
				msg := encoderMessage(e, 1, 0, true, &tc.r)
				// The refused source twice: the second line is held back.
				for range 2 {
					bad := dialFrom(t, tr, tc.refused, int(port))
					bad.Write(msg)
					if tr == "tcp" && !awaitClosed(t, bad, 20*time.Second) {
						t.Fatal("connection from a refused source kept")
					}
				}
				dropped := l.m.dropped[ReasonSourceNotAllowed]
				eventually(t, "two refusals counted", func() bool { return testutil.ToFloat64(dropped) == 2 })
				good := dialFrom(t, tr, tc.allow, int(port))
				if _, err := good.Write(msg); err != nil {
					t.Fatal(err)
				}
				got := collect(t, q, 1)
				if got[0].SrcAddr != tc.r.SrcAddr || got[0].ExporterAddr != netip.MustParseAddr(tc.allow) {
					t.Errorf("record %+v", got[0])
				}
				if tr == "tcp" {
					if n := testutil.ToFloat64(closedCounter(t, reg, "tcp", "source_not_allowed")); n != 2 {
						t.Errorf("source_not_allowed closes %v, want 2", n)
					}
				}
				eventually(t, "the record counted", func() bool { return testutil.ToFloat64(l.m.records.WithLabelValues(tr)) > 0 })
				if n := testutil.ToFloat64(l.m.records.WithLabelValues(tr)); n != 1 {
					t.Errorf("records decoded: %v, want 1 (the allowed source's)", n)
				}
				if lines := logs.Lines("allowed-sources"); len(lines) != 1 {
					t.Errorf("%d log lines about refused sources, want 1: %q", len(lines), lines)
				}
			})
		}
	}
}

// TestWarnOpen: a listener any host can feed is logged at start; loopback,
// an allowlist or mutual TLS keep quiet.
func TestWarnOpen(t *testing.T) {
	dir := writeCerts(t)
	p := func(n string) string { return dir + "/" + n }
	for _, tc := range []struct {
		name string
		cfg  Config
		warn bool
	}{
		{"any address", Config{TCPAddrs: []string{":0"}}, true},
		{"any ipv6 address udp", Config{UDPAddrs: []string{"[::]:0"}}, true},
		{"loopback", Config{TCPAddrs: []string{"127.0.0.1:0"}, UDPAddrs: []string{"[::1]:0"}}, false},
		{"allowlist", Config{TCPAddrs: []string{":0"}, AllowedSources: AllowList{netip.MustParsePrefix("fd00:10::/32")}}, false},
		{"tls without client certificates", Config{TLSAddrs: []string{":0"}, TLSCertFile: p("server.pem"), TLSKeyFile: p("server-key.pem")}, true},
		{"mutual tls", Config{TLSAddrs: []string{":0"}, TLSCertFile: p("server.pem"), TLSKeyFile: p("server-key.pem"), TLSClientCAFile: p("ca.pem")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logtest.Buffer
			l, err := New(tc.cfg, pipeline.NewQueue("decoded", 1, nil), pipeline.NewPool(16, 64), nil, nil, logs.Logger())
			if err != nil {
				t.Fatal(err)
			}
			l.Close()
			if got := len(logs.Lines("accept flows from any host")) == 1; got != tc.warn {
				t.Errorf("warned %v, want %v", got, tc.warn)
			}
		})
	}
}

// fakeUDP returns its datagrams in one read, then fails with
// net.ErrClosed once ctx is done.
type fakeUDP struct {
	ctx  context.Context
	dgs  []datagram
	done bool
}

func (f *fakeUDP) read(dgs []datagram) (int, uint32, bool, error) {
	if f.done {
		<-f.ctx.Done()
		return 0, 0, false, net.ErrClosed
	}
	f.done = true
	for i, d := range f.dgs {
		n := copy(dgs[i].buf, d.buf)
		dgs[i].n, dgs[i].from = n, d.from
	}
	return len(f.dgs), 0, false, nil
}

// TestQueueFullCountsMessages: when the pipeline queue is full, UDP drops
// the batch and counts each message whose records it held (and each
// record), not one per batch. The datagrams come in one read from two
// exporters of both families, so they share a batch.
func TestQueueFullCountsMessages(t *testing.T) {
	reg := prometheus.NewRegistry()
	pm := pipeline.NewMetrics(reg)
	q := pipeline.NewQueue("decoded", 1, pm)
	pool := pipeline.NewPool(16, 64)
	if !q.TryPut(pool.Get()) { // full: nobody reads it
		t.Fatal("queue refused its first batch")
	}
	l := &Listener{cfg: Config{}, out: q, pool: pool, m: newMetrics(reg), pm: pm, log: slog.Default()}
	l.cfg.SetDefaults()
	l.warns = ratelog.New(l.log, warnEvery, warnSources)
	recs := sampleRecords()
	e4, e6 := mustEncoder(4, 256), mustEncoder(6, 257)
	from4, from6 := netip.MustParseAddrPort("198.18.0.7:4739"), netip.MustParseAddrPort("[fd00:10::7]:4739")
	dg := func(from netip.AddrPort, b []byte) datagram { return datagram{buf: b, from: from} }
	in := []datagram{
		dg(from4, encoderMessage(e4, 1, 0, true)),            // templates only: nothing lost
		dg(from4, encoderMessage(e4, 1, 0, false, &recs[0])), // 1 record
		dg(from4, encoderMessage(e4, 1, 1, false, &recs[1], &recs[5])),
		dg(from6, encoderMessage(e6, 1, 0, true, &recs[2], &recs[3], &recs[4])),
		dg(from6, []byte{0, 10, 0, 3}), // malformed: dropped for its own reason
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.readUDP(ctx, &fakeUDP{ctx: ctx, dgs: in}, nil); close(done) }()
	dropped := l.m.dropped[ReasonQueueFull]
	eventually(t, "the drop counted", func() bool { return testutil.ToFloat64(dropped) > 0 })
	cancel()
	<-done
	if n := testutil.ToFloat64(dropped); n != 3 {
		t.Errorf("messages dropped queue_full = %v, want 3", n)
	}
	if n := testutil.ToFloat64(pm.Dropped.WithLabelValues(stageDecode, "queue_full")); n != 6 {
		t.Errorf("records dropped queue_full = %v, want 6", n)
	}
	if n := testutil.ToFloat64(l.m.dropped[ReasonShort]); n != 1 {
		t.Errorf("short messages %v, want 1", n)
	}
}

// TestBadFramingLogRateLimited: sessions closed for a bad header are each
// counted, but one source gets one log line per interval.
func TestBadFramingLogRateLimited(t *testing.T) {
	var logs logtest.Buffer
	l, _, reg := startListenerLog(t, Config{TCPAddrs: []string{"127.0.0.1:0", "[::1]:0"}}, logs.Logger())
	const n = 5
	for _, a := range l.TCPAddrs() {
		for range n {
			c, err := net.Dial("tcp", a.String())
			if err != nil {
				t.Fatal(err)
			}
			c.Write([]byte{0, 10, 0, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
			if !awaitClosed(t, c, 20*time.Second) {
				t.Fatal("session with a bad header not closed")
			}
			c.Close()
		}
	}
	eventually(t, "every bad session counted", func() bool {
		return testutil.ToFloat64(closedCounter(t, reg, "tcp", "bad_framing")) == 2*n
	})
	lines := logs.Lines("bad message header")
	if len(lines) != 2 {
		t.Fatalf("%d log lines, want 1 per source: %q", len(lines), lines)
	}
	if !strings.Contains(strings.Join(lines, "\n"), "127.0.0.1") || !strings.Contains(strings.Join(lines, "\n"), "::1") {
		t.Errorf("lines %q: want one per family", lines)
	}
}

// TestMalformedLogRateLimited: malformed messages on a session that
// survives them are logged, once per interval per source.
func TestMalformedLogRateLimited(t *testing.T) {
	var logs logtest.Buffer
	l, q, _ := startListenerLog(t, Config{UDPAddrs: []string{"[::1]:0"}}, logs.Logger())
	c, err := net.Dial("udp", l.UDPAddrs()[0].String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	bad := message(1, 0, cat(be16(256), be16(2))) // a set shorter than its header
	for range 5 {
		c.Write(bad)
	}
	r := sampleRecords()[2]
	c.Write(encoderMessage(mustEncoder(6, 256), 1, 0, true, &r))
	collect(t, q, 1)
	eventually(t, "five drops counted", func() bool { return testutil.ToFloat64(l.m.dropped[ReasonSetLength]) == 5 })
	if lines := logs.Lines("ipfix message dropped"); len(lines) != 1 || !strings.Contains(lines[0], "set_length") {
		t.Errorf("log lines %q, want 1 naming the reason", lines)
	}
}

// TestAllowListPreferred: the sources that may take the reserved places:
// the list's prefixes but /0 ("any"), or loopback and the private networks
// without a list; "any" alone prefers every source (no reserve).
func TestAllowListPreferred(t *testing.T) {
	for _, tc := range []struct {
		in         string
		prefer     []string
		dontPrefer []string
	}{
		{"", []string{"127.0.0.1", "127.9.9.9", "::1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "fd00:10::1", "::ffff:10.0.0.1"},
			[]string{"198.18.0.1", "2001:db8::1", "100.64.0.1"}},
		{"198.18.0.0/24,fd00:10:1::/48,any", []string{"198.18.0.9", "::ffff:198.18.0.9", "fd00:10:1::9"}, []string{"198.18.1.1", "fd00:10:2::1", "127.0.0.1", "::1"}},
		{"198.18.0.0/24,fd00:10:1::/48", []string{"198.18.0.9", "fd00:10:1::9"}, nil},
		{"any", []string{"198.18.0.1", "fd00:10::1", "127.0.0.1"}, nil},
	} {
		t.Run(tc.in, func(t *testing.T) {
			var a AllowList
			if err := a.Set(tc.in); err != nil {
				t.Fatal(err)
			}
			p := a.preferred()
			for _, s := range tc.prefer {
				if !p.Allows(netip.MustParseAddr(s)) {
					t.Errorf("%s not preferred", s)
				}
			}
			for _, s := range tc.dontPrefer {
				if p.Allows(netip.MustParseAddr(s)) {
					t.Errorf("%s preferred", s)
				}
			}
		})
	}
}
