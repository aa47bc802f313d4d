package api

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/internal/chsql"
)

var quoteCases = []string{
	"", "plain", "it's", `back\slash`, `\'`, `'; DROP TABLE dualflow.flows; --`, `\`, `x\`, "'",
	"nul\x00byte", "new\nline\ttab\r", "\x7fdel", "unicode ünïcödé ✓", `\x41`, "''", `\\'`, "fd00:10::1",
	"\xff\xfe invalid utf-8", "`backquote`", "emoji 🚀\u202e", "a' OR '1'='1",
}

// TestQuoteRoundTrip has the engine parse each literal of chsql.String
// back (chsql checks that none can be closed early), and match each value
// with chsql.Eq and all of them with chsql.In.
func TestQuoteRoundTrip(t *testing.T) {
	e := needEngine(t)
	ctx := context.Background()
	lits := make([]string, len(quoteCases))
	for i, s := range quoteCases {
		lits[i] = chsql.String(s)
		out, err := e.Query(ctx, "SELECT hex("+chsql.String(s)+")", "TabSeparated")
		if err != nil {
			t.Fatalf("chsql.String(%q): %v", s, err)
		}
		want := strings.ToUpper(hexString(s))
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("chsql.String(%q): engine read %s, want %s", s, got, want)
		}
	}
	from := "(SELECT arrayJoin([" + strings.Join(lits, ", ") + "]) AS v)"
	for _, s := range quoteCases {
		out, err := e.Query(ctx, chsql.Select{Cols: "hex(v)", From: from, Where: []string{chsql.Eq("v", s)}}.String(), "TabSeparated")
		if got, want := strings.TrimSpace(string(out)), strings.ToUpper(hexString(s)); err != nil || got != want {
			t.Errorf("chsql.Eq(%q): %q %v, want the one row %s", s, got, err, want)
		}
	}
	out, err := e.Query(ctx, chsql.Select{Cols: "count()", From: from, Where: []string{chsql.In("v", quoteCases)}}.String(), "TabSeparated")
	if got := strings.TrimSpace(string(out)); err != nil || got != fmt.Sprint(len(quoteCases)) {
		t.Errorf("chsql.In: %q %v, want every one of %d rows", got, err, len(quoteCases))
	}
}

func hexString(s string) string {
	const h = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		b.WriteByte(h[s[i]>>4])
		b.WriteByte(h[s[i]&15])
	}
	return b.String()
}

func TestLastAddr(t *testing.T) {
	for _, tc := range []struct{ p, hi string }{
		{"198.18.0.0/16", "198.18.255.255"},
		{"198.18.1.7/32", "198.18.1.7"},
		{"0.0.0.0/0", "255.255.255.255"},
		{"fd00:10::/32", "fd00:10:ffff:ffff:ffff:ffff:ffff:ffff"},
		{"fd00:10:244:1::/64", "fd00:10:244:1:ffff:ffff:ffff:ffff"},
		{"fd00:10::1/128", "fd00:10::1"},
		{"198.18.2.3/20", "198.18.15.255"},
		{"::/0", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"},
	} {
		if got := lastAddr(netip.MustParsePrefix(tc.p).Masked()); got != netip.MustParseAddr(tc.hi) {
			t.Errorf("%s: last %s, want %s", tc.p, got, tc.hi)
		}
	}
}
