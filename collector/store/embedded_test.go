package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/collector/store/chdb"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/migrations"
)

// engine is the embedded chDB shared by this package's tests: chDB allows
// one data directory per process at a time.
var engine *Embedded

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	dir, err := os.MkdirTemp("", "dualflow-store-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	e, err := NewEmbedded(EmbeddedConfig{DataDir: dir})
	switch {
	case errors.Is(err, chdb.ErrLibraryNotFound) && os.Getenv("DUALFLOW_REQUIRE_CHDB") != "1":
		fmt.Fprintln(os.Stderr, "libchdb not found: engine tests will skip (run make deps)")
	case err != nil:
		fmt.Fprintln(os.Stderr, "open embedded clickhouse:", err)
		return 1
	default:
		engine = e
		defer e.Close()
		r, err := migrations.NewRunner(e, migrations.Options{TTLDays: 0})
		if err == nil {
			_, err = r.Up(context.Background())
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "migrate:", err)
			return 1
		}
	}
	return m.Run()
}

func needEngine(t testing.TB) *Embedded {
	t.Helper()
	if engine == nil {
		t.Skip("libchdb not available (make deps)")
	}
	return engine
}

// truncate empties the flows table and rollups between tests.
func truncate(t testing.TB, c Conn) {
	t.Helper()
	for _, tbl := range []string{"flows", "rollup_pod_to_pod_1m", "rollup_pod_to_service_1m", "rollup_node_to_node_1m", "rollup_policy_1m"} {
		if err := c.Exec(context.Background(), "TRUNCATE TABLE dualflow."+tbl); err != nil {
			t.Fatal(err)
		}
	}
}

func insertRecords(t testing.TB, c Conn, token string, recs ...flow.Record) {
	t.Helper()
	var b []byte
	for i := range recs {
		b = AppendFlowRow(b, &recs[i])
	}
	if err := c.InsertRowBinary(context.Background(), FlowsTable, FlowColumns, token, len(recs), b); err != nil {
		t.Fatal(err)
	}
}

func queryJSON(t testing.TB, c Conn, q string) []map[string]any {
	t.Helper()
	out, err := c.Query(context.Background(), q, "JSONEachRow")
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	var rows []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("%s: %v in %q", q, err, line)
		}
		rows = append(rows, m)
	}
	return rows
}

func queryString(t testing.TB, c Conn, q string) string {
	t.Helper()
	out, err := c.Query(context.Background(), q, "TabSeparated")
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return strings.TrimSpace(string(out))
}

// wantColumns is what SELECT * shows for sampleRecord, per family.
func wantColumns(r flow.Record) map[string]any {
	return map[string]any{
		"flow_start": r.FlowStart.Format("2006-01-02 15:04:05.000"), "flow_end": r.FlowEnd.Format("2006-01-02 15:04:05.000"),
		"time_received": r.TimeReceived.Format("2006-01-02 15:04:05.000"),
		"ip_version":    float64(r.IPVersion), "src_ip": r.SrcAddr.String(), "dst_ip": r.DstAddr.String(),
		"src_port": float64(r.SrcPort), "dst_port": float64(r.DstPort), "protocol": float64(r.Proto),
		"service_ip": r.ServiceAddr.String(), "service_port": float64(r.ServicePort), "snat_ip": "", "snat_port": float64(0),
		"packets": "2", "bytes": "150", "reverse_packets": "1", "reverse_bytes": "900",
		"packets_total": "12", "bytes_total": "1500", "reverse_packets_total": "10", "reverse_bytes_total": "9000",
		"end_reason": "active_timeout", "tcp_state": "ESTABLISHED", "ct_zone": float64(7), "ct_mark": float64(0x42),
		"exporter_ip": r.ExporterAddr.String(), "observation_domain_id": float64(1), "exporter_node": "node-1", "source": "conntrack",
		"src_pod_namespace": "shop", "src_pod_name": r.Src.PodName, "src_pod_labels": map[string]any{"app": "frontend", "tier": "web", "version": "v2"},
		"src_workload_kind": "Deployment", "src_workload_name": "frontend", "src_node": "node-1", "src_zone": "zone-a",
		"dst_pod_namespace": "shop", "dst_pod_name": "cart-0", "dst_pod_labels": map[string]any{"app": "cart"},
		"dst_workload_kind": "StatefulSet", "dst_workload_name": "cart", "dst_node": "node-2", "dst_zone": "zone-b",
		"dst_service_namespace": "shop", "dst_service_name": "cart", "dst_service_port_name": "http",
		"flow_type": "inter_node", "correlation": "merged",
		"ingress_policy_namespace": "shop", "ingress_policy_name": "cart-allow-frontend", "ingress_policy_rule": float64(0),
		"ingress_verdict": "allowed", "ingress_reported_verdict": "unknown", "ingress_reported_policy": "",
		"egress_policy_namespace": "", "egress_policy_name": "", "egress_policy_rule": float64(-1),
		"egress_verdict": "not_isolated", "egress_reported_verdict": "unknown", "egress_reported_policy": "",
		"verdict_mismatch": false,
		"k8s_view_stale":   r.K8sViewStale,
		"probe_trace_id":   r.ProbeTraceID,
	}
}

// checkAllColumns reads back (through the embedded engine) every column of
// the flows table for an IPv4 and an IPv6 record written through w.
func checkAllColumns(t *testing.T, w Conn) {
	checkAllColumnsInsert(t, func(recs ...flow.Record) { insertRecords(t, w, "", recs...) })
}

// checkAllColumnsInsert is checkAllColumns with the rows inserted by
// insert.
func checkAllColumnsInsert(t *testing.T, insert func(...flow.Record)) {
	c := needEngine(t)
	truncate(t, c)
	v4, v6 := sampleRecord(1, false), sampleRecord(2, true)
	v6.ProbeTraceID = "tf-0123456789abcdef" // a traceflow probe's record; the IPv4 one is ordinary traffic
	insert(v4, v6)
	rows := queryJSON(t, c, "SELECT * FROM dualflow.flows ORDER BY ip_version SETTINGS output_format_json_quote_64bit_integers = 1")
	if len(rows) != 2 {
		t.Fatalf("got %d rows, want 2", len(rows))
	}
	for i, rec := range []flow.Record{v4, v6} {
		want := wantColumns(rec)
		got := rows[i]
		for k, w := range want {
			if fmt.Sprint(got[k]) != fmt.Sprint(w) {
				t.Errorf("ipv%d column %s = %v, want %v", rec.IPVersion, k, got[k], w)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("SELECT * shows column %s that the test does not check", k)
			}
		}
	}
	// The derived columns.
	got := queryString(t, c, "SELECT src_ip_bin, dst_ip_bin, protocol_name FROM dualflow.flows ORDER BY ip_version")
	want := "::ffff:198.18.1.10\t::ffff:198.18.2.20\tTCP\nfd00:10:1::a\tfd00:10:2::14\tTCP"
	if got != want {
		t.Errorf("derived columns:\n%s\nwant\n%s", got, want)
	}
	if got := queryString(t, c, "SELECT ip_version, is_probe FROM dualflow.flows ORDER BY ip_version"); got != "4\tfalse\n6\ttrue" {
		t.Errorf("is_probe:\n%s\nwant the IPv6 row only", got)
	}
}

func TestEmbeddedAllColumns(t *testing.T) {
	checkAllColumns(t, needEngine(t))
}

// TestNativeBlockAllColumns: a NativeBlock (the benchmarks' ceiling)
// stores every column as the writer does, and again on each insert.
func TestNativeBlockAllColumns(t *testing.T) {
	e := needEngine(t)
	checkAllColumnsInsert(t, func(recs ...flow.Record) {
		b := NewNativeBlock(recs)
		if b.Rows() != len(recs) {
			t.Fatalf("block of %d rows, want %d", b.Rows(), len(recs))
		}
		if err := e.InsertNativeBlock(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	})
	b := NewNativeBlock([]flow.Record{sampleRecord(3, false)})
	for range 2 { // a fresh dedup token each time: not deduplicated
		if err := e.InsertNativeBlock(context.Background(), b); err != nil {
			t.Fatal(err)
		}
	}
	if got := queryString(t, e, "SELECT count() FROM dualflow.flows"); got != "4" {
		t.Errorf("%s rows after inserting a block twice more, want 4", got)
	}
}

func TestEmbeddedPre0006Spool(t *testing.T) {
	checkPre0006Spool(t, needEngine(t))
}

func TestEmbeddedPre0012Spool(t *testing.T) {
	checkPre0012Spool(t, needEngine(t))
}

// checkPre0006Spool inserts through w a batch in the layout an older
// collector spooled, without k8s_view_stale (migration 0006) and
// probe_trace_id (0012): it is written, and the columns read false and
// the empty string.
func checkPre0006Spool(t *testing.T, w Conn) {
	checkOldSpool(t, w, flowColumnsV5, "4\tfrontend-7d9f-1\tfalse\ttrue\n6\tfrontend-7d9f-2\tfalse\ttrue")
}

// checkPre0012Spool is checkPre0006Spool for the layout without
// probe_trace_id (migration 0012).
func checkPre0012Spool(t *testing.T, w Conn) {
	checkOldSpool(t, w, flowColumnsV11, "4\tfrontend-7d9f-1\tfalse\ttrue\n6\tfrontend-7d9f-2\ttrue\ttrue")
}

// checkOldSpool inserts through w the sample rows in the layout columns
// (FlowColumns without its last ones) and checks how they read.
func checkOldSpool(t *testing.T, w Conn, columns []string, want string) {
	c := needEngine(t)
	truncate(t, c)
	var b []byte
	for i, rec := range []flow.Record{sampleRecord(1, false), sampleRecord(2, true)} {
		rec.ProbeTraceID = ""
		row := AppendFlowRow(nil, &rec)
		// The columns left out are one byte each here: k8s_view_stale
		// (Bool) and an empty probe_trace_id (String).
		cut := len(FlowColumns) - len(columns)
		if !slices.Equal(columns, FlowColumns[:len(columns)]) || row[len(row)-1] != 0 || (cut == 2 && row[len(row)-2] > 1) {
			t.Fatalf("row %d: layout %d columns does not end FlowColumns' rows", i, len(columns))
		}
		b = append(b, row[:len(row)-cut]...)
	}
	if err := w.InsertRowBinary(context.Background(), FlowsTable, columns, "", 2, b); err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, c, "SELECT ip_version, src_pod_name, k8s_view_stale, NOT is_probe FROM dualflow.flows ORDER BY ip_version"); got != want {
		t.Errorf("rows %q, want %q", got, want)
	}
}

// TestCIDRFilters runs the filters docs/schema.md recommends, for both
// families.
func TestCIDRFilters(t *testing.T) {
	e := needEngine(t)
	truncate(t, e)
	v4, v6 := sampleRecord(1, false), sampleRecord(2, true)
	noSvc := sampleRecord(3, true)
	noSvc.ServiceAddr, noSvc.ServicePort = netip.Addr{}, 0
	insertRecords(t, e, "", v4, v6, noSvc)
	tests := []struct {
		where string
		want  string
	}{
		{"isIPAddressInRange(src_ip, '198.18.0.0/15')", "1"},
		{"isIPAddressInRange(src_ip, 'fd00:10::/32')", "2"},
		{"isIPAddressInRange(dst_ip, 'fd00:10:2::/48')", "2"},
		{"service_ip != '' AND isIPAddressInRange(service_ip, 'fd00:10:ff::/64')", "1"},
		{"ip_version = 6", "2"},
		{"src_ip = '198.18.1.10'", "1"},
		{"src_ip_bin BETWEEN toIPv6('fd00:10::') AND toIPv6('fd00:10:ffff:ffff:ffff:ffff:ffff:ffff')", "2"},
		{"src_ip_bin BETWEEN toIPv6('198.18.0.0') AND toIPv6('198.19.255.255')", "1"},
	}
	for _, tt := range tests {
		if got := queryString(t, e, "SELECT count() FROM dualflow.flows WHERE "+tt.where); got != tt.want {
			t.Errorf("WHERE %s: count %s, want %s", tt.where, got, tt.want)
		}
	}
}

// TestRollupsSumDeltas checks that every rollup sums delta counters only.
func TestRollupsSumDeltas(t *testing.T) {
	e := needEngine(t)
	truncate(t, e)
	var recs []flow.Record
	for i := 0; i < 10; i++ {
		recs = append(recs, sampleRecord(i, i%2 == 1))
	}
	insertRecords(t, e, "", recs...)
	for _, tbl := range []string{"rollup_pod_to_pod_1m", "rollup_pod_to_service_1m", "rollup_node_to_node_1m"} {
		got := queryString(t, e, "SELECT ip_version, sum(records), sum(packets), sum(bytes), sum(reverse_bytes) FROM dualflow."+tbl+" GROUP BY ip_version ORDER BY ip_version")
		if want := "4\t5\t10\t750\t4500\n6\t5\t10\t750\t4500"; got != want {
			t.Errorf("%s:\n%s\nwant\n%s", tbl, got, want)
		}
	}
	got := queryString(t, e, "SELECT direction, verdict, policy_name, policy_rule, sum(records), sum(bytes) FROM dualflow.rollup_policy_1m GROUP BY ALL ORDER BY direction")
	if want := "ingress\tallowed\tcart-allow-frontend\t0\t10\t1500\negress\tnot_isolated\t\t-1\t10\t1500"; got != want {
		t.Errorf("rollup_policy_1m:\n%s\nwant\n%s", got, want)
	}
}

// TestRollupsLeaveOutProbes: the rollups' views sum ordinary traffic only:
// the rows of traceflow probes (probe_trace_id set), IPv4 or IPv6, are
// stored in flows and left out of every rollup (migration 0012).
func TestRollupsLeaveOutProbes(t *testing.T) {
	e := needEngine(t)
	truncate(t, e)
	var recs []flow.Record
	for i := 0; i < 8; i++ {
		r := sampleRecord(i, i%2 == 1)
		if i >= 4 {
			r.ProbeTraceID = fmt.Sprintf("tf-%016x", i)
		}
		recs = append(recs, r)
	}
	insertRecords(t, e, "", recs...)
	if got := queryString(t, e, "SELECT ip_version, countIf(is_probe), countIf(NOT is_probe) FROM dualflow.flows GROUP BY ip_version ORDER BY ip_version"); got != "4\t2\t2\n6\t2\t2" {
		t.Errorf("flows by family, probe and not:\n%s", got)
	}
	for _, tbl := range []string{"rollup_pod_to_pod_1m", "rollup_pod_to_service_1m", "rollup_node_to_node_1m"} {
		got := queryString(t, e, "SELECT ip_version, sum(records), sum(packets) FROM dualflow."+tbl+" GROUP BY ip_version ORDER BY ip_version")
		if want := "4\t2\t4\n6\t2\t4"; got != want {
			t.Errorf("%s:\n%s\nwant\n%s", tbl, got, want)
		}
	}
	got := queryString(t, e, "SELECT direction, sum(records) FROM dualflow.rollup_policy_1m GROUP BY ALL ORDER BY direction")
	if want := "ingress\t4\negress\t4"; got != want {
		t.Errorf("rollup_policy_1m:\n%s\nwant\n%s", got, want)
	}
}

// TestInsertDeduplication replays a batch with the same token, as the writer
// does after an ambiguous failure: ClickHouse keeps one copy, in flows and
// in the rollups.
func TestInsertDeduplication(t *testing.T) {
	e := needEngine(t)
	truncate(t, e)
	recs := []flow.Record{sampleRecord(1, false), sampleRecord(2, true)}
	insertRecords(t, e, "batch-1", recs...)
	insertRecords(t, e, "batch-1", recs...)
	insertRecords(t, e, "batch-2", recs...)
	if got := queryString(t, e, "SELECT count() FROM dualflow.flows"); got != "4" {
		t.Errorf("flows count = %s, want 4 (batch-1 once, batch-2 once)", got)
	}
	if got := queryString(t, e, "SELECT sum(records) FROM dualflow.rollup_node_to_node_1m"); got != "4" {
		t.Errorf("rollup records = %s, want 4", got)
	}
}
