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
// printing progress to log, and writes the manifest.
func load(ctx context.Context, dir string, want Manifest, log io.Writer) (*Manifest, error) {
	e, err := openStore(ctx, dir)
	if err != nil {
		return nil, err
	}
	defer e.Close()
	c := NewCluster(want.Shape, want.Seed)
	g := NewGenerator(c, want.Seed, want.Rows, want.End, time.Duration(want.Days)*24*time.Hour)
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
	for i := int64(0); i < want.Rows; {
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
				eta = (time.Duration(float64(want.Rows-st.RowsWritten)/avg) * time.Second).Round(time.Second).String()
			}
			fmt.Fprintf(log, "scale: %6.2f%% %11d rows written, %7.0f rows/s now, %7.0f average, ETA %s\n",
				100*float64(st.RowsWritten)/float64(want.Rows), st.RowsWritten, rate, avg, eta)
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
	m.RowsPerSecond = float64(want.Rows) / elapsed.Seconds()
	m.Edges = len(c.Edges)
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(filepath.Join(dir, manifestName), append(b, '\n'), 0o644); err != nil {
		return nil, err
	}
	if err := os.Remove(filepath.Join(dir, incompleteName)); err != nil {
		return nil, err
	}
	fmt.Fprintf(log, "scale: loaded %d rows in %s (%.0f rows/s)\n", want.Rows, elapsed.Round(time.Second), m.RowsPerSecond)
	return &m, nil
}
