package chsql

import "testing"

// cases are the strings the quoting must hold.
var cases = []string{
	"", "plain", "it's", `back\slash`, `\'`, `'; DROP TABLE dualflow.flows; --`,
	"nul\x00byte", "new\nline\ttab\r", "\x7fdel", "unicode ünïcödé ✓", `\x41`, "''", `\\'`, "fd00:10::1",
}

func TestStringNoBreakout(t *testing.T) {
	for _, s := range cases {
		q := String(s)
		if q[0] != '\'' || q[len(q)-1] != '\'' {
			t.Fatalf("String(%q) = %s", s, q)
		}
		inner := q[1 : len(q)-1]
		// Every quote inside is escaped by an odd run of backslashes.
		for i := 0; i < len(inner); i++ {
			if inner[i] == '\'' {
				n := 0
				for j := i - 1; j >= 0 && inner[j] == '\\'; j-- {
					n++
				}
				if n%2 == 0 {
					t.Errorf("String(%q) = %s: unescaped quote at %d", s, q, i)
				}
			}
			if inner[i] < 0x20 || inner[i] == 0x7f {
				t.Errorf("String(%q) has control byte %#x", s, inner[i])
			}
		}
	}
}

func TestIdent(t *testing.T) {
	for in, want := range map[string]string{"flows": "`flows`", "a`b": "`a\\`b`", `a\b`: "`a\\\\b`"} {
		if got := Ident(in); got != want {
			t.Errorf("Ident(%q) = %s, want %s", in, got, want)
		}
	}
}
