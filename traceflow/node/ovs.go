package node

import (
	"context"
	"fmt"

	"github.com/dualflow/dualflow/traceflow"
)

// OVS is the Open vSwitch datapath of a node.
type OVS struct {
	// RunDir is the OVS_RUNDIR of the node's ovs-vswitchd (empty: the
	// CLIs' default, /var/run/openvswitch).
	RunDir string
	// Bridge is the integration bridge (default br-int).
	Bridge string
	// RulesFile maps flow cookies to policy rules (exporter/ovs.Rules).
	RulesFile string
}

func (t *Tracer) watchOVS(ctx context.Context, p traceflow.Probe, emit func(traceflow.WatchEvent) error) error {
	return fmt.Errorf("OVS datapath: %w", traceflow.ErrNotSupported)
}
