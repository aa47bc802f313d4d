package api

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dualflow/dualflow/test/support/webtest"
)

// The benchmarks query benchRows flows (DUALFLOW_BENCH_ROWS, default 10M)
// spread over the hour before benchNow, a day before the tests' rows so
// the two sets never meet.
var (
	benchNow  = seedNow.Add(-24 * time.Hour)
	benchOnce sync.Once
	benchErr  error
)

func benchRows() int {
	if n, err := strconv.Atoi(os.Getenv("DUALFLOW_BENCH_ROWS")); err == nil && n > 0 {
		return n
	}
	return 10_000_000
}

func benchAPI(b *testing.B) http.Handler {
	e := needEngine(b)
	benchOnce.Do(func() {
		start := time.Now()
		benchErr = e.Exec(context.Background(), webtest.SeedSQL("dualflow", benchRows(), benchNow, time.Hour))
		b.Logf("seeded %d rows in %s", benchRows(), time.Since(start).Round(time.Millisecond))
		// Let the background merges of the insert finish so they do not
		// share the two cores with the measured queries.
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Second) {
			out, err := e.Query(context.Background(), "SELECT count() FROM system.merges", "TSV")
			if err != nil || strings.TrimSpace(string(out)) == "0" {
				break
			}
		}
	})
	if benchErr != nil {
		b.Fatal(benchErr)
	}
	return testAPI(b, Config{Now: func() time.Time { return benchNow }, Evaluator: fakeEvaluator{}})
}

// latencies runs one request per iteration and reports p50 and p95.
func latencies(b *testing.B, h http.Handler, method string, targets []string, body func(i int) string) {
	b.ReportAllocs()
	var d []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		var r *http.Request
		t := targets[i%len(targets)]
		if body != nil {
			r = httptest.NewRequest(method, t, strings.NewReader(body(i)))
			r.Header.Set("Content-Type", "application/json")
		} else {
			r = httptest.NewRequest(method, t, nil)
		}
		w := httptest.NewRecorder()
		start := time.Now()
		h.ServeHTTP(w, r)
		d = append(d, time.Since(start))
		if w.Code != 200 {
			b.Fatalf("%s: %d %.300s", t, w.Code, w.Body.String())
		}
	}
	b.StopTimer()
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	q := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000 }
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.95), "p95-ms")
}

// BenchmarkFlows pages through filtered flows: a family, a CIDR of either
// family, a workload and port, a negated label, a verdict.
func BenchmarkFlows(b *testing.B) {
	h := benchAPI(b)
	targets := []string{
		"ip_version=6",
		"dst_ip=198.18.3.0/24,fd00:10:244:3::/64",
		"src_workload=shop/frontend&dst_port=5432",
		"not.dst_label=app=dns&verdict=allowed",
		"verdict=denied&since=15m",
		"",
	}
	var all []string
	for _, q := range targets {
		all = append(all, "/api/v1/flows?limit=100&"+q)
	}
	b.Run("mix", func(b *testing.B) { latencies(b, h, "GET", all, nil) })
	for i, q := range targets {
		name := strings.NewReplacer("=", ":", "&", "+", "/", "_").Replace(q)
		if name == "" {
			name = "none"
		}
		b.Run(name, func(b *testing.B) { latencies(b, h, "GET", all[i:i+1], nil) })
	}
}

// BenchmarkReachability10x10 asks a 10×10 matrix without live traces.
func BenchmarkReachability10x10(b *testing.B) {
	h := benchAPI(b)
	var src, dst []string
	for i := 0; i < 10; i++ {
		w := webtest.Lab[i%len(webtest.Lab)]
		kind := "workload"
		name := w.Name
		if i >= len(webtest.Lab) {
			kind, name = "pod", w.Name+"-"+strconv.Itoa(i%3)
		}
		src = append(src, `{"kind":"`+kind+`","namespace":"`+w.Namespace+`","name":"`+name+`"}`)
		dst = append(dst, `{"kind":"`+kind+`","namespace":"`+w.Namespace+`","name":"`+name+`"}`)
	}
	body := `{"sources":[` + strings.Join(src, ",") + `],"destinations":[` + strings.Join(dst, ",") + `],"since":"1h"}`
	latencies(b, h, "POST", []string{"/api/v1/reachability"}, func(int) string { return body })
}

// BenchmarkSummary asks the Charts page's summaries of the hour: per
// family, grouped by either side's namespace, and the Sankey's pairs of
// namespaces and of workloads.
func BenchmarkSummary(b *testing.B) {
	h := benchAPI(b)
	for _, q := range []string{"", "dimension=namespace", "dimension=namespace&side=src", "pairs=namespace", "pairs=workload"} {
		name := strings.NewReplacer("=", ":", "&", "+").Replace(q)
		if name == "" {
			name = "none"
		}
		b.Run(name, func(b *testing.B) {
			latencies(b, h, "GET", []string{"/api/v1/flows/summary?since=1h&" + q}, nil)
		})
	}
}

// BenchmarkFlowsScoped: BenchmarkFlows' mix of pages, and the Charts
// page's summary, read by a Kubernetes user who may list pods in every
// namespace and by one who may only in infra (the scoped subquery,
// scopedSource: the rows with an end in infra, shop's end blanked), both
// with their access reviews cached. The difference is the cost of the
// namespace scope.
func BenchmarkFlowsScoped(b *testing.B) {
	benchAPI(b) // seeds the rows
	rs := newReviewServer(b)
	rs.tokens["all"], rs.tokens["infra"] = "all", "infra"
	rs.grants["all"] = []string{"list pods."}
	rs.grants["infra"] = []string{"list pods. in infra"}
	cat := fakeCatalog{fn: func(context.Context) (CatalogResponse, error) {
		return CatalogResponse{Namespaces: []string{"infra", "shop"}}, nil
	}}
	h := testAPI(b, Config{Now: func() time.Time { return benchNow }, Catalog: cat,
		Kube: &KubeAuth{Client: rs.client(b), TokenTTL: time.Hour, AllowTTL: time.Hour, DenyTTL: time.Hour}})
	var pages []string
	for _, q := range []string{"ip_version=6", "dst_ip=198.18.3.0/24,fd00:10:244:3::/64", "verdict=allowed", ""} {
		pages = append(pages, "/api/v1/flows?limit=100&"+q)
	}
	for _, user := range []string{"all", "infra"} {
		as := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.Header.Set("Authorization", "Bearer "+user)
			h.ServeHTTP(w, r)
		})
		b.Run(user+"/flows", func(b *testing.B) { latencies(b, as, "GET", pages, nil) })
		b.Run(user+"/summary", func(b *testing.B) {
			latencies(b, as, "GET", []string{"/api/v1/flows/summary?dimension=namespace"}, nil)
		})
	}
}
