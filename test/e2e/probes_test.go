package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/lab"
	labagent "github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/traceflow"
	"github.com/dualflow/dualflow/web/api"
)

// TestTraceProbesHidden runs traces on a lab with the product, in the
// three modes, through the REST API with the operator token: a probe
// dropped by a policy (tools/probe-1 -> backend/api@2:8080), one through
// a Service (frontend/web@1 -> svc backend/api:80, DNAT-ed) and an echo
// request (frontend/web@1 -> frontend/web@2). The exporters report the
// probes as any connection; their rows are stored with the trace's id,
// and the flows, the map, the reachability matrix and `dualflow audit
// denied` do not show them by default, while real connections between
// the same workloads (an allowed one, one denied by the same policy) do.
func TestTraceProbesHidden(t *testing.T) {
	requirePrereqs(t)
	t.Parallel() // its own labs and products (each its own database); the modes one after the other, as traces need the nft monitors fed
	bin := buildBinary(t)
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			record(t, mode)
			l := startLab(t, mode)
			checkTraceProbesHidden(t, l, mode, bin)
		})
	}
}

// probeSent is one family's probe of a trace.
type probeSent struct {
	id      string
	fam     traceflow.FamilyResult
	service bool
}

func checkTraceProbesHidden(t *testing.T, l *lab.Lab, mode manifest.Mode, bin string) {
	_, base := startProduct(t, l)
	// Only rows from now on are this test's traces and dials.
	start := time.Now().Add(-time.Second).UTC()
	since := start.Format(time.RFC3339Nano)
	pod := func(ns, app string, node int) *corev1.Pod {
		t.Helper()
		p, err := l.PodOn(ns, app, node)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}

	web1, web2 := pod(manifest.NSFrontend, "web", 1), pod(manifest.NSFrontend, "web", 2)
	api1, api2 := pod(manifest.NSBackend, "api", 1), pod(manifest.NSBackend, "api", 2)
	probe1, probe2 := pod(manifest.NSTools, "probe", 1), pod(manifest.NSTools, "probe", 2)
	fams := mode.Families()

	// `dualflow audit denied` reads the policy rollup, by whole minutes:
	// from the minute of the start, where rows of an earlier test may be,
	// so the probe's source is compared before and after the traces.
	auditDenied := func() (groups []audit.DeniedGroup, fromProbe1 []string) {
		t.Helper()
		out, err := exec.Command(bin, "audit", "denied", "--server", base, "--since", start.Truncate(time.Minute).Format(time.RFC3339), "--json").Output()
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				out = append(out, ee.Stderr...)
			}
			t.Fatalf("audit denied: %v\n%s", err, out)
		}
		if err := json.Unmarshal(out, &groups); err != nil {
			t.Fatalf("audit denied --json: %v\n%s", err, out)
		}
		for _, g := range groups {
			if g.SrcNamespace == probe1.Namespace && g.SrcWorkload == probe1.Name {
				fromProbe1 = append(fromProbe1, fmt.Sprintf("%s %s/%s -> %s/%s v%d %d records", g.Direction, g.PolicyNamespace, g.PolicyName, g.DstNamespace, g.DstWorkload, g.IPVersion, g.Records))
			}
		}
		return groups, fromProbe1
	}
	_, probe1Before := auditDenied()

	// Real traffic beside the probes: web@1 -> api@2 allowed, probe-2 ->
	// api@1 denied by backend/default-deny-ingress (as the first probe).
	for _, f := range fams {
		for _, d := range []struct {
			from, to *corev1.Pod
			allowed  bool
		}{{web1, api2, true}, {probe2, api1, false}} {
			a, _ := manifest.PodAddr(d.to, f)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := labDial(ctx, l, d.from, labagent.TCP, netip.AddrPortFrom(a, manifest.PortHTTP))
			cancel()
			if (err == nil) != d.allowed || err != nil && !errors.Is(err, labagent.ErrNoAnswer) {
				t.Fatalf("%s dial %s -> %s: %v, want allowed %v", f, ref(d.from), ref(d.to), err, d.allowed)
			}
		}
	}

	// The traces, over the mode's families.
	var sent []probeSent
	for _, tc := range []struct {
		req  traceflow.Request
		want traceflow.Outcome
	}{
		{traceflow.Request{Source: ref(probe1), Destination: traceflow.Destination{Pod: ref(api2), Port: manifest.PortHTTP}}, traceflow.Dropped},
		{traceflow.Request{Source: ref(web1), Destination: traceflow.Destination{Service: manifest.NSBackend + "/api", Port: manifest.ServicePortHTTP}}, traceflow.Delivered},
		{traceflow.Request{Source: ref(web1), Destination: traceflow.Destination{Pod: ref(web2)}, Protocol: traceflow.ICMP}, traceflow.Delivered},
	} {
		tc.req.Family, tc.req.Timeout = traceflow.Family(mode), traceflow.Duration(10*time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		res, _, err := restTrace(ctx, base, tc.req)
		cancel()
		if err != nil {
			t.Fatalf("trace %s -> %s: %v", tc.req.Source, tc.req.Destination, err)
		}
		for _, fr := range res.Families {
			if fr.Outcome != tc.want {
				t.Fatalf("trace %s -> %s %s: %s, want %s\n%s", tc.req.Source, tc.req.Destination, fr.Family, fr.Outcome, tc.want, dump(fr))
			}
			sent = append(sent, probeSent{id: res.ID, fam: fr, service: tc.req.Destination.Service != ""})
		}
	}
	if len(sent) != 3*len(fams) {
		t.Fatalf("%d family probes sent, want %d", len(sent), 3*len(fams))
	}
	isProbe := func(f api.Flow) bool {
		return slices.ContainsFunc(sent, func(p probeSent) bool {
			return f.SrcIP == p.fam.Src.String() && f.SrcPort == int(p.fam.SrcPort)
		})
	}

	get := func(path string, q url.Values, out any) error {
		q.Set("since", since)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err := restCall(ctx, http.MethodGet, base+path+"?"+q.Encode(), nil, out)
		return err
	}
	flows := func(q url.Values) []api.Flow {
		t.Helper()
		q.Set("limit", "1000")
		var page api.FlowPage
		if err := get("/api/v1/flows", q, &page); err != nil {
			t.Fatal(err)
		}
		return page.Flows
	}

	// Every family's probe is stored under its trace's id, the Service's
	// with the ClusterIP it was sent to; and the real dials are stored.
	await(t, 2*time.Minute, "the probes' rows, marked, and the dials' rows", func() (bool, string) {
		var missing []string
		for _, p := range sent {
			rows := flows(url.Values{"probe_trace_id": {p.id}})
			if !slices.ContainsFunc(rows, func(f api.Flow) bool {
				return f.ProbeTraceID == p.id && f.SrcIP == p.fam.Src.String() && f.SrcPort == int(p.fam.SrcPort) &&
					(!p.service || f.ServiceIP == p.fam.Dst.String())
			}) {
				missing = append(missing, fmt.Sprintf("%s %s %s:%d -> %s (%d rows)", p.id, p.fam.Family, p.fam.Src, p.fam.SrcPort, p.fam.Dst, len(rows)))
			}
		}
		real := map[string]int{}
		for _, f := range flows(url.Values{}) {
			real[f.SrcWorkload+"->"+f.DstWorkload]++
		}
		for _, pair := range []string{"web->api", "probe-2->api"} {
			if real[pair] < len(fams) {
				missing = append(missing, fmt.Sprintf("dials %s: %d rows", pair, real[pair]))
			}
		}
		return len(missing) == 0, strings.Join(missing, "; ")
	})

	// Flows: none of the probes' rows by default, all of them asked for.
	for _, f := range flows(url.Values{}) {
		if f.ProbeTraceID != "" || isProbe(f) {
			t.Errorf("flows show a probe by default: %+v", f)
		}
	}
	for _, f := range flows(url.Values{"probes": {"only"}}) {
		if !slices.ContainsFunc(sent, func(p probeSent) bool { return p.id == f.ProbeTraceID }) {
			t.Errorf("probes=only: row of no trace of this test: %+v", f)
		}
	}

	// The map: the real denied dial's edge, none of the probes' (the
	// probe's source, the Service, web to web).
	probeEdge := func(e api.MapEdge) bool {
		return e.Src == ref(probe1) || e.Dst == "svc:backend/api" || e.Src == "frontend/web" && e.Dst == "frontend/web"
	}
	var m api.ServiceMap
	if err := get("/api/v1/servicemap", url.Values{}, &m); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(m.Edges, func(e api.MapEdge) bool { return e.Src == ref(probe2) && e.Verdict == "dropped" }) {
		t.Errorf("map: no dropped edge of the real dial from %s: %+v", ref(probe2), m.Edges)
	}
	for _, e := range m.Edges {
		if probeEdge(e) {
			t.Errorf("map shows a probe's edge by default: %+v", e)
		}
	}
	if err := get("/api/v1/servicemap", url.Values{"probes": {"include"}}, &m); err != nil {
		t.Fatal(err)
	}
	if n := len(slices.DeleteFunc(slices.Clone(m.Edges), func(e api.MapEdge) bool { return !probeEdge(e) })); n != 3*len(fams) {
		t.Errorf("map with probes=include: %d probe edges, want 3 per family: %+v", n, m.Edges)
	}

	// The reachability matrix: probe-1 -> api@2 observed nothing (the
	// trace is not traffic).
	var reach api.Reachability
	req := api.ReachabilityRequest{Sources: []audit.Endpoint{{Kind: "pod", Namespace: probe1.Namespace, Name: probe1.Name}},
		Destinations: []audit.Endpoint{{Kind: "pod", Namespace: api2.Namespace, Name: api2.Name}}, Protocol: "tcp", Port: manifest.PortHTTP, Since: since}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_, err := restCall(ctx, http.MethodPost, base+"/api/v1/reachability", req, &reach)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	for fam, f := range reach.Cells[0][0].Families {
		if f.Observed.Flows != 0 {
			t.Errorf("reachability %s -> %s IPv%s: %d observed flows, want none (the probe's)", ref(probe1), ref(api2), fam, f.Observed.Flows)
		}
	}

	// `dualflow audit denied`: the real denied dial, not the probe.
	gs, probe1After := auditDenied()
	if !slices.ContainsFunc(gs, func(g audit.DeniedGroup) bool { return g.SrcWorkload == probe2.Name && g.DstWorkload == "api" }) {
		t.Errorf("audit denied lacks the real denied dial from %s: %+v", ref(probe2), gs)
	}
	if !slices.Equal(probe1Before, probe1After) {
		t.Errorf("audit denied counts the probe from %s:\nbefore the traces %q\nafter %q", ref(probe1), probe1Before, probe1After)
	}
}
