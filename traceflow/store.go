package traceflow

import (
	"bytes"
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/dualflow/dualflow/internal/chsql"
)

// sqlConn runs SQL on ClickHouse; store.Conn (ClickHouse, chDB) satisfies it.
type sqlConn interface {
	Exec(ctx context.Context, query string) error
	// Query returns the output of query in the given format (Store asks
	// for TSV, the one format every store.Conn backend renders).
	Query(ctx context.Context, query, format string) ([]byte, error)
}

// Store writes finished results to the traceflows table (migration
// 0004_traceflows.sql), one row per family, and reads them back, so every
// web replica over the same ClickHouse answers for a trace any of them
// ran. It is safe for concurrent use when conn is.
type Store struct {
	conn  sqlConn
	table string
}

// NewStore returns a store on database.traceflows (database defaults to
// "dualflow"; it must be an identifier, as migrations checks).
func NewStore(conn sqlConn, database string) *Store {
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
			chsql.String(r.ID), chsql.Time(r.Started), chsql.Time(cmp.Or(r.Ended, r.Started)), chsql.String(string(r.Phase)), chsql.String(r.Reason),
			chsql.String(r.Request.Source), chsql.String(r.Request.Destination.String()),
			chsql.String(string(fr.Family)), chsql.String(string(fr.Outcome)), chsql.String(fr.Reason), chsql.String(string(fr.Protocol)),
			chsql.String(addrText(fr.Src.String(), fr.Src.IsValid())), chsql.String(addrText(fr.Dst.String(), fr.Dst.IsValid())),
			strconv.Itoa(int(fr.SrcPort)), strconv.Itoa(int(fr.DstPort)),
			chsql.String(translated), chsql.String(pod), chsql.String(last), chsql.String(policy), chsql.String(rule),
			strconv.FormatFloat(float64(time.Duration(fr.Duration).Microseconds())/1000, 'f', 3, 64),
			chsql.String(string(obs)),
		}
		b.WriteString(" (" + strings.Join(vals, ", ") + ")")
	}
	return b.String(), nil
}

// loadColumns are the columns Load reads, in the order decodeRow expects.
// Every string goes through hex() so that the TSV is the same from every
// backend: chDB and an HTTP server escape TSV, the native driver prints
// values raw (a tab or newline in a reason would split the row).
var loadColumns = []string{"hex(phase)", "hex(phase_reason)", "hex(source_pod)", "hex(destination)",
	"hex(family)", "hex(outcome)", "hex(outcome_reason)", "hex(protocol)", "hex(src_ip)", "hex(dst_ip)",
	"src_port", "dst_port", "toUnixTimestamp64Milli(started)", "toUnixTimestamp64Milli(ended)",
	"toInt64(round(duration_ms * 1000))", "hex(observations)"}

// Load reads trace id back: the rows InsertSQL wrote, families in ipv4,
// ipv6 order (one row per family should a retried insert have doubled
// one). It returns an error wrapping ErrNotFound when id has no row or is
// not an id the controller makes (ids come from URLs; nothing else reaches
// the query).
//
// The table keeps less than a Result: times are in milliseconds and
// durations in microseconds; of the request, Source, Destination, Family
// (from the families stored) and Protocol (the first family's) come back,
// the pods picked for workloads standing for them, while SourceWorkload,
// Destination.Workload, SrcPort, TCPFlags, TTL, LiveTraffic, DroppedOnly,
// Timeout and the families' DSCP Tag read as zero.
func (s *Store) Load(ctx context.Context, id string) (Result, error) {
	if !validID(id) {
		return Result{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	out, err := s.conn.Query(ctx, s.SelectSQL(id), "TSV")
	if err != nil {
		return Result{}, fmt.Errorf("load traceflow %s: %w", id, err)
	}
	if len(out) == 0 {
		return Result{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	r := Result{ID: id}
	for n, line := range bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\n")) {
		if err := decodeRow(&r, n, string(line)); err != nil {
			return Result{}, fmt.Errorf("load traceflow %s: row %d: %w", id, n, err)
		}
	}
	r.Request.Family = r.Families[0].Family
	if len(r.Families) > 1 {
		r.Request.Family = Dual
	}
	for _, fr := range r.Families {
		if fr.Protocol != "" {
			r.Request.Protocol = fr.Protocol
			break
		}
	}
	return r, nil
}

// SelectSQL returns the query of Load for trace id (quoted as a literal).
func (s *Store) SelectSQL(id string) string {
	return chsql.Select{Cols: strings.Join(loadColumns, ", "), From: s.table, Where: []string{chsql.Eq("trace_id", id)},
		OrderBy: "family, ended DESC LIMIT 1 BY family"}.String()
}

// decodeRow adds row n (a TSV line of loadColumns) to r: the trace's
// fields from the first row, one family from each.
func decodeRow(r *Result, n int, line string) error {
	f := strings.Split(line, "\t")
	if len(f) != len(loadColumns) {
		return fmt.Errorf("%d fields, want %d", len(f), len(loadColumns))
	}
	var err error
	text := func(i int) string {
		b, e := hex.DecodeString(f[i])
		if e != nil && err == nil {
			err = fmt.Errorf("%s: %w", loadColumns[i], e)
		}
		return string(b)
	}
	num := func(i, bits int) int64 {
		v, e := strconv.ParseInt(f[i], 10, bits)
		if e != nil && err == nil {
			err = fmt.Errorf("%s: %w", loadColumns[i], e)
		}
		return v
	}
	addr := func(i int) netip.Addr {
		s := text(i)
		if s == "" {
			return netip.Addr{}
		}
		a, e := netip.ParseAddr(s)
		if e != nil && err == nil {
			err = fmt.Errorf("%s: %w", loadColumns[i], e)
		}
		return a
	}
	fr := FamilyResult{
		Family: Family(text(4)), Outcome: Outcome(text(5)), Reason: text(6), Protocol: Protocol(text(7)),
		Src: addr(8), Dst: addr(9), SrcPort: uint16(num(10, 17)), DstPort: uint16(num(11, 17)),
		Duration: Duration(time.Duration(num(14, 64)) * time.Microsecond),
	}
	if obs := text(15); err == nil {
		if e := json.Unmarshal([]byte(obs), &fr.Observations); e != nil {
			err = fmt.Errorf("observations: %w", e)
		}
	}
	if fr.Observations == nil {
		fr.Observations = []Observation{}
	}
	if n == 0 {
		r.Phase, r.Reason, r.Request.Source = Phase(text(0)), text(1), text(2)
		r.Started, r.Ended = time.UnixMilli(num(12, 64)).UTC(), time.UnixMilli(num(13, 64)).UTC()
		if err == nil {
			r.Request.Destination, err = ParseDestination(text(3))
		}
	}
	if err != nil {
		return err
	}
	r.Families = append(r.Families, fr)
	return nil
}

func addrText(s string, ok bool) string {
	if !ok {
		return ""
	}
	return s
}
