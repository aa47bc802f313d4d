package node

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/dualflow/dualflow/traceflow/observe"
)

// monitorLinger is how long the node's `nft monitor` outlives its last
// watch: traces come in bursts (a dual trace, a UI page of them), and a
// monitor that is already subscribed makes a watch ready in one table load
// instead of a process start and a subscription race.
const monitorLinger = 30 * time.Second

// subBuffer is the lines a watch may lag behind the monitor.
const subBuffer = 1024

// errMonitorExited: the node's nft monitor exited during a watch.
var errMonitorExited = errors.New("nft monitor exited")

// monitorHub shares one `nft monitor` of the node among the watches.
type monitorHub struct {
	start func() (*observe.Monitor, error)

	mu    sync.Mutex
	mon   *observe.Monitor
	subs  map[*monitorSub]struct{}
	idle  *time.Timer
	gen   int // bumps at each monitor start
	ended chan struct{}
}

// monitorSub is one watch's view of the monitor's lines.
type monitorSub struct {
	h     *monitorHub
	lines chan string
	done  chan struct{}
	once  sync.Once
}

// Lines returns the monitor's lines since the subscription; the channel
// closes when the monitor exits.
func (s *monitorSub) Lines() <-chan string { return s.lines }

// WaitFor reads lines until one starts with prefix; lines read meanwhile
// are returned.
func (s *monitorSub) WaitFor(ctx context.Context, prefix string) ([]string, error) {
	var seen []string
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				return seen, errMonitorExited
			}
			if strings.HasPrefix(l, prefix) {
				return seen, nil
			}
			seen = append(seen, l)
		case <-ctx.Done():
			return seen, fmt.Errorf("nft monitor: waiting for %q: %w", prefix, ctx.Err())
		}
	}
}

// Close ends the subscription.
func (s *monitorSub) Close() {
	s.once.Do(func() {
		close(s.done)
		s.h.unsubscribe(s)
	})
}

// subscribe returns a subscription to the node's monitor, starting it if
// needed. fresh reports whether the monitor was just started (it may not be
// subscribed to the kernel's events yet).
func (h *monitorHub) subscribe() (s *monitorSub, fresh bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	if h.mon == nil {
		mon, err := h.start()
		if err != nil {
			return nil, false, err
		}
		h.mon, h.subs, h.ended, fresh = mon, map[*monitorSub]struct{}{}, make(chan struct{}), true
		h.gen++
		go h.fanOut(mon, h.gen, h.ended)
	}
	s = &monitorSub{h: h, lines: make(chan string, subBuffer), done: make(chan struct{})}
	h.subs[s] = struct{}{}
	return s, fresh, nil
}

func (h *monitorHub) unsubscribe(s *monitorSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; !ok {
		return
	}
	delete(h.subs, s)
	if len(h.subs) == 0 && h.mon != nil {
		gen := h.gen
		h.idle = time.AfterFunc(monitorLinger, func() { h.stopIdle(gen) })
	}
}

// stopIdle stops monitor generation gen if it still has no watch.
func (h *monitorHub) stopIdle(gen int) {
	h.mu.Lock()
	if h.gen != gen || len(h.subs) > 0 || h.mon == nil {
		h.mu.Unlock()
		return
	}
	mon := h.mon
	h.mon, h.idle = nil, nil
	h.mu.Unlock()
	mon.Close()
}

// close stops the monitor now (the agent stops).
func (h *monitorHub) close() {
	h.mu.Lock()
	mon := h.mon
	h.mon = nil
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	h.mu.Unlock()
	if mon != nil {
		mon.Close()
	}
}

// fanOut copies each line of mon to every subscription; a subscription
// that lags by more than subBuffer lines holds the others back (a watch
// reads its lines at once, so this is a loaded machine, not a lost line).
// When mon exits, every subscription's channel closes and the next
// subscribe starts a new monitor.
func (h *monitorHub) fanOut(mon *observe.Monitor, gen int, ended chan struct{}) {
	defer close(ended)
	var subs []*monitorSub
	for l := range mon.Lines() {
		h.mu.Lock()
		subs = subs[:0]
		for s := range h.subs {
			subs = append(subs, s)
		}
		h.mu.Unlock()
		for _, s := range subs {
			select {
			case s.lines <- l:
			case <-s.done:
			}
		}
	}
	h.mu.Lock()
	if h.gen == gen {
		for s := range h.subs {
			close(s.lines)
		}
		h.subs = map[*monitorSub]struct{}{}
		if h.mon == mon {
			h.mon = nil
		}
	}
	h.mu.Unlock()
}
