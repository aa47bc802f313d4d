package ovs

import (
	"time"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/ovs"
)

// ethHeaderLen is the Ethernet header of an untagged frame. OpenFlow and
// packet-ins count frame bytes; conntrack counts IP bytes, so the OVS
// source subtracts this per packet to report the same unit as the
// kernel source.
const ethHeaderLen = 14

// deniedKey identifies one denied flow: its tuple as dropped and the drop
// rule's cookie.
type deniedKey struct {
	tuple  flow.Tuple
	cookie uint64
}

type deniedFlow struct {
	first, last      time.Time
	packets, bytes   uint64
	exported         bool // a record was already exported; the next one carries deltas
	basePkts, baseBy uint64
	service          flow.Tuple // CT original tuple when DNAT happened before the drop
	zone             uint16
	icmpType         uint8
}

// deniedTable aggregates dropped packets (packet-ins of drop flows) into
// one record per denied flow. A flow is exported when no drop was seen
// for idle, or every active while drops go on (each record carrying the
// deltas since the previous one). It is not safe for concurrent use.
type deniedTable struct {
	idle, active time.Duration
	max          int // bound on tracked flows; beyond it new flows are counted and dropped
	flows        map[deniedKey]*deniedFlow
	overflow     uint64
}

func newDeniedTable(idle, active time.Duration, max int) *deniedTable {
	return &deniedTable{idle: idle, active: active, max: max, flows: map[deniedKey]*deniedFlow{}}
}

// add records one dropped packet seen at now.
func (d *deniedTable) add(pi *ovs.PacketIn, now time.Time) {
	k := deniedKey{pi.Tuple, pi.Cookie}
	f, ok := d.flows[k]
	if !ok {
		if len(d.flows) >= d.max {
			d.overflow++
			return
		}
		f = &deniedFlow{first: now, zone: pi.CTZone, icmpType: pi.ICMPType}
		if pi.CTOrig.Dst.IsValid() && (pi.CTOrig.Dst != pi.Tuple.Dst || pi.CTOrig.DstPort != pi.Tuple.DstPort) &&
			pi.CTOrig.Src == pi.Tuple.Src {
			f.service = pi.CTOrig
		}
		d.flows[k] = f
	}
	f.last = now
	f.packets++
	if pi.TotalLen > ethHeaderLen {
		f.bytes += uint64(pi.TotalLen - ethHeaderLen)
	}
}

// expire appends the records due at now (all of them when force is set,
// with reason forced end) and returns the extended slice.
func (d *deniedTable) expire(now time.Time, force bool, rules *ovs.Rules, out []flow.Record) []flow.Record {
	for k, f := range d.flows {
		var reason flow.EndReason
		switch {
		case force:
			reason = flow.EndReasonForcedEnd
		case now.Sub(f.last) >= d.idle:
			reason = flow.EndReasonIdleTimeout
		case now.Sub(f.first) >= d.active && f.packets > f.basePkts:
			reason = flow.EndReasonActiveTimeout
		default:
			continue
		}
		if f.packets > f.basePkts || !f.exported {
			out = append(out, f.record(k, reason, rules))
		}
		if reason == flow.EndReasonActiveTimeout {
			f.basePkts, f.baseBy, f.exported, f.first = f.packets, f.bytes, true, now
			continue
		}
		delete(d.flows, k)
	}
	return out
}

func (f *deniedFlow) record(k deniedKey, reason flow.EndReason, rules *ovs.Rules) flow.Record {
	t := k.tuple
	r := flow.Record{
		FlowStart: f.first, FlowEnd: f.last,
		SrcAddr: t.Src, DstAddr: t.Dst, SrcPort: t.SrcPort, DstPort: t.DstPort, Proto: t.Proto,
		Packets: f.packets, Bytes: f.bytes,
		PacketsDelta: f.packets - f.basePkts, BytesDelta: f.bytes - f.baseBy,
		EndReason: reason, Zone: f.zone, Source: SourceName,
	}
	if f.service.Dst.IsValid() {
		r.ServiceAddr, r.ServicePort = f.service.Dst, f.service.DstPort
	}
	r.Normalize()
	_, id, _ := ovs.SplitCookie(k.cookie)
	p := flow.Policy{Rule: -1, ReportedVerdict: flow.VerdictDenied, ReportedName: rules.ReportedName(id)}
	if x, ok := rules.Lookup(id); ok && x.Direction == "egress" {
		r.Egress = p
	} else {
		r.Ingress = p
	}
	return r
}
