package conntrack

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/nsrun"
	"github.com/dualflow/dualflow/test/support/ctlab"
)

func open(t *testing.T, cfg Config) *Source {
	t.Helper()
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func find(conns []connstore.Conn, proto uint8, src netip.AddrPort) (connstore.Conn, bool) {
	for _, c := range conns {
		if c.Key.Proto == proto && c.Key.Src == src.Addr() && c.Key.SrcPort == src.Port() {
			return c, true
		}
	}
	return connstore.Conn{}, false
}

// TestDumpRealTraffic sends TCP and UDP through the lab router, plain,
// DNAT-ed and SNAT-ed, in both families, and checks every dumped entry
// against conntrack -L of the same table.
func TestDumpRealTraffic(t *testing.T) {
	l := ctlab.New(t, "ctdump")
	l.Echo(t)
	s := open(t, Config{NetNS: l.Router, IPv4: true, IPv6: true})
	if a, err := s.Accounting(); err != nil || a.Err() != nil {
		t.Fatalf("accounting %+v: %v %v", a, err, a.Err())
	}
	type sent struct {
		name     string
		proto    uint8
		src      netip.AddrPort
		f        ctlab.Family
		dnat     bool
		snat     bool
		dstPort  uint16
		payloadN int
	}
	var all []sent
	for _, f := range ctlab.Families {
		for _, proto := range []uint8{flow.ProtoTCP, flow.ProtoUDP} {
			network := map[uint8]string{flow.ProtoTCP: "tcp", flow.ProtoUDP: "udp"}[proto]
			for _, tc := range []struct {
				name      string
				dst       netip.Addr
				port      uint16
				dnat, snt bool
			}{
				{"plain", f.Server, ctlab.ServerPort, false, false},
				{"dnat", f.VIP, ctlab.VIPPort, true, false},
				{"snat", f.Server, ctlab.SNATPort, false, true},
			} {
				n := 1000 + len(all)
				src := l.Exchange(t, network, netip.AddrPortFrom(tc.dst, tc.port), make([]byte, n))
				all = append(all, sent{fmt.Sprintf("ipv%d/%s/%s", f.Version, network, tc.name), proto, src, f, tc.dnat, tc.snt, tc.port, n})
			}
		}
	}
	time.Sleep(100 * time.Millisecond) // let the last FINs settle
	cli := l.List(t)
	var conns []connstore.Conn
	for _, v := range []uint8{4, 6} {
		var err error
		if conns, err = s.Dump(v, conns); err != nil {
			t.Fatal(err)
		}
	}
	for _, snd := range all {
		t.Run(snd.name, func(t *testing.T) {
			c, ok := find(conns, snd.proto, snd.src)
			if !ok {
				t.Fatalf("no dumped entry from %v", snd.src)
			}
			e, ok := ctlab.Find(cli, map[uint8]string{6: "tcp", 17: "udp"}[snd.proto], snd.src)
			if !ok {
				t.Fatalf("conntrack -L has no entry from %v", snd.src)
			}
			if c.Packets != e.Packets || c.Bytes != e.Bytes || c.ReversePackets != e.ReplyPackets || c.ReverseBytes != e.ReplyBytes {
				t.Errorf("counters %d/%d %d/%d, conntrack -L says %d/%d %d/%d",
					c.Packets, c.Bytes, c.ReversePackets, c.ReverseBytes, e.Packets, e.Bytes, e.ReplyPackets, e.ReplyBytes)
			}
			if c.Bytes < uint64(snd.payloadN) || c.ReverseBytes < uint64(snd.payloadN) || !c.HasCounters {
				t.Errorf("bytes %d/%d below the payload %d", c.Bytes, c.ReverseBytes, snd.payloadN)
			}
			if c.Key.Dst != e.Dst || c.Key.DstPort != snd.dstPort || c.DstAddr != e.ReplySrc || c.DstPort != e.ReplySrcPort {
				t.Errorf("key %+v endpoint %v:%d; conntrack -L %+v", c.Key, c.DstAddr, c.DstPort, e)
			}
			if c.DstAddr != snd.f.Server {
				t.Errorf("endpoint %v, want the server %v", c.DstAddr, snd.f.Server)
			}
			if snd.dnat != (c.Key.Dst == snd.f.VIP) {
				t.Errorf("original destination %v (DNAT %v)", c.Key.Dst, snd.dnat)
			}
			if snd.snat != c.SNATAddr.IsValid() || (snd.snat && c.SNATAddr != snd.f.RouterSide) {
				t.Errorf("SNAT %v:%d, want SNAT=%v to %v", c.SNATAddr, c.SNATPort, snd.snat, snd.f.RouterSide)
			}
			if c.Mark != ctlab.Mark || c.Mark != e.Mark || c.Labels[0]&0x08 == 0 {
				t.Errorf("mark %#x (conntrack -L %#x) labels %x", c.Mark, e.Mark, c.Labels)
			}
			if c.Start.IsZero() || time.Since(c.Start) > time.Minute || c.ID == 0 {
				t.Errorf("start %v id %d", c.Start, c.ID)
			}
			if snd.proto == flow.ProtoTCP && (c.TCPState == "" || c.TCPState != e.State) {
				t.Errorf("tcp state %q, conntrack -L %q", c.TCPState, e.State)
			}
		})
	}
}

// TestZones creates entries in zones 0 and 7 (ti-mo Create, kernel 6.18:
// StatusConfirmed and Flow.Zone only) and dumps zone 7 alone.
func TestZones(t *testing.T) {
	l := ctlab.New(t, "ctzone")
	c, err := ct.Dial(&netlink.Config{NetNS: nsFD(t, l.Router)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	type created struct {
		src  netip.Addr
		zone uint16
	}
	var made []created
	for _, f := range ctlab.Families {
		for i, zone := range []uint16{0, 7, 7} {
			src := f.Client.Next()
			for range i {
				src = src.Next()
			}
			fl := ct.NewFlow(flow.ProtoTCP, ct.StatusConfirmed|ct.StatusAssured|ct.StatusSeenReply, src, f.Server, 5000, 80, 120, 0x99)
			fl.Zone = zone
			fl.ProtoInfo.TCP = &ct.ProtoInfoTCP{State: 3}
			if err := c.Create(fl); err != nil {
				t.Fatalf("create %v zone %d: %v", src, zone, err)
			}
			made = append(made, created{src, zone})
		}
	}
	for _, tc := range []struct {
		name  string
		zones []uint16
		v     uint8
	}{
		{"ipv4/all zones", nil, 4}, {"ipv4/zone 7", []uint16{7}, 4},
		{"ipv6/all zones", nil, 6}, {"ipv6/zone 7", []uint16{7}, 6},
		{"ipv6/zones 0 and 7", []uint16{0, 7}, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := open(t, Config{NetNS: nsrun.Path(l.Router), IPv4: true, IPv6: true, Zones: tc.zones})
			conns, err := s.Dump(tc.v, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range made {
				if flow.Version(m.src) != tc.v {
					continue
				}
				want := len(tc.zones) == 0 || containsZone(tc.zones, m.zone)
				got, ok := find(conns, flow.ProtoTCP, netip.AddrPortFrom(m.src, 5000))
				if ok != want {
					t.Errorf("%v zone %d: dumped %v, want %v", m.src, m.zone, ok, want)
				}
				if ok && (got.Key.Zone != m.zone || got.Mark != 0x99 || got.TCPState != "ESTABLISHED") {
					t.Errorf("%v: %+v", m.src, got)
				}
			}
			for _, c := range conns {
				if c.Key.IPVersion() != tc.v {
					t.Errorf("IPv%d dump returned %v", tc.v, c.Key.Src)
				}
			}
		})
	}
}

func containsZone(zs []uint16, z uint16) bool {
	for _, x := range zs {
		if x == z {
			return true
		}
	}
	return false
}

func nsFD(t *testing.T, name string) int {
	t.Helper()
	s := open(t, Config{NetNS: name, IPv4: true})
	return int(s.ns.Fd())
}

// TestEvents listens in the router namespace, sends one UDP exchange per
// family, deletes the entries and expects NEW then DESTROY with counters.
func TestEvents(t *testing.T) {
	l := ctlab.New(t, "ctev")
	l.Echo(t)
	for _, f := range ctlab.Families {
		t.Run(fmt.Sprintf("ipv%d", f.Version), func(t *testing.T) {
			cfg := Config{NetNS: l.Router, IPv4: f.Version == 4, IPv6: f.Version == 6}
			s := open(t, cfg)
			ctx, cancel := context.WithCancel(context.Background())
			var mu sync.Mutex
			var got []connstore.Conn
			done := make(chan error, 1)
			subscribed := make(chan struct{})
			go func() {
				done <- s.ListenReady(ctx, func(b []connstore.Conn) {
					mu.Lock()
					got = append(got, b...)
					mu.Unlock()
				}, func() { close(subscribed) })
			}()
			select {
			case <-subscribed:
			case err := <-done:
				t.Fatalf("Listen: %v", err)
			}
			src := l.Exchange(t, "udp", netip.AddrPortFrom(f.VIP, ctlab.VIPPort), make([]byte, 300))
			l.Run(t, l.Router, "conntrack", "-D", "-p", "udp", "--orig-port-src", fmt.Sprint(src.Port()), "-f", map[uint8]string{4: "ipv4", 6: "ipv6"}[f.Version])
			deadline := time.Now().Add(5 * time.Second)
			var newEv, destroy *connstore.Conn
			for time.Now().Before(deadline) && destroy == nil {
				time.Sleep(20 * time.Millisecond)
				mu.Lock()
				for i := range got {
					c := &got[i]
					if c.Key.Src != src.Addr() || c.Key.SrcPort != src.Port() {
						continue
					}
					if c.Ended {
						destroy = c
					} else {
						newEv = c
					}
				}
				mu.Unlock()
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if newEv == nil || destroy == nil {
				t.Fatalf("NEW %v DESTROY %v", newEv != nil, destroy != nil)
			}
			if newEv.HasCounters || newEv.Key.Dst != f.VIP || newEv.DstAddr != f.Server {
				t.Errorf("NEW: %+v", *newEv)
			}
			if !destroy.HasCounters || destroy.Packets != 1 || destroy.ReversePackets != 1 || destroy.Bytes < 300 || destroy.Start.IsZero() {
				t.Errorf("DESTROY: %+v", *destroy)
			}
			mu.Lock()
			for _, c := range got {
				if c.Key.IPVersion() != f.Version {
					t.Errorf("event of IPv%d with only IPv%d enabled", c.Key.IPVersion(), f.Version)
				}
			}
			mu.Unlock()
		})
	}
}

// TestAccounting reads the sysctls of a namespace with them on (the lab
// router) and of a fresh one with the kernel defaults (off), while the test
// process stays in its own namespace.
func TestAccounting(t *testing.T) {
	l := ctlab.New(t, "ctacct")
	s := open(t, Config{NetNS: l.Router, IPv4: true})
	a, err := s.Accounting()
	if err != nil || !a.Acct || !a.Timestamp {
		t.Fatalf("router: %+v %v", a, err)
	}
	s = open(t, Config{NetNS: nsrun.Path(l.Client), IPv4: true})
	a, err = s.Accounting()
	if err != nil || a.Acct || a.Timestamp {
		t.Fatalf("client: %+v %v", a, err)
	}
	if err := a.Err(); err == nil || !strings.Contains(err.Error(), "nf_conntrack_acct=0") {
		t.Errorf("Err: %v", err)
	}
	if _, err := Open(Config{NetNS: "dfx-does-not-exist", IPv4: true}); err == nil {
		t.Error("missing netns: no error")
	}
}

// TestListenClosesCleanly cancels Listen while the kernel floods it, to
// check the decoder is never left blocked.
func TestListenClosesCleanly(t *testing.T) {
	l := ctlab.New(t, "ctclose")
	s := open(t, Config{NetNS: l.Router, IPv4: true, IPv6: true})
	c, err := ct.Dial(&netlink.Config{NetNS: int(s.ns.Fd())})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Listen(ctx, func([]connstore.Conn) { time.Sleep(time.Millisecond) }) }()
	for i := range 2000 {
		src := netip.AddrFrom4([4]byte{198, 18, 20, byte(i)})
		if err := c.Create(ct.NewFlow(flow.ProtoUDP, ct.StatusConfirmed, src, netip.AddrFrom4([4]byte{198, 18, 21, 1}), uint16(i), 53, 30, 0)); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, ErrEventsLost) {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Listen did not return after cancel")
	}
}

// TestEventsLost floods a tiny event socket buffer behind a slow consumer:
// the kernel drops events and Listen must say so with ErrEventsLost.
func TestEventsLost(t *testing.T) {
	l := ctlab.New(t, "ctlost")
	s := open(t, Config{NetNS: l.Router, IPv4: true, IPv6: true, ReadBuffer: 4096})
	c, err := ct.Dial(&netlink.Config{NetNS: int(s.ns.Fd())})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	subscribed := make(chan struct{})
	go func() {
		done <- s.ListenReady(ctx, func([]connstore.Conn) { time.Sleep(20 * time.Millisecond) }, func() { close(subscribed) })
	}()
	select {
	case <-subscribed:
	case err := <-done:
		t.Fatalf("Listen: %v", err)
	}
	for i := range 20000 {
		src := netip.AddrFrom4([4]byte{198, 18, byte(20 + i>>8), byte(i)})
		if i%2 == 1 {
			src = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0x20, 14: byte(i >> 8), 15: byte(i)})
		}
		dst := netip.AddrFrom4([4]byte{198, 18, 250, 1})
		if src.Is6() {
			dst = netip.MustParseAddr("fd00:10:250::1")
		}
		if err := c.Create(ct.NewFlow(flow.ProtoUDP, ct.StatusConfirmed, src, dst, 1000, 53, 30, 0)); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrEventsLost) {
			t.Fatalf("Listen returned %v, want ErrEventsLost", err)
		}
	case <-ctx.Done():
		t.Fatal("no event loss reported")
	}
}
