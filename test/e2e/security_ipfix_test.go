package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
	"github.com/dualflow/dualflow/lab/manifest"
)

// TestSecurityIPFIXSessions is the session attack of issue 33 against the
// collector binary, in three IP modes: 80 connections that send a bare
// 16-byte IPFIX header every 4 s (the issue: every 4–5 s) and come back
// when closed hold every TCP session, from loopback addresses in many /24s
// (IPv4), from ::1 (IPv6), or both (dual-stack). It is scaled to 64
// sessions (the default is 4,096). An exporter busy since before the
// attack must keep its session, and a new exporter must get in while the
// attack goes on (before issue 33 it was refused every time); all their
// records are stored, and the evictions are counted.
func TestSecurityIPFIXSessions(t *testing.T) {
	t.Parallel() // each mode its own collector process, directory and ports
	bin := buildBinary(t)
	for _, mode := range []manifest.Mode{manifest.ModeIPv4, manifest.ModeIPv6, manifest.ModeDual} {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			record(t, mode)
			testIPFIXSessionAttack(t, bin, mode)
		})
	}
}

// attackPeriod is how often an attacking connection sends its header:
// more often than the collector's 10-s eviction age.
const attackPeriod = 4 * time.Second

func testIPFIXSessionAttack(t *testing.T, bin string, mode manifest.Mode) {
	const sessions, attackConns = 64, 80
	dir := t.TempDir()
	c := startBinaryCollector(t, bin, dir, mode, 1, "--clickhouse.flush-interval", "200ms",
		// ::1 alone may fill every session (IPv6 mode has one address).
		"--collector.ipfix.max-sessions", fmt.Sprint(sessions), "--collector.ipfix.max-sessions-per-source", fmt.Sprint(2*sessions))
	// c.ipfixAll: the IPv4 listener first in dual-stack.
	first, last := c.ipfixAll[0], c.ipfixAll[len(c.ipfixAll)-1]
	type source struct{ addr, target string }
	var attackers []source
	exporter := source{"::1", last}
	switch mode {
	case manifest.ModeIPv4:
		exporter = source{"127.0.0.1", first}
		for i := range 8 {
			attackers = append(attackers, source{fmt.Sprintf("127.%d.0.2", i+1), first})
		}
	case manifest.ModeIPv6:
		attackers = []source{{"::1", last}}
	case manifest.ModeDual:
		attackers = []source{{"127.1.0.2", first}, {"127.2.0.2", first}, {"::1", last}}
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	// The busy exporter: 10 records a second from before the attack on.
	const busyFirst = 2_000_000
	busy := dialIPFIX(t, exporter.addr, exporter.target)
	if _, err := busy.Write(ipfixMessage(crashRecords(mode, busyFirst, 10), 0, true)); err != nil {
		t.Fatal(err)
	}
	// Stored, so decoded: the session delivers. (The store, not /metrics,
	// whose address the collector logs after its listeners'.)
	waitFor(t, "the busy exporter's first records", time.Minute, func() bool {
		return c.query(t, dir, fmt.Sprintf("SELECT count() FROM dualflow.flows WHERE ct_mark BETWEEN %d AND %d", busyFirst, busyFirst+9)) == "10"
	})
	busySent := 10
	busyDone := make(chan error, 1)
	wg.Go(func() {
		defer close(busyDone)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second): // the exporter's pace
			}
			recs := crashRecords(mode, busyFirst+busySent, 10)
			if _, err := busy.Write(ipfixMessage(recs, uint32(busySent), false)); err != nil {
				busyDone <- err
				return
			}
			busySent += len(recs)
		}
	})

	for i := range attackConns {
		a := attackers[i%len(attackers)]
		wg.Go(func() { headerAttack(ctx, a.addr, a.target) })
	}
	tcp := `transport="tcp"`
	waitFor(t, "the attack to hold every session", time.Minute, func() bool {
		return c.metricWith(t, "dualflow_ipfix_sessions", tcp) == sessions
	})

	// A new exporter retries, as exporters do, until it is let in.
	const lateFirst, lateN = 3_000_000, 100
	start := time.Now()
	attempts := 0
	for {
		attempts++
		late := dialIPFIX(t, exporter.addr, exporter.target)
		recs := crashRecords(mode, lateFirst, lateN)
		if _, err := late.Write(ipfixMessage(recs, 0, true)); err == nil && kept(late) {
			break
		}
		late.Close()
		if time.Since(start) > time.Minute {
			t.Fatalf("a new exporter refused %d times in %v under the attack", attempts, time.Since(start).Round(time.Second))
		}
		time.Sleep(time.Second) // the exporter's retry pace, not a wait for a condition
	}
	t.Logf("%s: the new exporter got in after %d attempts, %v", mode, attempts, time.Since(start).Round(100*time.Millisecond))
	waitFor(t, "the new exporter's records", 2*time.Minute, func() bool {
		return c.query(t, dir, fmt.Sprintf("SELECT count() FROM dualflow.flows WHERE ct_mark BETWEEN %d AND %d", lateFirst, lateFirst+lateN-1)) == fmt.Sprint(lateN)
	})
	// The attack goes on, its connections taking one another's places,
	// several rounds past the new exporter's; the busy exporter's is
	// never taken.
	waitFor(t, "the attackers to evict each other", 2*time.Minute, func() bool {
		return c.metricWith(t, "dualflow_ipfix_sessions_closed_total", `reason="evicted"`) >= 3*(attackConns-sessions)
	})

	cancel()
	if err, ok := <-busyDone; ok {
		t.Fatalf("the busy exporter's session ended under the attack: %v", err)
	}
	waitFor(t, "the busy exporter's records", 2*time.Minute, func() bool {
		return c.query(t, dir, fmt.Sprintf("SELECT count() FROM dualflow.flows WHERE ct_mark BETWEEN %d AND %d", busyFirst, busyFirst+busySent-1)) == fmt.Sprint(busySent)
	})
	t.Logf("%s: %v connections refused, %v evicted", mode, c.metricWith(t, "dualflow_ipfix_sessions_closed_total", `reason="limit"`),
		c.metricWith(t, "dualflow_ipfix_sessions_closed_total", `reason="evicted"`))
}

// dialIPFIX connects to target from src; the connection is closed when
// the test ends.
func dialIPFIX(t *testing.T, src, target string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
	conn, err := d.Dial("tcp", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// kept reports whether the collector keeps conn open: it never writes, so
// a read ends at the deadline when the session is kept, at once when it is
// closed.
func kept(conn net.Conn) bool {
	conn.SetReadDeadline(time.Now().Add(2 * time.Second))
	defer conn.SetReadDeadline(time.Time{})
	_, err := conn.Read(make([]byte, 1))
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// headerAttack holds connections from src to target that send a bare
// IPFIX header every attackPeriod, reconnecting when closed, until ctx is
// done.
func headerAttack(ctx context.Context, src, target string) {
	for ctx.Err() == nil {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 10 * time.Second}
		if conn, err := d.DialContext(ctx, "tcp", target); err == nil {
			stop := context.AfterFunc(ctx, func() { conn.Close() })
			for seq := uint32(0); ; seq++ {
				if _, err := conn.Write(fipfix.AppendMessageHeader(nil, fipfix.MessageHeaderLen, time.Now(), seq, 1)); err != nil {
					break
				}
				conn.SetReadDeadline(time.Now().Add(attackPeriod))
				var ne net.Error
				if _, err := conn.Read(make([]byte, 1)); !errors.As(err, &ne) || !ne.Timeout() {
					break // closed: by the collector, or at the end
				}
			}
			stop()
			conn.Close()
		}
		select {
		case <-ctx.Done():
		case <-time.After(attackPeriod): // the attacker's pace
		}
	}
}

// ipfixMessage is one IPFIX message (observation domain 1) holding recs,
// a data set per family, after the templates of both families when
// templates is set.
func ipfixMessage(recs []flow.Record, seq uint32, templates bool) []byte {
	enc := map[uint8]*fipfix.Encoder{}
	enc[4], _ = fipfix.NewEncoder(4, 256)
	enc[6], _ = fipfix.NewEncoder(6, 257)
	var body []byte
	if templates {
		body = enc[6].AppendTemplateSet(enc[4].AppendTemplateSet(nil))
	}
	for _, v := range []uint8{4, 6} {
		start := len(body)
		body = append(body, 0, 0, 0, 0)
		n := 0
		for i := range recs {
			if recs[i].IPVersion == v {
				body = enc[v].AppendRecord(body, &recs[i])
				n++
			}
		}
		if n == 0 {
			body = body[:start]
			continue
		}
		fipfix.PutSetHeader(body[start:], enc[v].TemplateID())
	}
	return append(fipfix.AppendMessageHeader(nil, fipfix.MessageHeaderLen+len(body), time.Now(), seq, 1), body...)
}
