package wal

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/flow"
)

// fill sets every field of v (recursively) to a random non-zero value, so
// that a field the codec forgets fails the round trip.
func fill(rng *rand.Rand, v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		switch v.Interface().(type) {
		case time.Time:
			v.Set(reflect.ValueOf(time.Unix(rng.Int64N(4e9), rng.Int64N(1e9)).UTC()))
			return
		case netip.Addr:
			if rng.IntN(2) == 0 {
				v.Set(reflect.ValueOf(netip.AddrFrom4([4]byte{198, 18, byte(rng.IntN(256)), byte(rng.IntN(256))})))
			} else {
				v.Set(reflect.ValueOf(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 15: byte(rng.IntN(256))})))
			}
			return
		case flow.JournalRefs:
			return // not encoded: the frame id is the frame's
		}
		for i := range v.NumField() {
			if n := v.Type().Field(i).Name; n == "K8sViewStale" || n == "ProbeTraceID" || n == "PodAddrs" || n == "DualStackGap" {
				continue // not encoded: set by enrichment and the audit, after the journal
			}
			fill(rng, v.Field(i))
		}
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", rng.IntN(1e6)))
	case reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(1 + rng.Uint64N(1<<(8*v.Type().Size()-1)))
	case reflect.Int32:
		v.SetInt(int64(rng.Int32N(1<<30)) - 1<<29)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		m.SetMapIndex(reflect.ValueOf("app"), reflect.ValueOf(fmt.Sprintf("v%d", rng.IntN(100))))
		v.Set(m)
	default:
		panic("fill: unhandled kind " + v.Kind().String())
	}
}

func randomRecords(n int, seed uint64) []flow.Record {
	rng := rand.New(rand.NewPCG(seed, 1))
	recs := make([]flow.Record, n)
	for i := range recs {
		fill(rng, reflect.ValueOf(&recs[i]).Elem())
	}
	return recs
}

// TestCodecRoundTripEveryField: records encoded one after the other, each
// against the one before (random ones; ones sharing some of their fields
// with the record before, a zero time among them, as a batch's records
// do; the zero record), decode to themselves.
func TestCodecRoundTripEveryField(t *testing.T) {
	recs := randomRecords(200, 1)
	for i := 1; i < len(recs); i += 2 {
		r, prev := &recs[i], &recs[i-1]
		r.TimeReceived, r.ExporterAddr, r.ExporterNode, r.Source = prev.TimeReceived, prev.ExporterAddr, prev.ExporterNode, prev.Source
		r.Src.NodeName, r.Dst.Zone, r.TCPState, r.Egress.ReportedName = prev.Src.NodeName, prev.Dst.Zone, prev.TCPState, prev.Egress.ReportedName
		r.SrcAddr, r.SNATAddr = prev.SrcAddr, netip.Addr{}
		switch i % 6 {
		case 1:
			r.FlowStart = time.Time{}
		case 3:
			r.FlowEnd, r.Service.Name = time.Time{}, ""
		case 5:
			r.TimeReceived = time.Time{}
		}
	}
	recs = append(recs, flow.Record{}, recs[0], recs[0])
	var b []byte
	var zero flow.Record
	prev := &zero
	for i := range recs {
		b = appendRecord(b, &recs[i], prev)
		prev = &recs[i]
	}
	d := decoder{b: b, delta: true}
	var got, before flow.Record
	for i := range recs {
		got = flow.Record{}
		d.record(&got, &before)
		if d.err != nil {
			t.Fatalf("record %d: %v", i, d.err)
		}
		if !reflect.DeepEqual(got, recs[i]) {
			t.Fatalf("record %d:\n got %+v\nwant %+v", i, got, recs[i])
		}
		before = got
	}
	if len(d.b) != 0 {
		t.Fatalf("%d bytes left", len(d.b))
	}
}

// crash abandons the log as a killed process would: no pending ack is
// written, nothing is deleted, the lock goes.
func (l *Log) crash() {
	l.mu.Lock()
	l.closed = true
	if l.f != nil {
		l.f.Close()
	}
	l.mu.Unlock()
	close(l.stop)
	l.wg.Wait()
	l.lock.Close()
}

func open(t *testing.T, dir string) *Log {
	t.Helper()
	l, err := Open(Config{Dir: dir, SegmentAge: time.Hour, SegmentBytes: 64 << 10}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func segments(t *testing.T, dir string) int {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "*"+segSuffix))
	return len(m)
}

// TestCrashReplaysWhatIsNotDurable: records acknowledged before a crash
// are not replayed, the others are, with their values, once; a frame
// partly durable replays only the records that were not.
func TestCrashReplaysWhatIsNotDurable(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	var batches [][]flow.Record
	for i := range 50 {
		recs := randomRecords(100, uint64(i+10))
		if err := l.Append(recs); err != nil {
			t.Fatal(err)
		}
		batches = append(batches, recs)
	}
	if segments(t, dir) < 2 {
		t.Fatalf("expected rotation by size, %d segments", segments(t, dir))
	}
	// The first 30 batches become durable, plus half of batch 30, and the
	// merged record of batches 31 and 32 (one record standing for the
	// first record of each).
	for _, b := range batches[:30] {
		l.AckRecords(b)
	}
	l.AckRecords(batches[30][:50])
	m := batches[31][0]
	m.Journal.Absorb(batches[32][0].Journal)
	l.AckRecords([]flow.Record{m})
	// Killed right after the acknowledgements: they are in the log
	// already, not waiting for the next append or sync tick.
	l.crash()

	l2 := open(t, dir)
	defer l2.Close()
	var got []flow.Record
	n, err := l2.Replay(64, func(recs []flow.Record) error {
		got = append(got, recs...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Not durable: the second half of batch 30, batches 31 and 32 but
	// their first records, batches 33..49.
	want := slices.Concat(batches[30][50:], batches[31][1:], batches[32][1:], slices.Concat(batches[33:]...))
	if n != len(want) || len(got) != len(want) {
		t.Fatalf("replayed %d (%d), want %d", n, len(got), len(want))
	}
	for i := range got {
		w := want[i]
		j := got[i].Journal
		if j.Frame != w.Journal.Frame {
			t.Errorf("replayed record %d under reference %#x, journaled under %#x", i, j.Frame, w.Journal.Frame)
		}
		got[i].Journal, w.Journal = flow.JournalRefs{}, flow.JournalRefs{}
		if !reflect.DeepEqual(got[i], w) {
			t.Fatalf("replayed record %d differs", i)
		}
		got[i].Journal = j
	}
	// New appends get new frames; acknowledging the replayed records and
	// the new ones empties the log at Close.
	fresh := randomRecords(10, 99)
	if err := l2.Append(fresh); err != nil {
		t.Fatal(err)
	}
	if fresh[0].Journal.Frame <= got[len(got)-1].Journal.Frame {
		t.Errorf("new frame %d reuses an old id (last %d)", fresh[0].Journal.Frame, got[len(got)-1].Journal.Frame)
	}
	l2.AckRecords(got)
	l2.AckRecords(fresh)
	if st := l2.Stats(); st.PendingRecords != 0 {
		t.Errorf("pending %d", st.PendingRecords)
	}
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	if n := segments(t, dir); n != 0 {
		t.Errorf("%d segments left after a clean close", n)
	}
}

// TestKillRightAfterAck: a process killed right after the writer
// acknowledged its last batch (no append or sync tick since) replays
// nothing: replaying would store that batch a second time.
func TestKillRightAfterAck(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	a, b := randomRecords(20, 1), randomRecords(20, 2)
	for _, recs := range [][]flow.Record{a, b} {
		if err := l.Append(recs); err != nil {
			t.Fatal(err)
		}
	}
	l.AckRecords(a)
	l.Ack(b[0].Journal.Frame, len(b))
	l.FlushAcks() // as the writer does after each batch
	l.crash()
	l2 := open(t, dir)
	defer l2.Close()
	n, err := l2.Replay(64, func([]flow.Record) error { return nil })
	if err != nil || n != 0 {
		t.Errorf("replayed %d records (%v), want none: both batches were acknowledged", n, err)
	}
}

// TestPartlyDurableAcrossCrashes: a frame partly durable replays only its
// other records, and what is acknowledged of those after the restart
// counts at the next crash too.
func TestPartlyDurableAcrossCrashes(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	recs := randomRecords(10, 7)
	if err := l.Append(recs); err != nil {
		t.Fatal(err)
	}
	l.Ack(recs[0].Journal.Frame, 3) // records 0, 1, 2
	l.FlushAcks()
	l.crash()
	replay := func(l *Log) []flow.Record {
		var got []flow.Record
		if _, err := l.Replay(4, func(b []flow.Record) error { got = append(got, b...); return nil }); err != nil {
			t.Fatal(err)
		}
		return got
	}
	l2 := open(t, dir)
	got := replay(l2)
	if len(got) != 7 || got[0].Journal.Frame != recs[3].Journal.Frame {
		t.Fatalf("first restart replayed %d records from %#x, want 7 from %#x", len(got), got[0].Journal.Frame, recs[3].Journal.Frame)
	}
	l2.AckRecords(got[:3]) // records 3, 4, 5
	l2.crash()
	l3 := open(t, dir)
	got = replay(l3)
	if len(got) != 4 || got[0].Journal.Frame != recs[6].Journal.Frame {
		t.Fatalf("second restart replayed %d records, want 4 from record 6", len(got))
	}
	for i := range got {
		w := recs[6+i]
		got[i].Journal, w.Journal = flow.JournalRefs{}, flow.JournalRefs{}
		if !reflect.DeepEqual(got[i], w) {
			t.Fatalf("replayed record %d differs", i)
		}
	}
	for i := range got {
		got[i].Journal = recs[6+i].Journal
	}
	l3.AckRecords(got)
	if err := l3.Close(); err != nil {
		t.Fatal(err)
	}
	if n := segments(t, dir); n != 0 {
		t.Errorf("%d segments left once everything was acknowledged", n)
	}
}

// TestBigBatchSplitIntoFrames: a batch of more records than a frame holds
// is journaled as several frames, each record under its own reference.
func TestBigBatchSplitIntoFrames(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Config{Dir: dir}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	recs := make([]flow.Record, MaxFrameRecords+10)
	if err := l.Append(recs); err != nil {
		t.Fatal(err)
	}
	seen := map[uint64]bool{}
	for i := range recs {
		if f := recs[i].Journal.Frame; f == 0 || seen[f] {
			t.Fatalf("record %d: reference %#x", i, f)
		} else {
			seen[f] = true
		}
	}
	if refFrame(recs[0].Journal.Frame) == refFrame(recs[len(recs)-1].Journal.Frame) {
		t.Error("one frame for more than MaxFrameRecords records")
	}
	l.AckRecords(recs)
	if st := l.Stats(); st.PendingRecords != 0 {
		t.Errorf("pending %d", st.PendingRecords)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestReadsOlderSegments: segments an older collector wrote are replayed
// whole after an upgrade. testdata/v03.wal holds two frames of
// randomRecords(20, 11) (10 records each, none acknowledged) as format 03
// wrote them (absolute times, plain strings); formats 01 and 02 encode
// records the same way, so the same segment relabelled must replay too.
// (A field added to flow.Record later reads as zero from these segments:
// clear it in want.)
func TestReadsOlderSegments(t *testing.T) {
	v03, err := os.ReadFile("testdata/v03.wal")
	if err != nil {
		t.Fatal(err)
	}
	want := randomRecords(20, 11)
	for _, magic := range []string{segMagicV3, segMagicV2, segMagicV1} {
		t.Run(magic[:7], func(t *testing.T) {
			dir := t.TempDir()
			seg := append([]byte(magic), v03[len(magic):]...)
			if err := os.WriteFile(filepath.Join(dir, "00000000000000000001"+segSuffix), seg, 0o600); err != nil {
				t.Fatal(err)
			}
			l := open(t, dir)
			defer l.Close()
			var got []flow.Record
			n, err := l.Replay(64, func(recs []flow.Record) error {
				got = append(got, recs...)
				return nil
			})
			if err != nil || n != len(want) {
				t.Fatalf("replayed %d (%v), want %d", n, err, len(want))
			}
			for i := range got {
				if got[i].Journal.Frame == 0 {
					t.Errorf("record %d has no journal reference", i)
				}
				got[i].Journal = flow.JournalRefs{}
				if !reflect.DeepEqual(got[i], want[i]) {
					t.Fatalf("record %d:\n got %+v\nwant %+v", i, got[i], want[i])
				}
			}
			// New frames go to a new segment of the current format, and
			// replay the same way.
			recs := decodedRecords(5)
			if err := l.Append(recs); err != nil {
				t.Fatal(err)
			}
			l.crash()
			l2 := open(t, dir)
			defer l2.Close()
			var again []flow.Record
			if n, err := l2.Replay(64, func(rs []flow.Record) error { again = append(again, rs...); return nil }); err != nil || n != len(want)+len(recs) {
				t.Fatalf("after appending to the upgraded log: replayed %d (%v), want %d", n, err, len(want)+len(recs))
			}
			for i, r := range again[len(want):] {
				if r.Journal.Frame != recs[i].Journal.Frame {
					t.Errorf("new record %d replayed as %d, journaled as %d", i, r.Journal.Frame, recs[i].Journal.Frame)
				}
				if !reflect.DeepEqual(r, recs[i]) {
					t.Fatalf("new record %d:\n got %+v\nwant %+v", i, r, recs[i])
				}
			}
		})
	}
}

// TestSegmentsDeletedInOrder: a fully acknowledged segment goes only when
// every older one has gone, and the active one stays.
func TestSegmentsDeletedInOrder(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	defer l.Close()
	var batches [][]flow.Record
	for i := range 40 {
		recs := randomRecords(100, uint64(i))
		if err := l.Append(recs); err != nil {
			t.Fatal(err)
		}
		batches = append(batches, recs)
	}
	before := segments(t, dir)
	for _, b := range batches[1:] {
		l.AckRecords(b)
	}
	if n := segments(t, dir); n != before {
		t.Errorf("segments deleted while the oldest is not acknowledged: %d → %d", before, n)
	}
	l.AckRecords(batches[0])
	if n := segments(t, dir); n != 1 {
		t.Errorf("%d segments after every frame is acknowledged, want the active one", n)
	}
}

// TestTornTail: a frame cut by a crash ends its segment; what came before
// it is replayed.
func TestTornTail(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	for i := range 3 {
		if err := l.Append(randomRecords(10, uint64(i))); err != nil {
			t.Fatal(err)
		}
	}
	path := l.active.path
	l.crash()
	fi, _ := os.Stat(path)
	if err := os.Truncate(path, fi.Size()-7); err != nil {
		t.Fatal(err)
	}
	l2 := open(t, dir)
	defer l2.Close()
	n, err := l2.Replay(1000, func([]flow.Record) error { return nil })
	if err != nil || n != 20 {
		t.Fatalf("replayed %d, %v; want the 20 records before the torn frame", n, err)
	}
}

func TestLocked(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	defer l.Close()
	if _, err := Open(Config{Dir: dir}, nil, nil); err == nil {
		t.Fatal("second Open of the same directory succeeded")
	}
}

func FuzzReadSegment(f *testing.F) {
	dir := f.TempDir()
	l, _ := Open(Config{Dir: dir}, nil, nil)
	_ = l.Append(randomRecords(3, 1))
	path := l.active.path
	l.crash()
	seed, _ := os.ReadFile(path)
	f.Add(seed)
	f.Fuzz(func(t *testing.T, b []byte) {
		p := filepath.Join(t.TempDir(), "00000000000000000001.wal")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		_ = readSegment(p, func(kind byte, id uint64, payload []byte, delta bool) error {
			if kind == frameData {
				d := decoder{b: payload, delta: delta}
				n := d.uvarint()
				var prev flow.Record
				for i := uint64(0); i < n && d.err == nil; i++ {
					var r flow.Record
					d.record(&r, &prev)
					prev = r
				}
			}
			return nil
		}, func(string, int64, error) {})
	})
}

// decodedRecords returns n records shaped as the IPFIX listeners journal
// them (decoded, not yet enriched): 60% IPv4 and 40% IPv6, node names, TCP
// states, the exporter's node, source and address on every record, a
// Service on every fourth, one receive time per message of 50 records.
func decodedRecords(n int) []flow.Record {
	recs := make([]flow.Record, n)
	received := time.Unix(1_780_000_000, 123_456_789).UTC()
	states := []string{"ESTABLISHED", "TIME_WAIT", "CLOSE", "SYN_SENT"}
	for i := range recs {
		r := &recs[i]
		if i%50 < 30 {
			r.SrcAddr = netip.AddrFrom4([4]byte{198, 18, byte(1 + i%2), byte(i)})
			r.DstAddr = netip.AddrFrom4([4]byte{198, 18, byte(2 - i%2), byte(i * 7)})
			r.IPVersion = 4
		} else {
			r.SrcAddr = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, byte(1 + i%2), 14: byte(i >> 8), 15: byte(i)})
			r.DstAddr = netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, byte(2 - i%2), 14: 1, 15: byte(i)})
			r.IPVersion = 6
		}
		r.SrcPort, r.DstPort, r.Proto = uint16(30000+i), 8080, flow.ProtoTCP
		if i%5 == 0 {
			r.Proto = flow.ProtoUDP
		} else {
			r.TCPState = states[i%len(states)]
		}
		r.TimeReceived = received.Add(time.Duration(i/50) * time.Millisecond)
		r.FlowEnd = time.UnixMilli(r.TimeReceived.UnixMilli() - int64(i%1000)).UTC()
		r.FlowStart = r.FlowEnd.Add(-time.Duration(i%7) * time.Second)
		r.Packets, r.Bytes, r.ReversePackets, r.ReverseBytes = uint64(i), uint64(i*100), uint64(i), uint64(i*90)
		r.PacketsDelta, r.BytesDelta = uint64(i%10), uint64(i%10*100)
		r.EndReason, r.Type = flow.EndReasonActiveTimeout, flow.FlowTypeInterNode
		r.ExporterNode, r.Source = "node-1", "conntrack"
		r.ExporterAddr = netip.MustParseAddr("fd00:10::1")
		r.Src.NodeName, r.Dst.NodeName = "node-1", "node-2"
		r.Ingress.Rule, r.Egress.Rule = -1, -1
		if i%4 == 0 {
			if r.IPVersion == 4 {
				r.ServiceAddr = netip.AddrFrom4([4]byte{198, 19, 0, 10})
			} else {
				r.ServiceAddr = netip.MustParseAddr("fd00:10:ff::10")
			}
			r.ServicePort = 80
		}
	}
	return recs
}

// BenchmarkAppendDecoded journals batches of 1,024 records shaped as the
// listeners journal them and acknowledges them (so segments are deleted as
// in steady state); B/record is the journal's size per record.
func BenchmarkAppendDecoded(b *testing.B) {
	l, err := Open(Config{Dir: b.TempDir()}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	recs := decodedRecords(1024)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		for i := range recs {
			recs[i].Journal = flow.JournalRefs{}
		}
		if err := l.Append(recs); err != nil {
			b.Fatal(err)
		}
		l.AckRecords(recs)
	}
	n := float64(b.N * len(recs))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/n, "ns/record")
	b.ReportMetric(testutil.ToFloat64(l.m.bytes)/n, "B/record")
}

func BenchmarkAppendAck(b *testing.B) {
	dir := b.TempDir()
	l, err := Open(Config{Dir: dir}, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	src := randomRecords(1024, 7)
	recs := make([]flow.Record, len(src))
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		copy(recs, src)
		if err := l.Append(recs); err != nil {
			b.Fatal(err)
		}
		l.AckRecords(recs)
	}
	b.ReportMetric(float64(b.N*len(src))/b.Elapsed().Seconds(), "records/s")
}

// TestIntentOfStoredBatch: a batch inserted but not acknowledged at a
// crash (its intent written, its ack not) is not replayed when the store
// says it holds the token; a batch the store does not hold, and records
// in no intent, are; and when the store cannot answer everything not
// acknowledged is replayed.
func TestIntentOfStoredBatch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		stored func([]Intent) (map[string]bool, error)
	}{
		{"store answers", nil},
		{"store unreachable", func([]Intent) (map[string]bool, error) { return nil, errors.New("connection refused") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			l := open(t, dir)
			a, b, c := randomRecords(30, 1), randomRecords(30, 2), randomRecords(30, 3)
			for _, recs := range [][]flow.Record{a, b, c} {
				if err := l.Append(recs); err != nil {
					t.Fatal(err)
				}
			}
			// Batch "stored": a's last 20 records and b's first 10
			// (a merged pair among them), inserted, not acknowledged.
			// Batch "lost": b's next 10, its insert cut by the crash.
			// Batch "acked": a's first 10, stored and acknowledged.
			runs := func(recs []flow.Record) []uint64 { return []uint64{recs[0].Journal.Frame, uint64(len(recs))} }
			l.Intent("acked", 1, 2, 10, runs(a[:10]))
			l.AckRecords(a[:10])
			l.Intent("stored", 1000, 2000, 30, slices.Concat(runs(a[10:]), runs(b[:10])))
			l.Intent("lost", 1000, 2000, 10, runs(b[10:20]))
			l.crash()

			l2 := open(t, dir)
			defer l2.Close()
			var asked []Intent
			stored := tc.stored
			if stored == nil {
				stored = func(in []Intent) (map[string]bool, error) {
					asked = in
					return map[string]bool{"stored": true, "acked": true}, nil
				}
			}
			var got []flow.Record
			n, err := l2.ReplayVerified(64, stored, func(recs []flow.Record) error {
				got = append(got, recs...)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			want := slices.Concat(a[10:], b, c)
			if tc.stored == nil {
				want = slices.Concat(b[10:], c)
				// Only intents with records not acknowledged are asked about.
				if len(asked) != 2 || asked[0].Token != "stored" || asked[1].Token != "lost" ||
					asked[0].MinEnd != 1000 || asked[0].MaxEnd != 2000 || asked[0].Rows != 30 || len(asked[0].Runs) != 4 {
					t.Errorf("asked about %+v, want the intents stored and lost", asked)
				}
			}
			if n != len(want) || len(got) != len(want) {
				t.Fatalf("replayed %d (%d), want %d", n, len(got), len(want))
			}
			for i := range got {
				if got[i].Journal.Frame != want[i].Journal.Frame {
					t.Fatalf("replayed record %d is %#x, want %#x", i, got[i].Journal.Frame, want[i].Journal.Frame)
				}
			}
			// Acknowledging what was replayed empties the log: the
			// records of the stored batch count as durable.
			l2.AckRecords(got)
			if st := l2.Stats(); st.PendingRecords != 0 {
				t.Errorf("pending %d after acknowledging the replay", st.PendingRecords)
			}
			if err := l2.Close(); err != nil {
				t.Fatal(err)
			}
			if n := segments(t, dir); n != 0 {
				t.Errorf("%d segments left", n)
			}
		})
	}
}

// TestIntentAcrossTwoCrashes: the intents of the first run still count
// after a second crash that came before the replayed records were
// acknowledged, even when the store cannot be asked at the second
// restart.
func TestIntentAcrossTwoCrashes(t *testing.T) {
	dir := t.TempDir()
	l := open(t, dir)
	a := randomRecords(40, 5)
	if err := l.Append(a); err != nil {
		t.Fatal(err)
	}
	l.Intent("s1", 1, 2, 20, []uint64{a[0].Journal.Frame, 20})
	l.crash()
	for round := range 2 {
		// The store answers the first restart only: what it verified is
		// written back, so the second does not need to ask.
		stored := func([]Intent) (map[string]bool, error) { return map[string]bool{"s1": true}, nil }
		if round > 0 {
			stored = func([]Intent) (map[string]bool, error) { return nil, errors.New("store down") }
		}
		l2 := open(t, dir)
		n, err := l2.ReplayVerified(64, stored, func([]flow.Record) error { return nil })
		if err != nil || n != 20 {
			t.Fatalf("round %d: replayed %d (%v), want the 20 records of no stored batch", round, n, err)
		}
		l2.crash()
	}
}

// TestShortWriteKeepsLaterFrames: a frame cut short by a full disk (here
// the file size limit, EFBIG) is not left torn in the segment: the frames
// written once space is back are replayed, not skipped with the rest of
// the segment.
func TestShortWriteKeepsLaterFrames(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Config{Dir: dir, SegmentAge: time.Hour, SegmentBytes: 64 << 20}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := randomRecords(20, 1)
	if err := l.Append(before); err != nil {
		t.Fatal(err)
	}
	l.mu.Lock()
	size := l.active.size
	l.mu.Unlock()
	var old syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_FSIZE, &old); err != nil {
		t.Fatal(err)
	}
	lim := old
	lim.Cur = uint64(size) + 100 // room for part of the next frame only
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		t.Skipf("setrlimit: %v", err)
	}
	cut := randomRecords(200, 2)
	err = l.Append(cut)
	if rerr := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &old); rerr != nil {
		t.Fatal(rerr)
	}
	if err == nil {
		t.Fatal("append over the file size limit succeeded")
	}
	if cut[0].Journal.Frame != 0 {
		t.Fatal("records of the failed frame are marked journaled")
	}
	after := randomRecords(20, 3)
	if err := l.Append(after); err != nil {
		t.Fatal(err)
	}
	l.crash()
	l2 := open(t, dir)
	defer l2.Close()
	var got []flow.Record
	if _, err := l2.Replay(64, func(recs []flow.Record) error { got = append(got, recs...); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(before)+len(after) {
		t.Fatalf("replayed %d records, want the %d journaled before and after the failed write", len(got), len(before)+len(after))
	}
}
