// Package chsql writes values into ClickHouse SQL text. It is the one
// quoting of the project: the store's connections have no server-side
// parameters, so every value that reaches a statement (the web API's
// filters, the audit's reports, traceflow's rows, the migrations' ledger,
// the engine's connection settings) goes through String, and every name
// through Ident, every time through Time.
package chsql

import (
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
