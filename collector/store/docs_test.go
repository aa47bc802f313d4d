package store

import (
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
)

// TestSchemaDocExamples runs every ```sql block of docs/schema.md against the
// real engine, on IPv4 and IPv6 rows, so the documented queries keep working
// as the schema evolves.
func TestSchemaDocExamples(t *testing.T) {
	e := needEngine(t)
	doc, err := os.ReadFile("../../docs/schema.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(string(doc), -1)
	if len(blocks) < 8 {
		t.Fatalf("found %d sql examples in docs/schema.md, want at least 8", len(blocks))
	}
	truncate(t, e)
	var recs []flow.Record
	now := time.Now().UTC()
	for i := 0; i < 20; i++ {
		r := sampleRecord(i, i%2 == 0)
		r.FlowEnd, r.FlowStart = now.Add(-time.Duration(i)*time.Minute), now.Add(-time.Hour)
		recs = append(recs, r)
	}
	insertRecords(t, e, "", recs...)
	for _, b := range blocks {
		q := strings.TrimSuffix(strings.TrimSpace(b[1]), ";")
		out, err := e.Query(context.Background(), q, "TabSeparated")
		if err != nil {
			t.Errorf("docs/schema.md example failed: %v\n%s", err, q)
			continue
		}
		if strings.Contains(q, "ip_version = 6") && len(strings.TrimSpace(string(out))) == 0 {
			t.Errorf("IPv6 example returned no rows on IPv6 data:\n%s", q)
		}
	}
}
