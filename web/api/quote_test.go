package api

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	"github.com/dualflow/dualflow/internal/chsql"
)

var quoteCases = []string{
	"", "plain", "it's", `back\slash`, `\'`, `'; DROP TABLE dualflow.flows; --`,
	"nul\x00byte", "new\nline\ttab\r", "\x7fdel", "unicode ünïcödé ✓", `\x41`, "''", `\\'`, "fd00:10::1",
}

// TestQuoteRoundTrip has the engine parse each literal of chsql.String
// back (chsql checks that none can be closed early).
func TestQuoteRoundTrip(t *testing.T) {
	e := needEngine(t)
	for _, s := range quoteCases {
		out, err := e.Query(context.Background(), "SELECT hex("+chsql.String(s)+")", "TabSeparated")
		if err != nil {
			t.Fatalf("chsql.String(%q): %v", s, err)
		}
		want := strings.ToUpper(hexString(s))
		if got := strings.TrimSpace(string(out)); got != want {
			t.Errorf("chsql.String(%q): engine read %s, want %s", s, got, want)
		}
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

func TestPrefixRange(t *testing.T) {
	for _, tc := range []struct{ p, lo, hi string }{
		{"198.18.0.0/16", "198.18.0.0", "198.18.255.255"},
		{"198.18.1.7/32", "198.18.1.7", "198.18.1.7"},
		{"0.0.0.0/0", "0.0.0.0", "255.255.255.255"},
		{"fd00:10::/32", "fd00:10::", "fd00:10:ffff:ffff:ffff:ffff:ffff:ffff"},
		{"fd00:10:244:1::/64", "fd00:10:244:1::", "fd00:10:244:1:ffff:ffff:ffff:ffff"},
		{"fd00:10::1/128", "fd00:10::1", "fd00:10::1"},
		{"198.18.2.3/20", "198.18.0.0", "198.18.15.255"},
	} {
		p := netip.MustParsePrefix(tc.p)
		lo, hi := prefixRange(p)
		if lo != ipv6Literal(netip.MustParseAddr(tc.lo)) || hi != ipv6Literal(netip.MustParseAddr(tc.hi)) {
			t.Errorf("%s: %s..%s, want %s..%s", tc.p, lo, hi, tc.lo, tc.hi)
		}
	}
}
