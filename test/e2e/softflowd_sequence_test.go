package e2e

import (
	"context"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/ipfix"
	"github.com/dualflow/dualflow/collector/pipeline"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/nsrun"
	"github.com/dualflow/dualflow/test/support/logtest"
)

// longExchanges is the number of UDP exchanges per family of
// TestSoftflowdLongIPFIX: each is two flows (request, reply), so softflowd
// spreads them over more than 11 messages of different record counts.
const longExchanges = 200

// TestSoftflowdLongIPFIX runs softflowd's IPFIX export of many flows, in
// many messages, into the collector in each mode. softflowd's sequence
// number counts the flow records sent including those of the message it
// heads (seq_n = seq_{n-1} + records_n), not those before it as RFC 7011
// says; the collector must learn it and count no loss. Every record nfdump
// reads must be one row (exportRun.check). With -update-thirdparty the
// datagrams are written to
// collector/ipfix/testdata/thirdparty/softflowd-ipfix-long-<mode>.pcap,
// which collector/ipfix's TestSoftflowdSequence reads.
func TestSoftflowdLongIPFIX(t *testing.T) {
	requirePrereqs(t)
	requireCHDB(t)
	requireThirdParty(t)
	t.Parallel() // its own namespaces and in-process collector (its own database)
	c := startUDPCollector(t)
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			record(t, mode)
			p := startPair(t, mode)
			pcap := filepath.Join(p.dir, "traffic.pcap")
			capt := startCapture(t, p.a, "veth0", pcap)
			for _, f := range p.mode.Families() {
				src, dst := tpV4A, tpV4B
				if f == corev1.IPv6Protocol {
					src, dst = tpV6A, tpV6B
				}
				manyUDPExchanges(t, p, src, dst, longExchanges)
			}
			capt.stopAfterMarker(t, p.a, "veth0")
			truth := pcapFlows(t, pcap)

			lostBefore := metricSum(t, c.Registry(), "dualflow_ipfix_sequence_lost_records_total", "transport", "udp")
			stampedBefore := metricSum(t, c.Registry(), "dualflow_ipfix_records_stamped_total")
			r := newExportRun(t, p, c, "softflowd", "ipfix-long")
			ctl := filepath.Join(p.dir, "softflowd-long.ctl")
			cmd := softflowdCmd(pcap, r.tee.addr(), "10", ctl, filepath.Join(p.dir, "softflowd-long.pid"))
			out := new(strings.Builder)
			cmd.Stdout, cmd.Stderr = out, out
			done := p.start(t, p.a, cmd)
			if err := waitExit(done, ctl, 60*time.Second); err != nil {
				t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
			}
			r.check(t, p, c, truth)
			if n := len(r.tee.datagrams()); n < 11 {
				t.Errorf("softflowd sent %d messages, want at least 11 for the sequence numbers to mean something", n)
			}
			// The rows are in (check waited for them): their messages were
			// decoded and their sequence numbers checked.
			if lost := metricSum(t, c.Registry(), "dualflow_ipfix_sequence_lost_records_total", "transport", "udp") - lostBefore; lost != 0 {
				t.Errorf("sequence numbers show %v records lost; softflowd sent every message to a loopback tee", lost)
			}
			if n := metricSum(t, c.Registry(), "dualflow_ipfix_records_stamped_total") - stampedBefore; n != 0 {
				t.Errorf("%v records stamped; softflowd's have their times", n)
			}
		})
	}
}

// manyUDPExchanges sends n request/reply UDP exchanges from src to dst,
// each from a new socket: 2n flows.
func manyUDPExchanges(t *testing.T, p *tpPair, src, dst netip.Addr, n int) {
	t.Helper()
	var srv *net.UDPConn
	if err := nsrun.Do(nsrun.Path(p.b), func() error {
		var err error
		srv, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, tpUDPPort)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			srv.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	buf := make([]byte, 2048)
	for i := range n {
		var cl *net.UDPConn
		if err := nsrun.Do(nsrun.Path(p.a), func() error {
			var err error
			cl, err = net.DialUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, tpUDPPort)))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		// Sizes vary so that the records differ beyond their ports.
		if _, err := cl.Write(make([]byte, 50+i%100)); err != nil {
			t.Fatal(err)
		}
		cl.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := cl.Read(buf); err != nil {
			t.Fatalf("udp echo %d: %v", i, err)
		}
		cl.Close()
	}
}

// softflowdCmd is softflowd reading pcap and exporting NetFlow version v
// ("10": IPFIX) to dest, IPv6 flows included but in v5, with its control
// socket and pid file at ctl and pid.
func softflowdCmd(pcap string, dest netip.AddrPort, v, ctl, pid string) *exec.Cmd {
	args := []string{"-d", "-r", pcap, "-n", dest.String(), "-v", v, "-c", ctl, "-p", pid}
	if v != "5" {
		args = append(args, "-6")
	}
	return exec.Command("softflowd", args...)
}

// metricSum is the sum of the counters name of g whose labels include
// the given name/value pairs.
func metricSum(t *testing.T, g prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			match := true
			for i := 0; i+1 < len(labels); i += 2 {
				match = match && have[labels[i]] == labels[i+1]
			}
			if match {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// TestSoftflowdNetFlowOverTCP: softflowd sends NetFlow v9 over TCP when
// asked (-P tcp). NetFlow has no length field, so the stream cannot be
// framed: the collector's listener, in the exporter's namespace on the
// mode's loopback, counts the message as reason version, closes the
// session (bad_framing) and logs "NetFlow over TCP".
func TestSoftflowdNetFlowOverTCP(t *testing.T) {
	requirePrereqs(t)
	requireThirdParty(t)
	t.Parallel() // its own namespaces and listener
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			record(t, mode)
			p := startPair(t, mode)
			pcap := filepath.Join(p.dir, "traffic.pcap")
			capt := startCapture(t, p.a, "veth0", pcap)
			p.traffic(t)
			capt.stopAfterMarker(t, p.a, "veth0")

			var logs logtest.Buffer
			reg := prometheus.NewRegistry()
			pm := pipeline.NewMetrics(reg)
			var l *ipfix.Listener
			if err := nsrun.Do(nsrun.Path(p.a), func() error {
				var err error
				l, err = ipfix.New(ipfix.Config{TCPAddrs: []string{netip.AddrPortFrom(p.loopback(), 0).String()}},
					pipeline.NewQueue("decoded", 16, pm), pipeline.NewPool(64, 64), pm, reg, logs.Logger())
				return err
			}); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			stopped := make(chan struct{})
			go func() { l.Run(ctx); close(stopped) }()
			t.Cleanup(func() { cancel(); <-stopped })

			dest := l.TCPAddrs()[0].(*net.TCPAddr).AddrPort()
			ctl := filepath.Join(p.dir, "softflowd-tcp.ctl")
			cmd := softflowdCmd(pcap, dest, "9", ctl, filepath.Join(p.dir, "softflowd-tcp.pid"))
			cmd.Args = append(cmd.Args, "-P", "tcp")
			out := new(strings.Builder)
			cmd.Stdout, cmd.Stderr = out, out
			done := p.start(t, p.a, cmd)
			// softflowd may exit with an error once its connection is
			// closed: the counters tell what the collector did.
			go waitExit(done, ctl, 60*time.Second)
			deadline := time.Now().Add(60 * time.Second)
			for metricSum(t, reg, "dualflow_ipfix_sessions_closed_total", "transport", "tcp", "reason", "bad_framing") < 1 {
				if time.Now().After(deadline) {
					t.Fatalf("no NetFlow-over-TCP session closed after 60 s; softflowd: %s\nlog: %s", out, logs.String())
				}
				time.Sleep(100 * time.Millisecond)
			}
			if n := metricSum(t, reg, "dualflow_ipfix_messages_dropped_total", "reason", "version"); n < 1 {
				t.Errorf("messages dropped for their version: %v, want at least 1", n)
			}
			if n := metricSum(t, reg, "dualflow_ipfix_messages_dropped_total", "reason", "length"); n != 0 {
				t.Errorf("messages dropped for their length: %v, want 0", n)
			}
			if lines := logs.Lines("NetFlow over TCP"); len(lines) != 1 || !strings.Contains(lines[0], "version=9") {
				t.Errorf("log lines %q, want one naming NetFlow v9 over TCP", lines)
			}
		})
	}
}
