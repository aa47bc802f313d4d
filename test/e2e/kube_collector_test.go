package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/test/kubeapi"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/web/api"
)

// reflectBudget bounds the time from an API change to the collector's
// REST answers reflecting it. Informer events arrive in milliseconds and
// the cluster view is rebuilt at most once a second (collector.Inventory);
// the bound is generous for a loaded 2-core machine.
const reflectBudget = 30 * time.Second

// kubeReflect collects, per mode and change, the time from an API change
// to the REST API reflecting it, for the summary.
var kubeReflect = struct {
	sync.Mutex
	lines []string
}{}

// TestKubeCollector runs the product as on a cluster, in each lab mode:
// the lab's objects are published into a real kube-apiserver, `dualflow
// collector` (the binary) watches them with --k8s.source kubeconfig under
// a ServiceAccount bound to exactly collector/enrich/rbac.yaml (a
// TokenRequest token), the lab's exporters send it the nodes' conntrack
// while the lab's traffic runs, and the collector's own REST API is
// checked: flows of each family enriched and correlated, the reachability
// matrix per family, the audit findings (the dual-stack gap in dual
// mode). Then the cluster changes through the API while traffic runs: an
// EndpointSlice is deleted and recreated, a Service flips dual → IPv4 →
// dual, a pod is replaced by another on its addresses, a NetworkPolicy is
// edited to close the IPv6 gap. Each change must show in the REST answers
// within reflectBudget, and the rows of flows that start after that carry
// the current names and verdicts (checked through SQL).
func TestKubeCollector(t *testing.T) {
	requirePrereqs(t)
	requireKubeAPI(t)
	t.Parallel() // each mode its own lab, API server and collector process
	bin := buildBinary(t)
	orders := map[manifest.Mode]lab.PublishOrder{manifest.ModeIPv4: lab.OrderReverse, manifest.ModeIPv6: lab.OrderRandom, manifest.ModeDual: lab.OrderForward}
	t.Cleanup(func() {
		kubeReflect.Lock()
		defer kubeReflect.Unlock()
		for _, l := range kubeReflect.lines {
			t.Log(l)
		}
	})
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			k := newKubeEnv(t, mode, bin, orders[mode])
			steps := []struct {
				name string
				fn   func(*testing.T)
			}{
				{"UI served", k.checkUI},
				{"flows enriched and correlated", k.checkFlows},
				{"a namespace's user reads its flows only", k.checkNamespaceUser},
				{"reachability per family", func(t *testing.T) { k.checkReachability(t, manifest.PortMetrics, k.metricsVerdicts()) }},
				{"audit findings", k.checkFindings},
				{"CLI against the collector", func(t *testing.T) { k.checkCLI(t, bin) }},
				{"traceflow through the node agents", k.checkTraceflow},
				{"EndpointSlice recreated", k.churnEndpointSlice},
				{"Service dual to IPv4 to dual", k.churnServiceFamilies},
				{"pod replaced on its addresses", k.churnPodReplaced},
				{"NetworkPolicy closes the IPv6 gap", k.churnPolicy},
				{"API server outage, then a pod replaced", k.apiOutage},
			}
			for _, s := range steps {
				if s.name == "Service dual to IPv4 to dual" && mode != manifest.ModeDual {
					continue // a single-family Service has no family to drop
				}
				// Each step builds on the previous ones: stop at a failure.
				if !t.Run(s.name, func(t *testing.T) { record(t, mode); s.fn(t) }) {
					return
				}
			}
		})
	}
}

// kubeEnv is one mode's lab, API server and collector process.
type kubeEnv struct {
	mode    manifest.Mode
	l       *lab.Lab
	kube    *kubeapi.Server
	web     string // the collector's web base URL, "http://host:port"
	metrics string // its metrics URL
	fams    []corev1.IPFamily
	web1    *corev1.Pod // the traffic's main source pod
	apiN    *corev1.Pod // backend/api on the last node
}

func newKubeEnv(t *testing.T, mode manifest.Mode, bin string, order lab.PublishOrder) *kubeEnv {
	k := &kubeEnv{mode: mode, fams: mode.Families()}
	k.l = startTrafficLab(t, mode)
	k.kube = startKubeAPI(t)
	publish(t, k.kube, k.l.Manifest, order, uint64(time.Now().UnixNano()))
	kc := collectorKubeconfig(t, k.kube)
	// The web as on a cluster: a tokens file (the test's operator) and
	// the cluster's users (the collector bound to auth-delegator).
	rbac, err := os.ReadFile(kubeAuthRBACPath)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.kube.Apply(ctx, rbac); err != nil {
		t.Fatal(err)
	}
	tokens, opToken := writeOperatorTokens(t)
	agents := bindNodeAgents(t, k.l)
	p := startCollectorProcess(t, bin, mode, kc, "--traceflow.token-file", agents.tokenFile, "--traceflow.agents", agents.flag(),
		"--web.tokens-file", tokens, "--web.kubernetes-auth")
	k.web, k.metrics = p.web, p.metrics
	registerOperator(t, p.web, opToken)
	for _, n := range k.l.Manifest.Nodes {
		startExporter(t, k.l, mode, n.Name, p.ipfix, agents)
	}
	if k.web1, err = k.l.PodOn(manifest.NSFrontend, "web", 1); err != nil {
		t.Fatal(err)
	}
	if k.apiN, err = k.l.PodOn(manifest.NSBackend, "api", len(k.l.Manifest.Nodes)); err != nil {
		t.Fatal(err)
	}
	return k
}

// startTrafficLab is startLab with the lab's traffic generator running.
func startTrafficLab(t *testing.T, mode manifest.Mode) *lab.Lab {
	t.Helper()
	prefix := labPrefix()
	stateDir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := lab.Up(ctx, lab.Config{Mode: mode, Prefix: prefix, StateDir: stateDir, Traffic: true, TrafficInterval: 500 * time.Millisecond})
	t.Cleanup(func() {
		if l != nil {
			l.Close()
		}
		if err := lab.Down(stateDir, prefix); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	if err != nil {
		t.Fatalf("lab up (%s): %v", mode, err)
	}
	return l
}

// collectorProcess is a running `dualflow collector`.
type collectorProcess struct {
	web, metrics, ipfix string
	dataDir             string
}

// logAddr finds the addresses the collector logs as it starts.
var (
	logWebURL   = regexp.MustCompile(`serving the web UI and API.* url=(https?://[^ ]+)/`)
	logMetrics  = regexp.MustCompile(`serving metrics.* url=(http://[^ ]+)/metrics`)
	logIPFIXTCP = regexp.MustCompile(`receiving IPFIX transport=tcp addr=([^ ]+)`)
)

// startCollectorProcess runs the collector binary as an operator would
// on a cluster, with every listener on a free loopback port, and stops
// it (SIGTERM: it must exit cleanly) when the test ends.
func startCollectorProcess(t *testing.T, bin string, mode manifest.Mode, kubeconfig string, extra ...string) *collectorProcess {
	t.Helper()
	dir := t.TempDir()
	listen := "[::1]:0"
	if mode == manifest.ModeIPv4 {
		listen = "127.0.0.1:0"
	}
	cmd := exec.Command(bin, "collector",
		"--k8s.source", "kubeconfig", "--k8s.kubeconfig", kubeconfig,
		"--clickhouse.data-dir", filepath.Join(dir, "data"),
		"--clickhouse.http-addr", "127.0.0.1:0",
		"--clickhouse.flush-interval", "200ms",
		"--metrics-addr", "127.0.0.1:0",
		"--web.addr", "127.0.0.1:0",
		"--collector.ipfix.tcp-addr", listen,
		"--collector.ipfix.udp-addr", "",
		"--collector.correlate.timeout", "3s",
		"--audit.refresh", "1s",
	)
	cmd.Args = append(cmd.Args, extra...)
	logPath := filepath.Join(dir, "collector.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = logFile, io.MultiWriter(logFile, pw)
	if err := kubeapi.StartTied(cmd); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait(); pw.Close() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("collector exited with %v after SIGTERM; log %s", err, logPath)
			}
		case <-time.After(90 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("collector did not stop within 90 s of SIGTERM; log %s", logPath)
		}
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 8000 {
				b = b[len(b)-8000:]
			}
			t.Logf("collector log (end):\n%s", b)
		}
	})
	p := &collectorProcess{dataDir: filepath.Join(dir, "data")}
	found := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			if m := logWebURL.FindStringSubmatch(line); m != nil {
				p.web = m[1]
			}
			if m := logMetrics.FindStringSubmatch(line); m != nil {
				p.metrics = m[1] + "/metrics"
			}
			if m := logIPFIXTCP.FindStringSubmatch(line); m != nil {
				p.ipfix = m[1]
			}
			if p.web != "" && p.metrics != "" && p.ipfix != "" && found != nil {
				close(found)
				found = nil
			}
		}
		io.Copy(io.Discard, pr)
	}()
	select {
	case <-found:
	case err := <-exited:
		b, _ := os.ReadFile(logPath)
		t.Fatalf("collector exited at start: %v\n%s", err, b)
	case <-time.After(3 * time.Minute):
		b, _ := os.ReadFile(logPath)
		t.Fatalf("collector did not log its addresses within 3 minutes:\n%s", b)
	}
	return p
}

// rest calls the collector's REST API and decodes a 200 answer.
func (k *kubeEnv) rest(t *testing.T, method, path string, body, out any) {
	t.Helper()
	if err := k.restErr(method, path, body, out); err != nil {
		t.Fatal(err)
	}
}

func (k *kubeEnv) restErr(method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, k.web+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	authorize(req)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, b)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("%s %s: %v: %s", method, path, err, b)
	}
	return nil
}

// sql runs a query through POST /api/v1/sql and returns its rows.
func (k *kubeEnv) sql(t *testing.T, q string) [][]any {
	t.Helper()
	var res api.SQLResult
	k.rest(t, http.MethodPost, "/api/v1/sql", api.SQLRequest{Query: q}, &res)
	return res.Rows
}

// await polls cond (every 250 ms) until it holds or the budget ends; it
// returns how long that took.
func await(t testing.TB, budget time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	var last string
	for {
		ok, state := cond()
		if ok {
			return time.Since(start)
		}
		last = state
		if time.Since(start) > budget {
			t.Fatalf("%s: not within %v (last: %s)", what, budget, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func famVersion(f corev1.IPFamily) int {
	if f == corev1.IPv6Protocol {
		return 6
	}
	return 4
}

// checkUI: the collector serves the browser UI and its assets.
func (k *kubeEnv) checkUI(t *testing.T) {
	for path, want := range map[string]string{"/": "<title>dualflow</title>", "/app.js": "/api/v1", "/style.css": "{"} {
		resp, err := http.Get(k.web + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("GET %s: %s, %d bytes, want %q in it", path, resp.Status, len(b), want)
		}
	}
}

// checkFlows waits for enriched flows of each family through /flows, and
// for correlated rows through SQL.
func (k *kubeEnv) checkFlows(t *testing.T) {
	for _, f := range k.fams {
		v := famVersion(f)
		q := url.Values{"ip_version": {fmt.Sprint(v)}, "src_pod": {ref(k.web1)}, "limit": {"1000"}}
		await(t, 2*time.Minute, fmt.Sprintf("IPv%d flows of %s enriched", v, ref(k.web1)), func() (bool, string) {
			var res api.FlowPage
			if err := k.restErr(http.MethodGet, "/api/v1/flows?"+q.Encode(), nil, &res); err != nil {
				return false, err.Error()
			}
			var toPod, toService bool
			for _, fl := range res.Flows {
				if fl.SrcWorkload != "web" || fl.SrcKind != "Deployment" || fl.SrcNode != "node-1" {
					return false, fmt.Sprintf("source %+v", fl)
				}
				if fl.DstNamespace == manifest.NSBackend && fl.DstWorkload == "api" && fl.DstNode != "" {
					toPod = true
					toService = toService || fl.SvcName == manifest.ServiceAPI
				}
			}
			return toPod && toService, fmt.Sprintf("%d flows, to api %v, through the Service %v", len(res.Flows), toPod, toService)
		})
		await(t, time.Minute, fmt.Sprintf("IPv%d rows merged across nodes", v), func() (bool, string) {
			rows := k.sql(t, fmt.Sprintf(`SELECT count() FROM dualflow.flows WHERE ip_version = %d AND correlation = 'merged'
				AND src_pod_name = '%s' AND dst_node = '%s' AND dst_workload_name = 'api'`, v, k.web1.Name, k.apiN.Spec.NodeName))
			return len(rows) == 1 && fmt.Sprint(rows[0][0]) != "0", fmt.Sprint(rows)
		})
	}
}

// metricsVerdicts is the policy verdict per family of web@1 → api@N on
// the metrics port, as the lab's policies decide: allowed over IPv4,
// denied over IPv6 (the dual-stack gap).
func (k *kubeEnv) metricsVerdicts() map[string]string {
	out := map[string]string{}
	for _, f := range k.fams {
		if f == corev1.IPv4Protocol {
			out["4"] = "allow"
		} else {
			out["6"] = "deny"
		}
	}
	return out
}

// reachability asks the matrix web@1 → api@N on port.
func (k *kubeEnv) reachability(src *corev1.Pod, port uint16) (*api.Reachability, error) {
	var res api.Reachability
	err := k.restErr(http.MethodPost, "/api/v1/reachability", api.ReachabilityRequest{
		Sources:      []audit.Endpoint{{Kind: "pod", Namespace: src.Namespace, Name: src.Name}},
		Destinations: []audit.Endpoint{{Kind: "pod", Namespace: k.apiN.Namespace, Name: k.apiN.Name}},
		Protocol:     "tcp", Port: port, Since: "10m",
	}, &res)
	return &res, err
}

// cellState renders a cell's families: outcome, policy verdict and
// observed flows.
func cellState(c api.Cell) string {
	var b strings.Builder
	for _, fam := range []string{"4", "6"} {
		f := c.Families[fam]
		fmt.Fprintf(&b, "IPv%s %s (policy %+v, err %q, observed %d) ", fam, f.Outcome, f.Policy, f.PolicyError, f.Observed.Flows)
	}
	return b.String()
}

// checkReachability waits for the matrix to give want per family ("4",
// "6"; absent families unavailable), with traffic observed in each.
func (k *kubeEnv) checkReachability(t *testing.T, port uint16, want map[string]string) time.Duration {
	return await(t, reflectBudget, fmt.Sprintf("reachability %s -> %s:%d %v", ref(k.web1), ref(k.apiN), port, want), func() (bool, string) {
		res, err := k.reachability(k.web1, port)
		if err != nil {
			return false, err.Error()
		}
		c := res.Cells[0][0]
		for _, fam := range []string{"4", "6"} {
			f := c.Families[fam]
			w, ok := want[fam]
			if !ok {
				w = "unavailable"
			}
			if f.Outcome != w || (ok && f.Observed.Flows == 0) {
				return false, cellState(c)
			}
		}
		if len(want) == 2 && !c.Asymmetric && want["4"] != want["6"] {
			return false, "not marked asymmetric: " + cellState(c)
		}
		return true, ""
	})
}

// findings reads the collector's audit findings.
func (k *kubeEnv) findings() ([]audit.Finding, error) {
	var res audit.FindingsResponse
	if err := k.restErr(http.MethodGet, "/api/v1/audit/findings?since=10m", nil, &res); err != nil {
		return nil, err
	}
	if res.ObservedError != "" {
		return nil, fmt.Errorf("observed findings: %s", res.ObservedError)
	}
	return res.Findings, nil
}

// hasFinding reports whether fs has a finding of kind whose objects
// include ref ("Kind ns/name", followed by a rule or nothing).
func hasFinding(fs []audit.Finding, kind, ref string) bool {
	for _, f := range fs {
		if f.Kind != kind {
			continue
		}
		for _, o := range f.Objects {
			if s := o.String(); s == ref || strings.HasPrefix(s, ref+" ") {
				return true
			}
		}
	}
	return false
}

func kinds(fs []audit.Finding) string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Kind)
	}
	return strings.Join(out, ",")
}

var metricsPolicyRef = "NetworkPolicy " + manifest.NSBackend + "/" + manifest.PolicyMetricsIPv4

// checkFindings: the dual-stack gap of the metrics policy in dual mode,
// no dual-stack finding in single-family modes.
func (k *kubeEnv) checkFindings(t *testing.T) {
	await(t, reflectBudget, "audit findings", func() (bool, string) {
		fs, err := k.findings()
		if err != nil {
			return false, err.Error()
		}
		var dual int
		for _, f := range fs {
			if f.DualStack() {
				dual++
			}
		}
		if k.mode != manifest.ModeDual {
			return dual == 0, kinds(fs)
		}
		return hasFinding(fs, audit.KindVerdictGap, metricsPolicyRef) && hasFinding(fs, audit.KindIPBlockOneFamily, metricsPolicyRef) &&
			hasFinding(fs, audit.KindServiceSingleStack, "Service backend/"+manifest.ServiceAPISingle), kinds(fs)
	})
}

// checkCLI runs the CLI clients against the collector's REST API
// (--server), as an operator would against a deployed collector.
func (k *kubeEnv) checkCLI(t *testing.T, bin string) {
	tok, err := os.ReadFile(operatorTokenFile(k.web))
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) ([]byte, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), "DUALFLOW_TOKEN="+strings.TrimSpace(string(tok)))
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return append(out, stderr.Bytes()...), err
		}
		return out, nil
	}
	out, err := run("audit", "findings", "--server", k.web, "--dual-stack", "--json")
	if err != nil {
		t.Fatalf("audit findings --server: %v\n%s", err, out)
	}
	var fs []audit.Finding
	if err := json.Unmarshal(out, &fs); err != nil {
		t.Fatalf("audit findings --json: %v\n%s", err, out)
	}
	if got := hasFinding(fs, audit.KindVerdictGap, metricsPolicyRef); got != (k.mode == manifest.ModeDual) {
		t.Errorf("audit findings --server --dual-stack in %s mode: metrics gap %v (%s)", k.mode, got, kinds(fs))
	}
	// The lab's traffic has denied flows; the first ones are exported
	// once their connection attempt is idle.
	await(t, time.Minute, "audit denied --server", func() (bool, string) {
		out, err := run("audit", "denied", "--server", k.web, "--since", "10m", "--json")
		if err != nil {
			t.Fatalf("audit denied --server: %v\n%s", err, out)
		}
		var gs []audit.DeniedGroup
		if err := json.Unmarshal(out, &gs); err != nil {
			t.Fatalf("audit denied --server --json: %v\n%s", err, out)
		}
		return len(gs) > 0, string(out)
	})
	out, err = run("audit", "eval", "--server", k.web, "--from", ref(k.web1), "--to", ref(k.apiN), "--port", "9090")
	if err != nil || !strings.Contains(string(out), "9090/TCP") {
		t.Errorf("audit eval --server: %v\n%s", err, out)
	}
	// Through the node agents: every family of the mode delivered (exit 0).
	out, err = run("trace", "--server", k.web, "--token-file", operatorTokenFile(k.web), "-s", ref(k.web1), "-d", "svc:backend/api:80", "--family", string(k.mode), "--timeout", "10s")
	if err != nil || strings.Count(string(out), "=> DELIVERED") != len(k.fams) {
		t.Errorf("trace --server: %v\n%s", err, out)
	}
}

// reflected records how long the REST API took to show a change.
func (k *kubeEnv) reflected(t *testing.T, change string, d time.Duration) {
	t.Logf("%s: REST reflected the change in %v", change, d.Round(time.Millisecond))
	kubeReflect.Lock()
	defer kubeReflect.Unlock()
	kubeReflect.lines = append(kubeReflect.lines, fmt.Sprintf("%-5s %-45s reflected in %v", k.mode, change, d.Round(time.Millisecond)))
}

// since is a SQL condition on flows that started after t.
func since(t time.Time) string {
	return fmt.Sprintf("flow_start > fromUnixTimestamp64Milli(%d)", t.UnixMilli())
}

// awaitRows waits until the query (a count of matching rows, then a count
// of wrong ones) gives at least one matching row and no wrong one.
func (k *kubeEnv) awaitRows(t *testing.T, what, match, wrong string) {
	t.Helper()
	await(t, 2*time.Minute, what, func() (bool, string) {
		rows := k.sql(t, fmt.Sprintf("SELECT countIf(%s), countIf(%s) FROM dualflow.flows", match, wrong))
		if len(rows) != 1 {
			return false, fmt.Sprint(rows)
		}
		good, bad := fmt.Sprint(rows[0][0]), fmt.Sprint(rows[0][1])
		if bad != "0" {
			t.Fatalf("%s: %s rows written after the change carry stale names or verdicts (%s right)", what, bad, good)
		}
		return good != "0", good + " rows"
	})
}

// objectCount reads dualflow_enrich_objects{kind} from the metrics.
func (k *kubeEnv) objectCount(kind string) (string, error) {
	resp, err := http.Get(k.metrics)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	prefix := `dualflow_enrich_objects{kind="` + kind + `"} `
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), prefix); ok {
			return v, nil
		}
	}
	return "", fmt.Errorf("no %s in %s", prefix, k.metrics)
}

func kctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// churnEndpointSlice deletes the api Service's EndpointSlice of the
// mode's last family and creates it again: once the collector has the new
// slice, flows to the Service in that family name the Service, its port
// and the endpoint pod.
func (k *kubeEnv) churnEndpointSlice(t *testing.T) {
	f := k.fams[len(k.fams)-1]
	var slice *discoveryv1.EndpointSlice
	for i := range k.l.Manifest.EndpointSlices {
		s := &k.l.Manifest.EndpointSlices[i]
		if s.Namespace == manifest.NSBackend && s.Labels[manifest.LabelServiceName] == manifest.ServiceAPI && string(s.AddressType) == string(f) {
			slice = s
		}
	}
	if slice == nil {
		t.Fatalf("no %s EndpointSlice of backend/api", f)
	}
	c := k.kube.Admin.DiscoveryV1().EndpointSlices(manifest.NSBackend)
	before, err := k.objectCount("endpointslice")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(kctx(t), slice.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	await(t, reflectBudget, "EndpointSlice deletion seen", func() (bool, string) {
		n, err := k.objectCount("endpointslice")
		return err == nil && n != before, n
	})
	created := slice.DeepCopy()
	created.UID, created.ResourceVersion, created.GenerateName = "", "", ""
	if _, err := c.Create(kctx(t), created, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	await(t, reflectBudget, "EndpointSlice recreation seen", func() (bool, string) {
		n, err := k.objectCount("endpointslice")
		return err == nil && n == before, n
	})
	k.reflected(t, fmt.Sprintf("%s EndpointSlice deleted and recreated", f), time.Since(start))
	after := time.Now()
	v := famVersion(f)
	cond := fmt.Sprintf("ip_version = %d AND src_pod_name = '%s' AND service_port = %d AND protocol = 6 AND %s",
		v, k.web1.Name, manifest.ServicePortHTTP, since(after))
	k.awaitRows(t, fmt.Sprintf("IPv%d flows to the Service after the slice came back", v),
		cond+" AND dst_service_name = 'api' AND dst_service_port_name = 'http' AND dst_workload_name = 'api'",
		cond+" AND (dst_service_name != 'api' OR dst_workload_name != 'api')")
}

// churnServiceFamilies flips backend/api from dual-stack to single-stack
// IPv4 and back: the audit says the single-stack Service hides its
// dual-stack pods while it is IPv4 only, and IPv6 flows to its old IPv6
// ClusterIP (which the lab's datapath still translates) are no longer
// named after it; back to dual-stack, they are again.
func (k *kubeEnv) churnServiceFamilies(t *testing.T) {
	c := k.kube.Admin.CoreV1().Services(manifest.NSBackend)
	svc, err := c.Get(kctx(t), manifest.ServiceAPI, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dualIPs, dualFams, dualPolicy := svc.Spec.ClusterIPs, svc.Spec.IPFamilies, svc.Spec.IPFamilyPolicy
	single := corev1.IPFamilyPolicySingleStack
	svc.Spec.IPFamilyPolicy = &single
	svc.Spec.IPFamilies = []corev1.IPFamily{corev1.IPv4Protocol}
	svc.Spec.ClusterIPs = dualIPs[:1]
	if _, err := c.Update(kctx(t), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	d := await(t, reflectBudget, "single-stack Service finding", func() (bool, string) {
		fs, err := k.findings()
		if err != nil {
			return false, err.Error()
		}
		return hasFinding(fs, audit.KindServiceSingleStack, "Service backend/"+manifest.ServiceAPI), kinds(fs)
	})
	k.reflected(t, "Service dual -> single-stack IPv4", d)
	// The VIP has no new holder: flows that start within the enrichment's
	// clock-skew allowance after the change still resolve to the Service.
	after := start.Add(d + enrich.ClockSkew)
	cond := fmt.Sprintf("ip_version = 6 AND src_pod_name = '%s' AND service_port = %d AND protocol = 6 AND %s", k.web1.Name, manifest.ServicePortHTTP, since(after))
	k.awaitRows(t, "IPv6 flows to the former IPv6 ClusterIP, Service single-stack",
		cond+" AND dst_service_name = '' AND dst_workload_name = 'api'", cond+" AND dst_service_name != ''")

	svc, err = c.Get(kctx(t), manifest.ServiceAPI, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	svc.Spec.IPFamilyPolicy, svc.Spec.IPFamilies, svc.Spec.ClusterIPs = dualPolicy, dualFams, dualIPs
	if _, err := c.Update(kctx(t), svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	d = await(t, reflectBudget, "single-stack Service finding gone", func() (bool, string) {
		fs, err := k.findings()
		if err != nil {
			return false, err.Error()
		}
		return !hasFinding(fs, audit.KindServiceSingleStack, "Service backend/"+manifest.ServiceAPI), kinds(fs)
	})
	k.reflected(t, "Service single-stack IPv4 -> dual", d)
	after = start.Add(d)
	cond = fmt.Sprintf("ip_version = 6 AND src_pod_name = '%s' AND service_port = %d AND protocol = 6 AND %s", k.web1.Name, manifest.ServicePortHTTP, since(after))
	k.awaitRows(t, "IPv6 flows to the Service, dual-stack again",
		cond+" AND dst_service_name = 'api' AND dst_service_port_name = 'http'", cond+" AND dst_service_name != 'api'")
}

// churnPodReplaced deletes web@1 (the traffic's source) and creates
// another pod on its node and addresses: once the REST view resolves the
// new pod to its addresses, every flow from them names the new pod.
func (k *kubeEnv) churnPodReplaced(t *testing.T) {
	repl, start, d := k.replaceWeb1(t, "web-replaced", "replacement pod resolved")
	k.reflected(t, "pod replaced on the same addresses", d)
	after := start.Add(d)
	for _, f := range k.fams {
		a, _ := manifest.PodAddr(k.web1, f)
		cond := fmt.Sprintf("src_ip = '%s' AND %s", ipString(a), since(after))
		k.awaitRows(t, fmt.Sprintf("IPv%d flows from the replaced pod's address", famVersion(f)),
			cond+" AND src_pod_name = 'web-replaced' AND src_workload_name = 'web'", cond+" AND src_pod_name != 'web-replaced'")
	}
	k.web1 = repl
}

// replaceWeb1 deletes web@1 and creates a pod named name on its node and
// addresses, and waits until the REST view resolves the new pod's
// addresses in every family. It returns the pod, when it was created, and
// how long the REST view took.
func (k *kubeEnv) replaceWeb1(t *testing.T, name, what string) (*corev1.Pod, time.Time, time.Duration) {
	c := k.kube.Admin.CoreV1().Pods(manifest.NSFrontend)
	zero := int64(0)
	if err := c.Delete(kctx(t), k.web1.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	repl := k.web1.DeepCopy()
	repl.Name = name
	start := time.Now()
	if err := lab.CreatePod(kctx(t), k.kube.Admin, repl); err != nil {
		t.Fatal(err)
	}
	d := await(t, reflectBudget, what, func() (bool, string) {
		res, err := k.reachability(repl, manifest.PortHTTP)
		if err != nil {
			return false, err.Error()
		}
		c := res.Cells[0][0]
		for _, f := range k.fams {
			a, _ := manifest.PodAddr(repl, f)
			if p := c.Families[fmt.Sprint(famVersion(f))].Policy; p == nil || p.SrcIP != a.String() {
				return false, cellState(c)
			}
		}
		return true, ""
	})
	return repl, start, d
}

// outageLength is how long the API server stays down in apiOutage (the
// issue saw 13 s), and staleBound how soon after it is back a change must
// show in the rows: the collector retries an unreachable API server every
// second, where client-go's own backoff had grown to many seconds.
const (
	outageLength = 15 * time.Second
	staleBound   = 6 * time.Second
)

// apiOutage kills the API server (SIGKILL) while traffic flows: the
// collector says its view is stale (metrics, /readyz) and marks the rows
// it writes meanwhile. The API server comes back after outageLength and a
// pod is at once replaced by another on its addresses: rows of flows that
// start staleBound after the replacement name the new pod, and rows
// received after that are no longer marked stale (issue 24).
func (k *kubeEnv) apiOutage(t *testing.T) {
	if v, _ := k.metric(`dualflow_enrich_view_stale`); v != 0 {
		t.Fatalf("view stale before the outage")
	}
	killed := time.Now()
	k.kube.Kill()
	t.Logf("API server killed")
	d := await(t, time.Minute, "the collector says its view is stale", func() (bool, string) {
		v, err := k.metric(`dualflow_enrich_view_stale`)
		return v == 1, fmt.Sprint(v, err)
	})
	t.Logf("stale flagged %v after the kill", d.Round(time.Millisecond))
	if body := k.readyz(t); !strings.Contains(body, "warning: kubernetes view stale") || !strings.Contains(body, "pod") {
		t.Errorf("/readyz during the outage: %q", body)
	}
	if n, err := k.metric(`dualflow_enrich_watch_errors_total{kind="pod",reason="refused"}`); err != nil || n < 1 {
		t.Errorf("refused pod watches counted %v (%v)", n, err)
	}
	k.awaitCount(t, "rows marked k8s_view_stale during the outage",
		fmt.Sprintf("k8s_view_stale AND time_received > fromUnixTimestamp64Milli(%d)", killed.UnixMilli()))
	await(t, time.Minute, "an outage of "+outageLength.String(), func() (bool, string) {
		v, err := k.metric(`dualflow_enrich_view_stale_seconds{kind="pod"}`)
		return v >= outageLength.Seconds(), fmt.Sprint(v, err)
	})

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := k.kube.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("API server back after %v", back.Sub(killed).Round(time.Millisecond))
	repl, changed, d := k.replaceWeb1(t, "web-after-outage", "replacement pod resolved after the outage")
	k.reflected(t, "pod replaced right after an API outage", d)
	if d > staleBound {
		t.Errorf("the replacement took %v to show, over the %v bound", d.Round(time.Millisecond), staleBound)
	}
	for _, f := range k.fams {
		a, _ := manifest.PodAddr(k.web1, f)
		cond := fmt.Sprintf("src_ip = '%s' AND %s", ipString(a), since(changed.Add(staleBound)))
		k.awaitRows(t, fmt.Sprintf("IPv%d flows from the replaced pod's address after the outage", famVersion(f)),
			cond+" AND src_pod_name = 'web-after-outage' AND NOT k8s_view_stale", cond+" AND (src_pod_name != 'web-after-outage' OR k8s_view_stale)")
	}
	k.web1 = repl
	if v, err := k.metric(`dualflow_enrich_view_stale`); v != 0 || err != nil {
		t.Errorf("view still stale after the outage: %v %v", v, err)
	}
	if body := k.readyz(t); strings.Contains(body, "warning") {
		t.Errorf("/readyz after the outage: %q", body)
	}
	late := fmt.Sprintf("k8s_view_stale AND time_received > fromUnixTimestamp64Milli(%d)", back.Add(staleBound).UnixMilli())
	if rows := k.sql(t, "SELECT count() FROM dualflow.flows WHERE "+late); len(rows) != 1 || fmt.Sprint(rows[0][0]) != "0" {
		t.Errorf("rows received %v after the API server came back still marked stale: %v", staleBound, rows)
	}
}

// metric reads one sample of the collector's metrics: the line that
// starts with series followed by a space.
func (k *kubeEnv) metric(series string) (float64, error) {
	resp, err := http.Get(k.metrics)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			return strconv.ParseFloat(v, 64)
		}
	}
	return 0, fmt.Errorf("no %s in %s", series, k.metrics)
}

// readyz returns the body of the collector's /readyz (next to /metrics).
func (k *kubeEnv) readyz(t *testing.T) string {
	t.Helper()
	resp, err := http.Get(strings.TrimSuffix(k.metrics, "/metrics") + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/readyz: %d %s", resp.StatusCode, b)
	}
	return string(b)
}

// awaitCount waits until some row of flows matches cond.
func (k *kubeEnv) awaitCount(t *testing.T, what, cond string) {
	t.Helper()
	await(t, 2*time.Minute, what, func() (bool, string) {
		rows := k.sql(t, "SELECT count() FROM dualflow.flows WHERE "+cond)
		if len(rows) != 1 {
			return false, fmt.Sprint(rows)
		}
		n := fmt.Sprint(rows[0][0])
		return n != "0", n + " rows"
	})
}

// churnPolicy gives backend/allow-metrics-ipv4-only the IPv6 block it
// lacks (in the API server and in the lab's datapath): the dual-stack gap
// findings go, the matrix says IPv6 allow, and IPv6 metrics flows are
// written allowed.
func (k *kubeEnv) churnPolicy(t *testing.T) {
	var np *networkingv1.NetworkPolicy
	for i := range k.l.Manifest.NetworkPolicies {
		if p := &k.l.Manifest.NetworkPolicies[i]; p.Namespace == manifest.NSBackend && p.Name == manifest.PolicyMetricsIPv4 {
			np = p
		}
	}
	if np == nil {
		t.Fatal("no metrics policy in the lab")
	}
	n := len(k.l.Manifest.Nodes)
	v6 := networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "fd00:10::/56",
		Except: []string{manifest.PodCIDRFor(n, corev1.IPv6Protocol).String()}}}
	np.Spec.Ingress[0].From = append(np.Spec.Ingress[0].From, v6)
	if err := k.l.Reload(kctx(t)); err != nil {
		t.Fatal(err)
	}
	c := k.kube.Admin.NetworkingV1().NetworkPolicies(manifest.NSBackend)
	cur, err := c.Get(kctx(t), np.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Spec = *np.Spec.DeepCopy()
	if _, err := c.Update(kctx(t), cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	want := k.metricsVerdicts()
	if _, ok := want["6"]; ok {
		want["6"] = "allow"
	}
	d := k.checkReachability(t, manifest.PortMetrics, want)
	if k.mode == manifest.ModeDual {
		d = await(t, reflectBudget, "dual-stack gap findings gone", func() (bool, string) {
			fs, err := k.findings()
			if err != nil {
				return false, err.Error()
			}
			return !hasFinding(fs, audit.KindVerdictGap, metricsPolicyRef) && !hasFinding(fs, audit.KindIPBlockOneFamily, metricsPolicyRef), kinds(fs)
		})
		d = time.Since(start)
	}
	k.reflected(t, "NetworkPolicy edited to cover IPv6", d)
	if !k.mode.Has(corev1.IPv6Protocol) {
		return
	}
	after := start.Add(d)
	a, _ := manifest.PodAddr(k.apiN, corev1.IPv6Protocol)
	cond := fmt.Sprintf("ip_version = 6 AND src_pod_name = '%s' AND dst_ip = '%s' AND dst_port = %d AND protocol = 6 AND %s",
		k.web1.Name, a, manifest.PortMetrics, since(after))
	k.awaitRows(t, "IPv6 metrics flows after the policy change",
		cond+" AND ingress_verdict = 'allowed' AND ingress_policy_name = '"+manifest.PolicyMetricsIPv4+"'", cond+" AND ingress_verdict != 'allowed'")
}

// nodeAgents are the loopback listeners of the exporters' traceflow
// agents, bound before the collector starts so it is given their URLs,
// and the token they share with it.
type nodeAgents struct {
	listeners map[string]net.Listener
	tokenFile string
}

func bindNodeAgents(t *testing.T, l *lab.Lab) *nodeAgents {
	t.Helper()
	a := &nodeAgents{listeners: map[string]net.Listener{}, tokenFile: filepath.Join(t.TempDir(), "traceflow-token")}
	if err := os.WriteFile(a.tokenFile, []byte(fmt.Sprintf("kube-e2e-%d\n", time.Now().UnixNano())), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Manifest.Nodes {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		a.listeners[n.Name] = ln
	}
	return a
}

// flag is the collector's --traceflow.agents value.
func (a *nodeAgents) flag() string {
	var kv []string
	for n, ln := range a.listeners {
		kv = append(kv, n+"=http://"+ln.Addr().String())
	}
	return strings.Join(kv, ",")
}

// checkTraceflow traces through the collector process's REST API, which
// resolves names in the API server's view and reaches the exporters'
// agents: a pod-to-Service probe per family with its DNAT, and a probe
// dropped by backend's default deny, named from the API server's policies.
func (k *kubeEnv) checkTraceflow(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	fam := traceflow.Family(k.mode)
	res, _, err := restTrace(ctx, k.web, traceflow.Request{Source: ref(k.web1), Destination: traceflow.Destination{Service: "backend/api", Port: 80},
		Family: fam, Timeout: traceflow.Duration(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if res.Phase != traceflow.Succeeded || len(res.Families) != len(k.fams) {
		t.Fatalf("trace to backend/api: phase %s (%s), %d families", res.Phase, res.Reason, len(res.Families))
	}
	for _, fr := range res.Families {
		lb := slices.IndexFunc(fr.Observations, func(o traceflow.Observation) bool { return o.Component == traceflow.LoadBalancing })
		if fr.Outcome != traceflow.Delivered || lb < 0 || !fr.Observations[lb].TranslatedDst.IsValid() ||
			fr.Observations[lb].TranslatedDst.Addr().Is4() != (fr.Family == traceflow.IPv4) {
			t.Errorf("%s: %s", fr.Family, dump(fr))
		}
	}
	probe, err := k.l.PodOn(manifest.NSTools, "probe", 1)
	if err != nil {
		t.Fatal(err)
	}
	res, _, err = restTrace(ctx, k.web, traceflow.Request{Source: ref(probe), Destination: traceflow.Destination{Pod: ref(k.apiN), Port: 8080},
		Family: fam, Timeout: traceflow.Duration(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	for _, fr := range res.Families {
		if fr.Outcome != traceflow.Dropped || !strings.Contains(fr.Reason, "backend/default-deny-ingress") {
			t.Errorf("%s: want dropped by backend/default-deny-ingress: %s", fr.Family, dump(fr))
		}
	}
}

// writeOperatorTokens writes a tokens file with one operator token, and
// a file of that token alone (what registerOperator reads).
func writeOperatorTokens(t *testing.T) (tokensFile, tokenFile string) {
	t.Helper()
	dir := t.TempDir()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	tok := hex.EncodeToString(b)
	tokensFile, tokenFile = filepath.Join(dir, "tokens"), filepath.Join(dir, "operator-token")
	if err := os.WriteFile(tokensFile, []byte(tok+" operator e2e-operator\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokenFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return tokensFile, tokenFile
}

// namespaceViewer is a ServiceAccount of frontend that may list pods in
// frontend only.
const namespaceViewer = `
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: e2e-pod-reader}
rules: [{apiGroups: [""], resources: [pods], verbs: [list]}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: team-viewer, namespace: frontend}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: team-viewer, namespace: frontend}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: e2e-pod-reader}
subjects: [{kind: ServiceAccount, name: team-viewer, namespace: frontend}]
`

// checkNamespaceUser: a ServiceAccount that may list pods in frontend
// only reads, with its own token, the lab's flows with an end in
// frontend, each family of the mode, backend's end of web → api reduced
// to its namespace (no pod, workload, node, address, Service name); the
// map names no backend workload; the audit is refused. The operator's
// view of the same connections names them.
func (k *kubeEnv) checkNamespaceUser(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := k.kube.Apply(ctx, []byte(namespaceViewer)); err != nil {
		t.Fatal(err)
	}
	tr, err := k.kube.Admin.CoreV1().ServiceAccounts(manifest.NSFrontend).CreateToken(ctx, "team-viewer", &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: new(int64(3600))}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	get := func(path string) (int, []byte) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.web+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+tr.Status.Token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, f := range k.fams {
		v := famVersion(f)
		q := url.Values{"ip_version": {fmt.Sprint(v)}, "since": {"10m"}, "limit": {"1000"}}
		await(t, time.Minute, fmt.Sprintf("IPv%d flows of frontend, backend's end reduced", v), func() (bool, string) {
			code, b := get("/api/v1/flows?" + q.Encode())
			if code != http.StatusOK {
				return false, fmt.Sprintf("%d %s", code, b)
			}
			var page api.FlowPage
			if err := json.Unmarshal(b, &page); err != nil {
				t.Fatal(err)
			}
			toBackend := 0
			for _, fl := range page.Flows {
				if fl.IPVersion != v {
					t.Errorf("IPv%d row in an IPv%d query: %+v", fl.IPVersion, v, fl)
				}
				mine := fl.SrcNamespace == manifest.NSFrontend || fl.DstNamespace == manifest.NSFrontend || fl.SvcNamespace == manifest.NSFrontend
				if !mine {
					t.Errorf("a row without frontend: %+v", fl)
				}
				if fl.SrcNamespace != "" && fl.SrcNamespace != manifest.NSFrontend && (fl.SrcPod != "" || fl.SrcIP != "" || fl.SrcWorkload != "" || fl.SrcNode != "") {
					t.Errorf("another namespace's source shown: %+v", fl)
				}
				if fl.DstNamespace != "" && fl.DstNamespace != manifest.NSFrontend && (fl.DstPod != "" || fl.DstIP != "" || fl.DstWorkload != "" || fl.DstNode != "" || len(fl.DstLabels) > 0) {
					t.Errorf("another namespace's destination shown: %+v", fl)
				}
				if fl.SvcNamespace == manifest.NSBackend && (fl.SvcName != "" || fl.ServiceIP != "") {
					t.Errorf("backend's Service named: %+v", fl)
				}
				if fl.SrcNamespace == manifest.NSFrontend && fl.DstNamespace == manifest.NSBackend {
					if fl.SrcPod == "" || fl.SrcIP == "" {
						t.Errorf("frontend's own end blanked: %+v", fl)
					}
					toBackend++
				}
			}
			return toBackend > 0, fmt.Sprintf("%d rows, %d frontend → backend", len(page.Flows), toBackend)
		})
	}
	code, b := get("/api/v1/servicemap?since=10m")
	if code != http.StatusOK || strings.Contains(string(b), manifest.NSBackend+"/api") || !strings.Contains(string(b), manifest.NSFrontend+"/web") {
		t.Errorf("the namespace's map: %d %s", code, b)
	}
	// The findings all of whose objects are frontend's; the audit of
	// every namespace refused.
	code, b = get("/api/v1/audit/findings")
	var fr audit.FindingsResponse
	if code != http.StatusOK || json.Unmarshal(b, &fr) != nil {
		t.Errorf("the namespace's user's findings: %d %s", code, b)
	}
	for _, f := range fr.Findings {
		for _, o := range f.Objects {
			if o.Namespace != manifest.NSFrontend {
				t.Errorf("a finding of another namespace: %+v", f)
			}
		}
	}
	// The unprotected workloads of frontend; the denied groups with an
	// end in frontend, the other end's workload blanked.
	var un []audit.UnprotectedWorkload
	if code, b := get("/api/v1/audit/unprotected"); code != http.StatusOK || json.Unmarshal(b, &un) != nil {
		t.Errorf("the namespace's user's unprotected workloads: %d %s", code, b)
	}
	for _, w := range un {
		if w.Namespace != manifest.NSFrontend {
			t.Errorf("an unprotected workload of another namespace: %+v", w)
		}
	}
	var dg []audit.DeniedGroup
	if code, b := get("/api/v1/audit/denied"); code != http.StatusOK || json.Unmarshal(b, &dg) != nil {
		t.Errorf("the namespace's user's denied flows: %d %s", code, b)
	}
	for _, g := range dg {
		if (g.SrcNamespace != manifest.NSFrontend && g.DstNamespace != manifest.NSFrontend) ||
			(g.SrcNamespace != manifest.NSFrontend && g.SrcWorkload != "") || (g.DstNamespace != manifest.NSFrontend && g.DstWorkload != "") ||
			(g.PolicyNamespace != manifest.NSFrontend && g.PolicyName != "") {
			t.Errorf("a denied group not reduced to frontend's view: %+v", g)
		}
	}
	if code, b := get("/api/v1/status"); code != http.StatusForbidden || !strings.Contains(string(b), "list on pods in all namespaces") {
		t.Errorf("the namespace's user's cluster status: %d %s", code, b)
	}
	// The operator reads the same connections whole.
	var page api.FlowPage
	k.rest(t, http.MethodGet, "/api/v1/flows?since=10m&limit=1000&src_namespace=frontend&dst_namespace=backend", nil, &page)
	named := 0
	for _, fl := range page.Flows {
		if fl.DstPod != "" && fl.DstWorkload != "" {
			named++
		}
	}
	if named == 0 {
		t.Errorf("the operator's frontend → backend rows name no backend pod: %d rows", len(page.Flows))
	}
}
