package reload

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/dualflow/dualflow/internal/certs"
	"github.com/dualflow/dualflow/test/support/logtest"
	"github.com/dualflow/dualflow/test/support/reloadtest"
)

// waitFor polls cond until it holds, failing the test after a generous
// deadline (the machine may be loaded): never a fixed sleep.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// loadText loads a file's content; "bad" content does not load.
func loadText(path string) func() (string, error) {
	return func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", err
		}
		if s := string(b); s != "bad" {
			return s, nil
		}
		return "", errors.New("bad content")
	}
}

// TestFile: a changed file is loaded at the next check; content that does
// not load keeps the last good value, is logged and counted once however
// often it is checked, and a later good change loads.
func TestFile(t *testing.T) {
	var logs logtest.Buffer
	v := reloadtest.NewVolume(t, 0o600, map[string][]byte{"value": []byte("one")})
	f, err := NewFile(Options{Name: "test", Logger: logs.Logger(), Interval: time.Millisecond}, loadText(v.Path("value")), v.Path("value"))
	if err != nil || f.Get() != "one" {
		t.Fatalf("%q %v", f.Get(), err)
	}
	v.Update(map[string][]byte{"value": []byte("two")})
	waitFor(t, "two", func() bool { return f.Get() == "two" })

	v.Update(map[string][]byte{"value": []byte("bad")})
	waitFor(t, "the error counted", func() bool { f.Get(); return f.errors.Load() == 1 })
	for range 20 { // checks of the same bad content: no more logs, no more counts
		time.Sleep(time.Millisecond)
		if got := f.Get(); got != "two" {
			t.Fatalf("after a bad change: %q, want the last good two", got)
		}
	}
	if n := len(logs.Lines("reloading changed files failed")); n != 1 || f.errors.Load() != 1 {
		t.Errorf("bad content logged %d times, counted %d; want once:\n%s", n, f.errors.Load(), logs.String())
	}
	if l := logs.Lines("reloading changed files failed"); len(l) == 1 && (!strings.Contains(l[0], "name=test") || !strings.Contains(l[0], "bad content")) {
		t.Errorf("the log line does not say what and why: %s", l[0])
	}
	// The file goes missing (a Secret's key removed): still the last good.
	v.Update(map[string][]byte{"other": []byte("x")})
	waitFor(t, "the missing file counted", func() bool { f.Get(); return f.errors.Load() == 2 })
	if got := f.Get(); got != "two" {
		t.Errorf("with the file gone: %q", got)
	}
	v.Update(map[string][]byte{"value": []byte("three")})
	waitFor(t, "three", func() bool { return f.Get() == "three" })
	if f.reloads.Load() != 2 || len(logs.Lines("reloaded changed files")) != 2 {
		t.Errorf("reloads %d, logged %d; want 2", f.reloads.Load(), len(logs.Lines("reloaded changed files")))
	}
}

// TestFileInPlace: a file rewritten in place, as an editor or `cp` does
// (same inode), is seen by its size or modification time.
func TestFileInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "value")
	if err := os.WriteFile(path, []byte("one"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := NewFile(Options{Interval: time.Millisecond}, loadText(path), path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("two!"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "two!", func() bool { return f.Get() == "two!" })
}

// TestFileFirstLoad: a process does not start on files it cannot load.
func TestFileFirstLoad(t *testing.T) {
	path := filepath.Join(t.TempDir(), "value")
	os.WriteFile(path, []byte("bad"), 0o600)
	if _, err := NewFile(Options{}, loadText(path), path); err == nil {
		t.Error("loaded bad content")
	}
	if _, err := NewFile(Options{}, loadText(path+".missing"), path+".missing"); err == nil {
		t.Error("loaded a missing file")
	}
}

// TestFileConcurrent: Get from many goroutines while the file changes
// (run with -race).
func TestFileConcurrent(t *testing.T) {
	v := reloadtest.NewVolume(t, 0o600, map[string][]byte{"value": []byte("0")})
	f, err := NewFile(Options{Interval: time.Microsecond}, loadText(v.Path("value")), v.Path("value"))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
					if f.Get() == "" {
						t.Error("empty value")
						return
					}
				}
			}
		})
	}
	for i := range 20 {
		v.Update(map[string][]byte{"value": []byte{byte('a' + i)}})
	}
	waitFor(t, "the last update", func() bool { return f.Get() == string(rune('a'+19)) })
	close(stop)
	wg.Wait()
}

// TestMetrics: reloads, errors and the certificate's expiry by name, from
// several components' collectors in one registry.
func TestMetrics(t *testing.T) {
	v := reloadtest.NewVolume(t, 0o600, map[string][]byte{"value": []byte("one")})
	a, _ := NewFile(Options{Name: "a", Interval: time.Millisecond}, loadText(v.Path("value")), v.Path("value"))
	b, _ := NewFile(Options{Name: "b"}, loadText(v.Path("value")), v.Path("value"))
	set := newCertSet(t)
	tv := reloadtest.NewVolume(t, 0o600, set.secret(t, certs.CollectorFile, certs.CollectorKeyFile))
	tl, err := LoadTLS(secretFiles(tv), Options{Name: "ipfix-server"})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	var none *TLS
	reg.MustRegister(Metrics(a, none), Metrics(b, tl))
	v.Update(map[string][]byte{"value": []byte("bad")})
	waitFor(t, "the error", func() bool { a.Get(); return a.errors.Load() == 1 })
	want := `
# HELP dualflow_file_reload_errors_total Changed files that did not load (half written, unparsable, a key not matching its certificate), by name; the last good content stays in use.
# TYPE dualflow_file_reload_errors_total counter
dualflow_file_reload_errors_total{name="a"} 1
dualflow_file_reload_errors_total{name="b"} 0
dualflow_file_reload_errors_total{name="ipfix-server"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "dualflow_file_reload_errors_total"); err != nil {
		t.Error(err)
	}
	n, err := testutil.GatherAndCount(reg, "dualflow_tls_certificate_expiry_timestamp_seconds")
	if err != nil || n != 1 {
		t.Errorf("expiry series: %d %v", n, err)
	}
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "dualflow_tls_certificate_expiry_timestamp_seconds" {
			if got := int64(mf.Metric[0].GetGauge().GetValue()); got != tl.NotAfter().Unix() || got < time.Now().Unix() {
				t.Errorf("expiry %d, want %d", got, tl.NotAfter().Unix())
			}
		}
	}
}
