package chhttp

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ClickHouse/ch-go/proto"

	"github.com/dualflow/dualflow/internal/defaults"
)

// Defaults of the bounds on requests (Config).
const (
	// DefaultMaxRequestTime bounds a request from its first byte to its
	// answer: a statement still running then is killed.
	DefaultMaxRequestTime = 10 * time.Minute
	// DefaultMinDataRate is the least average rate, in bytes per second,
	// at which an INSERT's data must keep arriving once DataRateGrace has
	// passed: a client trickling a byte every few seconds holds an engine
	// slot for no more than the grace plus what it sent at this rate.
	// 64 KiB/s is far below any real exporter or collector batch (a
	// 10,000-row batch is a few MB, sent in milliseconds).
	DefaultMinDataRate = 64 << 10
	// DefaultReadersPerUser bounds the requests of one user (or, without
	// credentials, one source) still sending their query text.
	DefaultReadersPerUser = 16
)

// queueWait is how long a request waits for one of the engine slots
// shared by every request but the inserter's INSERTs, before 503. A
// variable for the tests.
var queueWait = 5 * time.Second

// DataRateGrace is the time a request may take before its average rate
// is judged (connection set-up, a client building its batch). A variable
// for the tests.
var DataRateGrace = 10 * time.Second

// ReaderLimits are the engine settings every request of a read-only user
// (the reader, anonymous read-only access) runs under. A request may
// tighten them through URL settings, never loosen them: a reader used to
// lift max_execution_time and max_memory_usage to 0 (no limit).
type ReaderLimits struct {
	MaxExecutionTime time.Duration // max_execution_time
	MaxMemoryBytes   int64         // max_memory_usage
	MaxThreads       int           // max_threads
	MaxResultBytes   int64         // max_result_bytes: answers are buffered whole in the collector
}

// DefaultReaderLimits are ReaderLimits' defaults.
var DefaultReaderLimits = ReaderLimits{MaxExecutionTime: 60 * time.Second, MaxMemoryBytes: 1 << 30, MaxThreads: 2, MaxResultBytes: 256 << 20}

func (l *ReaderLimits) setDefaults() {
	d := DefaultReaderLimits
	l.MaxExecutionTime = defaults.Positive(l.MaxExecutionTime, d.MaxExecutionTime)
	l.MaxMemoryBytes = defaults.Positive(l.MaxMemoryBytes, d.MaxMemoryBytes)
	l.MaxThreads = defaults.Positive(l.MaxThreads, d.MaxThreads)
	l.MaxResultBytes = defaults.Positive(l.MaxResultBytes, d.MaxResultBytes)
}

// bounds are the limit settings of l, by name, as the engine takes them.
func (l ReaderLimits) bounds() map[string]int64 {
	return map[string]int64{
		"max_execution_time": int64(l.MaxExecutionTime.Seconds()),
		"max_memory_usage":   l.MaxMemoryBytes,
		"max_threads":        int64(l.MaxThreads),
		"max_result_bytes":   l.MaxResultBytes,
	}
}

// tightenOnly are limit settings a read-only user may set below the
// server's value (0 means no limit, so it is never below), and never
// above; those of ReaderLimits start at the server's value, the others at
// no limit.
var tightenOnly = []string{"max_execution_time", "max_memory_usage", "max_threads", "max_result_bytes",
	"max_result_rows", "max_rows_to_read", "max_bytes_to_read", "max_rows_to_group_by", "max_rows_to_sort",
	"max_block_size", "limit"}

// readerSettings are the other settings a read-only user may send: how
// the answer is written. Settings that name files (format_schema,
// format_template_*, output_format_schema) or change what the engine may
// do are not among them.
var readerSettings = []string{"result_overflow_mode", "session_timezone", "date_time_output_format",
	"output_format_json_quote_64bit_integers", "output_format_json_quote_denormals", "output_format_json_named_tuples_as_objects",
	"output_format_pretty_max_rows", "output_format_pretty_color", "output_format_pretty_grid_charset",
	"output_format_csv_crlf_end_of_line", "output_format_tsv_crlf_end_of_line", "output_format_write_statistics",
	"output_format_decimal_trailing_zeros", "output_format_json_escape_forward_slashes", "output_format_native_encode_types_in_binary_format",
	"format_csv_delimiter", "format_tsv_null_representation", "format_csv_null_representation",
	"extremes", "join_use_nulls", "log_comment", "readonly"}

// readerStatementSettings applies a read-only user's URL settings over
// the server's bounds and returns the settings the statement runs with,
// or the refusal of one the user may not set.
func readerStatementSettings(asked map[string]string, l ReaderLimits) (map[string]string, error) {
	out := map[string]string{}
	for name, v := range l.bounds() {
		out[name] = strconv.FormatInt(v, 10)
	}
	out["result_overflow_mode"] = "throw"
	for name, v := range asked {
		switch {
		case slices.Contains(tightenOnly, name):
			n, err := strconv.ParseFloat(v, 64)
			if err != nil || n < 0 {
				return nil, newError(proto.ErrBadArguments, http.StatusBadRequest, "setting %s: %q is not a number", name, v)
			}
			if cur, bounded := out[name]; bounded {
				c, _ := strconv.ParseFloat(cur, 64)
				if n == 0 || n > c {
					return nil, newError(proto.ErrReadonly, httpStatus(proto.ErrReadonly), "Cannot modify '%s' setting in readonly mode: a read-only user may lower it below %s, not raise or remove it", name, cur)
				}
			}
			if name == "max_execution_time" {
				n = max(n, 1) // the engine reads whole seconds
			}
			out[name] = strconv.FormatFloat(n, 'f', -1, 64)
		case name == "readonly":
			// Whatever was asked, the user reads only (readonly=1 below).
		case slices.Contains(readerSettings, name):
			out[name] = v
		default:
			return nil, newError(proto.ErrReadonly, httpStatus(proto.ErrReadonly), "Cannot modify '%s' setting in readonly mode: a read-only user may set only the output's format and lower the limits (%s)", name, strings.Join(tightenOnly, ", "))
		}
	}
	// readonly=1: no SETTINGS clause in the statement can change any of
	// these (readonly=2 would let it).
	out["readonly"] = "1"
	return out, nil
}

// userGate bounds, per user, the requests reading their query text and
// the requests using the engine, so that one user cannot take every place
// of the server. Safe for concurrent use.
type userGate struct {
	maxReading, maxEngine int

	mu      sync.Mutex
	reading map[string]int
	engine  map[string]int
}

func newUserGate(maxReading, maxEngine int) *userGate {
	return &userGate{maxReading: maxReading, maxEngine: maxEngine, reading: map[string]int{}, engine: map[string]int{}}
}

// enter takes a place of kind ("reading" or "engine") for who; ok is
// false when who holds its cap already. leave gives it back.
func (g *userGate) enter(kind, who string) (leave func(), ok bool) {
	m, limit := g.reading, g.maxReading
	if kind == "engine" {
		m, limit = g.engine, g.maxEngine
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if m[who] >= limit {
		return nil, false
	}
	m[who]++
	var once sync.Once
	return func() {
		once.Do(func() {
			g.mu.Lock()
			defer g.mu.Unlock()
			if m[who]--; m[who] <= 0 {
				delete(m, who)
			}
		})
	}, true
}

// errTooSlow is a request body that arrives below MinDataRate.
var errTooSlow = errors.New("the request's data arrives too slowly")

// paceReader reads a request body under the server's bounds: before each
// read it sets the connection's read deadline to the earliest of
// BodyTimeout from now (a stall), the request's end (MaxRequestTime) and
// the moment its average rate would fall below MinDataRate (after
// DataRateGrace). A client that trickles data therefore holds an engine
// slot for seconds, not for as long as it keeps sending.
type paceReader struct {
	r        io.Reader
	rc       *http.ResponseController
	stall    time.Duration
	minRate  float64 // bytes/s; 0: no minimum
	start    time.Time
	end      time.Time
	n        int64
	tooSlow  bool
	deadline time.Time
}

func (p *paceReader) Read(b []byte) (int, error) {
	now := time.Now()
	d := now.Add(p.stall)
	if p.end.Before(d) {
		d = p.end
	}
	rateD := time.Time{}
	if p.minRate > 0 {
		rateD = p.start.Add(DataRateGrace + time.Duration(float64(p.n)/p.minRate*float64(time.Second)))
		if rateD.Before(now) {
			p.tooSlow = true
			return 0, fmt.Errorf("%w: %d bytes in %s, below %.0f bytes/s", errTooSlow, p.n, now.Sub(p.start).Round(time.Second), p.minRate)
		}
		if rateD.Before(d) {
			d = rateD
		}
	}
	p.deadline = d
	_ = p.rc.SetReadDeadline(d)
	n, err := p.r.Read(b)
	p.n += int64(n)
	if err != nil && !errors.Is(err, io.EOF) && !rateD.IsZero() && !time.Now().Before(rateD) {
		p.tooSlow = true
		return n, fmt.Errorf("%w: %d bytes in %s, below %.0f bytes/s", errTooSlow, p.n, time.Since(p.start).Round(time.Second), p.minRate)
	}
	return n, err
}
