package api

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/migrations"
	"github.com/dualflow/dualflow/traceflow"
)

// scopeDB holds TestNamespaceScope's rows.
const scopeDB = "scope_api"

// seedScope stores, per family of mode, four connections: shop/web to
// payments/db through Service payments/db (admitted by payments'
// ingress policy), payments/worker to shop/cart (let out by payments'
// egress policy), payments/worker to payments/db (no end in shop), and
// shop/web to an outside address. It returns the families.
func seedScope(t *testing.T, mode manifest.Mode) []int {
	t.Helper()
	e := needEngine(t)
	ctx := context.Background()
	r, err := migrations.NewRunner(e, migrations.Options{Database: scopeDB})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Up(ctx); err != nil {
		t.Fatal(err)
	}
	if err := e.Exec(ctx, "TRUNCATE TABLE "+scopeDB+".flows"); err != nil {
		t.Fatal(err)
	}
	pod := func(ns, name, wl string) flow.Endpoint {
		return flow.Endpoint{PodNamespace: ns, PodName: name, WorkloadKind: "Deployment", WorkloadName: wl, NodeName: "node-" + ns,
			Labels: map[string]string{"app": wl, "team": ns}}
	}
	var recs []flow.Record
	var fams []int
	for _, fam := range []struct {
		v                               int
		web, cart, worker, db, svc, out string
	}{
		{4, "198.18.1.10", "198.18.1.20", "198.18.2.10", "198.18.2.20", "198.19.0.20", "198.19.200.1"},
		{6, "fd00:10:0:1::a", "fd00:10:0:1::14", "fd00:10:0:2::a", "fd00:10:0:2::14", "fd00:10:ff::14", "fd00:10:ffff::1"},
	} {
		if (fam.v == 4 && mode == manifest.ModeIPv6) || (fam.v == 6 && mode == manifest.ModeIPv4) {
			continue
		}
		fams = append(fams, fam.v)
		end := seedNow.Add(-10 * time.Minute)
		mk := func(src, dst string, sp uint16, s, d flow.Endpoint) flow.Record {
			r := flow.Record{FlowStart: end.Add(-time.Second), FlowEnd: end, TimeReceived: end, Proto: flow.ProtoTCP,
				SrcAddr: netip.MustParseAddr(src), DstAddr: netip.MustParseAddr(dst), SrcPort: sp, DstPort: 8080,
				ExporterNode: "node-payments", Source: "conntrack", Src: s, Dst: d, PacketsDelta: 10, BytesDelta: 1000,
				Ingress: flow.Policy{Rule: -1, Verdict: flow.VerdictNotIsolated}, Egress: flow.Policy{Rule: -1, Verdict: flow.VerdictNotIsolated}}
			return r
		}
		toDB := mk(fam.web, fam.db, 41000, pod("shop", "web-0", "web"), pod("payments", "db-0", "db"))
		toDB.ServiceAddr, toDB.ServicePort = netip.MustParseAddr(fam.svc), 80
		toDB.Service = flow.Service{Namespace: "payments", Name: "db", PortName: "sql"}
		toDB.Ingress = flow.Policy{Namespace: "payments", Name: "db-ingress", Rule: 0, Verdict: flow.VerdictAllowed}
		toCart := mk(fam.worker, fam.cart, 42000, pod("payments", "worker-0", "worker"), pod("shop", "cart-0", "cart"))
		toCart.Egress = flow.Policy{Namespace: "payments", Name: "worker-egress", Rule: 1, Verdict: flow.VerdictAllowed}
		inside := mk(fam.worker, fam.db, 43000, pod("payments", "worker-0", "worker"), pod("payments", "db-0", "db"))
		out := mk(fam.web, fam.out, 44000, pod("shop", "web-0", "web"), flow.Endpoint{})
		recs = append(recs, toDB, toCart, inside, out)
	}
	var b []byte
	for i := range recs {
		recs[i].Normalize()
		b = store.AppendFlowRow(b, &recs[i])
	}
	if err := e.InsertRowBinary(ctx, scopeDB+".flows", store.FlowColumns, "", len(recs), b); err != nil {
		t.Fatal(err)
	}
	return fams
}

// TestNamespaceScope: a Kubernetes user who may list pods in shop only
// reads the flows with an end in shop, the other end of a
// cross-namespace row reduced to its namespace and family (no pod,
// workload, labels, node, address, Service name or address, policy),
// and no filter finds a row by what was blanked; the map, the charts
// and the catalog are shop's; views of every namespace (the audit) are
// refused. A user who may list pods everywhere reads every row whole.
// Three IP modes.
func TestNamespaceScope(t *testing.T) {
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			fams := seedScope(t, mode)
			rs := newReviewServer(t)
			rs.tokens["alice-token"], rs.tokens["bob-token"], rs.tokens["eve-token"] = "alice", "bob", "eve"
			rs.grants["alice"] = []string{"list pods."}
			rs.grants["bob"] = []string{"list pods. in shop"}
			cat := fakeCatalog{fn: func(context.Context) (CatalogResponse, error) {
				return CatalogResponse{Namespaces: []string{"payments", "shop"}, Nodes: []string{"node-payments", "node-shop"},
					Pods:     []CatalogPod{{Namespace: "shop", Name: "web-0"}, {Namespace: "payments", Name: "db-0"}},
					Services: []CatalogService{{Namespace: "payments", Name: "db"}}}, nil
			}}
			traces := scopeTraces{&fakeTraces{}}
			h := testAPI(t, Config{Store: needEngine(t), Database: scopeDB, Catalog: cat, Audit: scopeAudit{&audit.Queries{}},
				Traces: traces, Kube: &KubeAuth{Client: rs.client(t)}})
			get := func(token, path string) resp {
				t.Helper()
				return do(t, h, "GET", path, "", "Authorization", "Bearer "+token)
			}
			flows := func(token, q string) []Flow {
				t.Helper()
				r := get(token, "/api/v1/flows?limit=100&"+q)
				if r.code != 200 {
					t.Fatalf("%s flows?%s: %v", token, q, r)
				}
				return decode[FlowPage](t, r).Flows
			}

			// alice: every row, whole.
			if got := flows("alice-token", ""); len(got) != 4*len(fams) {
				t.Errorf("alice: %d rows, want %d", len(got), 4*len(fams))
			}
			// bob: the three rows with an end in shop.
			got := flows("bob-token", "")
			if len(got) != 3*len(fams) {
				t.Fatalf("bob: %d rows, want %d: %+v", len(got), 3*len(fams), got)
			}
			perFam := map[int]int{}
			for _, f := range got {
				perFam[f.IPVersion]++
				switch {
				case f.SrcNamespace == "payments" && f.DstNamespace == "payments":
					t.Errorf("bob sees a row of payments alone: %+v", f)
				case f.DstNamespace == "payments": // shop/web -> payments/db
					if f.SrcPod != "web-0" || f.SrcIP == "" || f.SrcLabels["app"] != "web" {
						t.Errorf("bob's own end blanked: %+v", f)
					}
					if f.DstPod != "" || f.DstIP != "" || f.DstWorkload != "" || f.DstKind != "" || f.DstLabels != nil || f.DstNode != "" ||
						f.SvcName != "" || f.ServiceIP != "" || f.IngressPol != "" || f.Exporter != "" {
						t.Errorf("payments' end not reduced to its namespace: %+v", f)
					}
					if f.SvcNamespace != "payments" || f.Ingress != "allowed" {
						t.Errorf("what bob may know is gone: %+v", f)
					}
				case f.SrcNamespace == "payments": // payments/worker -> shop/cart
					if f.SrcPod != "" || f.SrcIP != "" || f.SrcWorkload != "" || f.SrcLabels != nil || f.SrcNode != "" || f.EgressPol != "" {
						t.Errorf("payments' end not reduced to its namespace: %+v", f)
					}
					if f.DstPod != "cart-0" || f.DstIP == "" {
						t.Errorf("bob's own end blanked: %+v", f)
					}
				case f.DstNamespace == "": // to the outside
					if f.DstIP == "" || f.SrcPod != "web-0" {
						t.Errorf("bob's outside connection blanked: %+v", f)
					}
				}
			}
			for _, v := range fams {
				if perFam[v] != 3 {
					t.Errorf("bob: %d IPv%d rows, want 3", perFam[v], v)
				}
			}
			// No filter finds a row by what was blanked.
			for _, q := range []string{"dst_pod=db-0", "pod=payments/db-0", "src_pod=worker-0", "label=app=db", "dst_workload=db",
				"ip=198.18.2.20", "ip=fd00:10:0:2::14", "ip=198.18.2.0/24", "service=payments/db", "dst_node=node-payments"} {
				if got := flows("bob-token", q); len(got) > 0 {
					t.Errorf("bob flows?%s: %d rows, want none: %+v", q, len(got), got)
				}
			}
			// What bob may know filters as it reads.
			if got := flows("bob-token", "dst_namespace=payments"); len(got) != len(fams) {
				t.Errorf("bob flows?dst_namespace=payments: %d rows, want %d", len(got), len(fams))
			}
			// The map and the charts are of the same rows.
			r := get("bob-token", "/api/v1/servicemap")
			if r.code != 200 {
				t.Fatalf("bob servicemap: %v", r)
			}
			for _, s := range []string{"db-0", "worker", "db-ingress", "node-payments", "payments/db"} {
				if strings.Contains(r.body, s) {
					t.Errorf("bob's map names %q: %s", s, r.body)
				}
			}
			if !strings.Contains(r.body, "shop/web") {
				t.Errorf("bob's map has not shop/web: %s", r.body)
			}
			r = get("bob-token", "/api/v1/flows/summary?pairs=workload")
			if r.code != 200 || strings.Contains(r.body, "db-0") || strings.Contains(r.body, "worker") || strings.Contains(r.body, "db-ingress") {
				t.Errorf("bob summary: %v", r)
			}
			// The catalog: shop's names, no node.
			r = get("bob-token", "/api/v1/catalog")
			c := decode[CatalogResponse](t, r)
			if !slices.Equal(c.Namespaces, []string{"shop"}) || len(c.Pods) != 1 || len(c.Services) != 0 || len(c.Nodes) != 0 {
				t.Errorf("bob catalog: %+v", c)
			}
			if w := get("bob-token", "/api/v1/whoami"); !strings.Contains(w.body, `"namespaces":["shop"]`) {
				t.Errorf("bob whoami: %v", w)
			}
			// The findings all of whose objects are shop's.
			if r := get("bob-token", "/api/v1/audit/findings"); r.code != 200 {
				t.Errorf("bob findings: %v", r)
			} else if fr := decode[audit.FindingsResponse](t, r); len(fr.Findings) != 1 || fr.Findings[0].Message != "shop only" || fr.DualStack != 1 {
				t.Errorf("bob findings: %+v", fr)
			}
			if fr := decode[audit.FindingsResponse](t, get("alice-token", "/api/v1/audit/findings")); len(fr.Findings) != 3 || fr.DualStack != 2 {
				t.Errorf("alice findings: %+v", fr)
			}
			// A reachability matrix of shop's ends only; a matrix with an
			// end elsewhere, or an address (any pod's), is refused, naming
			// the end.
			reach := func(token, dst string) resp {
				t.Helper()
				return do(t, h, "POST", "/api/v1/reachability", `{"sources":[{"kind":"pod","namespace":"shop","name":"web-0"}],"destinations":[`+dst+`]}`,
					"Authorization", "Bearer "+token, "Content-Type", "application/json")
			}
			if r := reach("bob-token", `{"kind":"workload","namespace":"shop","name":"cart"}`); r.code != 200 {
				t.Errorf("bob's own matrix: %v", r)
			}
			if r := reach("bob-token", `{"kind":"workload","namespace":"shop","name":"cart"},{"kind":"service","namespace":"payments","name":"db"}`); r.code != 403 ||
				!strings.Contains(r.body, `destinations[1] is in namespace \"payments\"`) {
				t.Errorf("bob's matrix to payments: %v", r)
			}
			if r := reach("bob-token", `{"kind":"ip","name":"198.18.2.20"}`); r.code != 403 || !strings.Contains(r.body, "may be a pod of any namespace") {
				t.Errorf("bob's matrix to an address: %v", r)
			}
			if r := reach("alice-token", `{"kind":"service","namespace":"payments","name":"db"}`); r.code != 200 ||
				decode[Reachability](t, r).Cells[0][0].Families[strconv.Itoa(fams[0])].Observed.Flows != 1 {
				t.Errorf("alice's matrix to payments: %v", r)
			}
			// A trace's result, the same way.
			for id, want := range map[string]int{"tf-shop": 200, "tf-payments": 403, "tf-ip": 403} {
				if r := get("bob-token", "/api/v1/traceflows/"+id); r.code != want {
					t.Errorf("bob trace %s: %v, want %d", id, r, want)
				}
				if r := get("alice-token", "/api/v1/traceflows/"+id); r.code != 200 {
					t.Errorf("alice trace %s: %v", id, r)
				}
			}
			// The other reports: shop's workloads and rules; the denied
			// groups with an end in shop, payments' end and policy
			// reduced, and the groups that become alike summed.
			if r := get("bob-token", "/api/v1/audit/unprotected"); r.code != 200 || strings.Contains(r.body, "payments") || !strings.Contains(r.body, `"namespace":"shop"`) {
				t.Errorf("bob unprotected: %v", r)
			}
			if r := get("bob-token", "/api/v1/audit/unused"); r.code != 200 {
				t.Errorf("bob unused: %v", r)
			} else if u := decode[audit.UnusedReport](t, r); len(u.Rules) != 1 || u.Rules[0].Namespace != "shop" || len(u.Used) != 1 || strings.Contains(r.body, "payments") {
				t.Errorf("bob unused: %+v", u)
			}
			r = get("bob-token", "/api/v1/audit/denied")
			if dg := decode[[]audit.DeniedGroup](t, r); r.code != 200 || len(dg) != 2 ||
				dg[0].Records != 5 || dg[0].PolicyName != "" || dg[0].DstWorkload != "" || dg[0].SrcWorkload != "web" || dg[0].DstNamespace != "payments" ||
				dg[1].PolicyName != "web-egress" || dg[1].DstWorkload != "" || strings.Contains(r.body, "db") {
				t.Errorf("bob denied: %v", r)
			}
			if dg := decode[[]audit.DeniedGroup](t, get("alice-token", "/api/v1/audit/denied")); len(dg) != 3 || dg[0].PolicyName != "db-ingress" {
				t.Errorf("alice denied: %+v", dg)
			}
			// Every namespace's views are refused, naming the permission.
			for _, path := range []string{"/api/v1/audit/evaluate?from=pod:shop/web-0&to=pod:shop/cart-0", "/api/v1/status"} {
				if r := get("bob-token", path); r.code != 403 || !strings.Contains(r.body, "list on pods in all namespaces") {
					t.Errorf("bob %s: %v", path, r)
				}
			}
			// A user with no namespace at all.
			if r := get("eve-token", "/api/v1/flows"); r.code != 403 || !strings.Contains(r.body, "or in some namespace") {
				t.Errorf("eve flows: %v", r)
			}
		})
	}
}

// scopeAudit answers three findings: one of shop's objects only, one of
// shop and payments, one of a node.
type scopeAudit struct{ *audit.Queries }

func (scopeAudit) Findings(context.Context, audit.Window) (*audit.FindingsResponse, error) {
	return &audit.FindingsResponse{DualStack: 2, Findings: []audit.Finding{
		{Kind: audit.KindVerdictGap, Message: "shop only", Objects: []audit.Ref{{Kind: "Deployment", Namespace: "shop", Name: "web"}}},
		{Kind: audit.KindVerdictGap, Message: "shop and payments", Objects: []audit.Ref{{Kind: "Deployment", Namespace: "shop", Name: "web"}, {Kind: "NetworkPolicy", Namespace: "payments", Name: "db-ingress"}}},
		{Kind: "unused-rule", Message: "a node", Objects: []audit.Ref{{Kind: "Node", Name: "node-payments"}}},
	}}, nil
}

// scopeTraces answers three traces: shop to shop, shop to payments, shop
// to an address.
type scopeTraces struct{ *fakeTraces }

func (scopeTraces) Get(_ context.Context, id string) (traceflow.Result, error) {
	req := traceflow.Request{Source: "shop/web-0"}
	switch id {
	case "tf-shop":
		req.Destination = traceflow.Destination{Workload: "shop/cart", Port: 8080}
	case "tf-payments":
		req.Destination = traceflow.Destination{Service: "payments/db", Port: 80}
	case "tf-ip":
		req.Destination = traceflow.Destination{IP: netip.MustParseAddr("198.18.2.20"), Port: 8080}
	default:
		return traceflow.Result{}, traceflow.ErrNotFound
	}
	return traceflow.Result{ID: id, Request: req, Phase: traceflow.Succeeded}, nil
}

func (scopeAudit) Unprotected(context.Context) ([]audit.UnprotectedWorkload, error) {
	return []audit.UnprotectedWorkload{{Namespace: "payments", Pods: 1, IngressPods: 1}, {Namespace: "shop", Pods: 2, EgressPods: 2}}, nil
}

// Denied answers, as the store would for an end in shop: two groups of
// payments' ingress policy from shop/web to two payments workloads, and
// one of shop's egress policy. It checks the scope it is asked.
func (scopeAudit) Denied(_ context.Context, opt audit.DeniedOptions) ([]audit.DeniedGroup, error) {
	if opt.Namespaces != nil && !slices.Equal(opt.Namespaces, []string{"shop"}) {
		return nil, fmt.Errorf("namespaces %v", opt.Namespaces)
	}
	g := audit.DeniedGroup{Direction: "ingress", PolicyNamespace: "payments", PolicyName: "db-ingress", Rule: -1, Verdict: "denied",
		SrcNamespace: "shop", SrcWorkload: "web", DstNamespace: "payments", DstWorkload: "db", IPVersion: 4, Protocol: "TCP", DstPort: 5432,
		Records: 3, Packets: 3, Bytes: 180, First: seedNow.Add(-time.Hour), Last: seedNow.Add(-time.Minute)}
	g2 := g
	g2.DstWorkload, g2.Records = "db-replica", 2
	g3 := g
	g3.Direction, g3.PolicyNamespace, g3.PolicyName, g3.Records = "egress", "shop", "web-egress", 1
	return []audit.DeniedGroup{g, g2, g3}, nil
}

func (scopeAudit) Unused(context.Context, audit.Window) (*audit.UnusedReport, error) {
	pay := audit.RuleRef{Namespace: "payments", Name: "db-ingress", Direction: "ingress", Rule: 0}
	shop := audit.RuleRef{Namespace: "shop", Name: "web-egress", Direction: "egress", Rule: 0}
	return &audit.UnusedReport{Decisions: 10, Rules: []audit.UnusedRule{{RuleRef: pay}, {RuleRef: shop}},
		Used: map[string]uint64{pay.String(): 0, shop.String(): 0}}, nil
}
