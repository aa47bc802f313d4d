package api

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/internal/reload"
	"github.com/dualflow/dualflow/test/support/logtest"
	"github.com/dualflow/dualflow/test/support/reloadtest"
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
		tokens, err := LoadTokens(path, reload.Options{})
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
			if _, err := LoadTokens(path, reload.Options{}); err == nil || !strings.Contains(err.Error(), "chmod 600 "+path) {
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
	if _, err := LoadTokens(link, reload.Options{}); err == nil {
		t.Error("a 0644 file behind a symlink accepted")
	}
}

// TestTokensReload rotates the tokens file as the kubelet updates a Secret
// volume: a token taken out stops working at once the change is seen, a
// new one works; a changed file that is refused (group-readable by
// others, a line that does not parse) leaves the last good tokens in
// force, logged once.
func TestTokensReload(t *testing.T) {
	var logs logtest.Buffer
	v := reloadtest.NewVolume(t, 0o600, map[string][]byte{"tokens": []byte("old-tok operator alice\nview-tok viewer bob\n")})
	tokens, err := LoadTokens(v.Path("tokens"), reload.Options{Name: "web-tokens", Logger: logs.Logger(), Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	h := testAPI(t, Config{Store: &fakeStore{}, Tokens: tokens})
	code := func(tok string) int {
		return do(t, h, "GET", "/api/v1/whoami", "", "Authorization", "Bearer "+tok).code
	}
	waitCodes := func(what string, want map[string]int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			ok := true
			for tok, c := range want {
				ok = ok && code(tok) == c
			}
			if ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: timed out", what)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	waitCodes("start", map[string]int{"old-tok": 200, "view-tok": 200, "new-tok": 401})

	v.Update(map[string][]byte{"tokens": []byte("new-tok operator alice\nview-tok viewer bob\n")})
	waitCodes("rotated", map[string]int{"old-tok": 401, "view-tok": 200, "new-tok": 200})

	for i, bad := range []struct {
		name string
		mode os.FileMode
		body string
	}{
		{"readable by others", 0o644, "evil-tok operator mallory\n"},
		{"a line without a role", 0o600, "evil-tok\n"},
	} {
		v.Mode = bad.mode
		v.Update(map[string][]byte{"tokens": []byte(bad.body)})
		deadline := time.Now().Add(30 * time.Second)
		for len(logs.Lines("reloading changed files failed")) < i+1 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: never refused", bad.name)
			}
			code("new-tok")
			time.Sleep(2 * time.Millisecond)
		}
		for range 5 {
			if c := code("evil-tok"); c != 401 {
				t.Fatalf("%s: the refused file's token answered %d", bad.name, c)
			}
			if c := code("new-tok"); c != 200 {
				t.Fatalf("%s: the last good token answered %d", bad.name, c)
			}
		}
	}
	if n := len(logs.Lines("reloading changed files failed")); n != 2 {
		t.Errorf("2 refused files logged %d times:\n%s", n, logs.String())
	}
	if l := logs.Lines("chmod 600"); len(l) != 1 {
		t.Errorf("the refusal of a file others may read does not say the fix:\n%s", logs.String())
	}
	v.Mode = 0o600
	v.Update(map[string][]byte{"tokens": []byte("# every token revoked\n")})
	waitCodes("emptied", map[string]int{"new-tok": 401, "view-tok": 401})
}
