package ipfix

// Accessors the tests read: the product has no use for them.

// Templates returns the number of live templates of the session.
func (s *Session) Templates() int { return s.templates }

// Lost returns the number of data records that sequence numbers show as
// missing in observation domain id, of every protocol (for a NetFlow v9
// domain counting packets, see LostMessages).
func (s *Session) Lost(id uint32) uint64 {
	var n uint64
	for k, d := range s.domains {
		if k.id == id {
			n += d.seq.lostRecords
		}
	}
	return n
}

// LostMessages returns the number of messages that sequence numbers show
// as missing in observation domain id, of every protocol, for exporters
// whose sequence numbers count messages (NetFlow v9).
func (s *Session) LostMessages(id uint32) uint64 {
	var n uint64
	for k, d := range s.domains {
		if k.id == id {
			n += d.seq.lostMessages
		}
	}
	return n
}

// len returns how many strings are cached.
func (in *interner) len() int {
	n := 0
	for k := range in.sets {
		n += int(in.sets[k].n)
	}
	return n
}
