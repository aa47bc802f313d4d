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

// groupFlow is one flow of groupsDB from a source namespace to a
// destination namespace ("" for an address outside the cluster) and port;
// each namespace's pod is of the workload of its name.
type groupFlow struct {
	fam     int
	src, ns string
	port    uint16
	bytes   uint64
}

// groupFlows: client → web in both families, web → db only in IPv6, web →
// cache only in IPv4, web → an outside address in both, an outside
// address → web in IPv4.
var groupFlows = []groupFlow{
	{4, "client", "web", 443, 5000}, {6, "client", "web", 443, 5000},
	{6, "web", "db", 5432, 3000},
	{4, "web", "cache", 6379, 1000},
	{4, "web", "", 53, 500}, {6, "web", "", 53, 500},
	{4, "", "web", 443, 200},
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
		src, dst := netip.MustParseAddr(fmt.Sprintf("198.18.1.%d", 20+i)), netip.MustParseAddr(fmt.Sprintf("198.18.2.%d", 20+i))
		if g.fam == 6 {
			src, dst = netip.MustParseAddr(fmt.Sprintf("fd00:10:244:1::%x", 20+i)), netip.MustParseAddr(fmt.Sprintf("fd00:10:244:2::%x", 20+i))
		}
		end := seedNow.Add(-time.Duration(10+i) * time.Minute)
		rec := flow.Record{FlowStart: end.Add(-time.Second), FlowEnd: end, TimeReceived: end,
			SrcAddr: src, DstAddr: dst, SrcPort: uint16(41000 + i), DstPort: g.port, Proto: flow.ProtoTCP, ExporterNode: "node-a", Source: "conntrack",
			Egress: flow.Policy{Rule: -1, Verdict: flow.VerdictNotIsolated}, Ingress: flow.Policy{Rule: -1, Verdict: flow.VerdictNotIsolated},
			PacketsDelta: 10, BytesDelta: g.bytes}
		if g.src != "" {
			rec.Src = flow.Endpoint{PodNamespace: g.src, PodName: g.src + "-0", WorkloadKind: "Deployment", WorkloadName: g.src, NodeName: "node-a"}
		}
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
			{"dual namespace", "dimension=namespace&top=2", map[string]uint64{"web/4": 5200, "web/6": 5000, "db/6": 3000, OtherGroup + "/4": 1500, OtherGroup + "/6": 500}},
			{"IPv4 namespace", "dimension=namespace&top=2&ip_version=4", map[string]uint64{"web/4": 5200, "cache/4": 1000, OtherGroup + "/4": 500}},
			{"IPv6 namespace", "dimension=namespace&top=2&ip_version=6", map[string]uint64{"web/6": 5000, "db/6": 3000, OtherGroup + "/6": 500}},
			{"dual namespace all", "dimension=namespace&top=10&side=dst", map[string]uint64{"web/4": 5200, "web/6": 5000, "db/6": 3000, "cache/4": 1000, NoNamespace + "/4": 500, NoNamespace + "/6": 500}},
			{"dual workload", "dimension=workload&top=1", map[string]uint64{"web/web/4": 5200, "web/web/6": 5000, OtherGroup + "/4": 1500, OtherGroup + "/6": 3500}},
			{"IPv6 workload", "dimension=workload&top=1&ip_version=6", map[string]uint64{"web/web/6": 5000, OtherGroup + "/6": 3500}},
			{"dual port", "dimension=port&top=2", map[string]uint64{"443/4": 5200, "443/6": 5000, "5432/6": 3000, OtherGroup + "/4": 1500, OtherGroup + "/6": 500}},
			{"IPv4 port", "dimension=port&top=3&ip_version=4", map[string]uint64{"443/4": 5200, "6379/4": 1000, "53/4": 500}},
			{"dual family", "dimension=family&top=1", map[string]uint64{OtherGroup + "/4": 6700, "IPv6/6": 8500}},
			{"dual family both", "dimension=family", map[string]uint64{"IPv4/4": 6700, "IPv6/6": 8500}},
			{"IPv6 family", "dimension=family&ip_version=6", map[string]uint64{"IPv6/6": 8500}},
			// side=src: where the flows come from.
			{"dual source namespace", "dimension=namespace&side=src&top=2", map[string]uint64{"client/4": 5000, "client/6": 5000, "web/4": 1500, "web/6": 3500, OtherGroup + "/4": 200}},
			{"IPv4 source namespace", "dimension=namespace&side=src&ip_version=4", map[string]uint64{"client/4": 5000, "web/4": 1500, NoNamespace + "/4": 200}},
			{"IPv6 source namespace", "dimension=namespace&side=src&ip_version=6", map[string]uint64{"client/6": 5000, "web/6": 3500}},
			{"dual source workload", "dimension=workload&side=src&top=1", map[string]uint64{"client/client/4": 5000, "client/client/6": 5000, OtherGroup + "/4": 1700, OtherGroup + "/6": 3500}},
			{"IPv6 source workload", "dimension=workload&side=src&top=1&ip_version=6", map[string]uint64{"client/client/6": 5000, OtherGroup + "/6": 3500}},
			{"dual source family", "dimension=family&side=src", map[string]uint64{"IPv4/4": 6700, "IPv6/6": 8500}},
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
	if s.Groups != nil || s.Dimension != "" || s.Side != "" || s.Pairs != nil || s.PairsDimension != "" {
		t.Errorf("groups not asked for: %q %q %+v, pairs %q %+v", s.Dimension, s.Side, s.Groups, s.PairsDimension, s.Pairs)
	}
	if s := decode[Summary](t, do(t, h, "GET", "/api/v1/flows/summary?since=1h&dimension=workload", "")); s.Side != "dst" {
		t.Errorf("side %q, want dst by default", s.Side)
	}
	for _, tc := range []struct{ q, field, says string }{
		{"dimension=pod", "dimension", "want namespace"},
		{"dimension=namespace&side=both", "side", "want src or dst"},
		{"dimension=port&side=src", "side", "no src side"},
		{"side=src", "side", "dimension="},
		{"pairs=port", "pairs", "want namespace or workload"},
		{"pairs=family", "pairs", "want namespace or workload"},
	} {
		if r := do(t, h, "GET", "/api/v1/flows/summary?"+tc.q, ""); r.code != 400 || !strings.Contains(r.body, `"field":"`+tc.field+`"`) || !strings.Contains(r.body, tc.says) {
			t.Errorf("%s: %v, want 400 on %s saying %q", tc.q, r, tc.field, tc.says)
		}
	}
}

// TestSummaryPairs: pairs=D&top=N sums each family's traffic from each
// source group of D to each destination group of D over the window in
// the store (a Sankey's links), the top N groups of each side by bytes
// and the rest of that side as OtherGroup, in IPv4-only, IPv6-only and
// dual data; the pairs of a family are all of its traffic.
func TestSummaryPairs(t *testing.T) {
	h := testAPI(t, Config{Store: seedGroups(t), Database: groupsDB})
	o := OtherGroup
	for _, tc := range []struct {
		name, q string
		want    map[string]uint64 // bytes per "src>dst/family"
	}{
		{"dual namespace", "pairs=namespace", map[string]uint64{"client>web/4": 5000, "client>web/6": 5000, "web>db/6": 3000, "web>cache/4": 1000,
			"web>" + NoNamespace + "/4": 500, "web>" + NoNamespace + "/6": 500, NoNamespace + ">web/4": 200}},
		{"dual namespace top 1", "pairs=namespace&top=1", map[string]uint64{"client>web/4": 5000, "client>web/6": 5000, o + ">" + o + "/4": 1500, o + ">" + o + "/6": 3500, o + ">web/4": 200}},
		{"IPv4 namespace", "pairs=namespace&ip_version=4", map[string]uint64{"client>web/4": 5000, "web>cache/4": 1000, "web>" + NoNamespace + "/4": 500, NoNamespace + ">web/4": 200}},
		{"IPv6 namespace", "pairs=namespace&ip_version=6", map[string]uint64{"client>web/6": 5000, "web>db/6": 3000, "web>" + NoNamespace + "/6": 500}},
		{"IPv6 namespace top 1", "pairs=namespace&top=1&ip_version=6", map[string]uint64{"client>web/6": 5000, o + ">" + o + "/6": 3500}},
		{"dual workload top 2", "pairs=workload&top=2&dimension=namespace", map[string]uint64{"client/client>web/web/4": 5000, "client/client>web/web/6": 5000, "web/web>db/db/6": 3000,
			"web/web>" + o + "/4": 1500, "web/web>" + o + "/6": 500, o + ">web/web/4": 200}},
		{"IPv4 workload top 1", "pairs=workload&top=1&ip_version=4", map[string]uint64{"client/client>web/web/4": 5000, o + ">web/web/4": 200, o + ">" + o + "/4": 1500}},
	} {
		r := do(t, h, "GET", "/api/v1/flows/summary?since=1h&"+tc.q, "")
		if r.code != 200 {
			t.Fatalf("%s: %v", tc.name, r)
		}
		s := decode[Summary](t, r)
		got := map[string]uint64{}
		for _, p := range s.Pairs {
			got[fmt.Sprintf("%s>%s/%d", p.Src, p.Dst, p.IPVersion)] += p.Bytes
		}
		if fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("%s: pairs %v, want %v", tc.name, got, tc.want)
		}
		if s.PairsDimension == "" || len(got) != len(s.Pairs) {
			t.Errorf("%s: dimension %q, %d pairs for %d keys", tc.name, s.PairsDimension, len(s.Pairs), len(got))
		}
		for i := 1; i < len(s.Pairs); i++ {
			if s.Pairs[i].Bytes > s.Pairs[i-1].Bytes {
				t.Errorf("%s: pairs not biggest first: %+v", tc.name, s.Pairs)
			}
		}
		for _, fam := range s.Families {
			var b, n uint64
			for _, p := range s.Pairs {
				if p.IPVersion == fam.IPVersion {
					b, n = b+p.Bytes, n+p.Flows
				}
			}
			if b != fam.Bytes || n != fam.Flows {
				t.Errorf("%s: IPv%d pairs sum to %d bytes %d flows, the family has %d, %d", tc.name, fam.IPVersion, b, n, fam.Bytes, fam.Flows)
			}
		}
	}
}
