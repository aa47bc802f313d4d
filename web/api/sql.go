package api

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/collector/store/sqlguard"
)

// SQLRequest is the body of POST /sql.
type SQLRequest struct {
	Query string `json:"query"`
	// Format is json (default: columns and rows) or csv (CSVWithNames, as a
	// download).
	Format string `json:"format,omitempty"`
	// MaxRows lowers the server's row limit for this query.
	MaxRows int `json:"max_rows,omitempty"`
}

// SQLResult is the json answer of POST /sql.
type SQLResult struct {
	Columns []SQLColumn `json:"columns"`
	// Rows are the result's first Limits.MaxRows rows.
	Rows [][]any `json:"rows"`
	// Truncated says the result had more rows than Limits.MaxRows: Rows
	// are its first ones (add a LIMIT, or ask for CSV, which says it in
	// the X-Dualflow-Truncated header).
	Truncated bool      `json:"truncated"`
	Elapsed   float64   `json:"elapsed_seconds"`
	Limits    SQLLimits `json:"limits"`
}

// truncatedHeader is set to "true" on a CSV answer of POST /sql cut at
// its row limit.
const truncatedHeader = "X-Dualflow-Truncated"

// SQLColumn is a result column.
type SQLColumn struct {
	Name string `json:"name"`
	Type string `json:"type"`
}

// SQLLimits are the limits the query ran under.
type SQLLimits struct {
	MaxRows          int     `json:"max_rows"`
	MaxExecutionTime float64 `json:"max_execution_seconds"`
	MaxMemoryBytes   int64   `json:"max_memory_bytes"`
	MaxThreads       int     `json:"max_threads"`
}

// maxQueryBytes bounds the query text.
const maxQueryBytes = 64 << 10

// sqlSettings are the engine settings every /sql query runs with:
// readonly=1 forbids writes, DDL and changing settings (so a SETTINGS
// clause in the query cannot lift the limits); sqlguard refuses the rest.
// max_threads and a priority below the API's own reads (uiPriority) keep
// an operator's query from starving the collector's inserts and the UI.
// Past the row limit the engine stops reading (result_overflow_mode
// break) and returns what it has, at least MaxRows+1 rows (it stops at a
// block boundary) so that the handler can tell a cut result from one of
// exactly MaxRows; the handler keeps MaxRows of them.
// maxSQLResultBytes bounds what one POST /sql may bring back from the
// engine, whatever its row limit.
const maxSQLResultBytes = 64 << 20

func sqlSettings(l SQLLimits) map[string]string {
	return map[string]string{
		"readonly":             "1",
		"max_result_rows":      strconv.Itoa(l.MaxRows + 1),
		"result_overflow_mode": "break",
		// break stops at a block boundary (about 65k rows a thread), far
		// past a small max_rows: limit cuts the result itself, and
		// max_result_bytes bounds wide rows.
		"limit":              strconv.Itoa(l.MaxRows + 1),
		"max_result_bytes":   strconv.Itoa(maxSQLResultBytes),
		"max_execution_time": strconv.FormatFloat(l.MaxExecutionTime, 'f', -1, 64),
		"max_memory_usage":   strconv.FormatInt(l.MaxMemoryBytes, 10),
		"max_threads":        strconv.Itoa(l.MaxThreads),
		"priority":           sqlPriority,
	}
}

func (a *API) sql(c *gin.Context) (any, error) {
	var req SQLRequest
	if err := bindJSON(c, &req, maxQueryBytes+4096); err != nil {
		return nil, err
	}
	if strings.TrimSpace(req.Query) == "" {
		return nil, fieldErr("query", "empty query")
	}
	if len(req.Query) > maxQueryBytes {
		return nil, fieldErr("query", "longer than %d bytes", maxQueryBytes)
	}
	lim := SQLLimits{MaxRows: a.cfg.SQLMaxRows, MaxExecutionTime: a.cfg.SQLMaxTime.Seconds(), MaxMemoryBytes: a.cfg.SQLMaxMemory, MaxThreads: a.cfg.SQLMaxThreads}
	if req.MaxRows < 0 {
		return nil, fieldErr("max_rows", "must not be negative")
	}
	if req.MaxRows > 0 {
		lim.MaxRows = min(lim.MaxRows, req.MaxRows)
	}
	format := "JSONCompact"
	switch req.Format {
	case "", "json":
	case "csv":
		format = "CSVWithNames"
	default:
		return nil, fieldErr("format", "want json or csv")
	}
	// The vetting statements count too: they run on the engine.
	release, ok := a.admit(c, a.sqlGate)
	if !ok {
		return nil, nil // refused
	}
	defer release()
	// The engine enforces max_execution_time; the context is a backstop.
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.cfg.SQLMaxTime+5*time.Second)
	defer cancel()
	start := time.Now()
	settings := sqlSettings(lim)
	// readonly=1 does not stop the embedded engine from writing files
	// (INTO OUTFILE), reading them (file()), reaching the network or
	// running programs (table functions), or killing the collector's
	// inserts; and it runs every statement of a text. The engine's own
	// parse of the query decides (sqlguard) before anything runs.
	// The vetting statements run read-only too, without the row limit
	// (a parse has a line per node).
	vetSettings := maps.Clone(settings)
	delete(vetSettings, "max_result_rows")
	delete(vetSettings, "result_overflow_mode")
	vet := func(ctx context.Context, q, f string) ([]byte, error) {
		return a.cfg.SQL.RunSQL(ctx, q, f, vetSettings)
	}
	// The statements run in the flow store's database, never in system.
	if err := sqlguard.Vet(ctx, vet, "", req.Query); err != nil {
		var re *sqlguard.RefusedError
		switch {
		case errors.As(err, &re):
			a.metrics.sqlRefused.WithLabelValues(re.Reason).Inc()
			return nil, fieldErr("query", "%v", err)
		case errors.Is(err, sqlguard.ErrNotAccepted):
			a.metrics.sqlRefused.WithLabelValues("engine").Inc()
		}
		return nil, sqlError(err)
	}
	out, err := a.cfg.SQL.RunSQL(ctx, req.Query, format, settings)
	if err != nil {
		return nil, sqlError(err)
	}
	if format == "CSVWithNames" {
		out, cut := csvRows(out, lim.MaxRows)
		c.Header("Content-Disposition", `attachment; filename="dualflow-query.csv"`)
		c.Header(truncatedHeader, strconv.FormatBool(cut))
		c.Data(http.StatusOK, "text/csv; charset=utf-8", out)
		return nil, nil
	}
	raw := struct {
		Meta []SQLColumn `json:"meta"`
		Data [][]any     `json:"data"`
	}{[]SQLColumn{}, [][]any{}}
	dec := json.NewDecoder(bytes.NewReader(out))
	dec.UseNumber()
	if err := dec.Decode(&raw); err != nil {
		return nil, fieldErr("query", "the result is not JSON: remove the FORMAT clause (use format csv for CSV)")
	}
	cut := len(raw.Data) > lim.MaxRows
	if cut {
		raw.Data = raw.Data[:lim.MaxRows]
	}
	return SQLResult{Columns: raw.Meta, Rows: raw.Data, Truncated: cut, Elapsed: time.Since(start).Seconds(), Limits: lim}, nil
}

// csvRows keeps the header and the first max records of a CSVWithNames
// output (byte for byte; records may span lines), and reports whether
// there were more.
func csvRows(out []byte, max int) ([]byte, bool) {
	r := csv.NewReader(bytes.NewReader(out))
	r.FieldsPerRecord = -1
	r.LazyQuotes = true
	for range max + 1 { // the header, then max records
		if _, err := r.Read(); err != nil {
			return out, false // the end (or not CSV: left as it is)
		}
	}
	end := r.InputOffset()
	if _, err := r.Read(); err != nil {
		return out, false
	}
	return out[:end], true
}

// sqlError classifies an engine error: a ClickHouse exception, of the
// embedded engine or a server, is the user's query (400; ClickHouse also
// answers its limits exceeded as exceptions). Anything else, an
// unreachable server included, is the store's failure.
func sqlError(err error) error {
	var ce *chdb.Error
	var se *store.Exception
	switch {
	case errors.As(err, &ce) && ce.Code != 0, errors.As(err, &se) && se.Code != 0:
		return &queryError{err: err, user: true, field: "query"}
	}
	return err
}
