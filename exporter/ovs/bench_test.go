package ovs

import (
	"fmt"
	"runtime"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/ovs"
)

// benchConntrack returns n dump-conntrack -m lines: half IPv4, half IPv6,
// TCP, UDP and ICMP, like a busy node's dump.
func benchConntrack(n int) string {
	var b strings.Builder
	for i := range n {
		sp, a, c := 1024+i%60000, i/250%250, i%250
		switch i % 4 {
		case 0:
			fmt.Fprintf(&b, "tcp,orig=(src=198.18.%d.%d,dst=198.19.0.11,sport=%d,dport=80),reply=(src=198.18.2.11,dst=198.18.%d.%d,sport=8080,dport=%d),id=0,zone=1,status=0,mark=1,labels=0xaf3c3bbc5ecd65d6,protoinfo=(state_orig=ESTABLISHED,state_reply=ESTABLISHED,wscale_orig=10,wscale_reply=10,flags_orig=WINDOW_SCALE,flags_reply=WINDOW_SCALE)\n", a, c, sp, a, c, sp)
		case 1:
			fmt.Fprintf(&b, "tcp,orig=(src=fd00:10:0:%x::%x,dst=fd00:10:0:2::11,sport=%d,dport=8080),reply=(src=fd00:10:0:2::11,dst=fd00:10:0:%x::%x,sport=8080,dport=%d),id=0,zone=1,status=0,mark=1,labels=0x5ecd65d6,protoinfo=(state_orig=FIN_WAIT_2,state_reply=FIN_WAIT_2,wscale_orig=10,wscale_reply=10,flags_orig=WINDOW_SCALE,flags_reply=WINDOW_SCALE)\n", a, c, sp, a, c, sp)
		case 2:
			fmt.Fprintf(&b, "udp,orig=(src=198.18.%d.%d,dst=198.18.2.11,sport=%d,dport=5353),reply=(src=198.18.2.11,dst=198.18.%d.%d,sport=5353,dport=%d),id=0,zone=1,status=0,mark=1\n", a, c, sp, a, c, sp)
		default:
			fmt.Fprintf(&b, "icmpv6,orig=(src=fd00:10:0:%x::%x,dst=fd00:10:0:2::10,id=%d,type=128,code=0),reply=(src=fd00:10:0:2::10,dst=fd00:10:0:%x::%x,id=%d,type=129,code=0),id=0,zone=1,status=0,mark=1\n", a, c, sp, a, c, sp)
		}
	}
	return b.String()
}

// benchFlows returns n dump-flows lines, mostly learned counter flows of
// both families, the rest policy flows.
func benchFlows(n int) string {
	var b strings.Builder
	b.WriteString("NXST_FLOW reply (xid=0x8):\n")
	for i := range n {
		sp, a, c := 1024+i%60000, i/250%250, i%250
		switch i % 5 {
		case 0, 1:
			fmt.Fprintf(&b, " cookie=0xdf05000000000000, duration=4.846s, table=65, n_packets=%d, n_bytes=%d, idle_timeout=300, idle_age=4, priority=100,tcp,nw_src=198.18.%d.%d,nw_dst=198.18.2.11,tp_src=%d,tp_dst=8080 actions=drop\n", i, 70*i, a, c, sp)
		case 2, 3:
			fmt.Fprintf(&b, " cookie=0xdf05000000000000, duration=4.707s, table=65, n_packets=%d, n_bytes=%d, idle_timeout=300, idle_age=4, priority=100,udp6,ipv6_src=fd00:10:0:2::11,ipv6_dst=fd00:10:0:%x::%x,tp_src=5353,tp_dst=%d actions=drop\n", i, 90*i, a, c, sp)
		default:
			fmt.Fprintf(&b, " cookie=0xdf0200005ecd65d6, duration=22.358s, table=45, n_packets=%d, n_bytes=%d, idle_age=2, priority=19999,tcp6,ipv6_src=fd00:10:0:%x::%x,ipv6_dst=fd00:10:0:2::11,tp_dst=8080 actions=load:0x5ecd65d6->NXM_NX_REG5[],goto_table:50\n", i, 74*i, a, c)
		}
	}
	return b.String()
}

// BenchmarkParseConntrack parses a dump of 50k OVS conntrack entries.
func BenchmarkParseConntrack(b *testing.B) {
	const n = 50000
	out := benchConntrack(n)
	b.ReportAllocs()
	b.SetBytes(int64(len(out)))
	ms := memStats()
	for b.Loop() {
		got := 0
		if bad, err := ovs.ParseConntrack(out, func(*ovs.Entry) { got++ }); bad != 0 || got != n {
			b.Fatalf("%d entries, %d bad: %v", got, bad, err)
		}
	}
	reportPerEntry(b, n, ms)
}

// BenchmarkParseFlows parses a dump of 10k flows and indexes the counter
// flows by tuple (what each poll does).
func BenchmarkParseFlows(b *testing.B) {
	const n = 10000
	out := benchFlows(n)
	b.ReportAllocs()
	b.SetBytes(int64(len(out)))
	ms := memStats()
	for b.Loop() {
		snap := &Snapshot{Flows: make([]ovs.Flow, 0, n)}
		if bad, err := ovs.ParseFlows(out, func(f *ovs.Flow) { snap.Flows = append(snap.Flows, *f) }); bad != 0 || len(snap.Flows) != n {
			b.Fatalf("%d flows, %d bad: %v", len(snap.Flows), bad, err)
		}
		if c := snap.Counters(); len(c) != n/5*4 {
			b.Fatalf("%d counters", len(c))
		}
	}
	reportPerEntry(b, n, ms)
}

// BenchmarkPoll parses 50k conntrack entries and 10k flows and joins them
// into connstore observations, as one exporter poll does.
func BenchmarkPoll(b *testing.B) {
	ct, fl := benchConntrack(50000), benchFlows(10000)
	s, err := New(Config{IPv4: true, IPv6: true, CommandTimeout: 1, DeniedIdle: 1, DeniedActive: 1, DeniedMaxFlows: 1}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	ms := memStats()
	for b.Loop() {
		snap := &Snapshot{}
		ovs.ParseConntrack(ct, func(e *ovs.Entry) { snap.Conns = append(snap.Conns, *e) })
		ovs.ParseFlows(fl, func(f *ovs.Flow) { snap.Flows = append(snap.Flows, *f) })
		counters := snap.Counters()
		for i := range snap.Conns {
			s.conn(&snap.Conns[i], counters, snap.Taken)
		}
	}
	reportPerEntry(b, 60000, ms)
}

// reportPerEntry reports throughput in entries/s and heap bytes
// allocated per entry (B/entry) since start's memory statistics.
func reportPerEntry(b *testing.B, n int, start runtime.MemStats) {
	var end runtime.MemStats
	runtime.ReadMemStats(&end)
	total := float64(n) * float64(b.N)
	b.ReportMetric(total/b.Elapsed().Seconds(), "entries/s")
	b.ReportMetric(float64(end.TotalAlloc-start.TotalAlloc)/total, "B/entry")
}

func memStats() runtime.MemStats {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m
}
