package e2e

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
	"github.com/dualflow/dualflow/lab/nft"
	"github.com/dualflow/dualflow/test/support/labtruth"
)

// TestAudit checks the policy auditor against the lab's nftables datapath
// in every mode: for each default probe, the verdicts the Auditor
// evaluates for a record of the flow agree with what the datapath did (the
// dial's outcome, and the nft counter of the rule that accepted or the
// drop rule that dropped each side). It also checks that the static
// analysis finds the default lab's deliberate dual-stack gap in dual mode,
// and no dual-stack gap in the single-family modes.
func TestAudit(t *testing.T) {
	requirePrereqs(t)
	t.Parallel() // each mode its own lab
	for _, mode := range manifest.Modes {
		t.Run(string(mode), func(t *testing.T) {
			t.Parallel()
			l := startLab(t, mode)
			inv := enrich.NewSnapshot(l.Manifest.Objects()...)
			a, err := audit.New(audit.Config{}, inv, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
				t.Fatal(err)
			}
			t.Run("verdicts-match-datapath", func(t *testing.T) {
				record(t, mode)
				auditProbes(t, l, inv, a)
			})
			t.Run("dual-stack-gap-findings", func(t *testing.T) {
				record(t, mode)
				auditGapFindings(t, l, inv, mode)
			})
		})
	}
}

// counterDelta returns, per node, the named counters that gained packets
// while fn ran.
func counterDelta(t *testing.T, l *lab.Lab, fn func()) map[string]map[string]uint64 {
	t.Helper()
	read := func() map[string]map[string]labtruth.Counter {
		out := map[string]map[string]labtruth.Counter{}
		for _, n := range l.Manifest.Nodes {
			cs, err := labtruth.Counters(l, n.Name)
			if err != nil {
				t.Fatal(err)
			}
			out[n.Name] = cs
		}
		return out
	}
	before := read()
	fn()
	after := read()
	out := map[string]map[string]uint64{}
	for node, cs := range after {
		out[node] = map[string]uint64{}
		for name, c := range cs {
			if d := c.Packets - before[node][name].Packets; d > 0 {
				out[node][name] = d
			}
		}
	}
	return out
}

// counterDir returns the direction of a lab counter: "drop/<dir>/ns/pod"
// or "ns/policy/<dir>/<rule>".
func counterDir(name string) string {
	parts := strings.Split(name, "/")
	if len(parts) == 4 && parts[0] == "drop" {
		return parts[1]
	}
	if len(parts) == 4 {
		return parts[2]
	}
	return ""
}

// reported turns the counters one side of a flow hit on its node into a
// datapath-reported verdict: denied when the pod's drop rule counted it,
// allowed (naming the rule) when a policy rule did, unknown when the side
// is not isolated (nothing counts).
func reported(hits map[string]uint64, dir nft.Direction, pod *corev1.Pod) (flow.Verdict, string, []string) {
	var names []string
	for name := range hits {
		if counterDir(name) == string(dir) {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	switch {
	case len(names) == 0:
		return flow.VerdictUnknown, "", nil
	case len(names) == 1 && names[0] == nft.DropName(dir, pod.Namespace, pod.Name):
		return flow.VerdictDenied, names[0], names
	case len(names) == 1:
		return flow.VerdictAllowed, names[0], names
	}
	return flow.VerdictUnknown, "", names // ambiguous: reported below
}

func auditProbes(t *testing.T, l *lab.Lab, inv *enrich.Snapshot, a *audit.Auditor) {
	probes := l.DefaultProbes()
	if len(probes) == 0 {
		t.Fatal("no probes for the default lab")
	}
	for _, p := range probes {
		t.Run(p.Name, func(t *testing.T) {
			var reply agent.Reply
			var dialErr error
			hits := counterDelta(t, l, func() { reply, dialErr = labDial(ctx(t), l, p.From, p.Proto, p.To) })
			answered := dialErr == nil
			if answered != p.Allowed {
				t.Fatalf("datapath: answered=%v, the probe table says allowed=%v (%s): %v", answered, p.Allowed, p.Why, dialErr)
			}
			dst := p.ToPod
			if dst == nil && answered {
				var err error
				if dst, err = labPod(l, reply.Server); err != nil {
					t.Fatalf("service endpoint %q: %v", reply.Server, err)
				}
			}
			if dst == nil {
				t.Fatalf("%s: denied Service probe, endpoint unknown", p.Name)
			}
			rec := probeRecord(t, l, p, dst)
			src := p.From
			// What the datapath did, per side, from the nft counters.
			var egressNames, ingressNames []string
			rec.Egress.ReportedVerdict, rec.Egress.ReportedName, egressNames = reported(hits[src.Spec.NodeName], nft.Egress, src)
			rec.Ingress.ReportedVerdict, rec.Ingress.ReportedName, ingressNames = reported(hits[dst.Spec.NodeName], nft.Ingress, dst)
			a.Audit(&rec)
			t.Logf("egress %s %s/%s#%d (datapath %v), ingress %s %s/%s#%d (datapath %v)",
				rec.Egress.Verdict, rec.Egress.Namespace, rec.Egress.Name, rec.Egress.Rule, egressNames,
				rec.Ingress.Verdict, rec.Ingress.Namespace, rec.Ingress.Name, rec.Ingress.Rule, ingressNames)

			evalAllowed := rec.Egress.Verdict != flow.VerdictDenied && rec.Ingress.Verdict != flow.VerdictDenied
			if evalAllowed != answered {
				t.Errorf("evaluated allowed=%v, the datapath answered=%v", evalAllowed, answered)
			}
			checkSide(t, "egress", rec.Egress, nft.Egress, src, egressNames)
			if rec.Egress.Verdict == flow.VerdictDenied {
				return // dropped on the source node: ingress never saw it
			}
			checkSide(t, "ingress", rec.Ingress, nft.Ingress, dst, ingressNames)
			if rec.VerdictMismatch() {
				t.Errorf("record flags a verdict mismatch: %+v / %+v", rec.Egress, rec.Ingress)
			}
		})
	}
}

// checkSide compares one evaluated side with the counters the datapath hit
// in that direction on that side's node: exactly the deciding rule's
// counter when allowed, exactly the pod's drop counter when denied,
// nothing when not isolated.
func checkSide(t *testing.T, what string, got flow.Policy, dir nft.Direction, pod *corev1.Pod, hit []string) {
	t.Helper()
	var want []string
	switch got.Verdict {
	case flow.VerdictAllowed:
		want = []string{nft.RuleName(got.Namespace, got.Name, dir, int(got.Rule))}
	case flow.VerdictDenied:
		want = []string{nft.DropName(dir, pod.Namespace, pod.Name)}
		if got.Name == "" || got.Rule != -1 {
			t.Errorf("%s: denied without the isolating policy: %+v", what, got)
		}
	case flow.VerdictNotIsolated:
	default:
		t.Errorf("%s: verdict %s for a pod", what, got.Verdict)
	}
	if !slices.Equal(hit, want) {
		t.Errorf("%s: evaluated %s by %s/%s rule %d, want nft counters %v; the datapath hit %v", what, got.Verdict, got.Namespace, got.Name, got.Rule, want, hit)
	}
}

// probeRecord is the flow record enrichment would hand the Auditor for a
// probe: source pod, destination after DNAT (the endpoint that answered),
// destination port after DNAT.
func probeRecord(t *testing.T, l *lab.Lab, p lab.Probe, dst *corev1.Pod) flow.Record {
	t.Helper()
	src, ok := manifest.PodAddr(p.From, p.Family)
	if !ok {
		t.Fatalf("%s has no %s address", p.From.Name, p.Family)
	}
	dstAddr, ok := manifest.PodAddr(dst, p.Family)
	if !ok {
		t.Fatalf("%s has no %s address", dst.Name, p.Family)
	}
	rec := flow.Record{SrcAddr: src, DstAddr: dstAddr, SrcPort: 40000, DstPort: p.To.Port()}
	switch p.Proto {
	case agent.TCP:
		rec.Proto = flow.ProtoTCP
	case agent.UDP:
		rec.Proto = flow.ProtoUDP
	case agent.ICMP:
		rec.Proto, rec.DstPort = flow.ProtoICMP, 0
		if p.Family == corev1.IPv6Protocol {
			rec.Proto = flow.ProtoICMPv6
		}
	}
	if p.ToPod == nil { // a ClusterIP: DNAT to the Service's target port
		rec.ServiceAddr, rec.ServicePort = p.To.Addr(), p.To.Port()
		rec.DstPort = targetPort(t, l, p.To.Addr(), p.To.Port(), rec.Proto, dst)
	}
	for _, e := range []struct {
		pod *corev1.Pod
		ep  *flow.Endpoint
	}{{p.From, &rec.Src}, {dst, &rec.Dst}} {
		e.ep.PodNamespace, e.ep.PodName, e.ep.Labels, e.ep.NodeName = e.pod.Namespace, e.pod.Name, maps.Clone(e.pod.Labels), e.pod.Spec.NodeName
	}
	rec.Normalize()
	return rec
}

// targetPort resolves the port a Service port of vip DNATs to on pod.
func targetPort(t *testing.T, l *lab.Lab, vip netip.Addr, port uint16, proto uint8, pod *corev1.Pod) uint16 {
	t.Helper()
	for i := range l.Manifest.Services {
		s := &l.Manifest.Services[i]
		if !slices.Contains(s.Spec.ClusterIPs, vip.String()) {
			continue
		}
		for _, sp := range s.Spec.Ports {
			if sp.Port != int32(port) || policy.ProtoNumber(&sp.Protocol) != proto {
				continue
			}
			if sp.TargetPort.Type == intstr.Int {
				return uint16(sp.TargetPort.IntVal)
			}
			n, ok := manifest.ContainerPort(pod, sp.TargetPort.StrVal, sp.Protocol)
			if !ok {
				t.Fatalf("pod %s has no port %q", pod.Name, sp.TargetPort.StrVal)
			}
			return uint16(n)
		}
	}
	t.Fatalf("no Service port %s:%d", vip, port)
	return 0
}

func auditGapFindings(t *testing.T, l *lab.Lab, inv *enrich.Snapshot, mode manifest.Mode) {
	fs := audit.Findings(inv, audit.Options{})
	var dual []audit.Finding
	for _, f := range fs {
		if f.DualStack() {
			dual = append(dual, f)
			t.Logf("%s: %s", f.Kind, f.Message)
		}
	}
	if mode != manifest.ModeDual {
		if len(dual) != 0 {
			t.Fatalf("%s mode: %d dual-stack findings, want none", mode, len(dual))
		}
		return
	}
	metrics := fmt.Sprintf("NetworkPolicy %s/%s ingress rule 0", manifest.NSBackend, manifest.PolicyMetricsIPv4)
	var gap *audit.Finding
	for i, f := range dual {
		if f.Kind == audit.KindVerdictGap && f.Port == manifest.PortMetrics && f.Objects[0].Name == "web" && f.Objects[1].Name == "api" {
			gap = &dual[i]
		}
	}
	if gap == nil {
		t.Fatalf("no verdict gap frontend/web -> backend/api on %d", manifest.PortMetrics)
	}
	refs := make([]string, len(gap.Objects))
	for i, r := range gap.Objects {
		refs[i] = r.String()
	}
	if !slices.Contains(refs, metrics) || !strings.Contains(gap.Message, "allowed over IPv4 but denied over IPv6") {
		t.Errorf("gap %q (objects %v): want it allowed over IPv4 by %s", gap.Message, refs, metrics)
	}
	// The finding is what the datapath does: the pairs it counts answer
	// over IPv4 and drop over IPv6.
	web1, err := l.PodOn(manifest.NSFrontend, "web", 1)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= len(l.Manifest.Nodes); i++ {
		api, err := l.PodOn(manifest.NSBackend, "api", i)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
			a, _ := manifest.PodAddr(api, f)
			_, err := labDial(ctx(t), l, web1, agent.TCP, netip.AddrPortFrom(a, manifest.PortMetrics))
			if got, want := err == nil, f == corev1.IPv4Protocol; got != want {
				t.Errorf("web@1 -> api@%d:%d over %s: answered=%v, the finding says %v", i, manifest.PortMetrics, f, got, want)
			}
		}
	}
	if n := strconv.FormatUint(gap.Count, 10); !strings.Contains(gap.Message, "("+n+" of ") {
		t.Errorf("gap message %q does not state its count %s", gap.Message, n)
	}
	kinds := map[string]bool{}
	for _, f := range dual {
		kinds[f.Kind] = true
	}
	for _, k := range []string{audit.KindIPBlockOneFamily, audit.KindServiceSingleStack} {
		if !kinds[k] {
			t.Errorf("dual mode: no %s finding", k)
		}
	}
}
