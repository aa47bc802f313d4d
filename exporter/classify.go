package exporter

import (
	"net/netip"

	"github.com/dualflow/dualflow/flow"
)

// classifier fills what the exporter can tell from addresses alone: the
// flow type and the node of endpoints in this node's pod CIDRs. Without
// CIDRs it leaves records alone and the collector decides from Kubernetes.
type classifier struct {
	node           string
	local, cluster []netip.Prefix
}

func contains(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// classify sets r.Type, r.Src.NodeName and r.Dst.NodeName. The destination
// is the endpoint reached (after DNAT), so traffic to a Service is
// classified by the pod that served it.
func (c *classifier) classify(r *flow.Record) {
	if len(c.local) == 0 && len(c.cluster) == 0 {
		return
	}
	srcLocal, dstLocal := contains(c.local, r.SrcAddr), contains(c.local, r.DstAddr)
	srcCluster := srcLocal || contains(c.cluster, r.SrcAddr)
	dstCluster := dstLocal || contains(c.cluster, r.DstAddr)
	if srcLocal {
		r.Src.NodeName = c.node
	}
	if dstLocal {
		r.Dst.NodeName = c.node
	}
	switch {
	case srcLocal && dstLocal:
		r.Type = flow.FlowTypeIntraNode
	case srcCluster && dstCluster:
		r.Type = flow.FlowTypeInterNode
	case srcCluster:
		r.Type = flow.FlowTypeToExternal
	case dstCluster:
		r.Type = flow.FlowTypeFromExternal
	}
}
