package manifest

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Address plan of the lab. Everything is inside 198.18.0.0/15 (RFC 2544
// benchmarking) and fd00:10::/32 (ULA), so nothing can leak to a real network.
var (
	// ClusterCIDRv4 holds the node network (198.18.0.0/24) and one /24 pod
	// CIDR per node (198.18.<i>.0/24 for node i, i >= 1).
	ClusterCIDRv4 = netip.MustParsePrefix("198.18.0.0/16")
	// ClusterCIDRv6 holds the node network (fd00:10::/64) and one /64 pod
	// CIDR per node (fd00:10:0:<i>::/64), like --node-cidr-mask-size-ipv6=64.
	ClusterCIDRv6 = netip.MustParsePrefix("fd00:10::/56")
	// ServiceCIDRv4 and ServiceCIDRv6 hold the ClusterIPs.
	ServiceCIDRv4 = netip.MustParsePrefix("198.19.0.0/16")
	ServiceCIDRv6 = netip.MustParsePrefix("fd00:10:ff::/108")
)

// MaxNodes bounds Spec.Nodes: node i uses the /24 198.18.<i>.0 and zone
// letter i, so a handful is plenty for one machine.
const MaxNodes = 16

// Spec selects the default lab that Generate builds.
type Spec struct {
	Mode Mode
	// Nodes is the number of nodes (default 2, at most MaxNodes).
	Nodes int
	// Prefix starts every network namespace name (default "df-").
	Prefix string
}

// SetDefaults fills in unset fields.
func (s *Spec) SetDefaults() {
	s.Mode = cmp.Or(s.Mode, ModeDual)
	s.Nodes = cmp.Or(s.Nodes, 2)
	s.Prefix = cmp.Or(s.Prefix, "df-")
}

// Validate reports a spec that Generate cannot build.
func (s *Spec) Validate() error {
	if _, err := ParseMode(string(s.Mode)); err != nil {
		return err
	}
	if s.Nodes < 1 || s.Nodes > MaxNodes {
		return fmt.Errorf("nodes %d: want 1..%d", s.Nodes, MaxNodes)
	}
	if s.Prefix == "" || len(s.Prefix) > 32 {
		return errors.New("prefix: want 1..32 characters")
	}
	return nil
}

// Names of the objects of the default lab, for tests and the traffic mix.
const (
	NSFrontend = "frontend"
	NSBackend  = "backend"
	NSTools    = "tools"

	PolicyDefaultDeny  = "default-deny-ingress"
	PolicyAllowWeb     = "allow-web-to-api"
	PolicyMetricsIPv4  = "allow-metrics-ipv4-only"
	PolicyToolsEgress  = "restrict-egress"
	ServiceWeb         = "web"
	ServiceAPI         = "api"
	ServiceAPISingle   = "api-single"
	PortHTTP           = 8080
	PortMetrics        = 9090
	PortUDPEcho        = 5353
	PortDebug          = 7070
	ServicePortHTTP    = 80
	ServicePortUDPEcho = 53
)

// NodeName returns the name of node i (1-based).
func NodeName(i int) string { return "node-" + strconv.Itoa(i) }

// labRegion is the topology.kubernetes.io/region of every lab node.
const labRegion = "lab"

// Zone returns the zone of node i: zone-a, zone-b, ...
func Zone(i int) string { return "zone-" + string(rune('a'+i-1)) }

// NodeAddrFor returns the InternalIP of node i in family f.
func NodeAddrFor(i int, f corev1.IPFamily) netip.Addr {
	if f == corev1.IPv6Protocol {
		return netip.MustParseAddr(fmt.Sprintf("fd00:10::%x", i))
	}
	return netip.AddrFrom4([4]byte{198, 18, 0, byte(i)})
}

// NodeNetwork returns the underlay prefix that joins the nodes in family f.
func NodeNetwork(f corev1.IPFamily) netip.Prefix {
	if f == corev1.IPv6Protocol {
		return netip.MustParsePrefix("fd00:10::/64")
	}
	return netip.MustParsePrefix("198.18.0.0/24")
}

// PodCIDRFor returns the pod CIDR of node i in family f.
func PodCIDRFor(i int, f corev1.IPFamily) netip.Prefix {
	if f == corev1.IPv6Protocol {
		return netip.MustParsePrefix(fmt.Sprintf("fd00:10:0:%x::/64", i))
	}
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 18, byte(i), 0}), 24)
}

// podAddr returns the address of the k-th pod (0-based) of node i. The
// IPv6 host part repeats the IPv4 digits (.10 -> ::10) to ease reading.
func podAddr(i, k int, f corev1.IPFamily) netip.Addr {
	if f == corev1.IPv6Protocol {
		return netip.MustParseAddr(fmt.Sprintf("fd00:10:0:%x::%d", i, 10+k))
	}
	return netip.AddrFrom4([4]byte{198, 18, byte(i), byte(10 + k)})
}

// serviceAddr returns the k-th ClusterIP of family f.
func serviceAddr(k int, f corev1.IPFamily) netip.Addr {
	if f == corev1.IPv6Protocol {
		return netip.MustParseAddr(fmt.Sprintf("fd00:10:ff::%d", 10+k))
	}
	return netip.AddrFrom4([4]byte{198, 19, 0, byte(10 + k)})
}

// HostIface returns the node-side veth name of a pod: "veth" and 10 hex
// digits of a hash of namespace/name, 14 characters (IFNAMSIZ is 16).
func HostIface(namespace, name string) string {
	h := sha256.Sum256([]byte(namespace + "/" + name))
	return "veth" + hex.EncodeToString(h[:5])
}

// PodNetNS returns the network namespace name of a pod.
func PodNetNS(prefix, namespace, name string) string {
	return prefix + namespace + "-" + name
}

// NodeNetNS returns the network namespace name of a node.
func NodeNetNS(prefix, node string) string { return prefix + node }

// FabricNetNS returns the network namespace that holds the bridge joining
// the nodes (the "top of rack switch").
func FabricNetNS(prefix string) string { return prefix + "fabric" }

var typeNode = metav1.TypeMeta{APIVersion: "v1", Kind: "Node"}

// Generate builds the default lab of spec: per node one frontend/web pod
// (Deployment web), one backend/api pod (Deployment api) and one standalone
// tools/probe pod; Services web (RequireDualStack), api (PreferDualStack)
// and api-single (single-stack); their EndpointSlices; and four
// NetworkPolicies (see the package README for what each one tests).
func Generate(spec Spec) (*Manifest, error) {
	spec.SetDefaults()
	if err := spec.Validate(); err != nil {
		return nil, fmt.Errorf("lab spec: %w", err)
	}
	fams := spec.Mode.Families()
	m := &Manifest{}
	for i := 1; i <= spec.Nodes; i++ {
		m.Nodes = append(m.Nodes, genNode(spec, i, fams))
	}
	for _, ns := range []struct{ name, team string }{{NSFrontend, "web"}, {NSBackend, "api"}, {NSTools, "ops"}} {
		m.Namespaces = append(m.Namespaces, corev1.Namespace{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
			ObjectMeta: metav1.ObjectMeta{Name: ns.name, Labels: map[string]string{LabelNSName: ns.name, "team": ns.team}},
		})
	}
	webPorts := []corev1.ContainerPort{
		{Name: "http", ContainerPort: PortHTTP, Protocol: corev1.ProtocolTCP},
		{Name: "udp-echo", ContainerPort: PortUDPEcho, Protocol: corev1.ProtocolUDP},
	}
	apiPorts := []corev1.ContainerPort{
		{Name: "http", ContainerPort: PortHTTP, Protocol: corev1.ProtocolTCP},
		{Name: "metrics", ContainerPort: PortMetrics, Protocol: corev1.ProtocolTCP},
		{Name: "udp-echo", ContainerPort: PortUDPEcho, Protocol: corev1.ProtocolUDP},
	}
	probePorts := []corev1.ContainerPort{{Name: "debug", ContainerPort: PortDebug, Protocol: corev1.ProtocolTCP}}
	web := newWorkload(m, NSFrontend, "web", "6b7f9c5d84", spec.Nodes, webPorts)
	api := newWorkload(m, NSBackend, "api", "58d4c7f9b6", spec.Nodes, apiPorts)
	for i := 1; i <= spec.Nodes; i++ {
		m.Pods = append(m.Pods,
			web.pod(spec, i, 0, fams),
			api.pod(spec, i, 1, fams),
			standalonePod(spec, NSTools, "probe-"+strconv.Itoa(i), "probe", i, 2, fams, probePorts))
	}
	dual := spec.Mode == ModeDual
	require, prefer, single := corev1.IPFamilyPolicyRequireDualStack, corev1.IPFamilyPolicyPreferDualStack, corev1.IPFamilyPolicySingleStack
	webPolicy, apiPolicy := &require, &prefer
	if !dual {
		webPolicy, apiPolicy = &single, &single
	}
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	m.addService(NSFrontend, ServiceWeb, "web", 0, fams, webPolicy, []corev1.ServicePort{
		{Name: "http", Port: ServicePortHTTP, TargetPort: intstr.FromString("http"), Protocol: tcp},
	})
	m.addService(NSBackend, ServiceAPI, "api", 1, fams, apiPolicy, []corev1.ServicePort{
		{Name: "http", Port: ServicePortHTTP, TargetPort: intstr.FromString("http"), Protocol: tcp},
		{Name: "metrics", Port: PortMetrics, TargetPort: intstr.FromInt32(PortMetrics), Protocol: tcp},
		{Name: "udp-echo", Port: ServicePortUDPEcho, TargetPort: intstr.FromString("udp-echo"), Protocol: udp},
	})
	// Single-stack in every mode: in dual mode it has no IPv6 ClusterIP,
	// for "no address of this family" tests.
	m.addService(NSBackend, ServiceAPISingle, "api", 2, fams[:1], &single, []corev1.ServicePort{
		{Name: "http", Port: PortHTTP, TargetPort: intstr.FromInt32(PortHTTP), Protocol: tcp},
	})
	m.NetworkPolicies = defaultPolicies(spec)
	return m, nil
}

func genNode(spec Spec, i int, fams []corev1.IPFamily) corev1.Node {
	name := NodeName(i)
	n := corev1.Node{
		TypeMeta: typeNode,
		ObjectMeta: metav1.ObjectMeta{
			Name: name,
			UID:  uid("node", name),
			Labels: map[string]string{
				LabelHostname: name, LabelZone: Zone(i), LabelRegion: labRegion,
				"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
			},
			Annotations: map[string]string{AnnotationNetNS: NodeNetNS(spec.Prefix, name), AnnotationMode: string(spec.Mode)},
		},
	}
	for _, f := range fams {
		c := PodCIDRFor(i, f).String()
		n.Spec.PodCIDRs = append(n.Spec.PodCIDRs, c)
		n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: NodeAddrFor(i, f).String()})
	}
	n.Spec.PodCIDR = n.Spec.PodCIDRs[0]
	n.Status.Addresses = append(n.Status.Addresses, corev1.NodeAddress{Type: corev1.NodeHostName, Address: name})
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}
	return n
}

// uid returns a stable UID so that regenerating a lab gives the same file.
func uid(kind, key string) types.UID {
	h := sha256.Sum256([]byte(kind + "/" + key))
	x := hex.EncodeToString(h[:16])
	return types.UID(x[0:8] + "-" + x[8:12] + "-" + x[12:16] + "-" + x[16:20] + "-" + x[20:32])
}

type workload struct {
	ns, app, hash string
	ports         []corev1.ContainerPort
	rs            *appsv1.ReplicaSet
}

func newWorkload(m *Manifest, ns, app, hash string, replicas int, ports []corev1.ContainerPort) *workload {
	r := int32(replicas)
	labels := map[string]string{"app": app}
	tmpl := corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: app, Image: "dualflow/lab-agent", Ports: ports}}},
	}
	dep := appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: app, Namespace: ns, UID: uid("deployment", ns+"/"+app), Labels: labels},
		Spec:       appsv1.DeploymentSpec{Replicas: &r, Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl},
		Status:     appsv1.DeploymentStatus{Replicas: r, ReadyReplicas: r, AvailableReplicas: r, UpdatedReplicas: r},
	}
	rsName := app + "-" + hash
	rsLabels := map[string]string{"app": app, appsv1.DefaultDeploymentUniqueLabelKey: hash}
	rsTmpl := *tmpl.DeepCopy()
	rsTmpl.Labels = rsLabels
	rs := appsv1.ReplicaSet{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "ReplicaSet"},
		ObjectMeta: metav1.ObjectMeta{
			Name: rsName, Namespace: ns, UID: uid("replicaset", ns+"/"+rsName), Labels: rsLabels,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Deployment", Name: app, UID: dep.UID, Controller: new(true), BlockOwnerDeletion: new(true)}},
		},
		Spec:   appsv1.ReplicaSetSpec{Replicas: &r, Selector: &metav1.LabelSelector{MatchLabels: rsLabels}, Template: rsTmpl},
		Status: appsv1.ReplicaSetStatus{Replicas: r, ReadyReplicas: r, AvailableReplicas: r},
	}
	m.Deployments = append(m.Deployments, dep)
	m.ReplicaSets = append(m.ReplicaSets, rs)
	return &workload{ns: ns, app: app, hash: hash, ports: ports, rs: &m.ReplicaSets[len(m.ReplicaSets)-1]}
}

// podSuffix returns a stable 5-character pod name suffix in the alphabet
// Kubernetes uses for generated names.
func podSuffix(key string) string {
	const alphabet = "bcdfghjklmnpqrstvwxz2456789"
	h := sha256.Sum256([]byte(key))
	b := make([]byte, 5)
	for i := range b {
		b[i] = alphabet[int(h[i])%len(alphabet)]
	}
	return string(b)
}

func (w *workload) pod(spec Spec, node, k int, fams []corev1.IPFamily) corev1.Pod {
	name := w.rs.Name + "-" + podSuffix(w.rs.Name+strconv.Itoa(node))
	p := standalonePod(spec, w.ns, name, w.app, node, k, fams, w.ports)
	p.Labels[appsv1.DefaultDeploymentUniqueLabelKey] = w.hash
	p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: w.rs.Name, UID: w.rs.UID, Controller: new(true), BlockOwnerDeletion: new(true)}}
	return p
}

func standalonePod(spec Spec, ns, name, app string, node, k int, fams []corev1.IPFamily, ports []corev1.ContainerPort) corev1.Pod {
	p := corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: ns, UID: uid("pod", ns+"/"+name),
			// An API server of 1.35 or later (PodTopologyLabels admission)
			// copies the node's zone and region labels onto a pod created
			// with spec.nodeName; the lab's pods carry them as a real
			// cluster's would.
			Labels: map[string]string{"app": app, LabelZone: Zone(node), LabelRegion: labRegion},
			Annotations: map[string]string{
				AnnotationNetNS:     PodNetNS(spec.Prefix, ns, name),
				AnnotationHostIface: HostIface(ns, name),
			},
		},
		Spec: corev1.PodSpec{
			NodeName:   NodeName(node),
			Containers: []corev1.Container{{Name: app, Image: "dualflow/lab-agent", Ports: ports}},
		},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			HostIP:     NodeAddrFor(node, fams[0]).String(),
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	for _, f := range fams {
		p.Status.HostIPs = append(p.Status.HostIPs, corev1.HostIP{IP: NodeAddrFor(node, f).String()})
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: podAddr(node, k, f).String()})
	}
	p.Status.PodIP = p.Status.PodIPs[0].IP
	return p
}

// addService adds a ClusterIP Service selecting app=<app> and one
// EndpointSlice per family, named and labelled like the EndpointSlice
// controller does.
func (m *Manifest) addService(ns, name, app string, k int, fams []corev1.IPFamily, policy *corev1.IPFamilyPolicy, ports []corev1.ServicePort) {
	svc := corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uid("service", ns+"/"+name), Labels: map[string]string{"app": app}},
		Spec: corev1.ServiceSpec{
			Type: corev1.ServiceTypeClusterIP, Selector: map[string]string{"app": app},
			Ports: ports, IPFamilies: fams, IPFamilyPolicy: policy,
		},
	}
	for _, f := range fams {
		svc.Spec.ClusterIPs = append(svc.Spec.ClusterIPs, serviceAddr(k, f).String())
	}
	svc.Spec.ClusterIP = svc.Spec.ClusterIPs[0]
	m.Services = append(m.Services, svc)
	for _, f := range fams {
		at := discoveryv1.AddressTypeIPv4
		if f == corev1.IPv6Protocol {
			at = discoveryv1.AddressTypeIPv6
		}
		sl := discoveryv1.EndpointSlice{
			TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
			ObjectMeta: metav1.ObjectMeta{
				Name: name + "-" + podSuffix(name+string(f)), Namespace: ns, UID: uid("endpointslice", ns+"/"+name+string(f)),
				GenerateName: name + "-",
				Labels:       map[string]string{LabelServiceName: name, LabelManagedBy: "endpointslice-controller.k8s.io"},
				OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: name, UID: svc.UID,
					Controller: new(true), BlockOwnerDeletion: new(true)}},
			},
			AddressType: at,
		}
		var pods []*corev1.Pod
		for i := range m.Pods {
			if p := &m.Pods[i]; p.Namespace == ns && p.Labels["app"] == app {
				pods = append(pods, p)
			}
		}
		for _, sp := range ports {
			num := sp.TargetPort.IntVal
			if sp.TargetPort.Type == intstr.String && len(pods) > 0 {
				num, _ = ContainerPort(pods[0], sp.TargetPort.StrVal, sp.Protocol)
			}
			sl.Ports = append(sl.Ports, discoveryv1.EndpointPort{Name: new(sp.Name), Port: new(num), Protocol: new(sp.Protocol)})
		}
		for _, p := range pods {
			a, ok := PodAddr(p, f)
			if !ok {
				continue
			}
			node, _ := m.Node(p.Spec.NodeName)
			ep := discoveryv1.Endpoint{
				Addresses:  []string{a.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: new(true), Serving: new(true), Terminating: new(false)},
				NodeName:   new(p.Spec.NodeName),
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
			}
			if node != nil {
				ep.Zone = new(node.Labels[LabelZone])
			}
			sl.Endpoints = append(sl.Endpoints, ep)
		}
		m.EndpointSlices = append(m.EndpointSlices, sl)
	}
}

// defaultPolicies returns the NetworkPolicies of the default lab:
//   - backend/default-deny-ingress: every backend pod is isolated for ingress.
//   - backend/allow-web-to-api: frontend web pods may reach api on the named
//     ports http (TCP) and udp-echo (UDP), in every family.
//   - backend/allow-metrics-ipv4-only: api:9090 from an IPv4 ipBlock
//     (198.18.0.0/16 except the pod CIDR of the last node). There is no IPv6
//     block: the deliberate "dual-stack gap".
//   - tools/restrict-egress: tools pods may only reach backend pods on
//     8080/TCP and 5353/UDP, and pods outside node 1's pod CIDRs on
//     7000-7100/TCP (ipBlock with except, IPv4 and IPv6).
func defaultPolicies(spec Spec) []networkingv1.NetworkPolicy {
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	typ := metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"}
	meta := func(ns, name string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Name: name, Namespace: ns, UID: uid("networkpolicy", ns+"/"+name)}
	}
	port := func(p intstr.IntOrString) *intstr.IntOrString { return &p }
	var except []string
	if spec.Nodes > 1 {
		except = []string{PodCIDRFor(spec.Nodes, corev1.IPv4Protocol).String()}
	}
	return []networkingv1.NetworkPolicy{
		{
			TypeMeta: typ, ObjectMeta: meta(NSBackend, PolicyDefaultDeny),
			Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}},
		},
		{
			TypeMeta: typ, ObjectMeta: meta(NSBackend, PolicyAllowWeb),
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From: []networkingv1.NetworkPolicyPeer{{
						NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "web"}},
						PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
					}},
					Ports: []networkingv1.NetworkPolicyPort{
						{Protocol: &tcp, Port: port(intstr.FromString("http"))},
						{Protocol: &udp, Port: port(intstr.FromString("udp-echo"))},
					},
				}},
			},
		},
		{
			TypeMeta: typ, ObjectMeta: meta(NSBackend, PolicyMetricsIPv4),
			Spec: networkingv1.NetworkPolicySpec{
				PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "api"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress: []networkingv1.NetworkPolicyIngressRule{{
					From:  []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: ClusterCIDRv4.String(), Except: except}}},
					Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(intstr.FromInt32(PortMetrics))}},
				}},
			},
		},
		{
			TypeMeta: typ, ObjectMeta: meta(NSTools, PolicyToolsEgress),
			Spec: networkingv1.NetworkPolicySpec{
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress},
				Egress: []networkingv1.NetworkPolicyEgressRule{
					{
						To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "api"}}}},
						Ports: []networkingv1.NetworkPolicyPort{
							{Protocol: &tcp, Port: port(intstr.FromInt32(PortHTTP))},
							{Protocol: &udp, Port: port(intstr.FromInt32(PortUDPEcho))},
						},
					},
					{
						To: []networkingv1.NetworkPolicyPeer{
							{IPBlock: &networkingv1.IPBlock{CIDR: ClusterCIDRv4.String(), Except: []string{PodCIDRFor(1, corev1.IPv4Protocol).String()}}},
							{IPBlock: &networkingv1.IPBlock{CIDR: ClusterCIDRv6.String(), Except: []string{PodCIDRFor(1, corev1.IPv6Protocol).String()}}},
						},
						Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: port(intstr.FromInt32(7000)), EndPort: new(int32(7100))}},
					},
				},
			},
		},
	}
}
