package enrich

import (
	"context"
	"fmt"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/dualflow/dualflow/flow"
)

// The benchmark cluster: 800 dual-stack nodes in 3 zones, 100k pods (10k
// Deployments of 10 replicas, 125 per node), 20k dual-stack Services of
// which the first 10k select a Deployment (one EndpointSlice per family,
// 10 endpoints each). IPv4 fills the lab range 198.18.0.0/15: a /25 of
// pods per node from 198.18.0.0, Services from 198.19.144.0, nodes from
// 198.19.224.0.
const (
	benchNodes       = 800
	benchDeployments = 10000
	benchReplicas    = 10
	benchPods        = benchDeployments * benchReplicas
	benchServices    = 20000
)

func benchNodeName(n int) string { return fmt.Sprintf("node-%04d", n) }

// benchPodAddr returns pod j's address in family 4 or 6: the k-th pod
// of node n lives in node n's pod CIDR.
func benchPodAddr(j int, v6 bool) netip.Addr {
	n, k := j%benchNodes, j/benchNodes+1
	if v6 {
		return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0, byte(n >> 8), byte(n), 15: byte(k)})
	}
	return addr4(198<<24 | 18<<16 + uint32(n)*128 + uint32(k))
}

// addr4 is the IPv4 address of a 32-bit number.
func addr4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func benchSvcAddr(s int, v6 bool) netip.Addr {
	if v6 {
		return netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0x96, 14: byte(s >> 8), 15: byte(s)})
	}
	return addr4(198<<24 | 19<<16 | 144<<8 + uint32(s))
}

// benchPod is a realistic pod as the API server sends it (status,
// conditions, resources, managed fields), before the transform trims it.
func benchPod(j int) *corev1.Pod {
	d := j % benchDeployments
	hash := fmt.Sprintf("%010x", d*7919)
	rs := fmt.Sprintf("app-%05d-%s", d, hash)
	ns := fmt.Sprintf("team-%03d", d%300)
	name := fmt.Sprintf("%s-%05x", rs, j)
	a4, a6 := benchPodAddr(j, false), benchPodAddr(j, true)
	node := benchNodeName(j % benchNodes)
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns, UID: uid("pod", ns, name), ResourceVersion: fmt.Sprint(100000 + j),
			GenerateName: rs + "-", CreationTimestamp: created,
			Labels:          map[string]string{"app": fmt.Sprintf("app-%05d", d), "pod-template-hash": hash, "team": ns, "version": "v1"},
			Annotations:     map[string]string{"kubectl.kubernetes.io/restartedAt": "2026-02-01T00:00:00Z", "prometheus.io/scrape": "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: rs, UID: uid("rs", ns, rs), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager", Operation: "Update", APIVersion: "v1", FieldsType: "FieldsV1"}, {Manager: "kubelet", Operation: "Update", APIVersion: "v1", Subresource: "status"}},
		},
		Spec: corev1.PodSpec{
			NodeName: node, ServiceAccountName: "default", RestartPolicy: corev1.RestartPolicyAlways,
			Containers: []corev1.Container{{
				Name: "app", Image: "registry.example/app:1.2.3",
				Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}, {Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP}},
				Env:   []corev1.EnvVar{{Name: "MODE", Value: "prod"}},
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")}},
			}},
			Tolerations: []corev1.Toleration{{Key: "node.kubernetes.io/not-ready", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
		},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: a4.String(), PodIPs: []corev1.PodIP{{IP: a4.String()}, {IP: a6.String()}},
			HostIP: addr4(198<<24 | 19<<16 | 224<<8 + uint32(j%benchNodes)).String(), StartTime: &created,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}, {Type: corev1.ContainersReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{{Name: "app", Ready: true, Image: "registry.example/app:1.2.3", ImageID: "sha256:0123456789abcdef",
				ContainerID: fmt.Sprintf("containerd://%064x", j), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: created}}}},
		},
	}
	return p
}

func benchNode(n int) *corev1.Node {
	a4, a6 := addr4(198<<24|19<<16|224<<8+uint32(n)), netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, 0xff, 14: byte(n >> 8), 15: byte(n)})
	c4 := netip.PrefixFrom(benchPodAddr(n, false), 25).Masked()
	c6 := netip.PrefixFrom(benchPodAddr(n, true), 64).Masked()
	return mkNode(benchNodeName(n), fmt.Sprintf("zone-%c", 'a'+n%3), []string{a4.String(), a6.String()}, c4.String(), c6.String())
}

func benchService(s int) *corev1.Service {
	return mkService(fmt.Sprintf("team-%03d", s%300), fmt.Sprintf("svc-%05d", s), corev1.IPFamilyPolicyPreferDualStack,
		benchSvcAddr(s, false).String(), benchSvcAddr(s, true).String())
}

// benchIndex builds the benchmark cluster's index once.
var benchIndex = sync.OnceValue(func() *Enricher {
	e, err := NewForClient(testConfig(), nil, nil, discard())
	if err != nil {
		panic(err)
	}
	x, tr := e.x, e.tr
	for n := range benchNodes {
		x.setNode(tr.node(benchNode(n)))
	}
	for j := range benchPods {
		x.setPod(tr.pod(benchPod(j)))
	}
	for d := range benchDeployments {
		ns := fmt.Sprintf("team-%03d", d%300)
		rs := fmt.Sprintf("app-%05d-%010x", d, d*7919)
		x.setOwner(tr.owner(KindReplicaSet, &mkRS(ns, rs, fmt.Sprintf("app-%05d", d)).ObjectMeta))
	}
	for s := range benchServices {
		svc := benchService(s)
		x.setService(tr.service(svc))
		if s >= benchDeployments {
			continue
		}
		for _, v6 := range []bool{false, true} {
			var eps []ep
			for r := range benchReplicas {
				j := s + r*benchDeployments // the pods of Deployment s
				eps = append(eps, ep{benchPodAddr(j, v6).String(), benchNodeName(j % benchNodes), "", ""})
			}
			x.setEndpointSlice(tr.endpointSlice(mkSlice(svc.Namespace, fmt.Sprintf("%s-%v", svc.Name, v6), svc.Name, eps...)))
		}
	}
	return e
})

// benchRecords returns n records of a kind, over random-ish pods.
func benchRecords(kind string, v6 bool, n int) []flow.Record {
	recs := make([]flow.Record, n)
	start := time.Now().Add(-time.Second)
	for i := range recs {
		j := (i * 7919) % benchPods
		k := (i*104729 + 17) % benchPods
		r := flow.Record{SrcAddr: benchPodAddr(j, v6), DstAddr: benchPodAddr(k, v6), Proto: flow.ProtoTCP,
			SrcPort: 40000, DstPort: 8080, FlowStart: start, FlowEnd: start.Add(time.Second)}
		switch kind {
		case "service":
			s := k % benchDeployments
			r.ServiceAddr, r.ServicePort = benchSvcAddr(s, v6), 80
		case "external":
			r.DstAddr = netip.MustParseAddr("198.19.252.8")
			if v6 {
				r.DstAddr = netip.MustParseAddr("fd00:10:4860::8888")
			}
		}
		r.Normalize()
		recs[i] = r
	}
	return recs
}

// BenchmarkEnrich: one record per op against 100k pods and 20k Services.
func BenchmarkEnrich(b *testing.B) {
	e := benchIndex()
	for _, kind := range []string{"pod-to-pod", "service", "external"} {
		for _, v6 := range []bool{false, true} {
			fam := "ipv4"
			if v6 {
				fam = "ipv6"
			}
			recs := benchRecords(kind, v6, 4096)
			b.Run(kind+"/"+fam, func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					r := &recs[i&4095]
					r.Src, r.Dst, r.Service = flow.Endpoint{}, flow.Endpoint{}, flow.Service{}
					e.enrichOne(r)
					i++
				}
				if recs[0].Src.PodName == "" {
					b.Fatal("not enriched")
				}
			})
		}
	}
	// The same over 64 records: the index entries they touch stay in the
	// CPU cache, which shows the cost of the lookup code itself (the
	// 4096-record runs above are dominated by cache misses, the worst case
	// of flows spread over the whole cluster).
	hot := benchRecords("service", true, 64)
	b.Run("service/ipv6/cached", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			e.enrichOne(&hot[i&63])
			i++
		}
	})
	recs := benchRecords("service", true, 1024)
	b.Run("batch-1024/ipv6", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			e.Enrich(recs)
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(recs)), "ns/record")
	})
	b.Run("parallel/ipv6", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			rs := benchRecords("service", true, 256)
			i := 0
			for pb.Next() {
				e.enrichOne(&rs[i&255])
				i++
			}
		})
	})
}

// BenchmarkNodesForIPs: one address a call (ipv4, ipv6: the lock and the
// clock read paid per address, as the correlator did before it asked for a
// batch's addresses at once), and 128 a call (batch-128: a batch of 64
// records' sources and destinations), in ns per address.
func BenchmarkNodesForIPs(b *testing.B) {
	e := benchIndex()
	for _, n := range []int{1, 128} {
		for _, v6 := range []bool{false, true} {
			name := "ipv4"
			if v6 {
				name = "ipv6"
			}
			if n > 1 {
				name = "batch-" + strconv.Itoa(n) + "/" + name
			}
			b.Run(name, func(b *testing.B) {
				addrs, nodes := make([]netip.Addr, n), make([]string, n)
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					for j := range addrs {
						addrs[j] = benchPodAddr(i%benchPods, v6)
						i++
					}
					e.NodesForIPs(addrs, nodes)
					if nodes[n-1] == "" {
						b.Fatal("no node")
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(i), "ns/addr")
			})
		}
	}
}

// BenchmarkIndexMemory measures the heap held per pod once 100k pods are
// listed by a shared informer (the factory's pod informer: a namespace
// index, the transform, the enrichment's handler): the informer's store
// plus the address histories. "untrimmed" is the same informer storing
// the API objects as they come, without transform or index, for scale.
func BenchmarkIndexMemory(b *testing.B) {
	pods := make([]corev1.Pod, benchPods)
	for j := range pods {
		pods[j] = *benchPod(j)
	}
	for _, trimmed := range []bool{true, false} {
		name := "untrimmed-informer-store"
		if trimmed {
			name = "trimmed-and-indexed"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			var perPod float64
			for b.Loop() {
				perPod = measurePodInformer(b, pods, trimmed)
			}
			b.ReportMetric(perPod, "bytes/pod")
		})
	}
}

// measurePodInformer lists pods through a shared informer and returns the
// heap growth per pod, with the informer still referenced.
func measurePodInformer(b *testing.B, pods []corev1.Pod, trimmed bool) float64 {
	lw := &cache.ListWatch{
		ListWithContextFunc: func(context.Context, metav1.ListOptions) (k8sruntime.Object, error) {
			l := &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: make([]corev1.Pod, len(pods))}
			for i := range pods {
				pods[i].DeepCopyInto(&l.Items[i]) // as decoded from the wire
			}
			return l, nil
		},
		WatchFuncWithContext: func(context.Context, metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil },
	}
	before := heap()
	var e *Enricher
	inf := cache.NewSharedIndexInformer(listOnly{lw}, &corev1.Pod{}, 0, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if trimmed {
		var err error
		if e, err = NewForClient(testConfig(), nil, nil, discard()); err != nil {
			b.Fatal(err)
		}
		inf.SetTransform(e.tr.transform)
		inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(o any) { e.x.setPod((*Pod)(o.(*podObj))) }})
	}
	ctx, cancel := context.WithCancel(context.Background())
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		b.Fatal("no sync")
	}
	if trimmed {
		for {
			e.x.mu.RLock()
			n := len(e.x.pods)
			e.x.mu.RUnlock()
			if n == len(pods) {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	b.StopTimer()
	after := heap()
	b.StartTimer()
	if got := len(inf.GetStore().ListKeys()); got != len(pods) {
		b.Fatalf("%d pods stored", got)
	}
	runtime.KeepAlive(e)
	cancel()
	return float64(after-before) / float64(len(pods))
}

// listOnly tells the reflector to list, not to stream the initial state
// through a watch (which the fake watch would never end).
type listOnly struct{ *cache.ListWatch }

func (listOnly) IsWatchListSemanticsUnSupported() bool { return true }

func heap() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// BenchmarkSnapshot takes the cluster view that the audit, the
// reachability matrix, the catalog and traceflow read (Collector.Cluster takes it at
// most once a second while the cluster changes) from the 100k-pod index.
func BenchmarkSnapshot(b *testing.B) {
	e := benchIndex()
	b.ReportAllocs()
	var s *Snapshot
	for b.Loop() {
		s = e.Snapshot()
	}
	if len(s.Pods) != benchPods || len(s.Workloads) != benchPods {
		b.Fatalf("snapshot of %d pods, want %d", len(s.Pods), benchPods)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/benchPods, "ns/pod")
}
