package observe

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"golang.org/x/sys/unix"
)

// Trace tables are programmed over netlink (github.com/google/nftables),
// one batch per load in the node's namespace: no nft process, so a load
// takes a fraction of a millisecond and cannot be killed half-way by a
// timeout, and 128 watches at once cost no 128 processes.

// conn returns an nftables connection in the network namespace at nsPath;
// close releases it once its last Flush or List is done.
func conn(nsPath string) (c *nftables.Conn, close func(), err error) {
	f, err := os.Open(nsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("netns %s: %w", nsPath, err)
	}
	// Not lasting: each Flush dials its own netlink socket in the
	// namespace, so concurrent loads never share a batch.
	c, err = nftables.New(nftables.WithNetNSFd(int(f.Fd())))
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("nftables in %s: %w", nsPath, err)
	}
	return c, func() { f.Close() }, nil
}

// LoadTable creates table t in the namespace at nsPath, or replaces it
// when it exists (the reload of a watch whose monitor missed the first
// load), in one netlink transaction.
func LoadTable(nsPath string, t Table) error {
	c, done, err := conn(nsPath)
	if err != nil {
		return err
	}
	defer done()
	tb := &nftables.Table{Family: nftables.TableFamilyINet, Name: t.Name}
	// As `table X; delete table X; table X {...}`: whether or not it is
	// there, the batch ends with exactly the table below.
	c.AddTable(tb)
	c.DelTable(tb)
	c.AddTable(tb)
	if t.Canary {
		return flush(c, t.Name)
	}
	accept := nftables.ChainPolicyAccept
	pre := c.AddChain(&nftables.Chain{Name: ChainPre, Table: tb, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(prePriority), Policy: &accept})
	post := c.AddChain(&nftables.Chain{Name: ChainPost, Table: tb, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityRef(postPriority), Policy: &accept})
	c.AddRule(&nftables.Rule{Table: tb, Chain: pre, UserData: userdata.AppendString(nil, userdata.TypeComment, preComment),
		Exprs: append(t.exprs(), &expr.Immediate{Register: 1, Data: []byte{1}}, &expr.Meta{Key: expr.MetaKeyNFTRACE, SourceRegister: true, Register: 1})})
	c.AddRule(&nftables.Rule{Table: tb, Chain: post, UserData: userdata.AppendString(nil, userdata.TypeComment, postComment),
		Exprs: append(t.exprs(), &expr.Counter{})})
	return flush(c, t.Name)
}

func flush(c *nftables.Conn, name string) error {
	if err := c.Flush(); err != nil {
		return fmt.Errorf("load table inet %s: %w", name, err)
	}
	return nil
}

// DeleteTable removes table name from the namespace at nsPath; a table
// that is not there is no error.
func DeleteTable(nsPath, name string) error {
	c, done, err := conn(nsPath)
	if err != nil {
		return err
	}
	defer done()
	c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: name})
	if err := c.Flush(); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("delete table inet %s: %w", name, err)
	}
	return nil
}

// ListTables returns the names of the traceflow tables (TablePrefix) in
// the namespace at nsPath.
func ListTables(nsPath string) ([]string, error) {
	c, done, err := conn(nsPath)
	if err != nil {
		return nil, err
	}
	defer done()
	ts, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list tables: %w", err)
	}
	var out []string
	for _, t := range ts {
		if strings.HasPrefix(t.Name, TablePrefix) {
			out = append(out, t.Name)
		}
	}
	return out, nil
}

// Registers of the match: everything is loaded into register 1 and
// compared there, as nft does.
const reg = 1

func load(base expr.PayloadBase, off, n uint32) *expr.Payload {
	return &expr.Payload{DestRegister: reg, Base: base, Offset: off, Len: n}
}

func eq(b ...byte) *expr.Cmp { return &expr.Cmp{Op: expr.CmpOpEq, Register: reg, Data: b} }

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

func masked(n uint32, mask ...byte) *expr.Bitwise {
	return &expr.Bitwise{SourceRegister: reg, DestRegister: reg, Len: n, Mask: mask, Xor: make([]byte, n)}
}

// exprs is the match of Text in netlink expressions (a new slice each
// call: the two rules must not share one).
func (t Table) exprs() []expr.Any {
	src := t.Probe.Src
	proto := t.Probe.Proto
	if t.Live {
		src, proto = t.LiveSrc, t.LiveProto
	}
	src = src.Unmap()
	var e []expr.Any
	// meta nfproto ipv4|ipv6 (the dependency nft adds to ip and ip6
	// matches in an inet table)
	if src.Is4() {
		e = append(e, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg}, eq(unix.NFPROTO_IPV4))
	} else {
		e = append(e, &expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg}, eq(unix.NFPROTO_IPV6))
	}
	if !t.Live {
		// ip dscp TAG: the top 6 bits of the TOS byte; ip6 dscp TAG: bits
		// 4..9 of the first 16 bits (the traffic class's top 6).
		tag := t.Probe.Tag
		if src.Is4() {
			e = append(e, load(expr.PayloadBaseNetworkHeader, 1, 1), masked(1, 0xfc), eq(tag<<2))
		} else {
			e = append(e, load(expr.PayloadBaseNetworkHeader, 0, 2), masked(2, 0x0f, 0xc0), eq(tag>>2, (tag&3)<<6))
		}
	}
	// ip saddr / ip6 saddr
	if src.Is4() {
		a := src.As4()
		e = append(e, load(expr.PayloadBaseNetworkHeader, 12, 4), eq(a[:]...))
	} else {
		a := src.As16()
		e = append(e, load(expr.PayloadBaseNetworkHeader, 8, 16), eq(a[:]...))
	}
	l4 := func(p uint8) { e = append(e, &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg}, eq(p)) }
	transport := func(off, n uint32) { e = append(e, load(expr.PayloadBaseTransportHeader, off, n)) }
	port := t.Probe.SrcPort
	switch {
	case t.Live && proto == 6: // tcp flags & (syn | ack) == syn
		l4(6)
		transport(13, 1)
		e = append(e, masked(1, 0x12), eq(0x02))
	case t.Live && proto == 17: // meta l4proto udp
		l4(17)
	case proto == 6 || proto == 17: // tcp|udp sport PORT
		l4(proto)
		transport(0, 2)
		e = append(e, eq(be16(port)...))
	case proto == 1 || proto == 58: // icmp|icmpv6 type echo-request [icmp|icmpv6 id ID]
		echo := byte(8)
		if proto == 58 {
			echo = 128
		}
		l4(proto)
		transport(0, 1)
		e = append(e, eq(echo))
		if !t.Live {
			transport(4, 2)
			e = append(e, eq(be16(port)...))
		}
	}
	return e
}
