package ipfix

import (
	"strings"

	"github.com/dualflow/dualflow/flow"
)

// SourceForeign is the Record.Source of records from exporters that do not
// send dualflowSource (Antrea, other IPFIX exporters).
const SourceForeign = "ipfix"

// Field names what an element of the shared mapping fills: the collector's
// decoder (collector/ipfix) reads every element the exporter's templates
// carry through it, by (enterprise, id).
type Field uint8

// Fields of the mapping. Each names the flow.Record field filled, or the
// decode input that fills one in combination (seconds fallbacks, policy
// name parts, Antrea rule actions).
const (
	FieldNone                   Field = iota // not in the mapping
	FieldFlowStartMillis                     // FlowStart, unix ms
	FieldFlowEndMillis                       // FlowEnd, unix ms
	FieldFlowStartSeconds                    // FlowStart when no ms element, unix s
	FieldFlowEndSeconds                      // FlowEnd when no ms element, unix s
	FieldEndReason                           // EndReason
	FieldSrcAddr4                            // SrcAddr
	FieldDstAddr4                            // DstAddr
	FieldSrcAddr6                            // SrcAddr
	FieldDstAddr6                            // DstAddr
	FieldSrcPort                             // SrcPort
	FieldDstPort                             // DstPort
	FieldProto                               // Proto
	FieldPackets                             // Packets
	FieldBytes                               // Bytes
	FieldPacketsDelta                        // PacketsDelta
	FieldBytesDelta                          // BytesDelta
	FieldReversePackets                      // ReversePackets
	FieldReverseBytes                        // ReverseBytes
	FieldReversePacketsDelta                 // ReversePacketsDelta
	FieldReverseBytesDelta                   // ReverseBytesDelta
	FieldSNATAddr4                           // SNATAddr (unspecified = none)
	FieldSNATAddr6                           // SNATAddr (unspecified = none)
	FieldSNATPort                            // SNATPort (0 = none)
	FieldServiceAddr4                        // ServiceAddr (unspecified = none)
	FieldServiceAddr6                        // ServiceAddr (unspecified = none)
	FieldServicePort                         // ServicePort (0 = none)
	FieldServicePortName                     // Service, Antrea "namespace/name:port"
	FieldFlowType                            // Type
	FieldZone                                // Zone
	FieldMark                                // Mark
	FieldTCPState                            // TCPState
	FieldSrcNodeName                         // Src.NodeName
	FieldDstNodeName                         // Dst.NodeName
	FieldSrcPodNamespace                     // Src.PodNamespace
	FieldSrcPodName                          // Src.PodName
	FieldDstPodNamespace                     // Dst.PodNamespace
	FieldDstPodName                          // Dst.PodName
	FieldExporterNode                        // ExporterNode (observationDomainName)
	FieldSource                              // Source
	FieldIngressPolicyName                   // Ingress.ReportedName, name part
	FieldIngressPolicyNamespace              // Ingress.ReportedName, namespace part
	FieldEgressPolicyName                    // Egress.ReportedName, name part
	FieldEgressPolicyNamespace               // Egress.ReportedName, namespace part
	FieldIngressAction                       // Ingress.ReportedVerdict (Antrea rule action)
	FieldEgressAction                        // Egress.ReportedVerdict (Antrea rule action)
	NumFields                                // number of Field values
)

var fieldOf = map[key]Field{
	ieStartMs.key():         FieldFlowStartMillis,
	ieEndMs.key():           FieldFlowEndMillis,
	ieStartSec.key():        FieldFlowStartSeconds,
	ieEndSec.key():          FieldFlowEndSeconds,
	ieEndReason.key():       FieldEndReason,
	ieSrc4.key():            FieldSrcAddr4,
	ieDst4.key():            FieldDstAddr4,
	ieSrc6.key():            FieldSrcAddr6,
	ieDst6.key():            FieldDstAddr6,
	ieSrcPort.key():         FieldSrcPort,
	ieDstPort.key():         FieldDstPort,
	ieProto.key():           FieldProto,
	iePacketTotal.key():     FieldPackets,
	ieOctetTotal.key():      FieldBytes,
	iePacketDelta.key():     FieldPacketsDelta,
	ieOctetDelta.key():      FieldBytesDelta,
	ieRevPacketTotal.key():  FieldReversePackets,
	ieRevOctetTotal.key():   FieldReverseBytes,
	ieRevPacketDelta.key():  FieldReversePacketsDelta,
	ieRevOctetDelta.key():   FieldReverseBytesDelta,
	iePostNATSrc4.key():     FieldSNATAddr4,
	iePostNATSrc6.key():     FieldSNATAddr6,
	iePostNAPTSrcPort.key(): FieldSNATPort,
	ieProxySNAT4.key():      FieldSNATAddr4,
	ieProxySNAT6.key():      FieldSNATAddr6,
	ieProxySNATPort.key():   FieldSNATPort,
	ieClusterIP4.key():      FieldServiceAddr4,
	ieClusterIP6.key():      FieldServiceAddr6,
	ieServiceIP4.key():      FieldServiceAddr4,
	ieServiceIP6.key():      FieldServiceAddr6,
	ieServicePort.key():     FieldServicePort,
	ieServicePortName.key(): FieldServicePortName,
	ieFlowType.key():        FieldFlowType,
	ieConntrackZone.key():   FieldZone,
	ieConntrackMark.key():   FieldMark,
	ieTCPState.key():        FieldTCPState,
	ieSrcNodeName.key():     FieldSrcNodeName,
	ieDstNodeName.key():     FieldDstNodeName,
	ieSrcPodNamespace.key(): FieldSrcPodNamespace,
	ieSrcPodName.key():      FieldSrcPodName,
	ieDstPodNamespace.key(): FieldDstPodNamespace,
	ieDstPodName.key():      FieldDstPodName,
	ieObsDomainName.key():   FieldExporterNode,
	ieDualflowSource.key():  FieldSource,
	ieIngressPolicy.key():   FieldIngressPolicyName,
	ieIngressPolicyNS.key(): FieldIngressPolicyNamespace,
	ieEgressPolicy.key():    FieldEgressPolicyName,
	ieEgressPolicyNS.key():  FieldEgressPolicyNamespace,
	ieIngressAction.key():   FieldIngressAction,
	ieEgressAction.key():    FieldEgressAction,
}

// FieldOf returns the Field that element (enterprise, id) fills in the
// shared mapping, or FieldNone. Every element of our templates has a Field,
// except icmpTypeCodeIPv4/IPv6 (IANA 32/139): the collector maps those
// itself, as IANA alternatives that fill DstPort only when
// destinationTransportPort left it 0.
func FieldOf(enterprise uint32, id uint16) Field { return fieldOf[key{enterprise, id}] }

// ParseServicePortName splits Antrea's destinationServicePortName
// ("namespace/name:port").
func ParseServicePortName(s string) flow.Service {
	var svc flow.Service
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		s, svc.PortName = s[:i], s[i+1:]
	}
	if i := strings.IndexByte(s, '/'); i >= 0 {
		svc.Namespace, svc.Name = s[:i], s[i+1:]
	} else {
		svc.Name = s
	}
	return svc
}

// AntreaVerdict maps Antrea's NetworkPolicyRuleAction (0 none, 1 allow,
// 2 drop, 3 reject).
func AntreaVerdict(action uint8) flow.Verdict {
	switch action {
	case 1:
		return flow.VerdictAllowed
	case 2:
		return flow.VerdictDenied
	case 3:
		return flow.VerdictRejected
	}
	return flow.VerdictUnknown
}
