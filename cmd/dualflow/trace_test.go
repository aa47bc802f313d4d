package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/dualflow/dualflow/traceflow"
)

var update = flag.Bool("update", false, "rewrite the testdata/*.golden files from the command's output")

func TestParseProtocol(t *testing.T) {
	for in, want := range map[string]traceflow.Protocol{
		"tcp": traceflow.TCP, "UDP": traceflow.UDP, "icmp": traceflow.ICMP,
		"icmpv6": traceflow.ICMPv6, "ICMPv6": traceflow.ICMPv6, "sctp": "sctp",
	} {
		if got := parseProtocol(in); got != want {
			t.Errorf("parseProtocol(%q) = %q, want %q", in, got, want)
		}
	}
}

// loadTrace reads a result fixture of testdata.
func loadTrace(t *testing.T, name string) traceflow.Result {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var r traceflow.Result
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return r
}

// TestPrintTrace: a dual trace with long names, IPv4 dropped and IPv6
// delivered, prints within 100 columns, keeps every field (wrapped, not
// cut), ends with the families that did not arrive, and says nothing of
// success; missingFamilies names IPv4. The golden file shows the layout
// (-update rewrites it).
func TestPrintTrace(t *testing.T) {
	r := loadTrace(t, "trace-dropped.json")
	var buf bytes.Buffer
	printTrace(&buf, r)
	out := buf.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for i, l := range lines {
		if n := utf8.RuneCountInString(l); n > traceWidth {
			t.Errorf("line %d is %d columns wide: %q", i+1, n, l)
		}
	}
	// Every word of the long fields is printed (wrapping joins them back
	// with single spaces).
	flat := strings.Join(strings.Fields(out), " ")
	v4 := r.Families[0]
	for _, want := range []string{v4.Reason, v4.Observations[2].Detail, v4.Observations[2].Policy, v4.Observations[2].Rule,
		r.Request.Source, r.Families[1].Observations[3].Pod, "198.18.1.23:40123 -> 198.18.100.17:8080",
		"[fd00:10:0:1::23]:40123 -> [fd00:10:0:100::17]:8080", "=> DROPPED after 12ms", "=> DELIVERED after 3ms"} {
		if !strings.Contains(flat, strings.Join(strings.Fields(want), " ")) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if last := lines[len(lines)-1]; last != "did not arrive: IPv4 dropped (exit status 1)" {
		t.Errorf("last line %q", last)
	}
	if strings.Contains(strings.ToLower(out), "succeeded") {
		t.Errorf("output says succeeded:\n%s", out)
	}
	err := missingFamilies(r)
	if !errors.Is(err, errFamilyMissing) || !strings.Contains(err.Error(), "IPv4 dropped") || strings.Contains(err.Error(), "IPv6") {
		t.Errorf("missingFamilies = %v", err)
	}

	golden := filepath.Join("testdata", "trace-dropped.golden")
	if *update {
		if err := os.WriteFile(golden, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Errorf("output differs from %s (-update rewrites it):\n%s", golden, out)
	}
}

// TestMissingFamilies: exit status 0 only when every requested family
// arrived; a family without an address, or no family at all, is 1.
func TestMissingFamilies(t *testing.T) {
	fam := func(f traceflow.Family, o traceflow.Outcome) traceflow.FamilyResult {
		return traceflow.FamilyResult{Family: f, Outcome: o}
	}
	for _, tc := range []struct {
		name string
		frs  []traceflow.FamilyResult
		ok   bool
	}{
		{"dual delivered", []traceflow.FamilyResult{fam(traceflow.IPv4, traceflow.Delivered), fam(traceflow.IPv6, traceflow.Delivered)}, true},
		{"ipv6 only delivered", []traceflow.FamilyResult{fam(traceflow.IPv6, traceflow.Delivered)}, true},
		{"ipv4 only timeout", []traceflow.FamilyResult{fam(traceflow.IPv4, traceflow.TimedOut)}, false},
		{"ipv6 no address", []traceflow.FamilyResult{fam(traceflow.IPv4, traceflow.Delivered), fam(traceflow.IPv6, traceflow.NoAddress)}, false},
		{"none", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := missingFamilies(traceflow.Result{Families: tc.frs})
			if (err == nil) != tc.ok {
				t.Errorf("missingFamilies = %v, want ok %v", err, tc.ok)
			}
		})
	}
}
