// Package conntrack reads the kernel's connection tracking table over
// netlink (github.com/ti-mo/conntrack) and turns its entries into
// connstore.Conn observations: periodic dumps per IP family (and zone), and
// NEW/DESTROY events so that connections shorter than the poll interval are
// not missed. The table may be that of another network namespace (by name or
// path) while the process stays in its own.
//
// Events are best effort: under bursts the kernel drops them and Listen
// returns ErrEventsLost; periodic dumps reconcile (connstore.Store.Sweep).
//
// Counters and start times come from nf_conntrack_acct and
// nf_conntrack_timestamp, two per-namespace sysctls that are off by default;
// Source.Accounting reads them in the target namespace.
package conntrack

import (
	"errors"
	"fmt"
	"slices"
)

// Config selects the table to read.
type Config struct {
	// NetNS is the network namespace whose table is read: a name under
	// /run/netns, or a path (anything containing a slash, e.g.
	// /proc/1234/ns/net). Empty reads the process's own namespace.
	NetNS string
	// IPv4 and IPv6 enable each family, for dumps and events.
	IPv4, IPv6 bool
	// Zones restricts dumps and events to these conntrack zones; empty
	// means every zone. Kernel-side zone filtering needs Linux 6.8.
	Zones []uint16
	// ReadBuffer is the receive buffer of the event socket in bytes (0:
	// the system default). The kernel caps it at net.core.rmem_max; a
	// bigger buffer loses fewer events in bursts.
	ReadBuffer int
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if !c.IPv4 && !c.IPv6 {
		return errors.New("conntrack: neither IPv4 nor IPv6 enabled")
	}
	return nil
}

// Versions returns the enabled IP versions (4, 6).
func (c Config) Versions() []uint8 {
	var v []uint8
	if c.IPv4 {
		v = append(v, 4)
	}
	if c.IPv6 {
		v = append(v, 6)
	}
	return v
}

// wants reports whether an entry of IP version v in zone z is selected.
func (c Config) wants(v uint8, z uint16) bool {
	if (v == 4 && !c.IPv4) || (v == 6 && !c.IPv6) || v == 0 {
		return false
	}
	return len(c.Zones) == 0 || slices.Contains(c.Zones, z)
}

// ErrEventsLost is returned by Listen when the kernel dropped events
// because the socket buffer was full (ENOBUFS). Reconcile with a dump and
// listen again.
var ErrEventsLost = errors.New("conntrack events lost (ENOBUFS)")

// Accounting is the state of the sysctls the exporter depends on, read in
// the source's namespace.
type Accounting struct {
	Acct      bool // net.netfilter.nf_conntrack_acct: packet and byte counters
	Timestamp bool // net.netfilter.nf_conntrack_timestamp: start (and stop) times
	// Events is net.netfilter.nf_conntrack_events != 0: NEW/DESTROY events
	// are delivered.
	Events bool
}

// Err returns an error naming the missing features, or nil when counters,
// timestamps and events are all on.
func (a Accounting) Err() error {
	var off []string
	if !a.Acct {
		off = append(off, "nf_conntrack_acct=0 (no packet/byte counters)")
	}
	if !a.Timestamp {
		off = append(off, "nf_conntrack_timestamp=0 (no flow start times)")
	}
	if !a.Events {
		off = append(off, "nf_conntrack_events=0 (no NEW/DESTROY events: short flows are missed)")
	}
	if len(off) == 0 {
		return nil
	}
	return fmt.Errorf("conntrack sysctls off in the target netns: %v; set them with sysctl -w net.netfilter.<name>=1 in that netns before traffic starts", off)
}

// tcpStates are the kernel's enum tcp_conntrack names, as conntrack -L
// prints them.
var tcpStates = [...]string{"NONE", "SYN_SENT", "SYN_RECV", "ESTABLISHED", "FIN_WAIT", "CLOSE_WAIT", "LAST_ACK", "TIME_WAIT", "CLOSE", "SYN_SENT2"}

// TCPStateName returns the conntrack name of a kernel TCP state.
func TCPStateName(s uint8) string {
	if int(s) < len(tcpStates) {
		return tcpStates[s]
	}
	return "UNKNOWN"
}
