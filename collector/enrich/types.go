package enrich

import (
	"net/netip"
	"slices"
	"time"
	"unique"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The views below are what the informers store (see transform.go): trimmed,
// immutable copies of the Kubernetes objects. Every pointer the Enricher
// hands out points to one of them and stays valid (and unchanged) for as
// long as the caller holds it; an update stores a new value instead of
// modifying the old one. Maps and slices inside them are shared between
// objects (label sets and port lists are interned) and must not be
// modified.

// Workload names the controller a pod belongs to, resolved to the top:
// Deployment (through its ReplicaSet), StatefulSet, DaemonSet, Job, CronJob
// (through its Job), ReplicaSet (not owned by a Deployment), another
// controller kind as found in the owner reference, or Pod for a bare pod.
type Workload struct {
	Kind, Name string
}

// Workload kinds.
const (
	KindDeployment  = "Deployment"
	KindReplicaSet  = "ReplicaSet"
	KindStatefulSet = "StatefulSet"
	KindDaemonSet   = "DaemonSet"
	KindJob         = "Job"
	KindCronJob     = "CronJob"
	KindPod         = "Pod"
)

// ContainerPort is a port a pod declares, for named-port resolution.
type ContainerPort struct {
	Name     string
	Port     int32
	Protocol corev1.Protocol // TCP, UDP or SCTP; never empty
}

// Pod is the trimmed view of a Pod. The fields a lookup reads come
// first, so that they share the object's first two cache lines.
type Pod struct {
	Namespace, Name string
	NodeName        string
	// Labels are the pod's labels. Shared between pods with the same set:
	// read-only.
	Labels map[string]string
	// Owner is the pod's controller owner reference as written (for
	// example ReplicaSet web-6b7f9c5d84); Enricher.Workload resolves it.
	Owner Workload
	// ownerKey is the interned key of Owner in the index's owners.
	ownerKey unique.Handle[ownerKey]
	// deployment is the Deployment name implied by a ReplicaSet owner and
	// the pod-template-hash label, used while the ReplicaSet is unknown.
	deployment string

	UID types.UID
	// Addrs are status.podIPs in order (the primary first), unmapped. For
	// a host-network pod they are the node's addresses.
	Addrs       []netip.Addr
	HostNetwork bool
	// Terminated is true in phase Succeeded or Failed: the pod no longer
	// holds its addresses, whatever status.podIPs still says.
	Terminated bool
	// Ports are the container ports of every container. Shared: read-only.
	Ports []ContainerPort
	// hidden6 are the IPv6 addresses of status.podIPs when IPv6 is
	// disabled: they answer NodesForIPs only (see transformer.place).
	hidden6 []netip.Addr
	// Created is metadata.creationTimestamp.
	Created time.Time

	rv string
	// labelsRef and portsRef keep the interned Labels and Ports alive.
	labelsRef *map[string]string
	portsRef  *[]ContainerPort
	// finished is when a terminated pod's last container ended (unix ns,
	// 0 if unknown).
	finished int64
}

// ServicePort is one port of a Service.
type ServicePort struct {
	Name       string
	Protocol   corev1.Protocol // never empty
	Port       int32
	TargetPort intstr.IntOrString
	NodePort   int32
}

// Service is the trimmed view of a Service (the fields a lookup reads
// first).
type Service struct {
	Namespace, Name string
	Ports           []ServicePort
	id              unique.Handle[nsName] // interned namespace/name, matched by endpoints

	UID  types.UID
	Type corev1.ServiceType
	// ClusterIPs is spec.clusterIPs, primary first; empty for a headless
	// or ExternalName Service.
	ClusterIPs     []netip.Addr
	IPFamilies     []corev1.IPFamily
	IPFamilyPolicy corev1.IPFamilyPolicy // empty when unset
	Headless       bool
	// ExternalIPs is spec.externalIPs; LoadBalancerIPs is
	// status.loadBalancer.ingress[].ip.
	ExternalIPs     []netip.Addr
	LoadBalancerIPs []netip.Addr
	// Selector is spec.selector (nil: endpoints managed by hand). Shared
	// between Services with the same selector: read-only.
	Selector map[string]string
	Created  time.Time

	rv          string
	selectorRef *map[string]string
}

// HasFamily reports whether the Service has family f in spec.ipFamilies.
// A Service without ipFamilies (an old object, or a headless one with no
// selector) has every family.
func (s *Service) HasFamily(f corev1.IPFamily) bool {
	return len(s.IPFamilies) == 0 || slices.Contains(s.IPFamilies, f)
}

// EndpointPort is a port of an EndpointSlice.
type EndpointPort struct {
	Name     string
	Port     int32
	Protocol corev1.Protocol // never empty
}

// PodRef names the pod behind an endpoint (its targetRef).
type PodRef struct {
	Namespace, Name string
}

// Endpoint is one endpoint of an EndpointSlice.
type Endpoint struct {
	Addrs    []netip.Addr
	NodeName string
	// Zone is the endpoint's zone as the EndpointSlice states it.
	Zone string
	// Ready, Serving and Terminating are the endpoint conditions, with the
	// API's defaults applied (nil ready and serving mean true).
	Ready, Serving, Terminating bool
	// Pod is the targetRef when it is a Pod (zero otherwise).
	Pod PodRef
	// Slice is the EndpointSlice holding the endpoint.
	Slice *EndpointSlice

	svc unique.Handle[nsName] // the slice's Service (Service.id)
}

// EndpointSlice is the trimmed view of an EndpointSlice.
type EndpointSlice struct {
	Namespace, Name string
	UID             types.UID
	// Service is the kubernetes.io/service-name label: the Service the
	// slice belongs to ("" when missing).
	Service     string
	AddressType discoveryv1.AddressType
	Ports       []EndpointPort
	Endpoints   []Endpoint
	Created     time.Time

	rv string
}

// Node is the trimmed view of a Node.
type Node struct {
	Name string
	UID  types.UID
	// Zone is the topology.kubernetes.io/zone label (or the deprecated
	// failure-domain.beta.kubernetes.io/zone).
	Zone string
	// InternalIPs and ExternalIPs are status.addresses of those types, in
	// order, both families.
	InternalIPs, ExternalIPs []netip.Addr
	// PodCIDRs is spec.podCIDRs, masked, both families.
	PodCIDRs []netip.Prefix
	Created  time.Time
	// hidden6 and hidden6CIDRs are the IPv6 addresses and pod CIDRs when
	// IPv6 is disabled: they answer NodesForIPs only (see transformer.place).
	hidden6      []netip.Addr
	hidden6CIDRs []netip.Prefix

	rv string
}

// Namespace is the trimmed view of a Namespace.
type Namespace struct {
	Name string
	UID  types.UID
	// Labels are shared between namespaces with the same set: read-only.
	Labels  map[string]string
	Created time.Time

	rv        string
	labelsRef *map[string]string
}

// owner is a ReplicaSet or a Job reduced to its own controller, for
// workload resolution.
type owner struct {
	kind            string // KindReplicaSet or KindJob
	namespace, name string
	uid             types.UID
	controller      Workload // Kind "" when it has no controller
	rv              string
	key             unique.Handle[ownerKey]
}
