package node

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
)

func TestMatchesDst(t *testing.T) {
	src4, dst4 := netip.MustParseAddr("10.0.1.10"), netip.MustParseAddr("10.96.0.10")
	src6, dst6 := netip.MustParseAddr("fd00:1::10"), netip.MustParseAddr("fd00:96::10")
	tcp := func(src, dst netip.Addr, sport uint16) traceflow.Probe {
		return traceflow.Probe{Src: src, Dst: dst, Protocol: traceflow.TCP, DstPort: 80, SrcPort: sport}
	}
	pre := func(src, dst netip.Addr, sport, dport uint16) observe.Event {
		return observe.Event{Src: src, Dst: dst, SrcPort: sport, DstPort: dport}
	}
	for _, tc := range []struct {
		name string
		p    traceflow.Probe
		pre  observe.Event
		want bool
	}{
		{"v4 any source port", tcp(src4, dst4, 0), pre(src4, dst4, 40000, 80), true},
		{"v6 any source port", tcp(src6, dst6, 0), pre(src6, dst6, 40000, 80), true},
		{"v4 other port", tcp(src4, dst4, 0), pre(src4, dst4, 40000, 443), false},
		{"v6 other destination", tcp(src6, dst6, 0), pre(src6, netip.MustParseAddr("fd00:96::11"), 40000, 80), false},
		{"v4 other source", tcp(src4, dst4, 0), pre(netip.MustParseAddr("10.0.1.11"), dst4, 40000, 80), false},
		{"v4 requested source port", tcp(src4, dst4, 40000), pre(src4, dst4, 40000, 80), true},
		{"v6 other source port", tcp(src6, dst6, 40000), pre(src6, dst6, 40001, 80), false},
		{"v4 icmp any echo id", traceflow.Probe{Src: src4, Dst: dst4, Protocol: traceflow.ICMP}, pre(src4, dst4, 7, 0), true},
		{"v6 icmp requested echo id", traceflow.Probe{Src: src6, Dst: dst6, Protocol: traceflow.ICMPv6, SrcPort: 7}, pre(src6, dst6, 8, 0), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := matchesDst(tc.p, tc.pre); got != tc.want {
				t.Errorf("matchesDst = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestEchoID(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		want       uint16
		ok         bool
	}{
		{"v4 echo request", `trace id e36bccb3 inet t o packet: oif "lo" ip saddr 127.0.0.1 ip daddr 127.0.0.1 ip protocol icmp ip length 84 icmp type echo-request icmp code net-unreachable icmp id 18288 icmp sequence 1 @th,64,96 0xbe2d`, 18288, true},
		{"v6 echo request, id and sequence word", `trace id 6c590ef0 inet t o packet: oif "lo" ip6 saddr fd00::1 ip6 daddr fd00::1 ip6 nexthdr ipv6-icmp ip6 length 64 icmpv6 type echo-request icmpv6 code no-route icmpv6 parameter-problem 1198587905 @th,64,96 0xbe2d`, 18289, true},
		{"v6 echo request, id", `trace id 1 inet t o packet: ip6 saddr fd00::1 ip6 daddr fd00::2 icmpv6 type echo-request icmpv6 code no-route icmpv6 id 7 icmpv6 sequence 1`, 7, true},
		{"v4 echo reply", `trace id abb6868f inet t o packet: oif "lo" ip saddr 127.0.0.1 ip daddr 127.0.0.1 icmp type echo-reply icmp code net-unreachable icmp id 18288 icmp sequence 1`, 0, false},
		{"tcp", `trace id 1 inet t pre packet: iif "veth1" ip saddr 10.0.1.10 ip daddr 10.96.0.10 tcp sport 40000 tcp dport 80 tcp flags == syn`, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := echoID(tc.line)
			if got != tc.want || ok != tc.ok {
				t.Errorf("echoID = %d, %v, want %d, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestRecent(t *testing.T) {
	r := newRecent[string, int](2)
	r.put("a", 1)
	r.put("b", 2)
	r.put("a", 3) // newest again
	r.put("c", 4) // forgets b
	if _, ok := r.get("b"); ok {
		t.Error("b kept beyond the cap")
	}
	if v, ok := r.get("a"); !ok || v != 3 {
		t.Errorf("a = %d, %v, want 3", v, ok)
	}
	r.delete("a")
	r.delete("zz")
	if _, ok := r.get("a"); ok || r.len() != 1 || len(r.keys) != 1 {
		t.Errorf("after delete: len %d, keys %v", r.len(), r.keys)
	}
}

// liveFixture is a live probe of a Service from a pod, with the events a
// node's trace table reports (table of tag 5).
type liveFixture struct {
	p                  traceflow.Probe
	ep                 netip.Addr // the endpoint the Service DNATs to
	table              string
	epHost, otherIface string
}

func newLiveFixture(v6 bool) liveFixture {
	f := liveFixture{p: traceflow.Probe{Src: netip.MustParseAddr("10.0.1.10"), Dst: netip.MustParseAddr("10.96.0.10"),
		Protocol: traceflow.TCP, DstPort: 80, Tag: 5, Live: true, Service: "backend/api"},
		ep: netip.MustParseAddr("10.0.2.11"), table: observe.TablePrefix + "5_1767323045_0123456789", epHost: "veth-api2", otherIface: "eth0"}
	if v6 {
		f.p.Src, f.p.Dst, f.ep = netip.MustParseAddr("fd00:1::10"), netip.MustParseAddr("fd00:96::10"), netip.MustParseAddr("fd00:2::11")
	}
	return f
}

func (f liveFixture) pre(id string, dst netip.Addr, sport, dport uint16) observe.Event {
	return observe.Event{ID: id, Table: f.table, Chain: observe.ChainPre, Kind: observe.KindPacket, IIf: "veth-web1",
		Src: f.p.Src, Dst: dst, SrcPort: sport, DstPort: dport}
}

func (f liveFixture) fwd(id string, dst netip.Addr, sport, dport uint16, oif string) observe.Event {
	return observe.Event{ID: id, Table: "dualflow", Chain: "forward", Kind: observe.KindPacket, OIf: oif,
		Src: f.p.Src, Dst: dst, SrcPort: sport, DstPort: dport}
}

func (f liveFixture) post(id string, dst netip.Addr, sport, dport uint16, oif string) observe.Event {
	return observe.Event{ID: id, Table: f.table, Chain: observe.ChainPost, Kind: observe.KindPacket, OIf: oif,
		Src: f.p.Src, Dst: dst, SrcPort: sport, DstPort: dport}
}

func (f liveFixture) node(source bool) *liveNode {
	targets := []localTarget{{Target: traceflow.Target{Addr: f.ep, Pod: "backend/api-2"}, host: f.epHost}}
	return newLiveNode(&Tracer{Name: "node-1"}, f.p, f.table, source, targets)
}

func fams(t *testing.T, run func(t *testing.T, f liveFixture)) {
	for _, v6 := range []bool{false, true} {
		name := "ipv4"
		if v6 {
			name = "ipv6"
		}
		t.Run(name, func(t *testing.T) { run(t, newLiveFixture(v6)) })
	}
}

func conns(evs []traceflow.WatchEvent) []uint16 {
	var out []uint16
	for _, e := range evs {
		out = append(out, e.Conn)
	}
	return out
}

func TestLiveSourceNodeAnnouncesMatchingConnections(t *testing.T) {
	fams(t, func(t *testing.T, f liveFixture) {
		l := f.node(true)
		// Another destination: not reported on the source node.
		other := netip.AddrPortFrom(f.ep, 9090)
		if got := l.add(f.pre("aa", other.Addr(), 41000, other.Port())); got != nil {
			t.Errorf("connection to %s reported: %+v", other, got)
		}
		if got := l.add(f.fwd("aa", other.Addr(), 41000, other.Port(), f.otherIface)); got != nil {
			t.Errorf("event of an ignored packet reported: %+v", got)
		}

		// The requested destination: announced, then each event carries
		// the connection.
		got := l.add(f.pre("bb", f.p.Dst, 42000, 80))
		if len(got) != 2 || got[0].SrcPort != 42000 || got[0].Observation != nil {
			t.Fatalf("pre of a matching connection: %+v, want an announcement then an observation", got)
		}
		if o := got[1].Observation; o == nil || o.Action != traceflow.ActionReceived || o.Interface != "veth-web1" {
			t.Errorf("pre observation %+v", o)
		}
		got = append(got, l.add(f.fwd("bb", f.ep, 42000, 8080, f.otherIface))...)
		if o := got[2].Observation; o == nil || o.Component != traceflow.Routing || o.TranslatedDst != netip.AddrPortFrom(f.ep, 8080) {
			t.Errorf("forward observation %+v, want the translated destination", o)
		}
		left := l.add(f.post("bb", f.ep, 42000, 8080, f.otherIface))
		if len(left) != 1 || !left[0].Left || left[0].Outcome != "" {
			t.Errorf("post towards another node: %+v, want Left without an outcome", left)
		}
		for i, c := range conns(append(got, left...)) {
			if c != 42000 {
				t.Errorf("event %d: conn %d, want 42000", i, c)
			}
		}

		// The kernel reuses trace id aa for a matching packet: a new
		// group, not the ignored one.
		if got := l.add(f.pre("aa", f.p.Dst, 43000, 80)); len(got) != 2 || got[0].SrcPort != 43000 || got[1].Conn != 43000 {
			t.Errorf("reused trace id: %+v", got)
		}
	})
}

func TestLiveOtherNodeReportsEveryConnectionAndDelivers(t *testing.T) {
	fams(t, func(t *testing.T, f liveFixture) {
		l := f.node(false)
		// Arrives translated by the source node; never announced here.
		got := l.add(f.pre("cc", f.ep, 42000, 8080))
		got = append(got, l.add(f.fwd("cc", f.ep, 42000, 8080, f.epHost))...)
		got = append(got, l.add(f.post("cc", f.ep, 42000, 8080, f.epHost))...)
		if len(got) != 4 {
			t.Fatalf("got %d events, want received, forwarded, left, delivered: %+v", len(got), got)
		}
		for i, e := range got {
			if e.Conn != 42000 || e.SrcPort != 0 {
				t.Errorf("event %d: conn %d srcPort %d, want conn 42000 and no announcement", i, e.Conn, e.SrcPort)
			}
		}
		if o := got[1].Observation; o.TranslatedDst.IsValid() {
			t.Errorf("forward %+v: translated against the packet's own destination, want none", o)
		}
		if !got[2].Left {
			t.Errorf("post: %+v, want Left", got[2])
		}
		d := got[3]
		if d.Outcome != traceflow.Delivered || d.Observation == nil || d.Observation.Component != traceflow.Delivery ||
			d.Observation.Pod != "backend/api-2" || d.Observation.Interface != f.epHost || d.Observation.TranslatedDst != netip.AddrPortFrom(f.ep, 8080) {
			t.Errorf("delivery %+v %+v", d, d.Observation)
		}

		// Another connection of the source pod is reported too (the
		// controller picks by Conn), and its drop carries it.
		drop := observe.Event{ID: "dd", Table: "dualflow", Chain: "ingress/backend/api-2", Kind: observe.KindRule, Verdict: "drop",
			Rule: `counter name "drop/ingress/backend/api-2" drop`}
		got = l.add(f.pre("dd", f.ep, 42001, 8080))
		got = append(got, l.add(drop)...)
		if len(got) != 2 || got[1].Outcome != traceflow.Dropped || got[1].Conn != 42001 || got[0].Conn != 42001 {
			t.Errorf("dropped connection: %+v", got)
		}
	})
}

func TestLiveSameNodeServiceDelivery(t *testing.T) {
	fams(t, func(t *testing.T, f liveFixture) {
		l := f.node(true)
		dnat := observe.Event{ID: "ee", Table: "dualflow", Chain: "svc/backend/api", Kind: observe.KindRule, Verdict: "accept",
			Rule: fmt.Sprintf(`dnat to %s comment "endpoint %s of backend/api/http"`, netip.AddrPortFrom(f.ep, 8080), netip.AddrPortFrom(f.ep, 8080))}
		var got []traceflow.WatchEvent
		for _, ev := range []observe.Event{f.pre("ee", f.p.Dst, 42000, 80), dnat, f.fwd("ee", f.ep, 42000, 8080, f.epHost), f.post("ee", f.ep, 42000, 8080, f.epHost)} {
			got = append(got, l.add(ev)...)
		}
		var lb, delivered bool
		for _, e := range got {
			if e.Conn != 42000 {
				t.Errorf("event %+v without the connection", e)
			}
			if o := e.Observation; o != nil && o.Component == traceflow.LoadBalancing && o.TranslatedDst == netip.AddrPortFrom(f.ep, 8080) && o.Service == "backend/api" {
				lb = true
			}
			delivered = delivered || e.Outcome == traceflow.Delivered
		}
		if !lb || !delivered || got[0].SrcPort != 42000 {
			t.Errorf("want an announcement, the load balancing and a delivery: %+v", got)
		}
	})
}

func TestLiveUDPFlowReportedOnce(t *testing.T) {
	f := newLiveFixture(false)
	f.p.Protocol = traceflow.UDP
	l := f.node(true)
	if got := l.add(f.pre("a1", f.p.Dst, 5000, 80)); len(got) != 2 {
		t.Fatalf("first datagram: %+v", got)
	}
	if got := l.add(f.pre("a2", f.p.Dst, 5000, 80)); got != nil {
		t.Errorf("second datagram of the flow reported: %+v", got)
	}
	if got := l.add(f.pre("a3", f.p.Dst, 5001, 80)); len(got) != 2 || got[0].SrcPort != 5001 {
		t.Errorf("datagram of another flow: %+v", got)
	}
}

func TestLiveForgetsOldGroups(t *testing.T) {
	f := newLiveFixture(true)
	l := f.node(false)
	for i := range maxLiveGroups + 10 {
		l.add(f.pre(fmt.Sprintf("id%d", i), f.ep, uint16(30000+i), 8080))
	}
	if n := l.groups.len(); n != maxLiveGroups {
		t.Errorf("%d groups kept, want %d", n, maxLiveGroups)
	}
	if got := l.add(f.fwd("id0", f.ep, 30000, 8080, f.epHost)); got != nil {
		t.Errorf("event of a forgotten packet reported: %+v", got)
	}
	last := fmt.Sprintf("id%d", maxLiveGroups+9)
	if got := l.add(f.fwd(last, f.ep, uint16(30000+maxLiveGroups+9), 8080, f.epHost)); len(got) != 1 {
		t.Errorf("event of the newest packet: %+v", got)
	}
}

// len is how many entries r holds (tests).
func (r *recent[K, V]) len() int { return len(r.m) }
