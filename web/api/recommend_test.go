package api

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/recommend"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/migrations"
)

// recommendDB is the database of TestPolicyRecommend, beside the seeded
// one in the same engine.
const recommendDB = "recommend_api"

// seedRecommend stores, in recommendDB, the lab's web@1 -> api@2 on
// 8080/TCP and probe@1 -> api@2 on 8080/TCP over every family of mode,
// their verdicts evaluated with the lab's policies, as the collector
// does.
func seedRecommend(t *testing.T, mode manifest.Mode) *enrich.Snapshot {
	t.Helper()
	e := needEngine(t)
	ctx := context.Background()
	r, err := migrations.NewRunner(e, migrations.Options{Database: recommendDB})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Exec(ctx, "TRUNCATE TABLE "+recommendDB+".flows"); err != nil {
		t.Fatal(err)
	}
	m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: 2})
	if err != nil {
		t.Fatal(err)
	}
	inv := enrich.NewSnapshot(m.Objects()...)
	au, err := audit.New(audit.Config{}, inv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := au.SetPolicies(inv.NetworkPolicies); err != nil {
		t.Fatal(err)
	}
	pod := func(ns, app, node string) *corev1.Pod {
		for i := range m.Pods {
			if p := &m.Pods[i]; p.Namespace == ns && p.Labels["app"] == app && p.Spec.NodeName == node {
				return p
			}
		}
		t.Fatalf("no %s/%s on %s", ns, app, node)
		return nil
	}
	web, api, probe := pod("frontend", "web", manifest.NodeName(1)), pod("backend", "api", manifest.NodeName(2)), pod("tools", "probe", manifest.NodeName(1))
	end := func(p *corev1.Pod) flow.Endpoint {
		ip, _ := inv.Pod(p.Namespace, p.Name)
		w := inv.Workload(ip)
		return flow.Endpoint{PodNamespace: p.Namespace, PodName: p.Name, Labels: p.Labels, WorkloadKind: w.Kind, WorkloadName: w.Name, NodeName: p.Spec.NodeName}
	}
	var recs []flow.Record
	for _, fam := range mode.Families() {
		for _, src := range []*corev1.Pod{web, probe} {
			sa, _ := manifest.PodAddr(src, fam)
			da, _ := manifest.PodAddr(api, fam)
			at := seedNow.Add(-10 * time.Minute)
			rec := flow.Record{FlowStart: at.Add(-time.Second), FlowEnd: at, TimeReceived: at, SrcAddr: sa, DstAddr: da,
				Proto: flow.ProtoTCP, SrcPort: uint16(41000 + len(recs)), DstPort: 8080, Src: end(src), Dst: end(api),
				Packets: 3, PacketsDelta: 3, Bytes: 180, BytesDelta: 180, ExporterNode: api.Spec.NodeName, Source: "conntrack"}
			rec.Normalize()
			au.Audit(&rec)
			recs = append(recs, rec)
		}
	}
	var b []byte
	for i := range recs {
		b = store.AppendFlowRow(b, &recs[i])
	}
	if err := e.InsertRowBinary(ctx, recommendDB+".flows", store.FlowColumns, "", len(recs), b); err != nil {
		t.Fatal(err)
	}
	return inv
}

// TestPolicyRecommend: GET /policy/recommend over flows stored by the
// real engine, in every IP mode, answers the YAML (which decodes back
// to the policies it names), the notes, the replay of each family of the
// mode keeping every observed allowed group, and the static audit; bad
// input is a 400 naming its field, a limit past the what-if's bound a
// 422.
func TestPolicyRecommend(t *testing.T) {
	none := testAPI(t, Config{})
	if res := do(t, none, "GET", "/api/v1/policy/recommend", ""); res.code != http.StatusNotImplemented {
		t.Errorf("without a recommender: %d %s, want 501", res.code, res.body)
	}
	// Viewers may ask (it reads flows, writes nothing); a recommender
	// without store is unavailable.
	tok := &Tokens{}
	tok.Add("view-secret", Principal{Name: "v", Role: RoleViewer})
	noStore := testAPI(t, Config{Tokens: tok, Recommend: &recommend.Queries{Queries: &audit.Queries{}}})
	if res := do(t, noStore, "GET", "/api/v1/policy/recommend", ""); res.code != http.StatusUnauthorized {
		t.Errorf("without a token: %d %s, want 401", res.code, res.body)
	}
	if res := do(t, noStore, "GET", "/api/v1/policy/recommend", "", "Authorization", "Bearer view-secret"); res.code != http.StatusServiceUnavailable {
		t.Errorf("a viewer, without store: %d %s, want 503", res.code, res.body)
	}
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			inv := seedRecommend(t, mode)
			r, err := audit.NewReports(needEngine(t), recommendDB)
			if err != nil {
				t.Fatal(err)
			}
			aq := &audit.Queries{Reports: r, Cluster: func() (*enrich.Snapshot, error) { return inv, nil }}
			h := testAPI(t, Config{Audit: aq, Recommend: &recommend.Queries{Queries: aq}})
			window := url.Values{"since": {seedNow.Add(-time.Hour).Format(time.RFC3339)}, "until": {seedNow.Format(time.RFC3339)}}
			ask := func(params ...string) resp {
				q := url.Values{}
				for k, v := range window {
					q[k] = v
				}
				for i := 0; i+1 < len(params); i += 2 {
					q.Set(params[i], params[i+1])
				}
				return do(t, h, "GET", "/api/v1/policy/recommend?"+q.Encode(), "")
			}
			for _, scope := range [][]string{
				{"namespace", "backend", "workload", "Deployment/api"},
				{"namespace", "backend", "workload", "api", "mode", "least-privilege"},
				{"namespace", "backend"},
				{},
			} {
				res := ask(scope...)
				if res.code != http.StatusOK {
					t.Fatalf("%v: %d %s", scope, res.code, res.body)
				}
				rep := decode[recommend.Report](t, res)
				if rep.Mode != recommend.LeastPrivilege || rep.Flows == 0 || !strings.Contains(rep.YAML, "kind: NetworkPolicy") {
					t.Fatalf("%v: %+v", scope, rep)
				}
				pols, err := audit.DecodePolicies("yaml", strings.NewReader(rep.YAML), "default")
				if err != nil || len(pols) != len(rep.Policies) {
					t.Fatalf("%v: the YAML decodes to %d policies (%v), the answer names %v", scope, len(pols), err, rep.Policies)
				}
				for i, p := range pols {
					if p.Namespace+"/"+p.Name != rep.Policies[i] {
						t.Errorf("%v: policy %d is %s/%s, named %s", scope, i, p.Namespace, p.Name, rep.Policies[i])
					}
				}
				if len(scope) > 2 && !strings.Contains(strings.Join(rep.Policies, " "), "backend/api-ingress") {
					t.Errorf("%v: policies %v, want backend/api-ingress", scope, rep.Policies)
				}
				var fams []corev1.IPFamily
				for _, f := range rep.Replay {
					fam := corev1.IPv4Protocol
					if f.Family == 6 {
						fam = corev1.IPv6Protocol
					}
					fams = append(fams, fam)
					if f.Allowed == 0 || f.Kept != f.Allowed || len(f.NewlyDenied) != 0 {
						t.Errorf("%v: IPv%d replay %+v: want every observed allowed group kept", scope, f.Family, f)
					}
				}
				if want := mode.Families(); len(fams) != len(want) || fams[0] != want[0] {
					t.Errorf("%v: replayed families %v, want %v", scope, fams, want)
				}
				if len(rep.Diff) != len(rep.Policies) {
					t.Errorf("%v: %d diffs for %d policies", scope, len(rep.Diff), len(rep.Policies))
				}
				for i, d := range rep.Diff {
					if d.Namespace+"/"+d.Name != rep.Policies[i] || d.Change != recommend.Added || len(d.Summary) == 0 || !strings.Contains(d.Proposed, "name: "+d.Name) {
						t.Errorf("%v: diff %d: %+v, want %s added, with its summary and YAML", scope, i, d, rep.Policies[i])
					}
				}
				if rep.Findings == nil || rep.Notes == nil {
					t.Errorf("%v: findings %v, notes %v: want lists", scope, rep.Findings, rep.Notes)
				}
			}
			if res := ask("mode", "close-gaps"); res.code != http.StatusOK || decode[recommend.Report](t, res).Mode != recommend.CloseGaps {
				t.Errorf("close-gaps: %d %s", res.code, res.body)
			}
			for _, tc := range []struct {
				params []string
				code   int
				field  string
			}{
				{[]string{"mode", "most-privilege"}, 400, "mode"},
				{[]string{"workload", "api"}, 400, "namespace"},
				{[]string{"namespace", "nowhere"}, 400, "namespace"},
				{[]string{"namespace", "backend", "workload", "nothing"}, 400, "workload"},
				{[]string{"namespace", "backend", "workload", "StatefulSet/api"}, 400, "workload"},
				{[]string{"namespace", "backend", "workload", "/api"}, 400, "workload"},
				{[]string{"since", "yesterday"}, 400, "since"},
				{[]string{"limit", "-1"}, 400, "limit"},
				{[]string{"limit", "1"}, 422, "since"},
				{[]string{"limit", "300001"}, 422, "limit"},
			} {
				res := ask(tc.params...)
				if b := decode[errorBody](t, res); res.code != tc.code || b.Field != tc.field {
					t.Errorf("%v: %d %s, want %d naming %s", tc.params, res.code, res.body, tc.code, tc.field)
				}
			}
		})
	}
}
