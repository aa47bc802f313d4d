package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
)

// watchReady runs a watch of p until ready (or its end) and returns a
// function that ends it and returns its error.
func watchReady(t *testing.T, tr *Tracer, p traceflow.Probe, timeout time.Duration) (ready bool, end func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	readyC := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- tr.Watch(ctx, p, func(ev traceflow.WatchEvent) error {
			if ev.Ready {
				readyC <- struct{}{}
			}
			return nil
		})
	}()
	var err error
	select {
	case <-readyC:
		ready = true
	case err = <-done:
		done <- err
	}
	return ready, func() error {
		cancel()
		return <-done
	}
}

func probeOf(i int) traceflow.Probe {
	p := traceflow.Probe{Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.18.2.11"), Protocol: traceflow.TCP,
		DstPort: 80, SrcPort: uint16(30000 + i), Tag: uint8(1 + i%63)}
	if i%2 == 1 {
		p.Src, p.Dst = netip.MustParseAddr("fd00:10:0:1::10"), netip.MustParseAddr("fd00:10:0:2::11")
	}
	return p
}

// TestWatchesQueueForTheirLoads: 128 watches at once (an agent's limit)
// all become ready, their table loads loadSlots at a time, and every
// table is gone once they end, in both families.
func TestWatchesQueueForTheirLoads(t *testing.T) {
	needRoot(t)
	bin, tables := fakeNFT(t)
	tables.loadDelay = 5 * time.Millisecond
	tr := &Tracer{Name: "n1", NFT: bin, tables: tables}
	defer tr.Close()
	const watches = 128
	var wg sync.WaitGroup
	ends := make([]func() error, watches)
	var mu sync.Mutex
	notReady := 0
	for i := range watches {
		wg.Go(func() {
			ready, end := watchReady(t, tr, probeOf(i), 2*time.Minute)
			mu.Lock()
			defer mu.Unlock()
			ends[i] = end
			if !ready {
				notReady++
			}
		})
	}
	wg.Wait()
	for i, end := range ends {
		if err := end(); err != nil {
			t.Errorf("watch %d: %v", i, err)
		}
	}
	if notReady > 0 {
		t.Errorf("%d of %d watches never ready", notReady, watches)
	}
	if tables.maxLoads > loadSlots {
		t.Errorf("%d loads at once, want at most %d", tables.maxLoads, loadSlots)
	}
	if left := tables.names(); len(left) > 0 {
		t.Errorf("%d tables left: %v", len(left), left[:min(len(left), 5)])
	}
}

// TestTableRemovedAfterItsWatchTimedOut: a load slower than the watch's
// timeout is not killed half-way, the watch fails, and its table is
// removed all the same: the removal does not use the watch's context.
func TestTableRemovedAfterItsWatchTimedOut(t *testing.T) {
	needRoot(t)
	bin, tables := fakeNFT(t)
	tr := &Tracer{Name: "n1", NFT: bin, tables: tables}
	defer tr.Close()
	// The node's monitor subscribed (its canary echoed) ...
	if ready, end := watchReady(t, tr, probeOf(2), time.Minute); !ready {
		t.Fatal(end())
	} else {
		end()
	}
	// ... the loads become slower than the watches' timeout.
	tables.mu.Lock()
	tables.loadDelay = 300 * time.Millisecond
	tables.mu.Unlock()
	for i := range 2 { // IPv4, IPv6
		ready, end := watchReady(t, tr, probeOf(i), 50*time.Millisecond)
		err := end()
		if ready || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("watch %d: ready %v, err %v; want a timeout before ready", i, ready, err)
		}
		if left := tables.names(); len(left) > 0 {
			t.Errorf("watch %d: tables left: %v", i, left)
		}
	}
}

// TestSweep: the periodic sweep removes the tables no watch owns that are
// this agent's (a removal that failed), another agent's older than
// staleAfter, and names of an older agent; it keeps the watches' and
// another agent's recent ones. The sweep at start removes all but the
// watches'.
func TestSweep(t *testing.T) {
	needRoot(t)
	bin, tables := fakeNFT(t)
	tr := &Tracer{Name: "n1", NFT: bin, tables: tables}
	defer tr.Close()

	// A watch running (IPv6), whose table stays; one (IPv4) whose removal
	// fails.
	ready, endV6 := watchReady(t, tr, probeOf(1), time.Minute)
	if !ready {
		t.Fatal(endV6())
	}
	ready, endV4 := watchReady(t, tr, probeOf(2), time.Minute)
	if !ready {
		t.Fatal(endV4())
	}
	running := tables.names()
	tables.mu.Lock()
	tables.deleteErr = errors.New("netlink: resource busy")
	tables.mu.Unlock()
	endV4()
	tables.mu.Lock()
	tables.deleteErr = nil
	now := time.Now()
	other := func(age time.Duration) string {
		return fmt.Sprintf("%s7_%d_ffffffff1", observe.TablePrefix, now.Add(-age).Unix())
	}
	recent, old := other(time.Minute), other(staleAfter+time.Minute)
	for _, n := range []string{recent, old, observe.TablePrefix + "7"} {
		tables.tables[n] = true
	}
	tables.mu.Unlock()
	if n, err := tr.sweep(false); err != nil || n != 3 {
		t.Errorf("sweep removed %d (%v), want 3", n, err)
	}
	want := []string{recent}
	for _, n := range running { // the IPv6 watch's table, still running
		tr.mu.Lock()
		if tr.active[n] {
			want = append(want, n)
		}
		tr.mu.Unlock()
	}
	slices.Sort(want)
	if got := tables.names(); !slices.Equal(got, want) {
		t.Errorf("after the sweep: %v, want %v", got, want)
	}
	// At start, another agent's recent table goes too; a watch's stays.
	if err := tr.RemoveStaleTables(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := tables.names(); len(got) != 1 || !slices.Contains(want, got[0]) || got[0] == recent {
		t.Errorf("after RemoveStaleTables: %v", got)
	}
	endV6()
	if got := tables.names(); len(got) != 0 {
		t.Errorf("after the last watch: %v", got)
	}
}
