package chdb

import (
	"slices"
	"strings"
	"testing"
)

func TestSplitInsert(t *testing.T) {
	tests := []struct {
		name, in   string
		ok         bool
		query, fmt string
		data       string
	}{
		{"format", "INSERT INTO db.t (a, b) FORMAT RowBinary", true, "INSERT INTO db.t (a, b)", "RowBinary", ""},
		{"settings", "insert into t settings insert_deduplication_token='x FORMAT y' format Native", true, "insert into t settings insert_deduplication_token='x FORMAT y'", "Native", ""},
		{"inline data", "INSERT INTO t FORMAT CSV  \n1,2\n", true, "INSERT INTO t", "CSV", "1,2\n"},
		{"crlf", "INSERT INTO t FORMAT TSV\r\n1\n", true, "INSERT INTO t", "TSV", "1\n"},
		{"column named format", "INSERT INTO t (format, `FORMAT`) FORMAT TSV\n", true, "INSERT INTO t (format, `FORMAT`)", "TSV", ""},
		{"table named format", "INSERT INTO format FORMAT TSV", true, "INSERT INTO format", "TSV", ""},
		{"values", "INSERT INTO t VALUES (1, 'a'), (2, 'b')", true, "INSERT INTO t", "Values", " (1, 'a'), (2, 'b')"},
		{"comments", "/* x */ -- y\nINSERT /* FORMAT no */ INTO t # FORMAT no\n FORMAT JSONEachRow {}", true, "/* x */ -- y\nINSERT /* FORMAT no */ INTO t # FORMAT no", "JSONEachRow", "{}"},
		{"no format", "INSERT INTO t", true, "INSERT INTO t", "Values", ""},
		{"select", "INSERT INTO t SELECT * FROM u FORMAT TSV", false, "", "", ""},
		{"with select", "INSERT INTO t WITH 1 AS x SELECT x", false, "", "", ""},
		{"infile", "INSERT INTO t FROM INFILE '/etc/passwd' FORMAT TSV", false, "", "", ""},
		{"not insert", "SELECT 1 FORMAT TSV", false, "", "", ""},
		{"ipv6 in values", "INSERT INTO t VALUES ('fd00:10:db8::1')", true, "INSERT INTO t", "Values", " ('fd00:10:db8::1')"},
		{"empty", "", false, "", "", ""},
		{"format without name", "INSERT INTO t FORMAT", false, "", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := SplitInsert(tt.in)
			if ok != tt.ok {
				t.Fatalf("ok = %v, want %v (%+v)", ok, tt.ok, got)
			}
			if !ok {
				return
			}
			if got.Query != tt.query || got.Format != tt.fmt || tt.in[got.DataOffset:] != tt.data {
				t.Errorf("got %q %q data %q, want %q %q data %q", got.Query, got.Format, tt.in[got.DataOffset:], tt.query, tt.fmt, tt.data)
			}
		})
	}
}

func TestOutputFormat(t *testing.T) {
	tests := []struct{ in, want string }{
		{"SELECT 1", ""},
		{"SELECT 1 FORMAT JSON", "JSON"},
		{"select * from (select 1 format TSV) format Native settings a=1", "Native"},
		{"SELECT 'FORMAT CSV' -- FORMAT X\n", ""},
		{"INSERT INTO t FORMAT RowBinary", ""},
		{"SELECT toString('fd00:10:db8::1') FORMAT JSONEachRow;", "JSONEachRow"},
	}
	for _, tt := range tests {
		if got := OutputFormat(tt.in); got != tt.want {
			t.Errorf("OutputFormat(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func FuzzSplitInsert(f *testing.F) {
	for _, s := range []string{
		"INSERT INTO t FORMAT TSV\n1\n", "INSERT INTO t VALUES (1)", "INSERT INTO `a``b` (\"x\") FORMAT CSV",
		"INSERT /* /* nested */ */ INTO t FORMAT X", "INSERT INTO t SETTINGS a='\\'' FORMAT Y\r\n", "insert into t select 1",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := SplitInsert(s)
		if !ok {
			return
		}
		if got.DataOffset < 0 || got.DataOffset > len(s) {
			t.Fatalf("data offset %d out of range for %d bytes", got.DataOffset, len(s))
		}
		if got.Format == "" || !strings.HasPrefix(strings.TrimSpace(s), got.Query[:min(len(got.Query), 1)]) {
			t.Fatalf("bad split %+v", got)
		}
	})
}

// TestSplitInsertFunction: INSERT INTO FUNCTION is told apart, so that a
// user who may insert into tables cannot insert into a file.
func TestSplitInsertFunction(t *testing.T) {
	for in, want := range map[string]bool{
		"INSERT INTO FUNCTION file('/x', 'RawBLOB') FORMAT RawBLOB":            true,
		"insert into table function file('/x') values (1)":                     true,
		"INSERT /* c */ INTO\nFUNCTION url('http://[fd00:10::1]/') FORMAT TSV": true,
		"INSERT TABLE FUNCTION remote('198.18.0.1', db.t) VALUES (1)":          true,
		"INSERT INTO function_log FORMAT TSV":                                  false,
		"INSERT INTO db.t (a) FORMAT RowBinary":                                false,
		"INSERT INTO `FUNCTION` FORMAT TSV":                                    false,
	} {
		got, ok := SplitInsert(in)
		if !ok || got.Function != want {
			t.Errorf("%q: Function %v (ok %v), want %v", in, got.Function, ok, want)
		}
	}
}

func TestIntoOutfile(t *testing.T) {
	for in, want := range map[string]bool{
		"SELECT 1 INTO OUTFILE 'x'":             true,
		"select 1 into/* */outfile 'x'":         true,
		"DESCRIBE (SELECT 1) INTO\nOUTFILE 'x'": true,
		"SELECT 'INTO OUTFILE'":                 false,
		"SELECT 1 AS `INTO OUTFILE`":            false,
		"SELECT 1 -- INTO OUTFILE 'x'":          false,
		"SELECT into, outfile FROM t":           false,
	} {
		if got := IntoOutfile(in); got != want {
			t.Errorf("IntoOutfile(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestSortedKeys: settings are applied in name order, readonly last (set
// first, it would forbid the others).
func TestSortedKeys(t *testing.T) {
	for _, tc := range []struct {
		m    map[string]string
		want []string
	}{
		{nil, []string{}},
		{map[string]string{"b": "", "a": ""}, []string{"a", "b"}},
		{map[string]string{"readonly": "1", "max_threads": "2", "zz": ""}, []string{"max_threads", "zz", "readonly"}},
	} {
		if got := sortedKeys(tc.m); !slices.Equal(got, tc.want) {
			t.Errorf("sortedKeys(%v) = %v, want %v", tc.m, got, tc.want)
		}
	}
}
