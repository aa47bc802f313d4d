package cluster

import "testing"

// TestLostSYNs: a row may miss only retransmitted SYNs of the pod's count.
func TestLostSYNs(t *testing.T) {
	pod := Count{SentPackets: 7, SentBytes: 386, ReceivedPackets: 4, ReceivedBytes: 264, SYNPackets: 2, SYNBytes: 120}
	for _, c := range []struct {
		name                 string
		sp, sb, rp, rb, want uint64
		ok                   bool
	}{
		{"equal", 7, 386, 4, 264, 0, true},
		{"one retransmitted SYN", 6, 326, 4, 264, 1, true},
		{"every SYN", 5, 266, 4, 264, 0, false},
		{"a data packet", 6, 300, 4, 264, 0, false},
		{"a reply packet", 7, 386, 3, 200, 0, false},
		{"more than the pod sent", 8, 446, 4, 264, 0, false},
	} {
		k, ok := pod.LostSYNs(c.sp, c.sb, c.rp, c.rb)
		if ok != c.ok || (ok && k != c.want) {
			t.Errorf("%s: %d, %v; want %d, %v", c.name, k, ok, c.want, c.ok)
		}
	}
	if _, ok := (Count{SentPackets: 6, SentBytes: 326, ReceivedPackets: 4, ReceivedBytes: 264, SYNPackets: 1, SYNBytes: 60}).LostSYNs(5, 266, 4, 264); ok {
		t.Error("a single SYN lost: accepted")
	}
}
