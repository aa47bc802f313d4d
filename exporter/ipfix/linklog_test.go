package ipfix

import (
	"io"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/test/support/logtest"
)

// attr returns the integer value of key=N in line, or -1.
func attr(line, key string) int {
	m := regexp.MustCompile(`\b` + key + `=(\d+)`).FindStringSubmatch(line)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// sink is a collector that reads and discards everything, until stop.
func sink(t *testing.T, addr string) (stop func()) {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	closed := false
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				c.Close()
			}
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { io.Copy(io.Discard, c) })
		}
	})
	var once sync.Once
	stop = func() {
		once.Do(func() {
			ln.Close()
			mu.Lock()
			closed = true
			for _, c := range conns {
				c.Close()
			}
			mu.Unlock()
			wg.Wait()
		})
	}
	t.Cleanup(stop)
	return stop
}

// outageConfig is a fast-retrying exporter to addr logging to logs.
func outageConfig(addr string, logs *logtest.Buffer) Config {
	return Config{Address: addr, BufferBytes: 64 << 10, FlushInterval: 20 * time.Millisecond,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, Logger: logs.Logger()}
}

// TestOutageLogs: while the collector is unreachable the exporter says so
// once (not once per attempt), and once more when it is back, with the
// failed attempts and the records the full buffer dropped meanwhile.
func TestOutageLogs(t *testing.T) {
	for _, listen := range []string{"127.0.0.1:0", "[::1]:0"} {
		t.Run(listen, func(t *testing.T) {
			var logs logtest.Buffer
			addr := freePort(t, listen)
			e := newExporter(t, outageConfig(addr, &logs))
			e.link.settle = 10 * time.Millisecond
			start(t, e)
			for i := 0; i < 5000; i += 100 {
				e.Export(records(6, 100, i))
			}
			e.Flush()
			waitFor(t, 20*time.Second, "5 failed attempts", func() bool { return e.Stats().DialFailures >= 5 })
			warns := logs.Lines("level=WARN")
			if len(warns) != 1 || !strings.Contains(warns[0], "collector unreachable") || !strings.Contains(warns[0], addr) {
				t.Fatalf("warnings while down: %q, want 1", warns)
			}
			if e.Stats().DroppedBufferFull == 0 {
				t.Fatal("nothing dropped: the test exports too little")
			}
			sink(t, addr)
			waitFor(t, 20*time.Second, "the line saying the collector is back", func() bool {
				return len(logs.Lines("collector is back")) > 0
			})
			back := logs.Lines("collector is back")
			st := e.Stats()
			if len(back) != 1 || attr(back[0], "failed_attempts") < 5 || attr(back[0], "records_dropped") != int(st.DroppedBufferFull) {
				t.Errorf("back: %q; stats %+v", back, st)
			}
			if n := len(logs.Lines("level=WARN")); n != 1 {
				t.Errorf("%d warnings, want 1", n)
			}
		})
	}
}

// TestOutageSummary: a long outage is summarized every interval; a lost
// connection starts a new outage.
func TestOutageSummary(t *testing.T) {
	var logs logtest.Buffer
	addr := freePort(t, "[::1]:0")
	e := newExporter(t, outageConfig(addr, &logs))
	e.link.settle, e.link.every = 10*time.Millisecond, 30*time.Millisecond
	start(t, e)
	waitFor(t, 20*time.Second, "a summary with dropped records", func() bool {
		e.Export(records(4, 100, 0))
		e.Flush()
		for _, l := range logs.Lines("still unreachable") {
			if attr(l, "records_dropped") > 0 && attr(l, "failed_attempts") > 1 {
				return true
			}
		}
		return false
	})
	stopSink := sink(t, addr)
	waitFor(t, 20*time.Second, "the line saying the collector is back", func() bool {
		return len(logs.Lines("collector is back")) > 0
	})
	before := len(logs.Lines("collector unreachable"))
	stopSink()
	waitFor(t, 20*time.Second, "a warning about the lost connection", func() bool {
		for _, l := range logs.Lines("collector unreachable")[before:] {
			if attr(l, "connections_lost") == 1 {
				return true
			}
		}
		return false
	})
}

// TestRefusingCollectorIsNotBack: a collector that accepts and closes at
// once (a source it does not allow, a refused certificate), or a UDP port
// nobody listens on, is still an outage: connections that do not last are
// failed attempts, not "back" then "lost" each time.
func TestRefusingCollectorIsNotBack(t *testing.T) {
	for _, network := range []string{TCP, UDP} {
		t.Run(network, func(t *testing.T) {
			var logs logtest.Buffer
			var addr string
			if network == TCP {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { ln.Close() })
				go func() {
					for {
						c, err := ln.Accept()
						if err != nil {
							return
						}
						c.Close()
					}
				}()
				addr = ln.Addr().String()
			} else {
				pc, err := net.ListenPacket("udp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				addr = pc.LocalAddr().String()
				pc.Close()
			}
			cfg := outageConfig(addr, &logs)
			cfg.Transport = network
			e := newExporter(t, cfg)
			start(t, e)
			waitFor(t, 20*time.Second, "5 short connections", func() bool {
				e.Export(records(4, 1, 0))
				e.Flush()
				return e.Stats().Disconnects >= 5
			})
			if info := logs.Lines("level=INFO"); len(info) != 0 {
				t.Errorf("info lines: %q", info)
			}
			if warns := logs.Lines("level=WARN"); len(warns) != 1 {
				t.Errorf("warnings %q, want 1", warns)
			}
		})
	}
}

// TestBufferFullWhileConnectedLogged: records dropped while connected (a
// collector that reads slower than records come) are logged, once per
// interval.
func TestBufferFullWhileConnectedLogged(t *testing.T) {
	var logs logtest.Buffer
	l := newLinkLog(logs.Logger(), Config{Address: "[::1]:4739", Transport: TCP})
	now := time.Unix(1_800_000_000, 0)
	l.start(now)
	l.connected(now)
	l.tick(now.Add(l.settle), Stats{})
	if got := logs.Lines("connected to the collector"); len(got) != 1 {
		t.Fatalf("first connection: %q", got)
	}
	l.tick(now.Add(2*time.Second), Stats{DroppedBufferFull: 10})
	l.tick(now.Add(3*time.Second), Stats{DroppedBufferFull: 20})
	l.tick(now.Add(2*time.Second+l.every), Stats{DroppedBufferFull: 50})
	got := logs.Lines("send buffer full")
	if len(got) != 2 || attr(got[0], "records_dropped") != 10 || attr(got[1], "records_dropped") != 40 {
		t.Errorf("drop warnings %q", got)
	}
}
