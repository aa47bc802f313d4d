package exporter

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/exporter/conntrack"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/nsrun"
	"github.com/dualflow/dualflow/test/support/ctlab"
	"github.com/dualflow/dualflow/test/support/ipfixtest"
)

// exchange is one connection the test made through the lab router.
type exchange struct {
	name    string
	f       ctlab.Family
	proto   uint8
	src     netip.AddrPort // the client's side
	dnat    bool
	snat    bool
	deleted bool // removed from conntrack right away: exported through the DESTROY event
	payload int
}

// TestNetNS runs the exporter in the test's namespace against the lab
// router's conntrack table, in IPv4-only, IPv6-only and dual-stack mode.
// The collector listens on IPv4 loopback in IPv4 mode and on [::1]
// otherwise, so the IPv6-only exporter talks IPFIX over IPv6. Every
// exchange must arrive with the addresses, NAT fields and counters
// conntrack -L shows for it, and no record of a disabled family may arrive.
func TestNetNS(t *testing.T) {
	ctlab.Require(t)
	for _, mode := range []struct {
		name       string
		ipv4, ipv6 bool
		collector  string
	}{
		{"ipv4", true, false, "127.0.0.1:0"},
		{"ipv6", false, true, "[::1]:0"},
		{"dual", true, true, "[::1]:0"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			l := ctlab.New(t, "exp"+mode.name)
			l.Echo(t)
			col := ipfixtest.Start(t, ipfixtest.Options{Address: mode.collector})
			cfg := NewConfig()
			cfg.NodeName = "node-" + mode.name
			cfg.MetricsAddr = ""
			cfg.NetNS = l.Router
			cfg.IPv4, cfg.IPv6 = mode.ipv4, mode.ipv6
			cfg.RequireAccounting = true
			cfg.PollInterval = 200 * time.Millisecond
			cfg.Store.IdleTimeout = time.Second
			cfg.Store.ActiveTimeout = time.Hour
			cfg.IPFIX.Address = col.Addr
			cfg.IPFIX.FlushInterval = 50 * time.Millisecond
			cfg.LocalCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.10.0/24"), netip.MustParsePrefix("fd00:10:10::/64")}
			cfg.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("198.18.0.0/16"), netip.MustParsePrefix("fd00:10::/32")}
			cfg.SetDefaults()
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			e, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			stop := run(t, e)

			var sent []exchange
			for _, f := range ctlab.Families {
				enabled := (f.Version == 4 && mode.ipv4) || (f.Version == 6 && mode.ipv6)
				for _, x := range []exchange{
					{name: "tcp/plain", proto: flow.ProtoTCP},
					{name: "tcp/dnat", proto: flow.ProtoTCP, dnat: true},
					{name: "udp/snat", proto: flow.ProtoUDP, snat: true},
					{name: "udp/dnat deleted", proto: flow.ProtoUDP, dnat: true, deleted: true},
				} {
					x.f, x.payload = f, 500+100*len(sent)
					dst := netip.AddrPortFrom(f.Server, ctlab.ServerPort)
					switch {
					case x.dnat:
						dst = netip.AddrPortFrom(f.VIP, ctlab.VIPPort)
					case x.snat:
						dst = netip.AddrPortFrom(f.Server, ctlab.SNATPort)
					}
					network := map[uint8]string{flow.ProtoTCP: "tcp", flow.ProtoUDP: "udp"}[x.proto]
					x.src = l.Exchange(t, network, dst, make([]byte, x.payload))
					if x.deleted {
						l.Run(t, l.Router, "conntrack", "-D", "-p", "udp", "--orig-port-src", fmt.Sprint(x.src.Port()),
							"-f", map[uint8]string{4: "ipv4", 6: "ipv6"}[f.Version])
					}
					x.name = fmt.Sprintf("ipv%d/%s", f.Version, x.name)
					if enabled {
						sent = append(sent, x)
					}
				}
			}
			cli := l.List(t) // counters are final: TCP is closed, UDP exchanged once
			find := func(recs []flow.Record, x exchange) []flow.Record {
				var out []flow.Record
				for _, r := range recs {
					if r.SrcAddr == x.src.Addr() && r.SrcPort == x.src.Port() && r.Proto == x.proto {
						out = append(out, r)
					}
				}
				return out
			}
			recs := col.Wait(t, 15*time.Second, func(recs []flow.Record) bool {
				for _, x := range sent {
					if len(find(recs, x)) == 0 {
						return false
					}
				}
				return true
			})
			for _, r := range recs {
				if (r.IPVersion == 4 && !mode.ipv4) || (r.IPVersion == 6 && !mode.ipv6) {
					t.Errorf("IPv%d record exported in %s mode: %v → %v", r.IPVersion, mode.name, r.SrcAddr, r.DstAddr)
				}
			}
			for _, x := range sent {
				t.Run(x.name, func(t *testing.T) {
					rs := find(recs, x)
					r := rs[len(rs)-1]
					var sum [4]uint64
					for _, r := range rs {
						sum[0] += r.PacketsDelta
						sum[1] += r.BytesDelta
						sum[2] += r.ReversePacketsDelta
						sum[3] += r.ReverseBytesDelta
					}
					if sum != [4]uint64{r.Packets, r.Bytes, r.ReversePackets, r.ReverseBytes} {
						t.Errorf("deltas add up to %v, totals are %d/%d %d/%d", sum, r.Packets, r.Bytes, r.ReversePackets, r.ReverseBytes)
					}
					if x.deleted {
						if r.EndReason != flow.EndReasonEndOfFlow || r.Packets != 1 || r.ReversePackets != 1 || r.Bytes < uint64(x.payload) {
							t.Errorf("deleted flow: %v, packets %d/%d bytes %d", r.EndReason, r.Packets, r.ReversePackets, r.Bytes)
						}
					} else {
						e, ok := ctlab.Find(cli, map[uint8]string{6: "tcp", 17: "udp"}[x.proto], x.src)
						if !ok {
							t.Fatal("not in conntrack -L")
						}
						if r.Packets != e.Packets || r.Bytes != e.Bytes || r.ReversePackets != e.ReplyPackets || r.ReverseBytes != e.ReplyBytes {
							t.Errorf("counters %d/%d %d/%d, conntrack -L %d/%d %d/%d", r.Packets, r.Bytes, r.ReversePackets, r.ReverseBytes,
								e.Packets, e.Bytes, e.ReplyPackets, e.ReplyBytes)
						}
						if r.EndReason != flow.EndReasonIdleTimeout {
							t.Errorf("end reason %v", r.EndReason)
						}
						if x.proto == flow.ProtoTCP && r.TCPState != e.State {
							t.Errorf("tcp state %q, conntrack -L %q", r.TCPState, e.State)
						}
					}
					wantPort := uint16(ctlab.ServerPort)
					if x.snat {
						wantPort = ctlab.SNATPort
					}
					if r.DstAddr != x.f.Server || r.DstPort != wantPort {
						t.Errorf("destination %v:%d, want the server %v:%d", r.DstAddr, r.DstPort, x.f.Server, wantPort)
					}
					if x.dnat != (r.ServiceAddr == x.f.VIP && r.ServicePort == ctlab.VIPPort) || (!x.dnat && r.ServiceAddr.IsValid()) {
						t.Errorf("service %v:%d (DNAT %v)", r.ServiceAddr, r.ServicePort, x.dnat)
					}
					if x.snat != (r.SNATAddr == x.f.RouterSide) || (!x.snat && r.SNATAddr.IsValid()) {
						t.Errorf("SNAT %v:%d (SNAT %v)", r.SNATAddr, r.SNATPort, x.snat)
					}
					if r.Mark != ctlab.Mark || r.Zone != 0 || r.IPVersion != x.f.Version {
						t.Errorf("mark %#x zone %d version %d", r.Mark, r.Zone, r.IPVersion)
					}
					if r.FlowStart.IsZero() || time.Since(r.FlowStart) > time.Minute || r.FlowEnd.Before(r.FlowStart) {
						t.Errorf("times %v .. %v", r.FlowStart, r.FlowEnd)
					}
					if r.ExporterNode != cfg.NodeName || r.Source != "conntrack" || r.Type != flow.FlowTypeInterNode ||
						r.Src.NodeName != cfg.NodeName || r.ObservationDomainID != cfg.IPFIX.ObservationDomainID {
						t.Errorf("identity: node %q source %q type %v src node %q domain %d",
							r.ExporterNode, r.Source, r.Type, r.Src.NodeName, r.ObservationDomainID)
					}
				})
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// BenchmarkPoll measures a poll over 100k conntrack entries (50k IPv4, 50k
// IPv6, TCP and UDP, 10% in zone 7) in a netns of its own: "dump" is the
// two netlink dumps alone, "poll" adds the store's merge, sweep and expiry,
// "conntrack-L" is `conntrack -L` of the same table for comparison. Each
// reports ns/entry.
func BenchmarkPoll(b *testing.B) {
	ctlab.Require(b)
	const n = 100_000
	ns := fmt.Sprintf("dfx-bench-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add: %v: %s", err, out)
	}
	b.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	err := nsrun.Do(nsrun.Path(ns), func() error {
		for _, k := range []string{"nf_conntrack_acct", "nf_conntrack_timestamp"} {
			if err := os.WriteFile("/proc/sys/net/netfilter/"+k, []byte("1"), 0o644); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	fill(b, ns, n)

	src, err := conntrack.Open(conntrack.Config{NetNS: ns, IPv4: true, IPv6: true})
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	perEntry := func(b *testing.B) {
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/entry")
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/poll")
	}
	b.Run("dump", func(b *testing.B) {
		b.ReportAllocs()
		var buf []connstore.Conn
		for i := 0; i < b.N; i++ {
			buf = buf[:0]
			for _, v := range []uint8{4, 6} {
				if buf, err = src.Dump(v, buf); err != nil {
					b.Fatal(err)
				}
			}
			if len(buf) != n {
				b.Fatalf("dumped %d entries, want %d", len(buf), n)
			}
		}
		perEntry(b)
	})
	b.Run("poll", func(b *testing.B) {
		cfg := NewConfig()
		cfg.NodeName, cfg.MetricsAddr = "bench", ""
		cfg.SetDefaults()
		e, err := newExporter(cfg, src)
		if err != nil {
			b.Fatal(err)
		}
		e.poll(src) // first poll inserts; the steady state is updates
		if got := e.store.Len(); got != n {
			b.Fatalf("store holds %d, want %d", got, n)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			e.poll(src)
		}
		perEntry(b)
	})
	b.Run("conntrack-L", func(b *testing.B) {
		if _, err := exec.LookPath("conntrack"); err != nil {
			b.Skip("no conntrack CLI")
		}
		for i := 0; i < b.N; i++ {
			cmd := exec.Command("ip", "netns", "exec", ns, "conntrack", "-L")
			cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
		}
		perEntry(b)
	})
}

// fill creates n entries in namespace ns with ti-mo Create (kernel 6.18:
// StatusConfirmed set, zone on the flow only).
func fill(b *testing.B, ns string, n int) {
	b.Helper()
	f, err := os.Open(nsrun.Path(ns))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	c, err := ct.Dial(&netlink.Config{NetNS: int(f.Fd())})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 0; i < n && ctx.Err() == nil; i++ {
		var src, dst netip.Addr
		if i%2 == 0 {
			src = netip.AddrFrom4([4]byte{198, 18, byte(100 + (i>>16)&0x3f), byte(i >> 8)})
			dst = netip.AddrFrom4([4]byte{198, 19, byte(i & 0xff), 1})
		} else {
			src = netip.MustParseAddr(fmt.Sprintf("fd00:10:a:%x::%x", i>>16, i&0xffff))
			dst = netip.MustParseAddr("fd00:10:b::1")
		}
		proto := flow.ProtoTCP
		if i%3 == 0 {
			proto = flow.ProtoUDP
		}
		fl := ct.NewFlow(proto, ct.StatusAssured|ct.StatusSeenReply|ct.StatusConfirmed, src, dst, uint16(1024+i%60000), 8080, 3600, uint32(i%16))
		if proto == flow.ProtoTCP {
			fl.ProtoInfo.TCP = &ct.ProtoInfoTCP{State: 3}
		}
		if i%10 == 0 {
			fl.Zone = 7
		}
		if err := c.Create(fl); err != nil {
			b.Fatalf("create entry %d: %v", i, err)
		}
	}
}

// TestNetNSRecycledTuple: a second TCP connection from the same client
// port right after the first (closed with a reset) takes the same tuple;
// conntrack replaces the entry, possibly under the same ID (issue 24 saw
// destroy and new 15 µs apart with one ID). The exporter must export two
// connections, each with its own start time and counters, in both
// families.
func TestNetNSRecycledTuple(t *testing.T) {
	ctlab.Require(t)
	l := ctlab.New(t, "exprecycle")
	l.Echo(t)
	col := ipfixtest.Start(t, ipfixtest.Options{Address: "[::1]:0"})
	cfg := NewConfig()
	cfg.NodeName = "node-recycle"
	cfg.MetricsAddr = ""
	cfg.NetNS = l.Router
	cfg.RequireAccounting = true
	cfg.PollInterval = 200 * time.Millisecond
	cfg.Store.IdleTimeout = time.Second
	cfg.Store.ActiveTimeout = time.Hour
	cfg.IPFIX.Address = col.Addr
	cfg.IPFIX.FlushInterval = 50 * time.Millisecond
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, e)
	// Payloads far enough apart that each connection's forward bytes
	// (payload plus under 1,000 bytes of headers) tell which it is, and
	// both merged would be neither.
	const first, second, headers = 1200, 6000, 1000
	ports := map[uint8]uint16{}
	for _, f := range ctlab.Families {
		port := uint16(41000 + int(f.Version))
		ports[f.Version] = port
		dst := netip.AddrPortFrom(f.Server, ctlab.ServerPort)
		l.ExchangeTCPFrom(t, port, dst, make([]byte, first))
		// The records' start times have millisecond resolution (the
		// exporter compares conntrack's nanoseconds): the two connections
		// must start in different milliseconds for the test to tell them
		// apart. Not a wait for a condition: a spacing of the two starts.
		time.Sleep(2 * time.Millisecond)
		l.ExchangeTCPFrom(t, port, dst, make([]byte, second))
	}
	// Connections by start time: the largest byte total of each.
	conns := func(recs []flow.Record, v uint8) map[time.Time]uint64 {
		out := map[time.Time]uint64{}
		for _, r := range recs {
			if r.IPVersion == v && r.SrcPort == ports[v] && r.Proto == flow.ProtoTCP {
				out[r.FlowStart] = max(out[r.FlowStart], r.Bytes)
			}
		}
		return out
	}
	recs := col.Wait(t, 30*time.Second, func(recs []flow.Record) bool {
		for _, f := range ctlab.Families {
			if len(conns(recs, f.Version)) < 2 {
				return false
			}
		}
		return true
	})
	for _, f := range ctlab.Families {
		got := conns(recs, f.Version)
		var small, large int
		for _, b := range got {
			switch {
			case b >= first && b < first+headers:
				small++
			case b >= second && b < second+headers:
				large++
			default:
				t.Errorf("IPv%d: a connection of %d forward bytes: not one exchange (%d or %d payload bytes)", f.Version, b, first, second)
			}
		}
		if len(got) != 2 || small != 1 || large != 1 {
			t.Errorf("IPv%d: connections by start time %v, want one of each exchange", f.Version, got)
		}
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
}
