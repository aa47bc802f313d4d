package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/lab/labcmd"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/web/api"
)

// auditOut runs dualflow audit args and returns what it printed.
func auditOut(t *testing.T, args ...string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "stdout")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	stdout := os.Stdout
	os.Stdout = f
	err = runAudit(context.Background(), args)
	os.Stdout = stdout
	if err != nil {
		t.Fatalf("dualflow audit %v: %v", args, err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// noStore is a flow store with no flows to read.
type noStore struct{}

func (noStore) Query(context.Context, string, string) ([]byte, error) {
	return nil, errors.New("no flow store in this test")
}

// TestAuditLocalAndServer: dualflow audit asks the same questions of
// manifest files (--inventory), of a collector (--server) and, with
// neither, of the demo running on the lab of --state-dir, through one
// interface, and gets the same answers, in every IP mode.
func TestAuditLocalAndServer(t *testing.T) {
	t.Setenv(envToken, "")
	for _, mode := range []manifest.Mode{manifest.ModeIPv4, manifest.ModeIPv6, manifest.ModeDual} {
		t.Run(string(mode), func(t *testing.T) {
			m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: 2})
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(t.TempDir(), "manifest.yaml")
			f, err := os.Create(file)
			if err != nil {
				t.Fatal(err)
			}
			if err := m.Encode(f); err != nil {
				t.Fatal(err)
			}
			f.Close()
			inv, err := enrich.LoadSnapshot(file)
			if err != nil {
				t.Fatal(err)
			}
			a, err := api.New(api.Config{Store: noStore{}, Anonymous: api.RoleViewer, Logger: slog.New(slog.DiscardHandler),
				Audit: &audit.Queries{Cluster: func() (*enrich.Snapshot, error) { return inv, nil }}})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(a.Handler())
			defer srv.Close()
			// A demo's state directory names its REST API (labcmd's
			// web-url file, which labcmd.DemoWebURL reads).
			demoDir := t.TempDir()
			if err := os.WriteFile(filepath.Join(demoDir, "web-url"), []byte(srv.URL+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			if u, err := labcmd.DemoWebURL(demoDir); err != nil || u != srv.URL {
				t.Fatalf("DemoWebURL = %q, %v", u, err)
			}
			from, to := m.Pods[0], m.Pods[len(m.Pods)-1]
			for _, args := range [][]string{
				{"findings", "--json"},
				{"findings", "--json", "--dual-stack"},
				{"unprotected", "--json"},
				{"eval", "--json", "--from", from.Namespace + "/" + from.Name, "--to", to.Namespace + "/" + to.Name, "--port", "8080"},
			} {
				local := auditOut(t, append(args, "--inventory", file)...)
				remote := auditOut(t, append(args, "--server", srv.URL)...)
				if local != remote {
					t.Errorf("%v: --inventory printed\n%s\n--server printed\n%s", args, local, remote)
				}
				if demo := auditOut(t, append(args, "--state-dir", demoDir)...); demo != local {
					t.Errorf("%v: --inventory printed\n%s\nthe demo's API printed\n%s", args, local, demo)
				}
				var v any
				if err := json.Unmarshal([]byte(local), &v); err != nil || local == "null\n" {
					t.Errorf("%v: %v: %q", args, err, local)
				}
			}
		})
	}
}

// TestAuditWithoutDemo: without --server, --inventory or a demo, a
// subcommand that needs manifests says what to give it.
func TestAuditWithoutDemo(t *testing.T) {
	dir := t.TempDir()
	err := runAudit(context.Background(), []string{"findings", "--state-dir", dir})
	if err == nil || !strings.Contains(err.Error(), "--inventory is required when neither --server is given nor a demo runs on the lab of "+dir) {
		t.Errorf("err = %v", err)
	}
}

// TestPrintDenied: the rule shows only when one decided, the reported
// verdict only when an exporter reported one, and an end without a
// workload is blank rather than "/".
func TestPrintDenied(t *testing.T) {
	last := time.Date(2026, 12, 5, 5, 0, 0, 0, time.UTC)
	gs := []audit.DeniedGroup{
		{Direction: "ingress", PolicyNamespace: "backend", PolicyName: "deny-all", Rule: -1, Verdict: "denied", ReportedVerdict: "unknown",
			SrcNamespace: "frontend", SrcWorkload: "web", DstNamespace: "backend", DstWorkload: "api", IPVersion: 4, Records: 7, Last: last},
		{Direction: "egress", PolicyNamespace: "frontend", PolicyName: "allow-api", Rule: 2, Verdict: "allowed", ReportedVerdict: "denied",
			SrcNamespace: "frontend", SrcWorkload: "web", IPVersion: 6, Records: 3, Last: last},
	}
	var buf bytes.Buffer
	if err := printDenied(&buf, gs); err != nil {
		t.Fatal(err)
	}
	var rows [][]string
	for l := range strings.Lines(buf.String()) {
		rows = append(rows, strings.Fields(l))
	}
	want := [][]string{
		{"DIRECTION", "POLICY", "RULE", "VERDICT", "REPORTED", "SOURCE", "DESTINATION", "FAMILY", "RECORDS", "LAST"},
		{"ingress", "backend/deny-all", "denied", "frontend/web", "backend/api", "IPv4", "7", "2026-12-05T05:00:00Z"},
		{"egress", "frontend/allow-api", "2", "allowed", "denied", "frontend/web", "IPv6", "3", "2026-12-05T05:00:00Z"},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("printed\n%s\nwant the fields %q", buf.String(), want)
	}
	// The blank cells are blank columns, not missing ones: "denied" of
	// the first row stands under VERDICT.
	lines := strings.Split(buf.String(), "\n")
	if strings.Index(lines[1], "denied") != strings.Index(lines[0], "VERDICT") {
		t.Errorf("columns shifted:\n%s", buf.String())
	}
}
