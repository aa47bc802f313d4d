package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/dualflow/dualflow/collector/audit/recommend"
	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/web/api"
)

// clusterConn is one connection of checkRecommend: from a client pod to a
// server pod's address or a Service's ClusterIP.
type clusterConn struct {
	client *corev1.Pod
	to     netip.AddrPort
	proto  string
	what   string
}

func (c clusterConn) dial(ctx context.Context) (agent.Reply, error) {
	netns, err := PodNetNS(c.client)
	if err != nil {
		return agent.Reply{}, err
	}
	return agent.Dial(ctx, netns, c.proto, c.to, 3*time.Second)
}

// checkRecommend asks the collector, through the port-forward as an
// operator would, for a least-privilege recommendation for the server
// namespace from the web → api connections it observed over TCP (pod to
// pod and through the Services, every family of the cluster), applies
// it with kubectl, and checks with kube-router enforcing it: the observed
// connections still answer in every family, and web → api on the UDP
// port api listens on (never observed in the window) is refused, in every
// family, though it answered before. Run after checkPolicy deleted its
// policy: backend has none.
func checkRecommend(t *testing.T, ctx context.Context, c *Cluster, web *webClient) {
	clients, err := c.Pods(ctx, NSClient, "web")
	if err != nil {
		t.Fatal(err)
	}
	servers, err := c.Pods(ctx, NSServer, "api")
	if err != nil {
		t.Fatal(err)
	}
	var observed, unobserved []clusterConn
	for i := range clients {
		cl := &clients[i]
		for j := range servers {
			for _, ip := range servers[j].Status.PodIPs {
				a := netip.MustParseAddr(ip.IP)
				what := fmt.Sprintf("IPv%d %s → %s", family(a), cl.Name, servers[j].Name)
				observed = append(observed, clusterConn{cl, netip.AddrPortFrom(a, ServerPort), agent.TCP, what + fmt.Sprintf(":%d/tcp", ServerPort)})
				unobserved = append(unobserved, clusterConn{cl, netip.AddrPortFrom(a, ServerUDPPort), agent.UDP, what + fmt.Sprintf(":%d/udp", ServerUDPPort)})
			}
		}
		for _, svc := range []string{SvcDual, SvcV4, SvcV6} {
			ips, err := c.ServiceIPs(ctx, NSServer, svc)
			if err != nil {
				continue // not in this mode
			}
			for _, a := range ips {
				observed = append(observed, clusterConn{cl, netip.AddrPortFrom(a, 80), agent.TCP, fmt.Sprintf("IPv%d %s → svc/%s:80/tcp", family(a), cl.Name, svc)})
			}
		}
	}

	// checkPolicy deleted its policy; kube-router lifts it within
	// seconds: the window starts with the first round in which every
	// connection answers.
	type sent struct {
		clusterConn
		local netip.AddrPort
	}
	var dialled []sent
	var since time.Time
	var failed []string
	err = poll(ctx, 2*time.Minute, func() (bool, error) {
		since, dialled, failed = time.Now(), dialled[:0], failed[:0]
		for _, o := range observed {
			r, err := o.dial(ctx)
			if err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", o.what, err))
				continue
			}
			dialled = append(dialled, sent{o, r.Local})
		}
		return len(failed) == 0, nil
	})
	if err != nil {
		t.Fatalf("web → api without policies: %v\n%s", err, strings.Join(failed, "\n"))
	}
	// Every connection stored.
	var missing []string
	err = poll(ctx, 3*time.Minute, func() (bool, error) {
		q := url.Values{"src_namespace": {NSClient}, "dst_namespace": {NSServer}, "since": {since.UTC().Format(time.RFC3339Nano)}, "limit": {"1000"}}
		var page api.FlowPage
		if err := web.get(ctx, "/api/v1/flows?"+q.Encode(), &page); err != nil {
			return false, nil
		}
		missing = missing[:0]
		for _, d := range dialled {
			if !slices.ContainsFunc(page.Flows, func(f api.Flow) bool {
				return f.SrcIP == d.local.Addr().String() && f.SrcPort == int(d.local.Port()) && f.Protocol == "TCP"
			}) {
				missing = append(missing, d.what)
			}
		}
		return len(missing) == 0, nil
	})
	if err != nil {
		t.Fatalf("connections not stored: %v: %s", err, strings.Join(missing, ", "))
	}

	// The window ends here: the unobserved connections dialled below, to
	// show they answer before the recommendation, are after it.
	until := time.Now()
	q := url.Values{"namespace": {NSServer}, "mode": {string(recommend.LeastPrivilege)},
		"since": {since.UTC().Format(time.RFC3339Nano)}, "until": {until.UTC().Format(time.RFC3339Nano)}}
	var rep recommend.Report
	if err := web.get(ctx, "/api/v1/policy/recommend?"+q.Encode(), &rep); err != nil {
		t.Fatal(err)
	}
	var table []string
	for _, fr := range rep.Replay {
		table = append(table, fmt.Sprintf("IPv%d: %d observed allowed, %d kept, %d newly denied, %d newly allowed", fr.Family, fr.Allowed, fr.Kept, len(fr.NewlyDenied), len(fr.NewlyAllowed)))
	}
	t.Logf("least-privilege for namespace %s (%d flow groups): %v\n%s\nnotes %q\n%s", NSServer, rep.Flows, rep.Policies, strings.Join(table, "\n"), rep.Notes, rep.YAML)
	for _, f := range c.Mode().Families() {
		v := uint8(4)
		if f == corev1.IPv6Protocol {
			v = 6
		}
		i := slices.IndexFunc(rep.Replay, func(fr recommend.FamilyReplay) bool { return fr.Family == v })
		if i < 0 || rep.Replay[i].Allowed == 0 || rep.Replay[i].Kept != rep.Replay[i].Allowed || len(rep.Replay[i].NewlyDenied) != 0 {
			t.Fatalf("replay of IPv%d: %v; want every observed allowed group kept", v, table)
		}
	}

	// Before: nothing isolates api; the UDP port answers in every family.
	for _, u := range unobserved {
		if _, err := u.dial(ctx); err != nil {
			t.Fatalf("%s before the recommendation: %v (no policy isolates api)", u.what, err)
		}
	}
	if _, err := c.Kubectl(ctx, strings.NewReader(rep.YAML), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	applied := time.Now()
	defer func() {
		for _, p := range rep.Policies {
			ns, name, _ := strings.Cut(p, "/")
			if _, err := c.Kubectl(ctx, nil, "-n", ns, "delete", "networkpolicy", name); err != nil {
				t.Errorf("delete %s: %v", p, err)
			}
		}
	}()
	// kube-router applies policies within seconds: wait until the
	// observed connections answer and the unobserved ones are refused,
	// every one in the same round.
	var last []string
	err = poll(ctx, 2*time.Minute, func() (bool, error) {
		for n := 1; n <= Nodes; n++ {
			if err := c.exited("kube-router-" + nodeName(n)); err != nil {
				return false, err
			}
		}
		last = last[:0]
		for _, o := range observed {
			if _, err := o.dial(ctx); err != nil {
				last = append(last, fmt.Sprintf("observed %s: %v", o.what, err))
			}
		}
		for _, u := range unobserved {
			_, err := u.dial(ctx)
			switch {
			case err == nil:
				last = append(last, fmt.Sprintf("unobserved %s answers", u.what))
			case !errors.Is(err, agent.ErrNoAnswer) && !errors.Is(err, syscall.ECONNREFUSED):
				// kube-router rejects (ICMP port unreachable): refused too.
				return false, fmt.Errorf("%s: %w", u.what, err)
			}
		}
		return len(last) == 0, nil
	})
	if err != nil {
		t.Fatalf("kube-router with the recommendation %v: %v\n%s", rep.Policies, err, strings.Join(last, "\n"))
	}
	perFam := map[int][2]int{}
	for _, o := range observed {
		n := perFam[family(o.to.Addr())]
		n[0]++
		perFam[family(o.to.Addr())] = n
	}
	for _, u := range unobserved {
		n := perFam[family(u.to.Addr())]
		n[1]++
		perFam[family(u.to.Addr())] = n
	}
	for _, fam := range []int{4, 6} {
		if n, ok := perFam[fam]; ok {
			t.Logf("IPv%d with %v applied (kube-router enforcing within %s): %d observed connections (pod and Service) answer, %d unobserved web → api:%d/udp refused (dropped or rejected)",
				fam, rep.Policies, time.Since(applied).Round(100*time.Millisecond), n[0], n[1], ServerUDPPort)
		}
	}
}
