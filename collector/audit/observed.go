package audit

import (
	"net/netip"

	networkingv1 "k8s.io/api/networking/v1"

	"github.com/dualflow/dualflow/collector/audit/policy"
	"github.com/dualflow/dualflow/collector/enrich"
)

// ObservedFlow is the recorded flows of one group: between two ends
// (pods or addresses) over one family, protocol and destination port,
// addressed to one Service or none, with how many of their records were
// allowed, denied, or traceflow probes. Policy recommendations
// (package recommend) are built from a window's groups and replayed
// over them.
type ObservedFlow struct {
	// Src and Dst are the ends as enrichment named them: the address
	// (Dst after DNAT: a Service's endpoint), and for a pod its namespace,
	// name and workload.
	Src, Dst  FlowEnd
	Protocol  uint8 // IANA number
	DstPort   uint16
	IPVersion uint8 // 4 or 6
	// ServiceNamespace and ServiceName are the Service the flows were
	// addressed to (dst_service_*, empty when none), ServicePort the
	// Service port (service_port).
	ServiceNamespace, ServiceName string
	ServicePort                   uint16
	// Allowed and Denied count the ordinary records (not probes) whose
	// evaluated or reported verdict let them through, or denied or
	// rejected them on either side; Probes counts traceflow probe
	// records.
	Allowed, Denied, Probes uint64
}

// PodFlow is the policy view of a flow between two pods of view (nil:
// not a pod, or a host-network one: only the address counts) over the
// addresses given, with the destination's named port resolved: the flow
// the audit evaluates for the same ends.
func PodFlow(view *enrich.Snapshot, src *enrich.Pod, srcAddr netip.Addr, dst *enrich.Pod, dstAddr netip.Addr, proto uint8, port uint16) policy.Flow {
	return podFlow(view, src, srcAddr, dst, dstAddr, proto, port)
}

// WithProposed returns current with proposed added, a proposed policy
// replacing the current one of the same namespace and name: the policy
// set a what-if or a recommendation is evaluated with.
func WithProposed(current, proposed []*networkingv1.NetworkPolicy) []*networkingv1.NetworkPolicy {
	return withProposed(current, proposed)
}
