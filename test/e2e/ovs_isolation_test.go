package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/exporter"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/test/support/ipfixtest"
	"github.com/dualflow/dualflow/test/support/labtruth"
)

// TestOVSLabsSideBySide runs two OVS labs with the same addresses at the
// same time, as the modes of the OVS tests do in parallel, or a test next
// to `make run --datapath ovs`: both make the same connections (same
// pods, same destinations), and each lab's OVS conntrack, on both nodes,
// and the exporter on its node-1 must see the lab's own connections and
// none of the other's. The failure this guards against is a record or a
// conntrack entry of the other lab: a reply source that this lab never
// dialled.
func TestOVSLabsSideBySide(t *testing.T) {
	requireOVS(t)
	t.Parallel() // its own labs and OVS daemons
	mode := manifest.ModeDual
	recordAs(t, string(mode)+"/ovs")
	var labs [2]*sideLab
	for i := range labs {
		labs[i] = startSideLab(t, mode)
	}
	a, b := labs[0], labs[1]
	if a.l.State().Prefix == b.l.State().Prefix {
		t.Fatalf("both labs have prefix %s", a.l.State().Prefix)
	}

	// Lab a first, alone: lab b, which made no connection, must not see
	// any of a's (its exporter's records are checked at the end).
	a.dialAll(t)
	for _, node := range []string{"node-1", "node-2"} {
		for _, c := range b.conntrack(t, node) {
			if a.has(key(c.Orig)) {
				t.Errorf("lab %s %s shows lab %s's connection %v -> %v (reply from %v)", b.l.State().Prefix, node, a.l.State().Prefix,
					netip.AddrPortFrom(c.Orig.Src, c.Orig.SrcPort), netip.AddrPortFrom(c.Orig.Dst, c.Orig.DstPort), c.Reply.Src)
			}
		}
	}
	// Then both, at the same time.
	var wg sync.WaitGroup
	for _, s := range labs {
		wg.Go(func() { s.dialAll(t) })
	}
	wg.Wait()
	if t.Failed() {
		return
	}

	for i, s := range labs {
		other := labs[1-i]
		// A tuple both labs made (the same client port by chance) is
		// nobody's evidence: only the other lab's own tuples are foreign.
		foreign := map[tupleKey]bool{}
		for _, d := range other.made {
			for _, k := range []tupleKey{d.key, d.keyAfterDNAT()} {
				if !s.has(k) {
					foreign[k] = true
				}
			}
		}
		t.Run(s.l.State().Prefix, func(t *testing.T) {
			for _, node := range []string{"node-1", "node-2"} {
				conns := s.conntrack(t, node)
				for _, c := range conns {
					if foreign[key(c.Orig)] {
						t.Errorf("%s: conntrack entry of lab %s: %v:%d -> %v:%d, reply source %v:%d", node, other.l.State().Prefix,
							c.Orig.Src, c.Orig.SrcPort, c.Orig.Dst, c.Orig.DstPort, c.Reply.Src, c.Reply.SrcPort)
					}
				}
				for _, d := range s.made {
					if node == "node-2" && !d.crosses {
						continue
					}
					// node-2 sees a Service connection after node-1's DNAT.
					k := d.key
					if node == "node-2" {
						k = d.keyAfterDNAT()
					}
					j := slices.IndexFunc(conns, func(c labtruth.Conn) bool { return key(c.Orig) == k })
					if j < 0 {
						t.Errorf("%s: no conntrack entry for its own %s %v -> %v", node, d.name, d.local, d.to)
					} else if r := conns[j].Reply; r.Src != d.endpoint.Addr() || r.SrcPort != d.endpoint.Port() {
						t.Errorf("%s: %s %v -> %v: conntrack reply source %v:%d, want %v", node, d.name, d.local, d.to, r.Src, r.SrcPort, d.endpoint)
					}
				}
			}
			// Every connection starts on node-1: the exporter there
			// reports them all, and nothing of the other lab.
			var recs []flow.Record
			for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				recs = s.col.Records()
				all := true
				for k := range s.made {
					all = all && slices.ContainsFunc(recs, func(r flow.Record) bool { return origKey(r) == k })
				}
				if all || time.Now().After(deadline) {
					break
				}
			}
			for _, d := range s.made {
				if !slices.ContainsFunc(recs, func(r flow.Record) bool { return origKey(r) == d.key }) {
					t.Errorf("no exporter record of its own %s %v -> %v", d.name, d.local, d.to)
				}
			}
			for _, r := range recs {
				if foreign[origKey(r)] {
					t.Errorf("exporter record of lab %s: %v:%d -> %v:%d", other.l.State().Prefix, r.SrcAddr, r.SrcPort, r.DstAddr, r.DstPort)
				}
				if d, ok := s.made[origKey(r)]; ok && (r.DstAddr != d.endpoint.Addr() || r.DstPort != d.endpoint.Port()) {
					t.Errorf("%s from %v: record to %v:%d, want %v", d.name, d.local, r.DstAddr, r.DstPort, d.endpoint)
				}
			}
		})
	}
}

// sideLab is one of the two labs of TestOVSLabsSideBySide with its
// node-1 exporter and collector, and the connections it made.
type sideLab struct {
	l   *lab.Lab
	col *ipfixtest.Collector
	// made are the connections dialled, by original tuple.
	mu   sync.Mutex
	made map[tupleKey]dialled
}

type dialled struct {
	name      string
	key       tupleKey // original tuple
	local, to netip.AddrPort
	endpoint  netip.AddrPort // the server that answered (after DNAT)
	crosses   bool           // goes through node-2 too
}

// keyAfterDNAT is d's tuple once a Service address is translated to the
// endpoint, as the nodes after the client's see it.
func (d dialled) keyAfterDNAT() tupleKey {
	return tupleKey{d.key.proto, d.local, d.endpoint}
}

// has reports whether s made a connection with original or translated
// tuple k.
func (s *sideLab) has(k tupleKey) bool {
	for _, d := range s.made {
		if d.key == k || d.keyAfterDNAT() == k {
			return true
		}
	}
	return false
}

// tupleKey is a connection's original-direction tuple.
type tupleKey struct {
	proto    uint8
	src, dst netip.AddrPort
}

func key(t flow.Tuple) tupleKey {
	return tupleKey{t.Proto, netip.AddrPortFrom(t.Src, t.SrcPort), netip.AddrPortFrom(t.Dst, t.DstPort)}
}

// origKey is the original tuple of exporter record r: the client
// dialled the Service address when the record carries one.
func origKey(r flow.Record) tupleKey {
	k := tupleKey{r.Proto, netip.AddrPortFrom(r.SrcAddr, r.SrcPort), netip.AddrPortFrom(r.DstAddr, r.DstPort)}
	if r.ServiceAddr.IsValid() {
		k.dst = netip.AddrPortFrom(r.ServiceAddr, r.ServicePort)
	}
	return k
}

func startSideLab(t *testing.T, mode manifest.Mode) *sideLab {
	t.Helper()
	l := startLabOn(t, mode, lab.DatapathOVS)
	listen := "[::1]:0"
	if mode == manifest.ModeIPv4 {
		listen = "127.0.0.1:0"
	}
	s := &sideLab{l: l, col: ipfixtest.Start(t, ipfixtest.Options{Address: listen}), made: map[tupleKey]dialled{}}
	cfg := exporter.NewConfig()
	cfg.Source = exporter.SourceOVS
	cfg.NodeName = "node-1"
	cfg.MetricsAddr = ""
	cfg.OVS.RunDir, cfg.OVS.RulesFile = l.OVSDir("node-1"), l.OVSRulesPath()
	cfg.IPv4, cfg.IPv6 = mode.Has(corev1.IPv4Protocol), mode.Has(corev1.IPv6Protocol)
	cfg.PollInterval = 200 * time.Millisecond
	cfg.Store.IdleTimeout = time.Second
	cfg.Store.ActiveTimeout = time.Hour
	cfg.IPFIX.Address = s.col.Addr
	cfg.IPFIX.FlushInterval = 50 * time.Millisecond
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	exp, err := exporter.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := exp.Run(ctx); err != nil {
			t.Errorf("exporter of %s: %v", l.State().Prefix, err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-exp.Ready():
	case <-time.After(10 * time.Second):
		t.Fatalf("exporter of %s not ready", l.State().Prefix)
	}
	return s
}

// dialAll makes the same connections in every lab: from web on node-1 to
// api on node-1 and node-2 (TCP), to the api Service (TCP, DNAT) and to
// api on node-2 (UDP), in every family of the mode. It may run in a
// goroutine: it reports with t.Errorf.
func (s *sideLab) dialAll(t *testing.T) {
	pod := func(ns, app string, node int) *corev1.Pod {
		p, err := s.l.PodOn(ns, app, node)
		if err != nil {
			t.Errorf("%s: %v", s.l.State().Prefix, err)
		}
		return p
	}
	web1, api1, api2 := pod(manifest.NSFrontend, "web", 1), pod(manifest.NSBackend, "api", 1), pod(manifest.NSBackend, "api", 2)
	if web1 == nil || api1 == nil || api2 == nil {
		return
	}
	svc, _ := s.l.Manifest.Service(manifest.NSBackend, manifest.ServiceAPI)
	servers := map[string]*corev1.Pod{api1.Namespace + "/" + api1.Name: api1, api2.Namespace + "/" + api2.Name: api2}
	for _, f := range s.l.Mode().Families() {
		a1, _ := manifest.PodAddr(api1, f)
		a2, _ := manifest.PodAddr(api2, f)
		vip, _ := manifest.ServiceAddr(svc, f)
		for _, d := range []struct {
			name  string
			proto string
			to    netip.AddrPort
		}{
			{"tcp same node", agent.TCP, netip.AddrPortFrom(a1, manifest.PortHTTP)},
			{"tcp across nodes", agent.TCP, netip.AddrPortFrom(a2, manifest.PortHTTP)},
			{"tcp to service", agent.TCP, netip.AddrPortFrom(vip, manifest.ServicePortHTTP)},
			{"udp across nodes", agent.UDP, netip.AddrPortFrom(a2, manifest.PortUDPEcho)},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			r, err := labDial(ctx, s.l, web1, d.proto, d.to)
			cancel()
			if err != nil {
				t.Errorf("%s: %s %s -> %s: %v", s.l.State().Prefix, f, d.name, d.to, err)
				continue
			}
			srv := servers[r.Server]
			if srv == nil {
				t.Errorf("%s: %s %s answered by %q", s.l.State().Prefix, f, d.name, r.Server)
				continue
			}
			ep, _ := manifest.PodAddr(srv, f)
			port := d.to.Port()
			if d.to.Addr() == vip {
				port = manifest.PortHTTP
			}
			proto := map[string]uint8{agent.TCP: flow.ProtoTCP, agent.UDP: flow.ProtoUDP}[d.proto]
			k := tupleKey{proto, r.Local, d.to}
			s.mu.Lock()
			s.made[k] = dialled{name: fmt.Sprintf("%s %s", f, d.name), key: k, local: r.Local, to: d.to,
				endpoint: netip.AddrPortFrom(ep, port), crosses: srv == api2}
			s.mu.Unlock()
		}
	}
}

// conntrack returns node's OVS conntrack of the lab.
func (s *sideLab) conntrack(t *testing.T, node string) []labtruth.Conn {
	t.Helper()
	conns, err := labtruth.Conntrack(s.l, node)
	if err != nil {
		t.Fatalf("%s: conntrack of %s: %v", s.l.State().Prefix, node, err)
	}
	return conns
}
