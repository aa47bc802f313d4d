package api

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestBearerSchemeCaseInsensitive: RFC 7235 makes the auth scheme
// case-insensitive; the token itself is not.
func TestBearerSchemeCaseInsensitive(t *testing.T) {
	tok := &Tokens{}
	tok.Add("view-secret", Principal{Name: "v", Role: RoleViewer})
	h := testAPI(t, Config{Store: &fakeStore{}, Tokens: tok})
	for _, tc := range []struct {
		header string
		code   int
	}{
		{"Bearer view-secret", 200},
		{"bearer view-secret", 200},
		{"BEARER view-secret", 200},
		{"bEaReR view-secret", 200},
		{"Bearer   view-secret  ", 200},
		{"Bearer VIEW-SECRET", 401},
		{"Basic view-secret", 401},
		{"Bearerview-secret", 401},
		{"Bearer", 401},
		{"Bearer ", 401},
		{"view-secret", 401},
	} {
		if r := do(t, h, "GET", "/api/v1/whoami", "", "Authorization", tc.header); r.code != tc.code {
			t.Errorf("Authorization %q: %v, want %d", tc.header, r, tc.code)
		}
	}
}

// TestLoadTokensPermissions: like ssh with a private key, a tokens file
// group or others may read or write is refused, with the fix in the error.
func TestLoadTokensPermissions(t *testing.T) {
	for _, tc := range []struct {
		mode os.FileMode
		ok   bool
	}{
		{0o600, true},
		{0o400, true},
		{0o700, true},
		{0o644, false},
		{0o640, true}, // the process's own group (a pod's fsGroup); another group: below
		{0o440, true},
		{0o604, false},
		{0o620, false},
		{0o602, false},
		{0o660, false},
		{0o666, false},
	} {
		path := filepath.Join(t.TempDir(), "tokens")
		if err := os.WriteFile(path, []byte("tok operator alice\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, tc.mode); err != nil { // not subject to the umask
			t.Fatal(err)
		}
		tokens, err := LoadTokens(path)
		switch {
		case tc.ok && err != nil:
			t.Errorf("mode %#o: %v", tc.mode, err)
		case tc.ok && !tokens.Enabled():
			t.Errorf("mode %#o: no tokens loaded", tc.mode)
		case !tc.ok && err == nil:
			t.Errorf("mode %#o: accepted", tc.mode)
		case !tc.ok && !strings.Contains(err.Error(), "chmod 600 "+path):
			t.Errorf("mode %#o: the error does not say the fix: %v", tc.mode, err)
		}
	}
	// Group read for a group the process is not in is refused.
	if os.Geteuid() == 0 {
		path := filepath.Join(t.TempDir(), "tokens")
		os.WriteFile(path, []byte("tok operator alice\n"), 0o600)
		os.Chmod(path, 0o440)
		const other = 54321 // in no group of this process (checked)
		groups, _ := os.Getgroups()
		if !slices.Contains(append(groups, os.Getegid()), other) {
			if err := os.Chown(path, -1, other); err != nil {
				t.Fatal(err)
			}
			if _, err := LoadTokens(path); err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) {
				t.Errorf("mode 0440, group %d: %v, want refused", other, err)
			}
		}
	}
	// Through a symlink (a Kubernetes Secret volume), the file's own mode counts.
	dir := t.TempDir()
	target := filepath.Join(dir, "tokens-data")
	os.WriteFile(target, []byte("tok viewer\n"), 0o600)
	os.Chmod(target, 0o644)
	link := filepath.Join(dir, "tokens")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadTokens(link); err == nil {
		t.Error("a 0644 file behind a symlink accepted")
	}
}
