package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dualflow/dualflow/collector"
	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	fipfix "github.com/dualflow/dualflow/flow/ipfix"
	"github.com/dualflow/dualflow/web/api"
)

// The soak (-soak): the collector's memory while the API's queries run
// concurrently with ingest. In one process: the real collector (package
// collector, embedded engine on a loaded data set, --clickhouse.max-memory
// set to -soak-max-memory, IPFIX over TCP on 127.0.0.1:0, Kubernetes
// enrichment off), an exporter sending IPFIX to it at -soak-rate records/s,
// -soak-clients clients running the benchmark's API questions in a loop
// through the real web/api handler on the collector's store, and a sampler
// of this process's VmRSS and VmHWM every second.

// SoakResult is what -soak measured.
type SoakResult struct {
	DataDir        string  `json:"data_dir"`
	MaxMemory      string  `json:"max_memory"`
	Duration       float64 `json:"duration_s"`
	TargetRate     int     `json:"target_records_per_s"`
	Sent           int64   `json:"records_sent"`
	Written        int64   `json:"rows_written"`
	SentRate       float64 `json:"sent_records_per_s"`
	WrittenRate    float64 `json:"written_rows_per_s"`
	Clients        int     `json:"clients"`
	Queries        int     `json:"requests"`
	QueryErrors    int     `json:"request_errors"`
	FirstErr       string  `json:"first_error,omitempty"`
	QueryP50       float64 `json:"request_p50_ms"`
	QueryP95       float64 `json:"request_p95_ms"`
	QueryMax       float64 `json:"request_max_ms"`
	RSSStartMiB    float64 `json:"rss_start_mib"`
	RSSP50MiB      float64 `json:"rss_p50_mib"`
	RSSP95MiB      float64 `json:"rss_p95_mib"`
	RSSMaxMiB      float64 `json:"rss_max_mib"`
	HWMMiB         float64 `json:"vmhwm_mib"`
	HWMReset       bool    `json:"vmhwm_reset_at_start"`
	LoadStart      string  `json:"loadavg_start"`
	LoadEnd        string  `json:"loadavg_end"`
	WAL            bool    `json:"wal"`
	PerScenario    []soakScenario
	RSSSamplesMiB  []float64 `json:"rss_samples_mib"`
	RateSamplesRPS []float64 `json:"written_rows_per_s_samples"`
}

type soakScenario struct {
	Name   string  `json:"name"`
	N      int     `json:"n"`
	Errors int     `json:"errors"`
	P50    float64 `json:"p50_ms"`
	P95    float64 `json:"p95_ms"`
}

// procStatus returns VmRSS and VmHWM of this process in MiB.
func procStatus() (rss, hwm float64) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		l := s.Text()
		for _, k := range []string{"VmRSS:", "VmHWM:"} {
			if strings.HasPrefix(l, k) {
				fs := strings.Fields(l[len(k):])
				if len(fs) > 0 {
					kb, _ := strconv.ParseFloat(fs[0], 64)
					if k == "VmRSS:" {
						rss = kb / 1024
					} else {
						hwm = kb / 1024
					}
				}
			}
		}
	}
	return rss, hwm
}

func soak(ctx context.Context, o options) error {
	m, err := readManifest(o.data)
	if err != nil {
		return fmt.Errorf("-soak: %s: %w (load the data set first)", o.data, err)
	}
	dir := o.data
	if o.soakCopy != "" {
		// The soak adds rows: run it on a copy, so the data set stays as
		// the benchmark measured it.
		if err := os.RemoveAll(o.soakCopy); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "scale: soak: copying %s to %s\n", o.data, o.soakCopy)
		if err := copyTree(o.data, o.soakCopy); err != nil {
			return err
		}
		dir = o.soakCopy
	}
	var cfg collector.Config
	cfg.Store.DataDir = filepath.Join(dir, engineDir)
	cfg.Store.LibPath = os.Getenv("CHDB_LIB_PATH")
	if err := cfg.Store.MaxMemory.Set(o.soakMaxMemory); err != nil {
		return fmt.Errorf("-soak-max-memory: %w", err)
	}
	cfg.IPFIX.TCPAddrs = []string{"127.0.0.1:0"}
	cfg.K8s = enrich.NewConfig()
	cfg.K8s.Source = enrich.SourceOff
	if !o.soakWAL {
		cfg.WAL.Dir = "off"
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	c, err := collector.New(ctx, cfg, log)
	if err != nil {
		return err
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	stopCollector := func() error {
		cancel()
		return <-done
	}
	select {
	case <-c.Ready():
	case err := <-done:
		return fmt.Errorf("collector: %v", err)
	case <-time.After(2 * time.Minute):
		stopCollector()
		return fmt.Errorf("collector not ready after 2 min")
	}
	e, _ := c.Conn().(*store.Embedded)
	if e != nil && o.mutationWait > 0 {
		waitMutations(ctx, e, o.mutationWait, os.Stderr)
	}

	// The API on the collector's store, clocked at the data set's end (the
	// benchmark's questions, as measured without ingest).
	cl := NewCluster(m.Shape, m.Seed)
	end := m.End
	now := func() time.Time { return end }
	reports, err := audit.NewReports(c.Conn(), "dualflow")
	if err != nil {
		stopCollector()
		return err
	}
	view := &enrich.Snapshot{NetworkPolicies: cl.Policies()}
	auditQ := &audit.Queries{Reports: reports, Cluster: func() (*enrich.Snapshot, error) { return view, nil }}
	a, err := api.New(api.Config{Store: c.Conn(), Audit: auditQ, Now: now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		stopCollector()
		return err
	}
	h := a.Handler()
	var scs []scenario
	for _, s := range scenarios(cl, end) {
		if o.only == "" || strings.Contains(s.Name, o.only) {
			scs = append(scs, s)
		}
	}

	res := &SoakResult{DataDir: dir, MaxMemory: o.soakMaxMemory, TargetRate: o.soakRate, Clients: o.soakClients, WAL: o.soakWAL}
	// VmHWM from here on (writing 5 to clear_refs resets it), so the
	// figure is the soak's peak, not the migration's at open.
	res.HWMReset = os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	res.RSSStartMiB, _ = procStatus()
	res.LoadStart = loadavg()
	fmt.Fprintf(os.Stderr, "scale: soak: %s for %s, max-memory %s, %d records/s target, %d API clients, RSS %.0f MiB, load %s\n",
		dir, o.soakDuration, o.soakMaxMemory, o.soakRate, o.soakClients, res.RSSStartMiB, res.LoadStart)

	sctx, scancel := context.WithTimeout(ctx, o.soakDuration)
	defer scancel()
	var wg sync.WaitGroup

	// Exporter.
	var sent atomic.Int64
	var sendErr error
	addr := c.IPFIXAddrs()["tcp"][0]
	wg.Go(func() { sendErr = exportAt(sctx, addr, cl, m.Seed, o.soakRate, &sent) })

	// API clients.
	type lat struct {
		name string
		ms   float64
		err  error
	}
	var mu sync.Mutex
	var lats []lat
	for i := range o.soakClients {
		wg.Go(func() {
			for k := i * len(scs) / max(o.soakClients, 1); sctx.Err() == nil; k++ {
				s := scs[k%len(scs)]
				t0 := time.Now()
				err := do(sctx, h, s)
				d := float64(time.Since(t0).Microseconds()) / 1000
				if sctx.Err() != nil {
					return // cut short by the end of the soak
				}
				mu.Lock()
				lats = append(lats, lat{s.Name, d, err})
				mu.Unlock()
			}
		})
	}

	// Sampler.
	start := time.Now()
	w0 := c.Writer().Stats().RowsWritten
	var rss []float64
	tick := time.NewTicker(time.Second)
	lastW, lastT := w0, start
	for loop := true; loop; {
		select {
		case <-sctx.Done():
			loop = false
		case t := <-tick.C:
			r, hwm := procStatus()
			rss = append(rss, r)
			w := c.Writer().Stats().RowsWritten
			rate := float64(w-lastW) / t.Sub(lastT).Seconds()
			res.RateSamplesRPS = append(res.RateSamplesRPS, rate)
			lastW, lastT = w, t
			if len(rss)%10 == 0 {
				mu.Lock()
				n := len(lats)
				mu.Unlock()
				fmt.Fprintf(os.Stderr, "scale: soak %3.0fs: RSS %6.0f MiB (HWM %6.0f), sent %d, written %d (%.0f rows/s over 1 s), %d requests done, load %s\n",
					t.Sub(start).Seconds(), r, hwm, sent.Load(), w-w0, rate, n, loadavg())
			}
		}
	}
	tick.Stop()
	elapsed := time.Since(start).Seconds()
	written := c.Writer().Stats().RowsWritten - w0
	wg.Wait()
	_, res.HWMMiB = procStatus()
	res.LoadEnd = loadavg()
	res.Duration = elapsed
	res.Sent, res.Written = sent.Load(), written
	res.SentRate, res.WrittenRate = float64(res.Sent)/elapsed, float64(written)/elapsed
	res.RSSSamplesMiB = rss
	sorted := append([]float64(nil), rss...)
	sort.Float64s(sorted)
	res.RSSP50MiB, res.RSSP95MiB = pct(sorted, 50), pct(sorted, 95)
	if len(sorted) > 0 {
		res.RSSMaxMiB = sorted[len(sorted)-1]
	}
	var all []float64
	by := map[string][]float64{}
	errs := map[string]int{}
	var order []string
	for _, l := range lats {
		if _, ok := by[l.name]; !ok && errs[l.name] == 0 {
			order = append(order, l.name)
		}
		if l.err != nil {
			res.QueryErrors++
			errs[l.name]++
			if res.FirstErr == "" {
				res.FirstErr = l.err.Error()
			}
			continue
		}
		all = append(all, l.ms)
		by[l.name] = append(by[l.name], l.ms)
	}
	res.Queries = len(lats)
	sort.Float64s(all)
	res.QueryP50, res.QueryP95 = pct(all, 50), pct(all, 95)
	if len(all) > 0 {
		res.QueryMax = all[len(all)-1]
	}
	for _, n := range order {
		v := by[n]
		sort.Float64s(v)
		res.PerScenario = append(res.PerScenario, soakScenario{Name: n, N: len(v) + errs[n], Errors: errs[n], P50: pct(v, 50), P95: pct(v, 95)})
	}
	if err := stopCollector(); err != nil {
		fmt.Fprintf(os.Stderr, "scale: soak: collector run: %v\n", err)
	}
	if sendErr != nil {
		fmt.Fprintf(os.Stderr, "scale: soak: exporter: %v\n", sendErr)
	}
	fmt.Print(res.table())
	if o.result != "" {
		b, _ := json.MarshalIndent(res, "", "  ")
		return os.WriteFile(o.result, b, 0o644)
	}
	return nil
}

func (r *SoakResult) table() string {
	var b strings.Builder
	fmt.Fprintf(&b, "\nsoak: %s, --clickhouse.max-memory %s, WAL %v, %.0f s, load %s -> %s\n", r.DataDir, r.MaxMemory, r.WAL, r.Duration, r.LoadStart, r.LoadEnd)
	fmt.Fprintf(&b, "ingest: target %d records/s, sent %d (%.0f/s), written %d (%.0f rows/s)\n", r.TargetRate, r.Sent, r.SentRate, r.Written, r.WrittenRate)
	fmt.Fprintf(&b, "API: %d clients, %d requests (%d errors%s), p50 %s p95 %s max %s\n", r.Clients, r.Queries, r.QueryErrors, firstErr(r.FirstErr), ms(r.QueryP50), ms(r.QueryP95), ms(r.QueryMax))
	fmt.Fprintf(&b, "RSS: start %.0f MiB, p50 %.0f MiB, p95 %.0f MiB, max %.0f MiB; VmHWM %.0f MiB (reset at start: %v)\n\n", r.RSSStartMiB, r.RSSP50MiB, r.RSSP95MiB, r.RSSMaxMiB, r.HWMMiB, r.HWMReset)
	fmt.Fprintf(&b, "| question during ingest | n | errors | p50 | p95 |\n|---|---:|---:|---:|---:|\n")
	for _, s := range r.PerScenario {
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s |\n", s.Name, s.N, s.Errors, ms(s.P50), ms(s.P95))
	}
	return b.String()
}

func firstErr(s string) string {
	if s == "" {
		return ""
	}
	if len(s) > 300 {
		s = s[:300] + "..."
	}
	return "; first: " + s
}

// exportAt sends IPFIX over one TCP connection to addr at rate records/s
// until ctx ends: every 10 ms a slice of 1/100 of the second's records, in
// messages of 40 records; the records (the generator's conversations,
// lab addresses, ending now) are encoded anew every second.
func exportAt(ctx context.Context, addr net.Addr, c *Cluster, seed uint64, rate int, sent *atomic.Int64) error {
	conn, err := net.Dial(addr.Network(), addr.String())
	if err != nil {
		return err
	}
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	e4, _ := fipfix.NewEncoder(4, 256)
	e6, _ := fipfix.NewEncoder(6, 257)
	enc := map[uint8]*fipfix.Encoder{4: e4, 6: e6}
	var seq uint32
	const perMsg = 40
	var body, buf []byte
	msg := func(recs []flow.Record) {
		body = body[:0]
		for _, v := range []uint8{4, 6} {
			start := len(body)
			body = append(body, 0, 0, 0, 0)
			n := 0
			for i := range recs {
				if flow.Version(recs[i].SrcAddr) == v {
					body = enc[v].AppendRecord(body, &recs[i])
					n++
				}
			}
			if n == 0 {
				body = body[:start]
				continue
			}
			fipfix.PutSetHeader(body[start:], enc[v].TemplateID())
		}
		buf = fipfix.AppendMessageHeader(buf, fipfix.MessageHeaderLen+len(body), time.Now(), seq, 1)
		seq += uint32(len(recs))
		buf = append(buf, body...)
	}
	var tmpl []byte
	tmpl = e4.AppendTemplateSet(tmpl)
	tmpl = e6.AppendTemplateSet(tmpl)
	buf = fipfix.AppendMessageHeader(nil, fipfix.MessageHeaderLen+len(tmpl), time.Now(), 0, 1)
	buf = append(buf, tmpl...)
	if _, err := conn.Write(buf); err != nil {
		return err
	}
	const slots = 100 // per second
	perSlot := max(rate/slots/perMsg, 1) * perMsg
	g := NewGenerator(c, seed+7, 1_000_000_000, time.Now(), time.Hour)
	recs := make([]flow.Record, perSlot)
	var i int64
	t0 := time.Now()
	var slot int64
	var chunk []byte
	for ctx.Err() == nil {
		if slot%slots == 0 || chunk == nil {
			// A new second: new records, ending now.
			now := time.Now().Truncate(time.Millisecond)
			buf = buf[:0]
			for k := range recs {
				g.Fill(&recs[k], i)
				i++
				d := recs[k].FlowEnd.Sub(recs[k].FlowStart)
				recs[k].FlowEnd, recs[k].FlowStart, recs[k].TimeReceived = now, now.Add(-d), time.Time{}
			}
			for k := 0; k < len(recs); k += perMsg {
				msg(recs[k:min(k+perMsg, len(recs))])
			}
			chunk = append(chunk[:0], buf...)
		}
		if slot%slots != 0 {
			// The same records again: each message gets its next
			// sequence number and export time.
			for off := 0; off+fipfix.MessageHeaderLen <= len(chunk); {
				l := int(chunk[off+2])<<8 | int(chunk[off+3])
				n := uint32(perMsg) // every message of the chunk holds perMsg records
				putU32(chunk[off+4:], uint32(time.Now().Unix()))
				putU32(chunk[off+8:], seq)
				seq += n
				off += l
			}
		}
		if _, err := conn.Write(chunk); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		sent.Add(int64(perSlot))
		slot++
		// Pace: slot k is due at t0 + k*10ms; behind schedule, no pause
		// (the rate then says what the collector accepted).
		if d := time.Until(t0.Add(time.Duration(slot) * time.Second / slots)); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
	}
	return nil
}

// copyTree copies the directory src to dst (regular files and
// directories; the engine's data, which holds no links that matter).
func copyTree(src, dst string) error {
	return filepath.Walk(src, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		t := filepath.Join(dst, rel)
		switch {
		case fi.IsDir():
			return os.MkdirAll(t, 0o755)
		case fi.Mode()&os.ModeSymlink != 0:
			l, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(l, t)
		case fi.Mode().IsRegular():
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			out, err := os.Create(t)
			if err != nil {
				return err
			}
			if _, err := io.Copy(out, in); err != nil {
				out.Close()
				return err
			}
			return out.Close()
		}
		return nil
	})
}

func putU32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
}
