package api

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/migrations"
)

// groupsDB is the database of TestSummaryGroups, beside the seeded one.
const groupsDB = "groups_api"

// groupFlow is one flow of groupsDB to a destination namespace (""
// for an address outside the cluster) and port.
type groupFlow struct {
	fam   int
	ns    string
	port  uint16
	bytes uint64
}

// groupFlows: web in both families, db only in IPv6, cache only in IPv4,
// an outside address in both.
var groupFlows = []groupFlow{
	{4, "web", 443, 5000}, {6, "web", 443, 5000},
	{6, "db", 5432, 3000},
	{4, "cache", 6379, 1000},
	{4, "", 53, 500}, {6, "", 53, 500},
}

func seedGroups(t *testing.T) *store.Embedded {
	t.Helper()
	e := needEngine(t)
	ctx := context.Background()
	r, err := migrations.NewRunner(e, migrations.Options{Database: groupsDB})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Exec(ctx, "TRUNCATE TABLE "+groupsDB+".flows"); err != nil {
		t.Fatal(err)
	}
	var b []byte
	for i, g := range groupFlows {
		src, dst := netip.MustParseAddr("198.18.1.10"), netip.MustParseAddr(fmt.Sprintf("198.18.2.%d", 20+i))
		if g.fam == 6 {
			src, dst = netip.MustParseAddr("fd00:10:244:1::a"), netip.MustParseAddr(fmt.Sprintf("fd00:10:244:2::%x", 20+i))
		}
		end := seedNow.Add(-time.Duration(10+i) * time.Minute)
		rec := flow.Record{FlowStart: end.Add(-time.Second), FlowEnd: end, TimeReceived: end,
			SrcAddr: src, DstAddr: dst, SrcPort: uint16(41000 + i), DstPort: g.port, Proto: flow.ProtoTCP, ExporterNode: "node-a", Source: "conntrack",
			Src:    flow.Endpoint{PodNamespace: "client", PodName: "client-0", WorkloadKind: "Deployment", WorkloadName: "client", NodeName: "node-a"},
			Egress: flow.Policy{Rule: -1, Verdict: flow.VerdictNotIsolated}, Ingress: flow.Policy{Rule: -1, Verdict: flow.VerdictNotIsolated},
			PacketsDelta: 10, BytesDelta: g.bytes}
		if g.ns != "" {
			rec.Dst = flow.Endpoint{PodNamespace: g.ns, PodName: g.ns + "-0", WorkloadKind: "Deployment", WorkloadName: g.ns, NodeName: "node-b"}
		}
		rec.Normalize()
		b = store.AppendFlowRow(b, &rec)
	}
	if err := e.InsertRowBinary(ctx, groupsDB+".flows", store.FlowColumns, "", len(groupFlows), b); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestSummaryGroups: dimension=D&top=N sums each family's traffic per
// group of D in the store, the top N groups of the window by bytes and
// the rest as OtherGroup, in IPv4-only (ip_version=4), IPv6-only and dual
// data, from the projections' tiers (1m) and from rows (10s).
func TestSummaryGroups(t *testing.T) {
	h := testAPI(t, Config{Store: seedGroups(t), Database: groupsDB})
	for _, step := range []string{"1m", "10s"} {
		for _, tc := range []struct {
			name, q string
			want    map[string]uint64 // bytes per "group/family"
		}{
			{"dual namespace", "dimension=namespace&top=2", map[string]uint64{"web/4": 5000, "web/6": 5000, "db/6": 3000, OtherGroup + "/4": 1500, OtherGroup + "/6": 500}},
			{"IPv4 namespace", "dimension=namespace&top=2&ip_version=4", map[string]uint64{"web/4": 5000, "cache/4": 1000, OtherGroup + "/4": 500}},
			{"IPv6 namespace", "dimension=namespace&top=2&ip_version=6", map[string]uint64{"web/6": 5000, "db/6": 3000, OtherGroup + "/6": 500}},
			{"dual namespace all", "dimension=namespace&top=10", map[string]uint64{"web/4": 5000, "web/6": 5000, "db/6": 3000, "cache/4": 1000, NoNamespace + "/4": 500, NoNamespace + "/6": 500}},
			{"dual workload", "dimension=workload&top=1", map[string]uint64{"web/web/4": 5000, "web/web/6": 5000, OtherGroup + "/4": 1500, OtherGroup + "/6": 3500}},
			{"IPv6 workload", "dimension=workload&top=1&ip_version=6", map[string]uint64{"web/web/6": 5000, OtherGroup + "/6": 3500}},
			{"dual port", "dimension=port&top=2", map[string]uint64{"443/4": 5000, "443/6": 5000, "5432/6": 3000, OtherGroup + "/4": 1500, OtherGroup + "/6": 500}},
			{"IPv4 port", "dimension=port&top=3&ip_version=4", map[string]uint64{"443/4": 5000, "6379/4": 1000, "53/4": 500}},
			{"dual family", "dimension=family&top=1", map[string]uint64{OtherGroup + "/4": 6500, "IPv6/6": 8500}},
			{"dual family both", "dimension=family", map[string]uint64{"IPv4/4": 6500, "IPv6/6": 8500}},
			{"IPv6 family", "dimension=family&ip_version=6", map[string]uint64{"IPv6/6": 8500}},
		} {
			r := do(t, h, "GET", "/api/v1/flows/summary?since=1h&step="+step+"&"+tc.q, "")
			if r.code != 200 {
				t.Fatalf("%s step %s: %v", tc.name, step, r)
			}
			s := decode[Summary](t, r)
			got := map[string]uint64{}
			for _, g := range s.Groups {
				got[fmt.Sprintf("%s/%d", g.Group, g.IPVersion)] += g.Bytes
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Errorf("%s step %s: groups %v, want %v", tc.name, step, got, tc.want)
			}
			// The groups of a family are all of its traffic.
			for _, fam := range s.Families {
				var sum uint64
				for _, g := range s.Groups {
					if g.IPVersion == fam.IPVersion {
						sum += g.Bytes
					}
				}
				if sum != fam.Bytes {
					t.Errorf("%s step %s: IPv%d groups sum to %d bytes, the family has %d", tc.name, step, fam.IPVersion, sum, fam.Bytes)
				}
			}
			if s.Dimension == "" {
				t.Errorf("%s: no dimension in the answer", tc.name)
			}
		}
	}
	s := decode[Summary](t, do(t, h, "GET", "/api/v1/flows/summary?since=1h", ""))
	if s.Groups != nil || s.Dimension != "" {
		t.Errorf("groups not asked for: %q %+v", s.Dimension, s.Groups)
	}
	if r := do(t, h, "GET", "/api/v1/flows/summary?dimension=pod", ""); r.code != 400 || !strings.Contains(r.body, "dimension") {
		t.Errorf("dimension=pod: %v, want 400 naming dimension", r)
	}
}
