// Package flow holds the typed flow record shared by the exporter and the
// collector. It is the contract between every stage of the pipeline:
// conntrack/OVS → connection store → IPFIX → decode → correlate → enrich →
// audit → ClickHouse. One Record field maps to one column of the ClickHouse
// `flows` table (see docs/schema.md); the column name is given on each field.
//
// The package is a leaf: it imports nothing from the project, so every stage
// can depend on it without cycles.
//
// Addresses are netip.Addr. IPv4 addresses are always stored unmapped
// (198.18.0.1, never ::ffff:198.18.0.1): use Unmap at ingress, and
// Record.Normalize before handing a record to the next stage.
package flow

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// Tuple identifies a connection in one direction. It is comparable and is
// meant to be used as a map key. Src and Dst are always unmapped, so an IPv4
// connection never has two keys.
type Tuple struct {
	Src, Dst         netip.Addr
	Proto            uint8
	SrcPort, DstPort uint16
}

// IPVersion returns 4 or 6 for a valid tuple, 0 otherwise.
func (t Tuple) IPVersion() uint8 { return Version(t.Src) }

// Reverse returns the tuple of the reply direction.
func (t Tuple) Reverse() Tuple {
	return Tuple{Src: t.Dst, Dst: t.Src, Proto: t.Proto, SrcPort: t.DstPort, DstPort: t.SrcPort}
}

// Version returns 4 for an IPv4 (or 4-in-6 mapped) address, 6 for IPv6 and
// 0 for the zero Addr.
func Version(a netip.Addr) uint8 {
	switch {
	case !a.IsValid():
		return 0
	case a.Is4() || a.Is4In6():
		return 4
	default:
		return 6
	}
}

// ParseFamily reads an IP family the way every flag, query parameter and
// request of dualflow takes it: 4, ipv4 or v4; 6, ipv6 or v6; 0, dual or
// empty for both (or any) families, as 0.
func ParseFamily(s string) (uint8, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "0", "dual":
		return 0, nil
	case "4", "ipv4", "v4":
		return 4, nil
	case "6", "ipv6", "v6":
		return 6, nil
	}
	return 0, fmt.Errorf("family %q: want 4 (ipv4), 6 (ipv6) or 0 (dual)", s)
}

// IP protocol numbers used across dualflow.
const (
	ProtoICMP   uint8 = 1
	ProtoTCP    uint8 = 6
	ProtoUDP    uint8 = 17
	ProtoICMPv6 uint8 = 58
	ProtoSCTP   uint8 = 132
)

// ProtoName returns the name of IP protocol p (TCP, UDP, SCTP, ICMP,
// ICMPv6), or its number.
func ProtoName(p uint8) string {
	switch p {
	case ProtoTCP:
		return "TCP"
	case ProtoUDP:
		return "UDP"
	case ProtoSCTP:
		return "SCTP"
	case ProtoICMP:
		return "ICMP"
	case ProtoICMPv6:
		return "ICMPv6"
	}
	return strconv.Itoa(int(p))
}

// HasPorts says whether IP protocol p carries ports (TCP, UDP, SCTP): the
// protocols a NetworkPolicy port can name.
func HasPorts(p uint8) bool {
	return p == ProtoTCP || p == ProtoUDP || p == ProtoSCTP
}

// EndReason is the IPFIX flowEndReason (IANA element 136). Its values are the
// IANA ones, so they travel unchanged through IPFIX and into ClickHouse.
type EndReason uint8

const (
	EndReasonUnknown         EndReason = 0 // not ended or not reported
	EndReasonIdleTimeout     EndReason = 1 // no packets for the idle timeout
	EndReasonActiveTimeout   EndReason = 2 // periodic export of a live flow
	EndReasonEndOfFlow       EndReason = 3 // the connection ended (FIN/RST, conntrack DESTROY)
	EndReasonForcedEnd       EndReason = 4 // exporter shut down or flushed
	EndReasonLackOfResources EndReason = 5 // connection store full: exported untracked
)

var endReasonNames = []string{"unknown", "idle_timeout", "active_timeout", "end_of_flow", "forced_end", "lack_of_resources"}

// String returns the snake_case name used in the ClickHouse Enum.
func (r EndReason) String() string { return enumName(endReasonNames, r) }

// enumName returns names[v], or names[0] (unknown, none) for a value
// without a name.
func enumName[T ~uint8](names []string, v T) string {
	if int(v) < len(names) {
		return names[v]
	}
	return names[0]
}

// FlowType says where the two ends of a flow are, relative to the cluster.
// The values match Antrea's flowType element (PEN 56506, id 137).
type FlowType uint8

const (
	FlowTypeUnknown      FlowType = 0
	FlowTypeIntraNode    FlowType = 1 // both pods on the same node
	FlowTypeInterNode    FlowType = 2 // pods on two different nodes
	FlowTypeToExternal   FlowType = 3 // pod to an address outside the cluster
	FlowTypeFromExternal FlowType = 4 // outside address to a pod or service
)

var flowTypeNames = []string{"unknown", "intra_node", "inter_node", "to_external", "from_external"}

func (t FlowType) String() string { return enumName(flowTypeNames, t) }

// Verdict is a NetworkPolicy decision for one side (ingress or egress) of a
// flow.
type Verdict uint8

const (
	VerdictUnknown     Verdict = 0 // not evaluated or not reported
	VerdictNotIsolated Verdict = 1 // no policy selects the pod for this direction: allowed by default
	VerdictAllowed     Verdict = 2 // a policy selects the pod and a rule allows the flow
	VerdictDenied      Verdict = 3 // isolated and no rule allows it (dropped)
	VerdictRejected    Verdict = 4 // denied with a reject (RST / ICMP unreachable)
)

var verdictNames = []string{"unknown", "not_isolated", "allowed", "denied", "rejected"}

func (v Verdict) String() string { return enumName(verdictNames, v) }

// Correlation says whether a record merges the two node halves of a connection.
type Correlation uint8

const (
	CorrelationNone       Correlation = 0 // not subject to correlation (intra-node, external)
	CorrelationMerged     Correlation = 1 // both halves seen and merged
	CorrelationSourceOnly Correlation = 2 // only the source node's half arrived in time
	CorrelationDestOnly   Correlation = 3 // only the destination node's half arrived in time
)

var correlationNames = []string{"none", "merged", "source_only", "destination_only"}

func (c Correlation) String() string { return enumName(correlationNames, c) }

// Endpoint is the Kubernetes identity of one end of a flow, filled by the
// collector's enrichment. Zero values mean "not known" (for example an
// address outside the cluster).
type Endpoint struct {
	PodNamespace string // column {src,dst}_pod_namespace
	PodName      string // column {src,dst}_pod_name
	// WorkloadKind is Deployment, StatefulSet, DaemonSet, Job, CronJob,
	// ReplicaSet or Pod (a bare pod). Column {src,dst}_workload_kind.
	WorkloadKind string
	WorkloadName string // column {src,dst}_workload_name
	NodeName     string // node the pod runs on (or the node itself for host-network); column {src,dst}_node
	Zone         string // topology.kubernetes.io/zone of the node; column {src,dst}_zone
	// Labels of the pod, key=value. Column {src,dst}_pod_labels (Map).
	// Read-only once set: enrichment shares one map between the pods that
	// have the same labels, and the writer remembers a map's encoding by
	// identity. Replace the map to change a record's labels.
	Labels map[string]string
	// PodAddrs are the pod's addresses, of every family, as enrichment
	// knows them (read-only: shared with its view). Not a column: the
	// auditor evaluates a connection over the other family with them.
	PodAddrs []netip.Addr
}

// Service is the Kubernetes Service a flow was addressed to.
type Service struct {
	Namespace string // column dst_service_namespace
	Name      string // column dst_service_name
	PortName  string // column dst_service_port_name
}

// Policy names the NetworkPolicy rule that decided one side of a flow.
type Policy struct {
	Namespace string // column {ingress,egress}_policy_namespace
	Name      string // column {ingress,egress}_policy_name
	// Rule is the index of the rule within the policy's ingress or egress
	// list, or -1 when no rule applies (default deny, not isolated). It is
	// stored as -1 whenever Name is empty. Column {ingress,egress}_policy_rule.
	Rule    int32
	Verdict Verdict // column {ingress,egress}_verdict
	// ReportedVerdict is the verdict reported by the datapath (our OVS
	// source's denied records, or Antrea's policy elements), if any.
	// Column {ingress,egress}_reported_verdict.
	ReportedVerdict Verdict
	// ReportedName is the "namespace/name" (or rule id) the datapath reported.
	// Column {ingress,egress}_reported_policy.
	ReportedName string
}

// Record is one exported observation of a connection: a whole short flow, or
// one active-timeout slice of a long one. Counter totals are cumulative since
// the connection started; deltas are what happened since the previous record
// of the same connection, so summing deltas never double counts.
type Record struct {
	// Time
	FlowStart    time.Time // first packet (conntrack start timestamp); column flow_start
	FlowEnd      time.Time // last packet seen or export time; column flow_end
	TimeReceived time.Time // when the collector received it; column time_received

	// Connection. Src/Dst are the actual ends: Dst is the endpoint after DNAT.
	SrcAddr   netip.Addr // column src_ip
	DstAddr   netip.Addr // column dst_ip
	SrcPort   uint16     // column src_port; ICMP/ICMPv6: the echo identifier (0 for other types)
	DstPort   uint16     // column dst_port; ICMP/ICMPv6: type<<8|code
	Proto     uint8      // IANA protocol number; column protocol
	IPVersion uint8      // 4 or 6; column ip_version

	// ServiceAddr is the original destination when the connection was
	// DNAT-ed (a Service VIP), zero otherwise. Column service_ip.
	ServiceAddr netip.Addr
	ServicePort uint16 // column service_port
	// SNATAddr is the translated source when the connection was SNAT-ed
	// (masquerade), zero otherwise. Column snat_ip.
	SNATAddr netip.Addr
	SNATPort uint16 // column snat_port

	// Forward (src→dst) and reverse (dst→src, RFC 5103) counters.
	Packets             uint64 // column packets_total
	Bytes               uint64 // column bytes_total
	ReversePackets      uint64 // column reverse_packets_total
	ReverseBytes        uint64 // column reverse_bytes_total
	PacketsDelta        uint64 // column packets
	BytesDelta          uint64 // column bytes
	ReversePacketsDelta uint64 // column reverse_packets
	ReverseBytesDelta   uint64 // column reverse_bytes

	EndReason EndReason // column end_reason
	TCPState  string    // conntrack TCP state (ESTABLISHED, TIME_WAIT, …); column tcp_state
	Zone      uint16    // conntrack zone; column ct_zone
	Mark      uint32    // conntrack mark; column ct_mark

	// Exporter identity.
	ExporterAddr        netip.Addr // IPFIX exporter address; column exporter_ip
	ObservationDomainID uint32     // column observation_domain_id
	ExporterNode        string     // node name reported by the exporter; column exporter_node
	Source              string     // conntrack, ovs, ipfix (foreign exporter); column source

	// Kubernetes metadata (collector enrichment).
	Src     Endpoint // columns src_*
	Dst     Endpoint // columns dst_*
	Service Service  // columns dst_service_*
	Type    FlowType // column flow_type
	// K8sViewStale: the record was enriched while the collector's view of
	// the Kubernetes API was stale (a watched kind had no open watch for
	// a few seconds); its names may be out of date. Column k8s_view_stale.
	K8sViewStale bool

	// ProbeTraceID is the id of the traceflow trace whose probe packet
	// this record is ("tf-…"), set by the collector when the probe was
	// sent by its own trace controller; empty for ordinary traffic.
	// Column probe_trace_id.
	ProbeTraceID string

	// Correlation of the two node halves.
	Correlation Correlation // column correlation

	// Policy auditing.
	Ingress Policy // columns ingress_*
	Egress  Policy // columns egress_*
	// DualStackGap: the auditor found that the policies in force decide
	// this connection the other way over the other family of its two
	// dual-stack pods (allowed over one, denied over the other). Set on a
	// connection's first record only, for the flow metrics; not a column.
	DualStackGap bool

	// Journal is collector bookkeeping, not a column: the write-ahead log
	// frames holding the received records this one was made from.
	Journal JournalRefs
}

// JournalRefs names the write-ahead log records a record stands for: one
// for a received record, more once the correlator merged halves or
// coalesced updates into it. Each is a reference the log gave the received
// record (its frame and index, wal.Ref). The collector acknowledges them
// when the record is durable (in ClickHouse or the spool). Zero means not
// journaled.
type JournalRefs struct {
	Frame, Frame2 uint64   // the first two references; 0 when unused
	More          []uint64 // the rest (rare: coalesced updates)
}

// Absorb adds o's frames to j, for a record made from both.
func (j *JournalRefs) Absorb(o JournalRefs) {
	j.add(o.Frame)
	j.add(o.Frame2)
	for _, f := range o.More {
		j.add(f)
	}
}

func (j *JournalRefs) add(f uint64) {
	switch {
	case f == 0:
	case j.Frame == 0:
		j.Frame = f
	case j.Frame2 == 0:
		j.Frame2 = f
	default:
		j.More = append(j.More, f)
	}
}

// All appends j's frames to dst and returns it.
func (j *JournalRefs) All(dst []uint64) []uint64 {
	if j.Frame != 0 {
		dst = append(dst, j.Frame)
	}
	if j.Frame2 != 0 {
		dst = append(dst, j.Frame2)
	}
	return append(dst, j.More...)
}

// Tuple returns the record's connection tuple.
func (r *Record) Tuple() Tuple {
	return Tuple{Src: r.SrcAddr, Dst: r.DstAddr, Proto: r.Proto, SrcPort: r.SrcPort, DstPort: r.DstPort}
}

// Normalize unmaps every address and sets IPVersion from SrcAddr. Call it at
// ingress; later stages may rely on addresses being unmapped.
func (r *Record) Normalize() {
	r.SrcAddr = r.SrcAddr.Unmap()
	r.DstAddr = r.DstAddr.Unmap()
	r.ServiceAddr = r.ServiceAddr.Unmap()
	r.SNATAddr = r.SNATAddr.Unmap()
	r.ExporterAddr = r.ExporterAddr.Unmap()
	r.IPVersion = Version(r.SrcAddr)
}

// VerdictMismatch reports whether a datapath-reported verdict disagrees with
// the evaluated one on either side. Column verdict_mismatch.
func (r *Record) VerdictMismatch() bool {
	return mismatch(r.Ingress) || mismatch(r.Egress)
}

func mismatch(p Policy) bool {
	if p.ReportedVerdict == VerdictUnknown || p.Verdict == VerdictUnknown {
		return false
	}
	return p.ReportedVerdict.Blocked() != p.Verdict.Blocked()
}

// First reports whether r is its connection's first record: its packet
// total equals its delta (the first slice of a long connection, or a whole
// short one). The flow metrics count connections, and the auditor checks
// them, there.
func (r *Record) First() bool { return r.Packets == r.PacketsDelta }

// Blocked reports whether v denied or rejected the flow.
func (v Verdict) Blocked() bool { return v == VerdictDenied || v == VerdictRejected }
