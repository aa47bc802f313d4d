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

// subBuffer is the lines a watch may lag behind the monitor before it is
// ended.
const subBuffer = 4096

// lagTimeout is how long the fan-out waits for a watch whose buffer is
// full before it ends that watch.
const lagTimeout = 5 * time.Second

// errMonitorExited: the node's nft monitor exited during a watch.
var errMonitorExited = errors.New("nft monitor exited")

// monitorHub shares one `nft monitor` of the node among the watches.
type monitorHub struct {
	start func() (*observe.Monitor, error)
	// canary, when set, proves that a monitor just started is subscribed
	// to the kernel's events (before that, a table load is not echoed):
	// it runs once per monitor, on a subscription of its own, and returns
	// true once the monitor echoed what it loaded. The watches wait for
	// it instead of each reloading its table until echoed (128 watches at
	// once would reload hundreds of times). nil: a watch's echo
	// (confirm) is the only proof.
	canary func(s *monitorSub) bool
	wg     sync.WaitGroup // the canaries running; close waits for them

	mu    sync.Mutex
	mon   *observe.Monitor
	subs  map[*monitorSub]struct{}
	idle  *time.Timer
	gen   int           // bumps at each monitor start
	ended chan struct{} // closed when the monitor's output ends
	// ready is closed once the monitor is known to be subscribed to the
	// kernel's events (the canary's or a watch's load echoed): every later
	// load is echoed.
	ready     chan struct{}
	readyDone bool
}

// monitorSub is one watch's view of the monitor's lines.
type monitorSub struct {
	h      *monitorHub
	lines  chan string
	done   chan struct{}
	once   sync.Once
	lagged bool // set before lines is closed
	// ready and ended are the hub's of the monitor subscribed to: closed
	// once it is known subscribed, and when it exits.
	ready, ended <-chan struct{}
}

// errLagged: a watch fell too far behind the node's nft monitor.
var errLagged = errors.New("the watch fell behind the node's nft monitor (is its controller still reading?)")

// Err says why Lines closed.
func (s *monitorSub) Err() error {
	if s.lagged {
		return errLagged
	}
	return errMonitorExited
}

// Lines returns the monitor's lines since the subscription; the channel
// closes when the monitor exits.
func (s *monitorSub) Lines() <-chan string { return s.lines }

// WaitFor reads lines until one starts with prefix (e.g. the "add rule"
// echo of a table just loaded, proving the monitor is subscribed),
// dropping the lines before it.
func (s *monitorSub) WaitFor(ctx context.Context, prefix string) error {
	for {
		select {
		case l, ok := <-s.lines:
			if !ok {
				return errMonitorExited
			}
			if strings.HasPrefix(l, prefix) {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("nft monitor: waiting for %q: %w", prefix, ctx.Err())
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

// subscribe returns a subscription to the node's monitor, starting it
// (and its canary) if needed. Until the subscription's ready is closed, a
// table load may not be echoed.
func (h *monitorHub) subscribe() (*monitorSub, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.idle != nil {
		h.idle.Stop()
		h.idle = nil
	}
	started := false
	if h.mon == nil {
		mon, err := h.start()
		if err != nil {
			return nil, err
		}
		h.mon, h.subs, h.ended = mon, map[*monitorSub]struct{}{}, make(chan struct{})
		h.ready, h.readyDone = make(chan struct{}), false
		h.gen++
		go h.fanOut(mon, h.gen, h.ended)
		started = true
	}
	if started && h.canary != nil {
		cs := h.newSub()
		h.wg.Go(func() {
			defer cs.Close()
			if h.canary(cs) {
				h.confirm(cs)
			}
		})
	}
	return h.newSub(), nil
}

// newSub adds a subscription; h.mu must be held.
func (h *monitorHub) newSub() *monitorSub {
	s := &monitorSub{h: h, lines: make(chan string, subBuffer), done: make(chan struct{}), ready: h.ready, ended: h.ended}
	h.subs[s] = struct{}{}
	return s
}

// confirm records that the monitor s listens to echoed a load: it is
// subscribed.
func (h *monitorHub) confirm(s *monitorSub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok && !h.readyDone {
		h.readyDone = true
		close(h.ready)
	}
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

// close stops the monitor now (the agent stops), and waits for its
// canary.
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
	h.wg.Wait() // a canary ends once its monitor's lines do
}

// fanOut copies each line of mon to every subscription; a subscription
// whose buffer stays full for lagTimeout is ended (its watch fails with
// errLagged) instead of holding the others back longer.
// When mon exits, every subscription's channel closes and the next
// subscribe starts a new monitor.
func (h *monitorHub) fanOut(mon *observe.Monitor, gen int, ended chan struct{}) {
	defer close(ended)
	var subs []*monitorSub
	lag := time.NewTimer(lagTimeout)
	lag.Stop()
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
				continue
			case <-s.done:
				continue
			default:
			}
			lag.Reset(lagTimeout)
			select {
			case s.lines <- l:
			case <-s.done:
			case <-lag.C:
				// The watch stayed subBuffer lines behind for lagTimeout
				// (its controller stopped reading): end it rather than
				// hold every other watch of the node, and nft, back.
				h.mu.Lock()
				if _, ok := h.subs[s]; ok {
					delete(h.subs, s)
					s.lagged = true
					close(s.lines)
				}
				h.mu.Unlock()
			}
		}
	}
	h.mu.Lock()
	current := h.gen == gen && h.mon == mon
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
	if current {
		// nft exited (or its output stopped) by itself: reap it. A
		// monitor stopped by stopIdle or close is reaped there.
		mon.Close()
	}
}
