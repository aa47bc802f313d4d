package cluster

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dualflow/dualflow/lab/agent"
	"github.com/dualflow/dualflow/web/api"
)

// churnConn is one connection the traffic made during churn, and the pod
// that answered it (the server says its name): the truth its row must tell.
type churnConn struct {
	client  string
	srcPort uint16
	family  int
	to      netip.AddrPort
	server  string // "ns/pod"
	phase   int32  // the churn steps done when it was made
	at      time.Time
}

// checkChurn runs traffic from every client pod to every server pod's
// addresses and to every Service address while the cluster churns: a
// rolling restart of the api Deployment (new pods on new addresses), a
// scale-down, a roll of the exporter DaemonSet, and the collector pod
// deleted (its Recreate strategy brings it back on the same volume). Then
// every connection that was answered must have a row (the rows missing
// are the records lost, against the bound maxLost), and no row may name
// another pod than the one that answered. Rows beyond one per connection
// and rows that name no destination pod are counted and reported: the
// real cluster showed both across an exporter roll, and they are not
// fixed yet.
func checkChurn(t *testing.T, ctx context.Context, c *Cluster, in *Install, web *webClient) *webClient {
	const maxLost = 0 // the target: none lost
	began := time.Now()
	var (
		mu    sync.Mutex
		conns []churnConn
		fails int
		phase atomic.Int32
		// serverIPs are the addresses each server pod ("ns/pod") was
		// seen with.
		serverIPs = map[string][]netip.Addr{}
	)
	tctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			clients, _ := c.Pods(tctx, NSClient, "web")
			servers, _ := c.Pods(tctx, NSServer, "api")
			var targets []netip.AddrPort
			for _, s := range servers {
				if s.DeletionTimestamp != nil {
					continue
				}
				for _, ip := range s.Status.PodIPs {
					a := netip.MustParseAddr(ip.IP)
					targets = append(targets, netip.AddrPortFrom(a, ServerPort))
					mu.Lock()
					if k := NSServer + "/" + s.Name; !slices.Contains(serverIPs[k], a) {
						serverIPs[k] = append(serverIPs[k], a)
					}
					mu.Unlock()
				}
			}
			for _, name := range []string{SvcDual, SvcV4, SvcV6} {
				if ips, err := c.ServiceIPs(tctx, NSServer, name); err == nil {
					for _, a := range ips {
						targets = append(targets, netip.AddrPortFrom(a, 80))
					}
				}
			}
			for i := range clients {
				netns, err := PodNetNS(&clients[i])
				if err != nil {
					continue
				}
				for _, to := range targets {
					at := time.Now()
					r, err := agent.Dial(tctx, netns, agent.TCP, to, 2*time.Second)
					mu.Lock()
					if err != nil {
						fails++ // a pod going away, an endpoint not yet removed
					} else {
						conns = append(conns, churnConn{clients[i].Name, r.Local.Port(), family(to.Addr()), to, r.Server, phase.Load(), at})
					}
					mu.Unlock()
				}
			}
			select {
			case <-tctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	step := func(what string, args ...[]string) {
		t.Helper()
		at := time.Now()
		for _, a := range args {
			if out, err := c.Kubectl(ctx, nil, a...); err != nil {
				stop()
				wg.Wait()
				t.Fatalf("%s: %v\n%s", what, err, out)
			}
		}
		phase.Add(1)
		t.Logf("churn: %s in %s", what, time.Since(at).Round(100*time.Millisecond))
	}
	step("rolling restart of backend/api (new pods on new addresses)",
		[]string{"-n", NSServer, "rollout", "restart", "deployment/api"},
		[]string{"-n", NSServer, "rollout", "status", "deployment/api", "--timeout=3m"})
	step("scale-down of backend/api to one pod",
		[]string{"-n", NSServer, "scale", "deployment/api", "--replicas=1"},
		[]string{"-n", NSServer, "rollout", "status", "deployment/api", "--timeout=3m"})
	if err := poll(ctx, 3*time.Minute, func() (bool, error) {
		l, err := c.API.Admin.CoreV1().Pods(NSServer).List(ctx, metav1.ListOptions{LabelSelector: "app=api"})
		return err == nil && len(l.Items) == 1, nil
	}); err != nil {
		t.Errorf("churn: the scaled-down pods never went: %v", err)
	}
	step("exporter DaemonSet rolled",
		[]string{"-n", in.Namespace, "rollout", "restart", "daemonset/dualflow-exporter"},
		[]string{"-n", in.Namespace, "rollout", "status", "daemonset/dualflow-exporter", "--timeout=3m"})
	step("collector pod deleted and back (Recreate, same volume)",
		[]string{"-n", in.Namespace, "delete", "pod", "-l", "app.kubernetes.io/component=collector", "--wait=true"},
		[]string{"-n", in.Namespace, "rollout", "status", "deployment/dualflow-collector", "--timeout=5m"})
	// Traffic on to the end of an exporter's and the collector's
	// reconnection, then stop.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(time.Second)
	}
	stop()
	wg.Wait()
	churned := time.Since(began)
	// The port-forward went with the old collector pod.
	web = portForward(t, ctx, c, in)

	// Every answered connection's rows, by client pod, source port, family
	// and the address it was sent to (a row's Service address, else its
	// destination): a client reuses a source port over the run, and an
	// attempt that failed while pods went (not in conns) may have a row
	// of its own, naming the pod it reached, under the key of a later
	// connection. So a row is the connection of its key made nearest its
	// start, within nearRow; a row near none is a failed attempt's, and
	// so is a row whose destination is not an address of the pod that
	// answered (the source port reused by the next attempt).
	type key struct {
		client string
		port   uint16
		family int
		to     netip.Addr
	}
	want := map[key][]churnConn{}
	for _, cn := range conns {
		k := key{cn.client, cn.srcPort, cn.family, cn.to.Addr()}
		want[k] = append(want[k], cn)
	}
	const nearRow = 10 * time.Second // a dial's 2 s timeout and the clocks of the nodes, with room
	var missing, wrong, unnamed []string
	rows, extra, attempts := 0, 0, 0
	err := poll(ctx, 3*time.Minute, func() (bool, error) {
		q := fmt.Sprintf(`SELECT src_pod_name, src_port, ip_version, dst_pod_namespace, dst_pod_name, dst_ip, dst_port, service_ip,
       exporter_node, toString(end_reason), toUnixTimestamp64Milli(flow_start), toUnixTimestamp64Milli(flow_end), dst_node, k8s_view_stale
FROM flows WHERE src_pod_namespace = '%s' AND dst_port = %d AND probe_trace_id = '' AND flow_start >= fromUnixTimestamp64Milli(%d)`,
			NSClient, ServerPort, began.Add(-time.Second).UnixMilli())
		var res api.SQLResult
		if err := web.post(ctx, "/api/v1/sql", api.SQLRequest{Query: q}, &res); err != nil {
			t.Logf("churn rows: %v", err)
			return false, nil
		}
		if res.Truncated {
			return false, fmt.Errorf("%d rows and more: the query's limit", len(res.Rows))
		}
		rows = len(res.Rows)
		missing, wrong, unnamed, extra, attempts = missing[:0], wrong[:0], unnamed[:0], 0, 0
		seen := map[*churnConn][]string{}
		detail := map[*churnConn][]string{}
		for _, r := range res.Rows {
			to, _ := netip.ParseAddr(fmt.Sprint(r[7])) // service_ip
			if !to.IsValid() {
				to, _ = netip.ParseAddr(fmt.Sprint(r[5])) // dst_ip
			}
			k := key{fmt.Sprint(r[0]), uint16(num(r[1])), int(num(r[2])), to}
			start := time.UnixMilli(int64(num(r[10])))
			c, ok := nearest(want[k], start, nearRow)
			if !ok {
				attempts++ // a failed attempt's, or a row whose start is not its connection's (an exporter's restart dumps it again)
				continue
			}
			// A row that reached another address than the answering pod's
			// is not its connection: an attempt that failed (to a pod
			// going away) with the same source port, reused within nearRow.
			if ips, known := serverIPs[c.server]; known {
				if dst, err := netip.ParseAddr(fmt.Sprint(r[5])); err == nil && !slices.Contains(ips, dst.Unmap()) {
					attempts++
					continue
				}
			}
			seen[c] = append(seen[c], fmt.Sprintf("%v/%v", r[3], r[4]))
			detail[c] = append(detail[c], fmt.Sprintf("%v", r[5:]))
		}
		for _, cs := range want {
			for i := range cs {
				cn := &cs[i]
				got := seen[cn]
				if len(got) == 0 {
					missing = append(missing, fmt.Sprintf("IPv%d %s:%d → %s (answered by %s)", cn.family, cn.client, cn.srcPort, cn.to, cn.server))
					continue
				}
				extra += len(got) - 1
				for j, g := range got {
					switch {
					case g == "/":
						unnamed = append(unnamed, fmt.Sprintf("IPv%d %s:%d → %s answered by %s after step %d: %v", cn.family, cn.client, cn.srcPort, cn.to, cn.server, cn.phase, detail[cn][j]))
					case g != cn.server:
						wrong = append(wrong, fmt.Sprintf("IPv%d %s:%d → %s: row names %s, answered by %s after step %d (rows %v)", cn.family, cn.client, cn.srcPort, cn.to, g, cn.server, cn.phase, detail[cn]))
					}
				}
			}
		}
		return len(missing) <= maxLost && len(wrong) == 0, nil
	})
	sort.Strings(missing)
	sort.Strings(unnamed)
	if len(wrong) > 0 {
		t.Errorf("churn: %d rows name another pod than the one that answered:\n%s", len(wrong), strings.Join(wrong[:min(len(wrong), 20)], "\n"))
	}
	if err != nil && len(missing) > maxLost {
		t.Errorf("churn: %d of %d connections have no row (bound %d):\n%s", len(missing), len(conns), maxLost, strings.Join(missing[:min(len(missing), 20)], "\n"))
	}
	// Known, not yet fixed (issue 35's notes): an exporter roll reports
	// connections again (the stopping exporter's forced_end flush, the
	// new one's conntrack dump), and some rows name no destination pod.
	t.Logf("churn: %d connections answered (and %d attempts refused or unanswered while pods went) over %s; %d rows: %d connections without a row (bound %d; first: %s), %d rows naming a wrong pod, %d rows beyond one per connection, %d rows naming no destination pod (first: %s), %d rows of failed attempts",
		len(conns), fails, churned.Round(time.Second), rows, len(missing), maxLost, strings.Join(missing[:min(len(missing), 3)], "; "), len(wrong), extra, len(unnamed), strings.Join(unnamed[:min(len(unnamed), 5)], "; "), attempts)
	return web
}

// nearest is the connection of cs made nearest start, if one is within d.
func nearest(cs []churnConn, start time.Time, d time.Duration) (*churnConn, bool) {
	var best *churnConn
	for i := range cs {
		if off := start.Sub(cs[i].at).Abs(); off <= d && (best == nil || off < start.Sub(best.at).Abs()) {
			best = &cs[i]
		}
	}
	return best, best != nil
}

func num(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case string:
		var f float64
		fmt.Sscan(n, &f)
		return f
	}
	return 0
}
