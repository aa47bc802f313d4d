// Command scale generates a reproducible flow data set of a stated
// cluster shape (lab addresses only), loads it through the real
// store.Writer into the embedded engine, and benchmarks the REST API's
// queries on it: p50/p95 of each endpoint and UI page through the real
// handlers (in process), side by side with the same SQL run directly on
// the engine. See docs/scale.md; `make bench-query` runs it.
//
//	go run ./test/scale -sizes 10M,100M            load what is missing, benchmark each size
//	go run ./test/scale -sizes 100M -load-only     load only (reused by later runs)
//
// The embedded engine takes one data directory per process, so each size
// runs in a child process of its own (-rows), and the parent prints the
// sizes side by side.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	data     string
	sizes    string
	rows     int64
	seed     uint64
	days     int
	end      string
	loadOnly bool
	partial  bool
	resume   bool
	report   bool
	iters    int
	warmup   int
	budget   time.Duration
	minIters int
	only     string
	out      string
	result   string

	mutationWait time.Duration

	soak          bool
	soakCopy      string
	soakMaxMemory string
	soakRate      int
	soakClients   int
	soakDuration  time.Duration
	soakWAL       bool
}

func main() {
	var o options
	flag.StringVar(&o.data, "data", envOr("SCALE_DIR", "var/scale"), "directory of the data sets (one subdirectory per size; not committed)")
	flag.StringVar(&o.sizes, "sizes", envOr("SCALE_SIZES", "10M,100M"), "row counts to load and benchmark, comma-separated (k, M suffixes)")
	flag.Int64Var(&o.rows, "rows", 0, "run one size in this process (what the parent runs per size)")
	flag.Uint64Var(&o.seed, "seed", 1, "generator seed")
	flag.IntVar(&o.days, "days", 7, "days of timestamps, ending at -end")
	flag.StringVar(&o.end, "end", "", "end of the data set, RFC 3339 (default: now, to the minute, at load time; an existing data set is reused whatever its end)")
	flag.BoolVar(&o.loadOnly, "load-only", false, "load the data sets, do not benchmark")
	flag.BoolVar(&o.resume, "resume", false, "continue a load that was interrupted (the rows stored must be the generator's first rows: the tail is checked second by second) instead of loading it anew")
	flag.BoolVar(&o.partial, "partial", false, "benchmark a data set whose load was interrupted (the rows loaded so far, ending at the newest row) instead of loading it anew")
	flag.BoolVar(&o.report, "report", false, "only print the side-by-side table of the results already measured (<data>/result-<size>.json)")
	flag.IntVar(&o.iters, "iters", 20, "timed iterations per query")
	flag.IntVar(&o.warmup, "warmup", 2, "untimed iterations per query")
	flag.DurationVar(&o.budget, "budget", 60*time.Second, "time cap per query (API and engine together), past which no more iterations start once -min-iters ran")
	flag.IntVar(&o.minIters, "min-iters", 5, "timed iterations per query even past -budget")
	flag.StringVar(&o.only, "only", "", "run only the scenarios whose name contains this")
	flag.StringVar(&o.out, "out", "", "write the side-by-side markdown table here too (default <data>/bench.md)")
	flag.StringVar(&o.result, "result", "", "(child) write the JSON results here")
	flag.DurationVar(&o.mutationWait, "mutation-wait", 20*time.Minute, "before measuring, wait at most this long for the engine's background mutations (MATERIALIZE PROJECTION of the migrations) to finish")
	flag.BoolVar(&o.soak, "soak", false, "instead of the benchmark: run the collector (embedded engine on the -data data set, or a copy of it with -soak-copy) with IPFIX ingest at -soak-rate while -soak-clients run the API's questions in a loop, sampling this process's RSS every second")
	flag.StringVar(&o.soakCopy, "soak-copy", "", "copy the -data data set here first and soak the copy (the soak adds rows)")
	flag.StringVar(&o.soakMaxMemory, "soak-max-memory", "3GiB", "--clickhouse.max-memory of the soak's collector")
	flag.IntVar(&o.soakRate, "soak-rate", 100_000, "IPFIX records per second the soak's exporter sends")
	flag.IntVar(&o.soakClients, "soak-clients", 3, "concurrent API clients of the soak")
	flag.DurationVar(&o.soakDuration, "soak-duration", 4*time.Minute, "length of the soak")
	flag.BoolVar(&o.soakWAL, "soak-wal", true, "the collector's write-ahead log on (its default with the embedded store)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	if o.soak {
		err = soak(ctx, o)
	} else if o.rows > 0 {
		err = runOne(ctx, o)
	} else {
		err = runAll(ctx, o)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func parseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mul := int64(1)
	switch {
	case strings.HasSuffix(s, "M"):
		mul, s = 1_000_000, strings.TrimSuffix(s, "M")
	case strings.HasSuffix(s, "k"):
		mul, s = 1_000, strings.TrimSuffix(s, "k")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("size %q: want a row count like 10M", s)
	}
	return n * mul, nil
}

func sizeName(n int64) string {
	switch {
	case n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n%1_000 == 0:
		return fmt.Sprintf("%dk", n/1_000)
	}
	return strconv.FormatInt(n, 10)
}

// runAll runs each size in a child process and prints them side by side.
func runAll(ctx context.Context, o options) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	var results []*Result
	for _, s := range strings.Split(o.sizes, ",") {
		n, err := parseSize(s)
		if err != nil {
			return err
		}
		dir := filepath.Join(o.data, "rows-"+sizeName(n))
		res := filepath.Join(o.data, "result-"+sizeName(n)+".json")
		args := []string{"-rows", strconv.FormatInt(n, 10), "-data", dir, "-result", res,
			"-seed", strconv.FormatUint(o.seed, 10), "-days", strconv.Itoa(o.days),
			"-iters", strconv.Itoa(o.iters), "-warmup", strconv.Itoa(o.warmup), "-budget", o.budget.String(), "-min-iters", strconv.Itoa(o.minIters), "-mutation-wait", o.mutationWait.String()}
		if o.end != "" {
			args = append(args, "-end", o.end)
		}
		if o.only != "" {
			args = append(args, "-only", o.only)
		}
		if o.loadOnly {
			args = append(args, "-load-only")
		}
		if o.partial {
			args = append(args, "-partial")
		}
		if o.resume {
			args = append(args, "-resume")
		}
		if !o.report {
			cmd := exec.CommandContext(ctx, self, args...)
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
			cmd.WaitDelay = time.Minute
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("size %s: %w", sizeName(n), err)
			}
		}
		if o.loadOnly {
			continue
		}
		b, err := os.ReadFile(res)
		if err != nil {
			return err
		}
		var r Result
		if err := json.Unmarshal(b, &r); err != nil {
			return err
		}
		results = append(results, &r)
		if o.report {
			fmt.Print(r.table())
		}
	}
	if o.loadOnly {
		return nil
	}
	table := sideBySide(results)
	fmt.Println()
	fmt.Print(table)
	out := o.out
	if out == "" {
		out = filepath.Join(o.data, "bench.md")
	}
	return os.WriteFile(out, []byte(table), 0o644)
}

// runOne loads the data set of o.rows rows if missing, then benchmarks it.
func runOne(ctx context.Context, o options) error {
	want := Manifest{Version: generatorVersion, Shape: DefaultShape, Seed: o.seed, Rows: o.rows, Days: o.days}
	if o.end != "" {
		t, err := time.Parse(time.RFC3339, o.end)
		if err != nil {
			return fmt.Errorf("-end: %w", err)
		}
		want.End = t.UTC()
	}
	var m *Manifest
	var err error
	if o.partial {
		if m, err = readManifest(o.data); err != nil {
			if _, err := os.Stat(filepath.Join(o.data, incompleteName)); err != nil {
				return fmt.Errorf("-partial: %s is neither loaded nor an interrupted load", o.data)
			}
			m = &want // LoadedAt zero: partial
		}
	} else if o.resume && isInterrupted(o.data) {
		if m, err = load(ctx, o.data, want, true, os.Stderr); err != nil {
			return err
		}
	} else if m, err = prepare(o.data, want); err != nil {
		return err
	}
	if m == nil {
		if want.End.IsZero() {
			want.End = time.Now().UTC().Truncate(time.Minute)
		}
		if m, err = load(ctx, o.data, want, false, os.Stderr); err != nil {
			return err
		}
	} else if !m.LoadedAt.IsZero() {
		fmt.Fprintf(os.Stderr, "scale: reusing %s: %d rows ending %s (loaded %s at %.0f rows/s)\n",
			o.data, m.Rows, m.End.Format(time.RFC3339), m.LoadedAt.Format(time.RFC3339), m.RowsPerSecond)
	}
	if o.loadOnly {
		return nil
	}
	r, err := bench(ctx, o, m)
	if err != nil {
		return err
	}
	fmt.Print(r.table())
	if o.result != "" {
		b, _ := json.MarshalIndent(r, "", "  ")
		return os.WriteFile(o.result, b, 0o644)
	}
	return nil
}
