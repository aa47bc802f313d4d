package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dualflow/dualflow/traceflow"
)

// runTrace starts a trace over REST (POST /api/v1/traceflows, as the CLI
// and the UI do) and waits for its end.
func runTrace(ctx context.Context, web *webClient, req traceflow.Request) (traceflow.Result, error) {
	var res traceflow.Result
	if err := web.post(ctx, "/api/v1/traceflows", req, &res); err != nil {
		return res, err
	}
	id := res.ID
	err := poll(ctx, time.Minute, func() (bool, error) {
		if err := web.get(ctx, "/api/v1/traceflows/"+id, &res); err != nil {
			return false, err
		}
		return res.Phase != traceflow.Running, nil
	})
	return res, err
}

func familyOf(a netip.Addr) traceflow.Family {
	if a.Is4() {
		return traceflow.IPv4
	}
	return traceflow.IPv6
}

func describe(fr traceflow.FamilyResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s (%s):", fr.Family, fr.Outcome, fr.Reason)
	for _, o := range fr.Observations {
		fmt.Fprintf(&b, " [%s %s %s %s pod=%s svc=%s policy=%s rule=%s dnat=%v]", o.Node, o.Component, o.Action, o.Interface, o.Pod, o.Service, o.Policy, o.Rule, o.TranslatedDst)
	}
	return b.String()
}

// checkTraceflow traces, through the node agents in the exporters, from a
// client pod that containerd created to each Service per family (the
// probe is DNATed by kube-proxy to a backend, which receives it) and to
// the server pod on the other node (delivered across nodes).
func checkTraceflow(t *testing.T, ctx context.Context, c *Cluster, web *webClient) {
	clients, err := c.Pods(ctx, NSClient, "web")
	if err != nil {
		t.Fatal(err)
	}
	servers, err := c.Pods(ctx, NSServer, "api")
	if err != nil {
		t.Fatal(err)
	}
	client := clients[0]
	backends := map[netip.AddrPort]*corev1.Pod{}
	for i := range servers {
		for _, ip := range servers[i].Status.PodIPs {
			backends[netip.AddrPortFrom(netip.MustParseAddr(ip.IP), ServerPort)] = &servers[i]
		}
	}
	traces := 0
	for _, svc := range []string{SvcDual, SvcV4, SvcV6} {
		s, err := c.API.Admin.CoreV1().Services(NSServer).Get(ctx, svc, metav1.GetOptions{})
		if err != nil {
			continue // not in this mode
		}
		for _, ip := range s.Spec.ClusterIPs {
			fam := familyOf(netip.MustParseAddr(ip))
			req := traceflow.Request{Source: NSClient + "/" + client.Name, Destination: traceflow.Destination{Service: NSServer + "/" + svc, Port: 80},
				Family: fam, Timeout: traceflow.Duration(10 * time.Second)}
			res, err := runTrace(ctx, web, req)
			if err != nil {
				t.Errorf("trace %s → service %s %s: %v", client.Name, svc, fam, err)
				continue
			}
			fr, _ := res.Family(fam)
			lb := slices.IndexFunc(fr.Observations, func(o traceflow.Observation) bool { return o.Component == traceflow.LoadBalancing })
			del := slices.IndexFunc(fr.Observations, func(o traceflow.Observation) bool { return o.Component == traceflow.Delivery })
			switch {
			case fr.Outcome != traceflow.Delivered || lb < 0 || del < 0:
				t.Errorf("trace %s → service %s: want delivered through kube-proxy's DNAT: %s", client.Name, svc, describe(fr))
			case fr.Observations[lb].Service != NSServer+"/"+svc || backends[fr.Observations[lb].TranslatedDst] == nil ||
				fr.Observations[lb].Node != client.Spec.NodeName:
				t.Errorf("trace %s → service %s: the DNAT on %s is not to a backend: %s", client.Name, svc, client.Spec.NodeName, describe(fr))
			case fr.Observations[del].Pod != NSServer+"/"+backends[fr.Observations[lb].TranslatedDst].Name ||
				fr.Observations[del].Node != backends[fr.Observations[lb].TranslatedDst].Spec.NodeName:
				t.Errorf("trace %s → service %s: delivered elsewhere than the DNAT's backend: %s", client.Name, svc, describe(fr))
			default:
				traces++
				t.Logf("trace %s → service %s %s: DNAT on %s to %s, delivered to %s on %s", client.Name, svc, fam,
					fr.Observations[lb].Node, fr.Observations[lb].TranslatedDst, fr.Observations[del].Pod, fr.Observations[del].Node)
			}
		}
	}
	// Across nodes, to the server pod of the other node, every family.
	for i := range servers {
		sv := &servers[i]
		if sv.Spec.NodeName == client.Spec.NodeName {
			continue
		}
		for _, ip := range sv.Status.PodIPs {
			fam := familyOf(netip.MustParseAddr(ip.IP))
			res, err := runTrace(ctx, web, traceflow.Request{Source: NSClient + "/" + client.Name,
				Destination: traceflow.Destination{Pod: NSServer + "/" + sv.Name, Port: ServerPort}, Family: fam, Timeout: traceflow.Duration(10 * time.Second)})
			if err != nil {
				t.Errorf("trace %s → %s %s: %v", client.Name, sv.Name, fam, err)
				continue
			}
			fr, _ := res.Family(fam)
			nodes := map[string]bool{}
			for _, o := range fr.Observations {
				nodes[o.Node] = true
			}
			if fr.Outcome != traceflow.Delivered || !nodes[client.Spec.NodeName] || !nodes[sv.Spec.NodeName] {
				t.Errorf("trace %s on %s → %s on %s: want delivered, seen on both nodes: %s", client.Name, client.Spec.NodeName, sv.Name, sv.Spec.NodeName, describe(fr))
				continue
			}
			traces++
		}
	}
	t.Logf("traceflow through the node agents: %d traces delivered as kube-proxy and the CNI bridge forwarded them", traces)
}

// checkTracedDrops traces each attempt of checkPolicy: what kube-router
// allows is delivered, what it rejects ends on the server's node with the
// drop named for the policy.
func checkTracedDrops(t *testing.T, ctx context.Context, web *webClient, policy string, client, server *corev1.Pod, to netip.AddrPort, allow bool) bool {
	fam := familyOf(to.Addr())
	res, err := runTrace(ctx, web, traceflow.Request{Source: NSClient + "/" + client.Name,
		Destination: traceflow.Destination{Pod: NSServer + "/" + server.Name, Port: ServerPort}, Family: fam, Timeout: traceflow.Duration(10 * time.Second)})
	if err != nil {
		t.Errorf("trace %s → %s %s: %v", client.Name, server.Name, fam, err)
		return false
	}
	fr, _ := res.Family(fam)
	if allow {
		if fr.Outcome != traceflow.Delivered {
			t.Errorf("trace %s → %s %s: kube-router lets it in, the trace says %s", client.Name, server.Name, fam, describe(fr))
			return false
		}
		return true
	}
	drop := slices.IndexFunc(fr.Observations, func(o traceflow.Observation) bool {
		return o.Action == traceflow.ActionDropped || o.Action == traceflow.ActionRejected
	})
	if (fr.Outcome != traceflow.Dropped && fr.Outcome != traceflow.Rejected) || drop < 0 ||
		fr.Observations[drop].Component != traceflow.NetworkPolicy || !strings.Contains(fr.Observations[drop].Policy, NSServer+"/"+policy) ||
		fr.Observations[drop].Node != server.Spec.NodeName || !strings.Contains(fr.Reason, NSServer+"/"+policy) {
		t.Errorf("trace %s → %s %s: kube-router rejects it; want a drop on %s naming %s/%s: %s", client.Name, server.Name, fam, server.Spec.NodeName, NSServer, policy, describe(fr))
		return false
	}
	t.Logf("trace %s → %s %s: %s", client.Name, server.Name, fam, fr.Reason)
	return true
}
