package ipfix

import "testing"

// notInFieldOf are template elements that have no Field on purpose:
// icmpTypeCodeIPv4/IPv6 fill DstPort only as a fallback, and the collector
// maps them as IANA alternatives (collector/ipfix ianaAlternatives); a
// Field would shadow that handling.
var notInFieldOf = map[key]bool{ieICMPTypeCode4.key(): true, ieICMPTypeCode6.key(): true}

// TestFieldOfCoversTemplates checks that every element of our templates has
// a Field, so the collector's compiled decoder reads it, and that the
// mapping names each element once. TestOurTemplatesDecoded in
// collector/ipfix checks the collector reads every one of them.
func TestFieldOfCoversTemplates(t *testing.T) {
	for _, v := range []uint8{4, 6} {
		for _, e := range Elements(v) {
			if FieldOf(e.Enterprise, e.ID) == FieldNone && !notInFieldOf[e.key()] {
				t.Errorf("template element %s has no Field", e.Name)
			}
		}
	}
	for k, f := range fieldOf {
		if f == FieldNone || f >= NumFields {
			t.Errorf("element (%d, %d) maps to Field %d", k.ent, k.id, f)
		}
	}
}
