package ipfix

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	fipfix "github.com/dualflow/dualflow/flow/ipfix"
)

// TestFramerBadHeader: a header a stream cannot be framed by ends it, with
// the reason its message is counted under: version for NetFlow (no length
// field) and other protocols, length for an IPFIX header shorter than
// itself.
func TestFramerBadHeader(t *testing.T) {
	for _, tc := range []struct {
		name    string
		stream  []byte
		reason  Reason
		netflow bool
	}{
		{"NetFlow v9", v9Message(1, 0, 100_000, v9Set(0, v9Template(256, v9Src6, v9Dst6))), ReasonVersion, true},
		{"NetFlow v5", v5Packet(100_000, 1000, 2000), ReasonVersion, true},
		{"version 7", cat(be16(7), be16(16), make([]byte, 12)), ReasonVersion, false},
		{"IPFIX length 3", cat(be16(10), be16(3), make([]byte, 12)), ReasonLength, false},
		{"after a good message", cat(message(1, 0, set(2, templateRec(300, ieSrc4, ieDst4))), be16(9), be16(1)), ReasonVersion, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFramer(bytes.NewReader(tc.stream))
			var err error
			for err == nil {
				_, err = f.next()
			}
			var bad *badHeader
			if !errors.As(err, &bad) || !errors.Is(err, errFraming) {
				t.Fatalf("err %v, want a bad header", err)
			}
			if bad.reason() != tc.reason || bad.netflow() != tc.netflow {
				t.Errorf("reason %s, netflow %v; want %s, %v", bad.reason(), bad.netflow(), tc.reason, tc.netflow)
			}
		})
	}
}

// FuzzFramer cuts arbitrary streams into messages: it must never panic,
// every message must be as long as its header says, and the stream ends
// with EOF, a truncated message or a bad header.
func FuzzFramer(f *testing.F) {
	ours, _ := benchMessages(2)
	f.Add(bytes.Join(ours, nil))
	f.Add(v9Message(1, 0, 100_000, v9Set(0, v9Template(256, v9Src4, v9Dst4))))
	f.Add(v5Packet(100_000, 0, 0))
	f.Add(cat(ours[0], be16(10), be16(3)))
	f.Fuzz(func(t *testing.T, stream []byte) {
		fr := newFramer(bytes.NewReader(stream))
		total := 0
		for {
			m, err := fr.next()
			if err != nil {
				var bad *badHeader
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.As(err, &bad) {
					t.Fatalf("err %v", err)
				}
				if bad != nil && bad.version == fipfix.Version && bad.length >= fipfix.MessageHeaderLen {
					t.Fatalf("good header refused: %v", err)
				}
				return
			}
			if len(m) < fipfix.MessageHeaderLen || int(binary.BigEndian.Uint16(m[2:])) != len(m) || binary.BigEndian.Uint16(m) != fipfix.Version {
				t.Fatalf("message of %d bytes, header % x", len(m), m[:min(len(m), 4)])
			}
			if total += len(m); total > len(stream) {
				t.Fatalf("framed %d bytes of %d", total, len(stream))
			}
		}
	})
}
