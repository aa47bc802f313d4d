package flowmetrics

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// rulesDir holds the alert rules the product ships and their promtool
// unit tests.
const rulesDir = "../../deploy/helm/dualflow/files/prometheus"

// TestAlertRules: promtool (Debian's prometheus package, which make test
// installs) checks the shipped rules and runs their unit tests, and every
// dualflow metric the rules use is one the product exports (a renamed
// metric would leave an alert that can never fire while its unit test,
// written with the same name, still passes).
func TestAlertRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("DUALFLOW_REQUIRE_CHDB") == "1" { // make test installs it
			t.Fatal("promtool not found: scripts/deps.sh installs Debian's prometheus package")
		}
		t.Skip("promtool not found (scripts/deps.sh installs it)")
	}
	for _, args := range [][]string{{"check", "rules", "dualflow-rules.yaml"}, {"test", "rules", "dualflow-rules.test.yaml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = rulesDir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	rules, err := os.ReadFile(filepath.Join(rulesDir, "dualflow-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var src strings.Builder
	err = filepath.WalkDir("../..", func(p string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && (d.Name() == ".cache" || d.Name() == ".git" || d.Name() == "test" || d.Name() == "node_modules"):
			return filepath.SkipDir
		case d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go"):
			return nil
		}
		b, err := os.ReadFile(p)
		src.Write(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	code := src.String()
	seen := map[string]bool{}
	for _, name := range regexp.MustCompile(`dualflow_[a-z0-9_]+`).FindAllString(string(rules), -1) {
		if seen[name] {
			continue
		}
		seen[name] = true
		// Flow metrics are named from their config: dualflow_flow_<name>_total.
		short := strings.TrimSuffix(strings.TrimPrefix(name, "dualflow_flow_"), "_total")
		if !strings.Contains(code, `"`+name+`"`) && !(strings.HasPrefix(name, "dualflow_flow_") && metricHelp[Metric(short)] != "") &&
			!strings.Contains(code, `"`+strings.TrimPrefix(name, "dualflow_store_")+`"`) {
			t.Errorf("the rules use %s, which no product code names", name)
		}
	}
	if len(seen) < 8 {
		t.Errorf("the rules use %d dualflow metrics: %v", len(seen), seen)
	}
}
