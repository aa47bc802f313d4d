// Package ovs is the Open vSwitch vocabulary of dualflow, a leaf that
// exporter/ovs (OVS as a flow source), traceflow/node (probes on an OVS
// datapath) and lab/ovs (the lab's datapath) share: parsers of the CLIs'
// output (ParseConntrack for `ovs-appctl dpctl/dump-conntrack`, ParseFlows
// for `ovs-ofctl dump-flows`, MonitorParser for the packet-ins of
// `ovs-ofctl monitor`) and the contract with a dualflow-aware datapath:
// the cookie layout (Cookie, SplitCookie), the rules file (Rules) and the
// per-connection counter flows (CounterKeys). Parse errors wrap ErrSyntax;
// nothing here runs a command or logs. See README.md.
package ovs

import "time"

// Defaults of the CLIs' callers.
const (
	DefaultBridge         = "br-int"
	DefaultCommandTimeout = 5 * time.Second
	DefaultMonitorMissLen = 65534 // enables packet-ins on the monitor's service connection
)
