package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/dualflow/dualflow/internal/chsql"
)

// BatchRange names a batch the writer sent: its dedup token, the
// flow_end range of its rows (Unix milliseconds; 0, 0 when unknown) and its
// row count (0: unknown).
type BatchRange struct {
	Token          string
	MinEnd, MaxEnd int64
	Rows           int
}

// maxBatchesPerQuery bounds the tokens of one StoredBatches query.
const maxBatchesPerQuery = 200

// StoredBatches reports, by token, which of batches are stored whole in
// database.flows: as many rows carry the token's ingest_batch (cityHash64
// of the insert's dedup token, migration 0008) as the batch had. An
// insert is not atomic everywhere: through a Distributed table each shard
// commits its block, and on one server a batch whose rows span two days is
// two parts; a crash between them leaves part of the batch. Such a batch
// is not reported (its records are replayed: the part stored is then
// stored twice, rather than the rest lost). A batch without a row count
// counts as stored with one row. The flow_end ranges let the primary key
// skip all but a few minutes of the table. A replica that has not fetched
// a part yet, or an insert still being committed when the collector
// restarts (a slow Distributed insert), answers "not stored": the batch is
// then replayed and stored twice, as without this check.
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
		rows := map[string]int{}
		for _, b := range batches[:n] {
			rows[b.Token] = max(b.Rows, 1)
		}
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			t, c, ok := strings.Cut(line, "\t")
			if !ok {
				continue
			}
			if cnt, err := strconv.Atoi(c); err == nil && cnt >= rows[t] {
				found[t] = true
			}
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
		ranges.WriteString("flow_end BETWEEN " + chsql.Millis(b.MinEnd) + " AND " + chsql.Millis(b.MaxEnd))
	}
	return fmt.Sprintf(`SELECT t, n FROM (SELECT arrayJoin([%[2]s]) AS t, cityHash64(t) AS h) AS a
INNER JOIN (
    SELECT ingest_batch AS h, count() AS n FROM %[1]s
    WHERE (%[3]s) AND ingest_batch IN (SELECT cityHash64(arrayJoin([%[2]s])))
    GROUP BY ingest_batch) AS b USING (h)`,
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
