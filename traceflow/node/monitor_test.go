package node

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
)

// fakeNFT writes a stand-in for nft whose `nft monitor` follows a log
// file, and returns it with fake trace tables that echo each load to that
// log, as a subscribed monitor would.
func fakeNFT(t *testing.T) (string, *fakeTables) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "monitor.log")
	if err := os.WriteFile(log, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\nif [ \"$1\" = monitor ]; then exec tail -n0 -F " + log + " 2>/dev/null; fi\nexit 1\n"
	bin := filepath.Join(dir, "nft")
	if err := os.WriteFile(bin, []byte(script), 0o700); err != nil {
		t.Fatal(err)
	}
	return bin, &fakeTables{log: log, tables: map[string]bool{}}
}

// fakeTables keeps the node's trace tables in a map; a load echoes its
// post rule to the fake monitor's log. loadDelay slows every load down;
// deleteErr fails deletes while set.
type fakeTables struct {
	log       string
	loadDelay time.Duration

	mu        sync.Mutex
	tables    map[string]bool
	loading   int // loads running now
	maxLoads  int // the most at once
	deleteErr error
}

func (f *fakeTables) Load(ns string, tb observe.Table) error {
	f.mu.Lock()
	f.loading++
	f.maxLoads = max(f.maxLoads, f.loading)
	delay := f.loadDelay
	f.mu.Unlock()
	time.Sleep(delay)
	lf, err := os.OpenFile(f.log, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer lf.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.loading--
	f.tables[tb.Name] = true
	if _, err := fmt.Fprintf(lf, "add table inet %s\n", tb.Name); err != nil || tb.Canary {
		return err
	}
	_, err = fmt.Fprintf(lf, "add rule inet %s post ip saddr 198.18.1.10 counter\n", tb.Name)
	return err
}

func (f *fakeTables) Delete(ns, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.deleteErr != nil {
		return f.deleteErr
	}
	delete(f.tables, name)
	return nil
}

func (f *fakeTables) List(ns string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for n := range f.tables {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

func (f *fakeTables) names() []string { n, _ := f.List(""); return n }

var _ tableOps = (*fakeTables)(nil)

// TestWatchReturnsWhenItsContextEnds: a kernel watch that saw nothing
// returns once its context ends (the agent's handler, its watch slot and
// goroutines are freed), and again for the next watch on the shared
// monitor.
func TestWatchReturnsWhenItsContextEnds(t *testing.T) {
	needRoot(t)
	bin, tables := fakeNFT(t)
	tr := &Tracer{Name: "n1", NFT: bin, tables: tables}
	defer tr.Close()
	p := traceflow.Probe{Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.18.2.11"), Protocol: traceflow.TCP,
		DstPort: 80, SrcPort: 1234, Tag: 10}
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		ready := make(chan struct{}, 1)
		done := make(chan error, 1)
		go func() {
			done <- tr.Watch(ctx, p, func(ev traceflow.WatchEvent) error {
				if ev.Ready {
					ready <- struct{}{}
				}
				return nil
			})
		}()
		select {
		case <-ready:
		case err := <-done:
			t.Fatalf("watch %d ended before ready: %v", i, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("watch %d never ready", i)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("watch %d: %v", i, err)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("watch %d did not return after its context ended", i)
		}
		cancel()
	}
}

func zombieChildren(t *testing.T) int {
	t.Helper()
	n := 0
	tasks, _ := os.ReadDir("/proc/self/task")
	for _, task := range tasks {
		b, _ := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "children"))
		for _, pid := range strings.Fields(string(b)) {
			st, _ := os.ReadFile("/proc/" + pid + "/stat")
			if strings.Contains(string(st), ") Z ") {
				n++
			}
		}
	}
	return n
}

// TestHubReapsMonitorsThatExit: an nft monitor that exits by itself (no
// kernel support, no permission) is reaped, not left a zombie with its
// pipe, however often watches start one.
func TestHubReapsMonitorsThatExit(t *testing.T) {
	needRoot(t) // nft monitor starts in a namespace
	dir := t.TempDir()
	bin := filepath.Join(dir, "nft")
	os.WriteFile(bin, []byte("#!/bin/sh\necho 'Error: no nftables here'\nexit 1\n"), 0o700)
	h := &monitorHub{start: func() (*observe.Monitor, error) { return observe.StartMonitor("/proc/self/ns/net", bin) }}
	fds := func() int { es, _ := os.ReadDir("/proc/self/fd"); return len(es) }
	before := fds()
	for range 20 {
		s, err := h.subscribe()
		if err != nil {
			t.Fatal(err)
		}
		for range s.Lines() {
		}
		if !errors.Is(s.Err(), errMonitorExited) {
			t.Errorf("err %v", s.Err())
		}
		s.Close()
	}
	deadline := time.Now().Add(30 * time.Second)
	for zombieChildren(t) > 0 || fds() > before+4 {
		if time.Now().After(deadline) {
			t.Fatalf("%d zombie nft processes, %d fds (was %d)", zombieChildren(t), fds(), before)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHubEndsALaggingWatch: a watch that stops reading is ended with
// errLagged; the others get every line.
func TestHubEndsALaggingWatch(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	bin := filepath.Join(dir, "nft")
	os.WriteFile(bin, []byte("#!/bin/sh\nsleep 0.2\nseq 1 20000\nexec sleep 600\n"), 0o700)
	h := &monitorHub{start: func() (*observe.Monitor, error) { return observe.StartMonitor("/proc/self/ns/net", bin) }}
	defer h.close()
	stuck, err := h.subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	reader, err := h.subscribe()
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	got := 0
	for got < 20000 {
		select {
		case _, ok := <-reader.Lines():
			if !ok {
				t.Fatalf("reader ended after %d lines: %v", got, reader.Err())
			}
			got++
		case <-time.After(30 * time.Second):
			t.Fatalf("reader got %d lines", got)
		}
	}
	n := 0
	for range stuck.Lines() {
		n++
	}
	if !errors.Is(stuck.Err(), errLagged) || n != subBuffer {
		t.Errorf("stuck watch: %d lines buffered, err %v; want %d and errLagged", n, stuck.Err(), subBuffer)
	}
}
