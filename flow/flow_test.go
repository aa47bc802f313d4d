package flow

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	tests := []struct {
		addr string
		want uint8
	}{
		{"198.18.0.1", 4},
		{"::ffff:198.18.0.1", 4},
		{"fd00:10::1", 6},
		{"::", 6},
		{"fd00:10::1%eth0", 6},
	}
	for _, tt := range tests {
		if got := Version(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("Version(%s) = %d, want %d", tt.addr, got, tt.want)
		}
	}
	if Version(netip.Addr{}) != 0 {
		t.Error("Version(zero) != 0")
	}
}

func TestNormalizeUnmaps(t *testing.T) {
	r := Record{
		SrcAddr:      netip.MustParseAddr("::ffff:198.18.1.10"),
		DstAddr:      netip.MustParseAddr("::ffff:198.18.2.20"),
		ServiceAddr:  netip.MustParseAddr("::ffff:198.19.0.10"),
		SNATAddr:     netip.MustParseAddr("::ffff:198.18.0.1"),
		ExporterAddr: netip.MustParseAddr("::ffff:127.0.0.1"),
	}
	r.Normalize()
	for name, a := range map[string]netip.Addr{"src": r.SrcAddr, "dst": r.DstAddr, "service": r.ServiceAddr, "snat": r.SNATAddr, "exporter": r.ExporterAddr} {
		if !a.Is4() {
			t.Errorf("%s %v not unmapped", name, a)
		}
	}
	if r.IPVersion != 4 {
		t.Errorf("IPVersion = %d, want 4", r.IPVersion)
	}
	r6 := Record{SrcAddr: netip.MustParseAddr("fd00:10:1::a"), DstAddr: netip.MustParseAddr("fd00:10:2::14")}
	r6.Normalize()
	if r6.IPVersion != 6 || !r6.SrcAddr.Is6() {
		t.Errorf("IPv6 record normalized to %+v", r6)
	}
}

func TestTupleReverse(t *testing.T) {
	for _, tu := range []Tuple{
		{Src: netip.MustParseAddr("198.18.1.10"), Dst: netip.MustParseAddr("198.18.2.20"), Proto: ProtoTCP, SrcPort: 40000, DstPort: 8080},
		{Src: netip.MustParseAddr("fd00:10:1::a"), Dst: netip.MustParseAddr("fd00:10:2::14"), Proto: ProtoUDP, SrcPort: 40000, DstPort: 53},
	} {
		r := tu.Reverse()
		if r.Src != tu.Dst || r.DstPort != tu.SrcPort || r.Reverse() != tu {
			t.Errorf("Reverse(%v) = %v", tu, r)
		}
		if tu.IPVersion() != Version(tu.Src) {
			t.Errorf("IPVersion mismatch for %v", tu)
		}
	}
}

func TestVerdictMismatch(t *testing.T) {
	tests := []struct {
		evaluated, reported Verdict
		want                bool
	}{
		{VerdictAllowed, VerdictDenied, true},
		{VerdictDenied, VerdictRejected, false},
		{VerdictNotIsolated, VerdictAllowed, false},
		{VerdictDenied, VerdictUnknown, false},
		{VerdictUnknown, VerdictDenied, false},
	}
	for _, tt := range tests {
		r := Record{Ingress: Policy{Verdict: tt.evaluated, ReportedVerdict: tt.reported}}
		if got := r.VerdictMismatch(); got != tt.want {
			t.Errorf("ingress evaluated %v reported %v: mismatch %v, want %v", tt.evaluated, tt.reported, got, tt.want)
		}
		r = Record{Egress: Policy{Verdict: tt.evaluated, ReportedVerdict: tt.reported}}
		if got := r.VerdictMismatch(); got != tt.want {
			t.Errorf("egress evaluated %v reported %v: mismatch %v, want %v", tt.evaluated, tt.reported, got, tt.want)
		}
	}
}

func TestEnumNames(t *testing.T) {
	if EndReasonLackOfResources.String() != "lack_of_resources" || EndReason(99).String() != "unknown" {
		t.Error("EndReason names")
	}
	if FlowTypeFromExternal.String() != "from_external" || VerdictRejected.String() != "rejected" || CorrelationDestOnly.String() != "destination_only" {
		t.Error("enum names must match the ClickHouse Enum8 values in migrations/0001_flows.sql")
	}
}

// TestEnumsMatchSchema checks that every enum's names and values are the
// Enum8 definitions of the ClickHouse schema, so a value never lands as the
// wrong word in SQL.
func TestEnumsMatchSchema(t *testing.T) {
	sql, err := os.ReadFile("../migrations/0001_flows.sql")
	if err != nil {
		t.Fatal(err)
	}
	enum := func(col string) string {
		m := regexp.MustCompile(`(?m)^\s*` + col + `\s+Enum8\(([^)]*)\)`).FindSubmatch(sql)
		if m == nil {
			t.Fatalf("column %s not found", col)
		}
		return string(m[1])
	}
	render := func(n int, name func(int) string) string {
		var parts []string
		for i := 0; i < n; i++ {
			parts = append(parts, fmt.Sprintf("'%s' = %d", name(i), i))
		}
		return strings.Join(parts, ", ")
	}
	tests := []struct{ col, want string }{
		{"end_reason", render(6, func(i int) string { return EndReason(i).String() })},
		{"flow_type", render(5, func(i int) string { return FlowType(i).String() })},
		{"correlation", render(4, func(i int) string { return Correlation(i).String() })},
		{"ingress_verdict", render(5, func(i int) string { return Verdict(i).String() })},
		{"egress_reported_verdict", render(5, func(i int) string { return Verdict(i).String() })},
	}
	for _, tt := range tests {
		if got := enum(tt.col); got != tt.want {
			t.Errorf("%s: schema Enum8(%s), Go names %s", tt.col, got, tt.want)
		}
	}
}

// TestParseFamily: one spelling of families for every flag, query
// parameter and request.
func TestParseFamily(t *testing.T) {
	for in, want := range map[string]uint8{"": 0, "0": 0, "dual": 0, "Dual": 0, " 4 ": 4, "4": 4, "ipv4": 4, "IPv4": 4, "v4": 4, "6": 6, "ipv6": 6, "IPV6": 6, "v6": 6} {
		if got, err := ParseFamily(in); err != nil || got != want {
			t.Errorf("ParseFamily(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"5", "ipv5", "inet", "46", "4,6"} {
		if _, err := ParseFamily(in); err == nil || !strings.Contains(err.Error(), in) {
			t.Errorf("ParseFamily(%q): %v, want an error naming it", in, err)
		}
	}
}
