package labtruth

import (
	"context"
	"fmt"

	xovs "github.com/dualflow/dualflow/exporter/ovs"
	"github.com/dualflow/dualflow/lab"
	labovs "github.com/dualflow/dualflow/lab/ovs"
	vswitch "github.com/dualflow/dualflow/ovs"
)

// ovsSnapshot reads node's OVS (conntrack and flows) through
// exporter/ovs, for ground truth.
func ovsSnapshot(l *lab.Lab, node string) (*xovs.Snapshot, error) {
	cfg := xovs.Config{RunDir: l.OVSDir(node), Bridge: labovs.Bridge, RulesFile: l.OVSRulesPath(), IPv4: true, IPv6: true}
	cfg.SetDefaults()
	src, err := xovs.New(cfg, nil)
	if err != nil {
		return nil, err
	}
	return src.Snapshot(context.Background())
}

// ovsConntrack is Conntrack for the OVS datapath: OVS's conntrack (zone
// ovs.Zone) with counters from the learned per-connection flows (IP
// bytes). Start times are unknown (the userspace conntrack has none).
func ovsConntrack(l *lab.Lab, node string) ([]Conn, error) {
	snap, err := ovsSnapshot(l, node)
	if err != nil {
		return nil, fmt.Errorf("conntrack of %s: %w", node, err)
	}
	counters := snap.Counters()
	out := make([]Conn, 0, len(snap.Conns))
	for i := range snap.Conns {
		e := &snap.Conns[i]
		ok, rk := vswitch.CounterKeys(e)
		oc, rc := counters[ok], counters[rk]
		out = append(out, Conn{
			Orig: e.Orig, Reply: e.Reply, ICMPID: e.ICMPID,
			OrigPackets: oc.Packets, OrigBytes: oc.Bytes, ReplyPackets: rc.Packets, ReplyBytes: rc.Bytes,
			DstNAT: e.DstNAT(), SeenReply: rc.Packets > 0, Assured: e.TCPState == "ESTABLISHED" || e.TCPState == "TIME_WAIT",
			Zone: e.Zone, Mark: e.Mark,
		})
	}
	return out, nil
}

// ovsCounters is Counters for the OVS datapath: the packet and byte counts
// of each rule's flows, summed by the rule name the flows' cookie carries
// (the same names as the kernel datapath's nft counters).
func ovsCounters(l *lab.Lab, node string) (map[string]Counter, error) {
	snap, err := ovsSnapshot(l, node)
	if err != nil {
		return nil, fmt.Errorf("counters of %s: %w", node, err)
	}
	list, err := labovs.Rules(l.Manifest)
	if err != nil {
		return nil, err
	}
	rules, err := vswitch.NewRules(list)
	if err != nil {
		return nil, err
	}
	out := map[string]Counter{}
	// Every rule has a counter, hit or not, as with nft's named counters.
	for _, r := range list {
		out[r.Name] = Counter{}
	}
	for _, s := range snap.RuleStats(rules) {
		out[s.Rule.Name] = Counter{Packets: s.Packets, Bytes: s.Bytes}
	}
	return out, nil
}
