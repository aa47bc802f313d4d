package cluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/web/api"
)

// The real-cluster tier: dualflow installed as an operator would on a real
// two-node cluster (kubelet, containerd, CNI bridge, kube-proxy in
// nftables mode), in each IP mode. Root, DUALFLOW_E2E=1; the binaries come
// from scripts/k8s-cluster.sh (make test builds them in the background).
// DUALFLOW_CLUSTER_MODES limits the modes (comma-separated).

// Each mode's cluster has its own prefix and address block, apart from
// `make cluster` (dfk-, index 0) and from the lab (df-): the three run at
// once.
var clusterOf = map[manifest.Mode]struct {
	prefix string
	index  int
}{
	manifest.ModeIPv4: {"dfk4-", 1},
	manifest.ModeIPv6: {"dfk6-", 2},
	manifest.ModeDual: {"dfkd-", 3},
}

var images struct {
	tag      string
	archives []string
	bins     Bins
}

func TestMain(m *testing.M) {
	if os.Getenv("DUALFLOW_E2E") != "1" || os.Geteuid() != 0 {
		fmt.Println("the real-cluster tier needs root and DUALFLOW_E2E=1: skipped")
		os.Exit(0)
	}
	code := m.Run()
	// The images and their archives are this run's alone.
	if images.tag != "" {
		for _, img := range []string{"dualflow", "dualflow-chdb"} {
			exec.Command(filepath.Join(RepoRoot(), "scripts", "image.sh"), "buildah", "rmi", "localhost/"+img+":"+images.tag).Run()
		}
		for _, a := range images.archives {
			os.RemoveAll(filepath.Dir(a))
		}
	}
	os.Exit(code)
}

func setup(t *testing.T) {
	t.Helper()
	if images.tag != "" {
		return
	}
	ctx := context.Background()
	began := time.Now()
	bins, err := Build(ctx, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster binaries ready in %s", time.Since(began).Round(time.Second))
	tag := fmt.Sprintf("cluster-%d", os.Getpid())
	dir, err := os.MkdirTemp("", "dualflow-cluster-images-")
	if err != nil {
		t.Fatal(err)
	}
	began = time.Now()
	archives, err := ImageArchives(ctx, tag, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("images %s built and exported in %s", tag, time.Since(began).Round(time.Second))
	images.tag, images.archives, images.bins = tag, archives, bins
}

func modes(t *testing.T) []manifest.Mode {
	if s := os.Getenv("DUALFLOW_CLUSTER_MODES"); s != "" {
		var out []manifest.Mode
		for _, m := range strings.Split(s, ",") {
			mode, err := manifest.ParseMode(m)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, mode)
		}
		return out
	}
	return manifest.Modes
}

func TestCluster(t *testing.T) {
	setup(t)
	for _, mode := range modes(t) {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			testClusterMode(t, mode)
		})
	}
}

func testClusterMode(t *testing.T, mode manifest.Mode) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	dir := filepath.Join(os.TempDir(), "dualflow-cluster-"+string(mode))
	if err := DownDir(dir); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(dir)
	began := time.Now()
	c, err := Up(ctx, Config{Prefix: clusterOf[mode].prefix, Index: clusterOf[mode].index, Mode: mode, Dir: dir, Bins: images.bins,
		Images: images.archives, Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cluster up in %s", time.Since(began).Round(100*time.Millisecond))
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range []string{"kubelet-n1", "kubelet-n2", "kube-proxy-n1"} {
				t.Logf("--- %s ---\n%s", name, c.Log(name, 2000))
			}
			if out, err := c.Kubectl(context.Background(), nil, "get", "pods", "-A", "-o", "wide"); err == nil {
				t.Logf("%s", out)
			}
			if out, err := c.Kubectl(context.Background(), nil, "-n", "dualflow", "logs", "deployment/dualflow-collector", "--tail=60"); err == nil {
				t.Logf("%s", out)
			}
		}
		began := time.Now()
		if err := c.Down(); err != nil {
			t.Errorf("down: %v", err)
		}
		t.Logf("cluster down in %s", time.Since(began).Round(100*time.Millisecond))
		os.RemoveAll(dir)
	})
	began = time.Now()
	// Both ways docs/deploy.md gives: Helm in the dual-stack and IPv6
	// clusters, kustomize in the IPv4 one.
	how := Helm
	if mode == manifest.ModeIPv4 {
		how = Kustomize
	}
	in, err := c.Install(ctx, how, images.tag)
	if err != nil {
		t.Fatal(err)
	}
	installed := time.Now()
	t.Logf("dualflow installed (%s, embedded store) and ready in %s", how, installed.Sub(began).Round(100*time.Millisecond))
	if err := c.DeployWorkloads(ctx, images.tag); err != nil {
		t.Fatal(err)
	}
	web := portForward(t, ctx, c, in)
	checkUI(t, ctx, web)
	checkFlows(t, ctx, c, web, installed)
	checkTraceflow(t, ctx, c, web)
	checkPolicy(t, ctx, c, web)
	checkRecommend(t, ctx, c, web)
	web = checkChurn(t, ctx, c, in, web)
	screenshot(t, ctx, web, in.Token, mode)
}

// checkFlows sends pod-to-pod and pod-to-Service traffic over each family,
// same node and across nodes, and waits for each connection's one merged,
// enriched row.
func checkFlows(t *testing.T, ctx context.Context, c *Cluster, web *webClient, installed time.Time) {
	clients, err := c.Pods(ctx, NSClient, "web")
	if err != nil {
		t.Fatal(err)
	}
	servers, err := c.Pods(ctx, NSServer, "api")
	if err != nil {
		t.Fatal(err)
	}
	if len(clients) != 2 || len(servers) != 2 {
		t.Fatalf("%d clients, %d servers running, want 2 and 2", len(clients), len(servers))
	}
	client := clients[0]
	netns, err := PodNetNS(&client)
	if err != nil {
		t.Fatal(err)
	}
	// What each connection must become: a row from the client pod to a
	// server pod, through a Service when it went to one.
	type want struct {
		to      netip.AddrPort
		server  *corev1.Pod // nil: through a Service (either backend)
		service string
		family  int
		srcPort uint16
		count   Count // the client pod's own count of the connection
	}
	var wants []want
	for i := range servers {
		for _, ip := range servers[i].Status.PodIPs {
			a := netip.MustParseAddr(ip.IP)
			wants = append(wants, want{to: netip.AddrPortFrom(a, ServerPort), server: &servers[i], family: family(a)})
		}
	}
	for _, svc := range []string{SvcDual, SvcV4, SvcV6} {
		s, err := c.API.Admin.CoreV1().Services(NSServer).Get(ctx, svc, metav1.GetOptions{})
		if err != nil {
			continue // not in this mode
		}
		for _, ip := range s.Spec.ClusterIPs {
			a := netip.MustParseAddr(ip)
			wants = append(wants, want{to: netip.AddrPortFrom(a, 80), service: svc, family: family(a)})
		}
	}
	counter, err := NewPodCounter(ctx, netns)
	if err != nil {
		t.Fatal(err)
	}
	for i := range wants {
		if err := counter.Reset(ctx); err != nil {
			t.Fatal(err)
		}
		// kube-proxy programs a new Service's endpoints a moment after
		// they are ready: a refusal until then is its lag, not a fault.
		var r agent.Reply
		err := poll(ctx, time.Minute, func() (bool, error) {
			r, err = agent.Dial(ctx, netns, agent.TCP, wants[i].to, 10*time.Second)
			return err == nil, nil
		})
		if err != nil {
			t.Fatalf("from %s to %s: %v", client.Name, wants[i].to, err)
		}
		wants[i].srcPort = r.Local.Port()
		if err := counter.WaitClosed(ctx, wants[i].srcPort); err != nil {
			t.Fatalf("from %s to %s: the connection did not close: %v", client.Name, wants[i].to, err)
		}
		if wants[i].count, err = counter.Read(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s → %s answered by %s (saw %s); the pod counted %+v", client.Name, wants[i].to, r.Server, r.Seen, wants[i].count)
	}
	firstFlow := time.Duration(0)
	for _, w := range wants {
		what := fmt.Sprintf("IPv%d %s:%d → %s", w.family, client.Name, w.srcPort, w.to)
		lastCount := ""
		err := poll(ctx, 3*time.Minute, func() (bool, error) {
			q := url.Values{"src_pod": {NSClient + "/" + client.Name}, "ip_version": {fmt.Sprint(w.family)}, "limit": {"1000"}, "since": {"30m"}}
			var page api.FlowPage
			if err := web.get(ctx, "/api/v1/flows?"+q.Encode(), &page); err != nil {
				t.Logf("%s: %v", what, err)
				return false, nil
			}
			for _, f := range page.Flows {
				if f.SrcPort != int(w.srcPort) || f.DstPort != ServerPort {
					continue
				}
				if firstFlow == 0 {
					firstFlow = time.Since(installed)
				}
				problems := []string{}
				if f.SrcNode != client.Spec.NodeName || f.SrcWorkload != "web" || f.SrcNamespace != NSClient {
					problems = append(problems, fmt.Sprintf("source %s/%s/%s on %s", f.SrcNamespace, f.SrcWorkload, f.SrcPod, f.SrcNode))
				}
				if f.DstNamespace != NSServer || f.DstWorkload != "api" || f.DstNode == "" {
					problems = append(problems, fmt.Sprintf("destination %s/%s/%s on %s", f.DstNamespace, f.DstWorkload, f.DstPod, f.DstNode))
				}
				if w.server != nil && (f.DstPod != w.server.Name || f.DstNode != w.server.Spec.NodeName) {
					problems = append(problems, fmt.Sprintf("destination pod %s on %s, want %s on %s", f.DstPod, f.DstNode, w.server.Name, w.server.Spec.NodeName))
				}
				if w.service != "" && (f.SvcName != w.service || f.ServiceIP != w.to.Addr().String() || f.ServicePort != 80) {
					problems = append(problems, fmt.Sprintf("service %s/%s %s:%d, want %s %s:80", f.SvcNamespace, f.SvcName, f.ServiceIP, f.ServicePort, w.service, w.to.Addr()))
				}
				if len(problems) > 0 {
					return false, fmt.Errorf("%s: row %+v: %s", what, f, strings.Join(problems, "; "))
				}
				// The counters: the row may be exported before the
				// connection's last packets; its final export agrees
				// with the pod's own count exactly, but for SYNs the
				// pod retransmitted that never reached the node's
				// conntrack (seen once, under load).
				lost, ok := w.count.LostSYNs(f.Packets, f.Bytes, f.RevPackets, f.RevBytes)
				if !ok {
					lastCount = fmt.Sprintf("row counts {SentPackets:%d SentBytes:%d ReceivedPackets:%d ReceivedBytes:%d}, the pod counted %+v", f.Packets, f.Bytes, f.RevPackets, f.RevBytes, w.count)
					return false, nil
				}
				if lost > 0 {
					t.Logf("%s: %d of the pod's %d SYNs (retransmitted) never reached the node's conntrack; the rest of the row agrees with the pod's count", what, lost, w.count.SYNPackets)
				}
				return true, nil
			}
			return false, nil
		})
		if err != nil {
			t.Errorf("%s: %v %s", what, err, lastCount)
			continue
		}
	}
	t.Logf("first enriched flow %s after the install was ready; %d connections checked, their packets and bytes each way equal to the client pod's own count", firstFlow.Round(100*time.Millisecond), len(wants))
}

func family(a netip.Addr) int {
	if a.Is4() {
		return 4
	}
	return 6
}

func getJSON(ctx context.Context, hc *http.Client, u string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error string `json:"error"`
		}
		json.NewDecoder(resp.Body).Decode(&e)
		return fmt.Errorf("GET %s: %s %s", u, resp.Status, e.Error)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// webClient calls the web API through kubectl port-forward, as an
// operator reaches it (the collector's NetworkPolicy admits nothing else
// to the web port but namespaces labelled for it).
type webClient struct {
	base string
	hc   *http.Client
}

func (w *webClient) get(ctx context.Context, path string, out any) error {
	return getJSON(ctx, w.hc, w.base+path, out)
}

func (w *webClient) post(ctx context.Context, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.base+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := w.hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		body, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("POST %s: %s %s", path, resp.Status, body)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// portForward runs kubectl port-forward of the dualflow-web Service on
// this machine, through ServeAPI, until the test ends.
func portForward(t *testing.T, ctx context.Context, c *Cluster, in *Install) *webClient {
	kc, err := c.ServeAPI(ctx, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	pf := exec.CommandContext(ctx, images.bins.Kubectl, "--kubeconfig", kc, "-n", in.Namespace,
		"port-forward", "--address", "127.0.0.1", "svc/dualflow-web", "0:8080")
	out, err := pf.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	pf.Stderr = &stderr
	if err := pf.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		pf.Wait()
	})
	local := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			// "Forwarding from 127.0.0.1:41234 -> 8080"
			if f := strings.Fields(sc.Text()); len(f) >= 3 && f[0] == "Forwarding" {
				select {
				case local <- f[2]:
				default:
				}
			}
		}
	}()
	select {
	case addr := <-local:
		return &webClient{base: "http://" + addr, hc: &http.Client{Timeout: 30 * time.Second,
			Transport: &tokenTransport{token: in.Token, base: http.DefaultTransport}}}
	case <-time.After(time.Minute):
		t.Fatalf("kubectl port-forward printed no address within a minute: %s", stderr.String())
	}
	return nil
}

// checkUI: the UI and an authenticated API call answer through the
// port-forward.
func checkUI(t *testing.T, ctx context.Context, web *webClient) {
	resp, err := http.Get(web.base + "/")
	if err != nil {
		t.Fatalf("UI through kubectl port-forward: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "<title>dualflow</title>") {
		t.Fatalf("UI through kubectl port-forward: %s, %d bytes", resp.Status, len(body))
	}
	var page api.FlowPage
	if err := web.get(ctx, "/api/v1/flows?limit=5", &page); err != nil {
		t.Fatalf("REST through kubectl port-forward: %v", err)
	}
	t.Logf("UI and REST through kubectl port-forward at %s", web.base)
}

// checkPolicy applies a NetworkPolicy that lets api be reached on its
// port only from node n1's pod subnet of the cluster's primary family (in
// dual mode: IPv4 allowed, IPv6 denied, from the same client), and checks
// that kube-router enforces it, connection by connection, and that
// dualflow's stored verdict and policy agree with what happened, in every
// family.
func checkPolicy(t *testing.T, ctx context.Context, c *Cluster, web *webClient) {
	const policy = "allow-n1-primary-family"
	allowed := c.plan.podSubnets(1)[0]
	yaml := fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: %s, namespace: %s}
spec:
  podSelector: {matchLabels: {app: api}}
  policyTypes: [Ingress]
  ingress:
  - from: [{ipBlock: {cidr: %s}}]
    ports: [{protocol: TCP, port: %d}]
`, policy, NSServer, allowed, ServerPort)
	if _, err := c.Kubectl(ctx, strings.NewReader(yaml), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	clients, err := c.Pods(ctx, NSClient, "web")
	if err != nil {
		t.Fatal(err)
	}
	servers, err := c.Pods(ctx, NSServer, "api")
	if err != nil {
		t.Fatal(err)
	}
	type attempt struct {
		client, server *corev1.Pod
		to             netip.AddrPort
		allow          bool
	}
	var attempts []attempt
	for i := range clients {
		cl := &clients[i]
		for j := range servers {
			for _, ip := range servers[j].Status.PodIPs {
				a := netip.MustParseAddr(ip.IP)
				allow := false
				for _, cip := range cl.Status.PodIPs {
					if ca := netip.MustParseAddr(cip.IP); ca.Is4() == a.Is4() && allowed.Contains(ca) {
						allow = true
					}
				}
				attempts = append(attempts, attempt{cl, &servers[j], netip.AddrPortFrom(a, ServerPort), allow})
			}
		}
	}
	// kube-router applies the policy within a few seconds: wait until every
	// attempt goes as the policy says, then keep the last round's.
	var last []string
	var round time.Time // the start of the last round of attempts
	err = poll(ctx, 2*time.Minute, func() (bool, error) {
		round = time.Now()
		for n := 1; n <= Nodes; n++ {
			if err := c.exited("kube-router-" + nodeName(n)); err != nil {
				return false, err
			}
		}
		last = last[:0]
		for _, at := range attempts {
			netns, err := PodNetNS(at.client)
			if err != nil {
				return false, err
			}
			_, err = agent.Dial(ctx, netns, agent.TCP, at.to, 3*time.Second)
			if (err == nil) != at.allow {
				last = append(last, fmt.Sprintf("%s → %s (%s): connected %v, want %v", at.client.Name, at.to, at.server.Name, err == nil, at.allow))
			}
		}
		return len(last) == 0, nil
	})
	if err != nil {
		t.Fatalf("kube-router does not enforce %s as written: %v\n%s", policy, err, strings.Join(last, "\n"))
	}
	enforced := time.Since(applied)
	// The collector learns the policy from its informer, which may lag
	// kube-router by a moment on a loaded machine: a trace names a drop's
	// policy only from the collector's view (an operator who traces right
	// after applying a policy sees the datapath's rule until then). Wait
	// until the audit's evaluation over REST agrees with every attempt.
	var disagree []string
	err = poll(ctx, 2*time.Minute, func() (bool, error) {
		disagree = disagree[:0]
		for _, at := range attempts {
			q := url.Values{"from": {NSClient + "/" + at.client.Name}, "to": {at.to.Addr().String()},
				"port": {strconv.Itoa(int(at.to.Port()))}, "family": {strconv.Itoa(family(at.to.Addr()))}}
			var res []audit.ProbeResult
			if err := web.get(ctx, "/api/v1/audit/evaluate?"+q.Encode(), &res); err != nil {
				return false, nil // the view not ready yet: 503
			}
			if len(res) != 1 || res[0].Allowed != at.allow {
				disagree = append(disagree, fmt.Sprintf("%s → %s: %+v, want allowed %v", at.client.Name, at.to, res, at.allow))
			}
		}
		return len(disagree) == 0, nil
	})
	if err != nil {
		t.Fatalf("the collector's audit does not evaluate %s as kube-router enforces it: %v\n%s", policy, err, strings.Join(disagree, "\n"))
	}
	traced := 0
	for _, at := range attempts {
		if checkTracedDrops(t, ctx, web, policy, at.client, at.server, at.to, at.allow) {
			traced++
		}
	}
	t.Logf("traceflow agrees with kube-router on %d of %d attempts", traced, len(attempts))
	counts := map[string]int{}
	for _, at := range attempts {
		fam := family(at.to.Addr())
		want := "denied"
		if at.allow {
			want = "allowed"
		}
		// kube-router rejects a denied connection in the node's FORWARD
		// (through the bridge's netfilter hooks) before conntrack confirms
		// it: between two pods of one node it leaves no conntrack entry,
		// so no exporter can report it (seen with conntrack -E; the trace
		// above shows its drop). Across nodes the client's node forwards
		// it and tracks it, and that row must say denied.
		if !at.allow && at.client.Spec.NodeName == at.server.Spec.NodeName {
			continue
		}
		what := fmt.Sprintf("IPv%d %s → %s", fam, at.client.Name, at.to)
		err := poll(ctx, 2*time.Minute, func() (bool, error) {
			q := url.Values{"src_pod": {NSClient + "/" + at.client.Name}, "dst_pod": {NSServer + "/" + at.server.Name},
				"ip_version": {fmt.Sprint(fam)}, "limit": {"1000"}, "since": {"30m"}}
			var page api.FlowPage
			if err := web.get(ctx, "/api/v1/flows?"+q.Encode(), &page); err != nil {
				return false, nil
			}
			for _, f := range page.Flows {
				if f.FlowStartMs < applied.UnixMilli()-1000 || f.DstPort != ServerPort || f.DstIP != at.to.Addr().String() {
					continue
				}
				if f.Ingress != want || f.IngressPol != NSServer+"/"+policy {
					return false, fmt.Errorf("%s: stored ingress %s by %q, want %s by %s/%s (kube-router: connected %v)",
						what, f.Ingress, f.IngressPol, want, NSServer, policy, at.allow)
				}
				return true, nil
			}
			return false, nil
		})
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		counts[fmt.Sprintf("IPv%d %s", fam, want)]++
	}
	t.Logf("kube-router enforced %s within %s; dualflow's verdicts agree: %v", policy, enforced.Round(100*time.Millisecond), counts)

	// The kubelet's readiness probes of the isolated api pods come from
	// their node (the bridge's gateway): NetworkPolicy cannot restrict
	// them, and kube-router lets them in (the pods stay ready). dualflow
	// attributes the source to the node and stores them as allowed. The
	// kubelet probes a pod's primary address (status.podIP) only.
	for i := range servers {
		sv := &servers[i]
		for _, ip := range []string{sv.Status.PodIP} {
			fam := family(netip.MustParseAddr(ip))
			what := fmt.Sprintf("IPv%d kubelet probes of %s on %s", fam, sv.Name, sv.Spec.NodeName)
			var last string
			err := poll(ctx, 2*time.Minute, func() (bool, error) {
				q := url.Values{"dst_pod": {NSServer + "/" + sv.Name}, "ip_version": {fmt.Sprint(fam)}, "dst_port": {fmt.Sprint(ServerPort)},
					"limit": {"1000"}, "since": {"30m"}}
				var page api.FlowPage
				if err := web.get(ctx, "/api/v1/flows?"+q.Encode(), &page); err != nil {
					return false, nil
				}
				for _, f := range page.Flows {
					if f.FlowStartMs < applied.UnixMilli() || f.SrcPod != "" || f.SrcNode != sv.Spec.NodeName {
						continue
					}
					if f.Ingress != "allowed" {
						last = fmt.Sprintf("from %s (node %s): ingress %s by %q", f.SrcIP, f.SrcNode, f.Ingress, f.IngressPol)
						return false, nil
					}
					return true, nil
				}
				return false, nil
			})
			if err != nil {
				t.Errorf("%s: %v; last %s", what, err, last)
			}
		}
	}

	// The reachability matrix, from the collector's live view: each
	// client pod → api pod cell says, per family, what kube-router did,
	// and that it agrees with the flows observed in the last round of
	// attempts (earlier ones raced kube-router's first sync).
	since := round.Truncate(time.Second).Add(time.Second)
	req := api.ReachabilityRequest{Protocol: "tcp", Port: ServerPort, Since: since.UTC().Format(time.RFC3339)}
	for _, cl := range clients {
		req.Sources = append(req.Sources, audit.Endpoint{Kind: "pod", Namespace: cl.Namespace, Name: cl.Name})
	}
	for _, sv := range servers {
		req.Destinations = append(req.Destinations, audit.Endpoint{Kind: "pod", Namespace: sv.Namespace, Name: sv.Name})
	}
	var res api.Reachability
	if err := web.post(ctx, "/api/v1/reachability", req, &res); err != nil {
		t.Fatal(err)
	}
	cells := 0
	for _, at := range attempts {
		i := slices.IndexFunc(clients, func(p corev1.Pod) bool { return p.Name == at.client.Name })
		j := slices.IndexFunc(servers, func(p corev1.Pod) bool { return p.Name == at.server.Name })
		fam := res.Cells[i][j].Families[fmt.Sprint(family(at.to.Addr()))]
		want := "deny"
		if at.allow {
			want = "allow"
		}
		switch {
		case fam == nil:
			t.Errorf("reachability %s → %s: no IPv%d answer", at.client.Name, at.server.Name, family(at.to.Addr()))
		case fam.Outcome != want || fam.Mismatch != "":
			t.Errorf("reachability %s → %s IPv%d: %s (%s), mismatch %q; kube-router: connected %v",
				at.client.Name, at.server.Name, family(at.to.Addr()), fam.Outcome, fam.Reason, fam.Mismatch, at.allow)
		default:
			cells++
		}
	}
	t.Logf("reachability over REST agrees with kube-router on %d cell families, and with the observed flows", cells)

	denied := map[uint8]bool{}
	for _, at := range attempts {
		if !at.allow {
			denied[uint8(family(at.to.Addr()))] = true
		}
	}
	checkAudit(t, ctx, web, policy, len(clients[0].Status.PodIPs) == 2, denied, applied)
	if _, err := c.Kubectl(ctx, nil, "-n", NSServer, "delete", "networkpolicy", policy); err != nil {
		t.Fatal(err)
	}
}

// screenshot opens the flows page in headless Chromium through the
// port-forward, as an operator who pasted the token, waits for rows, and
// keeps the page as test/artifacts/cluster-<mode>-flows.png.
func screenshot(t *testing.T, ctx context.Context, web *webClient, token string, mode manifest.Mode) {
	chrome, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("no chromium (scripts/deps.sh installs it): %v", err)
	}
	actx, cancelA := chromedp.NewExecAllocator(ctx, chromedp.ExecPath(chrome),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1400, 900))
	defer cancelA()
	bctx, cancelB := chromedp.NewContext(actx)
	defer cancelB()
	bctx, cancelT := context.WithTimeout(bctx, 2*time.Minute)
	defer cancelT()
	setToken := chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument, page.AddScriptToEvaluateOnNewDocumentParams{
			Source: "try { localStorage.setItem('dualflow.token', '" + token + "') } catch (e) {}",
		})
		return err
	})
	if err := chromedp.Do(bctx, chromedp.Navigate("about:blank"), setToken,
		chromedp.Navigate(web.base+"/#/flows"), chromedp.WaitVisible(chromedp.CSS(`#page-flows`))); err != nil {
		t.Fatalf("chromium: %v", err)
	}
	err = poll(bctx, time.Minute, func() (bool, error) {
		n, err := chromedp.Run(bctx, chromedp.Evaluate[float64](`document.querySelectorAll('#flow-table tbody tr').length`))
		return err == nil && n > 0, nil
	})
	if err != nil {
		t.Errorf("the flows page showed no rows: %v", err)
	}
	buf, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := filepath.Join(RepoRoot(), "test", "artifacts")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f := filepath.Join(dir, "cluster-"+string(mode)+"-flows.png")
	if err := os.WriteFile(f, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of the flows page through kubectl port-forward: %s", f)
}
