package observe

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/nsrun"
)

// tables are the trace tables of every kind, in both families.
func tables() []Table {
	v4, v6 := netip.MustParseAddr("198.18.1.10"), netip.MustParseAddr("fd00:10:0:1::10")
	return []Table{
		ProbeTable("dualflow_trace_t1", ProbeMatch{Tag: 5, Src: v4, Proto: 6, SrcPort: 40000}),
		ProbeTable("dualflow_trace_t2", ProbeMatch{Tag: 6, Src: v6, Proto: 17, SrcPort: 40001}),
		ProbeTable("dualflow_trace_t3", ProbeMatch{Tag: 7, Src: v4, Proto: 1, SrcPort: 9}),
		ProbeTable("dualflow_trace_t4", ProbeMatch{Tag: 63, Src: v6, Proto: 58, SrcPort: 9}),
		ProbeTable("dualflow_trace_t5", ProbeMatch{Tag: 1, Src: v6, Proto: 6, SrcPort: 65535}),
		ProbeTable("dualflow_trace_t6", ProbeMatch{Tag: 46, Src: netip.MustParseAddr("::ffff:198.18.1.10"), Proto: 17, SrcPort: 53}),
		LiveTable("dualflow_trace_t7", v4, 6),
		LiveTable("dualflow_trace_t8", v6, 6),
		LiveTable("dualflow_trace_t9", v6, 17),
		LiveTable("dualflow_trace_t10", v4, 1),
		LiveTable("dualflow_trace_t11", v6, 58),
		CanaryTable("dualflow_trace_t12"),
	}
}

func TestTableText(t *testing.T) {
	want := []string{
		"ip dscp 5 ip saddr 198.18.1.10 tcp sport 40000 meta nftrace set 1",
		"ip6 dscp 6 ip6 saddr fd00:10:0:1::10 udp sport 40001 meta nftrace set 1",
		"ip dscp 7 ip saddr 198.18.1.10 icmp type echo-request icmp id 9 meta nftrace set 1",
		"ip6 dscp 63 ip6 saddr fd00:10:0:1::10 icmpv6 type echo-request icmpv6 id 9 meta nftrace set 1",
		"ip6 dscp 1 ip6 saddr fd00:10:0:1::10 tcp sport 65535 meta nftrace set 1",
		"ip dscp 46 ip saddr 198.18.1.10 udp sport 53 meta nftrace set 1",
		"ip saddr 198.18.1.10 tcp flags & (syn | ack) == syn meta nftrace set 1",
		"ip6 saddr fd00:10:0:1::10 tcp flags & (syn | ack) == syn meta nftrace set 1",
		"ip6 saddr fd00:10:0:1::10 meta l4proto udp meta nftrace set 1",
		"ip saddr 198.18.1.10 icmp type echo-request meta nftrace set 1",
		"ip6 saddr fd00:10:0:1::10 icmpv6 type echo-request meta nftrace set 1",
		"",
	}
	for i, tb := range tables() {
		got := tb.Text()
		if tb.Canary {
			if got != "table inet "+tb.Name+" {\n}\n" {
				t.Errorf("canary: %q", got)
			}
			continue
		}
		if !strings.Contains(got, want[i]) || !strings.HasPrefix(got, "table inet "+tb.Name+" {") || !strings.Contains(got, "hook prerouting priority -350") {
			t.Errorf("%s:\n%s\nwant it to contain %q", tb.Name, got, want[i])
		}
	}
}

func TestTableNames(t *testing.T) {
	now := time.Unix(1767323045, 0)
	a, b := NewTableName(5, now), NewTableName(5, now)
	if a == b || !strings.HasPrefix(a, TablePrefix+"5_1767323045_") {
		t.Fatalf("names %q %q: want distinct, dualflow_trace_5_<unix>_…", a, b)
	}
	if created, mine, ok := TableInfo(a); !ok || !mine || !created.Equal(now) {
		t.Errorf("TableInfo(%q) = %v %v %v", a, created, mine, ok)
	}
	for _, name := range []string{"dualflow_trace_5", "dualflow_trace_5_x_abc", "dualflow_trace_300_1_0123456789", "other_5_1_0123456789", "dualflow_trace_5_1_0123"} {
		if _, _, ok := TableInfo(name); ok {
			t.Errorf("TableInfo(%q) ok", name)
		}
	}
	// Another agent's name (another instance) is not mine.
	other := fmt.Sprintf("%s5_%d_%s7", TablePrefix, now.Unix(), "ffffffff")
	if other[len(TablePrefix)+2+10+1:][:8] == instance() {
		t.Skip("instance collided with ffffffff")
	}
	if _, mine, ok := TableInfo(other); !ok || mine {
		t.Errorf("TableInfo(%q): mine %v ok %v", other, mine, ok)
	}
}

func needNFT(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	nft, err := exec.LookPath("nft")
	if err != nil {
		t.Skip("nft not installed")
	}
	return nft
}

// scratchNS makes a network namespace for the test and removes it after.
func scratchNS(t *testing.T) string {
	t.Helper()
	name := fmt.Sprintf("dftest-observe-%d", os.Getpid())
	exec.Command("ip", "netns", "del", name).Run()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	return nsrun.Path(name)
}

func nftIn(t *testing.T, ns, nft string, stdin string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var in []byte
	if stdin != "" {
		in = []byte(stdin)
	}
	out, err := nsrun.Output(ctx, ns, in, append([]string{nft}, args...)...)
	if err != nil {
		t.Fatalf("nft %v: %v %s", args, err, out)
	}
	return string(out)
}

// TestLoadTableAsNft: every table loaded over netlink reads back from the
// kernel (`nft list table`) as the same table loaded by nft from Text, in
// both families; a reload replaces it, ListTables lists the traceflow
// tables only, DeleteTable removes one and ignores one that is gone.
func TestLoadTableAsNft(t *testing.T) {
	nft := needNFT(t)
	ns := scratchNS(t)
	nftIn(t, ns, nft, "table inet other {\n\tchain c {\n\t\ttype filter hook input priority 0;\n\t}\n}\n", "-f", "-")
	var names []string
	for _, tb := range tables() {
		if err := LoadTable(ns, tb); err != nil {
			t.Fatalf("%s: %v", tb.Name, err)
		}
		if err := LoadTable(ns, tb); err != nil { // a reload
			t.Fatalf("%s reload: %v", tb.Name, err)
		}
		names = append(names, tb.Name)
		got := nftIn(t, ns, nft, "", "list", "table", "inet", tb.Name)
		twin := tb
		twin.Name += "_nft"
		nftIn(t, ns, nft, twin.Text(), "-f", "-")
		want := nftIn(t, ns, nft, "", "list", "table", "inet", twin.Name)
		if strings.ReplaceAll(want, twin.Name, tb.Name) != got {
			t.Errorf("%s over netlink:\n%s\nby nft from Text:\n%s", tb.Name, got, want)
		}
		nftIn(t, ns, nft, "", "delete", "table", "inet", twin.Name)
		if !tb.Canary && (!strings.Contains(got, "meta nftrace set 1") || !strings.Contains(got, `comment "traceflow probe out"`)) {
			t.Errorf("%s:\n%s", tb.Name, got)
		}
	}
	listed, err := ListTables(ns)
	slices.Sort(listed)
	slices.Sort(names)
	if err != nil || !slices.Equal(listed, names) {
		t.Fatalf("ListTables = %v %v, want %v", listed, err, names)
	}
	for _, n := range names {
		if err := DeleteTable(ns, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := DeleteTable(ns, names[0]); err != nil {
		t.Errorf("delete a table that is gone: %v", err)
	}
	if out := nftIn(t, ns, nft, "", "list", "tables"); !bytes.Equal([]byte(strings.TrimSpace(out)), []byte("table inet other")) {
		t.Errorf("tables left: %q", out)
	}
}

// BenchmarkLoadTable measures one load and delete over netlink (what a
// watch costs the node, instead of two nft processes).
func BenchmarkLoadTable(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	tb := ProbeTable(NewTableName(5, time.Now()), ProbeMatch{Tag: 5, Src: netip.MustParseAddr("fd00:10:0:1::10"), Proto: 6, SrcPort: 40000})
	b.ReportAllocs()
	for b.Loop() {
		if err := LoadTable("/proc/self/ns/net", tb); err != nil {
			b.Fatal(err)
		}
		if err := DeleteTable("/proc/self/ns/net", tb.Name); err != nil {
			b.Fatal(err)
		}
	}
}
