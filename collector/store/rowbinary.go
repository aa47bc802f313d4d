package store

import (
	"encoding/binary"
	"errors"
	"math"
	"net/netip"
	"slices"
	"time"
	"unsafe"

	"github.com/dualflow/dualflow/flow"
)

// FlowsTable is the table flow records are inserted into.
const FlowsTable = "flows"

// FlowColumns lists, in RowBinary order, the columns of the flows table that
// AppendFlowRow encodes. MATERIALIZED columns (protocol_name, src_ip_bin,
// dst_ip_bin) are computed by ClickHouse and are not listed.
var FlowColumns = []string{
	"flow_start", "flow_end", "time_received",
	"ip_version", "src_ip_in", "dst_ip_in", "src_port", "dst_port", "protocol",
	"service_ip_in", "service_port", "snat_ip_in", "snat_port",
	"packets", "bytes", "reverse_packets", "reverse_bytes",
	"packets_total", "bytes_total", "reverse_packets_total", "reverse_bytes_total",
	"end_reason", "tcp_state", "ct_zone", "ct_mark",
	"exporter_ip_in", "observation_domain_id", "exporter_node", "source",
	"src_pod_namespace", "src_pod_name", "src_pod_labels", "src_workload_kind", "src_workload_name", "src_node", "src_zone",
	"dst_pod_namespace", "dst_pod_name", "dst_pod_labels", "dst_workload_kind", "dst_workload_name", "dst_node", "dst_zone",
	"dst_service_namespace", "dst_service_name", "dst_service_port_name",
	"flow_type", "correlation",
	"ingress_policy_namespace", "ingress_policy_name", "ingress_policy_rule", "ingress_verdict", "ingress_reported_verdict", "ingress_reported_policy",
	"egress_policy_namespace", "egress_policy_name", "egress_policy_rule", "egress_verdict", "egress_reported_verdict", "egress_reported_policy",
	"verdict_mismatch",
	"k8s_view_stale", // migration 0006
	"probe_trace_id", // migration 0012
}

// The layouts of batches spooled by an older collector: FlowColumns
// before migration 0006 added k8s_view_stale, and before 0012 added
// probe_trace_id. A spooled batch names its columns; the rows decode by
// their number (decodeFlowRow).
var (
	flowColumnsV5  = FlowColumns[:len(FlowColumns)-2]
	flowColumnsV11 = FlowColumns[:len(FlowColumns)-1]
)

// flowLayout reports whether columns is FlowColumns or an older layout of
// it.
func flowLayout(columns []string) bool {
	return slices.Equal(columns, FlowColumns) || slices.Equal(columns, flowColumnsV11) || slices.Equal(columns, flowColumnsV5)
}

// AppendFlowRow appends r encoded as one RowBinary row of FlowColumns to b
// and returns the extended buffer: the row the writer spools for r. Label
// maps are encoded in key order, so equal records encode to equal bytes.
func AppendFlowRow(b []byte, r *flow.Record) []byte {
	var nb nativeBuilder
	nb.reset(flowWire)
	nb.appendRecord(r, nil)
	b, _ = nb.rowBinary(b, flowWire) // cannot fail: the columns hold one whole row
	return b
}

// labelCache remembers the encoding of label maps by identity. Enrichment
// interns label sets (every pod of a ReplicaSet shares one map), so the
// writer sees the same few maps over and over, and iterating, sorting and
// encoding each was a third of a row's encoding time. A map must not change
// once it is in a record (flow.Endpoint.Labels); a slot keeps its map alive,
// so the address cannot be reused by another map while it is cached. Not
// safe for concurrent use.
type labelCache struct {
	e [1 << 10]labelSlot
}

// labelSlot holds one map's encoding, made when first asked for.
type labelSlot struct {
	m          map[string]string
	n          int    // len(m) when the encoding was made
	keys, vals []byte // the keys and the values as Strings, for Native columns
	hasCols    bool
}

// mapID is the identity of a map: the address of its header.
func mapID(m map[string]string) uintptr { return *(*uintptr)(unsafe.Pointer(&m)) }

// slot returns m's slot, emptied if it held another map.
func (c *labelCache) slot(m map[string]string) *labelSlot {
	id := mapID(m)
	s := &c.e[(id>>4^id>>14)&(1<<10-1)]
	// The length check is a cheap guard against a map changed in place
	// despite the rule above; it cannot catch every change.
	if s.m == nil || mapID(s.m) != id || s.n != len(m) {
		s.m, s.n, s.hasCols = m, len(m), false
	}
	return s
}

// columns returns m's keys and values as appendLabelColumns encodes them.
func (c *labelCache) columns(m map[string]string) (keys, vals []byte) {
	s := c.slot(m)
	if !s.hasCols {
		s.keys, s.vals = appendLabelColumns(s.keys[:0], s.vals[:0], m)
		s.hasCols = true
	}
	return s.keys, s.vals
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// ErrShortRow is returned when a RowBinary buffer ends inside a row.
var ErrShortRow = errors.New("rowbinary: truncated row")

// rowReader decodes RowBinary values written by AppendFlowRow.
type rowReader struct {
	b   []byte
	err error
}

func (r *rowReader) take(n int) []byte {
	if r.err != nil || n < 0 || len(r.b) < n {
		r.err = ErrShortRow
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *rowReader) u8() uint8 {
	if v := r.take(1); v != nil {
		return v[0]
	}
	return 0
}

func (r *rowReader) u16() uint16 {
	if v := r.take(2); v != nil {
		return binary.LittleEndian.Uint16(v)
	}
	return 0
}

func (r *rowReader) u32() uint32 {
	if v := r.take(4); v != nil {
		return binary.LittleEndian.Uint32(v)
	}
	return 0
}

func (r *rowReader) u64() uint64 {
	if v := r.take(8); v != nil {
		return binary.LittleEndian.Uint64(v)
	}
	return 0
}

func (r *rowReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = ErrShortRow
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *rowReader) str() string {
	n := r.uvarint()
	if n > math.MaxInt32 {
		r.err = ErrShortRow
		return ""
	}
	return string(r.take(int(n)))
}

func (r *rowReader) time() time.Time {
	ms := int64(r.u64())
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

func (r *rowReader) addr() netip.Addr {
	v := r.take(16)
	if v == nil || [16]byte(v) == [16]byte{} {
		return netip.Addr{}
	}
	return netip.AddrFrom16([16]byte(v)).Unmap()
}

func (r *rowReader) endpoint(e *flow.Endpoint) {
	e.PodNamespace = r.str()
	e.PodName = r.str()
	n := r.uvarint()
	if n > uint64(len(r.b)) { // each entry takes at least 2 bytes
		r.err = ErrShortRow
		return
	}
	if n > 0 {
		e.Labels = make(map[string]string, n)
		for i := uint64(0); i < n && r.err == nil; i++ {
			k := r.str()
			e.Labels[k] = r.str()
		}
	}
	e.WorkloadKind = r.str()
	e.WorkloadName = r.str()
	e.NodeName = r.str()
	e.Zone = r.str()
}

func (r *rowReader) policy(p *flow.Policy) {
	p.Namespace = r.str()
	p.Name = r.str()
	p.Rule = int32(r.u32())
	p.Verdict = flow.Verdict(r.u8())
	p.ReportedVerdict = flow.Verdict(r.u8())
	p.ReportedName = r.str()
}

// decodeFlowRow decodes one row written by AppendFlowRow, of the first
// columns columns of FlowColumns (the current layout or an older one:
// flowColumnsV5, flowColumnsV11), from b into rec and returns the rest of b.
func decodeFlowRow(b []byte, rec *flow.Record, columns int) ([]byte, error) {
	r := rowReader{b: b}
	*rec = flow.Record{}
	rec.FlowStart = r.time()
	rec.FlowEnd = r.time()
	rec.TimeReceived = r.time()
	rec.IPVersion = r.u8()
	rec.SrcAddr = r.addr()
	rec.DstAddr = r.addr()
	rec.SrcPort = r.u16()
	rec.DstPort = r.u16()
	rec.Proto = r.u8()
	rec.ServiceAddr = r.addr()
	rec.ServicePort = r.u16()
	rec.SNATAddr = r.addr()
	rec.SNATPort = r.u16()
	rec.PacketsDelta = r.u64()
	rec.BytesDelta = r.u64()
	rec.ReversePacketsDelta = r.u64()
	rec.ReverseBytesDelta = r.u64()
	rec.Packets = r.u64()
	rec.Bytes = r.u64()
	rec.ReversePackets = r.u64()
	rec.ReverseBytes = r.u64()
	rec.EndReason = flow.EndReason(r.u8())
	rec.TCPState = r.str()
	rec.Zone = r.u16()
	rec.Mark = r.u32()
	rec.ExporterAddr = r.addr()
	rec.ObservationDomainID = r.u32()
	rec.ExporterNode = r.str()
	rec.Source = r.str()
	r.endpoint(&rec.Src)
	r.endpoint(&rec.Dst)
	rec.Service.Namespace = r.str()
	rec.Service.Name = r.str()
	rec.Service.PortName = r.str()
	rec.Type = flow.FlowType(r.u8())
	rec.Correlation = flow.Correlation(r.u8())
	r.policy(&rec.Ingress)
	r.policy(&rec.Egress)
	r.u8() // verdict_mismatch is derived
	if columns > len(flowColumnsV5) {
		rec.K8sViewStale = r.u8() != 0
	}
	if columns > len(flowColumnsV11) {
		rec.ProbeTraceID = r.str()
	}
	return r.b, r.err
}
