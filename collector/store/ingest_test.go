package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// recAcker records what the writer tells the journal, in order.
type recAcker struct {
	mu      sync.Mutex
	events  []string // "intent <token>", "ack <token>"
	intents []BatchRange
	runs    map[string][]uint64
	acked   map[uint64]bool
	byRef   map[uint64]string // reference → token of the intent naming it
}

func newRecAcker() *recAcker {
	return &recAcker{runs: map[string][]uint64{}, acked: map[uint64]bool{}, byRef: map[uint64]string{}}
}

func (a *recAcker) Intent(token string, minEnd, maxEnd int64, rows int, runs []uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.events = append(a.events, "intent "+token)
	a.intents = append(a.intents, BatchRange{Token: token, MinEnd: minEnd, MaxEnd: maxEnd, Rows: rows})
	a.runs[token] = slices.Clone(runs)
	for k := 0; k+1 < len(runs); k += 2 {
		for i := range runs[k+1] {
			a.byRef[runs[k]+i] = token
		}
	}
}

func (a *recAcker) Ack(ref uint64, n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range uint64(n) {
		if a.acked[ref+i] {
			panic(fmt.Sprintf("reference %#x acknowledged twice", ref+i))
		}
		a.acked[ref+i] = true
		a.events = append(a.events, "ack "+a.byRef[ref+i])
	}
}

func (a *recAcker) FlushAcks() {}

// journaled gives records consecutive journal references, as the journal
// does for one received message (frame 7, records 0..n-1).
func journaled(recs []flow.Record) []flow.Record {
	for i := range recs {
		recs[i].Journal = flow.JournalRefs{Frame: 7<<16 | uint64(i)}
	}
	return recs
}

// checkStoredBatches writes journaled records through a writer on conn:
// each batch's intent comes before its acknowledgements, names its records
// and its flow_end range, and StoredBatches finds every batch by token in
// the engine's flows.ingest_batch, and no other token.
func checkStoredBatches(t *testing.T, conn Conn) {
	c := needEngine(t)
	truncate(t, c)
	cfg := testWriterConfig("")
	cfg.BatchRows = 100
	cfg.FlushInterval = time.Hour
	cfg.Inserters = 1 // intents in batch order (two inserters may swap them)
	w := startWriter(t, cfg, conn)
	a := newRecAcker()
	w.SetAcker(a)
	recs := journaled(idRecords(0, 250))
	base := time.Now().UTC().Truncate(time.Millisecond)
	for i := range recs {
		recs[i].FlowEnd = base.Add(time.Duration(i) * time.Millisecond)
	}
	write(t, w, recs)
	flush(t, w)

	a.mu.Lock()
	intents, events := slices.Clone(a.intents), slices.Clone(a.events)
	a.mu.Unlock()
	if len(intents) != 3 {
		t.Fatalf("%d intents, want 3 (250 rows in batches of 100): %v", len(intents), events)
	}
	seen := map[string]bool{}
	for _, e := range events {
		kind, tok, _ := strings.Cut(e, " ")
		if kind == "intent" {
			seen[tok] = true
		} else if !seen[tok] {
			t.Fatalf("acknowledgement of %q before its intent: %v", tok, events)
		}
	}
	for i, in := range intents {
		if in.Rows != min(100, 250-100*i) {
			t.Errorf("intent %d: %d rows", i, in.Rows)
		}
		want := []uint64{7<<16 | uint64(100*i), uint64(min(100, 250-100*i))}
		if got := a.runs[in.Token]; !slices.Equal(got, want) {
			t.Errorf("intent %d runs %v, want %v", i, got, want)
		}
		if in.MinEnd != base.Add(time.Duration(100*i)*time.Millisecond).UnixMilli() ||
			in.MaxEnd != base.Add(time.Duration(min(100*i+99, 249))*time.Millisecond).UnixMilli() {
			t.Errorf("intent %d flow_end range %d..%d, base %d", i, in.MinEnd, in.MaxEnd, base.UnixMilli())
		}
	}
	ask := append(slices.Clone(intents), BatchRange{Token: newDedupToken(), MinEnd: base.UnixMilli(), MaxEnd: base.UnixMilli() + 1000})
	ask = append(ask, BatchRange{Token: newDedupToken()}) // no range: the whole table
	found, err := StoredBatches(context.Background(), conn, "dualflow", ask)
	if err != nil {
		t.Fatal(err)
	}
	if len(found) != 3 {
		t.Errorf("found %v, want the 3 tokens of the batches", found)
	}
	for _, in := range intents {
		if !found[in.Token] {
			t.Errorf("batch %s not found", in.Token)
		}
	}
	// A batch with fewer rows stored than it had (an insert cut short
	// across shards or day partitions) is not stored: its records must be
	// replayed.
	partial := intents[2]
	partial.Rows++
	found, err = StoredBatches(context.Background(), conn, "dualflow", []BatchRange{partial, intents[1]})
	if err != nil || found[partial.Token] || !found[intents[1].Token] {
		t.Errorf("a batch short of one row counts as stored, or a whole one does not: %v %v", found, err)
	}
	// A batch with a range that misses its rows is not found: the range
	// does restrict the lookup.
	found, err = StoredBatches(context.Background(), conn, "dualflow", []BatchRange{{Token: intents[0].Token, MinEnd: 1, MaxEnd: 2}})
	if err != nil || len(found) != 0 {
		t.Errorf("batch found outside its range: %v %v", found, err)
	}
	// Rows inserted without a token carry 0.
	insertRecords(t, conn, "", sampleRecord(1, false))
	if got := queryString(t, c, "SELECT countIf(ingest_batch = 0), uniqExact(ingest_batch) FROM dualflow.flows"); got != "1\t4" {
		t.Errorf("ingest_batch: rows without a token, distinct values = %q, want 1 and 4", got)
	}
}

func TestStoredBatchesEmbedded(t *testing.T) {
	checkStoredBatches(t, needEngine(t))
}

func TestStoredBatchesOverHTTP(t *testing.T) {
	checkStoredBatches(t, newHTTPStore(t).server())
}

func TestStoredBatchesBadToken(t *testing.T) {
	for _, tok := range []string{"", "a'b", "x) OR 1", strings.Repeat("a", 200)} {
		if _, err := StoredBatches(context.Background(), &fakeConn{}, "dualflow", []BatchRange{{Token: tok}}); err == nil {
			t.Errorf("token %q accepted", tok)
		}
	}
}

// TestSpooledBatch: a batch that could not be inserted and went to the
// spool is reported by Spooled (a restart asks before replaying it), and
// no longer once the spool replayed it.
func TestSpooledBatch(t *testing.T) {
	var down sync.Mutex
	failing := true
	conn := &fakeConn{InsertRowBinaryFunc: func(context.Context, string, []string, string, int, []byte) error {
		down.Lock()
		defer down.Unlock()
		if failing {
			return fmt.Errorf("%w: refused", ErrUnavailable)
		}
		return nil
	}}
	cfg := testWriterConfig(t.TempDir())
	w := startWriter(t, cfg, conn)
	a := newRecAcker()
	w.SetAcker(a)
	write(t, w, journaled(idRecords(0, 10)))
	flush(t, w)
	a.mu.Lock()
	tok := a.intents[0].Token
	a.mu.Unlock()
	ctx := context.Background()
	if ok, err := w.Spooled(ctx, tok); !ok || err != nil {
		t.Fatalf("Spooled(spooled batch) = %v, %v", ok, err)
	}
	if ok, _ := w.Spooled(ctx, newDedupToken()); ok {
		t.Error("Spooled(unknown token) = true")
	}
	down.Lock()
	failing = false
	down.Unlock()
	eventually(t, "the spool to drain", func() bool { return w.Stats().SpoolBatches == 0 })
	if ok, _ := w.Spooled(ctx, tok); ok {
		t.Error("Spooled(replayed batch) = true")
	}
	// Before Run opens the spool, Spooled waits (here: until ctx ends).
	w2, err := NewWriter(cfg, conn, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := w2.Spooled(short, tok); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Spooled before Run = %v, want the context's deadline", err)
	}
}
