package recommend

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/dualflow/dualflow/collector/audit"
	"github.com/dualflow/dualflow/collector/enrich"
	"github.com/dualflow/dualflow/flow"
)

// volatileLabels change from pod to pod of one workload, or from one
// rollout to the next: a selector never uses them.
var volatileLabels = []string{
	"pod-template-hash",                        // Deployment → ReplicaSet
	"controller-revision-hash",                 // StatefulSet, DaemonSet
	"pod-template-generation",                  // DaemonSet
	"statefulset.kubernetes.io/pod-name",       // one pod
	"apps.kubernetes.io/pod-index",             // one pod
	"controller-uid",                           // Job (old)
	"batch.kubernetes.io/controller-uid",       // Job
	"batch.kubernetes.io/job-completion-index", // one pod of an indexed Job
	// Placement, copied from the node by some setups: not what the pod is.
	corev1.LabelTopologyZone,
	corev1.LabelTopologyRegion,
}

// cronJobLabels name the Job of one run of a CronJob.
var cronJobLabels = []string{"job-name", "batch.kubernetes.io/job-name"}

// workload is the pods of one workload in the cluster view.
type workload struct {
	ns   string
	w    enrich.Workload
	pods []*enrich.Pod
	// labels are the labels every pod of the workload has, volatile ones
	// left out: its selector.
	labels map[string]string
	// host: every pod is on the host network (policies do not apply).
	host bool
	// others are the workloads of the namespace whose pods the
	// selector also selects.
	others []string
}

func (w *workload) String() string { return w.w.Kind + " " + w.ns + "/" + w.w.Name }

// ref is the workload as the audit names it.
func (w *workload) ref() string { return w.ns + "/" + w.w.Name }

type wkey struct {
	ns, kind, name string
}

// cluster indexes the view for the recommender.
type cluster struct {
	view      *enrich.Snapshot
	workloads map[wkey]*workload
	byPod     map[*enrich.Pod]*workload
	nodes     map[string]*enrich.Node
	nodeAddr  map[netip.Addr]*enrich.Node
	svcAddr   map[netip.Addr]*enrich.Service
	// families are the families of the cluster's pods.
	families [2]bool
}

func newCluster(view *enrich.Snapshot) *cluster {
	c := &cluster{view: view, workloads: map[wkey]*workload{}, byPod: map[*enrich.Pod]*workload{},
		nodes: map[string]*enrich.Node{}, nodeAddr: map[netip.Addr]*enrich.Node{}, svcAddr: map[netip.Addr]*enrich.Service{}}
	var order []*workload
	for _, p := range view.Pods {
		w := view.Workload(p)
		k := wkey{p.Namespace, w.Kind, w.Name}
		wl := c.workloads[k]
		if wl == nil {
			wl = &workload{ns: p.Namespace, w: w, host: true}
			c.workloads[k] = wl
			order = append(order, wl)
		}
		wl.pods = append(wl.pods, p)
		wl.host = wl.host && p.HostNetwork
		c.byPod[p] = wl
		if !p.HostNetwork {
			for _, a := range p.Addrs {
				c.families[fi(flow.Version(a))] = true
			}
		}
	}
	for _, wl := range order {
		wl.labels = stableLabels(wl)
	}
	// A selector that also selects pods of another workload of its
	// namespace is said so.
	for _, wl := range order {
		if len(wl.labels) == 0 {
			continue
		}
		sel := labels.SelectorFromSet(wl.labels)
		for _, o := range order {
			if o == wl || o.ns != wl.ns || o.host {
				continue
			}
			if slices.ContainsFunc(o.pods, func(p *enrich.Pod) bool { return !p.HostNetwork && sel.Matches(labels.Set(p.Labels)) }) {
				wl.others = append(wl.others, o.String())
			}
		}
	}
	for _, n := range view.Nodes {
		c.nodes[n.Name] = n
		for _, a := range append(slices.Clone(n.InternalIPs), n.ExternalIPs...) {
			if _, dup := c.nodeAddr[a.Unmap()]; !dup {
				c.nodeAddr[a.Unmap()] = n
			}
		}
	}
	for _, s := range view.Services {
		for _, a := range s.ClusterIPs {
			c.svcAddr[a.Unmap()] = s
		}
	}
	return c
}

// fi is the index of family v (4 or 6) in a [2] array.
func fi(v uint8) int {
	if v == 6 {
		return 1
	}
	return 0
}

// stableLabels are the labels every pod of wl has with the same value,
// less the volatile ones.
func stableLabels(wl *workload) map[string]string {
	var out map[string]string
	for _, p := range wl.pods {
		if out == nil {
			out = map[string]string{}
			for k, v := range p.Labels {
				out[k] = v
			}
			continue
		}
		for k, v := range out {
			if pv, ok := p.Labels[k]; !ok || pv != v {
				delete(out, k)
			}
		}
	}
	for _, k := range volatileLabels {
		delete(out, k)
	}
	if wl.w.Kind == enrich.KindCronJob {
		for _, k := range cronJobLabels {
			delete(out, k)
		}
	}
	return out
}

// endKind is what one end of an observed flow is.
type endKind uint8

const (
	endUnknown  endKind = iota // a pod that is gone with its workload
	endPod                     // a pod off the host network
	endNode                    // a node, or a host-network pod
	endExternal                // an address outside the cluster
)

// end is one end of an observed flow, resolved on the view.
type end struct {
	kind endKind
	addr netip.Addr
	pod  *enrich.Pod // endPod: the pod (nil: gone, wl still known)
	wl   *workload   // endPod
	node *enrich.Node
	// svc is the Service whose ClusterIP the address is (a destination
	// recorded before DNAT).
	svc  *enrich.Service
	name string // what comments call it
}

// resolve resolves an end as enrichment recorded it.
func (c *cluster) resolve(e audit.FlowEnd) end {
	a, _ := netip.ParseAddr(e.IP)
	a = a.Unmap()
	out := end{addr: a}
	var p *enrich.Pod
	if e.Namespace != "" && e.Pod != "" {
		p, _ = c.view.Pod(e.Namespace, e.Pod)
	}
	if p == nil && e.Namespace == "" && a.IsValid() {
		p, _ = c.view.LookupPod(a, time.Time{})
	}
	if e.WorkloadKind == "Node" && c.nodes[e.WorkloadName] != nil {
		// Enrichment names a host-network end by its node.
		out.kind, out.node, out.name = endNode, c.nodes[e.WorkloadName], "node "+e.WorkloadName
		return out
	}
	switch {
	case p != nil && p.HostNetwork:
		out.kind, out.node = endNode, c.nodes[p.NodeName]
		out.name = "host-network pod " + p.Namespace + "/" + p.Name
		if out.node == nil {
			out.kind = endExternal
		}
		return out
	case p != nil:
		out.kind, out.pod, out.wl = endPod, p, c.byPod[p]
		out.name = out.wl.String()
		return out
	case e.Namespace != "":
		// The pod is gone: its workload may still have pods.
		if wl := c.workloads[wkey{e.Namespace, e.WorkloadKind, e.WorkloadName}]; wl != nil && !wl.host {
			out.kind, out.wl, out.name = endPod, wl, wl.String()
			return out
		}
		out.kind, out.name = endUnknown, "pod "+e.Namespace+"/"+e.Pod+" (gone, and no pod of its workload is left)"
		return out
	}
	if n := c.nodeAddr[a]; n != nil {
		out.kind, out.node, out.name = endNode, n, "node "+n.Name
		return out
	}
	if s := c.svcAddr[a]; s != nil {
		out.svc = s
	}
	if n := c.podNetNode(a); n != nil && out.svc == nil {
		// In a node's pod CIDR but no pod's: the node itself, through
		// its pods' gateway (kubelet probes on a bridge CNI).
		out.kind, out.node, out.name = endNode, n, "node "+n.Name+" (its pods' gateway "+a.String()+")"
		return out
	}
	out.kind, out.name = endExternal, a.String()
	return out
}

// podNetNode returns the node whose pod CIDR holds a, nil if none.
func (c *cluster) podNetNode(a netip.Addr) *enrich.Node {
	if !a.IsValid() {
		return nil
	}
	for _, n := range c.view.Nodes {
		for _, p := range n.PodCIDRs {
			if p.Contains(a) {
				return n
			}
		}
	}
	return nil
}

// backends is the workload a flow addressed to Service svc reached:
// the destination pod's. When svc's selector selects the destination's
// pods (in the Service's namespace), the rule names the backends by the
// selector.
func backendSelector(svc *enrich.Service, dst end) (map[string]string, bool) {
	if svc == nil || svc.Selector == nil || dst.kind != endPod || dst.wl.ns != svc.Namespace {
		return nil, false
	}
	sel := labels.SelectorFromSet(svc.Selector)
	for _, p := range dst.wl.pods {
		if !sel.Matches(labels.Set(p.Labels)) {
			return nil, false
		}
	}
	return svc.Selector, true
}

// portName is the name the destination gives port/proto: the pod's
// (any pod of its workload's when the pod is gone), "" when unnamed.
func (e end) portName(port uint16, proto uint8) string {
	if e.pod != nil {
		return e.pod.PortName(port, proto)
	}
	if e.wl != nil && len(e.wl.pods) > 0 {
		return e.wl.pods[0].PortName(port, proto)
	}
	return ""
}

// addrsOf returns the addresses of node n, every family, unmapped and
// sorted IPv6 first.
func addrsOf(n *enrich.Node) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.InternalIPs {
		if a = a.Unmap(); !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, cmpAddr)
	return out
}

// cmpAddr orders addresses IPv6 first, then by value.
func cmpAddr(a, b netip.Addr) int {
	return cmp.Or(cmp.Compare(fi(flow.Version(b)), fi(flow.Version(a))), a.Compare(b))
}

// nsName is the namespace selector of namespace ns.
func nsSelector(ns string) map[string]string {
	return map[string]string{corev1.LabelMetadataName: ns}
}

// familiesText is "IPv4", "IPv6" or "IPv4 and IPv6".
func familiesText(f [2]bool) string {
	var s []string
	if f[0] {
		s = append(s, "IPv4")
	}
	if f[1] {
		s = append(s, "IPv6")
	}
	return strings.Join(s, " and ")
}
