// Package chsql builds the ClickHouse SQL of the web API, the audit
// reports and traceflow's store, reads their JSONEachRow answers (Decode),
// and is the one quoting of the project:
// the store's connections have no server-side parameters, so every value
// that reaches a statement (filters, reports, traceflow's rows, the
// migrations' ledger, the engine's connection settings) goes through
// String (or Eq, In, Time, IPv6, built on it), every name through Ident.
// Column names and expressions are the callers' constants, never input.
package chsql

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// String returns s as a ClickHouse string literal. Backslash and quote
// are escaped, and every control byte (NUL included, which would end the
// engine's reading of the text) is written as \xHH, so the literal cannot
// be closed early whatever s holds and the statement stays one line.
func String(s string) string {
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('\'')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '\\':
			b.WriteString(`\\`)
		case c == '\'':
			b.WriteString(`\'`)
		case c < 0x20 || c == 0x7f:
			b.WriteString(`\x`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('\'')
	return b.String()
}

// Ident returns s as a backquoted ClickHouse identifier (a database, a
// table, a setting's name).
func Ident(s string) string {
	return "`" + strings.NewReplacer(`\`, `\\`, "`", "\\`").Replace(s) + "`"
}

// Time returns t as a DateTime64(3, 'UTC') literal, to the millisecond.
func Time(t time.Time) string { return Millis(t.UnixMilli()) }

// Millis returns the DateTime64(3, 'UTC') literal of ms milliseconds
// since the epoch.
func Millis(ms int64) string {
	return "fromUnixTimestamp64Milli(" + strconv.FormatInt(ms, 10) + ", 'UTC')"
}

// The flows table's time column, and its minute, the head of its sort key.
const (
	FlowEndCol = "flow_end"
	MinuteKey  = "toStartOfMinute(flow_end)"
)

// IPv6 returns the IPv6-typed literal of a (IPv4 mapped), to compare with
// the *_ip_bin columns.
func IPv6(a netip.Addr) string { return "toIPv6(" + String(a.Unmap().String()) + ")" }

// Eq is col = v, v quoted.
func Eq(col, v string) string { return col + " = " + String(v) }

// In is col IN (vs), each quoted.
func In(col string, vs []string) string {
	q := make([]string, len(vs))
	for i, v := range vs {
		q[i] = String(v)
	}
	return col + " IN (" + strings.Join(q, ", ") + ")"
}

// And is the conjunction of conds, in parentheses when there are several.
func And(conds ...string) string { return join(" AND ", conds) }

// Or is the disjunction of conds, in parentheses when there are several.
func Or(conds ...string) string { return join(" OR ", conds) }

func join(op string, conds []string) string {
	if len(conds) == 1 {
		return conds[0]
	}
	return "(" + strings.Join(conds, op) + ")"
}

// Window selects the rows whose time column col is in [since, until).
// The same bounds on toStartOfMinute(col), the head of the flows' sort
// key, let the engine skip the granules of a merged part outside the
// window: on flow_end alone it reads every granule of the part (a day once
// merged), 3.3M rows instead of 0.6M for a filtered page a day back at
// 100M rows (docs/scale.md).
func Window(col string, since, until time.Time) string {
	m := "toStartOfMinute(" + col + ")"
	return col + " >= " + Time(since) + " AND " + col + " < " + Time(until) +
		" AND " + m + " >= " + Time(since.Truncate(time.Minute)) + " AND " + m + " <= " + Time(until.Truncate(time.Minute))
}

// FlowEnd selects the flows table's rows whose flow_end is in [since,
// until).
func FlowEnd(since, until time.Time) string { return Window(FlowEndCol, since, until) }

// A Tier is a part of a window read at one granularity: Key is the time
// column (rows) or its minute or hour, a key of the projections that sum
// them; Cond selects the part.
type Tier struct{ Key, Cond string }

// Tiers cuts [since, until) of the time column col into whole hours (when
// hours is true) through toStartOfHour(col), whole minutes through
// toStartOfMinute(col), and the rows at either end. ClickHouse answers a
// tier from a projection keyed on its Key when the projection has every
// column the query needs, and from rows otherwise, with the same result.
// The tiers are disjoint and cover the window.
func Tiers(col string, since, until time.Time, hours bool) []Tier {
	var out []Tier
	span := func(key string, from, to time.Time) {
		if !from.Before(to) {
			return
		}
		cond := key + " >= " + Time(from) + " AND " + key + " < " + Time(to)
		if key == col {
			cond = Window(col, from, to)
		}
		out = append(out, Tier{Key: key, Cond: cond})
	}
	m1, m2 := ceil(since, time.Minute), until.Truncate(time.Minute)
	if !m1.Before(m2) {
		span(col, since, until)
		return out
	}
	span(col, since, m1)
	span(col, m2, until)
	minute, hour := "toStartOfMinute("+col+")", "toStartOfHour("+col+")"
	h1, h2 := ceil(m1, time.Hour), m2.Truncate(time.Hour)
	if hours && h1.Before(h2) {
		span(hour, h1, h2)
		span(minute, m1, h1)
		span(minute, h2, m2)
	} else {
		span(minute, m1, m2)
	}
	return out
}

// ceil rounds t up to a multiple of d (Unix time: UTC minutes and hours).
func ceil(t time.Time, d time.Duration) time.Time {
	if f := t.Truncate(d); f.Before(t) {
		return f.Add(d)
	}
	return t
}

// Select is a SELECT statement; String renders it, leaving out the
// clauses that are empty.
type Select struct {
	Cols, From string
	// Where is AND-ed.
	Where                    []string
	GroupBy, Having, OrderBy string
	// Limit is the LIMIT; 0 has none.
	Limit int
	// Settings follows, from " SETTINGS" on (JSONSettings).
	Settings string
}

func (s Select) String() string {
	var b strings.Builder
	b.WriteString("SELECT " + s.Cols + " FROM " + s.From)
	if len(s.Where) > 0 {
		b.WriteString(" WHERE " + strings.Join(s.Where, " AND "))
	}
	for _, c := range [...][2]string{{" GROUP BY ", s.GroupBy}, {" HAVING ", s.Having}, {" ORDER BY ", s.OrderBy}} {
		if c[1] != "" {
			b.WriteString(c[0] + c[1])
		}
	}
	if s.Limit > 0 {
		b.WriteString(" LIMIT " + strconv.Itoa(s.Limit))
	}
	return b.String() + s.Settings
}

// Union joins parts with UNION ALL.
func Union(parts ...string) string { return strings.Join(parts, "\nUNION ALL\n") }

// JSONSettings is the SETTINGS clause of a JSONEachRow read: 64-bit
// integers as plain JSON numbers, and memory bounded to maxMemory,
// aggregation and sorting spilling to disk past half of it, so that the
// engine ends a query past the bound rather than let it take the
// process's memory.
func JSONSettings(maxMemory int64) string {
	spill := strconv.FormatInt(maxMemory/2, 10)
	return " SETTINGS output_format_json_quote_64bit_integers = 0, max_memory_usage = " + strconv.FormatInt(maxMemory, 10) +
		", max_bytes_before_external_group_by = " + spill + ", max_bytes_before_external_sort = " + spill
}

// Decode reads JSONEachRow output (see JSONSettings), a T per row.
func Decode[T any](out []byte) ([]T, error) {
	var rows []T
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var v T
		if err := dec.Decode(&v); errors.Is(err, io.EOF) {
			return rows, nil
		} else if err != nil {
			return nil, fmt.Errorf("decode row %d: %w", len(rows), err)
		}
		rows = append(rows, v)
	}
}
