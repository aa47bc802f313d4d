package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/recommend"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/web/api"
)

// labRecommender recommends with the real recommend package over the
// lab's cluster view and given flow groups (what the store would read),
// and keeps the last request it was asked.
type labRecommender struct {
	view  *enrich.Snapshot
	flows []audit.ObservedFlow
	last  recommend.Request
}

func (l *labRecommender) Recommend(_ context.Context, req recommend.Request) (*recommend.Report, error) {
	l.last = req
	if req.Scope.Namespace == "nowhere" {
		return nil, &recommend.ScopeError{Field: "namespace", Message: `namespace "nowhere": not in the cluster`}
	}
	return recommend.Build(l.view, l.flows, req)
}

// TestPolicyRecommend: dualflow policy recommend asks a collector's
// GET /api/v1/policy/recommend (--server, or the demo of --state-dir)
// with the scope, window and mode given, prints the YAML alone on stdout
// (it decodes back to the policies the answer names) and the replay of
// each family of the IP mode, on stderr; -o json prints the answer; bad
// flags and the server's 400 are errors naming the field.
func TestPolicyRecommend(t *testing.T) {
	t.Setenv(envToken, "")
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			m, err := manifest.Generate(manifest.Spec{Mode: mode, Nodes: 2})
			if err != nil {
				t.Fatal(err)
			}
			inv := enrich.NewSnapshot(m.Objects()...)
			rec := &labRecommender{view: inv}
			var web, apiPod *corev1.Pod
			for i := range m.Pods {
				switch p := &m.Pods[i]; {
				case p.Namespace == "frontend" && p.Labels["app"] == "web":
					web = p
				case p.Namespace == "backend" && p.Labels["app"] == "api":
					apiPod = p
				}
			}
			end := func(p *corev1.Pod, fam corev1.IPFamily) audit.FlowEnd {
				a, _ := manifest.PodAddr(p, fam)
				ip, _ := inv.Pod(p.Namespace, p.Name)
				w := inv.Workload(ip)
				return audit.FlowEnd{IP: a.String(), Namespace: p.Namespace, Pod: p.Name, WorkloadKind: w.Kind, WorkloadName: w.Name}
			}
			for _, fam := range mode.Families() {
				f := audit.ObservedFlow{Src: end(web, fam), Dst: end(apiPod, fam), Protocol: flow.ProtoTCP, DstPort: 8080, IPVersion: 4, Allowed: 3}
				if fam == corev1.IPv6Protocol {
					f.IPVersion = 6
				}
				rec.flows = append(rec.flows, f)
			}
			a, err := api.New(api.Config{Store: noStore{}, Anonymous: api.RoleViewer, Logger: slog.New(slog.DiscardHandler), Recommend: rec})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(a.Handler())
			defer srv.Close()
			demoDir := t.TempDir()
			if err := os.WriteFile(filepath.Join(demoDir, "web-url"), []byte(srv.URL+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			run := func(args ...string) (string, string, error) {
				var stdout, stderr bytes.Buffer
				err := runPolicyRecommend(context.Background(), args, &stdout, &stderr)
				return stdout.String(), stderr.String(), err
			}
			scope := []string{"--namespace", "backend", "--workload", "Deployment/api", "--since", "2h"}
			before := time.Now()
			y, proof, err := run(append(scope, "--server", srv.URL)...)
			if err != nil {
				t.Fatal(err)
			}
			got, after := rec.last, time.Now()
			if got.Scope != (recommend.Scope{Namespace: "backend", Workload: "api"}) || got.Kind != "Deployment" || got.Mode != recommend.LeastPrivilege ||
				got.Since.Before(before.Add(-2*time.Hour)) || got.Since.After(after.Add(-2*time.Hour)) || got.Until.Sub(got.Since) != 2*time.Hour {
				t.Errorf("the server was asked %+v", got)
			}
			pols, err := audit.DecodePolicies("stdout", strings.NewReader(y), "default")
			if err != nil || len(pols) != 2 || pols[0].Namespace+"/"+pols[0].Name != "backend/api-egress" || pols[1].Name != "api-ingress" {
				t.Fatalf("stdout is not the policies of backend/api (%v):\n%s", err, y)
			}
			if strings.Contains(y, "IPv4:") || strings.Contains(y, "flow groups observed") {
				t.Errorf("the proof is on stdout:\n%s", y)
			}
			for _, fam := range mode.Families() {
				v := "IPv4"
				if fam == corev1.IPv6Protocol {
					v = "IPv6"
				}
				if !strings.Contains(proof, v+": 1 of 1 observed allowed flow groups stay allowed, 0 newly denied") {
					t.Errorf("stderr lacks the %s replay:\n%s", v, proof)
				}
			}
			if !strings.Contains(proof, "Against the policies in force: 2 added, 0 changed") || !strings.Contains(proof, "Adds NetworkPolicy backend/api-ingress: isolates the ingress of Deployment backend/api") {
				t.Errorf("stderr lacks the diff against the policies in force:\n%s", proof)
			}
			if len(mode.Families()) == 1 && strings.Count(proof, "observed allowed flow groups") != 1 {
				t.Errorf("stderr replays a family the %s lab has no flow of:\n%s", mode, proof)
			}
			if demo, _, err := run(append(scope, "--state-dir", demoDir)...); err != nil || demo != y {
				t.Errorf("the demo's API printed %v\n%s\nwant\n%s", err, demo, y)
			}
			j, _, err := run(append(scope, "--server", srv.URL, "-o", "json", "--mode", "close-gaps")...)
			var rep recommend.Report
			if err != nil || json.Unmarshal([]byte(j), &rep) != nil || rep.Mode != recommend.CloseGaps || rec.last.Mode != recommend.CloseGaps {
				t.Errorf("-o json --mode close-gaps: %v\n%s", err, j)
			}
			for _, tc := range []struct {
				args []string
				want string
			}{
				{[]string{"--workload", "/api"}, "--workload"},
				{[]string{"--mode", "most-privilege"}, "--mode"},
				{[]string{"-o", "xml"}, "-o"},
				{[]string{"--namespace", "nowhere"}, `400 Bad Request: namespace "nowhere"`},
			} {
				if _, _, err := run(append(tc.args, "--server", srv.URL)...); err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Errorf("%v: %v, want an error naming %s", tc.args, err, tc.want)
				}
			}
		})
	}
}

// TestPolicyRecommendLocal: without a server or a demo, dualflow policy
// recommend works locally, from --inventory and the embedded store of a
// running dualflow store (its ClickHouse HTTP interface), and prints the
// same YAML as the recommender given the same flow groups, in three
// modes: web's pods call api's on 8080 over each family, three records
// each, plus a denied-only group that gets no rule.
func TestPolicyRecommendLocal(t *testing.T) {
	needChDB(t)
	t.Setenv(envToken, "")
	dataDir := filepath.Join(t.TempDir(), "data")
	httpAddr, metAddr := freeAddr(t), freeAddr(t)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runStore(ctx, []string{"--clickhouse.data-dir", dataDir, "--clickhouse.http-addr", httpAddr, "--metrics-addr", metAddr})
	}()
	t.Cleanup(func() { stop(); <-done })
	waitReady(t, metAddr, done)
	storeFlags := []string{"--clickhouse.data-dir", dataDir, "--url", "http://" + httpAddr + "/"}
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			m, file, inv := labManifest(t, mode)
			end := func(p *corev1.Pod, fam corev1.IPFamily) audit.FlowEnd {
				a, _ := manifest.PodAddr(p, fam)
				ip, _ := inv.Pod(p.Namespace, p.Name)
				w := inv.Workload(ip)
				return audit.FlowEnd{IP: a.String(), Namespace: p.Namespace, Pod: p.Name, WorkloadKind: w.Kind, WorkloadName: w.Name}
			}
			var webs, apis, probes []*corev1.Pod
			for i := range m.Pods {
				switch p := &m.Pods[i]; {
				case p.Namespace == "frontend" && p.Labels["app"] == "web":
					webs = append(webs, p)
				case p.Namespace == "backend" && p.Labels["app"] == "api":
					apis = append(apis, p)
				case p.Namespace == "tools" && p.Labels["app"] == "probe":
					probes = append(probes, p)
				}
			}
			var groups []audit.ObservedFlow
			var rows []string
			now := time.Now().UTC()
			for _, fam := range mode.Families() {
				v := uint8(4)
				if fam == corev1.IPv6Protocol {
					v = 6
				}
				for _, g := range []audit.ObservedFlow{
					{Src: end(webs[0], fam), Dst: end(apis[0], fam), Protocol: flow.ProtoTCP, DstPort: 8080, IPVersion: v, Allowed: 3},
					{Src: end(probes[0], fam), Dst: end(apis[0], fam), Protocol: flow.ProtoTCP, DstPort: 9090, IPVersion: v, Denied: 3},
				} {
					groups = append(groups, g)
					verdict := "allowed"
					if g.Denied > 0 {
						verdict = "denied"
					}
					for i := range 3 {
						rows = append(rows, fmt.Sprintf("('%s', %d, toIPv6('%s'), toIPv6('%s'), %d, %d, '%s', '%s', '%s', '%s', '%s', '%s', '%s', '%s', '%s')",
							now.Add(-time.Duration(i+1)*time.Minute).Format("2006-01-02 15:04:05.000"), v, g.Src.IP, g.Dst.IP, g.DstPort, g.Protocol,
							g.Src.Namespace, g.Src.Pod, g.Src.WorkloadKind, g.Src.WorkloadName, g.Dst.Namespace, g.Dst.Pod, g.Dst.WorkloadKind, g.Dst.WorkloadName, verdict))
					}
				}
			}
			for _, q := range []string{"TRUNCATE TABLE dualflow.flows",
				`INSERT INTO dualflow.flows (flow_end, ip_version, src_ip_in, dst_ip_in, dst_port, protocol,
  src_pod_namespace, src_pod_name, src_workload_kind, src_workload_name, dst_pod_namespace, dst_pod_name, dst_workload_kind, dst_workload_name, ingress_verdict) VALUES ` + strings.Join(rows, ", ")} {
				if err := runSQL(context.Background(), append(append([]string{}, storeFlags...), "--write", q)); err != nil {
					t.Fatal(err)
				}
			}
			scope := []string{"--namespace", "backend", "--since", "1h"}
			var stdout, stderr bytes.Buffer
			if err := runPolicyRecommend(context.Background(), append(append(scope, storeFlags...), "--inventory", file, "--state-dir", t.TempDir()), &stdout, &stderr); err != nil {
				t.Fatalf("%v\n%s", err, stderr.String())
			}
			want, err := recommend.Build(inv, groups, recommend.Request{Options: recommend.Options{Scope: recommend.Scope{Namespace: "backend"}}})
			if err != nil {
				t.Fatal(err)
			}
			if stdout.String() != want.YAML {
				t.Errorf("local YAML:\n%s\nwant (the recommender over the same groups):\n%s", stdout.String(), want.YAML)
			}
			if !strings.Contains(stdout.String(), "name: api-ingress") || !strings.Contains(stderr.String(), "1 of 1 observed allowed flow groups stay allowed") {
				t.Errorf("stdout:\n%s\nstderr:\n%s", stdout.String(), stderr.String())
			}
		})
	}
}
