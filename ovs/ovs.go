// Package ovs is the Open vSwitch vocabulary dualflow shares: parsers of
// the OVS CLIs' text output and the contract with a dualflow-aware
// datapath. It imports nothing of the exporter or traceflow, which both
// build on it: exporter/ovs reads OVS as a flow source, traceflow/node
// watches probes on an OVS datapath, and lab/ovs installs the flows.
//
//   - `ovs-appctl dpctl/dump-conntrack -m [zone=N]` (ParseConntrack,
//     Entry): the connections, both families, with zone, mark, labels, NAT
//     (reply tuple) and TCP state. The userspace datapath has no
//     per-connection counters, no timestamps and id=0; the kernel datapath
//     with -s adds counters.
//   - `ovs-ofctl dump-flows` (ParseFlows, Flow): per-flow packet and byte
//     counts. Flows whose cookie has KindConn are per-connection counter
//     flows that the datapath learns when it commits a connection (one per
//     direction, see CounterKeys); KindAllow and KindDrop flows count
//     NetworkPolicy rule hits and drops.
//   - `ovs-ofctl monitor` (MonitorParser, PacketIn): packet-ins. Drop flows
//     send what they drop to the controller (rate-limited by a meter).
//
// The cookie layout (Cookie, SplitCookie) and the rules file that maps
// rule IDs to names (Rules) are the contract with the datapath. Parse
// errors wrap ErrSyntax; no parser panics or logs.
package ovs

import "time"

// Defaults of the CLIs' callers.
const (
	DefaultBridge         = "br-int"
	DefaultCommandTimeout = 5 * time.Second
	DefaultMonitorMissLen = 65534 // enables packet-ins on the monitor's service connection
)
