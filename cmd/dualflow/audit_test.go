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
	"unicode/utf8"

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
			m, file, inv := labManifest(t, mode)
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
// verdict only when an exporter reported one, an end without a workload
// is blank rather than "/", the port is a port for TCP, UDP and SCTP and
// TYPE.CODE for ICMP and ICMPv6, and PROTO and PORT are blank for the
// flows summed before the rollup kept them (migration 0013), in both
// families.
func TestPrintDenied(t *testing.T) {
	last := time.Date(2026, 12, 5, 5, 0, 0, 0, time.UTC)
	gs := []audit.DeniedGroup{
		{Direction: "ingress", PolicyNamespace: "backend", PolicyName: "deny-all", Rule: -1, Verdict: "denied", ReportedVerdict: "unknown",
			SrcNamespace: "frontend", SrcWorkload: "web", DstNamespace: "backend", DstWorkload: "api", IPVersion: 4, Protocol: "TCP", DstPort: 5432, Records: 7, Last: last},
		{Direction: "egress", PolicyNamespace: "frontend", PolicyName: "allow-api", Rule: 2, Verdict: "allowed", ReportedVerdict: "denied",
			SrcNamespace: "frontend", SrcWorkload: "web", IPVersion: 6, Records: 3, Last: last},
		{Direction: "ingress", PolicyNamespace: "backend", PolicyName: "deny-all", Rule: -1, Verdict: "denied", ReportedVerdict: "unknown",
			SrcNamespace: "frontend", SrcWorkload: "web", DstNamespace: "backend", DstWorkload: "api", IPVersion: 6, Protocol: "ICMPv6", DstPort: 128 << 8, Records: 2, Last: last},
		{Direction: "ingress", PolicyNamespace: "backend", PolicyName: "deny-all", Rule: -1, Verdict: "denied", ReportedVerdict: "unknown",
			SrcNamespace: "frontend", SrcWorkload: "web", DstNamespace: "backend", DstWorkload: "api", IPVersion: 4, Protocol: "UDP", DstPort: 53, Records: 1, Last: last},
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
		{"DIRECTION", "POLICY", "RULE", "VERDICT", "REPORTED", "SOURCE", "DESTINATION", "FAMILY", "PROTO", "PORT", "RECORDS", "LAST"},
		{"ingress", "backend/deny-all", "denied", "frontend/web", "backend/api", "IPv4", "TCP", "5432", "7", "2026-12-05T05:00:00Z"},
		{"egress", "frontend/allow-api", "2", "allowed", "denied", "frontend/web", "IPv6", "3", "2026-12-05T05:00:00Z"},
		{"ingress", "backend/deny-all", "denied", "frontend/web", "backend/api", "IPv6", "ICMPv6", "128.0", "2", "2026-12-05T05:00:00Z"},
		{"ingress", "backend/deny-all", "denied", "frontend/web", "backend/api", "IPv4", "UDP", "53", "1", "2026-12-05T05:00:00Z"},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("printed\n%s\nwant the fields %q", buf.String(), want)
	}
	// The blank cells are blank columns, not missing ones: "denied" of
	// the first row stands under VERDICT, the old group's count under
	// RECORDS, the ports under PORT.
	lines := strings.Split(buf.String(), "\n")
	for _, c := range []struct {
		line       int
		cell, head string
	}{{1, "denied", "VERDICT"}, {2, "3", "RECORDS"}, {1, "5432", "PORT"}, {3, "128.0", "PORT"}, {3, "ICMPv6", "PROTO"}} {
		if strings.Index(lines[c.line], " "+c.cell+" ") != strings.Index(lines[0], " "+c.head+" ") {
			t.Errorf("%q of line %d not under %s:\n%s", c.cell, c.line, c.head, buf.String())
		}
	}
}

// TestPrintFindings: each finding prints its severity in the SEVERITY
// column, its kind with the count and its unit (the count alone without a
// unit, nothing without a count; a unit of one is singular), its message below, and its fix on an
// indented line after it, no line wider than 100 columns (as dualflow
// trace's), long messages and fixes wrapped under their own start.
func TestPrintFindings(t *testing.T) {
	fs := []audit.Finding{
		{Kind: audit.KindObservedVerdictGap, Count: 12, Message: "Flows Deployment frontend/web → Deployment backend/api on 9090/TCP were allowed over IPv4 (7 records) but denied over IPv6 (5 records) between 2026-12-05T07:00:00Z and 2026-12-05T08:00:00Z."},
		{Kind: audit.KindInvalidPolicy, Message: "NetworkPolicy backend/broken is invalid: spec.ingress[0].from[0].ipBlock.cidr: Invalid value: \"fd00:10::/129\"."},
		{Kind: audit.KindUnprotectedEgress, Count: 1, Message: "Pod tools/probe-1 has no egress policy."},
	}
	audit.Describe(fs)
	fs = append(fs, audit.Finding{Kind: "some-future-kind", Count: 3, Severity: audit.SeverityLow, Message: "A finding without unit or fix."})
	var buf bytes.Buffer
	printFindings(&buf, fs)
	out := buf.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for _, l := range lines {
		if n := utf8.RuneCountInString(l); n > traceWidth {
			t.Errorf("line of %d columns, over %d: %q", n, traceWidth, l)
		}
	}
	if lines[0] != "SEVERITY  FINDING" {
		t.Errorf("header %q", lines[0])
	}
	// Each finding: its head line at column 0, then lines indented under
	// FINDING (the message), the fix's first line starting "  fix: " there.
	type block struct {
		head     string
		body     []string
		fixStart int // index in body of the fix's first line, -1 without
	}
	var blocks []block
	for _, l := range lines[1:] {
		if !strings.HasPrefix(l, " ") {
			blocks = append(blocks, block{head: l, fixStart: -1})
			continue
		}
		b := &blocks[len(blocks)-1]
		if !strings.HasPrefix(l, findingIndent) {
			t.Errorf("line not under FINDING: %q", l)
		}
		if strings.HasPrefix(l, findingIndent+"  fix: ") {
			b.fixStart = len(b.body)
		}
		b.body = append(b.body, l)
	}
	if len(blocks) != len(fs) {
		t.Fatalf("%d findings printed, want %d:\n%s", len(blocks), len(fs), out)
	}
	for i, want := range []struct{ head, fix string }{
		{"high      dual-stack-observed-verdict-gap, 12 flow records", fs[0].Fix},
		{"high      invalid-policy", fs[1].Fix},
		{"low       unprotected-egress, 1 pod", fs[2].Fix},
		{"low       some-future-kind, 3", ""},
	} {
		b := blocks[i]
		if b.head != want.head {
			t.Errorf("finding %d: head %q, want %q", i, b.head, want.head)
		}
		msgEnd := len(b.body)
		if b.fixStart >= 0 {
			msgEnd = b.fixStart
		}
		if got := strings.Join(strings.Fields(strings.Join(b.body[:msgEnd], " ")), " "); got != fs[i].Message {
			t.Errorf("finding %d: message %q, want %q", i, got, fs[i].Message)
		}
		var fix string
		if b.fixStart >= 0 {
			for j, l := range b.body[b.fixStart:] {
				if j > 0 && !strings.HasPrefix(l, findingIndent+"       ") {
					t.Errorf("finding %d: fix line not under the fix's start: %q", i, l)
				}
			}
			fix = strings.TrimPrefix(strings.Join(strings.Fields(strings.Join(b.body[b.fixStart:], " ")), " "), "fix: ")
		}
		if fix != want.fix || (want.fix == "") != (i == 3) {
			t.Errorf("finding %d: fix %q, want %q", i, fix, want.fix)
		}
	}
	if len(blocks[0].body) < 3 {
		t.Errorf("the long message and fix were not wrapped:\n%s", out)
	}
	buf.Reset()
	printFindings(&buf, nil)
	if buf.String() != "no findings\n" {
		t.Errorf("no findings: %q", buf.String())
	}
}

// labManifest generates the two-node lab of mode, writes it to a file
// (what --inventory reads) and loads it as the cluster view.
func labManifest(t *testing.T, mode manifest.Mode) (*manifest.Manifest, string, *enrich.Snapshot) {
	t.Helper()
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
	return m, file, inv
}
