package chsql

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestBuilderQuotesValues: every value the builder writes, hostile ones
// included, is the one literal of String, whole, where the value goes.
func TestBuilderQuotesValues(t *testing.T) {
	for _, v := range cases {
		lit := String(v)
		for _, tc := range []struct{ got, want string }{
			{Eq("src_pod_name", v), "src_pod_name = " + lit},
			{In("ns", []string{v, "b"}), "ns IN (" + lit + ", 'b')"},
			{And(Eq("a", v), Eq("b", v)), "(a = " + lit + " AND b = " + lit + ")"},
			{Or(Eq("a", v)), "a = " + lit},
			{Select{Cols: "count()", From: "t", Where: []string{Eq("a", v), "NOT x"}, Limit: 3}.String(),
				"SELECT count() FROM t WHERE a = " + lit + " AND NOT x LIMIT 3"},
		} {
			if tc.got != tc.want {
				t.Errorf("%q: %s, want %s", v, tc.got, tc.want)
			}
		}
	}
	if got := IPv6(netip.MustParseAddr("::ffff:10.0.0.1")); got != "toIPv6('10.0.0.1')" {
		t.Errorf("IPv6 of a mapped address: %s", got)
	}
}

func TestSelectClauses(t *testing.T) {
	q := Select{Cols: "a, count() AS n", From: "db.t", Where: []string{"x = 1", "y"}, GroupBy: "a", Having: "n > 1",
		OrderBy: "n DESC", Limit: 10, Settings: JSONSettings(1 << 20)}.String()
	want := "SELECT a, count() AS n FROM db.t WHERE x = 1 AND y GROUP BY a HAVING n > 1 ORDER BY n DESC LIMIT 10" +
		" SETTINGS output_format_json_quote_64bit_integers = 0, max_memory_usage = 1048576, max_bytes_before_external_group_by = 524288, max_bytes_before_external_sort = 524288"
	if q != want {
		t.Errorf("got  %s\nwant %s", q, want)
	}
	if q := (Select{Cols: "1", From: "t"}).String(); q != "SELECT 1 FROM t" {
		t.Errorf("empty clauses: %s", q)
	}
}

func TestTiers(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse("15:04:05.000", s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	const row, minute, hour = FlowEndCol, MinuteKey, "toStartOfHour(flow_end)"
	for _, tc := range []struct {
		since, until string
		hours        bool
		want         []string // key of each tier, in order
	}{
		{"10:00:10.000", "10:00:50.000", true, []string{row}},
		{"10:00:10.000", "10:05:50.000", true, []string{row, row, minute}},
		{"10:00:00.000", "10:05:00.000", true, []string{minute}},
		{"09:59:30.500", "12:00:10.000", true, []string{row, row, hour}},
		{"09:58:30.500", "12:01:10.000", true, []string{row, row, hour, minute, minute}},
		{"09:59:30.500", "12:00:10.000", false, []string{row, row, minute}},
		{"09:00:00.000", "12:30:00.000", true, []string{hour, minute}},
	} {
		var got []string
		for _, tr := range Tiers(FlowEndCol, at(tc.since), at(tc.until), tc.hours) {
			got = append(got, tr.Key)
			if !strings.HasPrefix(tr.Cond, tr.Key+" >= ") {
				t.Errorf("[%s, %s): tier %s selects %s", tc.since, tc.until, tr.Key, tr.Cond)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("[%s, %s) hours=%v: tiers %v, want %v", tc.since, tc.until, tc.hours, got, tc.want)
		}
	}
}

func TestDecode(t *testing.T) {
	type row struct {
		N uint64 `json:"n"`
		S string `json:"s"`
	}
	rows, err := Decode[row]([]byte("{\"n\":18446744073709551615,\"s\":\"a\\u0000'\"}\n{\"n\":1,\"s\":\"ü\"}\n"))
	if err != nil || len(rows) != 2 || rows[0].N != 1<<64-1 || rows[0].S != "a\x00'" || rows[1].S != "ü" {
		t.Errorf("Decode: %+v %v", rows, err)
	}
	if rows, err := Decode[row](nil); err != nil || len(rows) != 0 {
		t.Errorf("Decode of no output: %+v %v", rows, err)
	}
	if _, err := Decode[row]([]byte("{\"n\":1}\n{\"n\":\"x\"}\n")); err == nil || !strings.Contains(err.Error(), "row 1") {
		t.Errorf("Decode of a bad row: %v", err)
	}
}
