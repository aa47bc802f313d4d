package api

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/internal/chsql"
)

// Flow is one row of GET /flows.
type Flow struct {
	FlowStartMs  int64             `json:"flow_start_ms"`
	FlowEndMs    int64             `json:"flow_end_ms"`
	IPVersion    int               `json:"ip_version"`
	SrcIP        string            `json:"src_ip"`
	DstIP        string            `json:"dst_ip"`
	SrcPort      int               `json:"src_port"`
	DstPort      int               `json:"dst_port"`
	Protocol     string            `json:"protocol_name"`
	ServiceIP    string            `json:"service_ip,omitempty"`
	ServicePort  int               `json:"service_port,omitempty"`
	Packets      uint64            `json:"packets"`
	Bytes        uint64            `json:"bytes"`
	RevPackets   uint64            `json:"reverse_packets"`
	RevBytes     uint64            `json:"reverse_bytes"`
	SrcNamespace string            `json:"src_namespace,omitempty"`
	SrcPod       string            `json:"src_pod,omitempty"`
	SrcLabels    map[string]string `json:"src_labels,omitempty"`
	SrcWorkload  string            `json:"src_workload,omitempty"`
	SrcKind      string            `json:"src_workload_kind,omitempty"`
	SrcNode      string            `json:"src_node,omitempty"`
	DstNamespace string            `json:"dst_namespace,omitempty"`
	DstPod       string            `json:"dst_pod,omitempty"`
	DstLabels    map[string]string `json:"dst_labels,omitempty"`
	DstWorkload  string            `json:"dst_workload,omitempty"`
	DstKind      string            `json:"dst_workload_kind,omitempty"`
	DstNode      string            `json:"dst_node,omitempty"`
	SvcNamespace string            `json:"service_namespace,omitempty"`
	SvcName      string            `json:"service_name,omitempty"`
	FlowType     string            `json:"flow_type"`
	TCPState     string            `json:"tcp_state,omitempty"`
	EndReason    string            `json:"end_reason"`
	Ingress      string            `json:"ingress_verdict"`
	Egress       string            `json:"egress_verdict"`
	IngressPol   string            `json:"ingress_policy,omitempty"`
	EgressPol    string            `json:"egress_policy,omitempty"`
	Mismatch     bool              `json:"verdict_mismatch"`
	K8sStale     bool              `json:"k8s_view_stale"`
	ProbeTraceID string            `json:"probe_trace_id,omitempty"`
	Exporter     string            `json:"exporter_node,omitempty"`
	Key          string            `json:"key"` // tiebreaker, hex
	TimeRecvMs   int64             `json:"time_received_ms"`
}

// flowColumns selects Flow's fields and key. key is the page tiebreaker: rows
// with the same flow_end are ordered by a hash of what identifies them.
const flowColumns = `toUnixTimestamp64Milli(flow_start) AS flow_start_ms, toUnixTimestamp64Milli(flow_end) AS flow_end_ms,
 ip_version, src_ip, dst_ip, src_port, dst_port, protocol_name, service_ip, service_port,
 packets, bytes, reverse_packets, reverse_bytes,
 src_pod_namespace AS src_namespace, src_pod_name AS src_pod, src_pod_labels AS src_labels, src_workload_name AS src_workload, src_workload_kind, src_node,
 dst_pod_namespace AS dst_namespace, dst_pod_name AS dst_pod, dst_pod_labels AS dst_labels, dst_workload_name AS dst_workload, dst_workload_kind, dst_node,
 dst_service_namespace AS service_namespace, dst_service_name AS service_name,
 toString(flow_type) AS flow_type, tcp_state, toString(end_reason) AS end_reason,
 toString(ingress_verdict) AS ingress_verdict, toString(egress_verdict) AS egress_verdict,
 if(ingress_policy_name = '', '', concat(ingress_policy_namespace, '/', ingress_policy_name)) AS ingress_policy,
 if(egress_policy_name = '', '', concat(egress_policy_namespace, '/', egress_policy_name)) AS egress_policy,
 verdict_mismatch, k8s_view_stale, probe_trace_id, exporter_node, toUnixTimestamp64Milli(time_received) AS time_received_ms, toString(` + keyExpr + `) AS key`

// keyExpr is the tiebreaker of the cursor.
const keyExpr = `cityHash64(flow_start, src_ip, dst_ip, src_port, dst_port, protocol, exporter_node, time_received)`

// jsonSettings end every query of the API's own: 64-bit integers as
// numbers, not strings, their memory bounds (uiMaxMemory), and the engine
// priority that runs them before operator SQL (see sqlPriority).
var jsonSettings = chsql.JSONSettings(uiMaxMemory) + ", priority = " + uiPriority

// Page sizes.
const (
	defaultLimit = 100
	maxLimit     = 1000
	// followBatch bounds the rows one follow poll sends; a faster stream
	// is cut to the newest and the client is told how many it missed.
	followBatch = 500
	// followOverlap is how far before the newest row sent a follow poll
	// looks again, for rows committed late.
	followOverlap = 5 * time.Second
)

// cursor is (flow_end, key) of the last row of a page.
type cursor struct {
	EndMs int64
	Key   uint64
}

func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(fmt.Sprintf("%d.%d", c.EndMs, c.Key)))
}

func parseCursor(s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	a, k, ok := strings.Cut(string(b), ".")
	end, err1 := strconv.ParseInt(a, 10, 64)
	key, err2 := strconv.ParseUint(k, 10, 64)
	if err != nil || !ok || err1 != nil || err2 != nil {
		return cursor{}, fieldErr("cursor", "not a cursor from a previous page")
	}
	return cursor{EndMs: end, Key: key}, nil
}

// FlowPage is the answer of GET /flows.
type FlowPage struct {
	Flows []Flow `json:"flows"`
	// Next is the cursor of the following (older) page; empty at the end.
	Next string `json:"next,omitempty"`
}

func (a *API) flows(c *gin.Context) (any, error) {
	q := c.Request.URL.Query()
	f, err := parseFilter(q, a.cfg.Now(), "limit", "cursor", "follow", "last_event_id")
	if err != nil {
		return nil, err
	}
	f.scope = principalOf(c).scope
	if v := q.Get("follow"); v == "true" || v == "1" {
		resume, err := resumeFrom(c)
		if err != nil {
			return nil, err
		}
		if release, ok := a.admit(c, a.followGate); ok {
			defer release()
			a.follow(c, f, resume)
		}
		return nil, nil // streamed, or refused
	}
	limit, err := intParam(q, "limit", defaultLimit, 1, maxLimit)
	if err != nil {
		return nil, err
	}
	var cur *cursor
	if v := q.Get("cursor"); v != "" {
		cc, err := parseCursor(v)
		if err != nil {
			return nil, err
		}
		cur = &cc
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), a.cfg.QueryTimeout)
	defer cancel()
	return a.queryFlows(ctx, f, cur, limit)
}

// flowsSQL builds the page query: newest first, from the cursor on, and
// from the minute bound on when bound is not nil (see pageBound).
// Ordering by the minute first matches the table's sort key, so ClickHouse
// reads in order. The tiebreaker is left out of the ORDER BY (hashing every
// row read costs 2x); queryFlows settles ties at the page boundary with a
// second query on that one flow_end.
func (a *API) flowsSQL(f *Filter, cur *cursor, limit int, bound *int64) string {
	q := a.flowSelect(f, a.flowsWhere(f, cur), chsql.MinuteKey+" DESC, flow_end DESC", limit+1)
	if bound != nil {
		q.Where = append(q.Where, chsql.MinuteKey+" >= "+chsql.Millis(*bound*1000))
	}
	return q.String()
}

// flowSelect is the query of Flow rows.
func (a *API) flowSelect(f *Filter, where []string, orderBy string, limit int) chsql.Select {
	return chsql.Select{Cols: flowColumns, From: f.from(a.table), Where: where, OrderBy: orderBy, Limit: limit, Settings: jsonSettings}
}

// pageBound finds where a page starts. ClickHouse stops reading early for
// an ORDER BY on the sort key's head alone, but not for the (minute,
// flow_end) order the page needs: that reads the whole window (an hour is
// ~600k rows at 100M rows a week). So this asks first for the minutes of
// the limit+1 newest matching rows, ordered by the minute only, which does
// stop early: the oldest of them is the bound, and the page reads from it
// on. The page is the same: at least min(matched, limit+1) matching rows
// are at or after the bound, and any limit+1 rows have their oldest minute
// at or before that of the limit+1-th newest row, so whatever order the
// engine read them in, the bound never cuts the page. matched is how many
// rows it saw (at most limit+1), -1 if the store did not say; bound is nil
// when none matched.
func (a *API) pageBound(ctx context.Context, f *Filter, cur *cursor, limit int) (bound *int64, matched int, err error) {
	sql := "SELECT toUnixTimestamp(minOrNull(m)) AS bound, count() AS matched FROM (" +
		chsql.Select{Cols: chsql.MinuteKey + " AS m", From: f.from(a.table), Where: a.flowsWhere(f, cur), OrderBy: "m DESC", Limit: limit + 1}.String() + ")" + a.boundSettings(ctx)
	var rows []struct {
		Bound   *int64 `json:"bound"`
		Matched *int   `json:"matched"`
	}
	if err := decodeRows(ctx, a, sql, &rows); err != nil {
		return nil, 0, err
	}
	if len(rows) != 1 || rows[0].Matched == nil {
		// An aggregate answers one row; a store that does not (a fake, a
		// proxy) gets the page without a bound.
		return nil, -1, nil
	}
	return rows[0].Bound, *rows[0].Matched, nil
}

// virtualRowSetting lets ClickHouse skip the parts (and the blocks of the
// parts) that start past the rows already found when it reads in order,
// instead of reading a block of every part the window overlaps first: 60k
// rows read instead of 370k for a selective filter's newest minute on the
// 100M-row benchmark. It is off by default, and servers older than about
// 25.1 do not know it, so boundSettings asks the server once. Only the
// bound query uses it: ClickHouse releases have had wrong-order bugs in
// this reading, and a wrong order there can only lower the bound (see
// pageBound), while the page itself is read without it.
const virtualRowSetting = "read_in_order_use_virtual_row"

// boundSettings is the SETTINGS clause of the bound query: jsonSettings,
// and virtualRowSetting where the server has it. A failed probe is asked
// again at the next page.
func (a *API) boundSettings(ctx context.Context) string {
	if a.virtualRow.Load() == 0 {
		out, err := a.cfg.Store.Query(ctx, "SELECT count() FROM system.settings WHERE "+chsql.Eq("name", virtualRowSetting), "TabSeparated")
		if err != nil {
			return jsonSettings
		}
		if strings.TrimSpace(string(out)) == "1" {
			a.virtualRow.Store(1)
		} else {
			a.virtualRow.Store(2)
		}
	}
	if a.virtualRow.Load() == 1 {
		return jsonSettings + ", " + virtualRowSetting + " = 1"
	}
	return jsonSettings
}

// flowsWhere is the filter and the cursor. The key is only hashed for
// rows at the cursor's flow_end (or/and evaluate lazily).
func (a *API) flowsWhere(f *Filter, cur *cursor) []string {
	where := f.where()
	if cur != nil {
		end := chsql.Millis(cur.EndMs)
		where = append(where, "flow_end <= "+end, "(flow_end < "+end+" OR "+keyExpr+" < "+strconv.FormatUint(cur.Key, 10)+")")
	}
	return where
}

// tieSQL returns the rows at flow_end endMs in key order, for a page
// whose boundary falls inside a group of rows with the same flow_end.
func (a *API) tieSQL(f *Filter, cur *cursor, endMs int64, limit int) string {
	return a.flowSelect(f, append(a.flowsWhere(f, cur), "flow_end = "+chsql.Millis(endMs)), keyExpr+" DESC", limit+1).String()
}

type keyedFlow struct {
	Flow
	key uint64
}

func (a *API) decodeFlows(ctx context.Context, sql string) ([]keyedFlow, error) {
	var rows []Flow
	if err := decodeRows(ctx, a, sql, &rows); err != nil {
		return nil, err
	}
	out := make([]keyedFlow, len(rows))
	for i, fl := range rows {
		out[i].Flow = fl
		out[i].key, _ = strconv.ParseUint(fl.Key, 10, 64)
	}
	return out, nil
}

func (a *API) queryFlows(ctx context.Context, f *Filter, cur *cursor, limit int) (*FlowPage, error) {
	bound, matched, err := a.pageBound(ctx, f, cur, limit)
	if err != nil {
		return nil, err
	}
	var rows []keyedFlow
	if matched != 0 { // none matched: the page is empty
		if rows, err = a.decodeFlows(ctx, a.flowsSQL(f, cur, limit, bound)); err != nil {
			return nil, err
		}
		if bound != nil && len(rows) < min(matched, limit+1) {
			// The two reads disagree: on a cluster they may read different
			// replicas, and the page's may not have a batch the bound's saw
			// yet. A short page would end the pagination, so read the page
			// without the bound.
			a.metrics.pageRereads.Inc()
			if rows, err = a.decodeFlows(ctx, a.flowsSQL(f, cur, limit, nil)); err != nil {
				return nil, err
			}
		}
	}
	newestFirst := func(a, b keyedFlow) int {
		return cmp.Or(cmp.Compare(b.FlowEndMs, a.FlowEndMs), cmp.Compare(b.key, a.key))
	}
	slices.SortStableFunc(rows, newestFirst)
	if len(rows) > limit && rows[limit].FlowEndMs == rows[limit-1].FlowEndMs {
		// The page ends inside a tie: which rows of it come first is up to
		// the key, so fetch the tie in key order (every row of it with a
		// later flow_end is already here).
		t := rows[limit-1].FlowEndMs
		tie, err := a.decodeFlows(ctx, a.tieSQL(f, cur, t, limit))
		if err != nil {
			return nil, err
		}
		n := 0
		for n < len(rows) && rows[n].FlowEndMs > t {
			n++
		}
		rows = append(rows[:n:n], tie...)
		slices.SortStableFunc(rows, newestFirst)
	}
	page := &FlowPage{Flows: make([]Flow, 0, min(len(rows), limit))}
	for i := 0; i < len(rows) && i < limit; i++ {
		page.Flows = append(page.Flows, rows[i].Flow)
	}
	if len(rows) > limit {
		last := rows[limit-1]
		page.Next = cursor{EndMs: last.FlowEndMs, Key: last.key}.String()
	}
	return page, nil
}

// decodeRows runs a JSONEachRow query and appends its rows to *dst.
func decodeRows[T any](ctx context.Context, a *API, sql string, dst *[]T) error {
	out, err := a.cfg.Store.Query(ctx, sql, "JSONEachRow")
	switch {
	case err != nil && ctx.Err() != nil:
		return ctx.Err()
	case err != nil && queryTooLarge(err):
		return &queryError{err: fmt.Errorf("the request is too large for the engine, use fewer or shorter values: %w", err), user: true}
	case err != nil:
		return fmt.Errorf("store query: %w", err)
	}
	rows, err := chsql.Decode[T](out)
	*dst = append(*dst, rows...)
	return err
}

// queryTooLarge reports the engine refusing a query for its size: the
// request's values made it (the filter bounds should prevent it).
func queryTooLarge(err error) bool {
	var ce *chdb.Error
	if !errors.As(err, &ce) {
		return false
	}
	switch ce.Code {
	case 167, 168: // TOO_DEEP_AST, TOO_BIG_AST
		return true
	case chdb.CodeSyntaxError:
		return strings.Contains(ce.Message, "Max query size exceeded")
	}
	return false
}

// eventID is the SSE id of a flow event: the flow's time_received and
// key, "<ms>-<key>", which orders the events of a stream. A client that
// reconnects with it (Last-Event-ID) gets the flows after it.
type eventID struct {
	RecvMs int64
	Key    uint64
}

func (e eventID) String() string {
	return strconv.FormatInt(e.RecvMs, 10) + "-" + strconv.FormatUint(e.Key, 10)
}

func (e eventID) after(o eventID) bool {
	return e.RecvMs > o.RecvMs || (e.RecvMs == o.RecvMs && e.Key > o.Key)
}

func parseEventID(s string) (eventID, error) {
	a, k, ok := strings.Cut(s, "-")
	ms, err1 := strconv.ParseInt(a, 10, 64)
	key, err2 := strconv.ParseUint(k, 10, 64)
	if !ok || err1 != nil || err2 != nil || ms < 0 {
		return eventID{}, fieldErr("Last-Event-ID", "not the id of a flow event of this API (<ms>-<key>)")
	}
	if ms > time.Now().Add(time.Minute).UnixMilli() {
		// A stream resumed from the future would wait for it in silence.
		return eventID{}, fieldErr("Last-Event-ID", "an event id from the future (%d ms)", ms)
	}
	return eventID{ms, key}, nil
}

// followResumeWindow bounds how far back a resumed stream starts: a
// client away longer gets a lag event and the flows of the last
// followResumeWindow, not the whole table.
const followResumeWindow = time.Hour

// resumeFrom reads where a follow stream resumes: the Last-Event-ID
// header a reconnecting EventSource sends, or the last_event_id
// parameter; nil for a new stream.
func resumeFrom(c *gin.Context) (*eventID, error) {
	v := cmp.Or(c.Query("last_event_id"), c.GetHeader("Last-Event-ID"))
	if v == "" {
		return nil, nil
	}
	id, err := parseEventID(v)
	if err != nil {
		return nil, err
	}
	return &id, nil
}

// writeEvent writes one server-sent event; id may be empty.
func writeEvent(w io.Writer, id, event string, data any) {
	b, err := json.Marshal(data)
	if err != nil {
		b, _ = json.Marshal(errorBody{Message: "encode " + event + ": " + err.Error()})
		event = "error"
	}
	if id != "" {
		io.WriteString(w, "id:"+id+"\n")
	}
	io.WriteString(w, "event:"+event+"\ndata:"+string(b)+"\n\n") // a write error ends the stream at ctx
}

// follow streams flows received after the request as server-sent events
// ("flow" events with a Flow and an id, "lag" when a poll had more than
// followBatch rows), polling the store every FollowInterval until the
// client leaves. A stream resumed from an event id (resume non-nil) first
// sends the flows after it, oldest first, followBatch per query, as far
// back as followResumeWindow; then it follows as a new one.
func (a *API) follow(c *gin.Context, f *Filter, resume *eventID) {
	ctx := c.Request.Context()
	c.Header("Content-Type", "text/event-stream")
	c.Header("Cache-Control", "no-cache")
	c.Header("X-Accel-Buffering", "no")
	c.Status(http.StatusOK)
	c.Writer.Flush()
	w := c.Writer
	since := a.cfg.Now().Add(-a.cfg.FollowInterval).UnixMilli()
	if v := c.Request.URL.Query().Get("since"); v != "" {
		since = f.Since.UnixMilli()
	}
	// floor: the rows at or before it were sent (to the client's previous
	// stream when resumed).
	var floor eventID
	if resume != nil {
		floor = *resume
		if oldest := a.cfg.Now().Add(-followResumeWindow).UnixMilli(); floor.RecvMs < oldest {
			writeEvent(w, "", "lag", gin.H{"message": "the stream resumes at most " + followResumeWindow.String() + " back: older flows are not sent (see GET /flows)"})
			floor = eventID{RecvMs: oldest}
		}
		since = floor.RecvMs
	}
	catchUp := resume != nil
	where := f.allConds()
	tick := time.NewTicker(a.cfg.FollowInterval)
	defer tick.Stop()
	// Inserts can land out of time_received order (concurrent batches, an
	// INSERT split into several parts), so each poll looks back
	// followOverlap before the newest row sent and skips the rows it sent.
	sent := map[eventID]bool{}
	send := func(fl keyedFlow) {
		id := eventID{fl.TimeRecvMs, fl.key}
		if sent[id] || !id.after(floor) {
			return
		}
		sent[id] = true
		since = max(since, fl.TimeRecvMs)
		writeEvent(w, id.String(), "flow", fl.Flow)
	}
	for {
		// After the floor, oldest first, when catching up (what the client
		// missed); else newest first.
		from, recv, order := since-followOverlap.Milliseconds(), "time_received > ", " DESC"
		if catchUp {
			from, recv, order = floor.RecvMs, "time_received >= ", ""
		}
		cond := []string{recv + chsql.Millis(from), "flow_end >= " + chsql.Millis(from) + " - INTERVAL 1 HOUR"}
		if catchUp {
			cond = append(cond, "(toUnixTimestamp64Milli(time_received), "+keyExpr+") > ("+strconv.FormatInt(floor.RecvMs, 10)+", "+strconv.FormatUint(floor.Key, 10)+")")
		}
		qctx, cancel := context.WithTimeout(ctx, a.cfg.QueryTimeout)
		rows, err := a.decodeFlows(qctx, a.flowSelect(f, append(cond, where...), "time_received"+order+", "+keyExpr+order, followBatch+1).String())
		cancel()
		more := false
		switch {
		case err != nil && ctx.Err() != nil:
			return
		case err != nil:
			writeEvent(w, "", "error", errorBody{Message: err.Error()})
		case catchUp:
			more = len(rows) > followBatch
			if more {
				rows = rows[:followBatch]
			}
			for _, fl := range rows {
				send(fl)
			}
			if len(rows) > 0 {
				floor = eventID{rows[len(rows)-1].TimeRecvMs, rows[len(rows)-1].key}
			}
			catchUp = more
		default:
			if len(rows) > followBatch {
				rows = rows[:followBatch]
				writeEvent(w, "", "lag", gin.H{"message": "more flows arrived than one poll sends; showing the newest"})
			}
			// Oldest first.
			for i := len(rows) - 1; i >= 0; i-- {
				send(rows[i])
			}
		}
		for id := range sent {
			if id.RecvMs <= since-followOverlap.Milliseconds() {
				delete(sent, id)
			}
		}
		writeEvent(w, "", "heartbeat", gin.H{"time_ms": a.cfg.Now().UnixMilli()})
		c.Writer.Flush()
		if more {
			if ctx.Err() != nil {
				return
			}
			continue // catching up: the next batch now
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
