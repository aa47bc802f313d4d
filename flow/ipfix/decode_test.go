package ipfix

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vmware/go-ipfix/pkg/entities"

	"github.com/dualflow/dualflow/flow"
)

// dataRecord builds a decoded data record with the given addresses (an
// element per non-empty one) and source port.
func dataRecord(srcE Element, src string, dstE Element, dst string, sport uint16) entities.Record {
	var elems []entities.InfoElementWithValue
	if src != "" {
		elems = append(elems, entities.NewIPAddressInfoElement(srcE.InfoElement(), net.ParseIP(src)))
	}
	if dst != "" {
		elems = append(elems, entities.NewIPAddressInfoElement(dstE.InfoElement(), net.ParseIP(dst)))
	}
	elems = append(elems, entities.NewUnsigned16InfoElement(ieSrcPort.InfoElement(), sport),
		entities.NewUnsigned8InfoElement(ieProto.InfoElement(), flow.ProtoTCP))
	return entities.NewDataRecordFromElements(MinDataSetID, elems)
}

// TestAppendMessageSkipsBadRecords decodes a message whose middle records
// are bad (no addresses; a source and a destination of different
// families): the good records around them are all decoded, and the error
// counts and names the bad ones.
func TestAppendMessageSkipsBadRecords(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		srcE, dstE, otherE     Element
		src, dst, other, expAt string
	}{
		{"ipv4", ieSrc4, ieDst4, ieDst6, "198.18.1.1", "198.18.2.2", "fd00:10:2::2", "198.18.0.1"},
		{"ipv6", ieSrc6, ieDst6, ieDst4, "fd00:10:1::1", "fd00:10:2::2", "198.18.2.2", "fd00:10::1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set := entities.NewSet(true)
			if err := set.PrepareSet(entities.Data, MinDataSetID); err != nil {
				t.Fatal(err)
			}
			for _, r := range []entities.Record{
				dataRecord(tc.srcE, tc.src, tc.dstE, tc.dst, 1),
				dataRecord(tc.srcE, "", tc.dstE, "", 2),             // no addresses
				dataRecord(tc.srcE, tc.src, tc.otherE, tc.other, 3), // mixed families
				dataRecord(tc.srcE, tc.src, tc.dstE, tc.dst, 4),
				dataRecord(tc.srcE, tc.src, tc.otherE, tc.other, 5), // mixed families
				dataRecord(tc.srcE, tc.src, tc.dstE, tc.dst, 6),
			} {
				if err := set.AddRecordV3(r); err != nil {
					t.Fatal(err)
				}
			}
			msg := entities.NewMessage(true)
			msg.AddSet(set)
			msg.SetExportAddress(tc.expAt)
			msg.SetObsDomainID(7)
			received := time.Unix(1_780_000_000, 0)

			prev := flow.Record{SrcPort: 999}
			out, err := AppendMessage([]flow.Record{prev}, msg, received)
			var skipped *SkippedError
			if !errors.As(err, &skipped) || skipped.Skipped != 3 || skipped.Total != 6 {
				t.Fatalf("error %v, want 3 of 6 records skipped", err)
			}
			if !errors.Is(err, ErrNoAddresses) || !errors.Is(err, ErrMixedFamilies) {
				t.Errorf("error %v does not name both causes", err)
			}
			var ports []uint16
			for _, r := range out {
				ports = append(ports, r.SrcPort)
			}
			if len(ports) != 4 || ports[0] != 999 || ports[1] != 1 || ports[2] != 4 || ports[3] != 6 {
				t.Fatalf("decoded source ports %v, want [999 1 4 6]", ports)
			}
			for _, r := range out[1:] {
				if r.ExporterAddr != netip.MustParseAddr(tc.expAt) || r.ObservationDomainID != 7 || !r.TimeReceived.Equal(received) ||
					r.SrcAddr != netip.MustParseAddr(tc.src) || r.DstAddr != netip.MustParseAddr(tc.dst) {
					t.Errorf("record %+v", r)
				}
			}
		})
	}
}

// TestDecodeMixedFamilies rejects a record with a source and a destination
// of different IP families, either way round; a 4-in-6 mapped destination
// is IPv4.
func TestDecodeMixedFamilies(t *testing.T) {
	for _, tc := range []struct {
		name       string
		srcE, dstE Element
		src, dst   string
		ok         bool
	}{
		{"ipv4 source, ipv6 destination", ieSrc4, ieDst6, "198.18.1.1", "fd00:10:2::2", false},
		{"ipv6 source, ipv4 destination", ieSrc6, ieDst4, "fd00:10:1::1", "198.18.2.2", false},
		{"ipv4 source, mapped destination", ieSrc4, ieDst6, "198.18.1.1", "::ffff:198.18.2.2", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r flow.Record
			err := Decode(dataRecord(tc.srcE, tc.src, tc.dstE, tc.dst, 1), &r)
			if tc.ok {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrMixedFamilies) || !strings.Contains(err.Error(), tc.src) {
				t.Fatalf("got %v, want ErrMixedFamilies naming %s", err, tc.src)
			}
		})
	}
}
