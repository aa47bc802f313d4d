package chdb

import (
	"strings"
	"testing"
)

// TestSplitStatements: the statements of a migration file.
func TestSplitStatements(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"SELECT 1; SELECT 2;", []string{"SELECT 1", "SELECT 2"}},
		{"SELECT 'a;b';\n-- c;\nSELECT 2", []string{"SELECT 'a;b'", "SELECT 2"}},
		{"SELECT 'it\\'s;'; SELECT `x;y`", []string{"SELECT 'it\\'s;'", "SELECT `x;y`"}},
		{"/* a; b */ SELECT 1;", []string{"SELECT 1"}},
		{"# a; b\nSELECT 1 -- c;\n;", []string{"SELECT 1"}},
		{"SELECT 'it'';'", []string{"SELECT 'it'';'"}},
		{"-- only a comment;\n;;\n", nil},
		{"SELECT '::ffff:198.18.0.1', 'fd00:10::1';", []string{"SELECT '::ffff:198.18.0.1', 'fd00:10::1'"}},
		{"SELECT 'unterminated", []string{"SELECT 'unterminated"}},
	}
	for _, tt := range tests {
		got := SplitStatements(tt.in)
		if strings.Join(got, "|") != strings.Join(tt.want, "|") {
			t.Errorf("SplitStatements(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
