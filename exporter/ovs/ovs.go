// Package ovs reads Open vSwitch as a flow source, the way the exporter
// reads kernel conntrack (package exporter/conntrack): connections from
// OVS's connection tracker, counters from OpenFlow flow statistics, and
// denied connections from the packet-ins of drop flows. It talks to a
// running ovs-vswitchd through its CLIs (ovs-appctl, ovs-ofctl), each run
// under a timeout, and parses their text output with the top-level
// package ovs (the vocabulary it shares with traceflow/node); malformed
// output is skipped and counted in dualflow_exporter_ovs_parse_errors_total,
// never fatal.
//
// The cookie layout and the rules file that maps rule IDs to names are
// the contract with the datapath; see ovs.Cookie and ovs.Rules.
package ovs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dualflow/dualflow/exporter/connstore"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/ovs"
)

// SourceName is the flow.Record.Source of every record of this package.
const SourceName = "ovs"

// Defaults of Config.
const (
	DefaultDeniedIdle      = 2 * time.Second
	DefaultDeniedActive    = 60 * time.Second
	DefaultDeniedMaxFlows  = 65536 // ~10 MB of denied-flow state
	deniedTick             = 250 * time.Millisecond
	monitorRestartInterval = time.Second
)

// Config selects the ovs-vswitchd to read.
type Config struct {
	// RunDir is the OVS run directory of the target ovs-vswitchd (its
	// OVS_RUNDIR: where ovs-vswitchd.pid, the control socket and
	// <bridge>.mgmt live). Empty uses the CLIs' default
	// (/var/run/openvswitch).
	RunDir string
	// Bridge is the bridge whose flows are read (default br-int).
	Bridge string
	// Zones restricts the conntrack dump to these zones (empty: all).
	Zones []uint16
	// RulesFile maps rule IDs to names (see Rules); optional. It is read
	// again when it changes.
	RulesFile string
	// IPv4 and IPv6 enable each family.
	IPv4, IPv6 bool
	// CommandTimeout bounds every CLI run (default 5s).
	CommandTimeout time.Duration
	// Appctl and Ofctl are the CLI binaries (default from PATH).
	Appctl, Ofctl string
	// DeniedIdle is how long a denied flow must see no drop before its
	// record is exported (default 2s); DeniedActive how often a flow that
	// keeps being dropped is exported (default 60s); DeniedMaxFlows bounds
	// the denied flows tracked at once.
	DeniedIdle, DeniedActive time.Duration
	DeniedMaxFlows           int
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	c.Bridge = cmp.Or(c.Bridge, ovs.DefaultBridge)
	c.CommandTimeout = cmp.Or(c.CommandTimeout, ovs.DefaultCommandTimeout)
	c.Appctl = cmp.Or(c.Appctl, "ovs-appctl")
	c.Ofctl = cmp.Or(c.Ofctl, "ovs-ofctl")
	c.DeniedIdle = cmp.Or(c.DeniedIdle, DefaultDeniedIdle)
	c.DeniedActive = cmp.Or(c.DeniedActive, DefaultDeniedActive)
	c.DeniedMaxFlows = cmp.Or(c.DeniedMaxFlows, DefaultDeniedMaxFlows)
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if !c.IPv4 && !c.IPv6 {
		errs = append(errs, errors.New("ovs source: neither IPv4 nor IPv6 enabled"))
	}
	if c.CommandTimeout <= 0 || c.DeniedIdle <= 0 || c.DeniedActive <= 0 || c.DeniedMaxFlows <= 0 {
		errs = append(errs, errors.New("ovs source: timeouts and bounds must be positive"))
	}
	return errors.Join(errs...)
}

// Source reads one ovs-vswitchd. Dump and Denied may run concurrently;
// Dump itself must not be called concurrently (the exporter's poll
// goroutine owns it).
type Source struct {
	cfg Config
	m   *metrics

	mu       sync.Mutex
	rules    *ovs.Rules
	rulesMod time.Time
	logged   time.Time // last parse-error log

	// Dump state (poll goroutine only).
	pending [2][]connstore.Conn // the other family of the last snapshot
	hasPend [2]bool
	starts  map[connstore.Key]time.Time // first sighting's start estimate, stable across polls
}

// New returns a source for cfg (after SetDefaults and Validate), with its
// metrics registered on reg (nil: not registered).
func New(cfg Config, reg prometheus.Registerer) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Source{cfg: cfg, m: newMetrics(reg), starts: map[connstore.Key]time.Time{}}, nil
}

// Close releases nothing yet; it exists for the exporter's source interface.
func (s *Source) Close() error { return nil }

// run runs one CLI with the timeout and OVS_RUNDIR and returns its stdout.
func (s *Source) run(ctx context.Context, what string, argv ...string) (string, error) {
	out, err := ovs.Run(ctx, s.cfg.RunDir, s.cfg.CommandTimeout, argv...)
	if err != nil {
		s.m.commandErrors.WithLabelValues(what).Inc()
		return "", fmt.Errorf("%s: %w", what, err)
	}
	return out, nil
}

// parseFailed counts n parse errors of source and logs the first error at
// most once a minute.
func (s *Source) parseFailed(source string, n int, err error) {
	if n == 0 {
		return
	}
	s.m.parseErrors.WithLabelValues(source).Add(float64(n))
	s.mu.Lock()
	defer s.mu.Unlock()
	if time.Since(s.logged) >= time.Minute {
		s.logged = time.Now()
		slog.Warn("unparsable OVS output skipped", "source", source, "lines", n, "err", err)
	}
}

// currentRules returns the rules, reading the rules file again when its
// modification time changed.
func (s *Source) currentRules() *ovs.Rules {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cfg.RulesFile == "" {
		return s.rules
	}
	st, err := os.Stat(s.cfg.RulesFile)
	if err != nil || st.ModTime().Equal(s.rulesMod) {
		return s.rules
	}
	r, err := ovs.LoadRules(s.cfg.RulesFile)
	if err != nil {
		s.m.parseErrors.WithLabelValues(parseRules).Inc()
		return s.rules
	}
	s.rules, s.rulesMod = r, st.ModTime()
	return s.rules
}

// Snapshot is one reading of the connection tracker and the flow table.
type Snapshot struct {
	Conns []ovs.Entry
	Flows []ovs.Flow
	Taken time.Time
}

// Snapshot runs dump-conntrack (per zone) and dump-flows and parses them.
// Unparsable lines are skipped and counted.
func (s *Source) Snapshot(ctx context.Context) (*Snapshot, error) {
	snap := &Snapshot{Taken: time.Now()}
	zones := []string{""}
	if len(s.cfg.Zones) > 0 {
		zones = zones[:0]
		for _, z := range s.cfg.Zones {
			zones = append(zones, "zone="+strconv.Itoa(int(z)))
		}
	}
	for _, z := range zones {
		argv := []string{s.cfg.Appctl, "-T", strconv.Itoa(max(1, int(s.cfg.CommandTimeout/time.Second))), "-t", "ovs-vswitchd", "dpctl/dump-conntrack", "-m"}
		if z != "" {
			argv = append(argv, z)
		}
		out, err := s.run(ctx, "dump-conntrack", argv...)
		if err != nil {
			return nil, err
		}
		bad, perr := ovs.ParseConntrack(out, func(e *ovs.Entry) { snap.Conns = append(snap.Conns, *e) })
		s.parseFailed(parseConntrack, bad, perr)
	}
	out, err := s.run(ctx, "dump-flows", s.cfg.Ofctl, "--no-names", "dump-flows", s.cfg.Bridge)
	if err != nil {
		return nil, err
	}
	bad, perr := ovs.ParseFlows(out, func(f *ovs.Flow) { snap.Flows = append(snap.Flows, *f) })
	s.parseFailed(parseFlows, bad, perr)
	return snap, nil
}

// Counter is the statistics of one per-connection counter flow.
type Counter struct {
	Packets, Bytes uint64 // IP bytes (frame bytes minus the Ethernet header)
	Age            time.Duration
}

// Counters indexes the snapshot's per-connection counter flows (KindConn)
// by the tuple they match.
func (sn *Snapshot) Counters() map[flow.Tuple]Counter {
	out := make(map[flow.Tuple]Counter, len(sn.Flows))
	for i := range sn.Flows {
		f := &sn.Flows[i]
		if k, _, ok := ovs.SplitCookie(f.Cookie); !ok || k != ovs.KindConn {
			continue
		}
		t, ok := ovs.MatchTuple(f.Match)
		if !ok {
			continue
		}
		c := Counter{Packets: f.Packets, Bytes: f.Bytes, Age: f.Duration}
		if c.Bytes >= ethHeaderLen*c.Packets {
			c.Bytes -= ethHeaderLen * c.Packets
		}
		out[t] = c
	}
	return out
}

// RuleStats sums the statistics of the snapshot's allow and drop flows per
// rule ID, named from rules.
func (sn *Snapshot) RuleStats(rules *ovs.Rules) []RuleStat {
	idx := map[uint64]int{}
	var out []RuleStat
	for i := range sn.Flows {
		f := &sn.Flows[i]
		k, id, ok := ovs.SplitCookie(f.Cookie)
		if !ok || (k != ovs.KindAllow && k != ovs.KindDrop) {
			continue
		}
		key := ovs.Cookie(k, id)
		j, seen := idx[key]
		if !seen {
			r, known := rules.Lookup(id)
			if !known {
				r = ovs.Rule{ID: id, Kind: k, Name: rules.ReportedName(id), Index: -1}
			}
			r.Kind = k
			j = len(out)
			idx[key] = j
			out = append(out, RuleStat{Rule: r})
		}
		out[j].Packets += f.Packets
		out[j].Bytes += f.Bytes
	}
	return out
}

// Dump returns the connections of IP version 4 or 6 appended to dst, as
// connstore observations. One snapshot serves both families: the call for
// the first enabled family takes it and keeps the other family's part for
// the next call, so a poll that dumps IPv4 then IPv6 runs the CLIs once.
func (s *Source) Dump(version uint8, dst []connstore.Conn) ([]connstore.Conn, error) {
	fi := 0
	if version == 6 {
		fi = 1
	}
	if s.hasPend[fi] {
		s.hasPend[fi] = false
		dst = append(dst, s.pending[fi]...)
		clear(s.pending[fi])
		s.pending[fi] = s.pending[fi][:0]
		return dst, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*s.cfg.CommandTimeout)
	defer cancel()
	snap, err := s.Snapshot(ctx)
	if err != nil {
		return dst, err
	}
	rules := s.currentRules()
	s.m.rules.set(snap.RuleStats(rules))
	counters := snap.Counters()
	seen := make(map[connstore.Key]bool, len(snap.Conns))
	for i := range snap.Conns {
		e := &snap.Conns[i]
		v := flow.Version(e.Orig.Src)
		if (v == 4 && !s.cfg.IPv4) || (v == 6 && !s.cfg.IPv6) {
			continue
		}
		c := s.conn(e, counters, snap.Taken)
		seen[c.Key] = true
		if v == version {
			dst = append(dst, c)
			continue
		}
		oi := 1 - fi
		s.pending[oi] = append(s.pending[oi], c)
	}
	other := 1 - fi
	s.hasPend[other] = (other == 0 && s.cfg.IPv4) || (other == 1 && s.cfg.IPv6)
	for k := range s.starts {
		if !seen[k] {
			delete(s.starts, k)
		}
	}
	return dst, nil
}

// conn turns a conntrack entry and its counter flows into an observation.
func (s *Source) conn(e *ovs.Entry, counters map[flow.Tuple]Counter, taken time.Time) connstore.Conn {
	orig := e.Orig
	if orig.Proto == flow.ProtoICMP || orig.Proto == flow.ProtoICMPv6 {
		// The exporter keys ICMP connections by echo id, like the kernel
		// source: id as source port, type/code in the destination port.
		orig.SrcPort = e.ICMPID
		orig.DstPort = uint16(e.ICMPType)<<8 | uint16(e.ICMPCode)
	}
	c := connstore.Conn{
		Key: connstore.Key{Tuple: orig, Zone: e.Zone}, ID: e.ID,
		DstAddr: e.Reply.Src, DstPort: e.Reply.SrcPort,
		TCPState: e.TCPState, Mark: e.Mark,
	}
	if orig.Proto == flow.ProtoICMP || orig.Proto == flow.ProtoICMPv6 {
		c.DstAddr, c.DstPort = e.Reply.Src, orig.DstPort
	}
	if e.Reply.Dst != e.Orig.Src || (e.Reply.DstPort != e.Orig.SrcPort && orig.Proto != flow.ProtoICMP && orig.Proto != flow.ProtoICMPv6) {
		c.SNATAddr, c.SNATPort = e.Reply.Dst, e.Reply.DstPort
	}
	for i := 0; i < 8; i++ {
		c.Labels[i] = byte(e.LabelHi >> (56 - 8*i))
		c.Labels[8+i] = byte(e.LabelLo >> (56 - 8*i))
	}
	switch {
	case e.HasCounters: // kernel datapath with -s
		c.Packets, c.Bytes, c.ReversePackets, c.ReverseBytes = e.OrigPackets, e.OrigBytes, e.ReplyPackets, e.ReplyBytes
		c.HasCounters = true
	default:
		ok, rk := ovs.CounterKeys(e)
		oc, okO := counters[ok]
		rc, okR := counters[rk]
		if okO || okR {
			c.Packets, c.Bytes, c.ReversePackets, c.ReverseBytes = oc.Packets, oc.Bytes, rc.Packets, rc.Bytes
			c.HasCounters = true
		}
		if okO && oc.Age > 0 && e.Start.IsZero() {
			// The counter flow was learned when the connection was
			// committed: its age dates the connection. The first estimate
			// is kept so that the start is stable across polls.
			if st, ok := s.starts[c.Key]; ok {
				c.Start = st
			} else {
				c.Start = taken.Add(-oc.Age).Truncate(time.Millisecond)
				s.starts[c.Key] = c.Start
			}
		}
	}
	if !e.Start.IsZero() {
		c.Start = e.Start
	}
	return c
}

// Listen has nothing to listen to: OVS's conntrack has no event stream
// the CLIs expose. It blocks until ctx is done and returns nil.
func (s *Source) Listen(ctx context.Context, _ func([]connstore.Conn)) error {
	<-ctx.Done()
	return nil
}

// Denied runs `ovs-ofctl monitor` on the bridge until ctx is done and
// calls fn with records of denied flows: one per flow (tuple and drop
// rule) once it has been idle for DeniedIdle, and every DeniedActive
// while drops go on. Each record names the drop rule (Ingress or Egress
// ReportedName, ReportedVerdict denied). The monitor is restarted after
// a failure. fn is called from one goroutine. At the end the remaining
// flows are passed with reason forced end.
func (s *Source) Denied(ctx context.Context, fn func([]flow.Record)) error {
	tbl := newDeniedTable(s.cfg.DeniedIdle, s.cfg.DeniedActive, s.cfg.DeniedMaxFlows)
	pis := make(chan ovs.PacketIn, 1024) // bounded: when full the packet is counted as overflow and dropped
	var wg sync.WaitGroup
	mctx, stop := context.WithCancel(ctx)
	wg.Go(func() { s.monitorLoop(mctx, pis) })
	tick := time.NewTicker(deniedTick)
	defer tick.Stop()
	var recs []flow.Record
	for {
		select {
		case pi := <-pis:
			s.m.deniedPackets.Inc()
			before := tbl.overflow
			tbl.add(&pi, time.Now())
			if tbl.overflow != before {
				s.m.deniedDropped.Inc()
			}
		case now := <-tick.C:
			if recs = tbl.expire(now, false, s.currentRules(), recs[:0]); len(recs) > 0 {
				fn(recs)
			}
		case <-ctx.Done():
			stop()
			wg.Wait()
			if recs = tbl.expire(time.Now(), true, s.currentRules(), recs[:0]); len(recs) > 0 {
				fn(recs)
			}
			return nil
		}
	}
}

// monitorLoop keeps `ovs-ofctl monitor` running and sends the packet-ins
// of drop flows to out until ctx is done.
func (s *Source) monitorLoop(ctx context.Context, out chan<- ovs.PacketIn) {
	for ctx.Err() == nil {
		if err := s.monitor(ctx, out); err != nil && ctx.Err() == nil {
			s.m.commandErrors.WithLabelValues("monitor").Inc()
			slog.Debug("ovs-ofctl monitor stopped; restarting", "err", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(monitorRestartInterval):
		}
	}
}

// monitor runs `ovs-ofctl monitor` once, sending the packet-ins of drop
// flows to out (dropped and counted when out is full).
func (s *Source) monitor(ctx context.Context, out chan<- ovs.PacketIn) error {
	var p ovs.MonitorParser
	return ovs.Monitor(ctx, s.cfg.Ofctl, s.cfg.RunDir, s.cfg.Bridge, func(line string) {
		pi, done, err := p.Feed(line)
		if err != nil {
			s.parseFailed(parsePacketIn, 1, err)
		}
		if k, _, ok := ovs.SplitCookie(pi.Cookie); !done || !ok || k != ovs.KindDrop {
			return
		}
		select {
		case out <- pi:
		default:
			s.m.deniedDropped.Inc()
		}
	})
}
