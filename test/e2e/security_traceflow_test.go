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
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/app"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/labcmd"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/nsrun"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/traceflow/observe"
	"github.com/dualflow/dualflow/traceflow/packet"
)

// The traceflow abuse cases of issue 33 (items 10 and 11), against a real
// lab with the product on it, in the three IP modes: the agent's
// /agent/v1/inject and the REST API's POST /api/v1/traceflows are rate
// limited (429 with Retry-After) while a normal trace is not; probes that
// a trace does not need (TCP flags other than SYN, a TTL below the floor)
// and destinations outside the cluster are refused; 128 watches at once on
// one agent all become ready and leave no trace table behind.

// tfsEnv is one lab with the product on it and direct access to the
// node agents (their URLs and token), as an attacker holding the agent
// token would have.
type tfsEnv struct {
	l     *lab.Lab
	mode  manifest.Mode
	p     *labcmd.Product
	base  string // the web's URL
	token string // the agents' token
	// webToken is the web's local operator token when it has one (a web
	// without a tokens file may want it for operator calls on loopback).
	webToken string
	web1     *corev1.Pod
	api1     *corev1.Pod
	api2     *corev1.Pod
}

// tfsStartProduct is startProductEdited with the app's configuration
// edited by edit (the traceflow settings under test).
func tfsStartProduct(t *testing.T, l *lab.Lab, edit func(*app.Config)) (*labcmd.Product, string) {
	t.Helper()
	return startProductEdited(t, l, labcmd.ProductOptions{}, edit)
}

func newTFSEnv(t *testing.T, mode manifest.Mode, edit func(*app.Config)) *tfsEnv {
	t.Helper()
	l := startLab(t, mode)
	p, base := tfsStartProduct(t, l, edit)
	tok, err := os.ReadFile(filepath.Join(filepath.Dir(l.ManifestPath()), "traceflow-token"))
	if err != nil {
		t.Fatal(err)
	}
	e := &tfsEnv{l: l, mode: mode, p: p, base: base, token: strings.TrimSpace(string(tok))}
	if b, err := os.ReadFile(operatorTokenFile(base)); err == nil {
		e.webToken = strings.TrimSpace(string(b))
	}
	for _, x := range []struct {
		pp      **corev1.Pod
		ns, app string
		node    int
	}{{&e.web1, manifest.NSFrontend, "web", 1}, {&e.api1, manifest.NSBackend, "api", 1}, {&e.api2, manifest.NSBackend, "api", 2}} {
		if *x.pp, err = l.PodOn(x.ns, x.app, x.node); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// families are the families of the lab's mode.
func (e *tfsEnv) families() []traceflow.Family { return traceflow.Family(e.mode).Families() }

func tfsAddr(t *testing.T, p *corev1.Pod, f traceflow.Family) netip.Addr {
	t.Helper()
	a, ok := manifest.PodAddr(p, k8sFam(f))
	if !ok {
		t.Fatalf("pod %s has no %s address", ref(p), f)
	}
	return a
}

// probe is a SYN from web-1 to api-1:8080 (both on node-1) of family f,
// as the controller sends it.
func (e *tfsEnv) probe(t *testing.T, f traceflow.Family, tag uint8, sport uint16) traceflow.Probe {
	return traceflow.Probe{Family: f, SourcePod: ref(e.web1), SourceNode: e.web1.Spec.NodeName,
		Src: tfsAddr(t, e.web1, f), Dst: tfsAddr(t, e.api1, f), DstPod: ref(e.api1), Protocol: traceflow.TCP,
		SrcPort: sport, DstPort: 8080, TCPFlags: packet.SYN, Tag: tag}
}

// tfsReply is an HTTP answer: its status, Retry-After and body.
type tfsReply struct {
	code       int
	retryAfter string
	body       string
}

// post sends body as JSON to url, with the bearer token when set.
func tfsPost(ctx context.Context, url, token string, body any) (tfsReply, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return tfsReply{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return tfsReply{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return tfsReply{}, err
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	return tfsReply{code: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(rb)}, nil
}

// inject asks node's agent directly to send p, with the agent token.
func (e *tfsEnv) inject(ctx context.Context, node string, p traceflow.Probe) (tfsReply, error) {
	return tfsPost(ctx, e.p.Agents[node]+"/agent/v1/inject", e.token, map[string]any{"probe": p})
}

// flood calls do from workers goroutines for d and counts the answers by
// status; every 429 must say when to come back.
type tfsFloodResult struct {
	byCode      map[int]int
	noRetry     int // 429 without a valid Retry-After
	errs        int
	firstErr    string
	took        time.Duration
	firstBodies map[int]string
}

func tfsFlood(workers int, d time.Duration, do func(ctx context.Context, i int) (tfsReply, error)) tfsFloodResult {
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	var mu sync.Mutex
	res := tfsFloodResult{byCode: map[int]int{}, firstBodies: map[int]string{}}
	var n atomic.Int64
	start := time.Now()
	end := start.Add(d)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for time.Now().Before(end) {
				r, err := do(ctx, int(n.Add(1)))
				mu.Lock()
				switch {
				case err != nil:
					res.errs++
					if res.firstErr == "" {
						res.firstErr = err.Error()
					}
				default:
					res.byCode[r.code]++
					if _, ok := res.firstBodies[r.code]; !ok {
						res.firstBodies[r.code] = r.body
					}
					if secs, err := strconv.Atoi(r.retryAfter); r.code == http.StatusTooManyRequests && (err != nil || secs < 1) {
						res.noRetry++
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.took = time.Since(start)
	return res
}

// rate is n per second over the flood.
func (r tfsFloodResult) rate(n int) float64 { return float64(n) / r.took.Seconds() }

// waitFor polls ok every 200 ms until it holds or d passed.
func tfsPoll(d time.Duration, ok func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if ok() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// deliveredTrace runs a dual-or-single (the mode's) pod-to-pod trace
// across nodes through REST and reports whether it was accepted and every
// family delivered, retrying while it is refused for its rate for up to d.
func (e *tfsEnv) deliveredTrace(t *testing.T, d time.Duration) traceflow.Result {
	t.Helper()
	req := traceflow.Request{Source: ref(e.web1), Destination: traceflow.Destination{Pod: ref(e.api2), Port: 8080}, Family: traceflow.Family(e.mode)}
	var res traceflow.Result
	var last string
	ok := tfsPoll(d, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r, err := tfsPost(ctx, e.base+"/api/v1/traceflows?wait=true", e.webToken, req)
		if err != nil || r.code != http.StatusOK {
			last = fmt.Sprintf("%d %v %s", r.code, err, r.body)
			return false
		}
		res = traceflow.Result{}
		if err := json.Unmarshal([]byte(r.body), &res); err != nil {
			last = err.Error()
			return false
		}
		return true
	})
	if !ok {
		t.Fatalf("trace %s -> %s not accepted within %v: %s", req.Source, req.Destination, d, last)
	}
	for _, fr := range res.Families {
		if fr.Outcome != traceflow.Delivered {
			t.Errorf("%s: %s (%s), want delivered\n%s", fr.Family, fr.Outcome, fr.Reason, dump(fr))
		}
	}
	return res
}

// TestSecurityTraceflowRateLimit: probes sent directly at an agent with
// the agent token, and traces started through REST, are rate limited
// (429 with Retry-After), at rates a normal trace (and a UI cell's dual
// trace) never reaches; once the caller waits, traces work again.
func TestSecurityTraceflowRateLimit(t *testing.T) {
	requirePrereqs(t)
	// Serial: it must send faster than the limits (beside other tests it sent 2.4 probes/s, and no 429 came).
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			recordAs(t, string(mode)+"/trace-security")
			e := newTFSEnv(t, mode, nil)
			fams := e.families()

			// A normal trace, and the dual traces of a few UI reachability
			// cells (workload to workload, as the UI asks), are never
			// refused.
			e.deliveredTrace(t, 0)
			cell := traceflow.Request{SourceWorkload: e.web1.Namespace + "/web", Family: traceflow.Dual, Protocol: traceflow.TCP,
				Destination: traceflow.Destination{Workload: e.api2.Namespace + "/api", Port: 8080}}
			for i := range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				r, err := tfsPost(ctx, e.base+"/api/v1/traceflows?wait=true", e.webToken, cell)
				cancel()
				if err != nil || r.code != http.StatusOK {
					t.Fatalf("UI cell trace %d: %d %v %s", i, r.code, err, r.body)
				}
			}

			// REST: as many traces as the caller can start in 3 s.
			req := traceflow.Request{Source: ref(e.web1), Destination: traceflow.Destination{Pod: ref(e.api1), Port: 8080}, Family: traceflow.Family(mode)}
			rest := tfsFlood(8, 3*time.Second, func(ctx context.Context, _ int) (tfsReply, error) {
				return tfsPost(ctx, e.base+"/api/v1/traceflows", e.webToken, req)
			})
			accepted := rest.byCode[http.StatusAccepted]
			t.Logf("REST POST /api/v1/traceflows, %s: %d traces accepted in %v = %.1f traces/s, %.1f probes/s (first sends); answers %v; errors %d %s",
				mode, accepted, rest.took.Round(time.Millisecond), rest.rate(accepted), rest.rate(accepted*len(fams)), rest.byCode, rest.errs, rest.firstErr)
			if rest.byCode[http.StatusTooManyRequests] == 0 {
				t.Errorf("REST: no 429 after %d traces in %v", accepted, rest.took)
			}
			if rest.noRetry > 0 {
				t.Errorf("REST: %d answers 429 without Retry-After (%s)", rest.noRetry, rest.firstBodies[http.StatusTooManyRequests])
			}
			// The default bound: a burst of 30 family traces, then 5 a
			// second, per caller.
			if max := 30 + 5*rest.took.Seconds() + 2; float64(accepted*len(fams)) > max {
				t.Errorf("REST: %d family traces accepted in %v, want at most %.0f", accepted*len(fams), rest.took, max)
			}
			if n := rest.byCode[http.StatusAccepted] + rest.byCode[http.StatusTooManyRequests]; n != rest.total() {
				t.Errorf("REST: unexpected answers %v (errors %d: %s)", rest.byCode, rest.errs, rest.firstErr)
			}

			// The agent, directly with its token: as many SYNs as one
			// caller can send in 3 s, once a first one is accepted (the
			// traces above have drawn on the same caller's probes: the
			// controller calls from the same address in the lab).
			if !tfsPoll(30*time.Second, func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				r, err := e.inject(ctx, "node-1", e.probe(t, fams[0], 60, 40000))
				return err == nil && r.code == http.StatusOK
			}) {
				t.Fatal("the agent never accepted a first probe")
			}
			ag := tfsFlood(8, 3*time.Second, func(ctx context.Context, i int) (tfsReply, error) {
				f := fams[i%len(fams)]
				return e.inject(ctx, "node-1", e.probe(t, f, 60, uint16(40000+i%20000)))
			})
			sent := ag.byCode[http.StatusOK]
			t.Logf("agent /agent/v1/inject with the agent token, %s: %d probes sent in %v = %.1f probes/s; answers %v; errors %d %s",
				mode, sent, ag.took.Round(time.Millisecond), ag.rate(sent), ag.byCode, ag.errs, ag.firstErr)
			if ag.byCode[http.StatusTooManyRequests] == 0 {
				t.Errorf("agent: no 429 after %d probes in %v", sent, ag.took)
			}
			if ag.noRetry > 0 {
				t.Errorf("agent: %d answers 429 without Retry-After (%s)", ag.noRetry, ag.firstBodies[http.StatusTooManyRequests])
			}
			// The default bound: a burst of 40 probes, then 10 a second,
			// per caller (and 20 a second per node).
			if max := 40 + 10*ag.took.Seconds() + 2; float64(sent) > max {
				t.Errorf("agent: %d probes sent in %v, want at most %.0f", sent, ag.took, max)
			}
			if n := ag.byCode[http.StatusOK] + ag.byCode[http.StatusTooManyRequests]; n != ag.total() {
				t.Errorf("agent: unexpected answers %v (errors %d: %s) %v", ag.byCode, ag.errs, ag.firstErr, ag.firstBodies)
			}

			// Once the caller waits, a normal trace works again, soon: the
			// thousands of refusals took no tokens (a bucket in debt would
			// lock the caller, and the node, out for minutes).
			e.deliveredTrace(t, 10*time.Second)
		})
	}
}

func (r tfsFloodResult) total() int {
	n := r.errs
	for _, c := range r.byCode {
		n += c
	}
	return n - r.errs
}

// TestSecurityTraceflowProbeShape: the agent and the REST API refuse
// probes a trace does not need (TCP flags other than SYN, a TTL below the
// floor) and, unless the collector allows them and the request asks,
// destinations outside the cluster; what the controller, the CLI and the
// UI send is accepted.
func TestSecurityTraceflowProbeShape(t *testing.T) {
	requirePrereqs(t)
	t.Parallel() // its own labs and products (each its own database); the modes one after the other: a few traces each
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			recordAs(t, string(mode)+"/trace-security")
			e := newTFSEnv(t, mode, nil)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()

			// At the agent, with its token.
			for _, f := range e.families() {
				for _, tc := range []struct {
					name string
					edit func(p *traceflow.Probe)
					want int
				}{
					{"syn", func(p *traceflow.Probe) {}, http.StatusOK},
					{"rst", func(p *traceflow.Probe) { p.TCPFlags = packet.RST }, http.StatusBadRequest},
					{"syn-ack", func(p *traceflow.Probe) { p.TCPFlags = packet.SYN | packet.ACK }, http.StatusBadRequest},
					{"fin", func(p *traceflow.Probe) { p.TCPFlags = packet.FIN }, http.StatusBadRequest},
					{"no-flags", func(p *traceflow.Probe) { p.TCPFlags = 0 }, http.StatusBadRequest},
					{"ttl-1", func(p *traceflow.Probe) { p.TTL = 1 }, http.StatusBadRequest},
					{"ttl-64", func(p *traceflow.Probe) { p.TTL = 64 }, http.StatusOK},
					{"udp-with-flags", func(p *traceflow.Probe) { p.Protocol = traceflow.UDP }, http.StatusBadRequest},
					{"udp", func(p *traceflow.Probe) { p.Protocol, p.TCPFlags = traceflow.UDP, 0 }, http.StatusOK},
					{"echo", func(p *traceflow.Probe) {
						p.Protocol, p.TCPFlags, p.DstPort = traceflow.ICMP, 0, 0
						if f == traceflow.IPv6 {
							p.Protocol = traceflow.ICMPv6
						}
					}, http.StatusOK},
				} {
					p := e.probe(t, f, 61, 41000)
					tc.edit(&p)
					var r tfsReply
					// A 429 only means this test sends faster than the
					// limit: come back later.
					ok := tfsPoll(30*time.Second, func() bool {
						var err error
						r, err = e.inject(ctx, "node-1", p)
						return err == nil && r.code != http.StatusTooManyRequests
					})
					if !ok || r.code != tc.want {
						t.Errorf("agent %s %s: %d %s, want %d", f, tc.name, r.code, r.body, tc.want)
					}
				}
			}

			// Through REST.
			fam := traceflow.Family(mode)
			trace := func(body map[string]any) tfsReply {
				var r tfsReply
				tfsPoll(30*time.Second, func() bool {
					var err error
					r, err = tfsPost(ctx, e.base+"/api/v1/traceflows?wait=true", e.webToken, body)
					return err == nil && r.code != http.StatusTooManyRequests
				})
				return r
			}
			base := func() map[string]any {
				return map[string]any{"source": ref(e.web1), "destination": map[string]any{"pod": ref(e.api2), "port": 8080}, "family": fam, "timeout": "10s"}
			}
			for _, tc := range []struct {
				name string
				edit func(b map[string]any)
				want int
			}{
				{"default", func(b map[string]any) {}, http.StatusOK},
				{"syn", func(b map[string]any) { b["tcp_flags"] = packet.SYN }, http.StatusOK},
				{"rst", func(b map[string]any) { b["tcp_flags"] = packet.RST }, http.StatusBadRequest},
				{"syn-ack", func(b map[string]any) { b["tcp_flags"] = packet.SYN | packet.ACK }, http.StatusBadRequest},
				{"ttl-1", func(b map[string]any) { b["ttl"] = 1 }, http.StatusBadRequest},
				{"ttl-64", func(b map[string]any) { b["ttl"] = 64 }, http.StatusOK},
			} {
				b := base()
				tc.edit(b)
				if r := trace(b); r.code != tc.want {
					t.Errorf("REST %s: %d %s, want %d", tc.name, r.code, r.body, tc.want)
				}
			}

			// Destinations: in the cluster (a pod's or a Service's address)
			// they are traced; outside it they are refused by default, and
			// a request's external=true does not change that.
			svc, _ := e.l.Manifest.Service(manifest.NSBackend, "api")
			external := map[traceflow.Family]string{traceflow.IPv4: "198.19.0.99", traceflow.IPv6: "fd00:10:ffff::99"}
			for _, f := range e.families() {
				vip, _ := manifest.ServiceAddr(svc, k8sFam(f))
				for _, tc := range []struct {
					name     string
					dst      netip.Addr
					port     uint16
					external bool
					want     int
				}{
					{"pod-ip", tfsAddr(t, e.api2, f), 8080, false, http.StatusOK},
					{"service-ip", vip, 80, false, http.StatusOK},
					{"external", netip.MustParseAddr(external[f]), 8080, false, http.StatusBadRequest},
					{"external-asked", netip.MustParseAddr(external[f]), 8080, true, http.StatusBadRequest},
				} {
					b := map[string]any{"source": ref(e.web1), "destination": map[string]any{"ip": tc.dst, "port": tc.port}, "family": f, "timeout": "2s"}
					if tc.external {
						b["external"] = true
					}
					r := trace(b)
					if r.code != tc.want {
						t.Errorf("REST %s %s %s: %d %s, want %d", f, tc.name, tc.dst, r.code, r.body, tc.want)
					}
					if tc.want == http.StatusBadRequest && !strings.Contains(r.body, "outside the cluster") {
						t.Errorf("REST %s %s: %q does not say the destination is outside the cluster", f, tc.name, r.body)
					}
				}
			}
		})
	}
}

// TestSecurityTraceflowExternalAllowed: a collector started with
// --traceflow.allow-external traces a destination outside the cluster
// when the request asks for it (external=true), and only then.
func TestSecurityTraceflowExternalAllowed(t *testing.T) {
	requirePrereqs(t)
	t.Parallel() // its own labs and products (each its own database); the modes one after the other: a few traces each
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			recordAs(t, string(mode)+"/trace-security")
			e := newTFSEnv(t, mode, tfsAllowExternal)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			external := map[traceflow.Family]string{traceflow.IPv4: "198.19.0.99", traceflow.IPv6: "fd00:10:ffff::99"}
			for _, f := range e.families() {
				for _, asked := range []bool{false, true} {
					b := map[string]any{"source": ref(e.web1), "destination": map[string]any{"ip": external[f], "port": 8080}, "family": f, "timeout": "1s"}
					if asked {
						b["external"] = true
					}
					r, err := tfsPost(ctx, e.base+"/api/v1/traceflows?wait=true", e.webToken, b)
					switch {
					case err != nil:
						t.Fatal(err)
					case !asked && r.code != http.StatusBadRequest:
						t.Errorf("%s external without external=true: %d %s, want 400", f, r.code, r.body)
					case asked && r.code != http.StatusOK:
						t.Errorf("%s external with external=true: %d %s, want 200", f, r.code, r.body)
					case asked:
						var res traceflow.Result
						json.Unmarshal([]byte(r.body), &res)
						if len(res.Families) != 1 || res.Families[0].Dst.String() != external[f] {
							t.Errorf("%s external: %+v", f, res)
						}
					}
				}
			}
		})
	}
}

// tfsAllowExternal is the collector's --traceflow.allow-external.
func tfsAllowExternal(c *app.Config) { c.Traceflow.AllowExternal = true }

// TestSecurityTraceflowConcurrentWatches: 128 watches at once on one
// agent (its limit) all become ready and end at their timeout; no nft
// trace table is left in any node's namespace afterwards, and traces
// work as before.
func TestSecurityTraceflowConcurrentWatches(t *testing.T) {
	requirePrereqs(t)
	// Serial: 128 watches, each with nft monitors on every node, starve beside other tests on 2 cores.
	nftBin, err := lab.NFTPath()
	if err != nil {
		t.Fatal(err)
	}
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			recordAs(t, string(mode)+"/trace-security")
			e := newTFSEnv(t, mode, nil)
			fams := e.families()
			const watches = 128
			out := make([]tfsWatchOutcome, watches)
			start := time.Now()
			var wg sync.WaitGroup
			for i := range watches {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
					defer cancel()
					p := e.probe(t, fams[i%len(fams)], uint8(1+i%63), uint16(42000+i))
					out[i] = tfsWatch(ctx, e.p.Agents["node-1"], e.token, p, "3s")
				})
			}
			wg.Wait()
			took := time.Since(start)
			ready, limited := 0, 0
			failures := map[string]int{}
			for _, o := range out {
				switch {
				case o.code == http.StatusTooManyRequests:
					limited++
				case o.ready && o.err == "":
					ready++
				default:
					failures[fmt.Sprintf("%d %s", o.code, o.err)]++
				}
			}
			// Trace tables left in the nodes' namespaces: polled for a
			// while (a watch's cleanup may trail its last byte), but a
			// table that stays is a leak.
			var left []string
			tfsPoll(20*time.Second, func() bool {
				left = nil
				for _, n := range e.l.Manifest.Nodes {
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					b, err := nsrun.Output(ctx, e.l.NodeNetNSPath(n.Name), nil, nftBin, "list", "tables")
					cancel()
					if err != nil {
						left = append(left, n.Name+": "+err.Error())
						continue
					}
					for l := range strings.Lines(string(b)) {
						if strings.Contains(l, observe.TablePrefix) {
							left = append(left, n.Name+": "+strings.TrimSpace(l))
						}
					}
				}
				return len(left) == 0
			})
			t.Logf("%d concurrent watches on node-1, %s: %d ready, %d answered 429, failures %v; %d trace tables left; took %v",
				watches, mode, ready, limited, failures, len(left), took.Round(time.Millisecond))
			if len(failures) > 0 {
				t.Errorf("%d watches failed: %v", watches-ready-limited, failures)
			}
			if len(left) > 0 {
				t.Errorf("trace tables left behind: %v", left)
			}
			e.deliveredTrace(t, 30*time.Second)
		})
	}
}

// tfsWatchOutcome is how one watch ended.
type tfsWatchOutcome struct {
	code  int
	ready bool
	err   string
}

// tfsWatch opens one watch on an agent with the agent token and reads it
// to its end: ready is whether the first event said so, err the first
// error event (or a stream that did not end cleanly).
func tfsWatch(ctx context.Context, agentURL, token string, p traceflow.Probe, timeout string) (o tfsWatchOutcome) {
	b, _ := json.Marshal(map[string]any{"probe": p, "timeout": timeout})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, agentURL+"/agent/v1/watch", bytes.NewReader(b))
	if err != nil {
		o.err = err.Error()
		return o
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		o.err = err.Error()
		return o
	}
	defer resp.Body.Close()
	o.code = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		rb, _ := io.ReadAll(resp.Body)
		o.err = strings.TrimSpace(string(rb))
		return o
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 4096), 1<<20)
	for first := true; sc.Scan(); first = false {
		var ev traceflow.WatchEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			o.err = "bad event: " + err.Error()
			return o
		}
		if first {
			o.ready = ev.Ready
		}
		if ev.Error != "" && o.err == "" {
			o.err = ev.Error
		}
	}
	if err := sc.Err(); err != nil && o.err == "" {
		o.err = err.Error()
	}
	return o
}
