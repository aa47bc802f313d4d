// Package ipfix is the IPFIX (RFC 7011) information-element mapping of
// flow.Record. The exporter encodes with it and the collector decodes with
// it, so both ends share one definition of which element carries which field.
//
// The mapping follows Antrea's flow exporter where Antrea has an element, so
// Antrea's flow aggregator, Theia and go-ipfix based tools read our records,
// and our collector reads Antrea's:
//
//   - sourceIPv4Address/sourceIPv6Address and sourceTransportPort are the
//     client (the original source of the connection).
//   - destinationIPv4Address/destinationIPv6Address and
//     destinationTransportPort are the endpoint actually reached, that is the
//     source of the reply tuple after DNAT (Antrea's convention, not IANA's
//     pre-NAT reading).
//   - destinationClusterIPv4/IPv6 and destinationServicePort (Antrea, PEN
//     56506) are the original destination when the connection was DNAT-ed
//     (a Service VIP); 0.0.0.0 / :: and 0 otherwise.
//   - postNATSourceIPv4Address/IPv6Address and postNAPTSourceTransportPort
//     (IANA 225/281/227) are the translated source when the connection was
//     SNAT-ed (masquerade); 0.0.0.0 / :: and 0 otherwise.
//   - packet/octet Total and Delta counts are the forward direction; the RFC
//     5103 reverse elements (PEN 29305) the reply direction.
//   - For ICMP and ICMPv6, destinationTransportPort is type<<8|code (the
//     NetFlow convention) and so is icmpTypeCodeIPv4/IPv6 (IANA 32/139,
//     0 for other protocols), which nfdump and other IANA collectors read;
//     sourceTransportPort is the echo identifier, except that it is 0 when
//     type and code are both 0 (an IPv4 echo reply): nfdump 1.7 shows a
//     nonzero sourceTransportPort as the type.code when icmpTypeCode is 0.
//   - observationDomainName (IANA 300) is the exporting node's name.
//   - ingress/egressNetworkPolicyRuleAction and ingress/egressNetworkPolicyName
//     (Antrea 139/140, 110/112) carry a verdict the datapath itself reported
//     (flow.Policy.ReportedVerdict and ReportedName), such as the OVS source's
//     denied records naming their drop rule; the namespace elements stay
//     unset, so the name travels whole.
//
// Conntrack zone, mark and the record's source have no IANA or Antrea
// element; they travel as dualflow elements under EnterpriseDualflow.
//
// There is one template per IP family (Elements(4), Elements(6)). An unset
// address travels as 0.0.0.0 or :: and decodes back to the zero netip.Addr; a
// zero time travels as 0 and decodes back to the zero time.Time.
package ipfix

import "github.com/vmware/go-ipfix/pkg/entities"

// Private enterprise numbers of the elements used here.
const (
	EnterpriseIANA    uint32 = 0
	EnterpriseReverse uint32 = 29305 // RFC 5103 reverse information elements
	EnterpriseAntrea  uint32 = 56506 // Antrea (go-ipfix registry_antrea)
	// EnterpriseDualflow carries the elements neither IANA nor Antrea
	// define (conntrack zone and mark, record source). dualflow has no PEN
	// of its own yet: 32473 is the number RFC 5612 reserves for
	// documentation, so it collides with no vendor's elements. Change it
	// here, in one place, once a PEN is registered.
	EnterpriseDualflow uint32 = 32473
)

// VariableLength is the template length of variable-length elements
// (strings), RFC 7011 section 7.
const VariableLength = entities.VariableLength

// Element is one information element of a template.
type Element struct {
	Name       string
	Enterprise uint32
	ID         uint16
	Type       entities.IEDataType
	Length     uint16 // VariableLength for strings
}

// InfoElement returns the go-ipfix form of e.
func (e Element) InfoElement() *entities.InfoElement {
	return entities.NewInfoElement(e.Name, e.ID, e.Type, e.Enterprise, e.Length)
}

type key struct {
	ent uint32
	id  uint16
}

func (e Element) key() key { return key{e.Enterprise, e.ID} }

// IANA elements.
var (
	ieOctetDelta      = Element{"octetDeltaCount", EnterpriseIANA, 1, entities.Unsigned64, 8}
	iePacketDelta     = Element{"packetDeltaCount", EnterpriseIANA, 2, entities.Unsigned64, 8}
	ieProto           = Element{"protocolIdentifier", EnterpriseIANA, 4, entities.Unsigned8, 1}
	ieSrcPort         = Element{"sourceTransportPort", EnterpriseIANA, 7, entities.Unsigned16, 2}
	ieSrc4            = Element{"sourceIPv4Address", EnterpriseIANA, 8, entities.Ipv4Address, 4}
	ieDstPort         = Element{"destinationTransportPort", EnterpriseIANA, 11, entities.Unsigned16, 2}
	ieDst4            = Element{"destinationIPv4Address", EnterpriseIANA, 12, entities.Ipv4Address, 4}
	ieSrc6            = Element{"sourceIPv6Address", EnterpriseIANA, 27, entities.Ipv6Address, 16}
	ieDst6            = Element{"destinationIPv6Address", EnterpriseIANA, 28, entities.Ipv6Address, 16}
	ieICMPTypeCode4   = Element{"icmpTypeCodeIPv4", EnterpriseIANA, 32, entities.Unsigned16, 2}
	ieOctetTotal      = Element{"octetTotalCount", EnterpriseIANA, 85, entities.Unsigned64, 8}
	iePacketTotal     = Element{"packetTotalCount", EnterpriseIANA, 86, entities.Unsigned64, 8}
	ieEndReason       = Element{"flowEndReason", EnterpriseIANA, 136, entities.Unsigned8, 1}
	ieICMPTypeCode6   = Element{"icmpTypeCodeIPv6", EnterpriseIANA, 139, entities.Unsigned16, 2}
	ieStartSec        = Element{"flowStartSeconds", EnterpriseIANA, 150, entities.DateTimeSeconds, 4}
	ieEndSec          = Element{"flowEndSeconds", EnterpriseIANA, 151, entities.DateTimeSeconds, 4}
	ieStartMs         = Element{"flowStartMilliseconds", EnterpriseIANA, 152, entities.DateTimeMilliseconds, 8}
	ieEndMs           = Element{"flowEndMilliseconds", EnterpriseIANA, 153, entities.DateTimeMilliseconds, 8}
	iePostNATSrc4     = Element{"postNATSourceIPv4Address", EnterpriseIANA, 225, entities.Ipv4Address, 4}
	iePostNAPTSrcPort = Element{"postNAPTSourceTransportPort", EnterpriseIANA, 227, entities.Unsigned16, 2}
	iePostNATSrc6     = Element{"postNATSourceIPv6Address", EnterpriseIANA, 281, entities.Ipv6Address, 16}
	ieObsDomainName   = Element{"observationDomainName", EnterpriseIANA, 300, entities.String, VariableLength}
	ieRevOctetDelta   = Element{"reverseOctetDeltaCount", EnterpriseReverse, 1, entities.Unsigned64, 8}
	ieRevPacketDelta  = Element{"reversePacketDeltaCount", EnterpriseReverse, 2, entities.Unsigned64, 8}
	ieRevOctetTotal   = Element{"reverseOctetTotalCount", EnterpriseReverse, 85, entities.Unsigned64, 8}
	ieRevPacketTotal  = Element{"reversePacketTotalCount", EnterpriseReverse, 86, entities.Unsigned64, 8}
	ieSrcPodNamespace = Element{"sourcePodNamespace", EnterpriseAntrea, 100, entities.String, VariableLength}
	ieSrcPodName      = Element{"sourcePodName", EnterpriseAntrea, 101, entities.String, VariableLength}
	ieDstPodNamespace = Element{"destinationPodNamespace", EnterpriseAntrea, 102, entities.String, VariableLength}
	ieDstPodName      = Element{"destinationPodName", EnterpriseAntrea, 103, entities.String, VariableLength}
	ieSrcNodeName     = Element{"sourceNodeName", EnterpriseAntrea, 104, entities.String, VariableLength}
	ieDstNodeName     = Element{"destinationNodeName", EnterpriseAntrea, 105, entities.String, VariableLength}
	ieClusterIP4      = Element{"destinationClusterIPv4", EnterpriseAntrea, 106, entities.Ipv4Address, 4}
	ieClusterIP6      = Element{"destinationClusterIPv6", EnterpriseAntrea, 107, entities.Ipv6Address, 16}
	ieServicePort     = Element{"destinationServicePort", EnterpriseAntrea, 108, entities.Unsigned16, 2}
	ieServicePortName = Element{"destinationServicePortName", EnterpriseAntrea, 109, entities.String, VariableLength}
	ieIngressPolicy   = Element{"ingressNetworkPolicyName", EnterpriseAntrea, 110, entities.String, VariableLength}
	ieIngressPolicyNS = Element{"ingressNetworkPolicyNamespace", EnterpriseAntrea, 111, entities.String, VariableLength}
	ieEgressPolicy    = Element{"egressNetworkPolicyName", EnterpriseAntrea, 112, entities.String, VariableLength}
	ieEgressPolicyNS  = Element{"egressNetworkPolicyNamespace", EnterpriseAntrea, 113, entities.String, VariableLength}
	ieTCPState        = Element{"tcpState", EnterpriseAntrea, 136, entities.String, VariableLength}
	ieFlowType        = Element{"flowType", EnterpriseAntrea, 137, entities.Unsigned8, 1}
	ieIngressAction   = Element{"ingressNetworkPolicyRuleAction", EnterpriseAntrea, 139, entities.Unsigned8, 1}
	ieEgressAction    = Element{"egressNetworkPolicyRuleAction", EnterpriseAntrea, 140, entities.Unsigned8, 1}
	ieServiceIP4      = Element{"destinationServiceIPv4", EnterpriseAntrea, 168, entities.Ipv4Address, 4}
	ieServiceIP6      = Element{"destinationServiceIPv6", EnterpriseAntrea, 169, entities.Ipv6Address, 16}
	ieProxySNAT4      = Element{"proxySnatIPv4", EnterpriseAntrea, 170, entities.Ipv4Address, 4}
	ieProxySNAT6      = Element{"proxySnatIPv6", EnterpriseAntrea, 171, entities.Ipv6Address, 16}
	ieProxySNATPort   = Element{"proxySnatPort", EnterpriseAntrea, 172, entities.Unsigned16, 2}
	ieConntrackZone   = Element{"conntrackZone", EnterpriseDualflow, 1, entities.Unsigned16, 2}
	ieConntrackMark   = Element{"conntrackMark", EnterpriseDualflow, 2, entities.Unsigned32, 4}
	ieDualflowSource  = Element{"dualflowSource", EnterpriseDualflow, 3, entities.String, VariableLength}
)

// template4 and template6 are the element lists of the two templates, in
// wire order. Fixed-size elements first, strings last; the families differ
// only in their address elements.
var (
	template4 = template(ieSrc4, ieDst4, ieICMPTypeCode4, iePostNATSrc4, ieClusterIP4)
	template6 = template(ieSrc6, ieDst6, ieICMPTypeCode6, iePostNATSrc6, ieClusterIP6)
)

func template(src, dst, icmpTypeCode, postNATSrc, clusterIP Element) []Element {
	return []Element{
		ieStartMs, ieEndMs, ieEndReason,
		src, dst, ieSrcPort, ieDstPort, ieProto, icmpTypeCode,
		iePacketTotal, ieOctetTotal, iePacketDelta, ieOctetDelta,
		ieRevPacketTotal, ieRevOctetTotal, ieRevPacketDelta, ieRevOctetDelta,
		postNATSrc, iePostNAPTSrcPort, clusterIP, ieServicePort,
		ieFlowType, ieConntrackZone, ieConntrackMark, ieIngressAction, ieEgressAction,
		ieTCPState, ieSrcNodeName, ieDstNodeName, ieObsDomainName, ieDualflowSource,
		ieIngressPolicy, ieEgressPolicy,
	}
}

// Elements returns the template element list for IP version 4 or 6, in wire
// order, or nil for another version. The slice is a copy.
func Elements(version uint8) []Element {
	switch version {
	case 4:
		return append([]Element(nil), template4...)
	case 6:
		return append([]Element(nil), template6...)
	}
	return nil
}
