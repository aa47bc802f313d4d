package traceflow

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/migrations"
)

type fakeExec struct{ queries []string }

func (f *fakeExec) Exec(_ context.Context, q string) error {
	f.queries = append(f.queries, q)
	return nil
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
	for _, want := range []string{"INSERT INTO dualflow.traceflows (", `'service backend/api-single has no IPv6 ClusterIP; it\'s a \\ test\x0A'`,
		"'198.18.1.11:8080'", "'backend/api-1'", "toDateTime64('2026-11-29 21:00:00.123', 3, 'UTC')"} {
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
	dir := t.TempDir()
	e, err := store.NewEmbedded(store.EmbeddedConfig{DataDir: dir})
	if errors.Is(err, chdb.ErrLibraryNotFound) && os.Getenv("DUALFLOW_REQUIRE_CHDB") != "1" {
		t.Skip("libchdb not available (make deps)")
	}
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx := context.Background()
	r, err := migrations.NewRunner(e, migrations.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Up(ctx); err != nil {
		t.Fatal(err)
	}
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
