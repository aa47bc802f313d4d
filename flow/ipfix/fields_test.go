package ipfix

import "testing"

// notInFieldOf are elements Decode reads and our templates carry that have
// no Field on purpose: icmpTypeCodeIPv4/IPv6 fill DstPort only as a
// fallback, and the collector maps them as IANA alternatives
// (collector/ipfix ianaAlternatives); a Field would shadow that handling.
var notInFieldOf = map[key]bool{ieICMPTypeCode4.key(): true, ieICMPTypeCode6.key(): true}

// TestFieldOfCoversDecode checks that every element Decode reads has a
// Field, so the collector's compiled decoder reads the same elements.
func TestFieldOfCoversDecode(t *testing.T) {
	for k := range getters {
		if FieldOf(k.ent, k.id) == FieldNone && !notInFieldOf[k] {
			t.Errorf("element (%d, %d) is decoded but has no Field", k.ent, k.id)
		}
	}
	for k := range fieldOf {
		if getters[k] == nil {
			t.Errorf("element (%d, %d) has a Field but Decode does not read it", k.ent, k.id)
		}
	}
	for _, v := range []uint8{4, 6} {
		for _, e := range Elements(v) {
			if FieldOf(e.Enterprise, e.ID) == FieldNone && !notInFieldOf[e.key()] {
				t.Errorf("template element %s has no Field", e.Name)
			}
		}
	}
}
