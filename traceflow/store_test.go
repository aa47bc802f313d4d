package traceflow

import (
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/migrations"
)

// fakeExec records statements; Query answers out.
type fakeExec struct {
	queries []string
	out     []byte
}

func (f *fakeExec) Exec(_ context.Context, q string) error {
	f.queries = append(f.queries, q)
	return nil
}

func (f *fakeExec) Query(_ context.Context, q, _ string) ([]byte, error) {
	f.queries = append(f.queries, q)
	return f.out, nil
}

func sampleResult() Result {
	t0 := time.Date(2026, 11, 29, 21, 0, 0, 123e6, time.UTC)
	return Result{
		ID: "tf-1", Request: Request{Source: "frontend/web-1", Destination: Destination{Service: "backend/api-single", Port: 8080}, Family: Dual},
		Phase: Succeeded, Started: t0, Ended: t0.Add(200 * time.Millisecond),
		Families: []FamilyResult{
			{Family: IPv4, Outcome: Delivered, Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.19.0.12"), Protocol: TCP, SrcPort: 40000, DstPort: 8080,
				Duration: Duration(150 * time.Millisecond), Observations: []Observation{
					{Node: "node-1", Component: LoadBalancing, Action: ActionForwarded, Service: "backend/api-single", TranslatedDst: netip.MustParseAddrPort("198.18.1.11:8080")},
					{Node: "node-1", Component: Delivery, Action: ActionDelivered, Pod: "backend/api-1", Interface: "eth0"},
				}},
			{Family: IPv6, Outcome: NoAddress, Reason: `service backend/api-single has no IPv6 ClusterIP; it's a \ test` + "\n", Observations: []Observation{}},
		},
	}
}

func TestInsertSQLEscapes(t *testing.T) {
	f := &fakeExec{}
	s := NewStore(f, "")
	if err := s.Save(context.Background(), sampleResult()); err != nil {
		t.Fatal(err)
	}
	q := f.queries[0]
	for _, want := range []string{"INSERT INTO dualflow.traceflows (", `'service backend/api-single has no IPv6 ClusterIP; it\'s a \\ test\x0a'`,
		"'198.18.1.11:8080'", "'backend/api-1'", "fromUnixTimestamp64Milli(1795986000123, 'UTC')"} {
		if !strings.Contains(q, want) {
			t.Errorf("query lacks %s:\n%s", want, q)
		}
	}
	if strings.Contains(q, "\n") {
		t.Error("query spans lines")
	}
	if _, err := s.InsertSQL(Result{ID: "x"}); err == nil {
		t.Error("no families: want an error")
	}
}

// TestStoreChDB writes a result through the embedded engine after the
// migrations (0004 included) and reads it back.
func TestStoreChDB(t *testing.T) {
	e := newEngine(t)
	ctx := context.Background()
	if err := NewStore(e, "dualflow").Save(ctx, sampleResult()); err != nil {
		t.Fatal(err)
	}
	out, err := e.Query(ctx, "SELECT family, outcome, outcome_reason, translated_dst, delivered_pod, src_ip, JSONLength(observations) FROM dualflow.traceflows WHERE trace_id = 'tf-1' ORDER BY family", "TSV")
	if err != nil {
		t.Fatal(err)
	}
	want := "ipv4\tdelivered\t\t198.18.1.11:8080\tbackend/api-1\t198.18.1.10\t2\n" +
		"ipv6\tno-address\t" + `service backend/api-single has no IPv6 ClusterIP; it\'s a \\ test\n` + "\t\t\t\t0\n"
	if string(out) != want {
		t.Errorf("read back:\n%s\nwant:\n%s", out, want)
	}
}

// newEngine opens the embedded engine in a temporary directory and runs
// the migrations; it skips without libchdb unless DUALFLOW_REQUIRE_CHDB=1.
func newEngine(t *testing.T) *store.Embedded {
	t.Helper()
	e, err := store.NewEmbedded(store.EmbeddedConfig{DataDir: t.TempDir()})
	if errors.Is(err, chdb.ErrLibraryNotFound) && os.Getenv("DUALFLOW_REQUIRE_CHDB") != "1" {
		t.Skip("libchdb not available (make deps)")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	r, err := migrations.NewRunner(e, migrations.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Up(context.Background()); err != nil {
		t.Fatal(err)
	}
	return e
}

// stored is r as Store.Load returns it: times at the columns' precision
// (milliseconds, durations microseconds), the request fields and tags the
// table does not keep zero, the request's family and protocol from the
// families.
func stored(r Result) Result {
	r = cloneResult(r)
	r.Started, r.Ended = r.Started.Truncate(time.Millisecond), r.Ended.Truncate(time.Millisecond)
	r.Request = Request{Source: r.Request.Source, Destination: r.Request.Destination, Family: r.Families[0].Family}
	r.Request.Destination.Workload = ""
	if len(r.Families) > 1 {
		r.Request.Family = Dual
	}
	for i := range r.Families {
		fr := &r.Families[i]
		fr.Tag = 0
		fr.Duration = Duration(time.Duration(fr.Duration).Truncate(time.Microsecond))
		if r.Request.Protocol == "" {
			r.Request.Protocol = fr.Protocol
		}
	}
	return r
}

func jsonText(t *testing.T, v any) string {
	t.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// hostile holds strings that break naive quoting or TSV: quotes,
// backslashes, tabs, newlines, NUL, non-ASCII.
const hostile = "it's a \\ \"test\"\twith\ttabs\nand lines\r\x00 – ünïcode \\'; DROP TABLE x; --"

// roundTripResults are one result per family mode, with lab addresses.
func roundTripResults() map[string]Result {
	t0 := time.Date(2026, 11, 29, 21, 0, 0, 123456789, time.UTC)
	v4 := FamilyResult{Family: IPv4, Outcome: Delivered, Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.19.0.12"),
		Protocol: TCP, SrcPort: 40000, DstPort: 8080, Tag: 3, Duration: Duration(150*time.Millisecond + 1234567),
		Observations: []Observation{
			{Node: "node-1", Component: Forwarding, Action: ActionReceived, Interface: "veth1"},
			{Node: "node-1", Component: LoadBalancing, Action: ActionForwarded, Service: "backend/api",
				TranslatedSrc: netip.MustParseAddrPort("198.18.1.1:40000"), TranslatedDst: netip.MustParseAddrPort("198.18.2.11:8080")},
			{Node: "node-2", Component: Delivery, Action: ActionDelivered, Pod: "backend/api-1", Interface: "eth0", Detail: hostile},
		}}
	v6 := FamilyResult{Family: IPv6, Outcome: Dropped, Reason: hostile, Src: netip.MustParseAddr("fd00:10:0:1::10"), Dst: netip.MustParseAddr("fd00:10:ff::12"),
		Protocol: TCP, SrcPort: 40000, DstPort: 8080, Tag: 4, Duration: Duration(2 * time.Second),
		Observations: []Observation{
			{Node: "node-1", Component: NetworkPolicy, Action: ActionDropped, Policy: "backend/deny-all", Rule: "drop/ingress/backend/api-1"},
		}}
	noV6 := FamilyResult{Family: IPv6, Outcome: NoAddress, Reason: "service backend/api-single has no IPv6 ClusterIP", Observations: []Observation{}}
	base := func(id string, f Family, d Destination, frs ...FamilyResult) Result {
		return Result{ID: id, Phase: Succeeded, Started: t0, Ended: t0.Add(2*time.Second + 999999),
			Request:  Request{Source: "frontend/web-1", Destination: d, Family: f, Protocol: TCP, SrcPort: 40000, TCPFlags: 0x02, TTL: 9, Timeout: Duration(3 * time.Second)},
			Families: frs}
	}
	dual := base("tf-00000000000000d1", Dual, Destination{Service: "backend/api", Port: 8080}, v4, v6)
	dual.Phase, dual.Reason = Failed, "ipv6: "+hostile
	return map[string]Result{
		"ipv4":         base("tf-0000000000000004", IPv4, Destination{Pod: "backend/api-1", Port: 8080}, v4),
		"ipv6":         base("tf-0000000000000006", IPv6, Destination{IP: netip.MustParseAddr("fd00:10:0:2::11"), Port: 8080}, v6),
		"dual":         dual,
		"dual no IPv6": base("tf-00000000000000d2", Dual, Destination{IP: netip.MustParseAddr("198.18.2.11"), Port: 8080}, v4, noV6),
	}
}

// TestStoreLoadChDB saves results through the embedded engine and reads
// them back equal (at the columns' precision).
func TestStoreLoadChDB(t *testing.T) {
	e := newEngine(t)
	s := NewStore(e, "dualflow")
	ctx := context.Background()
	results := roundTripResults()
	for _, r := range results {
		if err := s.Save(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for name, r := range results {
		t.Run(name, func(t *testing.T) {
			got, err := s.Load(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			if g, w := jsonText(t, got), jsonText(t, stored(r)); g != w {
				t.Errorf("loaded:\n%s\nwant:\n%s", g, w)
			}
			if !reflect.DeepEqual(got, stored(r)) {
				t.Errorf("loaded %+v\nwant %+v", got, stored(r))
			}
		})
	}
	// A retried insert doubles the rows; Load still gives one per family.
	if err := s.Save(ctx, results["dual"]); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Load(ctx, results["dual"].ID); err != nil || len(got.Families) != 2 {
		t.Errorf("after a second save: %d families, %v", len(got.Families), err)
	}
}

var hostileIDs = []string{
	"", "tf-", "tf-1", "tf-0000000000000abc", // well formed, never saved
	"tf-0000000000000004' OR 1=1 --", "tf-0000000000000004\\' OR '1'='1", `\'; DROP TABLE dualflow.traceflows; --`,
	"tf-0000000000000004\n", "tf-000000000000000\x00", "TF-0000000000000004", "tf-0000000000000ABC",
	"tf-" + strings.Repeat("\\'", 1<<15), strings.Repeat("a", 1<<20),
}

// TestStoreLoadHostileIDChDB: ids that are not the controller's, or not
// saved, are not found, and never make a query fail.
func TestStoreLoadHostileIDChDB(t *testing.T) {
	e := newEngine(t)
	s := NewStore(e, "dualflow")
	ctx := context.Background()
	if err := s.Save(ctx, roundTripResults()["ipv4"]); err != nil {
		t.Fatal(err)
	}
	for _, id := range hostileIDs {
		if _, err := s.Load(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Errorf("Load(%.40q): %v, want ErrNotFound", id, err)
		}
	}
	// Quoted, even a hostile id is only a literal to the engine.
	for _, id := range hostileIDs[4:8] {
		out, err := e.Query(ctx, s.SelectSQL(id), "TSV")
		if err != nil || len(out) != 0 {
			t.Errorf("SelectSQL(%.40q): %q %v, want no row and no error", id, out, err)
		}
	}
	if _, err := s.Load(ctx, "tf-0000000000000004"); err != nil {
		t.Errorf("the table after the hostile ids: %v", err)
	}
}

func TestStoreLoadRejectsIDs(t *testing.T) {
	f := &fakeExec{out: []byte("not\tused\n")}
	s := NewStore(f, "")
	for _, id := range hostileIDs[2:] {
		if _, err := s.Load(context.Background(), id); !errors.Is(err, ErrNotFound) && id != "tf-0000000000000abc" {
			t.Errorf("Load(%.40q): %v, want ErrNotFound", id, err)
		}
	}
	if len(f.queries) != 1 {
		t.Errorf("queried %d times, want once (for the one well-formed id): %.200q", len(f.queries), f.queries)
	}
	// A malformed row is an error, not a result.
	if _, err := s.Load(context.Background(), "tf-0000000000000abc"); err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("malformed row: %v", err)
	}
}
