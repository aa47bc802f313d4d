package e2e

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
	"golang.org/x/sys/unix"

	"github.com/dualflow/dualflow/nsrun"
)

// nfRecord is one flow record as nfdump decoded it.
type nfRecord struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16 // ICMP: DstPort is type<<8 | code
	Proto            uint8
	Packets, Bytes   uint64
	OutPackets       uint64 // reverse direction (biflows), 0 if none
	OutBytes         uint64
	First, Last      time.Time
	ICMPType         int // -1 unless nfdump printed it
	ICMPCode         int
}

func (r nfRecord) String() string {
	return fmt.Sprintf("%s %s:%d > %s:%d %d/%d (rev %d/%d) %s..%s",
		protoLabel(r.Proto), r.Src, r.SrcPort, r.Dst, r.DstPort, r.Packets, r.Bytes, r.OutPackets, r.OutBytes,
		r.First.UTC().Format("2006-01-02 15:04:05.000"), r.Last.UTC().Format("2006-01-02 15:04:05.000"))
}

func protoLabel(p uint8) string {
	switch p {
	case 1:
		return "icmp"
	case 6:
		return "tcp"
	case 17:
		return "udp"
	case 58:
		return "icmp6"
	}
	return strconv.Itoa(int(p))
}

// nfcapd is an nfcapd process of the test, on the host's loopback.
type nfcapd struct {
	cmd  *exec.Cmd
	dir  string
	addr netip.AddrPort
	done chan error
	out  *strings.Builder
}

// startNfcapd starts nfcapd on a free UDP port of 127.0.0.1 writing into a
// fresh directory. It is stopped (SIGTERM, which flushes) by stop or when
// the test ends.
func startNfcapd(t *testing.T) *nfcapd {
	t.Helper()
	dir := t.TempDir()
	port := freeUDPPort(t)
	n := &nfcapd{dir: dir, addr: netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), port), done: make(chan error, 1), out: new(strings.Builder)}
	n.cmd = exec.Command("nfcapd", "-w", dir, "-p", strconv.Itoa(int(port)), "-b", "127.0.0.1", "-t", "3600")
	n.cmd.Stdout, n.cmd.Stderr = n.out, n.out
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { n.done <- n.cmd.Wait() }()
	t.Cleanup(func() { n.stop(t) })
	// Ready once it holds the port.
	deadline := time.Now().Add(15 * time.Second)
	for udpPortTaken(port) == false {
		if time.Now().After(deadline) {
			t.Fatalf("nfcapd did not bind port %d: %s", port, n.out)
		}
		select {
		case err := <-n.done:
			t.Fatalf("nfcapd exited: %v: %s", err, n.out)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return n
}

// stop terminates nfcapd (it writes its file on SIGTERM) and waits. It
// first waits for nfcapd to have read every datagram sent to it: one still
// in its socket's queue at SIGTERM is lost (a loaded machine lost the only
// datagram of a run so).
func (n *nfcapd) stop(t *testing.T) {
	if n.cmd.ProcessState != nil || n.done == nil {
		return
	}
	for deadline := time.Now().Add(20 * time.Second); ; {
		if q, _ := udpQueued(n.addr.Port()); q == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("nfcapd left datagrams unread in its socket for 20 s")
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	n.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-n.done:
	case <-time.After(20 * time.Second):
		n.cmd.Process.Kill()
		<-n.done
		t.Errorf("nfcapd did not stop on SIGTERM")
	}
	n.done = nil
}

// records stops nfcapd and returns every record nfdump reads from its files.
func (n *nfcapd) records(t *testing.T) []nfRecord {
	t.Helper()
	n.stop(t)
	cmd := exec.Command("nfdump", "-R", n.dir, "-o", "json", "-N")
	cmd.Env = append(os.Environ(), "TZ=UTC")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			out = append(out, ee.Stderr...)
		}
		t.Fatalf("nfdump: %v: %s (nfcapd: %s)", err, out, n.out)
	}
	recs, err := parseNfdumpJSON(out)
	if err != nil {
		t.Fatalf("nfdump output: %v\n%s", err, out)
	}
	return recs
}

// parseNfdumpJSON reads `nfdump -o json` (nfdump 1.7: an array of objects
// with src4_addr/src6_addr, src_port, dst_port, proto, in_packets,
// in_bytes, first, last; ICMP as icmp_type and icmp_code).
func parseNfdumpJSON(out []byte) ([]nfRecord, error) {
	s := strings.TrimSpace(string(out))
	if s == "" || strings.Contains(s, "No matching flows") {
		return nil, nil
	}
	var objs []map[string]any
	if err := json.Unmarshal([]byte(s), &objs); err != nil {
		// Some builds print one object per record without the array.
		dec := json.NewDecoder(strings.NewReader(s))
		objs = nil
		for {
			var o map[string]any
			if err2 := dec.Decode(&o); err2 == io.EOF {
				break
			} else if err2 != nil {
				return nil, err
			}
			objs = append(objs, o)
		}
	}
	var recs []nfRecord
	for _, o := range objs {
		if typ, _ := o["type"].(string); typ != "" && typ != "FLOW" {
			continue
		}
		str := func(k string) string { v, _ := o[k].(string); return v }
		num := func(k string) (uint64, bool) {
			switch v := o[k].(type) {
			case float64:
				return uint64(v), true
			case string:
				u, err := strconv.ParseUint(v, 10, 64)
				return u, err == nil
			}
			return 0, false
		}
		var r nfRecord
		var err error
		for _, k := range [][2]string{{"src4_addr", "dst4_addr"}, {"src6_addr", "dst6_addr"}} {
			if str(k[0]) != "" {
				if r.Src, err = netip.ParseAddr(str(k[0])); err != nil {
					return nil, err
				}
				if r.Dst, err = netip.ParseAddr(str(k[1])); err != nil {
					return nil, err
				}
			}
		}
		if !r.Src.IsValid() {
			return nil, fmt.Errorf("record without addresses: %v", o)
		}
		p, _ := num("proto")
		r.Proto = uint8(p)
		sp, _ := num("src_port")
		dp, _ := num("dst_port")
		r.SrcPort, r.DstPort = uint16(sp), uint16(dp)
		r.ICMPType, r.ICMPCode = -1, -1
		if it, ok := num("icmp_type"); ok {
			ic, _ := num("icmp_code")
			r.ICMPType, r.ICMPCode = int(it), int(ic)
			if r.DstPort == 0 {
				r.DstPort = uint16(it<<8 | ic)
			}
		}
		r.Packets, _ = num("in_packets")
		r.Bytes, _ = num("in_bytes")
		r.OutPackets, _ = num("out_packets")
		r.OutBytes, _ = num("out_bytes")
		for _, f := range []struct {
			k string
			t *time.Time
		}{{"first", &r.First}, {"last", &r.Last}, {"t_first", &r.First}, {"t_last", &r.Last}} {
			if v := str(f.k); v != "" {
				ts, err := time.ParseInLocation("2006-01-02T15:04:05.999", v, time.UTC)
				if err != nil {
					return nil, fmt.Errorf("time %s=%q: %w", f.k, v, err)
				}
				*f.t = ts
			}
		}
		recs = append(recs, r)
	}
	return recs, nil
}

// freeUDPPort returns a UDP port of 127.0.0.1 that was free a moment ago.
func freeUDPPort(t *testing.T) uint16 {
	t.Helper()
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port)
}

// udpPortTaken reports whether a UDP socket of the test's namespace is
// bound to port (read from /proc: binding it to find out would race).
func udpPortTaken(port uint16) bool {
	_, taken := udpQueued(port)
	return taken
}

// udpQueued returns the bytes waiting in the receive queue of the UDP
// socket bound to port in this network namespace, and whether there is
// one (/proc/net/udp{,6}: local_address, then tx_queue:rx_queue in hex).
func udpQueued(port uint16) (int64, bool) {
	suffix := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		b, _ := os.ReadFile(f)
		for _, l := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(l)
			if len(fs) <= 4 || !strings.HasSuffix(fs[1], suffix) {
				continue
			}
			_, rx, _ := strings.Cut(fs[4], ":")
			n, _ := strconv.ParseInt(rx, 16, 64)
			return n, true
		}
	}
	return 0, false
}

// datagram is one export message as the tee received it.
type datagram struct {
	at      time.Time
	from    netip.AddrPort
	to      netip.AddrPort
	payload []byte
}

// markerPayload ends a run: the tee sees it after every datagram the
// exporter sent before it (one socket, FIFO), and does not forward it.
var markerPayload = []byte("dualflow-e2e-end-of-export")

// tee is a UDP socket inside a netns that records every datagram and
// forwards it, from a source address of its own on the host's loopback,
// to each target.
type tee struct {
	conn    *net.UDPConn
	fwd     *net.UDPConn
	targets []*net.UDPAddr
	mu      sync.Mutex
	got     []datagram
	ended   chan struct{}
	closed  chan struct{}
}

// startTee listens on listen (an address of the namespace's loopback) in
// netns ns ("": the test's own) and forwards from fwdFrom (a host loopback address) to targets.
func startTee(t *testing.T, ns string, listen, fwdFrom netip.Addr, targets ...netip.AddrPort) *tee {
	t.Helper()
	tt := &tee{ended: make(chan struct{}), closed: make(chan struct{})}
	listenFn := func() error {
		var err error
		tt.conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(listen, 0)))
		return err
	}
	var err error
	if ns == "" {
		err = listenFn()
	} else {
		err = nsrun.Do(nsrun.Path(ns), listenFn)
	}
	if err != nil {
		t.Fatalf("tee in %s: %v", ns, err)
	}
	tt.fwd, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(fwdFrom, 0)))
	if err != nil {
		tt.conn.Close()
		t.Fatalf("tee forwarder: %v", err)
	}
	for _, a := range targets {
		tt.targets = append(tt.targets, net.UDPAddrFromAddrPort(a))
	}
	t.Cleanup(tt.close)
	go tt.run()
	return tt
}

func (tt *tee) addr() netip.AddrPort { return tt.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

func (tt *tee) run() {
	defer close(tt.closed)
	buf := make([]byte, 65535)
	for {
		n, from, err := tt.conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		at := time.Now()
		if string(buf[:n]) == string(markerPayload) {
			select {
			case <-tt.ended:
			default:
				close(tt.ended)
			}
			continue
		}
		p := append([]byte(nil), buf[:n]...)
		tt.mu.Lock()
		tt.got = append(tt.got, datagram{at: at, from: from, to: tt.addr(), payload: p})
		tt.mu.Unlock()
		for _, a := range tt.targets {
			tt.fwd.WriteToUDP(p, a)
		}
	}
}

// finish sends the end marker from inside ns and waits until the tee has
// forwarded everything received before it.
func (tt *tee) finish(t *testing.T, ns string) []datagram {
	t.Helper()
	send := func() error {
		c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(tt.addr()))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Write(markerPayload)
		return err
	}
	var err error
	if ns == "" {
		err = send()
	} else {
		err = nsrun.Do(nsrun.Path(ns), send)
	}
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-tt.ended:
	case <-time.After(20 * time.Second):
		t.Fatal("tee: end marker not seen")
	}
	return tt.datagrams()
}

func (tt *tee) datagrams() []datagram {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return append([]datagram(nil), tt.got...)
}

func (tt *tee) close() {
	tt.conn.Close()
	tt.fwd.Close()
	<-tt.closed
}

// writeDatagramPcap writes the datagrams as a pcap of Ethernet/IP/UDP
// packets (loopback MACs, checksums set), as a capture of the tee's socket
// would show them.
func writeDatagramPcap(path string, dgs []datagram) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	w := pcapgo.NewWriter(f)
	if err := w.WriteFileHeader(65535, layers.LinkTypeEthernet); err != nil {
		return err
	}
	for _, d := range dgs {
		udp := &layers.UDP{SrcPort: layers.UDPPort(d.from.Port()), DstPort: layers.UDPPort(d.to.Port())}
		eth := &layers.Ethernet{SrcMAC: make(net.HardwareAddr, 6), DstMAC: make(net.HardwareAddr, 6)}
		var ip gopacket.NetworkLayer
		if d.from.Addr().Unmap().Is4() {
			eth.EthernetType = layers.EthernetTypeIPv4
			ip4 := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP, SrcIP: d.from.Addr().Unmap().AsSlice(), DstIP: d.to.Addr().Unmap().AsSlice(), Flags: layers.IPv4DontFragment}
			ip = ip4
		} else {
			eth.EthernetType = layers.EthernetTypeIPv6
			ip = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP, SrcIP: d.from.Addr().AsSlice(), DstIP: d.to.Addr().AsSlice()}
		}
		udp.SetNetworkLayerForChecksum(ip)
		buf := gopacket.NewSerializeBuffer()
		err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
			eth, ip.(gopacket.SerializableLayer), udp, gopacket.Payload(d.payload))
		if err != nil {
			return err
		}
		b := buf.Bytes()
		if err := w.WritePacket(gopacket.CaptureInfo{Timestamp: d.at, CaptureLength: len(b), Length: len(b)}, b); err != nil {
			return err
		}
	}
	return f.Close()
}

// exportRecordCount counts the data records of NetFlow v5 and v9 messages
// (v5: the header count; v9: the header counts sets, so data records are
// counted through the templates seen). IPFIX has no record count: -1.
func exportRecordCount(dgs []datagram) int {
	n := 0
	v9len := map[uint16]int{} // template id -> record length
	for _, d := range dgs {
		p := d.payload
		if len(p) < 4 {
			continue
		}
		switch binary.BigEndian.Uint16(p) {
		case 5:
			n += int(binary.BigEndian.Uint16(p[2:]))
		case 9:
			for off := 20; off+4 <= len(p); {
				id, l := binary.BigEndian.Uint16(p[off:]), int(binary.BigEndian.Uint16(p[off+2:]))
				if l < 4 || off+l > len(p) {
					break
				}
				body := p[off+4 : off+l]
				switch {
				case id == 0:
					for b := body; len(b) >= 4; {
						tid, cnt := binary.BigEndian.Uint16(b), int(binary.BigEndian.Uint16(b[2:]))
						if len(b) < 4+4*cnt {
							break
						}
						rl := 0
						for i := 0; i < cnt; i++ {
							rl += int(binary.BigEndian.Uint16(b[4+4*i+2:]))
						}
						v9len[tid] = rl
						b = b[4+4*cnt:]
					}
				case id >= 256:
					if rl := v9len[id]; rl > 0 {
						n += len(body) / rl
					}
				}
				off += l
			}
		default:
			return -1
		}
	}
	return n
}

// sortRecords orders records for readable diffs.
func sortRecords(rs []nfRecord) {
	sort.Slice(rs, func(i, j int) bool { return rs[i].String() < rs[j].String() })
}

// sendMarkerFrame sends one Ethernet frame of the local experimental
// ethertype 0x88b5 on dev inside ns: no flow exporter counts it, and a
// capture that shows it has seen every packet sent before it.
func sendMarkerFrame(ns, dev string) error {
	return nsrun.Do(nsrun.Path(ns), func() error {
		ifi, err := net.InterfaceByName(dev)
		if err != nil {
			return err
		}
		fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		frame := make([]byte, 60)
		copy(frame, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
		copy(frame[6:], ifi.HardwareAddr)
		frame[12], frame[13] = 0x88, 0xb5
		copy(frame[14:], markerPayload)
		return unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: ifi.Index, Protocol: 0xb588, Halen: 6, Addr: [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}})
	})
}

// capture is a tcpdump writing a pcap inside a netns.
type capture struct {
	cmd  *exec.Cmd
	path string
	done chan error
	out  *strings.Builder
}

// startCapture runs tcpdump on dev in ns and returns once it listens.
func startCapture(t *testing.T, ns, dev, path string) *capture {
	t.Helper()
	c := &capture{path: path, done: make(chan error, 1), out: new(strings.Builder)}
	c.cmd = exec.Command("tcpdump", "-i", dev, "-n", "-U", "-w", path)
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := startIn(nsrun.Path(ns), c.cmd); err != nil {
		t.Fatal(err)
	}
	listening := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			c.out.WriteString(sc.Text() + "\n")
			if strings.Contains(sc.Text(), "listening on") {
				once.Do(func() { close(listening) })
			}
		}
		c.done <- c.cmd.Wait()
	}()
	t.Cleanup(func() { c.stop() })
	select {
	case <-listening:
	case <-time.After(15 * time.Second):
		t.Fatalf("tcpdump not listening: %s", c.out)
	}
	return c
}

// stopAfterMarker sends the marker frame, waits until the file shows it,
// then stops tcpdump.
func (c *capture) stopAfterMarker(t *testing.T, ns, dev string) {
	t.Helper()
	if err := sendMarkerFrame(ns, dev); err != nil {
		t.Fatalf("marker frame: %v", err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for !pcapHasMarker(c.path) {
		if time.Now().After(deadline) {
			t.Fatalf("capture %s never showed the marker frame", c.path)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.stop()
}

func (c *capture) stop() {
	if c.done == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Kill()
		<-c.done
	}
	c.done = nil
}

func pcapHasMarker(path string) bool {
	found := false
	readPcap(path, func(data []byte, _ time.Time) {
		if len(data) >= 14 && data[12] == 0x88 && data[13] == 0xb5 {
			found = true
		}
	})
	return found
}

// readPcap calls fn with each complete packet of the pcap at path and its
// capture time.
func readPcap(path string, fn func([]byte, time.Time)) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		return err
	}
	for {
		data, ci, err := r.ReadPacketData()
		if err != nil {
			return nil
		}
		fn(data, ci.Timestamp)
	}
}

// dirCounts is what a capture shows of one direction of a flow.
type dirCounts struct {
	Packets, Bytes uint64
	First, Last    time.Time // capture times of the first and last packet
}

// flowKey is a unidirectional 5-tuple; ICMP: DstPort is type<<8 | code.
type flowKey struct {
	Src, Dst         netip.Addr
	SrcPort, DstPort uint16
	Proto            uint8
}

func (k flowKey) String() string {
	return fmt.Sprintf("%s %s:%d > %s:%d", protoLabel(k.Proto), k.Src, k.SrcPort, k.Dst, k.DstPort)
}

// pcapFlows counts the IP packets of the pcap at path by unidirectional
// 5-tuple, bytes as IP total length.
func pcapFlows(t *testing.T, path string) map[flowKey]dirCounts {
	t.Helper()
	m := map[flowKey]dirCounts{}
	err := readPcap(path, func(data []byte, at time.Time) {
		p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.NoCopy)
		var k flowKey
		var n uint64
		switch ip := p.NetworkLayer().(type) {
		case *layers.IPv4:
			k.Src, _ = netip.AddrFromSlice(ip.SrcIP.To4())
			k.Dst, _ = netip.AddrFromSlice(ip.DstIP.To4())
			k.Proto, n = uint8(ip.Protocol), uint64(ip.Length)
		case *layers.IPv6:
			k.Src, _ = netip.AddrFromSlice(ip.SrcIP)
			k.Dst, _ = netip.AddrFromSlice(ip.DstIP)
			k.Proto, n = uint8(ip.NextHeader), uint64(ip.Length)+40
			if hbh := p.Layer(layers.LayerTypeIPv6HopByHop); hbh != nil {
				k.Proto = uint8(hbh.(*layers.IPv6HopByHop).NextHeader)
			}
		default:
			return
		}
		switch l := p.TransportLayer().(type) {
		case *layers.TCP:
			k.SrcPort, k.DstPort = uint16(l.SrcPort), uint16(l.DstPort)
		case *layers.UDP:
			k.SrcPort, k.DstPort = uint16(l.SrcPort), uint16(l.DstPort)
		}
		if ic := p.Layer(layers.LayerTypeICMPv4); ic != nil {
			k.DstPort = uint16(ic.(*layers.ICMPv4).TypeCode)
		}
		if ic := p.Layer(layers.LayerTypeICMPv6); ic != nil {
			k.DstPort = uint16(ic.(*layers.ICMPv6).TypeCode)
		}
		c := m[k]
		if c.Packets == 0 {
			c.First = at
		}
		c.Packets++
		c.Bytes += n
		c.Last = at
		m[k] = c
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// runIn runs argv inside ns, failing the test on error.
func runIn(t *testing.T, ns string, argv ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := nsrun.Output(ctx, nsrun.Path(ns), nil, argv...)
	if err != nil {
		t.Fatalf("%s in %s: %v", strings.Join(argv, " "), ns, err)
	}
	return string(out)
}

// run runs argv in the test's namespace, failing the test on error.
func run(t *testing.T, argv ...string) string {
	t.Helper()
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
	}
	return string(out)
}

// writeFile writes a small file into dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
