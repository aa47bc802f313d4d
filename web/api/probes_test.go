package api

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/migrations"
)

// probeDB is the database of TestProbesHiddenByDefault, beside the
// seeded one in the same engine.
const probeDB = "probes_api"

// probeTrace is the trace whose probes are stored.
const probeTrace = "tf-00c0ffee00c0ffee"

// seedProbes stores in probeDB, per family, an ordinary allowed flow
// frontend -> cart and the dropped probe of a trace frontend -> db (what
// a click on a reachability cell leaves behind).
func seedProbes(t *testing.T) *store.Embedded {
	t.Helper()
	e := needEngine(t)
	ctx := context.Background()
	r, err := migrations.NewRunner(e, migrations.Options{Database: probeDB})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Exec(ctx, "TRUNCATE TABLE "+probeDB+".flows"); err != nil {
		t.Fatal(err)
	}
	var recs []flow.Record
	for i, fam := range []struct{ src, cart, db string }{
		{"198.18.1.10", "198.18.2.20", "198.18.2.30"},
		{"fd00:10:244:1::a", "fd00:10:244:2::14", "fd00:10:244:2::1e"},
	} {
		end := seedNow.Add(-time.Duration(10+i) * time.Minute)
		base := flow.Record{FlowStart: end.Add(-time.Second), FlowEnd: end, TimeReceived: end,
			SrcAddr: netip.MustParseAddr(fam.src), Proto: flow.ProtoTCP, ExporterNode: "node-a", Source: "conntrack",
			Src:    flow.Endpoint{PodNamespace: "shop", PodName: "frontend-0", WorkloadKind: "Deployment", WorkloadName: "frontend", NodeName: "node-a"},
			Egress: flow.Policy{Rule: -1, Verdict: flow.VerdictNotIsolated}}
		ordinary := base
		ordinary.SrcPort, ordinary.DstAddr, ordinary.DstPort = 41000, netip.MustParseAddr(fam.cart), 8080
		ordinary.Dst = flow.Endpoint{PodNamespace: "shop", PodName: "cart-0", WorkloadKind: "Deployment", WorkloadName: "cart", NodeName: "node-b"}
		ordinary.Ingress = flow.Policy{Namespace: "shop", Name: "cart-policy", Rule: 0, Verdict: flow.VerdictAllowed}
		ordinary.PacketsDelta, ordinary.BytesDelta = 10, 1000
		probe := base
		probe.SrcPort, probe.DstAddr, probe.DstPort = 52000, netip.MustParseAddr(fam.db), 5432
		probe.Dst = flow.Endpoint{PodNamespace: "shop", PodName: "db-0", WorkloadKind: "StatefulSet", WorkloadName: "db", NodeName: "node-b"}
		probe.Ingress = flow.Policy{Namespace: "shop", Name: "db-policy", Rule: -1, Verdict: flow.VerdictDenied}
		probe.PacketsDelta, probe.BytesDelta = 1, 60
		probe.ProbeTraceID = probeTrace
		ordinary.Normalize()
		probe.Normalize()
		recs = append(recs, ordinary, probe)
	}
	var b []byte
	for i := range recs {
		b = store.AppendFlowRow(b, &recs[i])
	}
	if err := e.InsertRowBinary(ctx, probeDB+".flows", store.FlowColumns, "", len(recs), b); err != nil {
		t.Fatal(err)
	}
	return e
}

// TestProbesHiddenByDefault: the rows of a traceflow probe (IPv4 and
// IPv6) are in no answer by default, neither the flows nor the charts nor
// the map; probes=include shows them beside the traffic, probes=only
// alone, probe_trace_id those of one trace, each with its trace id.
func TestProbesHiddenByDefault(t *testing.T) {
	e := seedProbes(t)
	h := testAPI(t, Config{Store: e, Database: probeDB})
	flows := func(q string) (probes, ordinary map[int]int) {
		t.Helper()
		r := do(t, h, "GET", "/api/v1/flows?limit=100&"+q, "")
		if r.code != 200 {
			t.Fatalf("flows?%s: %v", q, r)
		}
		probes, ordinary = map[int]int{}, map[int]int{}
		for _, f := range decode[FlowPage](t, r).Flows {
			switch {
			case f.ProbeTraceID == probeTrace && f.DstWorkload == "db":
				probes[f.IPVersion]++
			case f.ProbeTraceID == "" && f.DstWorkload == "cart":
				ordinary[f.IPVersion]++
			default:
				t.Errorf("flows?%s: row %+v", q, f)
			}
		}
		return probes, ordinary
	}
	for _, tc := range []struct {
		q                  string
		probes, ordinaries int // per family
	}{
		{"", 0, 1},
		{"probes=exclude", 0, 1},
		{"probes=include", 1, 1},
		{"probes=only", 1, 0},
		{"probe_trace_id=" + probeTrace, 1, 0},
		{"probe_trace_id=tf-0000000000000000", 0, 0},
		{"probes=exclude&probe_trace_id=" + probeTrace, 0, 0},
		{"verdict=dropped", 0, 0},
		{"verdict=dropped&probes=include", 1, 0},
	} {
		p, o := flows(tc.q)
		for _, v := range []int{4, 6} {
			if p[v] != tc.probes || o[v] != tc.ordinaries {
				t.Errorf("flows?%s: IPv%d %d probe rows and %d others, want %d and %d", tc.q, v, p[v], o[v], tc.probes, tc.ordinaries)
			}
		}
	}
	for _, bad := range []string{"probes=maybe", "probes=", "not.probes=include", "probes=include&probes=only"} {
		if r := do(t, h, "GET", "/api/v1/flows?"+bad, ""); r.code != 400 || !strings.Contains(r.body, "probes") {
			t.Errorf("flows?%s: %v, want 400 naming probes", bad, r)
		}
	}

	// The charts: a whole-minute step (the projections' tiers) and a
	// 10-second one (rows); the totals and drops per family.
	for _, step := range []string{"1m", "10s"} {
		for _, tc := range []struct {
			q              string
			flows, dropped uint64
		}{{"", 1, 0}, {"&probes=include", 2, 1}, {"&probes=only", 1, 1}} {
			s := decode[Summary](t, do(t, h, "GET", "/api/v1/flows/summary?step="+step+tc.q, ""))
			for _, fam := range s.Families {
				if fam.Flows != tc.flows || fam.Dropped != tc.dropped {
					t.Errorf("summary step %s%s: IPv%d %d flows, %d dropped; want %d, %d", step, tc.q, fam.IPVersion, fam.Flows, fam.Dropped, tc.flows, tc.dropped)
				}
			}
			for _, tk := range s.Talkers {
				if tc.q == "" && tk.Dst == "shop/db" {
					t.Errorf("summary step %s: top talker %+v is the probe", step, tk)
				}
			}
		}
	}

	// The map: no dropped edge to the probe's destination.
	m := decode[ServiceMap](t, do(t, h, "GET", "/api/v1/servicemap", ""))
	for _, ed := range m.Edges {
		if ed.Dst == "shop/db" || ed.Verdict == "dropped" {
			t.Errorf("map edge %+v: the probe's", ed)
		}
	}
	if len(m.Edges) != 2 {
		t.Errorf("map edges %+v, want frontend -> cart over each family", m.Edges)
	}
	m = decode[ServiceMap](t, do(t, h, "GET", "/api/v1/servicemap?probes=include", ""))
	dropped := 0
	for _, ed := range m.Edges {
		if ed.Dst == "shop/db" && ed.Verdict == "dropped" {
			dropped++
		}
	}
	if dropped != 2 {
		t.Errorf("map with probes: %d dropped edges to shop/db, want one per family: %+v", dropped, m.Edges)
	}
}

// TestFollowLeavesOutProbes: the follow stream's polls leave the probes'
// rows out unless asked.
func TestFollowLeavesOutProbes(t *testing.T) {
	for _, tc := range []struct{ q, want, not string }{
		{"", "NOT is_probe", ""},
		{"&probes=include", "", "is_probe"},
		{"&probes=only", " AND is_probe", "NOT is_probe"},
	} {
		st := &seqStore{recv: time.Now().UnixMilli() + 60_000}
		a, err := New(Config{Store: st, FollowInterval: 20 * time.Millisecond, Anonymous: RoleOperator})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(a.Handler())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/api/v1/flows?follow=true"+tc.q, nil)
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		// A heartbeat ends each poll.
		sc := bufio.NewScanner(r.Body)
		for sc.Scan() && sc.Text() != "event:heartbeat" {
		}
		r.Body.Close()
		cancel()
		srv.Close()
		st.mu.Lock()
		if len(st.sqls) == 0 {
			t.Errorf("follow%s: no poll", tc.q)
		} else if sql := st.sqls[0]; tc.want != "" && !strings.Contains(sql, tc.want) || tc.not != "" && strings.Contains(sql, tc.not) {
			t.Errorf("follow%s polls with %s", tc.q, sql)
		}
		st.mu.Unlock()
	}
}
