package audit

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"strings"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
)

// Probe asks what the policies do to one flow, without traffic.
type Probe struct {
	// From and To are "namespace/pod", or an IP address (a pod's, or one
	// outside the cluster, which only ipBlocks match).
	From, To string
	Proto    uint8 // IANA number; 0 is TCP
	Port     uint16
	// Family is 4 or 6; 0 evaluates every family both ends have.
	Family uint8
}

// ProbeResult is the verdict of a Probe over one family.
type ProbeResult struct {
	Src       FlowEnd `json:"src"`
	Dst       FlowEnd `json:"dst"`
	IPVersion uint8   `json:"ip_version"`
	Protocol  string  `json:"protocol"`
	Port      uint16  `json:"port"`
	Verdicts
	Message string `json:"message"`
}

// Evaluate answers a Probe with the policies of set over the pods and
// namespaces of view, one result per family. Its ends resolve as the
// reachability matrix's pod and ip endpoints do (ClusterResolver), and
// each family's pair is evaluated as one of the matrix's (pairFlow).
func Evaluate(view *enrich.Snapshot, set *policy.Set, p Probe) ([]ProbeResult, error) {
	p.Proto = cmp.Or(p.Proto, flow.ProtoTCP)
	src, err := probeEnd(view, p.From)
	if err != nil {
		return nil, fmt.Errorf("from: %w", err)
	}
	dst, err := probeEnd(view, p.To)
	if err != nil {
		return nil, fmt.Errorf("to: %w", err)
	}
	var out []ProbeResult
	for _, v := range []uint8{4, 6} {
		_, ok1 := src.Peers[int(v)]
		_, ok2 := dst.Peers[int(v)]
		if p.Family != 0 && p.Family != v || !ok1 || !ok2 {
			continue
		}
		f := pairFlow(src, dst, int(v), p.Proto, p.Port)
		r := set.Evaluate(&f)
		res := ProbeResult{Src: end(view, src.pod, f.Src.Addr), Dst: end(view, dst.pod, f.Dst.Addr), IPVersion: v, Protocol: flow.ProtoName(p.Proto), Port: p.Port, Verdicts: verdicts(r)}
		on := res.Protocol
		if flow.HasPorts(p.Proto) {
			on = fmt.Sprintf("%d/%s", p.Port, res.Protocol)
		}
		res.Message = fmt.Sprintf("%s → %s on %s over IPv%d is allowed (egress: %s; ingress: %s).",
			describeEnd(res.Src), describeEnd(res.Dst), on, v,
			sideText(r.Egress, policy.Egress), sideText(r.Ingress, policy.Ingress))
		if d, denied := explainDenial(set, &f, describeEnd(res.Src), describeEnd(res.Dst)); denied {
			// The one explanation of a drop, as traces and reachability
			// pairs give it.
			res.Message = fmt.Sprintf("%s → %s on %s over IPv%d is denied: %s.", describeEnd(res.Src), describeEnd(res.Dst), on, v, d.Text)
		}
		out = append(out, res)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s and %s have no address of a common family", p.From, p.To)
	}
	return out, nil
}

// probeEnd resolves one end of a probe, "namespace/pod" or an address,
// as a pod or an ip endpoint: the one member it stands for.
func probeEnd(view *enrich.Snapshot, s string) (*Member, error) {
	e := Endpoint{Kind: "ip", Name: s}
	if _, err := netip.ParseAddr(s); err != nil {
		ns, name, ok := strings.Cut(s, "/")
		if !ok {
			return nil, fmt.Errorf("%q: want namespace/pod or an IP address", s)
		}
		if _, ok := view.Pod(ns, name); !ok {
			// As dualflow audit evaluate and /audit/evaluate have always
			// said it (the resolver says "pod ns/name not found").
			return nil, fmt.Errorf("pod %s not in the inventory", s)
		}
		e = Endpoint{Kind: "pod", Namespace: ns, Name: name}
	}
	t, err := ClusterResolver{Cluster: func() (*enrich.Snapshot, error) { return view, nil }}.Resolve(context.Background(), e)
	if err != nil {
		return nil, err
	}
	return &t.Members[0], nil
}

func end(view *enrich.Snapshot, p *enrich.Pod, a netip.Addr) FlowEnd {
	e := FlowEnd{IP: a.String()}
	if p != nil {
		w := view.Workload(p)
		e.Namespace, e.Pod, e.WorkloadKind, e.WorkloadName = p.Namespace, p.Name, w.Kind, w.Name
	}
	return e
}

func describeEnd(e FlowEnd) string {
	if e.Pod == "" {
		return e.IP
	}
	return e.Namespace + "/" + e.Pod
}

// sideText says in a few words how one side decided.
func sideText(d policy.Decision, dir policy.Direction) string {
	switch d.Verdict {
	case flow.VerdictAllowed:
		return "allowed by " + decisionRef(d, dir).String()
	case flow.VerdictDenied:
		end := "destination"
		if dir == policy.Egress {
			end = "source"
		}
		return fmt.Sprintf("denied, NetworkPolicy %s/%s isolates the %s and no rule allows it", d.Namespace, d.Name, end)
	case flow.VerdictNotIsolated:
		return "not isolated"
	}
	return "not a pod, no policy applies"
}
