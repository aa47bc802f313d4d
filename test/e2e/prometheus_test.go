package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/app"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/labcmd"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/web/api"
)

// shippedRules is the rules file the product ships (Helm chart and plain
// Prometheus alike).
const shippedRules = "../../deploy/helm/dualflow/files/prometheus/dualflow-rules.yaml"

// ruleScale maps the shipped rules' windows to the test's: every range,
// offset and for of the file, each about 30 to 60 times shorter, so that
// an alert meant to fire minutes after its cause fires seconds after it
// with 1 s scrapes and evaluations. The expressions stay as shipped.
var ruleScale = []struct{ shipped, scaled string }{
	{"[10m]", "[20s]"},
	{"offset 10m", "offset 20s"},
	{"[1h]", "[2m]"},
	{"[15m]", "[30s]"},
	{"for: 5m", "for: 5s"},
	{"for: 10m", "for: 10s"},
	{"for: 15m", "for: 15s"},
}

// unscaledWindow finds the windows of the rules, each of which ruleScale
// must scale (a new rule may bring a window of its own).
var unscaledWindow = regexp.MustCompile(`\[\d+[mhd]\]|offset \d+[mhd]|for: \d+[mhd]`)

// TestPrometheusAlerts runs the shipped alert rules in a real Prometheus
// that scrapes a lab product's collector and exporters, with a real
// Alertmanager notifying a webhook of the test (issue 39), in each IP
// mode:
//   - web@1 → api@2:8080/tcp runs in every family of the mode until the
//     rules' "succeeded before" window holds it; then the backend policy
//     that lets web in is narrowed to an ipBlock of the other family (as
//     an operator writing a one-family ipBlock would), so IPv6 (IPv4 in
//     the ipv4 mode) is denied and the other family not:
//     DualflowDualStackRegression fires at Alertmanager with
//     src_namespace=frontend, dst_namespace=backend and the family, and
//     resolves once the policy is back. The time from the policy change to
//     the notification is logged. In the dual-stack lab the edit is also a
//     dual-stack gap (the allowed family's connections would be denied
//     over the other family of the same pods): DualflowDualStackGap fires
//     for the pair and the allowed family, and resolves too;
//   - one exporter is stopped: DualflowExporterDown fires for its
//     instance; it is restarted: the alert resolves;
//   - once the traffic has stopped and every record is in, PromQL's
//     sum by (ip_family) of the flow byte and connection counters equals
//     the flows table's sums over the same records, exactly (both count
//     the same enriched records, the metrics as they pass, the table once
//     stored; traceflow probe rows, which the metrics leave out, are
//     excluded, and the test sends none).
//
// It runs beside other tests (its own lab prefix, ports, directories and
// database), and so do its modes, each a lab, a product, Prometheus and
// Alertmanager of its own: a mode spends its two minutes mostly waiting
// for the rules' windows, and one after the other they were the e2e
// tier's tail (383 s).
func TestPrometheusAlerts(t *testing.T) {
	t.Parallel()
	requirePrereqs(t)
	bins := promBinaries(t)
	rules := scaledRules(t, bins)
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			recordAs(t, string(mode)+"/prometheus")
			checkPrometheusAlerts(t, bins, rules, mode)
		})
	}
}

// promTools are the paths of Prometheus, Alertmanager and promtool.
type promTools struct{ prometheus, alertmanager, promtool string }

// promBinaries finds Debian's prometheus and prometheus-alertmanager
// (scripts/deps.sh installs them); it skips without them, or fails under
// DUALFLOW_E2E=1.
func promBinaries(t *testing.T) promTools {
	t.Helper()
	var b promTools
	var missing []string
	for _, c := range []struct {
		dst   *string
		names []string
	}{{&b.prometheus, []string{"prometheus"}}, {&b.alertmanager, []string{"prometheus-alertmanager", "alertmanager"}}, {&b.promtool, []string{"promtool"}}} {
		for _, n := range c.names {
			if p, err := exec.LookPath(n); err == nil {
				*c.dst = p
				break
			}
		}
		if *c.dst == "" {
			missing = append(missing, c.names[0])
		}
	}
	if len(missing) > 0 {
		msg := "missing " + strings.Join(missing, ", ") + " (scripts/deps.sh installs Debian's prometheus and prometheus-alertmanager)"
		if os.Getenv("DUALFLOW_E2E") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return b
}

// scaledRules writes the shipped rules with their windows scaled by
// ruleScale to a file of the test, checked by promtool.
func scaledRules(t *testing.T, bins promTools) string {
	t.Helper()
	b, err := os.ReadFile(shippedRules)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	for _, w := range unscaledWindow.FindAllString(s, -1) {
		if !slices.ContainsFunc(ruleScale, func(r struct{ shipped, scaled string }) bool { return r.shipped == w }) {
			t.Fatalf("the shipped rules have a window ruleScale does not scale: %q", w)
		}
	}
	for _, r := range ruleScale {
		if !strings.Contains(s, r.shipped) {
			t.Fatalf("the shipped rules have no %q: update ruleScale", r.shipped)
		}
		s = strings.ReplaceAll(s, r.shipped, r.scaled)
	}
	f := filepath.Join(t.TempDir(), "dualflow-rules.yaml")
	if err := os.WriteFile(f, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bins.promtool, "check", "rules", f).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules (scaled): %v\n%s", err, out)
	}
	return f
}

func checkPrometheusAlerts(t *testing.T, bins promTools, rules string, mode manifest.Mode) {
	l := startLab(t, mode)
	// The products of this process share one store: the flows table's
	// rows of this product are those received from now on.
	since := time.Now()
	p, base := startProductEdited(t, l, labcmd.ProductOptions{ExporterMetrics: true}, func(c *app.Config) {
		c.Collector.MetricsAddr = "127.0.0.1:0"
	})
	hook := startAlertWebhook(t)
	am := startAlertmanager(t, bins.alertmanager, hook.URL)
	prom := startPrometheus(t, bins.prometheus, rules, am, p.App.Collector().MetricsAddr().String(), p.ExporterMetrics)
	nodes := len(p.ExporterMetrics)
	await(t, time.Minute, "Prometheus scrapes the collector and every exporter", func() (bool, string) {
		v, err := prom.vector(`sum by (job) (up)`)
		return err == nil && v["dualflow-collector"] == 1 && v["dualflow-exporter"] == float64(nodes), fmt.Sprintf("up by job %v, err %v", v, err)
	})

	// The traffic: web@1 → api@N:8080/tcp in every family of the mode.
	n := len(l.Manifest.Nodes)
	web1, err := l.PodOn(manifest.NSFrontend, "web", 1)
	if err != nil {
		t.Fatal(err)
	}
	apiN, err := l.PodOn(manifest.NSBackend, "api", n)
	if err != nil {
		t.Fatal(err)
	}
	denied := corev1.IPv6Protocol // the family the edit denies
	if !mode.Has(denied) {
		denied = corev1.IPv4Protocol
	}
	deniedFam := promFamily(denied)
	tr := startTraffic(t, l, web1, apiN, mode.Families())

	// The rule's "succeeded before" term, as the rule has it: the edit
	// comes once the connections of the family are in its window.
	allowedBefore := `sum by (ip_family) (increase(dualflow_flow_connections_total{verdict="allowed",src_namespace="frontend",dst_namespace="backend"}[2m] offset 20s))`
	warm := await(t, 2*time.Minute, "allowed "+deniedFam+" connections frontend → backend in the rule's window", func() (bool, string) {
		v, err := prom.vector(allowedBefore)
		return err == nil && v[deniedFam] > 0, fmt.Sprintf("%v, err %v; traffic %s", v, err, tr)
	})
	t.Logf("%s: the rule's window holds allowed %s connections %v after the traffic started", mode, deniedFam, warm.Round(time.Second))
	if got := tr.failedSince(time.Time{}); len(got) > 0 {
		t.Fatalf("before the edit, connections failed: %v (the lab's policies allow web → api:8080)", got)
	}
	if ev := hook.events("DualflowDualStackRegression"); len(ev) > 0 {
		t.Fatalf("DualflowDualStackRegression notified before any policy change: %+v", ev)
	}

	// The edit: allow-web-to-api lets in the other family's cluster CIDR
	// only.
	orig := l.Manifest.NetworkPolicies
	edited := slices.Clone(orig)
	i := slices.IndexFunc(edited, func(np networkingv1.NetworkPolicy) bool {
		return np.Namespace == manifest.NSBackend && np.Name == manifest.PolicyAllowWeb
	})
	if i < 0 {
		t.Fatalf("no policy %s/%s in the lab", manifest.NSBackend, manifest.PolicyAllowWeb)
	}
	other := manifest.ClusterCIDRv4
	if denied == corev1.IPv4Protocol {
		other = manifest.ClusterCIDRv6
	}
	np := *edited[i].DeepCopy()
	np.Spec.Ingress[0].From = []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: other.String()}}}
	edited[i] = np
	restore := func() {
		l.Manifest.NetworkPolicies = orig
		if err := l.Reload(context.Background()); err != nil {
			t.Errorf("restore the lab's policies: %v", err)
		}
	}
	l.Manifest.NetworkPolicies = edited
	if err := l.Reload(ctx(t)); err != nil {
		restore()
		t.Fatal(err)
	}
	changed := time.Now()
	restored := false
	t.Cleanup(func() {
		if !restored {
			restore()
		}
	})

	want := map[string]string{"alertname": "DualflowDualStackRegression", "severity": "critical",
		"src_namespace": "frontend", "dst_namespace": "backend", "ip_family": deniedFam}
	fired := hook.await(t, 2*time.Minute, "firing", want, tr)
	t.Logf("%s: DualflowDualStackRegression (%s) notified by Alertmanager %v after the policy change (first %s connection refused after %v, the rule pending after %v)",
		mode, deniedFam, fired.Sub(changed).Round(100*time.Millisecond), deniedFam, tr.firstFailure(denied, changed).Round(100*time.Millisecond),
		prom.activeAt(t, want).Sub(changed).Round(100*time.Millisecond))
	// The datapath did what the alert says: the family is refused, the
	// other one is not.
	for _, f := range mode.Families() {
		failed := tr.failedSince(changed)[f]
		switch {
		case f == denied && failed == 0:
			t.Errorf("no %s connection failed after the edit", f)
		case f != denied && failed > 0:
			t.Errorf("%d %s connections failed after the edit, which allows that family", failed, f)
		}
	}
	if f, ok := hook.other("DualflowDualStackRegression", want); ok {
		t.Errorf("DualflowDualStackRegression for another pair or family: %v", f)
	}
	// In the dual-stack lab the edit is also a dual-stack gap: the
	// auditor finds the connections of the allowed family denied over the
	// other family of the same pods (single-stack pods have no other
	// family: no gap, and no such alert, below).
	var gap map[string]string
	if mode == manifest.ModeDual {
		allowedFam := "ipv4"
		if denied == corev1.IPv4Protocol {
			allowedFam = "ipv6"
		}
		gap = map[string]string{"alertname": "DualflowDualStackGap", "severity": "warning",
			"src_namespace": "frontend", "dst_namespace": "backend", "ip_family": allowedFam, "verdict": "allowed"}
		fired := hook.await(t, 2*time.Minute, "firing", gap, tr)
		t.Logf("%s: DualflowDualStackGap (%s allowed, %s denied) notified %v after the policy change", mode, allowedFam, deniedFam, fired.Sub(changed).Round(100*time.Millisecond))
	}

	restore()
	restored = true
	undone := time.Now()
	resolved := hook.await(t, 2*time.Minute, "resolved", want, tr)
	t.Logf("%s: resolved %v after the policy was restored", mode, resolved.Sub(undone).Round(100*time.Millisecond))
	if gap != nil {
		resolved := hook.await(t, 2*time.Minute, "resolved", gap, tr)
		t.Logf("%s: DualflowDualStackGap resolved %v after the policy was restored", mode, resolved.Sub(undone).Round(100*time.Millisecond))
	}
	await(t, 30*time.Second, deniedFam+" connections answered again", func() (bool, string) {
		ok := tr.answeredSince(time.Now().Add(-2 * time.Second))[denied] > 0
		return ok, tr.String()
	})
	tr.stop()
	if failed := tr.failedSince(undone.Add(3 * time.Second))[denied]; failed > 0 {
		t.Errorf("%d %s connections failed after the policy was restored", failed, denied)
	}

	// An exporter down, then back.
	node := l.Manifest.Nodes[n-1].Name
	target := p.ExporterMetrics[node]
	down := map[string]string{"alertname": "DualflowExporterDown", "severity": "critical", "job": "dualflow-exporter", "instance": target}
	if err := p.StopExporter(node); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	fired = hook.await(t, time.Minute, "firing", down, nil)
	t.Logf("%s: DualflowExporterDown (%s) notified %v after the exporter stopped", mode, node, fired.Sub(stopped).Round(100*time.Millisecond))
	if err := p.RestartExporter(node); err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	resolved = hook.await(t, time.Minute, "resolved", down, nil)
	t.Logf("%s: resolved %v after the exporter restarted", mode, resolved.Sub(restarted).Round(100*time.Millisecond))

	checkPromQLAgainstFlows(t, prom, base, since)
	checkRulesHealthy(t, prom)
	// Nothing else went wrong in the lab: any other alert is a false
	// alarm or a fault of the product.
	for _, name := range hook.names() {
		if name != "DualflowDualStackRegression" && name != "DualflowExporterDown" && (gap == nil || name != "DualflowDualStackGap") {
			t.Errorf("%s notified: %v", name, hook.events(name))
		}
	}
	t.Logf("%s: notifications: %s", mode, hook)
}

// checkPromQLAgainstFlows compares PromQL's per-family sums of the flow
// byte and connection counters with the flows table's over the same
// records (rows received since since). Once nothing is in flight they
// must be equal: the metrics count each record as it leaves the enrich
// stage and the table stores the same record (a connection counted at
// its record whose packet total equals its delta, packets = packets_total
// in the table); traceflow probes are in neither. What is in flight
// (records in the exporters' and collector's buffers, not yet stored or
// not yet scraped) is waited out, for at most a minute.
func checkPromQLAgainstFlows(t *testing.T, prom *promServer, base string, since time.Time) {
	t.Helper()
	q := fmt.Sprintf(`SELECT ip_version, toString(sum(bytes)), toString(countIf(packets = packets_total)) FROM flows
		WHERE time_received >= fromUnixTimestamp64Milli(toInt64(%d)) AND probe_trace_id = '' GROUP BY ip_version ORDER BY ip_version`, since.UnixMilli())
	var first string
	took := await(t, time.Minute, "PromQL sums equal to the flows table's", func() (bool, string) {
		bytes, err := prom.vector(`sum by (ip_family) (dualflow_flow_bytes_total)`)
		if err != nil {
			return false, err.Error()
		}
		conns, err := prom.vector(`sum by (ip_family) (dualflow_flow_connections_total)`)
		if err != nil {
			return false, err.Error()
		}
		var res api.SQLResult
		if _, err := restCall(ctx(t), http.MethodPost, base+"/api/v1/sql", api.SQLRequest{Query: q}, &res); err != nil {
			return false, err.Error()
		}
		tbBytes, tbConns := map[string]float64{}, map[string]float64{}
		for _, r := range res.Rows {
			fam := "ipv" + fmt.Sprint(r[0])
			tbBytes[fam], _ = strconv.ParseFloat(fmt.Sprint(r[1]), 64)
			tbConns[fam], _ = strconv.ParseFloat(fmt.Sprint(r[2]), 64)
		}
		state := fmt.Sprintf("PromQL bytes %v connections %v; flows table bytes %v connections %v", bytes, conns, tbBytes, tbConns)
		if first == "" {
			first = state
		}
		return len(tbBytes) > 0 && maps.Equal(bytes, tbBytes) && maps.Equal(conns, tbConns), state
	})
	t.Logf("PromQL and the flows table agree after %v; at first: %s", took.Round(100*time.Millisecond), first)
}

// checkRulesHealthy: every shipped rule evaluated in the real Prometheus
// without an error.
func checkRulesHealthy(t *testing.T, prom *promServer) {
	t.Helper()
	res, err := prom.api.Rules(ctx(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, g := range res.Groups {
		for _, r := range g.Rules {
			ar, ok := r.(promv1.AlertingRule)
			if !ok {
				continue
			}
			n++
			if ar.Health != promv1.RuleHealthGood {
				t.Errorf("rule %s: health %s: %s", ar.Name, ar.Health, ar.LastError)
			}
		}
	}
	if n == 0 {
		t.Error("Prometheus has no alerting rule loaded")
	}
}

func promFamily(f corev1.IPFamily) string {
	if f == corev1.IPv6Protocol {
		return "ipv6"
	}
	return "ipv4"
}

// promServer is a Prometheus server of the test.
type promServer struct {
	api promv1.API
}

// vector runs an instant query whose result has one label at most and
// returns its samples by that label's value.
func (p *promServer) vector(q string) (map[string]float64, error) {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v, _, _, err := p.api.Query(c, q, time.Now())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", q, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("%s: a %s, not a vector", q, v.Type())
	}
	out := map[string]float64{}
	for _, s := range vec {
		key := ""
		for _, val := range s.Metric {
			key = string(val)
		}
		out[key] = float64(s.Value)
	}
	return out, nil
}

// activeAt is when Prometheus's active alert with labels want (its
// alertname among them) became pending.
func (p *promServer) activeAt(t *testing.T, want map[string]string) time.Time {
	t.Helper()
	res, err := p.api.Alerts(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range res.Alerts {
		got := map[string]string{}
		for k, v := range a.Labels {
			got[string(k)] = string(v)
		}
		if maps.Equal(got, want) {
			return a.ActiveAt
		}
	}
	t.Fatalf("Prometheus has no active alert %v: %+v", want, res.Alerts)
	return time.Time{}
}

// startPrometheus runs Prometheus on a free port of 127.0.0.1, with its
// own storage, scraping the collector (job dualflow-collector) and the
// exporters (job dualflow-exporter, as the rules expect) every second,
// evaluating the rules every second and sending to Alertmanager at am.
func startPrometheus(t *testing.T, bin, rules, am, collector string, exporters map[string]string) *promServer {
	t.Helper()
	dir := t.TempDir()
	var targets []string
	for _, a := range exporters {
		targets = append(targets, strconv.Quote(a))
	}
	sort.Strings(targets)
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files: [%q]
alerting:
  alertmanagers:
  - static_configs: [{targets: [%q]}]
scrape_configs:
- job_name: dualflow-collector
  static_configs: [{targets: [%q]}]
- job_name: dualflow-exporter
  static_configs: [{targets: [%s]}]
`, rules, am, collector, strings.Join(targets, ", "))
	conf := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t, "127.0.0.1"))
	startDaemon(t, "prometheus", dir, addr, bin,
		"--config.file="+conf,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		// Firing alerts are resent every minute by default; the test's
		// windows are seconds.
		"--rules.alert.resend-delay=1s",
	)
	c, err := promapi.NewClient(promapi.Config{Address: "http://" + addr})
	if err != nil {
		t.Fatal(err)
	}
	return &promServer{api: promv1.NewAPI(c)}
}

// startAlertmanager runs Alertmanager on a free port of 127.0.0.1, its
// own data directory, without clustering, notifying every alert apart
// (group_by '...') to the webhook at hook at once, resolved ones too. It
// returns its address.
func startAlertmanager(t *testing.T, bin, hook string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf(`route:
  receiver: test
  group_by: ['...']
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
- name: test
  webhook_configs:
  - url: %q
    send_resolved: true
`, hook)
	conf := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(conf, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t, "127.0.0.1"))
	startDaemon(t, "alertmanager", dir, addr, bin,
		"--config.file="+conf,
		"--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--cluster.listen-address=",
	)
	return addr
}

// startDaemon starts bin with args, its output in dir, and waits until
// http://addr/-/ready answers 200 (Prometheus and Alertmanager both
// serve it). It is killed when the test ends; its log is shown if the
// test failed.
func startDaemon(t *testing.T, name, dir, addr, bin string, args ...string) {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	lf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = lf, lf
	// Killed if the test process dies (a test timeout skips Cleanup).
	// Pdeathsig follows the OS thread that started the child, and Go ends
	// threads (the lab's namespace switches do), so the child is started
	// from a thread locked until the daemon has been killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	started, release := make(chan error), make(chan struct{})
	go func() {
		runtime.LockOSThread()
		started <- cmd.Start()
		<-release
		runtime.UnlockOSThread()
	}()
	if err := <-started; err != nil {
		close(release)
		lf.Close()
		t.Fatalf("%s: %v", name, err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); lf.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		close(release)
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			t.Logf("%s log (end):\n%s", name, b)
		}
	})
	await(t, time.Minute, name+" ready", func() (bool, string) {
		select {
		case err := <-exited:
			exited <- err
			b, _ := os.ReadFile(logPath)
			t.Fatalf("%s exited at start: %v\n%s", name, err, b)
		default:
		}
		resp, err := http.Get("http://" + addr + "/-/ready")
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, resp.Status
	})
}

// alertEvent is one alert of a notification Alertmanager sent the
// webhook, and when it arrived.
type alertEvent struct {
	Status string            `json:"status"`
	Labels map[string]string `json:"labels"`
	at     time.Time
}

// alertWebhook is the receiver Alertmanager notifies (its webhook
// payload, version 4), on loopback.
type alertWebhook struct {
	URL string
	mu  sync.Mutex
	got []alertEvent
}

func startAlertWebhook(t *testing.T) *alertWebhook {
	h := &alertWebhook{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var msg struct {
			Version string       `json:"version"`
			Alerts  []alertEvent `json:"alerts"`
		}
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &msg); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		now := time.Now()
		h.mu.Lock()
		for _, a := range msg.Alerts {
			a.at = now
			h.got = append(h.got, a)
		}
		h.mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	h.URL = srv.URL + "/"
	return h
}

// events returns the notified alerts named name.
func (h *alertWebhook) events(name string) []alertEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []alertEvent
	for _, a := range h.got {
		if a.Labels["alertname"] == name {
			out = append(out, a)
		}
	}
	return out
}

// names returns the names of the alerts notified.
func (h *alertWebhook) names() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, a := range h.got {
		if !slices.Contains(out, a.Labels["alertname"]) {
			out = append(out, a.Labels["alertname"])
		}
	}
	return out
}

// await waits until an alert with exactly the labels want is notified
// with status (firing or resolved) and returns when it arrived.
func (h *alertWebhook) await(t *testing.T, budget time.Duration, status string, want map[string]string, tr *traffic) time.Time {
	t.Helper()
	var at time.Time
	await(t, budget, fmt.Sprintf("%s %v at Alertmanager", status, want), func() (bool, string) {
		for _, a := range h.events(want["alertname"]) {
			if a.Status == status && maps.Equal(a.Labels, want) {
				at = a.at
				return true, ""
			}
		}
		state := "notifications: " + h.String()
		if tr != nil {
			state += "; traffic " + tr.String()
		}
		return false, state
	})
	return at
}

// other returns an alert named name whose labels are not want.
func (h *alertWebhook) other(name string, want map[string]string) (map[string]string, bool) {
	for _, a := range h.events(name) {
		if !maps.Equal(a.Labels, want) {
			return a.Labels, true
		}
	}
	return nil, false
}

func (h *alertWebhook) String() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var s []string
	for _, a := range h.got {
		s = append(s, fmt.Sprintf("%s %s %v", a.at.Format("15:04:05.0"), a.Status, a.Labels))
	}
	return "[" + strings.Join(s, "; ") + "]"
}

// traffic dials one connection per family every trafficPeriod until
// stopped, and keeps each outcome.
type traffic struct {
	mu       sync.Mutex
	outcomes []dialOutcome
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

// trafficPeriod paces the traffic: a few connections a second per family,
// so that the counters the rules watch grow at every scrape.
const trafficPeriod = 250 * time.Millisecond

// trafficDialTimeout bounds a dial of the traffic: what does not answer
// within it counts as refused. Longer than labDial's 700 ms, which a
// loaded 2-core machine exceeded once for an allowed connection; a
// refused dial costs it, so the denied family still makes a connection
// every 2.25 s, several in each of the rule's 20 s windows.
const trafficDialTimeout = 2 * time.Second

type dialOutcome struct {
	family   corev1.IPFamily
	at       time.Time
	answered bool
}

// startTraffic dials from → to:8080/tcp in each family, every
// trafficPeriod, until stop (or the test's end).
func startTraffic(t *testing.T, l *lab.Lab, from, to *corev1.Pod, fams []corev1.IPFamily) *traffic {
	c, cancel := context.WithCancel(context.Background())
	tr := &traffic{cancel: cancel}
	for _, f := range fams {
		a, ok := manifest.PodAddr(to, f)
		if !ok {
			t.Fatalf("pod %s has no %s address", to.Name, f)
		}
		dst := netip.AddrPortFrom(a, manifest.PortHTTP)
		tr.wg.Go(func() {
			tick := time.NewTicker(trafficPeriod)
			defer tick.Stop()
			for {
				_, err := agent.Dial(c, l.PodNetNSPath(from), agent.TCP, dst, trafficDialTimeout)
				if c.Err() != nil {
					return
				}
				if err != nil && !errors.Is(err, agent.ErrNoAnswer) {
					t.Errorf("dial %s: %v", dst, err)
					return
				}
				tr.mu.Lock()
				tr.outcomes = append(tr.outcomes, dialOutcome{f, time.Now(), err == nil})
				tr.mu.Unlock()
				select {
				case <-c.Done():
					return
				case <-tick.C:
				}
			}
		})
	}
	t.Cleanup(tr.stop)
	return tr
}

func (tr *traffic) stop() { tr.cancel(); tr.wg.Wait() }

// count counts the outcomes since t that answered (or not).
func (tr *traffic) count(since time.Time, answered bool) map[corev1.IPFamily]int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := map[corev1.IPFamily]int{}
	for _, o := range tr.outcomes {
		if !o.at.Before(since) && o.answered == answered {
			out[o.family]++
		}
	}
	return out
}

func (tr *traffic) failedSince(t time.Time) map[corev1.IPFamily]int   { return tr.count(t, false) }
func (tr *traffic) answeredSince(t time.Time) map[corev1.IPFamily]int { return tr.count(t, true) }

// firstFailure is how long after since the first connection of f failed.
func (tr *traffic) firstFailure(f corev1.IPFamily, since time.Time) time.Duration {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, o := range tr.outcomes {
		if o.family == f && !o.answered && !o.at.Before(since) {
			return o.at.Sub(since)
		}
	}
	return -1
}

func (tr *traffic) String() string {
	return fmt.Sprintf("answered %v, failed %v", tr.answeredSince(time.Time{}), tr.failedSince(time.Time{}))
}
