package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/recommend"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/web/api"
)

// TestRecommend applies least-privilege recommendations to the lab and
// re-runs its traffic (issue 38), on both datapaths (kernel nftables and
// OVS) in every mode:
//   - the lab's traffic (Lab.DefaultProbes) runs once with the product
//     and is waited for until every connection is stored;
//   - the running product is asked, as an operator would through GET
//     /api/v1/policy/recommend, for the namespace backend and for the
//     workload frontend/web; each answer's replay keeps every observed
//     allowed flow group in every family of the mode (0 newly denied);
//   - each recommendation is applied alone to the lab's datapath (the
//     policies in force plus the recommended ones, as kubectl apply adds
//     them: Manifest.NetworkPolicies and Lab.Reload) and the traffic
//     re-runs: every connection that answered before answers again in its
//     family; one denied before answers now exactly when the replay lists
//     it newly allowed; and connections between the same pods that were
//     never observed (api@1 → web@1 on a TCP and a UDP port web listens
//     on), answered before in every family, are now refused.
func TestRecommend(t *testing.T) {
	requirePrereqs(t)
	t.Parallel() // each datapath and mode its own lab and product (its own database)
	for _, datapath := range []string{lab.DatapathKernel, lab.DatapathOVS} {
		t.Run(datapath, func(t *testing.T) {
			t.Parallel()
			if datapath == lab.DatapathOVS {
				requireOVS(t)
			}
			for _, mode := range manifest.Modes {
				t.Run(string(mode), func(t *testing.T) {
					t.Parallel()
					label := string(mode) + "/recommend"
					if datapath != lab.DatapathKernel {
						label = string(mode) + "/" + datapath + "/recommend"
					}
					recordAs(t, label)
					l := startLabOn(t, mode, datapath)
					_, base := startProduct(t, l)
					checkRecommend(t, l, mode, base)
				})
			}
		})
	}
}

// recScope is a scope of a recommendation and the query that asks it.
type recScope struct {
	name  string
	query url.Values
}

// probeRun is one probe of the lab's traffic and what the datapath did.
type probeRun struct {
	lab.Probe
	answered bool
	// dst is the pod that answered (a Service's endpoint) or was dialled.
	dst *corev1.Pod
	// exported says the datapath's exporter sees the connection: it
	// answered, or its drop leaves a trace the exporter reads.
	exported bool
}

// unobservedConn is a connection between pods of the observed traffic
// that the traffic never makes.
type unobservedConn struct {
	name     string // "api@1 -> web@1"
	from, to *corev1.Pod
	proto    string
	port     uint16
}

func (u unobservedConn) String() string {
	return fmt.Sprintf("%s:%d/%s", u.name, u.port, u.proto)
}

func checkRecommend(t *testing.T, l *lab.Lab, mode manifest.Mode, base string) {
	// Only flows from now on are the traffic's below (the lab's own
	// traffic generator may have run before).
	since := time.Now().Add(-time.Second).UTC().Format(time.RFC3339)
	observed := runProbes(t, l, true)
	if len(observed) == 0 {
		t.Fatal("the lab has no traffic (DefaultProbes)")
	}
	for _, r := range observed {
		if r.answered != r.Allowed {
			t.Fatalf("%s: answered=%v, the lab's probe table says allowed=%v (%s)", r.Name, r.answered, r.Allowed, r.Why)
		}
	}
	stored := awaitStored(t, base, since, observed, func(r probeRun) bool { return r.exported })
	// The window ends here: the unobserved connections dialled below, to
	// show they answer before, are after it.
	until := time.Now().UTC().Format(time.RFC3339Nano)

	api1, err := l.PodOn(manifest.NSBackend, "api", 1)
	if err != nil {
		t.Fatal(err)
	}
	web1, err := l.PodOn(manifest.NSFrontend, "web", 1)
	if err != nil {
		t.Fatal(err)
	}
	// web@1 → api@1 was observed; the reverse never was, on ports web@1
	// listens on. Both scopes' recommendations refuse it: backend's as
	// api's egress, frontend/web's as web's ingress.
	unobserved := []unobservedConn{
		{"api@1 -> web@1", api1, web1, agent.TCP, manifest.PortHTTP},
		{"api@1 -> web@1", api1, web1, agent.UDP, manifest.PortUDPEcho},
	}
	for _, u := range unobserved {
		for _, f := range stored {
			if f.SrcPod == u.from.Name && f.DstPod == u.to.Name {
				t.Fatalf("%s was observed (%+v): it cannot show what the recommendation refuses", u, f)
			}
		}
	}
	// Before any recommendation they answer in every family.
	for _, f := range mode.Families() {
		for _, u := range unobserved {
			if err := dialUnobserved(t, l, u, f); err != nil {
				t.Fatalf("%s over %s before the recommendation: %v (the lab's policies allow it)", u, f, err)
			}
		}
	}

	scopes := []recScope{
		{"namespace backend", url.Values{"namespace": {manifest.NSBackend}}},
		{"workload frontend/web", url.Values{"namespace": {manifest.NSFrontend}, "workload": {"Deployment/web"}}},
	}
	reps := make([]*recommend.Report, len(scopes))
	for i, sc := range scopes {
		reps[i] = askRecommend(t, base, sc, since, until)
		checkReplay(t, sc, mode, reps[i])
	}
	orig := l.Manifest.NetworkPolicies
	for i, sc := range scopes {
		t.Run(strings.ReplaceAll(sc.name, " ", "-"), func(t *testing.T) {
			applyRecommendation(t, l, reps[i])
			t.Cleanup(func() {
				l.Manifest.NetworkPolicies = orig
				if err := l.Reload(context.Background()); err != nil {
					t.Errorf("reload the lab's own policies: %v", err)
				}
			})
			recheck(t, l, mode, reps[i], observed, stored, unobserved)
		})
	}
}

// runProbes dials every probe of the lab's traffic once. With drops, it
// also finds where the datapath drops the probes the lab's policies deny
// (the drop counters), for exported: OVS reports every drop (a
// packet-in); the kernel datapath's exporter reads conntrack only, so it
// sees a drop only through the entry the source node keeps of a flow
// dropped at ingress on another node.
func runProbes(t *testing.T, l *lab.Lab, drops bool) []probeRun {
	t.Helper()
	ovs := l.State().Datapath == lab.DatapathOVS
	var out []probeRun
	for _, p := range l.DefaultProbes() {
		r := probeRun{Probe: p, dst: p.ToPod}
		var reply agent.Reply
		var err error
		dial := func() { reply, err = labDial(ctx(t), l, p.From, p.Proto, p.To) }
		if drops && !p.Allowed && p.ToPod != nil {
			hits := counterDelta(t, l, dial)
			node := p.ToPod.Spec.NodeName
			r.exported = ovs || node != p.From.Spec.NodeName && hits[node][nft.DropName(nft.Ingress, p.ToPod.Namespace, p.ToPod.Name)] > 0
		} else {
			dial()
		}
		switch {
		case err == nil:
			r.answered, r.exported = true, true
			if r.dst == nil {
				if r.dst, err = labPod(l, reply.Server); err != nil {
					t.Fatalf("%s: answered by %q: %v", p.Name, reply.Server, err)
				}
			}
		case !errors.Is(err, agent.ErrNoAnswer):
			t.Fatalf("%s: %v", p.Name, err)
		}
		out = append(out, r)
	}
	return out
}

// matches says whether stored flow f is probe run r's connection.
func (r probeRun) matches(f api.Flow) bool {
	src, _ := manifest.PodAddr(r.From, r.Family)
	if f.SrcIP != src.String() || !strings.HasPrefix(strings.ToLower(f.Protocol), r.Proto) {
		return false
	}
	if r.ToPod == nil {
		return f.ServiceIP == r.To.Addr().String() && f.ServicePort == int(r.To.Port())
	}
	return f.DstIP == r.To.Addr().String() && (r.Proto == agent.ICMP || f.DstPort == int(r.To.Port()))
}

// awaitStored waits until every probe run that need selects has a
// stored flow in the window from since, and returns the window's flows.
func awaitStored(t *testing.T, base, since string, runs []probeRun, need func(probeRun) bool) []api.Flow {
	t.Helper()
	var flows []api.Flow
	d := await(t, 90*time.Second, "every connection of the traffic stored", func() (bool, string) {
		var page api.FlowPage
		q := url.Values{"since": {since}, "limit": {"1000"}}
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := restCall(c, http.MethodGet, base+"/api/v1/flows?"+q.Encode(), nil, &page); err != nil {
			return false, err.Error()
		}
		flows = page.Flows
		var missing []string
		for _, r := range runs {
			if need(r) && !slices.ContainsFunc(flows, r.matches) {
				missing = append(missing, r.Name)
			}
		}
		var have []string
		for _, f := range flows {
			have = append(have, fmt.Sprintf("%s/%s->%s/%s:%d/%s(%s,%s)", f.SrcNamespace, f.SrcPod, f.DstNamespace, f.DstPod, f.DstPort, f.Protocol, f.Egress, f.Ingress))
		}
		return len(missing) == 0, fmt.Sprintf("missing %s; %d flows stored: %s", strings.Join(missing, ", "), len(flows), strings.Join(have, " "))
	})
	n := 0
	for _, r := range runs {
		if slices.ContainsFunc(flows, r.matches) {
			n++
		}
	}
	t.Logf("%d of the %d connections of the traffic stored after %v (%d flow rows)", n, len(runs), d.Round(time.Millisecond), len(flows))
	return flows
}

// askRecommend asks the product for a least-privilege recommendation
// for sc from the flows of the window [since, until).
func askRecommend(t *testing.T, base string, sc recScope, since, until string) *recommend.Report {
	t.Helper()
	q := url.Values{"mode": {string(recommend.LeastPrivilege)}, "since": {since}, "until": {until}}
	for k, v := range sc.query {
		q[k] = v
	}
	var rep recommend.Report
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := restCall(c, http.MethodGet, base+"/api/v1/policy/recommend?"+q.Encode(), nil, &rep); err != nil {
		t.Fatalf("recommend %s: %v", sc.name, err)
	}
	if len(rep.Policies) == 0 || rep.YAML == "" {
		t.Fatalf("recommend %s: no policy (%d flow groups; notes %q)", sc.name, rep.Flows, rep.Notes)
	}
	return &rep
}

// checkReplay checks rep's proof: in every family of the mode, flow
// groups were observed allowed and the recommendation keeps them all.
func checkReplay(t *testing.T, sc recScope, mode manifest.Mode, rep *recommend.Report) {
	t.Helper()
	var lines []string
	for _, fr := range rep.Replay {
		lines = append(lines, fmt.Sprintf("IPv%d: %d observed allowed, %d kept, %d newly denied, %d newly allowed, %d probe-only",
			fr.Family, fr.Allowed, fr.Kept, len(fr.NewlyDenied), len(fr.NewlyAllowed), fr.Probes))
		for _, f := range fr.NewlyAllowed {
			lines = append(lines, "  newly allowed: "+replayedString(f))
		}
		for _, f := range fr.NewlyDenied {
			lines = append(lines, "  NEWLY DENIED: "+replayedString(f))
		}
	}
	t.Logf("recommendation for %s (%d flow groups, policies %v):\nreplay:\n%s\nnotes: %q\n%s", sc.name, rep.Flows, rep.Policies, strings.Join(lines, "\n"), rep.Notes, rep.YAML)
	for _, f := range mode.Families() {
		v := uint8(famVersion(f))
		i := slices.IndexFunc(rep.Replay, func(fr recommend.FamilyReplay) bool { return fr.Family == v })
		if i < 0 {
			t.Errorf("%s: no replay of IPv%d", sc.name, v)
			continue
		}
		fr := rep.Replay[i]
		if fr.Allowed == 0 || fr.Kept != fr.Allowed || len(fr.NewlyDenied) != 0 {
			t.Errorf("%s IPv%d replay: %d observed allowed, %d kept, %d newly denied; want all kept", sc.name, v, fr.Allowed, fr.Kept, len(fr.NewlyDenied))
		}
	}
	for _, fr := range rep.Replay {
		if !mode.Has(famOf(fr.Family)) {
			t.Errorf("%s: replay of IPv%d in %s mode", sc.name, fr.Family, mode)
		}
	}
}

func famOf(v uint8) corev1.IPFamily {
	if v == 6 {
		return corev1.IPv6Protocol
	}
	return corev1.IPv4Protocol
}

func replayedString(f recommend.ReplayedFlow) string {
	return fmt.Sprintf("%s -> %s proto %d port %d IPv%d (%d allowed, %d denied records; after: %+v)",
		endString(f.Src), endString(f.Dst), f.Protocol, f.DstPort, f.IPVersion, f.Allowed, f.Denied, f.After)
}

func endString(e audit.FlowEnd) string {
	if e.Pod == "" {
		return e.IP
	}
	return e.Namespace + "/" + e.Pod + "(" + e.IP + ")"
}

// applyRecommendation adds rep's policies to the lab's, as kubectl apply
// -f would (one of the same namespace and name replaced), and has the
// datapath enforce them (Lab.Reload: nftables or OpenFlow).
func applyRecommendation(t *testing.T, l *lab.Lab, rep *recommend.Report) {
	t.Helper()
	m, err := manifest.Decode(strings.NewReader(rep.YAML))
	if err != nil {
		t.Fatalf("the recommended YAML does not decode: %v", err)
	}
	var names []string
	ps := slices.Clone(l.Manifest.NetworkPolicies)
	for _, p := range m.NetworkPolicies {
		names = append(names, p.Namespace+"/"+p.Name)
		if i := slices.IndexFunc(ps, func(q networkingv1.NetworkPolicy) bool { return q.Namespace == p.Namespace && q.Name == p.Name }); i >= 0 {
			ps[i] = p
		} else {
			ps = append(ps, p)
		}
	}
	if !slices.Equal(names, rep.Policies) {
		t.Fatalf("the YAML holds %v, the answer names %v", names, rep.Policies)
	}
	l.Manifest.NetworkPolicies = ps
	if err := l.Reload(ctx(t)); err != nil {
		t.Fatalf("apply %v: %v", names, err)
	}
	t.Logf("applied %v beside the lab's %d policies", names, len(ps)-len(names))
}

// recheck re-runs the traffic with a recommendation applied, per family.
// stored are the flows stored before the recommendation was asked.
func recheck(t *testing.T, l *lab.Lab, mode manifest.Mode, rep *recommend.Report, observed []probeRun, stored []api.Flow, unobserved []unobservedConn) {
	after := runProbes(t, l, false)
	if len(after) != len(observed) {
		t.Fatalf("%d probes after, %d before", len(after), len(observed))
	}
	for _, f := range mode.Families() {
		t.Run(string(f), func(t *testing.T) {
			var kept, stillDenied int
			var newly, unseen []string
			for i, r := range after {
				b := observed[i]
				if r.Family != f {
					continue
				}
				predicted := b.listedNewlyAllowed(rep)
				switch {
				case b.answered && !r.answered:
					t.Errorf("%s: observed allowed, refused with the recommendation", r.Name)
				case b.answered:
					kept++
				case predicted && !r.answered:
					t.Errorf("%s: observed denied, the replay lists it newly allowed, the datapath still refuses it", r.Name)
				case r.answered && !predicted && slices.ContainsFunc(stored, b.matches):
					t.Errorf("%s: observed denied, the replay does not list it newly allowed, the datapath allows it", r.Name)
				case r.answered && !predicted:
					// A drop the exporter never saw: the selectors name the
					// workloads of an observed pair.
					unseen = append(unseen, r.Name)
				case r.answered:
					newly = append(newly, r.Name)
				default:
					stillDenied++
				}
			}
			var refused []string
			for _, u := range unobserved {
				err := dialUnobserved(t, l, u, f)
				switch {
				case err == nil:
					t.Errorf("unobserved %s over %s answers with the recommendation", u, f)
				case !errors.Is(err, agent.ErrNoAnswer):
					t.Errorf("unobserved %s over %s: %v", u, f, err)
				default:
					refused = append(refused, u.String())
				}
			}
			t.Logf("%s: %d connections observed allowed still answer; %d observed denied answer now, as the replay predicted %v; %d denied but never stored answer now %v; %d stay denied; unobserved %v answered before, refused now",
				f, kept, len(newly), newly, len(unseen), unseen, stillDenied, refused)
		})
	}
}

// listedNewlyAllowed says whether rep's replay lists r's connection
// among the flow groups observed denied that the recommendation allows.
func (r probeRun) listedNewlyAllowed(rep *recommend.Report) bool {
	src, _ := manifest.PodAddr(r.From, r.Family)
	proto := map[string]uint8{agent.TCP: flow.ProtoTCP, agent.UDP: flow.ProtoUDP, agent.ICMP: flow.ProtoICMP}[r.Proto]
	if r.Proto == agent.ICMP && r.Family == corev1.IPv6Protocol {
		proto = flow.ProtoICMPv6
	}
	for _, fr := range rep.Replay {
		for _, f := range fr.NewlyAllowed {
			if f.Src.IP != src.String() || f.Protocol != proto || f.IPVersion != uint8(famVersion(r.Family)) {
				continue
			}
			if r.ToPod == nil && f.ServicePort == r.To.Port() && f.ServiceName != "" ||
				r.ToPod != nil && f.Dst.IP == r.To.Addr().String() && (r.Proto == agent.ICMP || f.DstPort == r.To.Port()) {
				return true
			}
		}
	}
	return false
}

// dialUnobserved dials u over family f.
func dialUnobserved(t *testing.T, l *lab.Lab, u unobservedConn, f corev1.IPFamily) error {
	t.Helper()
	_, err := labDial(ctx(t), l, u.from, u.proto, netip.AddrPortFrom(addr(t, u.to, f), u.port))
	return err
}
