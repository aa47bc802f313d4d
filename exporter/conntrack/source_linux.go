package conntrack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/mdlayher/netlink"
	ct "github.com/ti-mo/conntrack"
	"github.com/ti-mo/netfilter"
	"golang.org/x/sys/unix"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/nsrun"
)

const (
	// eventQueue is how many decoded events may wait for the store. Beyond
	// it the decoder blocks, the kernel socket buffer (Config.ReadBuffer)
	// fills, and the kernel drops events, which Listen reports as
	// ErrEventsLost.
	eventQueue = 4096
	// eventBatch is the most events handed to the callback at once.
	eventBatch = 512
)

// Source reads one namespace's conntrack table. Dump and Listen may run
// concurrently with each other; Dump calls are serialized.
type Source struct {
	cfg  Config
	ns   *os.File // the target namespace, nil for our own
	acct bool     // counters are on: entries without counters really have none

	mu   sync.Mutex // serializes dumps on conn
	conn *ct.Conn   // dump socket, dialed lazily and after errors
}

// Open opens the namespace of cfg and reads its accounting sysctls. It
// does not fail when they are off: see Accounting.
func Open(cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Source{cfg: cfg}
	if cfg.NetNS != "" {
		path := cfg.NetNS
		if !strings.Contains(path, "/") {
			path = "/run/netns/" + path
		}
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("conntrack open netns: %w", err)
		}
		s.ns = f
	}
	if a, err := s.Accounting(); err == nil {
		s.acct = a.Acct
	}
	return s, nil
}

// Close releases the dump socket and the namespace.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	if s.conn != nil {
		err = s.conn.Close()
		s.conn = nil
	}
	if s.ns != nil {
		err = errors.Join(err, s.ns.Close())
	}
	return err
}

func (s *Source) dial() (*ct.Conn, error) {
	var cfg netlink.Config
	if s.ns != nil {
		cfg.NetNS = int(s.ns.Fd())
	}
	c, err := ct.Dial(&cfg)
	if err != nil {
		return nil, fmt.Errorf("conntrack dial: %w", err)
	}
	return c, nil
}

// Dump reads every entry of IP version 4 or 6 (in each configured zone),
// appends one Conn per entry to dst and returns the extended slice. A dump
// taken while the table churns may hold an entry twice; the store's merge
// tolerates that.
func (s *Source) Dump(version uint8, dst []connstore.Conn) ([]connstore.Conn, error) {
	family := netfilter.ProtoIPv4
	if version == 6 {
		family = netfilter.ProtoIPv6
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.conn == nil {
		c, err := s.dial()
		if err != nil {
			return dst, err
		}
		s.conn = c
	}
	filters := []ct.Filter{ct.NewFilter().Family(family)}
	if len(s.cfg.Zones) > 0 {
		filters = filters[:0]
		for _, z := range s.cfg.Zones {
			filters = append(filters, ct.NewFilter().Family(family).Zone(z))
		}
	}
	for i, f := range filters {
		flows, err := s.conn.DumpFilter(f, nil)
		if err != nil {
			s.conn.Close()
			s.conn = nil
			if len(s.cfg.Zones) > 0 {
				return dst, fmt.Errorf("conntrack dump IPv%d zone %d: %w", version, s.cfg.Zones[i], err)
			}
			return dst, fmt.Errorf("conntrack dump IPv%d: %w", version, err)
		}
		for j := range flows {
			c := FromFlow(&flows[j], s.acct)
			if s.cfg.wants(c.Key.IPVersion(), c.Key.Zone) {
				dst = append(dst, c)
			}
		}
	}
	return dst, nil
}

// Listen subscribes to NEW and DESTROY events of the selected families and
// zones and hands them to fn in batches (at most eventBatch, each slice
// reused after fn returns) until ctx is done, when it returns nil. It
// returns ErrEventsLost when the kernel dropped events, or another error
// when the socket fails; the caller may call it again. fn runs on Listen's
// goroutine. NEW events carry no counters (HasCounters false); DESTROY
// events carry the final ones and Ended.
func (s *Source) Listen(ctx context.Context, fn func([]connstore.Conn)) error {
	return s.ListenReady(ctx, fn, nil)
}

// ListenReady is Listen that also calls ready (if not nil), on Listen's
// goroutine, once the subscription is in place: every event after that
// reaches fn (or is reported lost). A dump started after ready misses
// nothing that happens in between. ready is not called when subscribing
// fails.
func (s *Source) ListenReady(ctx context.Context, fn func([]connstore.Conn), ready func()) error {
	c, err := s.dial()
	if err != nil {
		return err
	}
	if s.cfg.ReadBuffer > 0 {
		// Best effort: the kernel caps it at rmem_max.
		_ = c.SetReadBuffer(s.cfg.ReadBuffer)
	}
	events := make(chan ct.Event, eventQueue)
	errs, err := c.Listen(events, 1, []netfilter.NetlinkGroup{netfilter.GroupCTNew, netfilter.GroupCTDestroy})
	if err != nil {
		c.Close()
		return fmt.Errorf("conntrack listen: %w", err)
	}
	defer closeDraining(c, events, errs)
	if ready != nil {
		ready()
	}
	batch := make([]connstore.Conn, 0, eventBatch)
	add := func(ev ct.Event) {
		if ev.Flow == nil || (ev.Type != ct.EventNew && ev.Type != ct.EventDestroy) {
			return
		}
		conn := FromFlow(ev.Flow, ev.Type == ct.EventDestroy && s.acct)
		if !s.cfg.wants(conn.Key.IPVersion(), conn.Key.Zone) {
			return
		}
		if ev.Type == ct.EventNew {
			// A NEW event's counters are not the connection's.
			conn.HasCounters = false
			conn.Packets, conn.Bytes, conn.ReversePackets, conn.ReverseBytes = 0, 0, 0, 0
		}
		conn.Ended = ev.Type == ct.EventDestroy
		batch = append(batch, conn)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-errs:
			if errors.Is(err, unix.ENOBUFS) {
				return ErrEventsLost
			}
			return fmt.Errorf("conntrack events: %w", err)
		case ev := <-events:
			add(ev)
		more:
			for len(batch) < eventBatch {
				select {
				case ev := <-events:
					add(ev)
				default:
					break more
				}
			}
			if len(batch) > 0 {
				fn(batch)
				batch = batch[:0]
			}
		}
	}
}

// closeDraining closes an event socket. ti-mo's Close waits for its
// decoder, which may be blocked sending on events or errs, so both are
// drained until Close returns.
func closeDraining(c *ct.Conn, events chan ct.Event, errs chan error) {
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-events:
			case <-errs:
			case <-done:
				return
			}
		}
	}()
	c.Close()
	close(done)
}

// Accounting reads nf_conntrack_acct, nf_conntrack_timestamp and
// nf_conntrack_events in the source's namespace.
func (s *Source) Accounting() (Accounting, error) {
	var a Accounting
	names := []string{"nf_conntrack_acct", "nf_conntrack_timestamp", "nf_conntrack_events"}
	vals := make([]string, len(names))
	read := func() error {
		for i, n := range names {
			b, err := os.ReadFile("/proc/sys/net/netfilter/" + n)
			if err != nil {
				return fmt.Errorf("conntrack sysctl: %w", err)
			}
			vals[i] = strings.TrimSpace(string(b))
		}
		return nil
	}
	var err error
	if s.ns == nil {
		err = read()
	} else {
		// /proc/sys/net shows the namespace of the reading thread: read
		// on a thread of its own that joined the source's namespace.
		err = nsrun.OnThrowawayThread(func() error {
			if err := unix.Setns(int(s.ns.Fd()), unix.CLONE_NEWNET); err != nil {
				return fmt.Errorf("setns: %w", err)
			}
			return read()
		})
	}
	if err != nil {
		return a, err
	}
	a.Acct, a.Timestamp, a.Events = vals[0] != "0", vals[1] != "0", vals[2] != "0"
	return a, nil
}
