package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/lab"
	labagent "github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/labcmd"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/traceflow"
)

// traceEnv is one lab with the product on it: every trace goes through the
// REST API, the controller and the exporters' node agents.
type traceEnv struct {
	l               *lab.Lab
	mode            manifest.Mode
	base            string // the web's URL
	web, api, probe map[int]*corev1.Pod
}

func newTraceEnv(t *testing.T, l *lab.Lab, mode manifest.Mode) *traceEnv {
	t.Helper()
	_, base := startProduct(t, l)
	e := &traceEnv{l: l, mode: mode, base: base, web: map[int]*corev1.Pod{}, api: map[int]*corev1.Pod{}, probe: map[int]*corev1.Pod{}}
	for i := 1; i <= 2; i++ {
		for _, x := range []struct {
			m       map[int]*corev1.Pod
			ns, app string
		}{{e.web, manifest.NSFrontend, "web"}, {e.api, manifest.NSBackend, "api"}, {e.probe, manifest.NSTools, "probe"}} {
			p, err := l.PodOn(x.ns, x.app, i)
			if err != nil {
				t.Fatal(err)
			}
			x.m[i] = p
		}
	}
	return e
}

func ref(p *corev1.Pod) string { return p.Namespace + "/" + p.Name }

// family is the request family covering the lab's mode.
func (e *traceEnv) family() traceflow.Family { return traceflow.Family(e.mode) }

// trace runs req (family defaulted to the mode's) through the REST API and
// checks the result is final, has one result per requested family, and is
// what GET /api/v1/traceflows/{id} answers too.
func (e *traceEnv) trace(t *testing.T, req traceflow.Request) traceflow.Result {
	t.Helper()
	if req.Family == "" {
		req.Family = e.family()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, _, err := restTrace(ctx, e.base, req)
	if err != nil {
		t.Fatalf("trace %s -> %s: %v", req.Source, req.Destination, err)
	}
	if res.Phase == traceflow.Running {
		t.Fatalf("trace %s still running after ?wait=true", res.ID)
	}
	if len(res.Families) != len(req.Family.Families()) {
		t.Fatalf("got %d family results, want %d", len(res.Families), len(req.Family.Families()))
	}
	got, err := restWait(ctx, e.base, res.ID)
	if err != nil || got.Phase != res.Phase {
		t.Errorf("GET phase %s (%v), POST phase %s", got.Phase, err, res.Phase)
	}
	return res
}

// traceLive starts a live trace of req, dials from -> to over TCP every
// 150 ms until it ends, and returns its result.
func (e *traceEnv) traceLive(t *testing.T, req traceflow.Request, from *corev1.Pod, to netip.AddrPort) traceflow.Result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	id, err := restStart(ctx, e.base, req)
	if err != nil {
		t.Fatalf("live trace: %v", err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(150 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				wg.Go(func() { labDial(ctx, e.l, from, labagent.TCP, to) }) // a denied dial blocks for the dial timeout
			}
		}
	})
	res, err := restWait(ctx, e.base, id)
	close(stop)
	wg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// modeFamilies returns the result families of the lab's mode.
func (e *traceEnv) modeFamilies() []traceflow.Family { return e.family().Families() }

func k8sFam(f traceflow.Family) corev1.IPFamily {
	if f == traceflow.IPv6 {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

func dump(fr traceflow.FamilyResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %q\n", fr.Family, fr.Outcome, fr.Reason)
	for _, o := range fr.Observations {
		fmt.Fprintf(&b, "  %+v\n", o)
	}
	return b.String()
}

// wantDelivered checks every family of res was delivered to pod (any of
// pods for a Service).
func wantDelivered(t *testing.T, e *traceEnv, res traceflow.Result, pods ...*corev1.Pod) {
	t.Helper()
	if res.Phase != traceflow.Succeeded {
		t.Errorf("phase %s (%s), want succeeded", res.Phase, res.Reason)
	}
	for _, fr := range res.Families {
		f := fr.Family
		if fr.Outcome != traceflow.Delivered {
			t.Errorf("%s: outcome %s (%s), want delivered\n%s", f, fr.Outcome, fr.Reason, dump(fr))
			continue
		}
		last := fr.Observations[len(fr.Observations)-1]
		if last.Component != traceflow.Delivery || last.Action != traceflow.ActionDelivered {
			t.Errorf("%s: last observation %+v, want a delivery", f, last)
		}
		if !slices.ContainsFunc(pods, func(p *corev1.Pod) bool { return ref(p) == last.Pod && p.Spec.NodeName == last.Node }) {
			t.Errorf("%s: delivered to %s on %s, want one of %d pods", f, last.Pod, last.Node, len(pods))
		}
		if first := fr.Observations[0]; first.Action != traceflow.ActionReceived {
			t.Errorf("%s: first observation %+v, want received at the source node", f, first)
		}
		if fr.Src.Is4() != (f == traceflow.IPv4) || fr.Dst.Is4() != (f == traceflow.IPv4) {
			t.Errorf("%s: probe %s -> %s of the wrong family", f, fr.Src, fr.Dst)
		}
	}
}

// traceScenarios run on both datapaths, in every mode.
var traceScenarios = []struct {
	name string
	run  func(t *testing.T, e *traceEnv)
}{
	{"pod-to-pod-same-node", func(t *testing.T, e *traceEnv) {
		res := e.trace(t, traceflow.Request{Source: ref(e.web[1]), Destination: traceflow.Destination{Pod: ref(e.api[1]), Port: 8080}})
		wantDelivered(t, e, res, e.api[1])
		for _, fr := range res.Families {
			for _, o := range fr.Observations {
				if o.Node != e.api[1].Spec.NodeName {
					t.Errorf("%s: observation on %s, want only %s", fr.Family, o.Node, e.api[1].Spec.NodeName)
				}
			}
			if !slices.ContainsFunc(fr.Observations, func(o traceflow.Observation) bool {
				return o.Component == traceflow.NetworkPolicy && o.Rule == nft.RuleName(manifest.NSBackend, "allow-web-to-api", nft.Ingress, 0)
			}) {
				t.Errorf("%s: no allow by backend/allow-web-to-api/ingress/0:\n%s", fr.Family, dump(fr))
			}
		}
	}},
	{"pod-to-pod-across-nodes", func(t *testing.T, e *traceEnv) {
		res := e.trace(t, traceflow.Request{Source: ref(e.web[1]), Destination: traceflow.Destination{Pod: ref(e.api[2]), Port: 8080}})
		wantDelivered(t, e, res, e.api[2])
		for _, fr := range res.Families {
			var nodes []string
			for _, o := range fr.Observations {
				if len(nodes) == 0 || nodes[len(nodes)-1] != o.Node {
					nodes = append(nodes, o.Node)
				}
			}
			if !slices.Equal(nodes, []string{"node-1", "node-2"}) {
				t.Errorf("%s: path over nodes %v, want [node-1 node-2]", fr.Family, nodes)
			}
		}
	}},
	{"pod-to-service", func(t *testing.T, e *traceEnv) {
		res := e.trace(t, traceflow.Request{Source: ref(e.web[1]), Destination: traceflow.Destination{Service: "backend/api", Port: 80}})
		wantDelivered(t, e, res, e.api[1], e.api[2])
		for _, fr := range res.Families {
			i := slices.IndexFunc(fr.Observations, func(o traceflow.Observation) bool { return o.Component == traceflow.LoadBalancing })
			if i < 0 {
				t.Errorf("%s: no load-balancing observation:\n%s", fr.Family, dump(fr))
				continue
			}
			lb := fr.Observations[i]
			last := fr.Observations[len(fr.Observations)-1]
			p, _ := labPod(e.l, last.Pod)
			want, _ := manifest.PodAddr(p, k8sFam(fr.Family))
			if lb.Service != "backend/api" || lb.TranslatedDst.Addr() != want || lb.TranslatedDst.Port() != 8080 {
				t.Errorf("%s: load balancing %+v, want backend/api DNAT to %s:8080", fr.Family, lb, want)
			}
			if lb.Node != "node-1" {
				t.Errorf("%s: DNAT on %s, want the source node", fr.Family, lb.Node)
			}
		}
	}},
	{"policy-denied", func(t *testing.T, e *traceEnv) {
		res := e.trace(t, traceflow.Request{Source: ref(e.probe[1]), Destination: traceflow.Destination{Pod: ref(e.api[2]), Port: 8080}})
		if res.Phase != traceflow.Succeeded {
			t.Errorf("phase %s (%s), want succeeded (a drop is an outcome)", res.Phase, res.Reason)
		}
		drop := nft.DropName(nft.Ingress, manifest.NSBackend, e.api[2].Name)
		for _, fr := range res.Families {
			if fr.Outcome != traceflow.Dropped {
				t.Errorf("%s: outcome %s, want dropped\n%s", fr.Family, fr.Outcome, dump(fr))
				continue
			}
			last := fr.Observations[len(fr.Observations)-1]
			if last.Component != traceflow.NetworkPolicy || last.Action != traceflow.ActionDropped || last.Rule != drop ||
				last.Policy != "backend/default-deny-ingress" || last.Node != "node-2" || !strings.Contains(last.Detail, drop) {
				t.Errorf("%s: last observation %+v, want a drop on node-2 by %s (backend/default-deny-ingress, the rule in its detail)", fr.Family, last, drop)
			}
			// The one explanation of a drop (policy.Explanation), the
			// datapath's counter name left to the detail.
			want := "dropped on node-2: ingress denied by backend/default-deny-ingress, which isolates " + manifest.NSBackend + "/" + e.api[2].Name +
				": no ingress rule of "
			if !strings.HasPrefix(fr.Reason, want) || !strings.Contains(fr.Reason, map[traceflow.Family]string{traceflow.IPv4: "IPv4", traceflow.IPv6: "IPv6"}[fr.Family]+" TCP/8080 (http) from tools/") || strings.Contains(fr.Reason, drop) {
				t.Errorf("%s: reason %q, want the explanation %q…", fr.Family, fr.Reason, want)
			}
		}
	}},
	{"udp-and-icmp", func(t *testing.T, e *traceEnv) {
		res := e.trace(t, traceflow.Request{Source: ref(e.web[2]), Destination: traceflow.Destination{Service: "backend/api", Port: 53}, Protocol: traceflow.UDP})
		wantDelivered(t, e, res, e.api[1], e.api[2])
		// ICMP to the api pods is not allowed by any rule: dropped.
		res = e.trace(t, traceflow.Request{Source: ref(e.web[1]), Destination: traceflow.Destination{Pod: ref(e.api[2])}, Protocol: traceflow.ICMP})
		for _, fr := range res.Families {
			if fr.Outcome != traceflow.Dropped {
				t.Errorf("%s %s: outcome %s, want dropped by the default deny\n%s", fr.Family, fr.Protocol, fr.Outcome, dump(fr))
			}
		}
		// ICMP between pods that no policy isolates: delivered.
		res = e.trace(t, traceflow.Request{Source: ref(e.web[1]), Destination: traceflow.Destination{Pod: ref(e.web[2])}, Protocol: traceflow.ICMP})
		wantDelivered(t, e, res, e.web[2])
	}},
	{"single-family-service-dual", func(t *testing.T, e *traceEnv) {
		res := e.trace(t, traceflow.Request{Source: ref(e.web[1]), Destination: traceflow.Destination{Service: "backend/api-single", Port: 8080}, Family: traceflow.Dual})
		has := map[traceflow.Family]bool{}
		for _, f := range e.modeFamilies() {
			has[f] = true
		}
		missing := map[manifest.Mode]traceflow.Family{manifest.ModeDual: traceflow.IPv6, manifest.ModeIPv4: traceflow.IPv6, manifest.ModeIPv6: traceflow.IPv4}[e.mode]
		for _, fr := range res.Families {
			if fr.Family == missing {
				if fr.Outcome != traceflow.NoAddress || !strings.Contains(fr.Reason, "has no "+map[traceflow.Family]string{traceflow.IPv4: "IPv4", traceflow.IPv6: "IPv6"}[missing]) {
					t.Errorf("%s: outcome %s %q, want no-address with a clear reason", fr.Family, fr.Outcome, fr.Reason)
				}
				if e.mode == manifest.ModeDual && fr.Reason != "no address of this family: service backend/api-single has no IPv6 ClusterIP" {
					t.Errorf("reason %q", fr.Reason)
				}
				continue
			}
			if fr.Outcome != traceflow.Delivered {
				t.Errorf("%s: outcome %s (%s), want delivered\n%s", fr.Family, fr.Outcome, fr.Reason, dump(fr))
			}
		}
		if res.Phase != traceflow.Succeeded {
			t.Errorf("phase %s (%s)", res.Phase, res.Reason)
		}
	}},
	{"timeout-with-reason", func(t *testing.T, e *traceEnv) {
		// An address of node-2's pod range that no pod has: inside the
		// cluster (a destination outside it is refused unless allowed),
		// but nothing answers it, so neither delivery nor a drop rule.
		dst := map[traceflow.Family]string{traceflow.IPv4: "198.18.2.250", traceflow.IPv6: "fd00:10:0:2::250"}
		for _, f := range e.modeFamilies() {
			d, _ := traceflow.ParseDestination("ip:" + dst[f])
			d.Port = 8080
			start := time.Now()
			res := e.trace(t, traceflow.Request{Source: ref(e.web[1]), Destination: d, Family: f, Timeout: traceflow.Duration(400 * time.Millisecond)})
			fr := res.Families[0]
			if res.Phase != traceflow.Failed || fr.Outcome != traceflow.TimedOut || !strings.Contains(fr.Reason, "timeout") {
				t.Errorf("%s: phase %s outcome %s reason %q, want failed/timeout with a reason", f, res.Phase, fr.Outcome, fr.Reason)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("%s: timed-out trace took %v", f, took)
			}
		}
	}},
	{"live-traffic", func(t *testing.T, e *traceEnv) {
		// Kernel datapath only (OVS answers "not supported yet").
		web1 := e.web[1]
		for _, f := range e.modeFamilies() {
			svc, _ := e.l.Manifest.Service(manifest.NSBackend, "api")
			vip, _ := manifest.ServiceAddr(svc, k8sFam(f))
			res := e.traceLive(t, traceflow.Request{Source: ref(web1), Destination: traceflow.Destination{Service: "backend/api", Port: 80}, Family: f,
				LiveTraffic: true, Timeout: traceflow.Duration(10 * time.Second)}, web1, netip.AddrPortFrom(vip, 80))
			if e.l.State().Datapath == lab.DatapathOVS {
				if fr := res.Families[0]; fr.Outcome != traceflow.Error || !strings.Contains(fr.Reason, "not supported yet") {
					t.Errorf("%s: OVS live trace %s %q, want a not-supported error", f, fr.Outcome, fr.Reason)
				}
				continue
			}
			wantDelivered(t, e, res, e.api[1], e.api[2])
			if fr := res.Families[0]; fr.SrcPort == 0 || !slices.ContainsFunc(fr.Observations, func(o traceflow.Observation) bool {
				return o.Component == traceflow.LoadBalancing && o.TranslatedDst.Port() == 8080
			}) {
				t.Errorf("%s: live trace without the traced port or the DNAT:\n%s", f, dump(fr))
			}
		}
	}},
	{"live-dropped-only", func(t *testing.T, e *traceEnv) {
		if e.l.State().Datapath == lab.DatapathOVS {
			t.Skip("live traffic: kernel datapath only")
		}
		// tools/probe-1 -> api@2:8080 is denied by backend's default
		// deny in every family; the first dropped connection is reported.
		for _, f := range e.modeFamilies() {
			dst, _ := manifest.PodAddr(e.api[2], k8sFam(f))
			res := e.traceLive(t, traceflow.Request{Source: ref(e.probe[1]), Destination: traceflow.Destination{Pod: ref(e.api[2]), Port: 8080}, Family: f,
				LiveTraffic: true, DroppedOnly: true, Timeout: traceflow.Duration(10 * time.Second)}, e.probe[1], netip.AddrPortFrom(dst, 8080))
			fr := res.Families[0]
			drop := nft.DropName(nft.Ingress, manifest.NSBackend, e.api[2].Name)
			if fr.Outcome != traceflow.Dropped || !slices.ContainsFunc(fr.Observations, func(o traceflow.Observation) bool { return o.Rule == drop && o.Node == "node-2" }) {
				t.Errorf("%s: %s", f, dump(fr))
			}
		}
	}},
	{"concurrent-traces-apart", func(t *testing.T, e *traceEnv) {
		// Same source pod, different destinations, all at once.
		type job struct {
			dst  traceflow.Destination
			want traceflow.Outcome
		}
		jobs := []job{
			{traceflow.Destination{Pod: ref(e.api[1]), Port: 8080}, traceflow.Delivered},
			{traceflow.Destination{Pod: ref(e.api[2]), Port: 8080}, traceflow.Delivered},
			{traceflow.Destination{Pod: ref(e.api[2]), Port: 7070}, traceflow.Dropped},
			{traceflow.Destination{Service: "backend/api", Port: 80}, traceflow.Delivered},
			{traceflow.Destination{Pod: ref(e.web[2]), Port: 8080}, traceflow.Delivered},
			{traceflow.Destination{Pod: ref(e.api[1]), Port: 9999}, traceflow.Dropped},
		}
		var wg sync.WaitGroup
		for _, j := range jobs {
			wg.Go(func() {
				// A dozen family traces set up at once on a loaded 2-core
				// machine: the timeout only bounds what never arrives.
				res := e.trace(t, traceflow.Request{Source: ref(e.web[1]), Destination: j.dst, Timeout: traceflow.Duration(30 * time.Second)})
				for _, fr := range res.Families {
					if fr.Outcome != j.want {
						t.Errorf("%s %s: outcome %s, want %s\n%s", j.dst, fr.Family, fr.Outcome, j.want, dump(fr))
					}
					for _, o := range fr.Observations {
						if o.TranslatedDst.IsValid() && o.TranslatedDst.Addr().Is4() != (fr.Family == traceflow.IPv4) {
							t.Errorf("%s %s: observation of the other family: %+v", j.dst, fr.Family, o)
						}
						if o.Component == traceflow.Delivery && j.dst.Pod != "" && o.Pod != j.dst.Pod {
							t.Errorf("%s %s: delivered to %s", j.dst, fr.Family, o.Pod)
						}
					}
				}
			})
		}
		wg.Wait()
	}},
}

// TestTraceflow traces the scenarios on the kernel datapath (nftables
// trace, conntrack, capture) in the three modes, in parallel.
func TestTraceflow(t *testing.T) {
	requirePrereqs(t)
	// Serial: a dozen traces at once, whose monitors starve beside other tests (runTraceflow).
	runTraceflow(t, lab.DatapathKernel, "trace")
}

// TestTraceflowOVS traces the same scenarios on the OVS datapath
// (ofproto/trace, drop packet-ins, capture).
func TestTraceflowOVS(t *testing.T) {
	requireOVS(t)
	// Serial: as TestTraceflow.
	runTraceflow(t, lab.DatapathOVS, "ovs-trace")
}

func runTraceflow(t *testing.T, datapath, label string) {
	// The modes run one after the other: every scenario watches all nodes
	// with nft monitor (or ovs-ofctl monitor) processes, a dozen at once in
	// concurrent-traces-apart; three labs doing that together on a 2-core
	// machine starve the monitors, and probes are missed.
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			l := startLabOn(t, mode, datapath)
			e := newTraceEnv(t, l, mode)
			for _, sc := range traceScenarios {
				t.Run(sc.name, func(t *testing.T) {
					recordAs(t, string(mode)+"/"+label)
					sc.run(t, e)
				})
			}
		})
	}
}

// BenchmarkTraceDual measures a dual-family pod-to-Service trace in a dual
// lab (root only), on each datapath, and reports the median, which must
// stay under 1 s.
func BenchmarkTraceDual(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (network namespaces)")
	}
	if _, err := lab.NFTPath(); err != nil {
		b.Skip(err)
	}
	for _, dp := range []string{lab.DatapathKernel, lab.DatapathOVS} {
		b.Run(dp, func(b *testing.B) {
			if _, err := exec.LookPath("ovs-vswitchd"); dp == lab.DatapathOVS && err != nil {
				b.Skip("Open vSwitch not installed")
			}
			benchTraceDual(b, dp)
		})
	}
}

func benchTraceDual(b *testing.B, datapath string) {
	prefix, dir := labPrefix(), b.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	l, err := lab.Up(ctx, lab.Config{Mode: manifest.ModeDual, Prefix: prefix, StateDir: dir, Datapath: datapath})
	b.Cleanup(func() {
		if l != nil {
			l.Close()
		}
		lab.Down(dir, prefix)
	})
	if err != nil {
		b.Fatal(err)
	}
	_, base := startProduct(b, l)
	web, _ := l.PodOn(manifest.NSFrontend, "web", 1)
	req := traceflow.Request{Source: ref(web), Destination: traceflow.Destination{Service: "backend/api", Port: 80}, Family: traceflow.Dual}
	var took []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		res, _, err := restTrace(ctx, base, req)
		if err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(start))
		if res.Phase != traceflow.Succeeded {
			b.Fatalf("trace %s: %s", res.Phase, res.Reason)
		}
	}
	slices.Sort(took)
	med := took[len(took)/2]
	b.ReportMetric(float64(med.Microseconds())/1000, "ms/median")
	b.ReportMetric(float64(took[len(took)*95/100].Microseconds())/1000, "ms/p95")
	if med > time.Second {
		b.Errorf("median dual trace %v, want under 1s", med)
	}
}

// TestTraceCLI runs `dualflow trace` against the REST API of the product
// running on a lab (found through the lab's state dir, as for the demo):
// both families side by side, exit 0 when both arrive, non-zero with a
// clear reason when one family has no address (backend/api-single).
func TestTraceCLI(t *testing.T) {
	requirePrereqs(t)
	// Serial: traces, as TestTraceflow.
	recordAs(t, "dual/trace-cli")
	bin := buildBinary(t)
	l := startLab(t, manifest.ModeDual)
	_, base := startProduct(t, l)
	// What the demo writes for `dualflow trace` without --server.
	dir := filepath.Dir(l.ManifestPath())
	if err := os.WriteFile(filepath.Join(dir, "web-url"), []byte(base+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "web-token-file"), []byte(operatorTokenFile(base)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	web, err := l.PodOn(manifest.NSFrontend, "web", 1)
	if err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(bin, append([]string{"trace", "--state-dir", dir, "-s", ref(web)}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := run("-d", "svc:backend/api:80", "--family", "dual")
	if err != nil {
		t.Fatalf("trace to backend/api: %v\n%s", err, out)
	}
	// The text output: each family's path, within 100 columns, and a last
	// line saying which families arrived (cmd/dualflow's TestPrintTrace
	// checks the layout).
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if strings.Count(out, "\nIPv4  ") != 1 || strings.Count(out, "\nIPv6  ") != 1 || strings.Count(out, "=> DELIVERED") != 2 ||
		lines[len(lines)-1] != "arrived: IPv4, IPv6 (exit status 0)" {
		t.Errorf("want both families, delivered:\n%s", out)
	}
	out, err = run("-d", "svc:backend/api-single:8080", "--family", "dual")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("trace to backend/api-single: err %v, want exit status 1\n%s", err, out)
	}
	// Long reasons wrap onto indented lines: compare the words.
	if words := strings.Join(strings.Fields(out), " "); !strings.Contains(words, "service backend/api-single has no IPv6 ClusterIP") ||
		!strings.Contains(words, "=> DELIVERED") || !strings.Contains(words, "did not arrive: IPv6 no-address (exit status 1)") {
		t.Errorf("want IPv4 delivered and a clear IPv6 reason:\n%s", out)
	}
	out, err = run("-d", "pod:"+ref(web)+":8080", "--family", "ipv6", "--json", "--server", base)
	var res traceflow.Result
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Phase != traceflow.Succeeded {
		t.Errorf("--json: %v\n%s", err, out)
	}
	// Workload ends, as the UI sends them: one pod of each, the same for
	// both families, named in the result.
	out, err = run("-s", "workload:"+manifest.NSFrontend+"/web", "-d", "workload:"+manifest.NSBackend+"/api:8080", "--family", "dual", "--json", "--server", base)
	res = traceflow.Result{}
	if err != nil || json.Unmarshal([]byte(out), &res) != nil || res.Phase != traceflow.Succeeded || len(res.Families) != 2 ||
		res.Request.SourceWorkload != manifest.NSFrontend+"/web" || !strings.HasPrefix(res.Request.Source, manifest.NSFrontend+"/web-") ||
		!strings.HasPrefix(res.Request.Destination.Pod, manifest.NSBackend+"/api-") {
		t.Errorf("workload to workload: %v\n%s", err, out)
	}
	for _, fr := range res.Families {
		if fr.Outcome != traceflow.Delivered {
			t.Errorf("workload to workload %s: %s (%s)", fr.Family, fr.Outcome, fr.Reason)
		}
	}
}

// TestTraceflowAgent checks the failures of the agent API through REST: an
// agent refuses a wrong token (and the trace says unauthorized, naming the
// node), and an agent that is down is reported as unreachable.
func TestTraceflowAgent(t *testing.T) {
	requirePrereqs(t)
	// Serial: traces, as TestTraceflow.
	recordAs(t, "dual/trace-agent")
	l := startLab(t, manifest.ModeDual)
	web, _ := l.PodOn(manifest.NSFrontend, "web", 1)
	api2, _ := l.PodOn(manifest.NSBackend, "api", 2)
	req := traceflow.Request{Source: ref(web), Destination: traceflow.Destination{Pod: ref(api2), Port: 8080}, Family: traceflow.Dual}
	try := func(opts labcmd.ProductOptions, also func(p *labcmd.Product)) traceflow.Result {
		p, base := startProductWith(t, l, opts)
		defer p.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		res, _, err := restTrace(ctx, base, req)
		if err != nil {
			t.Fatal(err)
		}
		if also != nil {
			also(p)
		}
		return res
	}

	res := try(labcmd.ProductOptions{}, func(p *labcmd.Product) {
		// The agent itself refuses a call without the token.
		code, err := restCall(context.Background(), http.MethodGet, p.Agents["node-1"]+"/agent/v1/info", nil, nil)
		if code != http.StatusUnauthorized {
			t.Errorf("agent without a token: %d %v, want 401", code, err)
		}
	})
	for _, fr := range res.Families {
		if fr.Outcome != traceflow.Delivered {
			t.Errorf("%s: %s %s", fr.Family, fr.Outcome, fr.Reason)
		}
	}

	wrong := filepath.Join(t.TempDir(), "token")
	os.WriteFile(wrong, []byte("not-the-token\n"), 0o600)
	res = try(labcmd.ProductOptions{ControllerTokenFile: wrong}, nil)
	if res.Phase != traceflow.Failed || !strings.Contains(res.Reason, "unauthorized") || !strings.Contains(res.Reason, "node node-1") {
		t.Errorf("wrong token: phase %s, reason %q; want failed, unauthorized, naming the node", res.Phase, res.Reason)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String() // nobody serves it once closed
	ln.Close()
	res = try(labcmd.ProductOptions{AgentURLs: map[string]string{"node-2": dead}}, nil)
	if res.Phase != traceflow.Failed || !strings.Contains(res.Reason, "node node-2") || !strings.Contains(res.Reason, "unreachable") {
		t.Errorf("agent down: phase %s, reason %q; want failed, node-2 unreachable", res.Phase, res.Reason)
	}
}
