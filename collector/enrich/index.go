package enrich

import (
	"cmp"
	"net/netip"
	"slices"
	"sync"
	"time"
	"unique"

	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/dualflow/dualflow/collector/audit/policy"
)

// index is the enrichment state: the live objects by name, and the
// time-aware address histories derived from them. Informer event handlers
// call its set/remove methods (under mu); lookups read under mu.RLock.
//
// Every derived entry is a function of one object's state and the time of
// its events; joins between kinds (pod → node zone, pod → ReplicaSet →
// Deployment, endpoint → Service) are made at lookup time. That is what
// makes the result independent of the order in which events of different
// objects arrive.
type index struct {
	mu    sync.RWMutex
	now   func() time.Time
	grace int64 // ns; 0 drops ended claims at once
	ipv6  bool

	// serviceCIDRs and clusterCIDRs come from the configuration: addresses
	// inside them are in the cluster even when no object names them.
	serviceCIDRs, clusterCIDRs []netip.Prefix

	pods    map[nsName]*Pod
	podIPs  history[netip.Addr, *Pod]      // non-host-network pods
	hostIPs history[netip.Addr, nodeClaim] // node addresses and host-network pods' addresses

	nodes    map[string]*Node
	zones    map[string]string // node → zone; kept after a node is deleted (names are few)
	podCIDRs history[netip.Prefix, nodeClaim]
	cidrLens map[cidrLen]int // prefix lengths in use, with counts
	lens     [2][]int        // distinct prefix lengths per family (0: IPv4, 1: IPv6), longest first

	services  map[nsName]*Service
	svcIPs    history[netip.Addr, *Service] // cluster, external and load-balancer IPs
	nodePorts map[portKey][]*Service

	slices      map[nsName]*EndpointSlice
	slicesBySvc map[nsName]map[string]*EndpointSlice
	epIPs       history[netip.Addr, *Endpoint]

	namespaces map[string]*Namespace
	// owners is keyed by the interned (kind, namespace, name) that pods
	// hold too: a lookup hashes and compares a pointer, not strings.
	owners   map[unique.Handle[ownerKey]]ownerEntry
	policies map[string][]*networkingv1.NetworkPolicy // per namespace, sorted by name; replaced on change
	// policiesChanged receives (without blocking; capacity 1) when a
	// NetworkPolicy was added, changed or removed.
	policiesChanged chan struct{}
}

type nsName struct{ ns, name string }

// ownerEntry is what the index keeps of an owner (the map's key names
// it). A lookup copies the entry twice, 16 bytes at a time: the whole
// owner, 120 bytes, ended in an overlapping copy, whose load the CPU does
// not forward from the two stores it spans (0.54 s of the 6.0 s of
// enrichment and audit in the end-to-end benchmark's CPU profile, on one
// instruction of workload); these 64 bytes copy in four whole pieces.
type ownerEntry struct {
	controller Workload // Kind "" when it has no controller
	uid        types.UID
	rv         string
}

type ownerKey struct{ kind, ns, name string }

type portKey struct {
	proto uint8
	port  uint16
}

type cidrLen struct {
	v6   bool
	bits int
}

// nodeClaim is a node address (or pod CIDR) held by a Node, or by a
// host-network pod on behalf of its node.
type nodeClaim struct {
	node string
	id   string // UID of the Node or of the pod
}

func (c nodeClaim) claimID() string  { return c.id }
func (p *Pod) claimID() string       { return string(p.UID) }
func (s *Service) claimID() string   { return string(s.UID) }
func (e *Endpoint) claimID() string  { return string(e.Slice.UID) }
func (p *Pod) key() nsName           { return nsName{p.Namespace, p.Name} }
func (s *Service) key() nsName       { return nsName{s.Namespace, s.Name} }
func (s *EndpointSlice) key() nsName { return nsName{s.Namespace, s.Name} }

func newIndex(now func() time.Time, grace time.Duration, ipv6 bool) *index {
	return &index{
		now:         now,
		grace:       int64(grace),
		ipv6:        ipv6,
		pods:        map[nsName]*Pod{},
		podIPs:      newHistory[netip.Addr, *Pod](),
		hostIPs:     newHistory[netip.Addr, nodeClaim](),
		nodes:       map[string]*Node{},
		zones:       map[string]string{},
		podCIDRs:    newHistory[netip.Prefix, nodeClaim](),
		cidrLens:    map[cidrLen]int{},
		services:    map[nsName]*Service{},
		svcIPs:      newHistory[netip.Addr, *Service](),
		nodePorts:   map[portKey][]*Service{},
		slices:      map[nsName]*EndpointSlice{},
		slicesBySvc: map[nsName]map[string]*EndpointSlice{},
		epIPs:       newHistory[netip.Addr, *Endpoint](),
		namespaces:  map[string]*Namespace{},
		owners:      map[unique.Handle[ownerKey]]ownerEntry{},
		policies:    map[string][]*networkingv1.NetworkPolicy{},

		policiesChanged: make(chan struct{}, 1),
	}
}

// set applies a transformed object (an informer's add or update);
// other values are ignored.
func (x *index) set(o any) {
	switch v := o.(type) {
	case *podObj:
		x.setPod((*Pod)(v))
	case *serviceObj:
		x.setService((*Service)(v))
	case *sliceObj:
		x.setEndpointSlice((*EndpointSlice)(v))
	case *nodeObj:
		x.setNode((*Node)(v))
	case *namespaceObj:
		x.setNamespace((*Namespace)(v))
	case *ownerObj:
		x.setOwner((*owner)(v))
	case *networkingv1.NetworkPolicy:
		x.setPolicy(v)
	}
}

// remove applies a transformed object's deletion.
func (x *index) remove(o any) {
	switch v := o.(type) {
	case *podObj:
		x.removePod((*Pod)(v))
	case *serviceObj:
		x.removeService((*Service)(v))
	case *sliceObj:
		x.removeEndpointSlice((*EndpointSlice)(v))
	case *nodeObj:
		x.removeNode((*Node)(v))
	case *namespaceObj:
		x.removeNamespace((*Namespace)(v))
	case *ownerObj:
		x.removeOwner((*owner)(v))
	case *networkingv1.NetworkPolicy:
		x.removePolicy(v)
	}
}

func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// moveClaims moves claimant id's active claims from the keys in oldKeys
// to those in newKeys: kept keys get the new value, new keys a claim from
// from, dropped keys end at until. newVal returns the value for a key.
func moveClaims[K comparable, V claimer](x *index, h *history[K, V], id string, oldKeys, newKeys []K, newVal func(i int) V, from, until int64) {
	now := x.now().UnixNano()
	for i, k := range newKeys {
		if slices.Contains(oldKeys, k) && h.replace(k, newVal(i)) {
			continue
		}
		h.add(k, newVal(i), from)
	}
	for _, k := range oldKeys {
		if !slices.Contains(newKeys, k) {
			h.end(k, id, until, now, x.grace > 0)
		}
	}
}

// fromFor is the start of claims an object makes: its creation for an
// object seen for the first time (it has held them since about then),
// now for addresses an update adds.
func (x *index) fromFor(created time.Time, isNew bool) int64 {
	if isNew {
		return unixNano(created)
	}
	return x.now().UnixNano()
}

// podKeys returns the addresses p holds: none once it terminated.
func podKeys(p *Pod) []netip.Addr {
	if p == nil || p.Terminated {
		return nil
	}
	return allAddrs(p)
}

// allAddrs is p's addresses, the hidden IPv6 ones included.
func allAddrs(p *Pod) []netip.Addr {
	if len(p.hidden6) == 0 {
		return p.Addrs
	}
	return slices.Concat(p.Addrs, p.hidden6)
}

func (x *index) setPod(p *Pod) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.pods[p.key()]
	if old != nil && old.UID != p.UID {
		x.removePodLocked(old)
		old = nil
	}
	x.pods[p.key()] = p
	from := x.fromFor(p.Created, old == nil)
	until := x.now().UnixNano()
	if p.Terminated && p.finished > 0 && p.finished < until {
		until = p.finished
	}
	var oldPod, oldHost []netip.Addr
	if old != nil && old.HostNetwork {
		oldHost = podKeys(old)
	} else {
		oldPod = podKeys(old)
	}
	var newPod, newHost []netip.Addr
	if p.HostNetwork {
		newHost = podKeys(p)
	} else {
		newPod = podKeys(p)
	}
	id := string(p.UID)
	nc := nodeClaim{node: p.NodeName, id: id}
	if old == nil && p.Terminated && p.finished > from && x.grace > 0 && x.now().UnixNano()-p.finished < x.grace {
		// First seen after it finished (a Job's pod, at start): it held
		// its addresses until then, and late records may still come.
		newPod, newHost = allAddrs(p), nil
		if p.HostNetwork {
			newPod, newHost = nil, allAddrs(p)
		}
		moveClaims(x, &x.podIPs, id, nil, newPod, func(int) *Pod { return p }, from, until)
		moveClaims(x, &x.hostIPs, id, nil, newHost, func(int) nodeClaim { return nc }, from, until)
		oldPod, oldHost, newPod, newHost = newPod, newHost, nil, nil
	}
	moveClaims(x, &x.podIPs, id, oldPod, newPod, func(int) *Pod { return p }, from, until)
	moveClaims(x, &x.hostIPs, id, oldHost, newHost, func(int) nodeClaim { return nc }, from, until)
}

func (x *index) removePod(p *Pod) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if cur := x.pods[p.key()]; cur != nil && cur.UID == p.UID {
		x.removePodLocked(cur)
	}
}

func (x *index) removePodLocked(p *Pod) {
	delete(x.pods, p.key())
	if p.HostNetwork {
		endAll(x, &x.hostIPs, string(p.UID), podKeys(p))
	} else {
		endAll(x, &x.podIPs, string(p.UID), podKeys(p))
	}
}

func endAll[K comparable, V claimer](x *index, h *history[K, V], id string, keys []K) {
	now := x.now().UnixNano()
	for _, k := range keys {
		h.end(k, id, now, now, x.grace > 0)
	}
}

// serviceKeys returns every address that reaches s: cluster IPs, external
// IPs and load-balancer IPs.
func serviceKeys(s *Service) []netip.Addr {
	if s == nil {
		return nil
	}
	out := slices.Clone(s.ClusterIPs)
	for _, a := range slices.Concat(s.ExternalIPs, s.LoadBalancerIPs) {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

func (x *index) setService(s *Service) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.services[s.key()]
	if old != nil && old.UID != s.UID {
		x.removeServiceLocked(old)
		old = nil
	}
	x.services[s.key()] = s
	now := x.now().UnixNano()
	moveClaims(x, &x.svcIPs, string(s.UID), serviceKeys(old), serviceKeys(s), func(int) *Service { return s }, x.fromFor(s.Created, old == nil), now)
	x.setNodePorts(old, s)
}

func (x *index) removeService(s *Service) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if cur := x.services[s.key()]; cur != nil && cur.UID == s.UID {
		x.removeServiceLocked(cur)
	}
}

func (x *index) removeServiceLocked(s *Service) {
	delete(x.services, s.key())
	endAll(x, &x.svcIPs, string(s.UID), serviceKeys(s))
	x.setNodePorts(s, nil)
}

// setNodePorts replaces old's node ports with s's (either may be nil).
// Node ports are live only: a NodePort flow names a node address, which
// the host history keeps.
func (x *index) setNodePorts(old, s *Service) {
	if old != nil {
		for _, p := range old.Ports {
			if p.NodePort == 0 {
				continue
			}
			k := portKey{policy.ProtoNumber(&p.Protocol), uint16(p.NodePort)}
			l := slices.DeleteFunc(x.nodePorts[k], func(v *Service) bool { return v.UID == old.UID })
			if len(l) == 0 {
				delete(x.nodePorts, k)
			} else {
				x.nodePorts[k] = l
			}
		}
	}
	if s != nil {
		for _, p := range s.Ports {
			if p.NodePort == 0 {
				continue
			}
			k := portKey{policy.ProtoNumber(&p.Protocol), uint16(p.NodePort)}
			l := append(x.nodePorts[k], s)
			slices.SortFunc(l, func(a, b *Service) int { return cmp.Compare(a.UID, b.UID) })
			x.nodePorts[k] = slices.Compact(l)
		}
	}
}

// sliceKeys returns the addresses of an EndpointSlice with the endpoint
// holding each (the first, should an address repeat).
func sliceKeys(s *EndpointSlice) ([]netip.Addr, []*Endpoint) {
	if s == nil {
		return nil, nil
	}
	var keys []netip.Addr
	var eps []*Endpoint
	for i := range s.Endpoints {
		for _, a := range s.Endpoints[i].Addrs {
			if !slices.Contains(keys, a) {
				keys = append(keys, a)
				eps = append(eps, &s.Endpoints[i])
			}
		}
	}
	return keys, eps
}

// setEndpointSlice indexes a slice's addresses under the slice's own
// identity: the IPv4 and the IPv6 slice of a Service (or two slices of one
// family) never replace each other's entries, whatever their order.
func (x *index) setEndpointSlice(s *EndpointSlice) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.slices[s.key()]
	if old != nil && old.UID != s.UID {
		x.removeSliceLocked(old)
		old = nil
	}
	if old != nil && old.Service != s.Service {
		x.unlinkSlice(old)
	}
	x.slices[s.key()] = s
	svc := nsName{s.Namespace, s.Service}
	if x.slicesBySvc[svc] == nil {
		x.slicesBySvc[svc] = map[string]*EndpointSlice{}
	}
	x.slicesBySvc[svc][s.Name] = s
	oldKeys, _ := sliceKeys(old)
	newKeys, eps := sliceKeys(s)
	now := x.now().UnixNano()
	moveClaims(x, &x.epIPs, string(s.UID), oldKeys, newKeys, func(i int) *Endpoint { return eps[i] }, x.fromFor(s.Created, old == nil), now)
}

func (x *index) removeEndpointSlice(s *EndpointSlice) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if cur := x.slices[s.key()]; cur != nil && cur.UID == s.UID {
		x.removeSliceLocked(cur)
	}
}

func (x *index) removeSliceLocked(s *EndpointSlice) {
	delete(x.slices, s.key())
	x.unlinkSlice(s)
	keys, _ := sliceKeys(s)
	endAll(x, &x.epIPs, string(s.UID), keys)
}

func (x *index) unlinkSlice(s *EndpointSlice) {
	svc := nsName{s.Namespace, s.Service}
	if m := x.slicesBySvc[svc]; m != nil && m[s.Name] == s {
		delete(m, s.Name)
		if len(m) == 0 {
			delete(x.slicesBySvc, svc)
		}
	}
}

func nodeKeys(n *Node) []netip.Addr {
	if n == nil {
		return nil
	}
	out := slices.Clone(n.InternalIPs)
	for _, a := range slices.Concat(n.ExternalIPs, n.hidden6) {
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	return out
}

func cidrKeys(n *Node) []netip.Prefix {
	if n == nil {
		return nil
	}
	if len(n.hidden6CIDRs) > 0 {
		return slices.Concat(n.PodCIDRs, n.hidden6CIDRs)
	}
	return n.PodCIDRs
}

func (x *index) setNode(n *Node) {
	x.mu.Lock()
	defer x.mu.Unlock()
	old := x.nodes[n.Name]
	if old != nil && old.UID != n.UID {
		x.removeNodeLocked(old)
		old = nil
	}
	x.nodes[n.Name] = n
	if n.Zone != "" || x.zones[n.Name] != "" {
		x.zones[n.Name] = n.Zone
	}
	from, now := x.fromFor(n.Created, old == nil), x.now().UnixNano()
	nc := nodeClaim{node: n.Name, id: string(n.UID)}
	val := func(int) nodeClaim { return nc }
	moveClaims(x, &x.hostIPs, nc.id, nodeKeys(old), nodeKeys(n), val, from, now)
	moveClaims(x, &x.podCIDRs, nc.id, cidrKeys(old), cidrKeys(n), val, from, now)
	x.countCIDRs(cidrKeys(old), -1)
	x.countCIDRs(cidrKeys(n), +1)
}

func (x *index) removeNode(n *Node) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if cur := x.nodes[n.Name]; cur != nil && cur.UID == n.UID {
		x.removeNodeLocked(cur)
	}
}

func (x *index) removeNodeLocked(n *Node) {
	delete(x.nodes, n.Name)
	endAll(x, &x.hostIPs, string(n.UID), nodeKeys(n))
	endAll(x, &x.podCIDRs, string(n.UID), cidrKeys(n))
	// A retained CIDR claim still needs its length looked up; lengths are
	// recounted from the history at collection.
}

// countCIDRs keeps the set of prefix lengths in use, per family.
func (x *index) countCIDRs(ps []netip.Prefix, d int) {
	changed := false
	for _, p := range ps {
		k := cidrLen{p.Addr().Is6(), p.Bits()}
		n := x.cidrLens[k] + d
		if n <= 0 {
			delete(x.cidrLens, k)
		} else {
			x.cidrLens[k] = n
		}
		changed = true
	}
	if changed {
		x.rebuildLens()
	}
}

// rebuildLens derives lens from cidrLens and from the lengths of retained
// claims (a deleted node's CIDR still resolves during the grace period).
func (x *index) rebuildLens() {
	var lens [2][]int
	add := func(v6 bool, bits int) {
		f := 0
		if v6 {
			f = 1
		}
		if !slices.Contains(lens[f], bits) {
			lens[f] = append(lens[f], bits)
		}
	}
	for k := range x.cidrLens {
		add(k.v6, k.bits)
	}
	for p := range x.podCIDRs.m {
		add(p.Addr().Is6(), p.Bits())
	}
	for f := range lens {
		slices.SortFunc(lens[f], func(a, b int) int { return b - a })
	}
	x.lens = lens
}

func (x *index) setNamespace(n *Namespace) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.namespaces[n.Name] = n
}

func (x *index) removeNamespace(n *Namespace) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if cur := x.namespaces[n.Name]; cur != nil && cur.UID == n.UID {
		delete(x.namespaces, n.Name)
	}
}

func (x *index) setOwner(o *owner) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.owners[o.key] = ownerEntry{controller: o.controller, uid: o.uid, rv: o.rv}
}

func (x *index) removeOwner(o *owner) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if cur, ok := x.owners[o.key]; ok && cur.uid == o.uid {
		delete(x.owners, o.key)
	}
}

// setPolicy replaces the namespace's policy list with a new slice, so a
// list handed out earlier never changes.
func (x *index) setPolicy(p *networkingv1.NetworkPolicy) {
	x.mu.Lock()
	defer x.mu.Unlock()
	l := slices.DeleteFunc(slices.Clone(x.policies[p.Namespace]), func(q *networkingv1.NetworkPolicy) bool { return q.Name == p.Name })
	l = append(l, p)
	slices.SortFunc(l, func(a, b *networkingv1.NetworkPolicy) int { return cmp.Compare(a.Name, b.Name) })
	x.policies[p.Namespace] = l
	x.notifyPolicies()
}

// notifyPolicies signals policiesChanged: one pending signal stands for
// any number of changes.
func (x *index) notifyPolicies() {
	select {
	case x.policiesChanged <- struct{}{}:
	default:
	}
}

func (x *index) removePolicy(p *networkingv1.NetworkPolicy) {
	x.mu.Lock()
	defer x.mu.Unlock()
	l := slices.DeleteFunc(slices.Clone(x.policies[p.Namespace]), func(q *networkingv1.NetworkPolicy) bool {
		return q.Name == p.Name && q.UID == p.UID
	})
	if len(l) == 0 {
		delete(x.policies, p.Namespace)
	} else {
		x.policies[p.Namespace] = l
	}
	x.notifyPolicies()
}

// collect drops claims that ended more than the grace period ago. It
// returns how many it dropped.
func (x *index) collect() int {
	x.mu.Lock()
	defer x.mu.Unlock()
	cutoff := x.now().UnixNano() - x.grace
	n := x.podIPs.collect(cutoff) + x.hostIPs.collect(cutoff) + x.svcIPs.collect(cutoff) + x.epIPs.collect(cutoff)
	if c := x.podCIDRs.collect(cutoff); c > 0 {
		n += c
		x.rebuildLens()
	}
	return n
}

// retained returns the number of ended claims kept for late records.
func (x *index) retained() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.podIPs.retained + x.hostIPs.retained + x.svcIPs.retained + x.epIPs.retained + x.podCIDRs.retained
}

// counts returns the number of live objects per kind.
func (x *index) counts() map[string]int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	var rs, jobs, pols int
	for k := range x.owners {
		if k.Value().kind == KindJob {
			jobs++
		} else {
			rs++
		}
	}
	for _, l := range x.policies {
		pols += len(l)
	}
	return map[string]int{
		"pod": len(x.pods), "service": len(x.services), "endpointslice": len(x.slices), "node": len(x.nodes),
		"namespace": len(x.namespaces), "replicaset": rs, "job": jobs, "networkpolicy": pols,
	}
}
