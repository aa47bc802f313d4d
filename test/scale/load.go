package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/migrations"
)

// Manifest describes a loaded data set; it is written when the load
// completes, and a data set whose manifest matches the parameters asked
// for is reused.
type Manifest struct {
	Version  int       `json:"version"` // of the generator: bump when the rows change
	Shape    Shape     `json:"shape"`
	Seed     uint64    `json:"seed"`
	Rows     int64     `json:"rows"`
	Days     int       `json:"days"`
	End      time.Time `json:"end"`
	LoadedAt time.Time `json:"loaded_at"`
	// LoadSeconds and RowsPerSecond are the load's, through store.Writer
	// into the embedded engine (generation included).
	LoadSeconds   float64 `json:"load_seconds"`
	RowsPerSecond float64 `json:"rows_per_second"`
	Edges         int     `json:"edges"`
	// ResumedAt is the rows an interrupted load had stored when -resume
	// continued it (LoadSeconds and RowsPerSecond are then the rest's).
	ResumedAt int64 `json:"resumed_at,omitempty"`
}

const generatorVersion = 1

const (
	manifestName   = "manifest.json"
	incompleteName = "LOAD-INCOMPLETE" // marks a directory this tool may wipe
	engineDir      = "chdb"
)

// same reports whether m was made with the parameters of want (End is
// only compared when want has one).
func (m *Manifest) same(want Manifest) bool {
	return m.Version == want.Version && m.Shape == want.Shape && m.Seed == want.Seed && m.Rows == want.Rows &&
		m.Days == want.Days && (want.End.IsZero() || m.End.Equal(want.End))
}

func readManifest(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, manifestName))
	if err != nil {
		return nil, err
	}
	var m Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, manifestName), err)
	}
	return &m, nil
}

// prepare returns the manifest of the data set in dir when it matches
// want; otherwise it empties dir (only a directory that is empty or that
// this tool made) and returns nil.
func prepare(dir string, want Manifest) (*Manifest, error) {
	if m, err := readManifest(dir); err == nil {
		if m.same(want) {
			return m, nil
		}
		fmt.Fprintf(os.Stderr, "scale: %s holds another data set (%d rows, seed %d, shape %+v): loading anew\n", dir, m.Rows, m.Seed, m.Shape)
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if len(entries) > 0 {
		ours := false
		for _, e := range entries {
			if e.Name() == incompleteName || e.Name() == manifestName {
				ours = true
			}
		}
		if !ours {
			return nil, fmt.Errorf("%s is not empty and not a scale data set: refusing to wipe it", dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return nil, os.WriteFile(filepath.Join(dir, incompleteName), []byte("a scale data set is being loaded here; it is wiped on the next load\n"), 0o644)
}

// openStore opens the engine in dir and applies the migrations.
func openStore(ctx context.Context, dir string) (*store.Embedded, error) {
	e, err := store.NewEmbedded(store.EmbeddedConfig{LibPath: os.Getenv("CHDB_LIB_PATH"), DataDir: filepath.Join(dir, engineDir)})
	if err != nil {
		return nil, err
	}
	r, err := migrations.NewRunner(e, migrations.Options{})
	if err == nil {
		_, err = r.Up(ctx)
	}
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("migrate: %w", err)
	}
	return e, nil
}

// load writes want.Rows generated rows through store.Writer (its default
// configuration, as the collector runs it) into the engine in dir,
// printing progress to log, and writes the manifest. With resume it
// continues an interrupted load instead (see resumePoint).
func load(ctx context.Context, dir string, want Manifest, resume bool, log io.Writer) (*Manifest, error) {
	e, err := openStore(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	var from int64
	if resume {
		if from, err = resumePoint(ctx, e, dir, &want, log); err != nil {
			return nil, err
		}
	}
	c := NewCluster(want.Shape, want.Seed)
	g := NewGenerator(c, want.Seed, want.Rows, want.End, time.Duration(want.Days)*24*time.Hour)
	if from > 0 {
		if err := checkPrefix(ctx, e, g, from, log); err != nil {
			return nil, err
		}
	}
	// No spool: a batch that cannot be written is counted as dropped and
	// fails the load. Inserts may wait behind merges on a busy 2-core
	// machine: a long insert timeout.
	w, err := store.NewWriter(store.WriterConfig{InsertTimeout: 10 * time.Minute}, e, nil, nil)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()

	fmt.Fprintf(log, "scale: loading %d rows (%d pods, %d namespaces, %d Services, %d edges, %d days ending %s) into %s\n",
		want.Rows, len(c.Pods), len(c.Namespaces), len(c.Services), len(c.Edges), want.Days, want.End.Format(time.RFC3339), dir)
	start := time.Now()
	last, lastRows := start, int64(0)
	const chunk = 1000
	batch := make([]flow.Record, chunk)
	for i := from; i < want.Rows; {
		n := min(int64(chunk), want.Rows-i)
		for j := range n {
			g.Fill(&batch[j], i+j)
		}
		if err := w.Write(ctx, batch[:n]); err != nil {
			return nil, err
		}
		i += n
		if now := time.Now(); now.Sub(last) >= 10*time.Second || i == want.Rows {
			st := w.Stats()
			rate := float64(st.RowsWritten-lastRows) / now.Sub(last).Seconds()
			avg := float64(st.RowsWritten) / now.Sub(start).Seconds()
			eta := "?"
			if avg > 0 {
				eta = (time.Duration(float64(want.Rows-from-st.RowsWritten)/avg) * time.Second).Round(time.Second).String()
			}
			fmt.Fprintf(log, "scale: %6.2f%% %11d rows written, %7.0f rows/s now, %7.0f average, ETA %s\n",
				100*float64(from+st.RowsWritten)/float64(want.Rows), from+st.RowsWritten, rate, avg, eta)
			last, lastRows = now, st.RowsWritten
		}
	}
	if err := w.Flush(ctx); err != nil {
		return nil, err
	}
	elapsed := time.Since(start)
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		return nil, err
	}
	if st := w.Stats(); st.DroppedRows != 0 || st.SpooledRows != 0 {
		return nil, fmt.Errorf("writer dropped or spooled rows: %+v", st)
	}
	out, err := e.Query(ctx, "SELECT count() FROM dualflow.flows", "TSV")
	if err != nil {
		return nil, err
	}
	if got := strings.TrimSpace(string(out)); got != fmt.Sprint(want.Rows) {
		return nil, fmt.Errorf("flows holds %s rows, want %d", got, want.Rows)
	}
	m := want
	m.LoadedAt = time.Now().UTC()
	m.LoadSeconds = elapsed.Seconds()
	m.RowsPerSecond = float64(want.Rows-from) / elapsed.Seconds()
	m.ResumedAt = from
	m.Edges = len(c.Edges)
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, manifestName), append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := os.Remove(filepath.Join(dir, incompleteName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	fmt.Fprintf(log, "scale: loaded %d rows in %s (%.0f rows/s)\n", want.Rows, elapsed.Round(time.Second), m.RowsPerSecond)
	return &m, nil
}

func isInterrupted(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, incompleteName))
	_, merr := os.Stat(filepath.Join(dir, manifestName))
	return err == nil && merr != nil
}

// resumePoint finds where the interrupted load in e stopped: the rows
// stored are counted, and the data set's end is found from its oldest row
// (the generator's row 0 is within a second of the start, a whole minute,
// and the end is days later) and set in want. load then checks that they
// are the generator's first rows and writes the rest.
func resumePoint(ctx context.Context, e *store.Embedded, dir string, want *Manifest, log io.Writer) (int64, error) {
	out, err := e.Query(ctx, "SELECT count(), toUnixTimestamp64Milli(min(flow_end)) FROM dualflow.flows", "TSV")
	if err != nil {
		return 0, err
	}
	var n, minMs int64
	if _, err := fmt.Sscan(string(out), &n, &minMs); err != nil {
		return 0, fmt.Errorf("count the stored rows: %q: %w", out, err)
	}
	if n == 0 || n >= want.Rows {
		return 0, fmt.Errorf("-resume: %s holds %d rows of %d: nothing to resume", dir, n, want.Rows)
	}
	end := time.UnixMilli(minMs).UTC().Truncate(time.Minute).Add(time.Duration(want.Days) * 24 * time.Hour)
	if !want.End.IsZero() && !want.End.Equal(end) {
		return 0, fmt.Errorf("-resume: the stored rows end at %s, not -end %s", end.Format(time.RFC3339), want.End.Format(time.RFC3339))
	}
	want.End = end
	fmt.Fprintf(log, "scale: resuming the load in %s at row %d of %d (data set ending %s)\n", dir, n, want.Rows, end.Format(time.RFC3339))
	return n, nil
}

// checkPrefix advances g past the first n rows and checks that the
// engine holds them: the rows of the last tail ones, second by second
// (an interrupted load loses its batches in flight, the newest), and the
// count. It leaves g where row n comes next.
func checkPrefix(ctx context.Context, e *store.Embedded, g *Generator, n int64, log io.Writer) error {
	const tail = 300_000
	first := max(0, n-tail)
	// Rows before first end before the base time of row first plus the
	// jitter (under a second): from the next whole second on, every row
	// generated is one of the tail.
	base := g.start.Add(time.Duration(float64(g.span) * float64(first) / float64(g.n)))
	from := base.Add(time.Second).Truncate(time.Second).Add(time.Second)
	want := map[int64]int64{}
	var r flow.Record
	start := time.Now()
	for i := int64(0); i < n; i++ {
		g.Fill(&r, i)
		if i >= first && !r.FlowEnd.Before(from) {
			want[r.FlowEnd.Unix()]++
		}
	}
	fmt.Fprintf(log, "scale: generated the %d stored rows again in %s\n", n, time.Since(start).Round(time.Second))
	out, err := e.Query(ctx, fmt.Sprintf("SELECT toUnixTimestamp(flow_end), count() FROM dualflow.flows WHERE flow_end >= fromUnixTimestamp64Milli(%d, 'UTC') GROUP BY 1", from.UnixMilli()), "TSV")
	if err != nil {
		return err
	}
	got := map[int64]int64{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var s, c int64
		if _, err := fmt.Sscan(line, &s, &c); err != nil {
			return fmt.Errorf("row %q: %w", line, err)
		}
		got[s] = c
	}
	bad := 0
	for s, c := range want {
		if got[s] != c {
			bad++
		}
	}
	for s := range got {
		if _, ok := want[s]; !ok {
			bad++
		}
	}
	if bad > 0 || len(want) == 0 {
		return fmt.Errorf("the stored rows are not the generator's first %d (%d of %d seconds since %s differ): load anew without -resume", n, bad, len(want), from.Format(time.RFC3339))
	}
	fmt.Fprintf(log, "scale: the stored rows are the generator's first %d (their last %d seconds checked)\n", n, len(want))
	return nil
}
