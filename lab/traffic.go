package lab

import (
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/lab/manifest"
)

// Probe is one connection attempt of the default lab with the verdict its
// NetworkPolicies should give. DefaultProbes is the traffic mix of the
// generator and the expectation table of the e2e tests.
type Probe struct {
	Name   string // e.g. "web@1 -> api@2:9090/tcp ipv6"
	From   *corev1.Pod
	Proto  string
	To     netip.AddrPort
	Family corev1.IPFamily
	// ToPod is the destination pod; nil when To is a ClusterIP.
	ToPod *corev1.Pod
	// Allowed is the verdict of the policies; Why says which rule decides.
	Allowed bool
	Why     string
}

// DefaultProbes returns the allowed and denied flows of the default lab
// (manifest.Generate), for every family of the lab's mode. It returns nil
// for a manifest that lacks the default pods.
func (l *Lab) DefaultProbes() []Probe {
	n := len(l.Manifest.Nodes)
	pod := func(ns, app string, node int) *corev1.Pod {
		p, _ := l.PodOn(ns, app, node)
		return p
	}
	web1, webN := pod(manifest.NSFrontend, "web", 1), pod(manifest.NSFrontend, "web", n)
	api1, apiN := pod(manifest.NSBackend, "api", 1), pod(manifest.NSBackend, "api", n)
	probe1, probeN := pod(manifest.NSTools, "probe", 1), pod(manifest.NSTools, "probe", n)
	apiSvc, ok := l.Manifest.Service(manifest.NSBackend, manifest.ServiceAPI)
	if web1 == nil || webN == nil || api1 == nil || apiN == nil || probe1 == nil || probeN == nil || !ok {
		return nil
	}
	var out []Probe
	for _, f := range l.Mode().Families() {
		v4 := f == corev1.IPv4Protocol
		add := func(from *corev1.Pod, fromName string, proto string, to *corev1.Pod, toName string, port uint16, allowed bool, why string) {
			a, ok := manifest.PodAddr(to, f)
			if !ok {
				return
			}
			out = append(out, Probe{
				Name: fmt.Sprintf("%s -> %s:%d/%s %s", fromName, toName, port, proto, f), From: from, Proto: proto,
				To: netip.AddrPortFrom(a, port), Family: f, ToPod: to, Allowed: allowed, Why: why,
			})
		}
		if a, ok := manifest.ServiceAddr(apiSvc, f); ok {
			out = append(out,
				Probe{Name: fmt.Sprintf("web@1 -> svc/api:80/tcp %s", f), From: web1, Proto: agent.TCP, To: netip.AddrPortFrom(a, manifest.ServicePortHTTP),
					Family: f, Allowed: true, Why: "backend/allow-web-to-api/ingress/0 after DNAT"},
				Probe{Name: fmt.Sprintf("web@1 -> svc/api:53/udp %s", f), From: web1, Proto: agent.UDP, To: netip.AddrPortFrom(a, manifest.ServicePortUDPEcho),
					Family: f, Allowed: true, Why: "backend/allow-web-to-api/ingress/0 (named port udp-echo) after DNAT"})
		}
		nn := fmt.Sprintf("@%d", n)
		add(web1, "web@1", agent.TCP, api1, "api@1", manifest.PortHTTP, true, "backend/allow-web-to-api/ingress/0 (same node)")
		add(web1, "web@1", agent.TCP, apiN, "api"+nn, manifest.PortHTTP, true, "backend/allow-web-to-api/ingress/0")
		add(web1, "web@1", agent.UDP, apiN, "api"+nn, manifest.PortUDPEcho, true, "backend/allow-web-to-api/ingress/0 (udp)")
		// The dual-stack gap: the metrics ipBlock only has an IPv4 CIDR.
		add(web1, "web@1", agent.TCP, apiN, "api"+nn, manifest.PortMetrics, v4,
			"backend/allow-metrics-ipv4-only/ingress/0 covers IPv4 only")
		if n > 1 {
			add(webN, "web"+nn, agent.TCP, api1, "api@1", manifest.PortMetrics, false, "source in the ipBlock except (IPv4) or no IPv6 block")
		}
		add(probe1, "probe@1", agent.TCP, api1, "api@1", manifest.PortHTTP, false, "backend/default-deny-ingress: tools is not team=web")
		add(probe1, "probe@1", agent.TCP, webN, "web"+nn, manifest.PortHTTP, false, "tools/restrict-egress: frontend not allowed")
		add(web1, "web@1", agent.ICMP, webN, "web"+nn, 0, true, "frontend has no policy")
		add(web1, "web@1", agent.ICMP, apiN, "api"+nn, 0, false, "backend/default-deny-ingress: every allow rule has ports")
		add(probe1, "probe@1", agent.TCP, probeN, "probe"+nn, manifest.PortDebug, n > 1, "tools/restrict-egress/egress/1: ipBlock except node 1")
		if n > 1 {
			add(probeN, "probe"+nn, agent.TCP, probe1, "probe@1", manifest.PortDebug, false, "tools/restrict-egress/egress/1: node 1 CIDR is in except")
		}
	}
	return out
}

// DefaultFlows returns DefaultProbes as traffic generator flows.
func (l *Lab) DefaultFlows() []agent.Flow {
	var out []agent.Flow
	for _, p := range l.DefaultProbes() {
		out = append(out, agent.Flow{Name: p.Name, NetNS: l.PodNetNSPath(p.From), Proto: p.Proto, To: p.To, Allowed: p.Allowed})
	}
	return out
}
