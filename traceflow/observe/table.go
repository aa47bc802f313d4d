package observe

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// TablePrefix starts the name of every traceflow table.
const TablePrefix = "dualflow_trace_"

// ErrUnsupported is returned where netlink nftables is not available
// (not Linux).
var ErrUnsupported = errors.New("nftables over netlink: Linux only")

// instance tells this process's tables from another agent's on the same
// node (two agents during a rolling update): 4 random bytes, hex.
var instance = sync.OnceValue(func() string {
	b := make([]byte, 4)
	rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
})

var tableSeq atomic.Uint64

// NewTableName returns a table name for one watch of the probe with tag,
// unique to the call (it never names another watch's table, here or in
// another agent): dualflow_trace_<tag>_<unix seconds>_<instance><seq>.
// Its creation time and instance let a sweep tell a leftover from a live
// table (TableInfo).
func NewTableName(tag uint8, now time.Time) string {
	return fmt.Sprintf("%s%d_%d_%s%d", TablePrefix, tag, now.Unix(), instance(), tableSeq.Add(1))
}

// TableInfo reads a name of NewTableName: when it was made and whether by
// this process. ok is false for any other name (a table of an older
// agent, "dualflow_trace_5").
func TableInfo(name string) (created time.Time, mine, ok bool) {
	rest, found := strings.CutPrefix(name, TablePrefix)
	f := strings.Split(rest, "_")
	if !found || len(f) != 3 {
		return time.Time{}, false, false
	}
	if _, err := strconv.ParseUint(f[0], 10, 8); err != nil {
		return time.Time{}, false, false
	}
	secs, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || len(f[2]) <= 8 {
		return time.Time{}, false, false
	}
	return time.Unix(secs, 0), f[2][:8] == instance(), true
}

// ProbeMatch identifies one probe in nft rules.
type ProbeMatch struct {
	Tag     uint8
	Src     netip.Addr
	Proto   uint8  // 1, 6, 17 or 58
	SrcPort uint16 // or echo id
}

// Chains of a trace table: Pre sees the probe arrive before conntrack and
// DNAT (priority -350, ahead of raw), Post sees it leave after SNAT.
const (
	ChainPre  = "pre"
	ChainPost = "post"
)

// Priorities of the chains (see ChainPre).
const (
	prePriority  = -350
	postPriority = 350
)

// Comments of the rules.
const (
	preComment  = "traceflow probe"
	postComment = "traceflow probe out"
)

// Table is one watch's trace table: its name, and the packets its pre
// chain sets nftrace on and its post chain counts. It is loaded over
// netlink (LoadTable); Text is the same table in nft syntax.
type Table struct {
	Name string
	// Probe is the probe traced, unless Live.
	Probe ProbeMatch
	// Live traces instead the first packet of every new connection of
	// protocol LiveProto from LiveSrc: a TCP SYN without ACK, an echo
	// request, or any UDP datagram.
	Live      bool
	LiveSrc   netip.Addr
	LiveProto uint8
	// Canary is a table with no chain: it traces nothing, and its load
	// proves that `nft monitor` is subscribed when the monitor echoes it.
	Canary bool
}

// ProbeTable is the table named name that traces probe m.
func ProbeTable(name string, m ProbeMatch) Table { return Table{Name: name, Probe: m} }

// LiveTable is the table named name that traces the first packet of
// every new connection of protocol proto from src.
func LiveTable(name string, src netip.Addr, proto uint8) Table {
	return Table{Name: name, Live: true, LiveSrc: src, LiveProto: proto}
}

// CanaryTable is the empty table named name (Table.Canary).
func CanaryTable(name string) Table { return Table{Name: name, Canary: true} }

// l3 is "ip" or "ip6", the family of a's packets.
func l3(a netip.Addr) string {
	if a.Unmap().Is6() {
		return "ip6"
	}
	return "ip"
}

// match is the rules' match in nft syntax.
func (t Table) match() string {
	if t.Live {
		s := fmt.Sprintf("%s saddr %s", l3(t.LiveSrc), t.LiveSrc.Unmap())
		switch t.LiveProto {
		case 6:
			s += " tcp flags & (syn | ack) == syn"
		case 17:
			s += " meta l4proto udp"
		case 1:
			s += " icmp type echo-request"
		case 58:
			s += " icmpv6 type echo-request"
		}
		return s
	}
	m := t.Probe
	s := fmt.Sprintf("%s dscp %d %s saddr %s", l3(m.Src), m.Tag, l3(m.Src), m.Src.Unmap())
	switch m.Proto {
	case 6:
		s += fmt.Sprintf(" tcp sport %d", m.SrcPort)
	case 17:
		s += fmt.Sprintf(" udp sport %d", m.SrcPort)
	case 1:
		s += fmt.Sprintf(" icmp type echo-request icmp id %d", m.SrcPort)
	case 58:
		s += fmt.Sprintf(" icmpv6 type echo-request icmpv6 id %d", m.SrcPort)
	}
	return s
}

// Text returns the table in nft syntax (`nft -f`), as LoadTable programs
// it: for logs, and to check one against the other.
func (t Table) Text() string {
	if t.Canary {
		return "table inet " + t.Name + " {\n}\n"
	}
	return fmt.Sprintf(`table inet %[1]s {
	chain %[2]s {
		type filter hook prerouting priority %[5]d; policy accept;
		%[4]s meta nftrace set 1 comment %[6]q
	}
	chain %[3]s {
		type filter hook postrouting priority %[7]d; policy accept;
		%[4]s counter comment %[8]q
	}
}
`, t.Name, ChainPre, ChainPost, t.match(), prePriority, preComment, postPriority, postComment)
}
