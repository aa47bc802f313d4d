package ovs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/ovs"
)

// readTestdata reads a capture of the OVS lab from the parsers' testdata
// (package ovs), which the source's tests replay through fake CLIs.
func readTestdata(t testing.TB, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "ovs", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// fakeCLI writes a script that prints out (and, after delay, exits) and
// returns its path.
func fakeCLI(t *testing.T, name, out string, delay time.Duration) string {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, name+".out")
	if err := os.WriteFile(data, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\n"
	if delay > 0 {
		script += "sleep " + delay.String()[:len(delay.String())-1] + "\n"
	}
	script += "cat " + data + "\n"
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestDump runs Dump against CLIs that print the captured outputs (plus a
// malformed line each): one snapshot serves both families, counters and
// starts come from the counter flows, Service connections keep their VIP
// as key and the endpoint as destination, and bad lines are counted.
func TestDump(t *testing.T) {
	ct := readTestdata(t, "conntrack-ipv4.txt") + readTestdata(t, "conntrack-ipv6.txt") + "tcp,orig=(garbage\n"
	fl := readTestdata(t, "flows-ipv4.txt") + readTestdata(t, "flows-ipv6.txt") + " cookie=0xdf05, duration=bad\n"
	reg := prometheus.NewRegistry()
	cfg := Config{IPv4: true, IPv6: true, Appctl: fakeCLI(t, "appctl", ct, 0), Ofctl: fakeCLI(t, "ofctl", fl, 0)}
	cfg.SetDefaults()
	s, err := New(cfg, reg)
	if err != nil {
		t.Fatal(err)
	}
	v4, err := s.Dump(4, nil)
	if err != nil {
		t.Fatal(err)
	}
	v6, err := s.Dump(6, nil) // from the same snapshot
	if err != nil {
		t.Fatal(err)
	}
	if len(v4) != strings.Count(readTestdata(t, "conntrack-ipv4.txt"), "\n") || len(v6) != strings.Count(readTestdata(t, "conntrack-ipv6.txt"), "\n") {
		t.Fatalf("%d IPv4 and %d IPv6 connections", len(v4), len(v6))
	}
	for _, tc := range []struct {
		conns   []connstore.Conn
		version uint8
	}{{v4, 4}, {v6, 6}} {
		counted, services := 0, 0
		for _, c := range tc.conns {
			if c.Key.IPVersion() != tc.version || c.Key.Zone != 1 {
				t.Errorf("conn %+v: want IPv%d zone 1", c.Key, tc.version)
			}
			if c.HasCounters {
				counted++
				if c.Packets == 0 || c.Start.IsZero() {
					t.Errorf("conn %+v with counters but %d packets, start %v", c.Key, c.Packets, c.Start)
				}
			}
			if c.DstAddr != c.Key.Dst && c.Key.Proto == flow.ProtoTCP {
				services++
			}
		}
		if counted == 0 || services == 0 {
			t.Errorf("IPv%d: %d connections with counters, %d DNAT-ed; want some of each", tc.version, counted, services)
		}
	}
	for src, want := range map[string]float64{parseConntrack: 1, parseFlows: 1} {
		if got := testutil.ToFloat64(s.m.parseErrors.WithLabelValues(src)); got != want {
			t.Errorf("parse errors %s = %v, want %v", src, got, want)
		}
	}
	// Stable start across polls.
	again, err := s.Dump(4, nil)
	if err != nil {
		t.Fatal(err)
	}
	starts := map[connstore.Key]time.Time{}
	for _, c := range v4 {
		starts[c.Key] = c.Start
	}
	for _, c := range again {
		if !c.Start.Equal(starts[c.Key]) {
			t.Errorf("start of %+v moved from %v to %v", c.Key, starts[c.Key], c.Start)
		}
	}
}

// TestDumpTimeout: a CLI that hangs fails the poll after the timeout and
// is counted; it does not block the caller.
func TestDumpTimeout(t *testing.T) {
	cfg := Config{IPv4: true, IPv6: true, CommandTimeout: 200 * time.Millisecond,
		Appctl: fakeCLI(t, "appctl", "", 5*time.Second), Ofctl: fakeCLI(t, "ofctl", "", 0)}
	cfg.SetDefaults()
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := s.Dump(4, nil); err == nil {
		t.Fatal("want an error")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Dump took %v with a 200ms timeout", d)
	}
	if got := testutil.ToFloat64(s.m.commandErrors.WithLabelValues("dump-conntrack")); got != 1 {
		t.Errorf("command errors = %v", got)
	}
}

// TestDenied runs Denied against a monitor that prints the captured
// packet-ins: every drop becomes a denied record naming its rule.
func TestDenied(t *testing.T) {
	out := readTestdata(t, "monitor-ipv4.txt") + "NXT_PACKET_IN2 (xid=0x0): garbage\n" + readTestdata(t, "monitor-ipv6.txt")
	rules := filepath.Join(t.TempDir(), "rules.json")
	var rs []ovs.Rule
	// Name every drop cookie of the capture.
	var p ovs.MonitorParser
	seen := map[uint32]bool{}
	for l := range strings.Lines(out) {
		if pi, done, _ := p.Feed(strings.TrimSuffix(l, "\n")); done {
			if _, id, _ := ovs.SplitCookie(pi.Cookie); !seen[id] {
				seen[id] = true
				rs = append(rs, ovs.Rule{ID: id, Kind: ovs.KindDrop, Name: "drop/egress/test/" + string(rune('a'+len(rs))), Direction: "egress"})
			}
		}
	}
	if err := ovs.WriteRules(rules, rs); err != nil {
		t.Fatal(err)
	}
	// ovs-ofctl monitor prints on stderr.
	cfg := Config{IPv4: true, IPv6: true, RulesFile: rules, DeniedIdle: 100 * time.Millisecond, Ofctl: fakeStderrCLI(t, out)}
	cfg.SetDefaults()
	s, err := New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	var got []flow.Record
	s.Denied(ctx, func(recs []flow.Record) { got = append(got, recs...) })
	if len(got) == 0 {
		t.Fatal("no denied records")
	}
	v := map[uint8]int{}
	for _, r := range got {
		v[r.IPVersion]++
		if r.Egress.ReportedVerdict != flow.VerdictDenied || !strings.HasPrefix(r.Egress.ReportedName, "drop/egress/test/") {
			t.Errorf("record %+v", r.Egress)
		}
	}
	if v[4] == 0 || v[6] == 0 {
		t.Errorf("records per family %v", v)
	}
	if testutil.ToFloat64(s.m.parseErrors.WithLabelValues(parsePacketIn)) < 1 {
		t.Error("malformed packet-in not counted")
	}
}

func fakeStderrCLI(t *testing.T, out string) string {
	t.Helper()
	dir := t.TempDir()
	data := filepath.Join(dir, "monitor.out")
	if err := os.WriteFile(data, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "ofctl")
	if err := os.WriteFile(path, []byte("#!/bin/sh\ncat "+data+" >&2\nsleep 10\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}
