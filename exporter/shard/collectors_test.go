package shard

import (
	"context"
	"testing"
	"time"

	"github.com/dualflow/dualflow/exporter/ipfix"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/test/support/ipfixtest"
)

// TestCollectors runs two nodes' sharders, given the same three real
// collectors, in each mode: both halves of every connection reach the same
// collector; when one collector goes away its share moves to the others
// after the failover timeout, and returns when it is back.
func TestCollectors(t *testing.T) {
	for _, mode := range []struct {
		name   string
		v      uint8 // records' family; 0: both
		listen [3]string
	}{
		{"ipv4", 4, [3]string{"127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0"}},
		{"ipv6", 6, [3]string{"[::1]:0", "[::1]:0", "[::1]:0"}},
		{"dual-stack", 0, [3]string{"127.0.0.1:0", "[::1]:0", "127.0.0.1:0"}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			var cols [3]*ipfixtest.Collector
			addrs := make([]string, len(cols))
			for i := range cols {
				cols[i] = ipfixtest.Start(t, ipfixtest.Options{Address: mode.listen[i]})
				addrs[i] = cols[i].Addr
			}
			node := func(domain uint32) *Sharder {
				s := newSharder(t, Config{Collectors: addrs, FailoverTimeout: 300 * time.Millisecond, CheckInterval: 10 * time.Millisecond,
					Logger: quiet, IPFIX: ipfix.Config{ObservationDomainID: domain, FlushInterval: 20 * time.Millisecond,
						BackoffMin: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond, DrainTimeout: 2 * time.Second}})
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { done <- s.Run(ctx) }()
				t.Cleanup(func() {
					cancel()
					select {
					case err := <-done:
						if err != nil {
							t.Error(err)
						}
					case <-time.After(10 * time.Second):
						t.Error("Run did not return")
					}
				})
				return s
			}
			nodeA, nodeB := node(1), node(2)
			waitFor(t, "both nodes connected to every collector", func() bool {
				return nodeA.Stats().Connected && nodeB.Stats().Connected
			})

			const n = 600
			// batch exports connections first..first+n-1: their source
			// halves from node a, their destination halves from node b.
			batch := func(first int) {
				src, dst := make([]flow.Record, n), make([]flow.Record, n)
				for i := range n {
					v := mode.v
					if v == 0 {
						v = 4 + 2*uint8(i%2)
					}
					src[i], dst[i] = connHalves(v, first+i)
				}
				nodeA.Export(src)
				nodeB.Export(dst)
			}
			// paired waits until every half of connections first..first+n-1
			// arrived, checks both halves of each are at one collector, and
			// returns how many connections each collector got.
			paired := func(first int, at []int) [3]int {
				t.Helper()
				type got struct{ col, a, b int }
				var conns map[int]*got
				waitFor(t, "every half arrived", func() bool {
					conns = map[int]*got{}
					halves := 0
					for _, i := range at {
						for _, r := range cols[i].Records() {
							id := int(r.BytesDelta)
							if id < first || id >= first+n {
								continue
							}
							halves++
							g := conns[id]
							if g == nil {
								g = &got{col: i}
								conns[id] = g
							}
							if g.col != i {
								t.Fatalf("connection %d split between %s and %s", id, addrs[g.col], addrs[i])
							}
							switch r.ExporterNode {
							case "node-a":
								g.a++
							case "node-b":
								g.b++
							}
						}
					}
					return halves >= 2*n
				})
				var per [3]int
				for id, g := range conns {
					if g.a != 1 || g.b != 1 {
						t.Fatalf("connection %d: %d source and %d destination halves at %s", id, g.a, g.b, addrs[g.col])
					}
					per[g.col]++
				}
				return per
			}

			batch(0)
			per := paired(0, []int{0, 1, 2})
			for i, c := range per {
				if c == 0 {
					t.Fatalf("collector %s got no connection: %v", addrs[i], per)
				}
			}

			// Collector 2 goes away: after the failover timeout its share
			// goes to the others.
			cols[2].Stop()
			waitFor(t, "both nodes failed collector 2 over", func() bool {
				return nodeA.failovers.Load() >= 1 && nodeB.failovers.Load() >= 1
			})
			batch(n)
			per = paired(n, []int{0, 1})
			if per[0] == 0 || per[1] == 0 {
				t.Fatalf("survivors' connections %v", per)
			}

			// It comes back: its share returns.
			cols[2] = ipfixtest.Start(t, ipfixtest.Options{Address: addrs[2]})
			ks := make([]uint64, n)
			for i := range ks {
				src, _ := connHalves(4+2*uint8(i%2), 2*n+i)
				ks[i] = Key(&src)
			}
			waitFor(t, "both nodes route to collector 2 again", func() bool {
				back := 0
				for _, k := range ks {
					if nodeA.Pick(k) == addrs[2] && nodeB.Pick(k) == addrs[2] {
						back++
					}
				}
				return back > 0
			})
			batch(2 * n)
			per = paired(2*n, []int{0, 1, 2})
			if per[2] == 0 {
				t.Fatalf("the recovered collector got no connection: %v", per)
			}
			for _, s := range []*Sharder{nodeA, nodeB} {
				if st := s.Stats(); st.DroppedBufferFull+st.DroppedInvalid+st.DroppedOversize != 0 {
					t.Errorf("drops: %+v", st)
				}
			}
		})
	}
}
