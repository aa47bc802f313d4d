package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/collector/store"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// loadPolicies returns n policies of namespace ns that each select every
// pod of it (an Exists selector, which the label index cannot narrow)
// with one ingress and one egress rule that match no pod: a flow between
// two of its pods is checked against all n on each side.
func loadPolicies(ns string, n int) []*networkingv1.NetworkPolicy {
	none := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "none"}}}}
	out := make([]*networkingv1.NetworkPolicy, n)
	for i := range out {
		out[i] = &networkingv1.NetworkPolicy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p" + strconv.Itoa(i)},
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpExists}}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: none}},
				Egress:      []networkingv1.NetworkPolicyEgressRule{{To: none}},
			},
		}
	}
	return out
}

// denyAll is a proposed policy isolating every pod of ns for ingress.
func denyAll(ns string) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "deny-all"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
}

// storeGroups stores n flow groups between the 20 pods (app=w0..w19) of
// namespace ns, one record each, ending within the minute before end:
// IPv4 and IPv6 alternately, destination ports from port up.
func storeGroups(t *testing.T, ns string, n int, end time.Time, port int) {
	t.Helper()
	recs := make([]flow.Record, n)
	for i := range recs {
		fam := 4 + 2*(i%2)
		s, d := i%20, (i/20)%20
		addr := func(pod int) netip.Addr {
			if fam == 4 {
				return netip.AddrFrom4([4]byte{198, 18, 200, byte(pod)})
			}
			return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0xc8, 15: byte(pod)})
		}
		ep := func(pod int) flow.Endpoint {
			name := "w" + strconv.Itoa(pod)
			return flow.Endpoint{PodNamespace: ns, PodName: name + "-0", Labels: map[string]string{"app": name}, WorkloadKind: "StatefulSet", WorkloadName: name}
		}
		r := flow.Record{Proto: flow.ProtoTCP, SrcPort: 40000, DstPort: uint16(port + i/400), SrcAddr: addr(s), DstAddr: addr(d), Src: ep(s), Dst: ep(d),
			FlowStart: end.Add(-2 * time.Minute), FlowEnd: end.Add(-time.Duration(1+i%50) * time.Second), TimeReceived: end,
			Packets: 3, PacketsDelta: 3, Bytes: 180, BytesDelta: 180}
		r.Normalize()
		recs[i] = r
	}
	var b []byte
	for i := range recs {
		b = store.AppendFlowRow(b, &recs[i])
	}
	if err := needEngine(t).InsertRowBinary(context.Background(), store.FlowsTable, store.FlowColumns, "", len(recs), b); err != nil {
		t.Fatal(err)
	}
}

// TestWhatIfWorkBound: a what-if whose flow groups times the policies
// checked for each pass the bound is refused before it reads the flows,
// 422 naming the window; a lower limit brings it within the bound; only
// the flows to or from the proposal's namespaces are read.
func TestWhatIfWorkBound(t *testing.T) {
	needEngine(t)
	end := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	storeGroups(t, "load", 10_000, end, 8000)
	storeGroups(t, "quiet", 100, end, 9000)
	// 2,000 policies on each side of every "load" flow, before and after
	// the proposal: about 8,000 checks per flow group, 80 million for the
	// 10,000 groups.
	inv := enrich.NewSnapshot(append(objects(namespace("load"), namespace("quiet")), objects(loadPolicies("load", 2000)...)...)...)
	rep, _ := NewReports(engine, "")
	win := Window{Since: end.Add(-time.Hour), Until: end.Add(time.Second)}
	ctx := context.Background()

	_, err := rep.WhatIf(ctx, inv, []*networkingv1.NetworkPolicy{denyAll("load")}, win, 0)
	var tl *TooLargeError
	if !errors.As(err, &tl) || tl.Field != "since" {
		t.Fatalf("10,000 flow groups under 2,000 policies: %v, want a TooLargeError about since", err)
	}
	for _, want := range []string{"flow groups", "namespace load", "policy checks", "narrow the window", "lower limit"} {
		if !strings.Contains(tl.Message, want) {
			t.Errorf("message %q lacks %q", tl.Message, want)
		}
	}
	// Through Queries, as the web API asks (it answers 422 naming since).
	q := &Queries{Reports: rep, Cluster: func() (*enrich.Snapshot, error) { return inv, nil }}
	_, err = q.WhatIf(ctx, strings.NewReader("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny-all, namespace: load}\nspec: {podSelector: {}, policyTypes: [Ingress]}\n"), win, 0)
	if !errors.As(err, &tl) || tl.Field != "since" || !strings.Contains(tl.Message, "policy checks") {
		t.Errorf("what-if through Queries: %v", err)
	}

	// A lower limit reads fewer groups: within the bound, truncated.
	r, err := rep.WhatIf(ctx, inv, []*networkingv1.NetworkPolicy{denyAll("load")}, win, 1000)
	if err != nil || !r.Truncated || r.Flows != 1000 {
		t.Errorf("limit 1000: %v, %+v", err, r)
	}
	// A proposal for "quiet" reads its 100 groups only, and denies them.
	r, err = rep.WhatIf(ctx, inv, []*networkingv1.NetworkPolicy{denyAll("quiet")}, win, 0)
	if err != nil || r.Flows != 100 || r.Truncated || len(r.Changes) != 100 {
		t.Errorf("a proposal for quiet: %v, %d flows read, %d changes, want its 100", err, r.Flows, len(r.Changes))
	}
}

// fakeCounts answers the what-if's counting query with counts and
// records the queries.
type fakeCounts struct {
	counts  string
	queries []string
}

func (f *fakeCounts) Query(_ context.Context, q, _ string) ([]byte, error) {
	f.queries = append(f.queries, q)
	if strings.Contains(q, "uniqCombined64") {
		return []byte(f.counts), nil
	}
	return nil, nil
}

// TestWhatIfChecks: the checks are the groups of each side times the
// policies tried for that side, with the policies before and after the
// proposal, the costliest first past limit; the bound is inclusive; the
// flow groups read are bounded in number and in engine memory.
func TestWhatIfChecks(t *testing.T) {
	inv := &enrich.Snapshot{NetworkPolicies: loadPolicies("load", 3)}
	// 10 groups from app=a and 10 to app=b, all in "load": 3 policies
	// tried per side before the proposal, 4 after (deny-all isolates
	// ingress only: 3 on the egress side after).
	f := &fakeCounts{counts: `{"side":"src","namespace":"load","labels":{"app":"a"},"groups":10}
{"side":"dst","namespace":"load","labels":{"app":"b"},"groups":10}
{"side":"src","namespace":"","labels":{},"groups":5}
{"side":"dst","namespace":"elsewhere","labels":{"app":"x"},"groups":5}
`}
	rep, _ := NewReports(f, "")
	win := Window{Since: time.Now().Add(-time.Hour)}
	want := int64(10*(3+3) + 10*(3+4))
	for _, c := range []struct {
		max, limit int
		ok         bool
	}{
		{int(want), 0, true},
		{int(want) - 1, 0, false},
		// Past limit 5 the costliest groups count: 5 of each side.
		{5*(3+3) + 5*(3+4), 5, true},
		{5*(3+3) + 5*(3+4) - 1, 5, false},
	} {
		rep.WhatIfLimits = WhatIfLimits{MaxChecks: int64(c.max)}
		_, err := rep.WhatIf(context.Background(), inv, []*networkingv1.NetworkPolicy{denyAll("load")}, win, c.limit)
		var tl *TooLargeError
		if got := !errors.As(err, &tl); got != c.ok || (c.ok && err != nil) {
			t.Errorf("max %d, limit %d: %v, want ok %v", c.max, c.limit, err, c.ok)
		}
	}
	rep.WhatIfLimits = WhatIfLimits{MaxFlowGroups: 500}
	f.queries = nil
	if _, err := rep.WhatIf(context.Background(), inv, []*networkingv1.NetworkPolicy{denyAll("load")}, win, 0); err != nil {
		t.Fatal(err)
	}
	if len(f.queries) != 2 {
		t.Fatalf("queries %q, want the count and the read", f.queries)
	}
	read := f.queries[1]
	for _, s := range []string{"LIMIT 501", "max_memory_usage = 536870912", "max_bytes_before_external_group_by = 268435456",
		"(src_pod_namespace IN ('load') OR dst_pod_namespace IN ('load'))"} {
		if !strings.Contains(read, s) {
			t.Errorf("the read lacks %s: %s", s, read)
		}
	}
	var tl *TooLargeError
	if _, err := rep.WhatIf(context.Background(), inv, []*networkingv1.NetworkPolicy{denyAll("load")}, win, 501); !errors.As(err, &tl) || tl.Field != "limit" {
		t.Errorf("limit past MaxFlowGroups: %v, want a TooLargeError about limit", err)
	}
}

// fakeGroups answers the what-if's counting query with n groups from
// app=a to app=b of "load", and its read with the n groups.
type fakeGroups struct{ n int }

func (f fakeGroups) Query(_ context.Context, q, _ string) ([]byte, error) {
	if strings.Contains(q, "uniqCombined64") {
		return []byte(fmt.Sprintf(`{"side":"src","namespace":"load","labels":{"app":"a"},"groups":%[1]d}
{"side":"dst","namespace":"load","labels":{"app":"b"},"groups":%[1]d}
`, f.n)), nil
	}
	var b bytes.Buffer
	for i := range f.n {
		fmt.Fprintf(&b, `{"src_ip":"198.18.200.1","dst_ip":"198.18.200.2","protocol":6,"dst_port":%d,"ip_version":4,`+
			`"src_pod_namespace":"load","src_pod_name":"a-0","src_workload_kind":"StatefulSet","src_workload_name":"a","src_labels":{"app":"a"},`+
			`"dst_pod_namespace":"load","dst_pod_name":"b-0","dst_workload_kind":"StatefulSet","dst_workload_name":"b","dst_labels":{"app":"b"},`+
			`"records":1,"last_ms":1700000000000}`+"\n", 1000+i)
	}
	return b.Bytes(), nil
}

// BenchmarkWhatIfMaximal re-evaluates the largest what-if the default
// bound admits under 2,000 policies that all apply to both ends of every
// flow: 6,249 flow groups of 8,001 checks each, just under
// DefaultWhatIfMaxChecks (the store's part is faked). cpu-s/op is its
// CPU.
func BenchmarkWhatIfMaximal(b *testing.B) {
	inv := enrich.NewSnapshot(append(objects(namespace("load")), objects(loadPolicies("load", 2000)...)...)...)
	rep, _ := NewReports(fakeGroups{n: DefaultWhatIfMaxChecks / 8001}, "")
	win := Window{Since: time.Now().Add(-time.Hour)}
	b.ReportAllocs()
	cpu0 := cpuTime()
	for b.Loop() {
		r, err := rep.WhatIf(context.Background(), inv, []*networkingv1.NetworkPolicy{denyAll("load")}, win, 0)
		if err != nil || r.Flows != DefaultWhatIfMaxChecks/8001 {
			b.Fatalf("%v %+v", err, r)
		}
	}
	b.ReportMetric((cpuTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
}

// allowFromV4 is a proposed policy of frontend: web admits IPv4 pod
// addresses of the cluster but those of node 2, and no IPv6 address.
func allowFromV4() *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: manifest.NSFrontend, Name: "allow-ipv4"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{
				CIDR: manifest.ClusterCIDRv4.String(), Except: []string{manifest.PodCIDRFor(2, corev1.IPv4Protocol).String()}}}}}},
		}}
}

// TestWhatIfCells: a proposal isolating frontend/web for ingress, with
// an ipBlock admitting IPv4 pods of node 1 only, changes the cells into
// web differently per family: over IPv4 the pairs from node 2 are newly
// denied (allow → partial), over IPv6 every pair (allow → deny). Cells
// whose verdict does not change (out of web: the proposal has no egress;
// from tools/probe: denied by its egress before and after) are not
// listed, and each changed pod pair is listed once, with why it is denied.
func TestWhatIfCells(t *testing.T) {
	needEngine(t)
	for _, mode := range []manifest.Mode{manifest.ModeIPv4, manifest.ModeIPv6, manifest.ModeDual} {
		t.Run(string(mode), func(t *testing.T) {
			m, inv := labInventory(t, mode, 2)
			fams := map[manifest.Mode][]int{manifest.ModeIPv4: {4}, manifest.ModeIPv6: {6}, manifest.ModeDual: {4, 6}}[mode]
			rep, _ := NewReports(engine, "")
			// A window without flows: the cells come from the cluster view.
			win := Window{Since: time.Date(2001, 1, 1, 0, 0, 0, 0, time.UTC), Until: time.Date(2001, 1, 1, 1, 0, 0, 0, time.UTC)}
			r, err := rep.WhatIf(context.Background(), inv, []*networkingv1.NetworkPolicy{allowFromV4()}, win, 0)
			if err != nil {
				t.Fatal(err)
			}
			web := Endpoint{Kind: "workload", Namespace: manifest.NSFrontend, Name: "web"}
			api := Endpoint{Kind: "workload", Namespace: manifest.NSBackend, Name: "api"}
			var apiWeb *WhatIfCell
			for i, c := range r.Cells {
				t.Logf("%s -> %s %s: 4 %+v, 6 %+v", c.Src, c.Dst, c.Protocol, *c.Families["4"], *c.Families["6"])
				if c.Src == web && c.Dst.Namespace != manifest.NSFrontend || c.Src.Namespace == manifest.NSTools {
					t.Errorf("cell %s -> %s does not change", c.Src, c.Dst)
				}
				if c.Src == api && c.Dst == web && c.Protocol == "TCP" {
					apiWeb = &r.Cells[i]
				}
			}
			if apiWeb == nil {
				t.Fatal("no cell backend/api -> frontend/web on TCP")
			}
			want := map[int]struct{ outcome string }{4: {OutcomePartial}, 6: {OutcomeDeny}}
			for _, fam := range []int{4, 6} {
				f := apiWeb.Families[strconv.Itoa(fam)]
				if !slices.Contains(fams, fam) {
					if f.Changed || f.Before.Outcome != OutcomeUnavailable || f.After.Outcome != OutcomeUnavailable {
						t.Errorf("IPv%d, absent from the lab: %+v", fam, f)
					}
					continue
				}
				if !f.Changed || f.Before.Outcome != OutcomeAllow || f.Before.PairsAllowed != 4 || f.After.Outcome != want[fam].outcome || f.After.PairsTotal != 4 {
					t.Errorf("IPv%d: %+v, want allow 4/4 -> %s", fam, f, want[fam].outcome)
				}
			}
			if svc := slices.IndexFunc(r.Cells, func(c WhatIfCell) bool {
				return c.Src == api && c.Dst == Endpoint{Kind: "service", Namespace: manifest.NSFrontend, Name: manifest.ServiceWeb}
			}); svc < 0 {
				t.Error("no cell backend/api -> service frontend/web")
			}
			// The pairs of api -> web on TCP 8080: over IPv4 the two from
			// node 2, over IPv6 all four; once each, none newly allowed.
			api2 := manifest.NSBackend + "/" + labPod(t, m, manifest.NSBackend, "api", 2).Name
			count := map[uint8]int{}
			seen := map[string]bool{}
			for _, p := range r.Pairs {
				key := fmt.Sprint(p.IPVersion, p.Protocol, p.Before.Src, p.Before.Dst, p.Before.Port)
				if seen[key] {
					t.Errorf("pair %s listed twice", key)
				}
				seen[key] = true
				if p.Change != ChangeNewlyDenied || p.After.Explanation == "" || !strings.Contains(p.After.Ingress, "frontend/allow-ipv4") || !pairAllowed(p.Before.Verdict) {
					t.Errorf("pair %+v: want newly denied by frontend/allow-ipv4, explained", p)
				}
				if p.Cell < 0 || p.Cell >= len(r.Cells) {
					t.Fatalf("pair %+v: cell %d of %d", p, p.Cell, len(r.Cells))
				}
				if c := r.Cells[p.Cell]; c.Src == api && c.Dst == web && p.Protocol == "TCP" && p.Before.Port == manifest.PortHTTP {
					count[p.IPVersion]++
					if p.IPVersion == 4 && p.Before.Src != api2 {
						t.Errorf("IPv4 pair %s -> %s newly denied: only node 2's pods are", p.Before.Src, p.Before.Dst)
					}
				}
			}
			wantPairs := map[uint8]int{}
			for _, fam := range fams {
				wantPairs[uint8(fam)] = map[int]int{4: 2, 6: 4}[fam]
			}
			if fmt.Sprint(count) != fmt.Sprint(wantPairs) || r.PairsTruncated {
				t.Errorf("pairs of api -> web TCP 8080 per family %v, want %v (truncated %v)", count, wantPairs, r.PairsTruncated)
			}
			if r.Flows != 0 || len(r.Changes) != 0 {
				t.Errorf("no flow in the window: %d flows, %d changes", r.Flows, len(r.Changes))
			}

			// The cells get what the flows leave of the what-if's bound:
			// past it they are skipped, with the reason, before any
			// pair is evaluated, and the flows are still answered.
			rep.WhatIfLimits = WhatIfLimits{MaxChecks: 10}
			r, err = rep.WhatIf(context.Background(), inv, []*networkingv1.NetworkPolicy{allowFromV4()}, win, 0)
			if err != nil || len(r.Cells) != 0 || len(r.Pairs) != 0 || !strings.Contains(r.CellsSkipped, "policy checks, more than the 10 the flows leave") {
				t.Errorf("past MaxChecks: err %v, %d cells, %d pairs, skipped %q: want the cells skipped with the reason", err, len(r.Cells), len(r.Pairs), r.CellsSkipped)
			}
		})
	}
}

// cellsView is a cluster of n namespaces of 10 Deployments of 3
// dual-stack pods each, declaring 8080/TCP, each namespace isolated for
// ingress but from its own pods.
func cellsView(n int) *enrich.Snapshot {
	var objs []runtime.Object
	ctl := true
	for i := range n {
		ns := "ns" + strconv.Itoa(i)
		objs = append(objs, namespace(ns), &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "own"},
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}}}}})
		for w := range 10 {
			for k := range 3 {
				n := (i*10+w)*3 + k
				p := pod(ns, fmt.Sprintf("w%d-%d", w, k), map[string]string{"app": "w" + strconv.Itoa(w)},
					[]string{fmt.Sprintf("198.18.%d.%d", n/250, n%250+1), fmt.Sprintf("fd00:10::%x", n+1)},
					corev1.ContainerPort{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP})
				p.OwnerReferences = []metav1.OwnerReference{{Kind: "Deployment", Name: "w" + strconv.Itoa(w), Controller: &ctl}}
				objs = append(objs, p)
			}
		}
	}
	return enrich.NewSnapshot(objs...)
}

// TestWhatIfCellsBound: a proposal for one namespace of 300 (9,000 pods)
// covers more pod pairs than a what-if evaluates: its cells are skipped,
// naming the proposal's namespace, before any pair is evaluated; the
// flows are answered (none here: the store's count says none).
func TestWhatIfCellsBound(t *testing.T) {
	inv := cellsView(300)
	f := &fakeCounts{}
	rep, _ := NewReports(f, "")
	r, err := rep.WhatIf(context.Background(), inv, []*networkingv1.NetworkPolicy{denyAll("ns0")}, Window{Since: time.Now().Add(-time.Hour)}, 0)
	if err != nil || len(r.Cells) != 0 || !strings.Contains(r.CellsSkipped, "1078200 pod pairs, more than the 1000000") || !strings.Contains(r.CellsSkipped, "namespace ns0") {
		t.Fatalf("err %v, skipped %q: want the cells skipped, naming the proposal's namespace", err, r.CellsSkipped)
	}
	for _, q := range f.queries {
		if strings.Contains(q, "LIMIT") {
			t.Errorf("flows read: %s", q)
		}
	}
	// A cluster of 100 is within the bound.
	if _, err := rep.WhatIf(context.Background(), cellsView(100), []*networkingv1.NetworkPolicy{denyAll("ns0")}, Window{Since: time.Now().Add(-time.Hour)}, 0); err != nil {
		t.Errorf("100 namespaces: %v", err)
	}
}

// BenchmarkWhatIfCells evaluates the cells of a proposal for one
// namespace of a cluster of 100 (1,000 workloads, 3,000 pods): its 10
// workloads to and from every other, twice; the store's part is empty.
// The proposal admits every IPv4 pod into ns0: 9,900 cells change over
// IPv4.
func BenchmarkWhatIfCells(b *testing.B) {
	inv := cellsView(100)
	open := inv.NetworkPolicies[0].DeepCopy()
	open.Spec.Ingress[0].From = append(open.Spec.Ingress[0].From, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: "198.18.0.0/15"}})
	rep, _ := NewReports(&fakeCounts{}, "")
	win := Window{Since: time.Now().Add(-time.Hour)}
	b.ReportAllocs()
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	for b.Loop() {
		r, err := rep.WhatIf(context.Background(), inv, []*networkingv1.NetworkPolicy{open}, win, 0)
		if err != nil {
			b.Fatal(err)
		}
		if len(r.Cells) == 0 {
			b.Fatal("no cell changes")
		}
		b.ReportMetric(float64(len(r.Cells)), "cells")
		b.ReportMetric(float64(len(r.Pairs)), "pairs-listed")
	}
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
	b.ReportMetric(cpu.Seconds()/float64(b.N), "cpu-s/op")
}
