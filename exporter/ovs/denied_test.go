package ovs

import (
	"net/netip"
	"testing"
	"time"

	"github.com/dualflow/dualflow/flow"
	"github.com/dualflow/dualflow/ovs"
)

// TestDeniedTable aggregates packet-ins into one record per denied flow,
// exported once idle, naming the drop rule, with the Service address when
// DNAT happened before the drop.
func TestDeniedTable(t *testing.T) {
	rules, _ := ovs.NewRules([]ovs.Rule{{ID: 7, Kind: ovs.KindDrop, Name: "drop/egress/tools/probe-1", Direction: "egress"}})
	tbl := newDeniedTable(time.Second, time.Minute, 10)
	t0 := time.Unix(1000, 0)
	for i, tc := range []struct {
		src, dst, svc string
	}{
		{"198.18.1.12", "198.18.2.10", ""},
		{"fd00:10:0:1::12", "fd00:10:0:1::11", "fd00:10:ff::11"},
	} {
		pi := ovs.PacketIn{Cookie: ovs.Cookie(ovs.KindDrop, 7), TotalLen: 74, CTZone: 1,
			Tuple: flow.Tuple{Src: netip.MustParseAddr(tc.src), Dst: netip.MustParseAddr(tc.dst), Proto: flow.ProtoTCP, SrcPort: 4000, DstPort: 8080}}
		if tc.svc != "" {
			pi.CTOrig = flow.Tuple{Src: pi.Tuple.Src, Dst: netip.MustParseAddr(tc.svc), Proto: flow.ProtoTCP, SrcPort: 4000, DstPort: 80}
		}
		tbl.add(&pi, t0)
		tbl.add(&pi, t0.Add(time.Duration(i+1)*100*time.Millisecond)) // a retransmission
	}
	if recs := tbl.expire(t0.Add(500*time.Millisecond), false, rules, nil); len(recs) != 0 {
		t.Fatalf("records before idle: %+v", recs)
	}
	recs := tbl.expire(t0.Add(2*time.Second), false, rules, nil)
	if len(recs) != 2 {
		t.Fatalf("%d records, want 2", len(recs))
	}
	for _, r := range recs {
		if r.Egress.ReportedVerdict != flow.VerdictDenied || r.Egress.ReportedName != "drop/egress/tools/probe-1" ||
			r.Packets != 2 || r.Bytes != 120 || r.PacketsDelta != 2 || r.EndReason != flow.EndReasonIdleTimeout || r.Source != SourceName {
			t.Errorf("record %+v", r)
		}
		if r.IPVersion == 6 && (r.ServiceAddr != netip.MustParseAddr("fd00:10:ff::11") || r.ServicePort != 80) {
			t.Errorf("ipv6 record: service %v:%d", r.ServiceAddr, r.ServicePort)
		}
		if r.IPVersion == 4 && r.ServiceAddr.IsValid() {
			t.Errorf("ipv4 record: service %v", r.ServiceAddr)
		}
	}
	if len(tbl.flows) != 0 {
		t.Errorf("%d flows left", len(tbl.flows))
	}
}
