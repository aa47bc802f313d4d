package audit

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/dualflow/dualflow/collector/audit/policy"
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
// namespaces of inv, one result per family.
func Evaluate(inv *Inventory, set *policy.Set, p Probe) ([]ProbeResult, error) {
	if p.Proto == 0 {
		p.Proto = flow.ProtoTCP
	}
	src, srcAddrs, err := resolveEnd(inv, p.From)
	if err != nil {
		return nil, fmt.Errorf("from: %w", err)
	}
	dst, dstAddrs, err := resolveEnd(inv, p.To)
	if err != nil {
		return nil, fmt.Errorf("to: %w", err)
	}
	var out []ProbeResult
	for _, v := range []uint8{4, 6} {
		if p.Family != 0 && p.Family != v {
			continue
		}
		sa, ok1 := addrOf(srcAddrs, v)
		da, ok2 := addrOf(dstAddrs, v)
		if !ok1 || !ok2 {
			continue
		}
		f := inv.Flow(src, sa, dst, da, p.Proto, p.Port)
		r := set.Evaluate(&f)
		res := ProbeResult{Src: end(inv, src, sa), Dst: end(inv, dst, da), IPVersion: v, Protocol: ProtoName(p.Proto), Port: p.Port, Verdicts: verdicts(r)}
		verdict := "allowed"
		if !r.Allowed() {
			verdict = "denied"
		}
		res.Message = fmt.Sprintf("%s → %s on %d/%s over IPv%d is %s (egress: %s; ingress: %s).",
			describeEnd(res.Src), describeEnd(res.Dst), p.Port, res.Protocol, v, verdict,
			sideText(r.Egress, policy.Egress), sideText(r.Ingress, policy.Ingress))
		out = append(out, res)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s and %s have no address of a common family", p.From, p.To)
	}
	return out, nil
}

func resolveEnd(inv *Inventory, s string) (*Pod, []netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		a = a.Unmap()
		if p, ok := inv.PodByAddr(a); ok {
			return p, []netip.Addr{a}, nil
		}
		return nil, []netip.Addr{a}, nil
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok {
		return nil, nil, fmt.Errorf("%q: want namespace/pod or an IP address", s)
	}
	p, ok := inv.Pod(ns, name)
	if !ok {
		return nil, nil, fmt.Errorf("pod %s not in the inventory", s)
	}
	return p, p.Addrs, nil
}

func addrOf(as []netip.Addr, v uint8) (netip.Addr, bool) {
	for _, a := range as {
		if flow.Version(a) == v {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func end(inv *Inventory, p *Pod, a netip.Addr) FlowEnd {
	e := FlowEnd{IP: a.String()}
	if p != nil {
		w := inv.Workload(p)
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
