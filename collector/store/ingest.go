package store

import (
	"context"
	"fmt"
	"strings"
)

// BatchRange names a batch the writer sent: its dedup token and the
// flow_end range of its rows (Unix milliseconds; 0, 0 when unknown).
type BatchRange struct {
	Token          string
	MinEnd, MaxEnd int64
}

// maxBatchesPerQuery bounds the tokens of one StoredBatches query.
const maxBatchesPerQuery = 200

// StoredBatches reports, by token, which of batches have rows in
// database.flows. Each row carries ingest_batch, cityHash64 of its insert's
// dedup token (migration 0008); an insert is atomic, so one row of a batch
// means all of it (but for a batch whose rows span two days, which are two
// parts, a crash of the embedded engine between them can keep one). The
// flow_end ranges let the primary key skip all but a few minutes of the
// table. In a replicated cluster a replica that has not fetched a part yet
// answers "not stored": the batch is then replayed and stored twice, as
// without this check.
func StoredBatches(ctx context.Context, conn Conn, database string, batches []BatchRange) (map[string]bool, error) {
	found := map[string]bool{}
	for len(batches) > 0 {
		n := min(len(batches), maxBatchesPerQuery)
		q, err := storedBatchesQuery(database, batches[:n])
		if err != nil {
			return nil, err
		}
		out, err := conn.Query(ctx, q, "TabSeparated")
		if err != nil {
			return nil, fmt.Errorf("look up batches in %s.flows: %w", database, err)
		}
		for _, t := range strings.Fields(string(out)) {
			found[t] = true
		}
		batches = batches[n:]
	}
	return found, nil
}

func storedBatchesQuery(database string, batches []BatchRange) (string, error) {
	var tokens, ranges strings.Builder
	for i, b := range batches {
		if !validToken(b.Token) {
			return "", fmt.Errorf("look up batches: bad token %q", b.Token)
		}
		if i > 0 {
			tokens.WriteString(", ")
		}
		fmt.Fprintf(&tokens, "'%s'", b.Token)
		if b.MinEnd <= 0 || b.MaxEnd < b.MinEnd {
			ranges.Reset() // unknown range: scan the whole table
			ranges.WriteString("1")
			continue
		}
		if ranges.String() == "1" {
			continue
		}
		if ranges.Len() > 0 {
			ranges.WriteString(" OR ")
		}
		fmt.Fprintf(&ranges, "flow_end BETWEEN fromUnixTimestamp64Milli(toInt64(%d), 'UTC') AND fromUnixTimestamp64Milli(toInt64(%d), 'UTC')", b.MinEnd, b.MaxEnd)
	}
	return fmt.Sprintf(`SELECT t FROM (SELECT arrayJoin([%[2]s]) AS t)
WHERE cityHash64(t) IN (
    SELECT ingest_batch FROM %[1]s
    WHERE (%[3]s) AND ingest_batch IN (SELECT cityHash64(arrayJoin([%[2]s]))))`,
		qualify(database, FlowsTable), tokens.String(), ranges.String()), nil
}

// validToken accepts the writer's dedup tokens (hex) and little else, so a
// token can be quoted without escaping.
func validToken(t string) bool {
	if t == "" || len(t) > 128 {
		return false
	}
	for _, c := range t {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
