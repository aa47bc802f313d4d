package traceflow

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// execer runs one SQL statement; store.Conn (ClickHouse, chDB) satisfies it.
type execer interface {
	Exec(ctx context.Context, query string) error
}

// Store writes finished results to the traceflows table (migration
// 0004_traceflows.sql), one row per family. It is safe for concurrent use
// when conn is.
type Store struct {
	conn  execer
	table string
}

// NewStore returns a store writing to database.traceflows (database
// defaults to "dualflow"; it must be an identifier, as migrations checks).
func NewStore(conn execer, database string) *Store {
	return &Store{conn: conn, table: cmp.Or(database, "dualflow") + ".traceflows"}
}

var _ resultStore = (*Store)(nil)

// storeColumns are the inserted columns, in InsertSQL's value order.
var storeColumns = []string{"trace_id", "started", "ended", "phase", "phase_reason", "source_pod", "destination",
	"family", "outcome", "outcome_reason", "protocol", "src_ip", "dst_ip", "src_port", "dst_port",
	"translated_dst", "delivered_pod", "last_node", "drop_policy", "drop_rule", "duration_ms", "observations"}

// Save inserts r, one row per family.
func (s *Store) Save(ctx context.Context, r Result) error {
	q, err := s.InsertSQL(r)
	if err != nil {
		return err
	}
	if err := s.conn.Exec(ctx, q); err != nil {
		return fmt.Errorf("save traceflow %s: %w", r.ID, err)
	}
	return nil
}

// InsertSQL returns the INSERT statement of r with every value escaped as
// a ClickHouse literal.
func (s *Store) InsertSQL(r Result) (string, error) {
	if len(r.Families) == 0 {
		return "", fmt.Errorf("save traceflow %s: no family results", r.ID)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "INSERT INTO %s (%s) VALUES", s.table, strings.Join(storeColumns, ", "))
	for i, fr := range r.Families {
		obs, err := json.Marshal(fr.Observations)
		if err != nil {
			return "", fmt.Errorf("save traceflow %s: %w", r.ID, err)
		}
		var translated, pod, last, policy, rule string
		for _, o := range fr.Observations {
			last = o.Node
			if o.TranslatedDst.IsValid() && translated == "" {
				translated = o.TranslatedDst.String()
			}
			if o.Component == Delivery {
				pod = o.Pod
			}
			if o.Component == NetworkPolicy && (o.Action == ActionDropped || o.Action == ActionRejected) {
				policy, rule = o.Policy, o.Rule
			}
		}
		if i > 0 {
			b.WriteByte(',')
		}
		vals := []string{
			quote(r.ID), quoteTime(r.Started), quoteTime(cmp.Or(r.Ended, r.Started)), quote(string(r.Phase)), quote(r.Reason),
			quote(r.Request.Source), quote(r.Request.Destination.String()),
			quote(string(fr.Family)), quote(string(fr.Outcome)), quote(fr.Reason), quote(string(fr.Protocol)),
			quote(addrText(fr.Src.String(), fr.Src.IsValid())), quote(addrText(fr.Dst.String(), fr.Dst.IsValid())),
			strconv.Itoa(int(fr.SrcPort)), strconv.Itoa(int(fr.DstPort)),
			quote(translated), quote(pod), quote(last), quote(policy), quote(rule),
			strconv.FormatFloat(float64(time.Duration(fr.Duration).Microseconds())/1000, 'f', 3, 64),
			quote(string(obs)),
		}
		b.WriteString(" (" + strings.Join(vals, ", ") + ")")
	}
	return b.String(), nil
}

func addrText(s string, ok bool) string {
	if !ok {
		return ""
	}
	return s
}

// quote returns s as a ClickHouse string literal: backslash and quote
// escaped, control characters as \xHH so the statement stays one line.
func quote(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\' || c == '\'':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, `\x%02X`, c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

func quoteTime(t time.Time) string {
	return "toDateTime64(" + quote(t.UTC().Format("2006-01-02 15:04:05.000")) + ", 3, 'UTC')"
}
