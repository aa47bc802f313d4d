package ipfix

import (
	"errors"
	"io"
	"os"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// readPcap returns the UDP payloads of a capture (the datagrams an
// exporter sent), in capture order.
func readPcap(t testing.TB, path string) [][]byte {
	t.Helper()
	msgs, _ := readPcapTimes(t, path)
	return msgs
}

// readPcapTimes returns the UDP payloads of a capture and when each was
// captured: the time a collector received it.
func readPcapTimes(t testing.TB, path string) ([][]byte, []time.Time) {
	t.Helper()
	var out [][]byte
	var at []time.Time
	forEachPacket(t, path, func(p gopacket.Packet) {
		if u, ok := p.Layer(layers.LayerTypeUDP).(*layers.UDP); ok {
			out = append(out, append([]byte(nil), u.Payload...))
			at = append(at, p.Metadata().Timestamp)
		}
	})
	return out, at
}

// forEachPacket calls fn with each packet of a capture, decoded, with its
// capture timestamp.
func forEachPacket(t testing.TB, path string, fn func(gopacket.Packet)) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r, err := pcapgo.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for {
		data, ci, err := r.ReadPacketData()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		p := gopacket.NewPacket(data, r.LinkType(), gopacket.Default)
		p.Metadata().CaptureInfo = ci
		fn(p)
	}
}
