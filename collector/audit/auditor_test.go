package audit

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/lab/manifest"
)

// record builds the record enrichment would produce for a flow from pod
// src to pod dst (nil: an outside address) over family f.
func record(t testing.TB, inv *enrich.Snapshot, src, dst *corev1.Pod, f corev1.IPFamily, proto uint8, port uint16) flow.Record {
	t.Helper()
	r := flow.Record{Proto: proto, DstPort: port, SrcPort: 40000}
	end := func(p *corev1.Pod, e *flow.Endpoint, a *netip.Addr) {
		if p == nil {
			*a = netip.MustParseAddr("198.19.255.1")
			if f == corev1.IPv6Protocol {
				*a = netip.MustParseAddr("fd00:10:ffff::1")
			}
			return
		}
		addr, ok := manifest.PodAddr(p, f)
		if !ok {
			t.Fatalf("pod %s has no %s address", p.Name, f)
		}
		*a = addr
		ip, _ := inv.Pod(p.Namespace, p.Name)
		w := inv.Workload(ip)
		*e = flow.Endpoint{PodNamespace: p.Namespace, PodName: p.Name, Labels: p.Labels, WorkloadKind: w.Kind, WorkloadName: w.Name, PodAddrs: ip.Addrs}
	}
	end(src, &r.Src, &r.SrcAddr)
	end(dst, &r.Dst, &r.DstAddr)
	r.Normalize()
	return r
}

func labPod(t testing.TB, m *manifest.Manifest, ns, app string, node int) *corev1.Pod {
	t.Helper()
	for i := range m.Pods {
		p := &m.Pods[i]
		if p.Namespace == ns && p.Labels["app"] == app && p.Spec.NodeName == manifest.NodeName(node) {
			return p
		}
	}
	t.Fatalf("no %s/%s on node %d", ns, app, node)
	return nil
}

func TestAuditLab(t *testing.T) {
	m, inv := labInventory(t, manifest.ModeDual, 2)
	web1, web2 := labPod(t, m, "frontend", "web", 1), labPod(t, m, "frontend", "web", 2)
	api1, api2 := labPod(t, m, "backend", "api", 1), labPod(t, m, "backend", "api", 2)
	probe1, probe2 := labPod(t, m, "tools", "probe", 1), labPod(t, m, "tools", "probe", 2)
	reg := prometheus.NewRegistry()
	a, err := New(Config{}, inv, reg)
	if err != nil {
		t.Fatal(err)
	}
	unaudited := record(t, inv, web1, api2, corev1.IPv4Protocol, flow.ProtoTCP, 8080)
	a.Audit(&unaudited)
	if unaudited.Ingress.Verdict != flow.VerdictUnknown {
		t.Fatalf("audited before the policies are known: %+v", unaudited.Ingress)
	}
	if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
		t.Fatal(err)
	}
	type side struct {
		v          flow.Verdict
		ns, policy string
		rule       int32
	}
	allow := func(ns, name string, rule int32) side { return side{flow.VerdictAllowed, ns, name, rule} }
	deny := func(ns, name string) side { return side{flow.VerdictDenied, ns, name, -1} }
	open := side{flow.VerdictNotIsolated, "", "", -1}
	none := side{flow.VerdictUnknown, "", "", -1}
	cases := []struct {
		name            string
		src, dst        *corev1.Pod
		proto           uint8
		port            uint16
		v4, v6          [2]side // egress, ingress
		reported, named string
	}{
		{name: "web to api http (named port)", src: web1, dst: api2, proto: flow.ProtoTCP, port: 8080,
			v4: [2]side{open, allow("backend", manifest.PolicyAllowWeb, 0)}, v6: [2]side{open, allow("backend", manifest.PolicyAllowWeb, 0)}},
		{name: "web to api udp-echo", src: web1, dst: api1, proto: flow.ProtoUDP, port: 5353,
			v4: [2]side{open, allow("backend", manifest.PolicyAllowWeb, 0)}, v6: [2]side{open, allow("backend", manifest.PolicyAllowWeb, 0)}},
		{name: "metrics: the dual-stack gap", src: web1, dst: api2, proto: flow.ProtoTCP, port: 9090,
			v4: [2]side{open, allow("backend", manifest.PolicyMetricsIPv4, 0)}, v6: [2]side{open, deny("backend", manifest.PolicyDefaultDeny)}},
		{name: "metrics from the except", src: web2, dst: api1, proto: flow.ProtoTCP, port: 9090,
			v4: [2]side{open, deny("backend", manifest.PolicyDefaultDeny)}, v6: [2]side{open, deny("backend", manifest.PolicyDefaultDeny)}},
		{name: "tools to api: egress allows, ingress denies", src: probe1, dst: api1, proto: flow.ProtoTCP, port: 8080,
			v4: [2]side{allow("tools", manifest.PolicyToolsEgress, 0), deny("backend", manifest.PolicyDefaultDeny)},
			v6: [2]side{allow("tools", manifest.PolicyToolsEgress, 0), deny("backend", manifest.PolicyDefaultDeny)}},
		{name: "tools to frontend: egress denies", src: probe1, dst: web2, proto: flow.ProtoTCP, port: 8080,
			v4: [2]side{deny("tools", manifest.PolicyToolsEgress), open}, v6: [2]side{deny("tools", manifest.PolicyToolsEgress), open}},
		{name: "probe to probe: ipBlock and endPort", src: probe1, dst: probe2, proto: flow.ProtoTCP, port: 7070,
			v4: [2]side{allow("tools", manifest.PolicyToolsEgress, 1), open}, v6: [2]side{allow("tools", manifest.PolicyToolsEgress, 1), open}},
		{name: "probe to probe: node 1 is excepted", src: probe2, dst: probe1, proto: flow.ProtoTCP, port: 7070,
			v4: [2]side{deny("tools", manifest.PolicyToolsEgress), open}, v6: [2]side{deny("tools", manifest.PolicyToolsEgress), open}},
		{name: "icmp to api", src: web1, dst: api2, proto: flow.ProtoICMP, port: 0,
			v4: [2]side{open, deny("backend", manifest.PolicyDefaultDeny)}, v6: [2]side{open, deny("backend", manifest.PolicyDefaultDeny)}},
		{name: "outside client to web", src: nil, dst: web1, proto: flow.ProtoTCP, port: 8080,
			v4: [2]side{none, open}, v6: [2]side{none, open}},
		{name: "outside client to api", src: nil, dst: api1, proto: flow.ProtoTCP, port: 8080,
			v4: [2]side{none, deny("backend", manifest.PolicyDefaultDeny)}, v6: [2]side{none, deny("backend", manifest.PolicyDefaultDeny)}},
	}
	for _, c := range cases {
		for fi, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
			t.Run(c.name+"/"+string(f), func(t *testing.T) {
				want := c.v4
				if fi == 1 {
					want = c.v6
				}
				r := record(t, inv, c.src, c.dst, f, c.proto, c.port)
				// The datapath reported the opposite of the evaluated
				// ingress verdict: Audit keeps it, and flags it.
				reported := flow.VerdictDenied
				if want[1].v == flow.VerdictDenied {
					reported = flow.VerdictAllowed
				}
				r.Ingress.ReportedVerdict, r.Ingress.ReportedName = reported, "datapath/rule"
				a.Audit(&r)
				for i, got := range []flow.Policy{r.Egress, r.Ingress} {
					w := want[i]
					if got.Verdict != w.v || got.Namespace != w.ns || got.Name != w.policy || got.Rule != w.rule {
						t.Errorf("%s: got %+v, want %+v", []string{"egress", "ingress"}[i], got, w)
					}
				}
				if r.Ingress.ReportedVerdict != reported || r.Ingress.ReportedName != "datapath/rule" {
					t.Errorf("reported verdict changed: %+v", r.Ingress)
				}
				if (want[1].v != flow.VerdictUnknown) != r.VerdictMismatch() {
					t.Errorf("VerdictMismatch = %v", r.VerdictMismatch())
				}
				// A gap: the two families of the same pods decided
				// differently (every lab pod is dual-stack here).
				allowed := func(s [2]side) bool {
					return s[0].v != flow.VerdictDenied && s[1].v != flow.VerdictDenied
				}
				if gap := c.src != nil && allowed(c.v4) != allowed(c.v6); r.DualStackGap != gap {
					t.Errorf("DualStackGap = %v, want %v", r.DualStackGap, gap)
				}
			})
		}
	}
	if n := testutil.ToFloat64(a.m.verdicts[policy.Ingress][flow.VerdictDenied]); n != 9 {
		t.Errorf("dualflow_audit_verdicts_total{ingress,denied} = %v, want 9", n)
	}
	if n := testutil.ToFloat64(a.m.gaps); n != 2 {
		t.Errorf("dualflow_audit_dual_stack_gap_connections_total = %v, want 2 (the metrics port, one per family)", n)
	}
	if n, err := testutil.GatherAndCount(reg, "dualflow_audit_verdicts_total"); err != nil || n != 10 {
		t.Errorf("dualflow_audit_verdicts_total has %d series (err %v), want 2 directions x 5 verdicts", n, err)
	}
}

// TestDualStackGapModes: the lab's metrics port is allowed over IPv4 and
// denied over IPv6 between the same two pods. Only in the dual-stack lab
// is that a gap a record can show (single-stack pods have no other
// family), only on a connection's first record, and never for a policy
// set without ipBlocks (selectors decide both families alike).
func TestDualStackGapModes(t *testing.T) {
	for _, mode := range []manifest.Mode{manifest.ModeIPv4, manifest.ModeIPv6, manifest.ModeDual} {
		t.Run(string(mode), func(t *testing.T) {
			m, inv := labInventory(t, mode, 2)
			web1, api2 := labPod(t, m, "frontend", "web", 1), labPod(t, m, "backend", "api", 2)
			a, _ := New(Config{}, inv, nil)
			if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
				t.Fatal(err)
			}
			if !a.Policies().NamesBlocks() {
				t.Fatal("the lab's policies have ipBlocks")
			}
			for _, f := range mode.Families() {
				r := record(t, inv, web1, api2, f, flow.ProtoTCP, 9090)
				later := r
				later.Packets, later.PacketsDelta = 10, 4
				a.Audit(&r)
				a.Audit(&later)
				if want := mode == manifest.ModeDual; r.DualStackGap != want {
					t.Errorf("%s first record: DualStackGap = %v, want %v", f, r.DualStackGap, want)
				}
				if later.DualStackGap {
					t.Errorf("%s later record flagged", f)
				}
				// The same policies without their ipBlock rules: no gap.
				var noBlocks []*networkingv1.NetworkPolicy
				for _, p := range inv.NetworkPolicies {
					if p.Name != manifest.PolicyMetricsIPv4 {
						noBlocks = append(noBlocks, p)
					}
				}
				b, _ := New(Config{}, inv, nil)
				if err := b.SetPolicies(noBlocks); err != nil {
					t.Fatal(err)
				}
				r.DualStackGap = true
				b.Audit(&r)
				if r.DualStackGap {
					t.Errorf("%s: a gap without the ipBlock policy", f)
				}
			}
		})
	}
}

func TestSetPoliciesRecompilesOnChange(t *testing.T) {
	_, inv := labInventory(t, manifest.ModeIPv4, 2)
	a, err := New(Config{}, inv, nil)
	if err != nil {
		t.Fatal(err)
	}
	pols := inv.NetworkPolicies
	if err := a.SetPolicies(pols); err != nil {
		t.Fatal(err)
	}
	first := a.Policies()
	reversed := []*networkingv1.NetworkPolicy{pols[3], pols[2], pols[1], pols[0]}
	if err := a.SetPolicies(reversed); err != nil || a.Policies() != first {
		t.Fatalf("same policies in another order: recompiled (err %v)", err)
	}
	changed := pols[0].DeepCopy()
	changed.Spec.PolicyTypes = append(changed.Spec.PolicyTypes, networkingv1.PolicyTypeEgress)
	if err := a.SetPolicies([]*networkingv1.NetworkPolicy{changed, pols[1], pols[2], pols[3]}); err != nil || a.Policies() == first {
		t.Fatalf("changed spec: not recompiled (err %v)", err)
	}
	bad := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "bad", ResourceVersion: "7"},
		Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{}}}}}}
	err = a.SetPolicies(append([]*networkingv1.NetworkPolicy{bad}, pols...))
	if err == nil || a.Policies().Len() != 4 {
		t.Fatalf("invalid policy: err %v, %d policies; want an error and the 4 valid ones", err, a.Policies().Len())
	}
}

func TestRun(t *testing.T) {
	_, inv := labInventory(t, manifest.ModeIPv6, 1)
	a, err := New(Config{Refresh: 5 * time.Millisecond}, inv, nil)
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	var logs bytes.Buffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- a.Run(ctx, func() []*networkingv1.NetworkPolicy {
			calls.Add(1)
			return append([]*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: "bad"},
				Spec: networkingv1.NetworkPolicySpec{Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{}}}}}}},
				inv.NetworkPolicies...)
		}, nil, newTestLogger(&logs))
	}()
	for calls.Load() < 5 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if a.Policies().Len() != 4 {
		t.Fatalf("%d policies", a.Policies().Len())
	}
	if n := strings.Count(logs.String(), "invalid"); n != 1 {
		t.Fatalf("logged the invalid policy %d times over %d refreshes, want once:\n%s", n, calls.Load(), logs.String())
	}
}

// TestRunFollowsChanges: a change signal refreshes at once, long before
// the next periodic refresh.
func TestRunFollowsChanges(t *testing.T) {
	_, inv := labInventory(t, manifest.ModeDual, 1)
	a, err := New(Config{Refresh: time.Hour}, inv, nil)
	if err != nil {
		t.Fatal(err)
	}
	var pols atomic.Pointer[[]*networkingv1.NetworkPolicy]
	pols.Store(&[]*networkingv1.NetworkPolicy{})
	changed := make(chan struct{}, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- a.Run(ctx, func() []*networkingv1.NetworkPolicy { return *pols.Load() }, changed, nil) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	all := inv.NetworkPolicies
	pols.Store(&all)
	changed <- struct{}{}
	deadline := time.Now().Add(time.Minute)
	for a.Policies() == nil || a.Policies().Len() != len(all) {
		if time.Now().After(deadline) {
			t.Fatalf("the policies did not count within a minute of the change signal (refresh every hour)")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestAuditBatchAllocs(t *testing.T) {
	m, inv := labInventory(t, manifest.ModeDual, 2)
	a, _ := New(Config{}, inv, nil)
	if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
		t.Fatal(err)
	}
	web1, api2 := labPod(t, m, "frontend", "web", 1), labPod(t, m, "backend", "api", 2)
	recs := []flow.Record{
		record(t, inv, web1, api2, corev1.IPv4Protocol, flow.ProtoTCP, 8080),
		record(t, inv, web1, api2, corev1.IPv6Protocol, flow.ProtoTCP, 9090),
		record(t, inv, nil, api2, corev1.IPv6Protocol, flow.ProtoUDP, 5353),
	}
	if n := testing.AllocsPerRun(100, func() { a.AuditBatch(recs) }); n != 0 {
		t.Fatalf("AuditBatch allocates %v times per batch, want 0", n)
	}
}

// BenchmarkAuditBatch: 256 records between varied pods of the 4-node
// lab, with the lab's policies (named: some name their ports) and with the
// same policies naming no port (numbered: no port name is looked up).
func BenchmarkAuditBatch(b *testing.B) {
	m, inv := labInventory(b, manifest.ModeDual, 4)
	var recs []flow.Record
	for i := range 256 {
		src, dst := &m.Pods[i%len(m.Pods)], &m.Pods[(i*7+3)%len(m.Pods)]
		f := corev1.IPv4Protocol
		if i%2 == 1 {
			f = corev1.IPv6Protocol
		}
		recs = append(recs, record(b, inv, src, dst, f, flow.ProtoTCP, []uint16{8080, 9090, 7070, 5353}[i%4]))
	}
	for _, named := range []bool{true, false} {
		pols := inv.NetworkPolicies
		name := "named"
		if !named {
			pols, name = numberedPorts(pols), "numbered"
		}
		b.Run(name, func(b *testing.B) {
			a, _ := New(Config{}, inv, prometheus.NewRegistry())
			if err := a.SetPolicies(pols); err != nil {
				b.Fatal(err)
			}
			if a.Policies().NamesPorts() != named {
				b.Fatalf("NamesPorts() = %v", !named)
			}
			b.ReportAllocs()
			cpu0 := cpuTime()
			for b.Loop() {
				a.AuditBatch(recs)
			}
			b.ReportMetric(float64(b.N*len(recs))/b.Elapsed().Seconds(), "records/s")
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/float64(b.N*len(recs)), "cpu-ns/record")
		})
	}
}

// numberedPorts returns copies of pols whose named ports are numbered
// (any number: the rule's meaning does not matter to a benchmark).
func numberedPorts(pols []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
	var out []*networkingv1.NetworkPolicy
	for _, p := range pols {
		p = p.DeepCopy()
		number := func(ports []networkingv1.NetworkPolicyPort) {
			for i := range ports {
				if pt := ports[i].Port; pt != nil && pt.Type == intstr.String {
					*pt = intstr.FromInt32(8080)
				}
			}
		}
		for i := range p.Spec.Ingress {
			number(p.Spec.Ingress[i].Ports)
		}
		for i := range p.Spec.Egress {
			number(p.Spec.Egress[i].Ports)
		}
		out = append(out, p)
	}
	return out
}

// BenchmarkAuditBatchRuns: a batch of the shape of the collector's
// enriched end-to-end benchmark: one pod pair's connections, 3 in 5 IPv4,
// the rest IPv6.
func BenchmarkAuditBatchRuns(b *testing.B) {
	m, inv := labInventory(b, manifest.ModeDual, 2)
	a, _ := New(Config{}, inv, prometheus.NewRegistry())
	if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
		b.Fatal(err)
	}
	web1, api1 := labPod(b, m, "frontend", "web", 1), labPod(b, m, "backend", "api", 1)
	var recs []flow.Record
	for i := range 40 {
		f := corev1.IPv4Protocol
		if i%5 >= 3 {
			f = corev1.IPv6Protocol
		}
		recs = append(recs, record(b, inv, web1, api1, f, flow.ProtoTCP, 8080))
	}
	b.ReportAllocs()
	for b.Loop() {
		a.AuditBatch(recs)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
}

// TestConcurrentAudit audits from several goroutines while the policies
// change (run with -race).
func TestConcurrentAudit(t *testing.T) {
	m, inv := labInventory(t, manifest.ModeDual, 2)
	a, _ := New(Config{}, inv, prometheus.NewRegistry())
	pols := inv.NetworkPolicies
	if err := a.SetPolicies(pols); err != nil {
		t.Fatal(err)
	}
	web1, api2 := labPod(t, m, "frontend", "web", 1), labPod(t, m, "backend", "api", 2)
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			recs := []flow.Record{
				record(t, inv, web1, api2, corev1.IPv4Protocol, flow.ProtoTCP, 9090),
				record(t, inv, web1, api2, corev1.IPv6Protocol, flow.ProtoTCP, 9090),
			}
			for range 200 {
				a.AuditBatch(recs)
				if v := recs[g%2].Ingress.Verdict; v != flow.VerdictAllowed && v != flow.VerdictDenied {
					t.Errorf("verdict %s", v)
					return
				}
			}
		}()
	}
	for i := range 50 {
		if err := a.SetPolicies(pols[:len(pols)-i%2]); err != nil {
			t.Error(err)
		}
	}
	for range 4 {
		<-done
	}
}

// countingLookup counts the calls that reach the view.
type countingLookup struct {
	Lookup
	ns, ports int
}

func (c *countingLookup) Namespace(name string) (*enrich.Namespace, bool) {
	c.ns++
	return c.Lookup.Namespace(name)
}

func (c *countingLookup) Pod(namespace, name string) (*enrich.Pod, bool) {
	c.ports++
	return c.Lookup.Pod(namespace, name)
}

// TestAuditBatchMemo: AuditBatch, which remembers the last namespaces and
// destination port of a batch, gives every record the verdicts Audit gives
// it alone, on a batch of runs and alternations of pods, ports, protocols
// and both families; and it asks the lookup less often.
func TestAuditBatchMemo(t *testing.T) {
	m, inv := labInventory(t, manifest.ModeDual, 3)
	lk := &countingLookup{Lookup: inv}
	a, _ := New(Config{}, lk, nil)
	if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
		t.Fatal(err)
	}
	var recs []flow.Record
	for i := range 600 {
		src, dst := &m.Pods[(i/7)%len(m.Pods)], &m.Pods[(i/3*5+1)%len(m.Pods)]
		var s, d *corev1.Pod = src, dst
		if i%11 == 0 {
			s = nil // from outside
		}
		f := corev1.IPv4Protocol
		if (i/5)%2 == 1 {
			f = corev1.IPv6Protocol
		}
		proto := []uint8{flow.ProtoTCP, flow.ProtoUDP, flow.ProtoTCP}[i%3]
		recs = append(recs, record(t, inv, s, d, f, proto, []uint16{8080, 9090, 8080, 5353, 7070}[(i/2)%5]))
	}
	want := slices.Clone(recs)
	for i := range want {
		a.Audit(&want[i])
	}
	alone := lk.ns + lk.ports
	lk.ns, lk.ports = 0, 0
	got := slices.Clone(recs)
	a.AuditBatch(got)
	for i := range got {
		if got[i].Ingress != want[i].Ingress || got[i].Egress != want[i].Egress {
			t.Fatalf("record %d: batch %+v %+v, alone %+v %+v", i, got[i].Ingress, got[i].Egress, want[i].Ingress, want[i].Egress)
		}
	}
	if batch := lk.ns + lk.ports; batch >= alone || batch == 0 {
		t.Errorf("batch asked the lookup %d times, records alone %d", batch, alone)
	}
	verdicts := map[flow.Verdict]int{}
	for i := range got {
		verdicts[got[i].Ingress.Verdict]++
	}
	if len(verdicts) < 2 {
		t.Errorf("the batch has one ingress verdict only (%v): not a test of anything", verdicts)
	}
}

// echoLookup answers with the question: a wrong memo hit shows. Its
// pods (by name, or by address for a pod without a name) name their
// ports 80 and 81, TCP and UDP, after the question.
type echoLookup struct{}

func (echoLookup) Namespace(name string) (*enrich.Namespace, bool) {
	return &enrich.Namespace{Name: name, Labels: map[string]string{"name": name}}, name != "unknown"
}

func echoPod(id string) *enrich.Pod {
	p := &enrich.Pod{}
	for _, port := range []int32{80, 81} {
		for _, proto := range []corev1.Protocol{corev1.ProtocolTCP, corev1.ProtocolUDP} {
			p.Ports = append(p.Ports, enrich.ContainerPort{Name: fmt.Sprintf("%s/%d/%s", id, port, proto), Port: port, Protocol: proto})
		}
	}
	return p
}

func (echoLookup) Pod(namespace, name string) (*enrich.Pod, bool) {
	return echoPod(namespace + "/" + name), name != ""
}

func (echoLookup) LookupPod(a netip.Addr, _ time.Time) (*enrich.Pod, bool) {
	return echoPod(a.String()), true
}

// TestMemoTwoNamespaces: a run of flows between pods of two namespaces
// (source and destination asked in turn) looks each namespace up once; a
// third one pushes out the one asked least recently.
func TestMemoTwoNamespaces(t *testing.T) {
	l := &countingLookup{Lookup: echoLookup{}}
	m := memo{lookup: l}
	for range 8 {
		m.namespaceLabels("frontend")
		m.namespaceLabels("backend")
	}
	if l.ns != 2 {
		t.Errorf("%d lookups for a run between two namespaces, want 2", l.ns)
	}
	m.namespaceLabels("other") // pushes out frontend
	m.namespaceLabels("backend")
	m.namespaceLabels("frontend")
	if l.ns != 4 {
		t.Errorf("%d lookups, want 4", l.ns)
	}
}

// TestAuditBatchTwoFlows: a batch whose records alternate between flows
// of different verdicts, in each family, gives every record the verdicts
// Audit gives it alone.
func TestAuditBatchTwoFlows(t *testing.T) {
	m, inv := labInventory(t, manifest.ModeDual, 2)
	a, _ := New(Config{}, inv, nil)
	if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
		t.Fatal(err)
	}
	web1, api2 := labPod(t, m, "frontend", "web", 1), labPod(t, m, "backend", "api", 2)
	for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		flows := []flow.Record{
			record(t, inv, web1, api2, f, flow.ProtoTCP, 8080),
			record(t, inv, nil, api2, f, flow.ProtoTCP, 8080),
			record(t, inv, web1, api2, f, flow.ProtoTCP, 7070),
		}
		want := slices.Clone(flows)
		for i := range want {
			a.Audit(&want[i])
		}
		if want[0].Ingress == want[1].Ingress || want[0].Ingress == want[2].Ingress {
			t.Fatalf("%s: the flows' verdicts do not differ: %+v %+v %+v", f, want[0].Ingress, want[1].Ingress, want[2].Ingress)
		}
		var batch, wantBatch []flow.Record
		for _, i := range []int{0, 1, 0, 1, 1, 0, 2, 0, 2, 1, 0, 1} {
			batch, wantBatch = append(batch, flows[i]), append(wantBatch, want[i])
		}
		a.AuditBatch(batch)
		for i := range batch {
			if batch[i].Ingress != wantBatch[i].Ingress || batch[i].Egress != wantBatch[i].Egress {
				t.Errorf("%s record %d: batch %+v %+v, alone %+v %+v", f, i, batch[i].Ingress, batch[i].Egress, wantBatch[i].Ingress, wantBatch[i].Egress)
			}
		}
	}
}

// TestMemoKeys: every field of a question counts in the memo's key.
func TestMemoKeys(t *testing.T) {
	m := memo{lookup: echoLookup{}}
	byName := PortQuery{Namespace: "a", Pod: "p", Addr: netip.MustParseAddr("198.18.0.1"), Port: 80, Proto: flow.ProtoTCP}
	byAddr := byName
	byAddr.Pod = ""
	qs := []PortQuery{byName, byName}
	for _, change := range []func(*PortQuery){
		func(q *PortQuery) { q.Namespace = "b" },
		func(q *PortQuery) { q.Pod = "q" },
		func(q *PortQuery) { q.Port = 81 },
		func(q *PortQuery) { q.Proto = flow.ProtoUDP },
	} {
		q := byName
		change(&q)
		qs = append(qs, q, q, byName)
	}
	q := byAddr
	q.Addr = netip.MustParseAddr("fd00:10::1")
	qs = append(qs, byAddr, q, q, byAddr)
	for i, q := range qs {
		if got, want := m.portNameOf(&q), portName(echoLookup{}, q); got != want || got == "" {
			t.Errorf("query %d: %q, want %q", i, got, want)
		}
	}
	// Two namespaces are remembered: the ends of flows between two
	// namespaces interleave.
	for _, name := range []string{"x", "x", "y", "x", "y", "unknown", "unknown", "x", "y", "x", "unknown", "y", "unknown"} {
		labels, ok := m.namespaceLabels(name)
		if ok && labels["name"] != name || ok != (name != "unknown") {
			t.Errorf("namespace %s: %v %v", name, labels, ok)
		}
	}
}

// TestAuditFromTheNode: the kubelet's probe of an isolated pod, from the
// pod's own node (an address enrichment attributed to that node), is
// allowed; the same address attributed to another node, or to none, is
// judged by the policies. Both families.
func TestAuditFromTheNode(t *testing.T) {
	m, inv := labInventory(t, manifest.ModeDual, 2)
	api := labPod(t, m, "backend", "api", 1)
	a, err := New(Config{}, inv, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
		t.Fatal(err)
	}
	for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		for _, c := range []struct {
			node string
			want flow.Verdict
		}{{api.Spec.NodeName, flow.VerdictAllowed}, {"some-other-node", flow.VerdictDenied}, {"", flow.VerdictDenied}} {
			// 9999 is no port of api's policies: only the node gets in.
			r := record(t, inv, nil, api, f, flow.ProtoTCP, 9999)
			r.Dst.NodeName = api.Spec.NodeName
			r.Src.NodeName = c.node
			a.Audit(&r)
			if r.Ingress.Verdict != c.want {
				t.Errorf("%s: from node %q to %s:9999: ingress %v by %s/%s, want %v", f, c.node, api.Name, r.Ingress.Verdict, r.Ingress.Namespace, r.Ingress.Name, c.want)
			}
		}
	}
}

// TestExplainLab: the one explanation of a drop, on the lab's policies in
// each IP mode: the dual-stack gap of the metrics port names the IPv4-only
// rule and what it lacks for IPv6; an egress denial is explained from the
// source's side; an allowed flow has none.
func TestExplainLab(t *testing.T) {
	for _, mode := range []manifest.Mode{manifest.ModeIPv4, manifest.ModeIPv6, manifest.ModeDual} {
		t.Run(string(mode), func(t *testing.T) {
			m, inv := labInventory(t, mode, 2)
			web1, api2 := labPod(t, m, "frontend", "web", 1), labPod(t, m, "backend", "api", 2)
			probe1 := labPod(t, m, "tools", "probe", 1)
			a, err := New(Config{}, inv, nil)
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := a.Explain(&flow.Record{}); ok {
				t.Fatal("explained before the policies are known")
			}
			if err := a.SetPolicies(inv.NetworkPolicies); err != nil {
				t.Fatal(err)
			}
			for _, f := range mode.Families() {
				v := "IPv4"
				if f == corev1.IPv6Protocol {
					v = "IPv6"
				}
				metrics := record(t, inv, web1, api2, f, flow.ProtoTCP, 9090)
				d, ok := a.Explain(&metrics)
				if f == corev1.IPv4Protocol {
					if ok {
						t.Errorf("IPv4 metrics are allowed, explained: %+v", d)
					}
				} else {
					want := "ingress denied by backend/" + manifest.PolicyDefaultDeny + ", which isolates backend/" + api2.Name +
						": no ingress rule of backend/" + manifest.PolicyMetricsIPv4 + ", backend/" + manifest.PolicyAllowWeb +
						" allows IPv6 TCP/9090 (metrics) from frontend/" + web1.Name + "; nearest: backend/" + manifest.PolicyMetricsIPv4 +
						" rule 0 matches 9090/TCP but has no IPv6 ipBlock"
					if !ok || d.Text != want || d.Policy != "backend/"+manifest.PolicyDefaultDeny || d.Direction != policy.Ingress {
						t.Errorf("IPv6 metrics: %v %+v\nwant %s", ok, d, want)
					}
				}
				out := record(t, inv, probe1, web1, f, flow.ProtoTCP, 8080)
				d, ok = a.Explain(&out)
				if want := "egress denied by tools/" + manifest.PolicyToolsEgress + ", which isolates tools/" + probe1.Name + ": no egress rule of tools/" +
					manifest.PolicyToolsEgress + " allows " + v + " TCP/8080 (http) to frontend/" + web1.Name + "; nearest: tools/" + manifest.PolicyToolsEgress + " rule 0 matches 8080/TCP but its namespaceSelector does not select namespace frontend"; !ok || d.Direction != policy.Egress || !strings.HasPrefix(d.Text, want) {
					t.Errorf("tools to web %s: %v %+v\nwant %s…", v, ok, d, want)
				}
			}
		})
	}
}

// cpuTime is the process's CPU time (user and system): a benchmark's
// figure that other processes on the machine do not inflate.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
