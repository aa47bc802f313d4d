package chdb

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Error is an exception raised by the ClickHouse engine.
type Error struct {
	// Code is the ClickHouse error code (62 SYNTAX_ERROR, 60 UNKNOWN_TABLE,
	// 164 READONLY, ...); 0 when the engine gave no code.
	Code int
	// Name is the symbolic code name when the text carries one, e.g. "SYNTAX_ERROR".
	Name string
	// Message is the exception text after the "Code: N. DB::Exception: " prefix.
	Message string
}

// Error renders the exception the way ClickHouse prints it:
// "Code: 62. DB::Exception: Syntax error: ...".
func (e *Error) Error() string {
	if e.Code == 0 {
		return "chdb: " + e.Message
	}
	return fmt.Sprintf("Code: %d. DB::Exception: %s", e.Code, e.Message)
}

// Well-known ClickHouse error codes.
const (
	CodeSyntaxError    = 62
	CodeUnknownTable   = 60
	CodeUnknownSetting = 115
	CodeReadonly       = 164
)

var (
	// ErrLocked means another process holds the data directory. chDB allows
	// one process per directory; usually a running collector owns it.
	ErrLocked = errors.New("chdb data directory is locked by another process (likely a running dualflow collector); " +
		"query that process over its ClickHouse HTTP endpoint instead, e.g. curl 'http://127.0.0.1:8123/?query=SELECT+1', or stop it first")
	// ErrOtherDir means this process already has a different data directory
	// open; chDB runs one data directory per process at a time.
	ErrOtherDir = errors.New("chdb: another data directory is open in this process (chDB allows one per process)")
	// ErrClosed is returned by calls on a closed DB.
	ErrClosed = errors.New("chdb: database is closed")
)

var (
	codeRe = regexp.MustCompile(`^Code:\s*(\d+)\.\s*`)
	nameRe = regexp.MustCompile(`\(([A-Z][A-Z0-9_]+)\)`)
)

// parseError turns engine error text into *Error. Text without a
// "Code: N." prefix keeps Code 0.
func parseError(text string) *Error {
	msg := strings.TrimSpace(text)
	e := &Error{}
	if m := codeRe.FindStringSubmatch(msg); m != nil {
		e.Code, _ = strconv.Atoi(m[1])
		msg = msg[len(m[0]):]
		if i := strings.Index(msg, ": "); i > 0 && !strings.ContainsAny(msg[:i], " \t\n") &&
			strings.Contains(strings.ToLower(msg[:i]), "exception") {
			msg = msg[i+2:]
		}
	}
	if ms := nameRe.FindAllStringSubmatch(msg, -1); ms != nil {
		e.Name = ms[len(ms)-1][1]
	}
	e.Message = msg
	return e
}
