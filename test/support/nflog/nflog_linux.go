//go:build linux

package nflog

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// nfnetlink_log constants (include/uapi/linux/netfilter/nfnetlink_log.h);
// x/sys/unix does not define them.
const (
	subsysULOG    = 4 // NFNL_SUBSYS_ULOG
	msgPacket     = 0 // NFULNL_MSG_PACKET
	msgConfig     = 1 // NFULNL_MSG_CONFIG
	cfgCmd        = 1 // NFULA_CFG_CMD
	cfgMode       = 2 // NFULA_CFG_MODE
	cmdBind       = 1 // NFULNL_CFG_CMD_BIND
	copyPacket    = 2 // NFULNL_COPY_PACKET
	attrHdr       = 1 // NFULA_PACKET_HDR
	attrTimestamp = 3 // NFULA_TIMESTAMP
	attrInDev     = 4 // NFULA_IFINDEX_INDEV
	attrOutDev    = 5 // NFULA_IFINDEX_OUTDEV
	attrPayload   = 9 // NFULA_PAYLOAD
	attrPrefix    = 10
)

// copyRange is how much of each packet the kernel copies: enough for the
// IPv6 header and the L4 ports.
const copyRange = 128

// Reader receives the packets of one NFLOG group.
type Reader struct {
	conn  *netlink.Conn
	group uint16
}

// Open binds NFLOG group in the namespace at netnsPath ("" for the current
// one).
func Open(netnsPath string, group uint16) (*Reader, error) {
	cfg := &netlink.Config{}
	if netnsPath != "" {
		fd, err := unix.Open(netnsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("nflog: open netns: %w", err)
		}
		defer unix.Close(fd)
		cfg.NetNS = fd
	}
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, cfg)
	if err != nil {
		return nil, fmt.Errorf("nflog: dial: %w", err)
	}
	r := &Reader{conn: c, group: group}
	mode := make([]byte, 6) // struct nfulnl_msg_config_mode
	binary.BigEndian.PutUint32(mode, copyRange)
	mode[4] = copyPacket
	for _, a := range []struct {
		typ  uint16
		data []byte
	}{{cfgCmd, []byte{cmdBind}}, {cfgMode, mode}} {
		if err := r.config(a.typ, a.data); err != nil {
			c.Close()
			return nil, fmt.Errorf("nflog: bind group %d: %w", group, err)
		}
	}
	return r, nil
}

func (r *Reader) config(typ uint16, data []byte) error {
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(typ, data)
	attrs, err := ae.Encode()
	if err != nil {
		return err
	}
	hdr := []byte{unix.AF_UNSPEC, 0, 0, 0} // nfgenmsg: family, version, res_id (BE)
	binary.BigEndian.PutUint16(hdr[2:], r.group)
	_, err = r.conn.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(subsysULOG<<8 | msgConfig), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(hdr, attrs...),
	})
	return err
}

// Close unbinds and closes.
func (r *Reader) Close() error { return r.conn.Close() }

// Read waits until deadline for logged packets and returns those of the
// next batch. At the deadline it returns an error wrapping
// os.ErrDeadlineExceeded.
func (r *Reader) Read(deadline time.Time) ([]Packet, error) {
	if err := r.conn.SetReadDeadline(deadline); err != nil {
		return nil, fmt.Errorf("nflog: %w", err)
	}
	msgs, err := r.conn.Receive()
	if err != nil {
		return nil, fmt.Errorf("nflog: receive: %w", err)
	}
	var out []Packet
	for _, m := range msgs {
		if m.Header.Type != netlink.HeaderType(subsysULOG<<8|msgPacket) || len(m.Data) < 4 {
			continue
		}
		p, err := decode(m.Data[4:])
		if err != nil {
			continue // not an IP packet we can read: skip it
		}
		out = append(out, p)
	}
	return out, nil
}

func decode(b []byte) (Packet, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return Packet{}, err
	}
	ad.ByteOrder = binary.BigEndian
	var p Packet
	var payload []byte
	for ad.Next() {
		switch ad.Type() {
		case attrPrefix:
			p.Prefix = string(bytes.TrimRight(ad.Bytes(), "\x00"))
		case attrPayload:
			payload = ad.Bytes()
		case attrHdr:
			if h := ad.Bytes(); len(h) >= 3 {
				p.Hook = h[2]
			}
		case attrInDev:
			p.InDev = ad.Uint32()
		case attrOutDev:
			p.OutDev = ad.Uint32()
		case attrTimestamp:
			if t := ad.Bytes(); len(t) == 16 {
				p.Time = time.Unix(int64(binary.BigEndian.Uint64(t)), int64(binary.BigEndian.Uint64(t[8:]))*1000)
			}
		}
	}
	if err := ad.Err(); err != nil {
		return Packet{}, err
	}
	if p.Time.IsZero() {
		p.Time = time.Now()
	}
	p.Tuple, err = ParseIP(payload)
	return p, err
}
