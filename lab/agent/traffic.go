package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"
)

// Flow is one connection the generator repeats.
type Flow struct {
	// Name labels the flow in logs, e.g. "web-1 -> api:80 v6".
	Name string
	// NetNS is the path of the client pod's namespace.
	NetNS string
	Proto string
	To    netip.AddrPort
	// Allowed is what the lab's policies should do with the flow; a
	// mismatch is counted as unexpected.
	Allowed bool
}

// GeneratorConfig configures a Generator.
type GeneratorConfig struct {
	Flows []Flow
	// Interval between rounds (default 1s); every flow runs once a round.
	Interval time.Duration
	// Timeout of one attempt (default 500ms); a drop costs this much.
	Timeout time.Duration
	// ReportEvery is the period of the summary log line (default 30s).
	ReportEvery time.Duration
	Logger      *slog.Logger
}

// SetDefaults fills in unset fields.
func (c *GeneratorConfig) SetDefaults() {
	c.Interval = cmp.Or(c.Interval, time.Second)
	c.Timeout = cmp.Or(c.Timeout, 500*time.Millisecond)
	c.ReportEvery = cmp.Or(c.ReportEvery, 30*time.Second)
	c.Logger = cmp.Or(c.Logger, slog.Default())
}

// Validate reports a config that cannot run.
func (c *GeneratorConfig) Validate() error {
	if len(c.Flows) == 0 {
		return errors.New("traffic generator: no flows")
	}
	for _, f := range c.Flows {
		if f.NetNS == "" || !f.To.Addr().IsValid() {
			return fmt.Errorf("traffic generator: flow %q: need a netns and a destination", f.Name)
		}
	}
	return nil
}

// Stats counts attempts since the generator started.
type Stats struct {
	Rounds     int
	Answered   int // got an answer
	NoAnswer   int // timed out: dropped
	Errors     int // other failures (refused, unreachable, ...)
	Unexpected int // outcome differs from Flow.Allowed
}

// Generator repeats a set of flows, every flow once per round, all flows of
// a round in parallel.
type Generator struct {
	cfg   GeneratorConfig
	mu    sync.Mutex
	stats Stats
}

// NewGenerator checks cfg and returns a generator.
func NewGenerator(cfg GeneratorConfig) (*Generator, error) {
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Generator{cfg: cfg}, nil
}

// Stats returns a snapshot of the counters. Safe for concurrent use.
func (g *Generator) Stats() Stats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.stats
}

// Run runs rounds until ctx is cancelled and returns nil then. Each round
// waits for all its attempts, so no goroutine outlives Run.
func (g *Generator) Run(ctx context.Context) error {
	tick := time.NewTicker(g.cfg.Interval)
	defer tick.Stop()
	report := time.NewTicker(g.cfg.ReportEvery)
	defer report.Stop()
	g.cfg.Logger.Info("traffic generator started", "flows", len(g.cfg.Flows), "interval", g.cfg.Interval)
	for {
		g.round(ctx)
		select {
		case <-ctx.Done():
			s := g.Stats()
			g.cfg.Logger.Info("traffic generator stopped", "rounds", s.Rounds, "answered", s.Answered, "no_answer", s.NoAnswer, "errors", s.Errors, "unexpected", s.Unexpected)
			return nil
		case <-report.C:
			s := g.Stats()
			g.cfg.Logger.Info("traffic", "rounds", s.Rounds, "answered", s.Answered, "no_answer", s.NoAnswer, "errors", s.Errors, "unexpected", s.Unexpected)
		case <-tick.C:
		}
	}
}

func (g *Generator) round(ctx context.Context) {
	var wg sync.WaitGroup
	for _, f := range g.cfg.Flows {
		wg.Go(func() {
			_, err := Dial(ctx, f.NetNS, f.Proto, f.To, g.cfg.Timeout)
			if ctx.Err() != nil {
				return
			}
			g.mu.Lock()
			defer g.mu.Unlock()
			switch {
			case err == nil:
				g.stats.Answered++
			case errors.Is(err, ErrNoAnswer):
				g.stats.NoAnswer++
			default:
				g.stats.Errors++
			}
			if (err == nil) != f.Allowed {
				g.stats.Unexpected++
			}
		})
	}
	wg.Wait()
	g.mu.Lock()
	g.stats.Rounds++
	g.mu.Unlock()
}
