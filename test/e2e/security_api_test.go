package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/store/chhttp"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/web/api"
)

// TestSecurityAPI is the security tier of issue 33 (items 7, 8 and 16),
// run against the collector binary with viewer tokens, a cluster view (an
// inventory file of 200 pods and 2,000 policies) and stored flows, in
// each IP mode:
//   - what-ifs and reachability matrices past their gates (per token,
//     per role) are answered 429 naming the cap, while the collector keeps
//     answering;
//   - a what-if and a matrix whose work passes its bound are answered 422
//     saying what to narrow, before the work runs;
//   - one token cannot take every follow stream of its role.
func TestSecurityAPI(t *testing.T) {
	t.Parallel() // its own collector process, directory and ports; the modes one after the other, as each fills its caps
	bin := buildBinary(t)
	for _, mode := range []manifest.Mode{manifest.ModeIPv4, manifest.ModeIPv6, manifest.ModeDual} {
		t.Run(string(mode), func(t *testing.T) {
			record(t, mode)
			testSecurityAPI(t, bin, mode)
		})
	}
}

// apiCluster is a generated cluster view: namespace "load" with
// StatefulSets w0..w<workloads-1> of size pods each (addresses of the
// mode's families), and policies.
type apiCluster struct {
	mode            manifest.Mode
	workloads, size int
	policies        []*networkingv1.NetworkPolicy
}

// families are the IP versions of the mode.
func (c *apiCluster) families() []int {
	switch c.mode {
	case manifest.ModeIPv4:
		return []int{4}
	case manifest.ModeIPv6:
		return []int{6}
	}
	return []int{4, 6}
}

// podAddr is pod k of workload w's address of family fam: 198.18.(1+w).(1+k)
// or fd00:10:0:(1+w)::(1+k).
func podAddr(fam, w, k int) netip.Addr {
	if fam == 4 {
		return netip.AddrFrom4([4]byte{198, 18, byte(1 + w), byte(1 + k)})
	}
	return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0, byte((1 + w) >> 8), byte(1 + w), 14: byte((1 + k) >> 8), 15: byte(1 + k)})
}

// write writes the cluster as an inventory file (multi-document YAML).
func (c *apiCluster) write(t testing.TB, path string) {
	t.Helper()
	objs := []runtime.Object{
		&corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
			ObjectMeta: metav1.ObjectMeta{Name: "load", Labels: map[string]string{corev1.LabelMetadataName: "load"}}},
	}
	yes := true
	for w := range c.workloads {
		for k := range c.size {
			p := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
				ObjectMeta: metav1.ObjectMeta{Namespace: "load", Name: fmt.Sprintf("w%d-%d", w, k), Labels: map[string]string{"app": fmt.Sprintf("w%d", w)},
					OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: fmt.Sprintf("w%d", w), UID: "u", Controller: &yes}}},
				Spec:   corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "app", Image: "app"}}},
				Status: corev1.PodStatus{Phase: corev1.PodRunning},
			}
			for _, fam := range c.families() {
				a := podAddr(fam, w, k).String()
				if p.Status.PodIP == "" {
					p.Status.PodIP = a
				}
				p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: a})
			}
			objs = append(objs, p)
		}
	}
	for _, p := range c.policies {
		p.TypeMeta = metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
		objs = append(objs, p)
	}
	var b bytes.Buffer
	for i, o := range objs {
		y, err := yaml.Marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		if i > 0 {
			b.WriteString("---\n")
		}
		b.Write(y)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// worstPolicies returns n policies of "load" that each select every pod
// (an Exists selector, which the label index cannot narrow) with an
// ingress and an egress rule that match no pod: every flow between two
// pods is checked against all n on both sides.
func worstPolicies(n int) []*networkingv1.NetworkPolicy {
	none := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "none"}}}}
	out := make([]*networkingv1.NetworkPolicy, n)
	for i := range out {
		out[i] = &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "load", Name: "p" + strconv.Itoa(i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: none}},
				Egress:      []networkingv1.NetworkPolicyEgressRule{{To: none}},
			},
		}
	}
	return out
}

// flowGroupsSQL inserts n flow groups of the cluster's pods, one record
// each, ending at end (milliseconds): pod (number % workloads, 0) to pod
// ((number / workloads) % workloads, 1), the families of the mode in
// turn, destination ports from port up, so every row is its own group.
func (c *apiCluster) flowGroupsSQL(n int, end time.Time, port int) string {
	fams := c.families()
	ipExpr := func(side string) string {
		w := "number % " + strconv.Itoa(c.workloads)
		k := "0"
		if side == "dst" {
			w, k = "intDiv(number, "+strconv.Itoa(c.workloads)+") % "+strconv.Itoa(c.workloads), "1"
		}
		v4 := "toIPv6(concat('::ffff:198.18.', toString(1 + " + w + "), '.', toString(1 + " + k + ")))"
		v6 := "toIPv6(concat('fd00:10:0:', hex(toUInt16(1 + " + w + ")), '::', hex(toUInt16(1 + " + k + "))))"
		switch {
		case len(fams) == 2:
			return "if(number % 2 = 0, " + v4 + ", " + v6 + ")"
		case fams[0] == 4:
			return v4
		}
		return v6
	}
	ver := strconv.Itoa(fams[0])
	if len(fams) == 2 {
		ver = "if(number % 2 = 0, 4, 6)"
	}
	pod := func(side string) string {
		w := "toString(number % " + strconv.Itoa(c.workloads) + ")"
		k := "'0'"
		if side == "dst" {
			w, k = "toString(intDiv(number, "+strconv.Itoa(c.workloads)+") % "+strconv.Itoa(c.workloads)+")", "'1'"
		}
		return fmt.Sprintf("'load', concat('w', %[1]s, '-', %[2]s), map('app', concat('w', %[1]s)), 'StatefulSet', concat('w', %[1]s)", w, k)
	}
	ms := end.UnixMilli()
	return fmt.Sprintf(`INSERT INTO dualflow.flows (flow_start, flow_end, time_received, ip_version, src_ip_in, dst_ip_in, src_port, dst_port, protocol,
 src_pod_namespace, src_pod_name, src_pod_labels, src_workload_kind, src_workload_name,
 dst_pod_namespace, dst_pod_name, dst_pod_labels, dst_workload_kind, dst_workload_name, exporter_node, source)
SELECT fromUnixTimestamp64Milli(toInt64(%[1]d - 5000), 'UTC'), fromUnixTimestamp64Milli(toInt64(%[1]d), 'UTC'), now64(3),
 %[2]s, %[3]s, %[4]s, 40000, toUInt16(%[5]d + intDiv(number, %[6]d)), 6, %[7]s, %[8]s, 'node-1', 'conntrack'
FROM numbers(%[9]d)`, ms, ver, ipExpr("src"), ipExpr("dst"), port, c.workloads*c.workloads, pod("src"), pod("dst"), n)
}

// writeTokens writes a tokens file (mode 0600) with the viewers named
// and one operator, op; each token is "secret-" and its name.
func writeTokens(t testing.TB, path string, viewers ...string) {
	t.Helper()
	var b strings.Builder
	for _, v := range viewers {
		fmt.Fprintf(&b, "secret-%s viewer %s\n", v, v)
	}
	b.WriteString("secret-op operator op\n")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
}

// apiReply is an answer of the REST API, with how long it took.
type apiReply struct {
	who        string
	status     int
	retryAfter string
	message    string
	field      string
	took       time.Duration
}

// call sends one request as token who ("" for none).
func call(ctx context.Context, method, target, who, body string) apiReply {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, method, target, strings.NewReader(body))
	if err != nil {
		return apiReply{who: who, message: err.Error()}
	}
	if who != "" {
		req.Header.Set("Authorization", "Bearer secret-"+who)
	}
	if strings.HasPrefix(body, "{") {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return apiReply{who: who, message: err.Error(), took: time.Since(start)}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e struct{ Message, Field string }
	_ = json.Unmarshal(b, &e)
	if e.Message == "" && resp.StatusCode >= 300 {
		e.Message = string(b)
	}
	return apiReply{who: who, status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), message: e.Message, field: e.Field, took: time.Since(start)}
}

// matrix is the body of a reachability request of the first sides
// workloads to the next sides.
func matrix(sides int) string {
	var req api.ReachabilityRequest
	for i := range sides {
		req.Sources = append(req.Sources, audit.Endpoint{Kind: "workload", Namespace: "load", Name: "w" + strconv.Itoa(i)})
		req.Destinations = append(req.Destinations, audit.Endpoint{Kind: "workload", Namespace: "load", Name: "w" + strconv.Itoa(sides+i)})
	}
	req.Port, req.Since = 80, "10m"
	b, _ := json.Marshal(req)
	return string(b)
}

// denyAllYAML is a proposed policy isolating every pod of "load".
const denyAllYAML = "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-all, namespace: load}\nspec: {podSelector: {}, policyTypes: [Ingress]}\n"

// burst sends the requests of whos at once (one each) and returns the
// answers; meanwhile it asks probe every 100 ms and returns its slowest
// answer, and samples the collector's in-flight gauge of kind.
func burst(t *testing.T, c *apiCollector, kind string, whos []string, send func(who string) apiReply, probe func() apiReply) (answers []apiReply, slowest apiReply, mostInFlight float64) {
	t.Helper()
	var wg sync.WaitGroup
	out := make(chan apiReply, len(whos))
	start := make(chan struct{})
	for _, who := range whos {
		wg.Go(func() {
			<-start
			out <- send(who)
		})
	}
	done := make(chan struct{})
	probed := make(chan apiReply, 1)
	go func() {
		var worst apiReply
		for {
			r := probe()
			if r.took > worst.took || r.status != http.StatusOK {
				worst = r
			}
			if n, err := c.scrape("dualflow_web_in_flight", `kind="`+kind+`"`); err == nil {
				mostInFlight = max(mostInFlight, n)
			}
			select {
			case <-done:
				probed <- worst
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	close(start)
	wg.Wait()
	close(done)
	slowest = <-probed
	close(out)
	for r := range out {
		answers = append(answers, r)
	}
	return answers, slowest, mostInFlight
}

// checkBurst checks the answers of a burst past a gate of perRole places
// for viewers: some refused 429 with Retry-After naming the token's or the
// role's cap, the others 200; no more in flight than the role's cap; the
// probe answered within 10 s throughout.
func checkBurst(t *testing.T, what string, answers []apiReply, slowest apiReply, mostInFlight float64, perRole int) {
	t.Helper()
	refused := 0
	for _, r := range answers {
		switch r.status {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			refused++
			if r.retryAfter == "" || !strings.Contains(r.message, `of token "`+r.who+`"`) && !strings.Contains(r.message, "of role viewer") {
				t.Errorf("%s of %s refused: Retry-After %q, %q: want the cap it reached", what, r.who, r.retryAfter, r.message)
			}
		default:
			t.Errorf("%s of %s: %d %s", what, r.who, r.status, r.message)
		}
	}
	if refused == 0 {
		t.Errorf("%d %s at once, past the caps: none refused", len(answers), what)
	}
	if mostInFlight > float64(perRole) {
		t.Errorf("%v %s in flight at once, more than the role's %d", mostInFlight, what, perRole)
	}
	if slowest.status != http.StatusOK || slowest.took > 10*time.Second {
		t.Errorf("while the %s ran, the collector answered a viewer in %v (%d %s), want 200 within 10 s", what, slowest.took, slowest.status, slowest.message)
	}
	t.Logf("%d %s at once: %d refused (429), %v in flight at most; the slowest other answer took %v", len(answers), what, refused, mostInFlight, slowest.took.Round(time.Millisecond))
}

// apiCollector is the collector binary serving the REST API on loopback
// with tokens, over a generated cluster view (an inventory file).
type apiCollector struct {
	t                testing.TB
	d                *daemon
	web, ch, dataDir string
}

// startAPICollector starts the collector binary serving the REST API on
// loopback with the tokens of viewers (and op), over the cluster c, and
// returns it once the cluster view answers.
func startAPICollector(t testing.TB, bin, dir string, mode manifest.Mode, c *apiCluster, viewers []string, extra ...string) *apiCollector {
	t.Helper()
	inventory, tokens := filepath.Join(dir, "inventory.yaml"), filepath.Join(dir, "tokens")
	c.write(t, inventory)
	writeTokens(t, tokens, viewers...)
	webAddr, ipfix := "127.0.0.1:0", "127.0.0.1:0"
	switch mode {
	case manifest.ModeIPv6:
		webAddr, ipfix = "[::1]:0", "[::1]:0"
	case manifest.ModeDual:
		ipfix = "127.0.0.1:0,[::1]:0"
	}
	col := &apiCollector{t: t, dataDir: filepath.Join(dir, "data")}
	col.d = newDaemon(t, "collector", bin, append([]string{"collector",
		"--k8s.source", "inventory", "--k8s.inventory", inventory,
		"--clickhouse.data-dir", col.dataDir, "--clickhouse.http-addr", "127.0.0.1:0", "--clickhouse.flush-interval", "200ms",
		"--metrics-addr", "127.0.0.1:0", "--web.addr", webAddr, "--web.tokens-file", tokens,
		"--collector.ipfix.tcp-addr", ipfix, "--collector.ipfix.udp-addr", ""}, extra...)...)
	found := col.d.start(logWebURL, logCHHTTP)
	col.web, col.ch = found[0], found[1]
	deadline := time.Now().Add(3 * time.Minute)
	for {
		r := call(context.Background(), "POST", col.web+"/api/v1/audit/whatif?since=1s", "op", denyAllYAML)
		if r.status == http.StatusOK {
			return col
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cluster view did not answer within 3 minutes: %d %s", r.status, r.message)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// query runs SQL as the admin user of the store's users file.
func (c *apiCollector) query(q string) string {
	c.t.Helper()
	users, err := chhttp.LoadUsers(filepath.Join(c.dataDir, "http-users.json"))
	if err != nil {
		c.t.Fatal(err)
	}
	admin, _ := chhttp.Find(users, chhttp.AdminUser)
	req, _ := http.NewRequest("POST", c.ch+"/", strings.NewReader(q))
	req.SetBasicAuth(admin.Name, admin.Password)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		c.t.Fatalf("query %.200q: %d %s", q, resp.StatusCode, b)
	}
	return strings.TrimSpace(string(b))
}

// metricWith sums the samples of name whose labels contain label.
func (c *apiCollector) metricWith(name, label string) float64 {
	c.t.Helper()
	v, err := c.scrape(name, label)
	if err != nil {
		c.t.Fatal(err)
	}
	return v
}

// scrape is metricWith for any goroutine: it returns its error.
func (c *apiCollector) scrape(name, label string) (float64, error) {
	resp, err := http.Get(c.d.metrics)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sum := 0.0
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		if n, labels, _ := strings.Cut(f[0], "{"); n == name && strings.Contains(labels, label) {
			v, _ := strconv.ParseFloat(f[1], 64)
			sum += v
		}
	}
	return sum, sc.Err()
}

// memory is a field of the collector's /proc/PID/status (VmRSS, VmHWM:
// the resident set, its peak), in MiB.
func (c *apiCollector) memory(field string) float64 {
	c.t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", c.d.cmd.Process.Pid))
	if err != nil {
		c.t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	c.t.Fatalf("no %s in /proc/pid/status", field)
	return 0
}

func testSecurityAPI(t *testing.T, bin string, mode manifest.Mode) {
	dir := t.TempDir()
	// 20 workloads of 10 pods under 2,000 policies that each apply to
	// every pod: a pod pair or flow group is checked against 2,000 on
	// each side.
	c := &apiCluster{mode: mode, workloads: 20, size: 10, policies: worstPolicies(2000)}
	viewers := []string{"v1", "v2", "v3", "v4"}
	col := startAPICollector(t, bin, dir, mode, c, viewers)
	// 5,000 flow groups in the last hour and 5,000 the hour before: each
	// checked against 8,001 policies (2,000 and 2,000 before the
	// proposal, 2,000 and 2,001 after), 40 million checks in the last
	// hour, 80 million in the last two (the bound is 50 million).
	now := time.Now()
	col.query(c.flowGroupsSQL(5000, now.Add(-90*time.Minute), 10000))
	col.query(c.flowGroupsSQL(5000, now.Add(-30*time.Minute), 20000))
	whatif := func(who, query string) apiReply {
		return call(context.Background(), "POST", col.web+"/api/v1/audit/whatif?"+query, who, denyAllYAML)
	}
	reach := func(who string, sides int) apiReply {
		return call(context.Background(), "POST", col.web+"/api/v1/reachability", who, matrix(sides))
	}
	whoami := func() apiReply { return call(context.Background(), "GET", col.web+"/api/v1/whoami", "v4", "") }

	t.Run("a what-if past its bound is refused", func(t *testing.T) {
		r := whatif("v1", "since=2h")
		if r.status != http.StatusUnprocessableEntity || r.field != "since" || !strings.Contains(r.message, "policy checks") || !strings.Contains(r.message, "narrow the window") {
			t.Errorf("a what-if of 80 million checks: %d %q field %q, want 422 saying to narrow the window", r.status, r.message, r.field)
		}
		if r.took > 30*time.Second {
			t.Errorf("the refusal took %v: it must come before the work", r.took)
		}
		if r := whatif("v1", "since=2h&limit=200000"); r.status != http.StatusUnprocessableEntity || r.field != "limit" {
			t.Errorf("limit 200000: %d %q field %q, want 422 about limit", r.status, r.message, r.field)
		}
		if r := whatif("v1", "since=2h&limit=1000"); r.status != http.StatusOK {
			t.Errorf("the same window with limit 1000: %d %s", r.status, r.message)
		}
		if n := col.metricWith("dualflow_web_too_large_total", `kind="whatif"`); n != 2 {
			t.Errorf("dualflow_web_too_large_total{kind=whatif} %v, want 2", n)
		}
	})

	t.Run("a reachability matrix past its bound is refused", func(t *testing.T) {
		// 10×10 workloads of 10 pods: 10,000 pod pairs per family, each
		// checked against 4,000 policies.
		r := reach("v1", 10)
		if r.status != http.StatusUnprocessableEntity || r.field != "destinations" || !strings.Contains(r.message, "policy checks") || !strings.Contains(r.message, "fewer or smaller endpoints") {
			t.Errorf("a matrix of 40 million checks or more: %d %q field %q, want 422", r.status, r.message, r.field)
		}
		if n := col.metricWith("dualflow_web_too_large_total", `kind="reachability"`); n != 1 {
			t.Errorf("dualflow_web_too_large_total{kind=reachability} %v, want 1", n)
		}
	})

	t.Run("what-ifs past the gate get 429", func(t *testing.T) {
		// Two of each of three viewers, each 40 million checks (a second
		// or more): one per token and two per role run at once.
		whos := []string{"v1", "v1", "v2", "v2", "v3", "v3"}
		answers, slowest, most := burst(t, col, "whatif", whos, func(who string) apiReply { return whatif(who, "since=1h") }, whoami)
		checkBurst(t, "what-ifs", answers, slowest, most, api.DefaultWhatIfConcurrency)
	})

	t.Run("reachability matrices past the gate get 429", func(t *testing.T) {
		// Three of each of four viewers, each a 5×5 matrix of 10-pod
		// workloads: 2,500 pod pairs per family, 10 million checks per
		// family: two per token and four per role run at once.
		var whos []string
		for _, v := range viewers {
			whos = append(whos, v, v, v)
		}
		answers, slowest, most := burst(t, col, "reachability", whos, func(who string) apiReply { return reach(who, 5) }, whoami)
		checkBurst(t, "reachability matrices", answers, slowest, most, api.DefaultReachabilityConcurrency)
	})

	t.Run("one token cannot take every follow stream", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		open := func(who string) apiReply {
			req, _ := http.NewRequestWithContext(ctx, "GET", col.web+"/api/v1/flows?follow=true", nil)
			req.Header.Set("Authorization", "Bearer secret-"+who)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if resp.StatusCode == http.StatusOK {
				return apiReply{who: who, status: resp.StatusCode} // open until cancel
			}
			defer resp.Body.Close()
			var e struct{ Message string }
			_ = json.NewDecoder(resp.Body).Decode(&e)
			return apiReply{who: who, status: resp.StatusCode, message: e.Message, retryAfter: resp.Header.Get("Retry-After")}
		}
		opened := 0
		for ; opened < api.DefaultFollowStreamsPerRole; opened++ {
			r := open("v1")
			if r.status == http.StatusOK {
				continue
			}
			if r.status != http.StatusTooManyRequests || r.retryAfter == "" || !strings.Contains(r.message, `token "v1"`) {
				t.Errorf("stream %d of v1: %d %q, want 429 naming the token", opened+1, r.status, r.message)
			}
			break
		}
		if opened != api.DefaultFollowStreamsPerToken {
			t.Errorf("one viewer token opened %d follow streams of the role's %d, want %d", opened, api.DefaultFollowStreamsPerRole, api.DefaultFollowStreamsPerToken)
		}
		if r := open("v2"); r.status != http.StatusOK {
			t.Errorf("another viewer token while v1 holds its streams: %d %s", r.status, r.message)
		}
		if n := col.metricWith("dualflow_web_concurrency_refused_total", `cap="token",kind="follow"`); n != 1 {
			t.Errorf("follow refusals of the token cap: %v, want 1", n)
		}
	})
	t.Logf("collector peak RSS (VmHWM) %.0f MiB", col.memory("VmHWM"))
}

// BenchmarkWhatIfRSS measures the collector's peak resident set (VmHWM)
// while 8 viewers, each with its own token, ask a what-if at once over
// 200,000 flow groups of the last hour, under 1,946 policies (each
// selecting one of 40 workloads of 10 pods by label, so a flow is
// checked against about 50 policies on its ingress side), in dual-stack
// mode. limit=200000 reads every group; the default limit reads the
// 100,000 most frequent. peak-MiB is VmHWM after the burst, reset after
// the flows were stored; base-MiB the resident set before it. Run it with
// DUALFLOW_BIN set to the binary to measure, -benchtime 1x.
func BenchmarkWhatIfRSS(b *testing.B) {
	bin := buildBinary(b)
	for _, query := range []string{"since=1h&limit=200000", "since=1h"} {
		b.Run(strings.NewReplacer("=", "-", "&", "+").Replace(query), func(b *testing.B) {
			benchWhatIfRSS(b, bin, query)
		})
	}
}

func benchWhatIfRSS(b *testing.B, bin, query string) {
	c := &apiCluster{mode: manifest.ModeDual, workloads: 40, size: 10}
	tcp := corev1.ProtocolTCP
	for i := range 1946 {
		port := intstr.FromInt32(int32(8000 + i%1000))
		c.policies = append(c.policies, &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: "load", Name: "allow-" + strconv.Itoa(i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "w" + strconv.Itoa(i%40)}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "w" + strconv.Itoa((i+1)%40)}}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}},
				}},
			},
		})
	}
	var viewers []string
	for i := range 8 {
		viewers = append(viewers, "v"+strconv.Itoa(i+1))
	}
	col := startAPICollector(b, bin, b.TempDir(), manifest.ModeDual, c, viewers)
	col.query(c.flowGroupsSQL(200_000, time.Now().Add(-10*time.Minute), 1000))
	if n := col.query("SELECT count() FROM dualflow.flows"); n != "200000" {
		b.Fatalf("%s flows stored, want 200000", n)
	}
	codes := map[int]int{}
	var base, peak float64
	var took time.Duration
	for b.Loop() {
		// Reset the peak to the current resident set (proc(5), clear_refs).
		if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", col.d.cmd.Process.Pid), []byte("5"), 0); err != nil {
			b.Fatal(err)
		}
		base = col.memory("VmRSS")
		start := time.Now()
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, v := range viewers {
			wg.Go(func() {
				r := call(context.Background(), "POST", col.web+"/api/v1/audit/whatif?"+query, v, denyAllYAML)
				mu.Lock()
				codes[r.status]++
				mu.Unlock()
			})
		}
		wg.Wait()
		took = time.Since(start)
		peak = col.memory("VmHWM")
	}
	b.ReportMetric(base, "base-MiB")
	b.ReportMetric(peak, "peak-MiB")
	b.ReportMetric(took.Seconds(), "burst-s")
	for code, n := range codes {
		b.ReportMetric(float64(n)/float64(b.N), "http"+strconv.Itoa(code)+"/op")
	}
}
