package api

import (
	"fmt"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// filterVocabulary is every word the filter builder writes outside string
// literals: keywords, functions and column names. Input never adds one.
var filterVocabulary = func() map[string]bool {
	m := map[string]bool{}
	for _, w := range strings.Fields(`AND OR NOT BETWEEN IN mapContains toIPv6 fromUnixTimestamp64Milli toStartOfMinute
		flow_end ip_version protocol verdict_mismatch k8s_view_stale is_probe probe_trace_id ingress_verdict egress_verdict
		dst_service_name dst_service_namespace
		ingress_policy_name ingress_policy_namespace egress_policy_name egress_policy_namespace`) {
		m[w] = true
	}
	for _, s := range sides {
		for _, c := range strings.Fields("pod_name pod_namespace workload_name workload_kind node zone ip_bin port pod_labels") {
			m[s+"_"+c] = true
		}
	}
	return m
}()

// filterOperators are the builder's punctuation.
var filterOperators = []string{"!=", ">=", "(", ")", "[", "]", ",", "=", "<"}

// filterLiterals are the string literals the builder writes itself.
var filterLiterals = map[string]bool{"UTC": true, "unknown": true, "denied": true, "rejected": true}

// sqlToken is a token of the engine's SQL lexer, as far as the filter
// builder's output needs: a word, a number, a string literal (its value
// unescaped as the engine reads it) or an operator.
type sqlToken struct {
	kind string // word, number, string, op
	text string
}

// lexFilterSQL splits sql as the engine would. It fails on anything the
// builder never writes: comments, quoted identifiers, other operators, an
// unterminated literal.
func lexFilterSQL(sql string) ([]sqlToken, error) {
	var out []sqlToken
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == ' ':
			i++
		case c == '\'':
			v, n, err := readLiteral(sql[i:])
			if err != nil {
				return nil, fmt.Errorf("at %d: %w", i, err)
			}
			out = append(out, sqlToken{"string", v})
			i += n
		case isWordStart(c):
			j := i + 1
			for j < len(sql) && (isWordStart(sql[j]) || isDigit(sql[j])) {
				j++
			}
			out = append(out, sqlToken{"word", sql[i:j]})
			i = j
		case isDigit(c) || c == '-' && i+1 < len(sql) && isDigit(sql[i+1]):
			j := i + 1
			for j < len(sql) && isDigit(sql[j]) {
				j++
			}
			if j < len(sql) && (isWordStart(sql[j]) || sql[j] == '.') {
				return nil, fmt.Errorf("at %d: malformed number %q", i, sql[i:min(j+1, len(sql))])
			}
			out = append(out, sqlToken{"number", sql[i:j]})
			i = j
		default:
			op := ""
			for _, o := range filterOperators {
				if strings.HasPrefix(sql[i:], o) {
					op = o
					break
				}
			}
			if op == "" {
				return nil, fmt.Errorf("at %d: %q is not something the builder writes", i, sql[i:min(i+10, len(sql))])
			}
			out = append(out, sqlToken{"op", op})
			i += len(op)
		}
	}
	return out, nil
}

func isWordStart(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isDigit(c byte) bool     { return c >= '0' && c <= '9' }

// readLiteral reads the string literal at the start of s by the engine's
// rules (ReadHelpers' parseComplexEscapeSequence): a backslash escapes the
// next byte (\xHH is a byte; \n, \t, ... controls; other escapes keep the
// backslash unless the byte is \ ' " ` / = or a control), and ” is a
// quote. It returns the value and the bytes read.
func readLiteral(s string) (string, int, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'':
			if i+1 < len(s) && s[i+1] == '\'' {
				b.WriteByte('\'')
				i++
				continue
			}
			return b.String(), i + 1, nil
		case '\\':
			if i+1 >= len(s) {
				return "", 0, fmt.Errorf("unterminated literal %q", s)
			}
			i++
			e := s[i]
			if e == 'x' {
				if i+2 >= len(s) {
					return "", 0, fmt.Errorf("short \\x escape in %q", s)
				}
				v, err := strconv.ParseUint(s[i+1:i+3], 16, 8)
				if err != nil {
					return "", 0, fmt.Errorf("bad \\x escape in %q", s)
				}
				b.WriteByte(byte(v))
				i += 2
				continue
			}
			if e == 'N' { // \N is an empty string
				continue
			}
			d := map[byte]byte{'a': 7, 'b': 8, 'e': 0x1b, 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t', 'v': '\v', '0': 0}[e]
			if d == 0 && e != '0' {
				d = e
			}
			if !strings.ContainsRune(`\'"`+"`/=", rune(d)) && d >= 0x20 && d != 0x7f {
				b.WriteByte('\\')
			}
			b.WriteByte(d)
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, fmt.Errorf("unterminated literal %q", s)
}

// valuePieces are the parts of a filter value a literal may hold: the
// value, or what is left of it around one of the separators the fields
// use (ns/name, Kind:ns/name, key=value, key!=value, !key), trimmed. A
// literal that ends inside a piece means a quote in the input closed it.
func valuePieces(v string) []string {
	out := []string{v}
	add := func(s ...string) {
		for _, x := range s {
			out = append(out, x, strings.TrimSpace(x))
		}
	}
	if rest, ok := strings.CutPrefix(v, "!"); ok {
		add(rest)
	}
	for _, sep := range []string{"/", ":", "=", "!="} {
		if a, b, ok := strings.Cut(v, sep); ok {
			add(a, b, strings.TrimPrefix(b, "="))
			if sep == ":" {
				if ns, name, ok := strings.Cut(b, "/"); ok {
					add(ns, name)
				}
			}
		}
	}
	return out
}

// checkFilterSQL checks that sql, built from the query q, is made of the
// builder's vocabulary and of literals from the input: every string
// literal reads back as a whole piece of a value of q (or an address the
// builder parsed from one, or one of its own), every number is in q, a
// protocol number, or the time range.
func checkFilterSQL(q url.Values, f *Filter, sql string) error {
	toks, err := lexFilterSQL(sql)
	if err != nil {
		return err
	}
	var input []string
	pieces := map[string]bool{}
	for _, vs := range q {
		input = append(input, vs...)
		for _, raw := range vs {
			for _, v := range strings.Split(raw, ",") {
				for _, p := range valuePieces(strings.TrimSpace(v)) {
					pieces[p] = true
				}
			}
		}
	}
	fromInput := func(s string) bool {
		for _, v := range input {
			if strings.Contains(v, s) {
				return true
			}
		}
		return false
	}
	numbers := map[string]bool{}
	for _, t := range []time.Time{f.Since, f.Until, f.Since.Truncate(time.Minute), f.Until.Truncate(time.Minute)} {
		numbers[strconv.FormatInt(t.UnixMilli(), 10)] = true
	}
	for _, n := range []int{1, 6, 17, 58, 132} { // the protocols audit.ParseProto names
		numbers[strconv.Itoa(n)] = true
	}
	for i, t := range toks {
		switch t.kind {
		case "word":
			if !filterVocabulary[t.text] {
				return fmt.Errorf("word %q outside a literal is not the builder's", t.text)
			}
		case "number":
			if !numbers[t.text] && !fromInput(t.text) {
				return fmt.Errorf("number %s is not from the input", t.text)
			}
		case "string":
			if filterLiterals[t.text] || pieces[t.text] {
				continue
			}
			if i >= 2 && toks[i-2].text == "toIPv6" && toks[i-1].text == "(" {
				if _, err := netip.ParseAddr(t.text); err == nil {
					continue
				}
			}
			return fmt.Errorf("literal %q is not from the input", t.text)
		}
	}
	return nil
}

// FuzzFilterSQL: for every filter parseFilter accepts, the SQL it builds
// holds input only inside literals that read back as that input, so no
// filter can inject SQL; and it stays within the size bound.
func FuzzFilterSQL(f *testing.F) {
	for _, s := range []string{
		"src_ip=198.18.2.3",
		"src_ip=::ffff:198.18.2.3&dst_ip=fd00:10::/32",
		"dst_ip=::ffff:198.18.0.0/111,fd00:10:244:3::/64",
		"pod=ns/p'x",
		"not.verdict=denied&ip_version=6",
		"verdict=unknown,dropped,not_isolated",
		"src_label=app%3Dweb&dst_label=!tier&label=k!%3Dv",
		"port=80-90&protocol=udp,6,ICMPv6",
		"src_workload=Deployment:shop/frontend&dst_port=5432",
		"service=shop/db&policy=shop/db-policy&verdict_mismatch=true",
		"namespace=infra&src_node=node-b&zone=eu-1a",
		"since=15m&until=2026-11-29T11:00:00Z&src_pod=x')%20OR%201=1%20--",
		"since=1700000000000&dst_pod=a\\&src_pod=%27%27",
		"label=%5C%27%20OR%201%3D1&node=%00%0a%7f%ff",
		"workload=::::/&policy=a/b/c",
	} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		fl, err := parseFilter(q, now)
		if err != nil {
			return
		}
		size := 0
		for _, c := range fl.conds {
			size += len(c)
		}
		if size > maxFilterSQL {
			t.Fatalf("conditions of %d bytes passed the %d bound", size, maxFilterSQL)
		}
		sql := strings.Join(fl.where(), " AND ")
		if err := checkFilterSQL(q, fl, sql); err != nil {
			t.Fatalf("%q builds %s\n%v", raw, sql, err)
		}
	})
}

// TestCheckFilterSQL: the checker FuzzFilterSQL relies on catches
// injection.
func TestCheckFilterSQL(t *testing.T) {
	q := url.Values{"src_pod": {"x' OR 1=1 --"}}
	f := &Filter{Since: time.UnixMilli(1), Until: time.UnixMilli(2)}
	for _, bad := range []string{
		"src_pod_name = 'x' OR 1=1 --'",                // the quote not escaped
		"src_pod_name = 'x\\' OR 1=1 --\\'",            // the backslash not escaped: an unterminated literal
		"src_pod_name = 'x' OR src_pod_name = 'y'",     // a literal not from the input
		"src_pod_name = 'x' OR `src_pod_name` = 'x'",   // a quoted identifier
		"src_pod_name = 'x' /* c */",                   // a comment
		"src_pod_name = 'x' OR dst_pod_name = 12",      // a number not from the input
		"src_pod_name = 'x' OR sleep(3)",               // a function of no builder
		"src_pod_name = toIPv6('x'' OR 1=1 --not-ip')", // a literal posing as an address
	} {
		if err := checkFilterSQL(q, f, bad); err == nil {
			t.Errorf("checker accepts %s", bad)
		}
	}
	if err := checkFilterSQL(q, f, `src_pod_name = 'x\' OR 1=1 --' AND flow_end >= fromUnixTimestamp64Milli(1, 'UTC')`); err != nil {
		t.Errorf("checker refuses the quoted input: %v", err)
	}
	// Input that is all vocabulary: a quote not escaped leaves only words
	// outside the literals, but the literals are not whole values.
	q = url.Values{"src_pod": {"x' OR src_pod_name = 'x"}}
	for _, bad := range []string{
		"src_pod_name = 'x' OR src_pod_name = 'x'",
		"(src_pod_name = 'x' OR src_pod_name = 'x' OR dst_pod_name = 'x' OR src_pod_name = 'x')",
	} {
		if err := checkFilterSQL(q, f, bad); err == nil {
			t.Errorf("checker accepts %s", bad)
		}
	}
}
